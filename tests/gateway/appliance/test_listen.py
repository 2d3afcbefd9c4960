"""A connection to a secure gate that never finishes its TLS handshake is closed after
`request_timeout_s` (asyncio's default is 60 s, and such connections are not yet counted by the
gates' connection limit). Real sockets against `sepa-gateway run --secure`."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import time
from pathlib import Path
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


def test_accepts_that_fail_for_want_of_descriptors_are_counted_and_logged_once(start_gateway) -> None:
    """A LAN host holding thousands of TLS handshakes took the gateway to its descriptor limit, and
    asyncio logged an ERROR with a traceback for each failed accept: 3,079 (1.4 MB) in 12 s. Here the
    gateway's limit is lowered under it (prlimit) and connections are opened until accepts fail."""
    gateway = start_gateway()
    pid = gateway.process.pid
    in_use = len(os.listdir(f"/proc/{pid}/fd"))
    (soft,) = [line.split()[3] for line in Path(f"/proc/{pid}/limits").read_text().splitlines() if "open files" in line]
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={in_use + 10}:"], check=True)
    held = [socket.create_connection(("127.0.0.1", gateway.http_port), timeout=10) for _ in range(40)]
    time.sleep(3.5)  # asyncio tries the accept again every second
    for connection in held:
        connection.close()
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={soft}:"], check=True)
    gateway.wait_for_metric("sepa_listen_accept_errors", lambda value: value >= 2, timeout=10.0)
    assert gateway.stop() == 0
    log = gateway.log()
    assert "Traceback" not in log
    assert log.count("accepting connections failed") == 1
