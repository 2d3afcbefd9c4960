"""The appliance's components on ``/health``: each adapter, the cloud shipper and the clock.

The gates answer ``/health`` and check the store themselves (broker.gates.health); the appliance
adds a check for every other part it runs, in :func:`add_checks`. What each one means:

- an adapter (``mqtt``, ``coap``) is required and ready when its own ``health()`` says ``ok``
  (MQTT: connected to its broker; CoAP: listening). A broker that is down makes the gateway not
  ready, yet alive: readings wait in Mosquitto's session, and a restart would not bring it back.
- ``shipper`` is *not* required: its spool exists to ride out cloud outages, and the gateway does
  its job meanwhile. It is failing once its backlog fills half of ``spool_budget_bytes``: past the
  budget the oldest observations are dropped, so a monitor should hear of it well before; and while
  the cloud's last answer was a refusal only the operator ends (a token refused, 401/403; a URL not
  served, 404/405; a batch refused for good, 400/409/413), whatever the backlog.
- ``clock`` is required: the wall clock must not be before the installation of this code nor the
  last write into the data directory. A Raspberry Pi has no real-time clock: it boots at 1970, or
  at the time fake-hwclock saved at the last shutdown, until NTP sets it, and every observation
  stored meanwhile would carry that time (the cloud would file it decades or days back). Both
  bounds are read once, before the store opens (so the store's own writes do not move them).
  A clock the kernel says is synchronised is ready even before them: they were written while the
  clock ran ahead (set by hand, a bad RTC), and NTP has corrected it since.
- ``clock_sync`` is *not* required: it is failing while the kernel says the wall clock is not
  synchronised (adjtimex(2) answers TIME_ERROR: what ``timedatectl show -p NTPSynchronized``
  reads). Why: fake-hwclock restores the time of the last shutdown, which is after the data
  directory's last write, so ``clock`` is ok while the clock is as far behind as the board was off,
  and every observation stored until NTP steps it carries that time. Not required: a board with no
  NTP server in reach (a plant network) or with a real-time clock and no NTP is never
  synchronised, and would never be ready.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.api import ComponentHealth
from gateway.kernel_clock import kernel_synchronised

if TYPE_CHECKING:
    from broker.api import Gates
    from gateway.appliance.plugins import Adapter
    from gateway.shipper.shipper import Shipper

# the shipper fails its check past this share of its spool budget (the oldest data goes at 100 %)
SHIPPER_BACKLOG_SHARE = 0.5


def add_checks(
    gates: Gates, adapters: dict[str, Adapter], shipper: Shipper | None, budget_bytes: int, clock: ClockFloor
) -> None:
    """Register the appliance's checks on the gates' ``/health``."""
    gates.health.checks["clock"] = clock.check
    gates.health.checks["clock_sync"] = clock_sync_health
    for name, adapter in adapters.items():
        gates.health.checks[name] = lambda adapter=adapter: adapter_health(adapter)
    if shipper is not None:
        gates.health.checks["shipper"] = lambda: shipper_health(shipper.metrics(), budget_bytes, shipper.refusal)


def adapter_health(adapter: Adapter) -> ComponentHealth:
    """An adapter's own account (``{"ok": bool, ...}``), its plain values as the detail."""
    report = adapter.health()
    detail = ", ".join(
        f"{key}={value}" for key, value in report.items() if key != "ok" and isinstance(value, str | int | float | bool)
    )
    return ComponentHealth(bool(report.get("ok")), detail)


