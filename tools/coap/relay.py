"""A lossy UDP relay: forwards datagrams between CoAP clients and a server, dropping some each way.

Why: the exactly-once claims of the CoAP adapter (a retransmitted confirmable request is never a
second observation; a reading acknowledged is stored) only mean something on a lossy network, and a
relay we control loses packets reproducibly (a seeded random generator) on plain 127.0.0.1 sockets,
with no root and no tc/netem. Each client address gets its own upstream socket, so the server sees
one peer per client, as it would without the relay.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

HOST = "127.0.0.1"


@dataclass
class RelayStats:
    forwarded: int = 0
    dropped_up: int = 0
    dropped_down: int = 0


class _Upstream(asyncio.DatagramProtocol):
    def __init__(self, relay: LossyRelay, client: tuple[str, int]) -> None:
        self.relay, self.client = relay, client
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: list[bytes] = []  # received for the server before the socket was open

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        for data in self.pending:
            self.transport.sendto(data, self.relay.server)
        self.pending.clear()

    def datagram_received(self, data: bytes, _addr: tuple[str, int]) -> None:
        self.relay.down(data, self.client)


class LossyRelay(asyncio.DatagramProtocol):
    """Listens on 127.0.0.1:`port` (0: any); drops `loss` of the datagrams in each direction."""

    def __init__(self, server: tuple[str, int], loss: float, seed: int = 7) -> None:
        self.server = server
        self.loss = loss
        self.random = random.Random(seed)
        self.stats = RelayStats()
        self.transport: asyncio.DatagramTransport | None = None
        self._upstreams: dict[tuple[str, int], _Upstream] = {}

    async def start(self, port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self, local_addr=(HOST, port))
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def close(self) -> None:
        for upstream in self._upstreams.values():
            if upstream.transport is not None:
                upstream.transport.close()
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.random.random() < self.loss:
            self.stats.dropped_up += 1
            return
        upstream = self._upstreams.get(addr)
        if upstream is None:
            upstream = self._upstreams[addr] = _Upstream(self, addr)
            loop = asyncio.get_running_loop()
            loop.create_task(loop.create_datagram_endpoint(lambda: upstream, local_addr=(HOST, 0)))
        self.stats.forwarded += 1
        if upstream.transport is None:
            upstream.pending.append(data)
        else:
            upstream.transport.sendto(data, self.server)

    def down(self, data: bytes, client: tuple[str, int]) -> None:
        if self.random.random() < self.loss:
            self.stats.dropped_down += 1
            return
        if self.transport is not None:
            self.transport.sendto(data, client)
            self.stats.forwarded += 1
