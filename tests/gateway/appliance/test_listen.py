"""A connection to a secure gate that never finishes its TLS handshake is closed after
`request_timeout_s` (asyncio's default is 60 s, and such connections are not yet counted by the
gates' connection limit). Real sockets against `sepa-gateway run --secure`."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from gateway.appliance.listen import HANDSHAKES, HANDSHAKES_PER_ADDRESS
from tests.polling import wait_until
from tests.support.coap import host_address


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


def _tls_reply(port: int, source: str | None = None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    plain = socket.create_connection(("127.0.0.1" if source is None else source, port), timeout=10)
    with context.wrap_socket(plain) as tls:
        tls.sendall(b"GET /secure/rights HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        return tls.recv(12)


def test_one_host_has_at_most_its_share_of_tls_handshakes_under_way(start_gateway, tmp_path) -> None:
    """Each connection in its TLS handshake holds asyncio's 256 KiB buffer from its accept, and the
    gates' connection limit saw it only after the handshake: one LAN host opening ~340 connections a
    second and sending nothing held 7,640 of them, RSS 291 -> 2,553 MB, every descriptor taken.
    Now one address has HANDSHAKES_PER_ADDRESS under way at most; the rest are closed at once."""
    lan = host_address()
    toml = f'[security]\nhost = "{lan}"\n[http]\nrequest_timeout_s = 30.0\n'
    gateway = start_gateway("--secure", toml=toml, data_dir=tmp_path / "data")
    port = urlsplit(gateway.https_url).port
    silent = []
    try:
        for _ in range(HANDSHAKES_PER_ADDRESS + 8):
            connection = socket.socket()
            connection.bind((lan, 0))
            connection.connect((lan, port))
            silent.append(connection)
        time.sleep(0.5)
        closed = 0
        for connection in silent:
            connection.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                closed += connection.recv(1) == b""
        assert closed == 8
        assert gateway.metrics()["sepa_listen_handshakes_refused"] == 8
        for connection in silent:
            connection.close()
        silent.clear()
        wait_until(lambda: gateway.metrics()["sepa_listen_handshakes"] == 0)
        assert _tls_reply(port, source=lan).startswith(b"HTTP/1.1 401")  # its turn again (no token: 401)
    finally:
        for connection in silent:
            connection.close()


def test_silent_connections_filling_every_handshake_slot_keep_no_other_address_out(start_gateway, tmp_path) -> None:
    """8 LAN addresses of 32 silent connections each filled all HANDSHAKES slots, and every other
    client (this board's too) was reset at its accept for as long as they were held: opened again
    every `request_timeout_s`, they kept both secure ports shut. This board's connections count only
    toward the total, so they fill it here. Now a newcomer from an address holding fewer takes the
    place of the oldest handshake of the address holding the most; one from that address is refused."""
    lan = host_address()
    toml = f'[security]\nhost = "{lan}"\n[http]\nrequest_timeout_s = 30.0\n'
    gateway = start_gateway("--secure", toml=toml, data_dir=tmp_path / "data")
    port = urlsplit(gateway.https_url).port
    silent = [
        socket.create_connection((lan, port), timeout=10, source_address=("127.0.0.1", 0)) for _ in range(HANDSHAKES)
    ]
    try:
        wait_until(lambda: gateway.metrics()["sepa_listen_handshakes"] == HANDSHAKES)
        assert _tls_reply(port, source=lan).startswith(b"HTTP/1.1 401")  # served (no token: 401)
        assert gateway.metrics()["sepa_listen_handshakes_evicted"] == 1
        assert silent[0].recv(1) == b""  # the oldest silent one made room
        for _ in range(2):  # the slot the LAN client gave back, then one past the total
            silent.append(socket.create_connection((lan, port), timeout=10, source_address=("127.0.0.1", 0)))
        assert silent[-1].recv(1) == b""  # from the address holding the most: refused
        assert gateway.metrics()["sepa_listen_handshakes_refused"] == 1
    finally:
        for connection in silent:
            connection.close()


def _rss_kib(pid: int) -> int:
    (line,) = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:")]
    return int(line.split()[1])


def test_an_idle_tls_connection_holds_no_256_kib_buffer(start_gateway, tmp_path) -> None:
    """asyncio's TLS protocol keeps a 256 KiB read buffer as long as its connection is open, and the
    gates hold 4,096 connections: 16 LAN addresses of 256 idle HTTPS connections each took the
    gateway from 87 to 1,220 MB (~0.28 MB a connection). Now it reads 32 KiB at a time: 87 -> 319 MB."""
    gateway = start_gateway("--secure", data_dir=tmp_path / "data")
    port = urlsplit(gateway.https_url).port
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    assert _tls_reply(port).startswith(b"HTTP/1.1 401")  # everything a connection needs is loaded
    before = _rss_kib(gateway.process.pid)
    idle = []
    try:
        for _ in range(300):
            idle.append(context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10)))
        time.sleep(0.5)
        grown = _rss_kib(gateway.process.pid) - before
        assert grown < 300 * 100, f"{grown // 300} KiB a connection"
    finally:
        for connection in idle:
            connection.close()
