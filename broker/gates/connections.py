"""How many connections the gates hold open: at most `total` together, and `per_address` from one
address off this board.

Why: every connection holds a descriptor, and the process's descriptors are also the store's
(RocksDB opens files as it compacts), the journal's, the query workers' pipes and the adapters'
sockets. Measured with the gateway limited to 1024 descriptors (the unit allows 8192): 1,100 idle
TCP connections from one host, each kept until `idle_timeout_s`, took all of them; new clients
timed out, and asyncio logged a traceback for every failed accept. Here a connection past a limit
is closed as soon as it is accepted (its descriptor back at once), counted
(`sepa_connections_refused_total`), and logged once a minute at most; past `total`, a connection
from an address holding fewer than another takes that one's oldest place instead
(`sepa_connections_evicted_total`, :class:`ConnectionLimit`). `total` defaults to half the
open-file limit, leaving the other half to everything else; loopback clients (this board's tools,
the adapters) are held to `total` only. A burst holds more for a moment: asyncio accepts up to the
listen backlog (aiohttp's 128) in one pass of its loop before the first of them is seen here, and
a refused one's descriptor is closed two passes later (abort schedules the close), so up to three
backlogs can be open at once: an explicit `total` must leave that much room (CI runs with 400
descriptors and `total` 50 or 100 hit "Too many open files" under 500 connections at once).
"""

from __future__ import annotations

import ipaddress
import logging
import resource
import time
from collections import Counter
from typing import Any

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0


def default_total() -> int:
    """Half the process's soft open-file limit (at least 64)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, (soft if soft != resource.RLIM_INFINITY else 65536) // 2)


def peer_host(transport: Any) -> str | None:
    """The peer's address, or None for this board (loopback, a Unix socket)."""
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple) or not peer:
        return None
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return str(peer[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return None if address.is_loopback else str(address)


class Admission:
    """One admitted connection: the peer it is counted under (None: this board) and its transport."""

    __slots__ = ("host", "transport", "counted", "spared")

    def __init__(self, host: str | None, transport: Any) -> None:
        self.host, self.transport, self.counted = host, transport, True
        # a secure WebSocket whose client sent a valid token: made room for after the others (Shares._evict)
        self.spared = False


class Shares:
    """Connections counted by peer address: at most `per_address` from one network address and
    `total` in all. When all `total` are held, a newcomer from an address holding fewer than the
    address holding the most takes the place of that address's oldest (aborted, whatever it is
    doing), so a host holding many keeps out only addresses holding as many: each address keeps an
    equal share at worst. Used for the gates' connections (:class:`ConnectionLimit`) and for the TLS
    handshakes under way (gateway/appliance/listen.py)."""

    def __init__(self, total: int, per_address: int) -> None:
        self.total, self.per_address = total, per_address
        self.open = 0
        # the connections of each address, oldest first (dicts keep their insertion order)
        self.by_address: dict[str | None, dict[Admission, None]] = {}
        self.evicted = 0

    def take(self, host: str | None, transport: Any) -> Admission | None:
        """`transport`'s place, counted until `release`, or None when it may not have one."""
        held = len(self.by_address.get(host, ()))
        if (host is not None and held >= self.per_address) or (self.open >= self.total and not self._evict(held)):
            return None
        admission = Admission(host, transport)
        self.by_address.setdefault(host, {})[admission] = None
        self.open += 1
        return admission

    def _evict(self, held: int) -> bool:
        """Abort a connection of an address holding the most, if it holds more than `held`: the
        oldest not spared of the first such address that has one, else the first one's oldest.

        Why not the first one's oldest, whatever it is: with addresses holding one connection each,
        the first is the one that came first, and a subscriber's socket, authenticated and open for
        good, becomes that address as the others come and go. 4,096 addresses opening a connection
        each (IPv6 gives a LAN host as many as it likes) evicted it at the 4,096th, every time it
        came back (/tmp/atk-ws/shares_sim.py; a real-socket test shows it with three addresses and
        `max_connections = 2`). A socket with no token left is closed within `[security]
        auth_timeout_s`, so sparing the authenticated ones spares no attacker without credentials,
        and a client with credentials still keeps others only to an equal share: when every
        connection of the tied addresses is spared, the first one's oldest goes."""
        most = max(map(len, self.by_address.values()), default=0)
        if most <= held:
            return False
        tied = [mine for mine in self.by_address.values() if len(mine) == most]
        unspared = (admission for mine in tied for admission in mine if not admission.spared)
        oldest = next(unspared, next(iter(tied[0])))
        self.release(oldest)
        oldest.transport.abort()
        self.evicted += 1
        return True

    def release(self, admission: Admission) -> None:
        """Uncount `admission` (once: an evicted one is released again as its connection is lost).
        Why the admission and not the transport: a transport being lost may no longer say its
        peer (an exception out of connection_lost, seen in a test run), and the address counted at
        admission would then never be released: its 256th connection refused for ever."""
        if not admission.counted:
            return
        admission.counted = False
        self.open -= 1
        mine = self.by_address[admission.host]
        del mine[admission]
        if not mine:
            del self.by_address[admission.host]


class ConnectionLimit(Shares):
    """Admission of the gates' connections (see the module docstring and :class:`Shares`). Why a
    newcomer takes the oldest place of the address holding the most rather than being refused:
    16 LAN addresses of 256 idle HTTPS connections each (4,096, reopened every `idle_timeout_s`)
    reset every other client's connection on every port, this board's tools on the plain port
    too (/tmp/atk-tls/idle_tls.py). Whatever the victim is doing: a WebSocket upgrade needs no
    token, so sparing busy connections would spare an attacker's."""

    def __init__(self, counters: Counter[str], *, total: int = 0, per_address: int = 256) -> None:
        super().__init__(total or default_total(), per_address)
        self.counters = counters
        self._logged_at = float("-inf")

    def admit(self, transport: Any) -> Admission | None:
        """The connection of `transport` counted until `release`, or None when it may not stay."""
        host = peer_host(transport)
        evicted = self.evicted
        admission = self.take(host, transport)
        self.counters["connections_evicted"] += self.evicted - evicted
        if admission is None:
            self.counters["connections_refused"] += 1
            now = time.monotonic()
            if now - self._logged_at >= LOG_EVERY_S:
                self._logged_at = now
                log.warning(
                    "connections refused",
                    extra={"open": self.open, "total": self.total, "per_address": self.per_address, "peer": host},
                )
        return admission
