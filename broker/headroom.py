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

A limit on the gateway's control group counts as the machine's memory: a unit's ``MemoryMax=`` or
``MemoryHigh=``, a container's ``--memory`` (cgroup v2 ``memory.max`` / ``memory.high`` of its group
and of every group above it; v1 ``memory.limit_in_bytes`` and the hierarchical limit). There the
kernel's OOM killer ends the group's processes once they reach the limit however much the machine
has free, so what is available is the least of MemAvailable and, for each limit, the limit less what
the group uses (``memory.current`` or ``memory.usage_in_bytes``, less its inactive page cache, which
the kernel reclaims before it kills: as ``docker stats`` counts it). The group is read from
/proc/self/cgroup at each sample (systemd may move a process; ~30 us in all on the test machine).

The floor: by default an eighth of the machine's memory, at least 64 MiB (a 1 GB board: 120 MiB);
in a group with a limit, an eighth of the limit.
A compaction copies the live quads beside the dead ones (:mod:`broker.compaction`) and the query
workers' replicas grow with every delta: the floor is the room they need, not a share the store may
fill. Sampled at most every SAMPLE_S, on the thread that runs the update (one read of
/proc/meminfo: ~13 us on the test machine), so an idle gateway reads nothing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from broker.errors import StoreFull

SAMPLE_S = 0.25
MIN_FLOOR_BYTES = 64 << 20
FLOOR_SHARE = 8  # the default floor: this fraction of MemTotal (at least MIN_FLOOR_BYTES)
_MEMINFO = "/proc/meminfo"
_PROC_CGROUP = "/proc/self/cgroup"
_CGROUP_ROOT = "/sys/fs/cgroup"
NO_LIMIT = 1 << 60  # v1 writes "no limit" as the largest page-aligned 64-bit number; v2 as "max"


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


def _number(path: Path) -> int | None:
    """The number a cgroup file holds; None for none ("max", absent, unreadable)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat(path: Path) -> dict[str, int]:
    """A cgroup's memory.stat figures (empty when absent)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return {key: int(value) for key, _, value in (line.partition(" ") for line in lines) if value.isdigit()}


def _groups(proc_cgroup: str, root: Path) -> list[tuple[Path, bool]]:
    """The memory cgroup directories whose limits hold this process, each with whether it is a
    v1 group: the v2 group and every group above it to the root; or the v1 memory group (its
    hierarchical limit covers those above). In a container the path /proc names may not exist in
    the container's view of /sys/fs/cgroup, whose root is then the container's own group."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return []
    groups: list[tuple[Path, bool]] = []
    for line in lines:
        _hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        relative = relative.strip("/")
        if controllers == "":  # v2; in a hybrid layout mounted elsewhere, without the memory controller
            if not (root / "cgroup.controllers").exists():
                continue
            group = root / relative
            if not group.is_dir():
                group = root
            groups.append((group, False))
            while group != root and root in group.parents:
                group = group.parent
                groups.append((group, False))
        elif "memory" in controllers.split(","):
            mount = root / "memory"
            group = mount / relative
            groups.append((group if (group / "memory.limit_in_bytes").exists() else mount, True))
    return groups


def cgroup_limit(proc_cgroup: str = _PROC_CGROUP, root: str = _CGROUP_ROOT) -> tuple[int, int] | None:
    """The tightest memory limit of this process's control groups and the room left under it
    (the limit less what the group uses, less its inactive page cache), in bytes; None without one."""
    tightest: tuple[int, int] | None = None
    for group, v1 in _groups(proc_cgroup, Path(root)):
        stat = _stat(group / "memory.stat")
        if v1:
            limits = [_number(group / "memory.limit_in_bytes"), stat.get("hierarchical_memory_limit")]
            used = _number(group / "memory.usage_in_bytes") or 0
            inactive = stat.get("total_inactive_file", 0)
        else:
            limits = [_number(group / "memory.max"), _number(group / "memory.high")]
            used = _number(group / "memory.current") or 0
            inactive = stat.get("inactive_file", 0)
        limit = min((value for value in limits if value and value < NO_LIMIT), default=None)
        if limit is None:
            continue
        room = max(0, limit - max(0, used - inactive))
        if tightest is None or room < tightest[1]:
            tightest = (limit, room)
    return tightest


def default_floor() -> int:
    """An eighth of the machine's memory (of its control group's limit, if lower), at least
    MIN_FLOOR_BYTES."""
    total = meminfo().get("MemTotal", 0)
    limited = cgroup_limit()
    if limited is not None:
        total = min(total, limited[0]) if total else limited[0]
    return max(MIN_FLOOR_BYTES, total // FLOOR_SHARE)


class Headroom:
    """The floor of available memory under which the store may not grow; :attr:`refused` counts
    the updates refused for it (for /metrics)."""

    def __init__(
        self, floor_bytes: int | None = None, *, proc_cgroup: str = _PROC_CGROUP, cgroup_root: str = _CGROUP_ROOT
    ) -> None:
        """`proc_cgroup` and `cgroup_root`: where this process's control groups are read (another
        process's, or a test's tree)."""
        self.floor_bytes = default_floor() if floor_bytes is None else floor_bytes
        self.available: int | None = None  # at the last sample (None: not known on this system)
        self.limit: int | None = None  # the tightest control group limit at the last sample
        self.refused = 0
        self._cgroup = (proc_cgroup, cgroup_root)
        self._sampled = -SAMPLE_S
        self._lock = threading.Lock()

    def sample(self) -> int | None:
        """The available memory, read again if the last reading is older than SAMPLE_S."""
        now = time.monotonic()
        if now - self._sampled >= SAMPLE_S:
            self._sampled = now
            available = meminfo().get("MemAvailable")
            limited = cgroup_limit(*self._cgroup)
            self.limit = None if limited is None else limited[0]
            if limited is not None:
                available = limited[1] if available is None else min(available, limited[1])
            self.available = available
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
            "memory_limit_bytes": self.limit or 0,
            "refused_growth_total": self.refused,
        }
