"""Support for the subscribe tests: clients that misbehave, and what the gateway holds for them.

What it protects: the subscribe tests talk to the gateway (tools.launcher, through the fixtures of
tests/conftest.py) only over real sockets, the way deployed SEPA clients do. :class:`RawWebSocket`
is a WebSocket client written on a plain socket so a test can make it stop reading or stop answering
pings on purpose, which no well-behaved client library allows. The ``/proc`` helpers let a test see
whether the gateway process still holds a TCP connection and how much it could not send on it (Linux
only; they return None elsewhere).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from tools.launcher import HOST, RunningGateway


def holds_connection_from(gateway: RunningGateway, client_port: int) -> bool | None:
    """Whether the gateway process still has an open socket for the client at `client_port`."""
    rows = (_tcp_rows(gateway.ws_port, client_port) or []) + (_tcp_rows(gateway.http_port, client_port) or [])
    inodes = {inode for _, inode in rows}
    fd_dir = f"/proc/{gateway.process.pid}/fd"
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


def send_queue_to(gateway: RunningGateway, client_port: int) -> int | None:
    """Bytes the kernel holds unsent (or unacknowledged) on the gateway's side of that connection."""
    rows = _tcp_rows(gateway.ws_port, client_port)
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


class RawWebSocket:
    """A minimal RFC 6455 client on a plain socket that reads only when told to.

    It never answers pings by itself, so it can play a client that stopped reading (stalled) or one
    that vanished from the network (silent). `receive_buffer` shrinks SO_RCVBUF so that a stall
    backs up into the gateway quickly.
    """

    def __init__(
        self, port: int, path: str = "/subscribe", receive_buffer: int | None = None, address: str = HOST
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(5.0)
        if address != HOST:
            self.sock.bind((address, 0))  # the peer the gateway sees: this address, not loopback
        self.sock.connect((address, port))
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

    def send_frame(self, opcode: int, payload: bytes, *, masked: bool = True) -> None:
        """One frame; `masked=False` sends it as only a server may (RFC 6455 5.1)."""
        mask = os.urandom(4) if masked else b""
        bit = 0x80 if masked else 0
        header = bytearray([0x80 | opcode])
        if len(payload) < 126:
            header.append(bit | len(payload))
        elif len(payload) < 1 << 16:
            header += bytes([bit | 126]) + len(payload).to_bytes(2, "big")
        else:
            header += bytes([bit | 127]) + len(payload).to_bytes(8, "big")
        if masked:
            payload = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
        self.sock.sendall(bytes(header) + mask + payload)

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

    def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0), not a FIN: a client whose Wi-Fi dropped, or killed."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()


# -- asyncio helpers (aiohttp clients) ------------------------------------------------------------


async def post_update(session: aiohttp.ClientSession, gateway: RunningGateway, sparql: str) -> dict[str, Any]:
    """POST a SPARQL update (form-encoded); the reply must be 200 with the JSON counts."""
    async with session.post(gateway.update_url, data={"update": sparql}) as response:
        body = await response.text()
        assert response.status == 200, body
        return json.loads(body)


async def metric_now(session: aiohttp.ClientSession, gateway: RunningGateway, name: str) -> float:
    async with session.get(f"{gateway.http_url}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == name:
            return float(value)
    return 0.0


async def wait_for_metric(
    session: aiohttp.ClientSession,
    gateway: RunningGateway,
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
