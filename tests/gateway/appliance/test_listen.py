"""A connection to a secure gate that never finishes its TLS handshake is closed after
`request_timeout_s` (asyncio's default is 60 s, and such connections are not yet counted by the
gates' connection limit). Real sockets against `sepa-gateway run --secure`."""

from __future__ import annotations

import socket
import ssl
import time
from urllib.parse import urlsplit


def test_a_tls_handshake_that_never_comes_is_cut_at_the_request_timeout(start_gateway, tmp_path) -> None:
    gateway = start_gateway("--secure", toml="[http]\nrequest_timeout_s = 2.0\n", data_dir=tmp_path / "data")
    port = urlsplit(gateway.https_url).port
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
    try:
        started = time.monotonic()
        for connection in silent:
            assert connection.recv(1) == b""  # the gateway closed it
        assert time.monotonic() - started < 5.0
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10)) as tls:
            tls.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            assert tls.recv(12).startswith(b"HTTP/1.1")  # a client that does its handshake is served
    finally:
        for connection in silent:
            connection.close()
