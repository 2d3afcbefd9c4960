"""Refusing to grow the store while the machine is short of memory.

Why: the store lives in memory (in memory, and resident on disk: :mod:`broker.store`), and so does
every worker's replica of it. Nothing else bounds its size: a writer allowed to update (a client
with write rights; a sensor publishing on thousands of new topics under a wildcard mapping) could
grow it until the kernel's OOM killer ends the gateway, the largest process. With a resident store
the next start loads the same snapshot and journals, and is killed again: a crash loop no restart
ends. So while the machine's available memory (``MemAvailable`` in /proc/meminfo: free memory plus
what the kernel can reclaim, the page cache among it) is under a floor, an update that would add
more quads than it removes is refused with :class:`~broker.errors.StoreFull` (507) and changes
nothing. Updates that remove at least as much as they add still run: retention's pruning and a
client's DELETE are what give the memory back. The MQTT intake retries a refused batch with backoff
(the readings wait in Mosquitto's session, none is lost); a CoAP sensor is answered 5.03.

The floor: by default an eighth of the machine's memory, at least 64 MiB (a 1 GB board: 120 MiB).
A compaction copies the live quads beside the dead ones (:mod:`broker.compaction`) and the query
workers' replicas grow with every delta: the floor is the room they need, not a share the store may
fill. Sampled at most every SAMPLE_S, on the thread that runs the update (one read of
/proc/meminfo: ~13 us on the test machine), so an idle gateway reads nothing.
"""

from __future__ import annotations

import threading
import time

from broker.errors import StoreFull

SAMPLE_S = 0.25
MIN_FLOOR_BYTES = 64 << 20
FLOOR_SHARE = 8  # the default floor: this fraction of MemTotal (at least MIN_FLOOR_BYTES)
_MEMINFO = "/proc/meminfo"


def meminfo() -> dict[str, int]:
    """/proc/meminfo's figures in bytes (MemTotal, MemAvailable...); empty where there is none."""
    try:
        with open(_MEMINFO, "rb") as file:
            text = file.read()
    except OSError:
        return {}
    figures: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(b":")
        fields = value.split()
        if fields and fields[0].isdigit():
            figures[name.decode()] = int(fields[0]) * (1024 if fields[-1:] == [b"kB"] else 1)
    return figures


def default_floor() -> int:
    """An eighth of the machine's memory, at least MIN_FLOOR_BYTES."""
    return max(MIN_FLOOR_BYTES, meminfo().get("MemTotal", 0) // FLOOR_SHARE)


class Headroom:
    """The floor of available memory under which the store may not grow; :attr:`refused` counts
    the updates refused for it (for /metrics)."""

    def __init__(self, floor_bytes: int | None = None) -> None:
        self.floor_bytes = default_floor() if floor_bytes is None else floor_bytes
        self.available: int | None = None  # at the last sample (None: not known on this system)
        self.refused = 0
        self._sampled = -SAMPLE_S
        self._lock = threading.Lock()

    def sample(self) -> int | None:
        """The available memory, read again if the last reading is older than SAMPLE_S."""
        now = time.monotonic()
        if now - self._sampled >= SAMPLE_S:
            self._sampled = now
            self.available = meminfo().get("MemAvailable")
        return self.available

    @property
    def low(self) -> bool:
        """Whether the machine is under the floor now (an unknown figure is not low)."""
        available = self.sample()
        return available is not None and available < self.floor_bytes

    def check(self, growth: int) -> None:
        """Raise StoreFull if `growth` quads more would be added while memory is low."""
        if growth <= 0 or not self.low:
            return
        with self._lock:
            self.refused += 1
        assert self.available is not None
        raise StoreFull(
            f"the gateway is short of memory ({self.available >> 20} MiB available, under its floor of "
            f"{self.floor_bytes >> 20} MiB): updates that add to the store are refused until deletions "
            "or retention free some"
        )

    def metrics(self) -> dict[str, int]:
        """For /metrics: the available memory (sampled again if stale), the floor, the refusals."""
        return {
            "memory_available_bytes": self.sample() or 0,
            "memory_floor_bytes": self.floor_bytes,
            "refused_growth_total": self.refused,
        }
