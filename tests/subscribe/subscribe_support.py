"""Support for the subscribe tests: a real `sepa-gateway run` subprocess and clients that misbehave.

What it protects: the tests in this directory talk to the gateway only over real sockets, the way
deployed SEPA clients do. :func:`running_gateway` starts the installed ``sepa-gateway run`` on free
ports (in-memory store, optional TOML config), waits until both gates accept connections, captures
its log and stops it with SIGTERM. :class:`RawWebSocket` is a WebSocket client written on a plain
socket so a test can make it stop reading or stop answering pings on purpose, which no well-behaved
client library allows. The ``/proc`` helpers let a test see whether the gateway process still holds
a TCP connection and how much it could not send on it (Linux only; they return None elsewhere).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

HOST = "127.0.0.1"
START_TIMEOUT_S = 15.0


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports that were free a moment ago (bound to port 0, then released)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def gateway_command() -> list[str]:
    """The installed `sepa-gateway` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("sepa-gateway")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]


@dataclass
class GatewayProcess:
    """A running `sepa-gateway run` and the URLs it serves."""

    process: subprocess.Popen[bytes]
    http_port: int
    ws_port: int
    log_path: Path

    @property
    def http(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def update_url(self) -> str:
        return f"{self.http}/update"

    @property
    def query_url(self) -> str:
        return f"{self.http}/query"

    @property
    def ws_url(self) -> str:
        """The subscribe gate on the WebSocket port."""
        return f"ws://{HOST}:{self.ws_port}/subscribe"

    @property
    def ws_url_on_http_port(self) -> str:
        """The same gate, also served on the HTTP port (one origin for browsers)."""
        return f"ws://{HOST}:{self.http_port}/subscribe"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def metrics(self) -> dict[str, float]:
        """/metrics as {series: value}; labelled series keep their labels in the key."""
        with urllib.request.urlopen(f"{self.http}/metrics", timeout=5) as response:
            text = response.read().decode("utf-8")
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def metric(self, name: str) -> float:
        return self.metrics().get(name, 0.0)

    def wait_for_metric(self, name: str, accept: Callable[[float], bool], timeout: float = 5.0) -> float:
        """Poll /metrics until `accept(value)`; fails with the last value seen after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.metric(name)
            if accept(value):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} is still {value} after {timeout} s")
            time.sleep(0.02)

    def holds_connection_from(self, client_port: int) -> bool | None:
        """Whether the gateway process still has an open socket for the client at `client_port`."""
        rows = (_tcp_rows(self.ws_port, client_port) or []) + (_tcp_rows(self.http_port, client_port) or [])
        inodes = {inode for _, inode in rows}
        fd_dir = f"/proc/{self.process.pid}/fd"
        if not Path("/proc/net/tcp").exists():
            return None
        try:
            links = set()
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):  # an fd closed while we look
                    links.add(os.readlink(f"{fd_dir}/{fd}"))
        except OSError:
            return None
        return any(f"socket:[{inode}]" in links for inode in inodes if inode)

    def send_queue_to(self, client_port: int) -> int | None:
        """Bytes the kernel holds unsent (or unacknowledged) on the gateway's side of that connection."""
        rows = _tcp_rows(self.ws_port, client_port)
        if rows is None:
            return None
        return max((tx_queue for tx_queue, _ in rows), default=0)


def _tcp_rows(local_port: int, remote_port: int) -> list[tuple[int, int]] | None:
    """(tx_queue, inode) of the IPv4 TCP sockets local_port <-> remote_port, from /proc/net/tcp."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    rows = []
    for line in lines:
        fields = line.split()
        local, remote, queues, inode = fields[1], fields[2], fields[4], fields[9]
        if int(local.split(":")[1], 16) == local_port and int(remote.split(":")[1], 16) == remote_port:
            rows.append((int(queues.split(":")[0], 16), int(inode)))
    return rows


def _accepts_connections(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def running_gateway(directory: Path, config: str | None = None) -> Iterator[GatewayProcess]:
    """Run `sepa-gateway run` (in-memory store) on free ports with an optional TOML config text."""
    directory.mkdir(parents=True, exist_ok=True)
    http_port, ws_port = free_ports(2)
    command = [*gateway_command(), "run", "--host", HOST, "--http-port", str(http_port), "--ws-port", str(ws_port)]
    command.append("--no-mqtt")  # no broker in these tests
    if config is not None:
        config_path = directory / "sepa-gateway.toml"
        config_path.write_text(config, encoding="utf-8")
        command += ["--config", str(config_path)]
    log_path = directory / "gateway.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    gateway = GatewayProcess(process, http_port, ws_port, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (_accepts_connections(ws_port) and _accepts_connections(http_port)):
            if process.poll() is not None:
                raise RuntimeError(f"sepa-gateway exited with {process.returncode}:\n{gateway.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"sepa-gateway did not start within {START_TIMEOUT_S} s:\n{gateway.log()}")
            time.sleep(0.05)
        yield gateway
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class RawWebSocket:
    """A minimal RFC 6455 client on a plain socket that reads only when told to.

    It never answers pings by itself, so it can play a client that stopped reading (stalled) or one
    that vanished from the network (silent). `receive_buffer` shrinks SO_RCVBUF so that a stall
    backs up into the gateway quickly.
    """

    def __init__(self, port: int, path: str = "/subscribe", receive_buffer: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(5.0)
        self.sock.connect((HOST, port))
        key = base64.b64encode(os.urandom(16)).decode("ascii")
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode("ascii")
        )
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the WebSocket handshake")
            self.buffer += chunk
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status = head.split(b"\r\n")[0]
        if b" 101 " not in status + b" ":
            raise ConnectionError(f"handshake refused: {status!r}")

    @property
    def local_port(self) -> int:
        return int(self.sock.getsockname()[1])

    def send_json(self, message: Any) -> None:
        self.send_frame(0x1, json.dumps(message).encode("utf-8"))

    def send_frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        header = bytearray([0x80 | opcode])
        if len(payload) < 126:
            header.append(0x80 | len(payload))
        elif len(payload) < 1 << 16:
            header += bytes([0x80 | 126]) + len(payload).to_bytes(2, "big")
        else:
            header += bytes([0x80 | 127]) + len(payload).to_bytes(8, "big")
        masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
        self.sock.sendall(bytes(header) + mask + masked)

    def _read_exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the gateway closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def receive_frame(self) -> tuple[int, bytes]:
        first, second = self._read_exactly(2)
        length = second & 0x7F
        if length == 126:
            length = int.from_bytes(self._read_exactly(2), "big")
        elif length == 127:
            length = int.from_bytes(self._read_exactly(8), "big")
        return first & 0x0F, self._read_exactly(length)

    def receive_json(self) -> Any:
        """The next text message, skipping (and not answering) pings."""
        while True:
            opcode, payload = self.receive_frame()
            if opcode == 0x1:
                return json.loads(payload)
            if opcode == 0x8:
                raise ConnectionError(f"the gateway sent a close frame: {payload!r}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


# -- asyncio helpers (aiohttp clients) ------------------------------------------------------------


async def post_update(session: aiohttp.ClientSession, gateway: GatewayProcess, sparql: str) -> dict[str, Any]:
    """POST a SPARQL update (form-encoded); the reply must be 200 with the JSON counts."""
    async with session.post(gateway.update_url, data={"update": sparql}) as response:
        body = await response.text()
        assert response.status == 200, body
        return json.loads(body)


async def metric_now(session: aiohttp.ClientSession, gateway: GatewayProcess, name: str) -> float:
    async with session.get(f"{gateway.http}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == name:
            return float(value)
    return 0.0


async def wait_for_metric(
    session: aiohttp.ClientSession,
    gateway: GatewayProcess,
    name: str,
    accept: Callable[[float], bool],
    timeout: float = 5.0,
) -> float:
    """Poll /metrics until `accept(value)`; fails with the last value after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await metric_now(session, gateway, name)
        if accept(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{name} is still {value} after {timeout} s")
        await asyncio.sleep(0.02)


async def receive_json(ws: aiohttp.ClientWebSocketResponse, timeout: float = 5.0) -> dict[str, Any]:
    """The next message on the socket, which must be a JSON text frame."""
    message = await ws.receive(timeout=timeout)
    assert message.type == aiohttp.WSMsgType.TEXT, f"expected a text frame, got {message}"
    return json.loads(message.data)


async def subscribe(ws: aiohttp.ClientWebSocketResponse, body: dict[str, Any]) -> dict[str, Any]:
    """Send {"subscribe": body}; returns the reply, which must be the sequence-0 notification."""
    await ws.send_json({"subscribe": body})
    reply = await receive_json(ws)
    assert "notification" in reply, reply
    assert reply["notification"]["sequence"] == 0, reply
    return reply["notification"]