def shipper_health(numbers: dict[str, Any], budget_bytes: int, refusal: str | None = None) -> ComponentHealth:
    """Failing once the spool's backlog passes :data:`SHIPPER_BACKLOG_SHARE` of its budget, while
    the spool cannot be opened or written (its disk full: the store alone holds what is not
    spooled), and while the cloud's last answer was a refusal only the operator ends (`refusal`,
    :attr:`gateway.shipper.Shipper.refusal`: a token refused, a URL not served, a batch refused
    for good)."""
    if "backlog_bytes" not in numbers:
        return ComponentHealth(False, "the spool cannot be opened (see the log); trying again", required=False)
    if numbers.get("holding"):
        return ComponentHealth(False, "the spool cannot be written (see the log); trying again", required=False)
    backlog = int(numbers.get("backlog_bytes", 0))
    # by the monotonic clock: the wall clock's time of the last upload said "-3600 s ago" after a step
    since = (
        f"last upload {float(numbers.get('seconds_since_success', 0)):.0f} s ago"
        if numbers.get("last_success_timestamp")
        else "nothing uploaded since start"
    )
    detail = (
        f"backlog {numbers.get('backlog_observations', 0)} observations, {_size(backlog)} of the "
        f"{_size(budget_bytes)} spool budget; {since}"
    )
    if refusal is not None:
        return ComponentHealth(
            False, f"the cloud refuses the uploads ({_refused(refusal)}; see the log); {detail}", required=False
        )
    return ComponentHealth(backlog < SHIPPER_BACKLOG_SHARE * budget_bytes, detail, required=False)


def _refused(reason: str) -> str:
    """A refusal's reason (``http_401``) as the health detail says it."""
    status = reason.removeprefix("http_")
    if status in ("401", "403"):
        return f"HTTP {status}: the token is not accepted for this gateway"
    if status in ("404", "405"):
        return f"HTTP {status}: the URL is not the landing endpoint's"
    return f"HTTP {status}: batches set aside in spool/rejected/"


class ClockFloor:
    """The earliest the wall clock may say: the newer of this code's installation and the data
    directory's last write, taken when the gateway is built."""

    def __init__(self, data_dir: str, synchronised: Callable[[], bool | None] | None = None) -> None:
        """`synchronised`: the kernel's account of the clock (kernel_synchronised by default)."""
        self.synchronised = synchronised or kernel_synchronised
        self.floor, self.source = Path(__file__).stat().st_mtime, "the installation of this code"
        if data_dir:
            written = newest_write(Path(data_dir))
            if written > self.floor:
                self.floor, self.source = written, f"the last write into {data_dir}"

    def check(self) -> ComponentHealth:
        now = time.time()
        if now >= self.floor:
            return ComponentHealth(True, f"{_utc(now)}, after {_utc(self.floor)} ({self.source})")
        if self.synchronised():
            # Why: a clock that ran ahead (set by hand, a bad RTC) and was then corrected by NTP left
            # files stamped in the future, and the gateway was not ready until the clock reached them
            return ComponentHealth(
                True,
                f"{_utc(now)}, synchronised; before {_utc(self.floor)} ({self.source}), written while the "
                "clock was ahead",
            )
        return ComponentHealth(
            False,
            f"the wall clock says {_utc(now)}, before {_utc(self.floor)} ({self.source}): it is not set "
            "(no real-time clock, no NTP yet?) and observations would carry wrong times",
        )


def clock_sync_health(synchronised: Callable[[], bool | None] = kernel_synchronised) -> ComponentHealth:
    """Failing (not required) while the kernel says the wall clock is not synchronised."""
    state = synchronised()
    if state is None:
        return ComponentHealth(True, "unknown: the kernel cannot be asked (adjtimex)", required=False)
    if state:
        return ComponentHealth(True, f"synchronised, {_utc(time.time())}", required=False)
    return ComponentHealth(
        False,
        f"the kernel says the wall clock ({_utc(time.time())}) is not synchronised (no NTP server reached "
        "yet? timedatectl show -p NTPSynchronized): observations stored meanwhile carry its time",
        required=False,
    )


def newest_write(directory: Path, depth: int = 2) -> float:
    """The newest modification time of `directory` and what lies within `depth` levels of it (0 if none):
    the store's files are one level down, a RocksDB directory's two."""
    newest = 0.0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                    if depth > 1 and entry.is_dir(follow_symlinks=False):
                        newest = max(newest, newest_write(Path(entry.path), depth - 1))
                except OSError:
                    continue
    except OSError:
        return newest
    return newest


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count >> 10} KiB"


def _utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
