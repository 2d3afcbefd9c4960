"""How many connections the gates hold open: at most `total` together, and `per_address` from one
address off this board.

Why: every connection holds a descriptor, and the process's descriptors are also the store's
(RocksDB opens files as it compacts), the journal's, the query workers' pipes and the adapters'
sockets. Measured with the gateway limited to 1024 descriptors (the unit allows 8192): 1,100 idle
TCP connections from one host, each kept until `idle_timeout_s`, took all of them; new clients
timed out, and asyncio logged a traceback for every failed accept. Here a connection past a limit
is closed as soon as it is accepted (its descriptor back at once), counted
(`sepa_connections_refused_total`), and logged once a minute at most. `total` defaults to half the
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
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Admission:
    """One admitted connection: the peer it is counted under (None: this board)."""

    host: str | None


class ConnectionLimit:
    """Admission of the gates' connections (see the module docstring)."""

    def __init__(self, counters: Counter[str], *, total: int = 0, per_address: int = 256) -> None:
        self.counters = counters
        self.total = total or default_total()
        self.per_address = per_address
        self.open = 0
        self.by_address: Counter[str] = Counter()
        self._logged_at = float("-inf")

    def admit(self, transport: Any) -> Admission | None:
        """The connection of `transport` counted until `release`, or None when it may not stay."""
        host = peer_host(transport)
        if self.open >= self.total or (host is not None and self.by_address[host] >= self.per_address):
            self.counters["connections_refused"] += 1
            now = time.monotonic()
            if now - self._logged_at >= LOG_EVERY_S:
                self._logged_at = now
                log.warning(
                    "connections refused",
                    extra={"open": self.open, "total": self.total, "per_address": self.per_address, "peer": host},
                )
            return None
        self.open += 1
        if host is not None:
            self.by_address[host] += 1
        return Admission(host)

    def release(self, admission: Admission) -> None:
        """Why the admission and not the transport: a transport being lost may no longer say its
        peer (an exception out of connection_lost, seen in a test run), and the address counted at
        admission would then never be released: its 256th connection refused for ever."""
        self.open -= 1
        host = admission.host
        if host is not None:
            self.by_address[host] -= 1
            if self.by_address[host] <= 0:
                del self.by_address[host]
