"""``/health``: liveness and readiness, one check per component, for probes and monitoring.

Why two answers: a probe that restarts the process (systemd, a watchdog) must ask only whether the
process is alive, or it would restart a gateway whose MQTT broker is down, which no restart fixes;
a monitor or a load balancer asks whether the gateway can do its job now. So:

- ``GET /health/live``: 200 ``{"status": "alive"}`` whenever the event loop answers at all;
- ``GET /health``: 200 when every *required* component is ready, else 503; the body always gives
  every component's ``status`` ("ok" or "failing"), whether it is ``required`` and a one-line
  ``detail``, with the gateway's ``version`` and ``uptime_s``.

The gates know no component but the store and its scheduler: the appliance adds its own checks
(adapters, shipper, clock) to :attr:`Health.checks`. A check runs on the event loop, so it must be
cheap and must not block (it reads counters and flags); one that raises is a failing component,
whose detail is the exception, never a 500.

Where it is served: beside ``/metrics``, on the plain HTTP port only, which the installed appliance
binds to 127.0.0.1 (docs/security.md): a probe on the board asks it without a token, and nothing is
exposed on the network unauthenticated.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from broker.scheduler import Scheduler
from broker.version import gateway_version

log = logging.getLogger(__name__)

# Below this much free space on the store's file system the store is not ready: the journal and
# RocksDB need room for the next updates, and a full disk fails every update (and every reading).
MIN_FREE_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class ComponentHealth:
    """One component's answer: ready or not, why, and whether the gateway's readiness needs it."""

    ok: bool
    detail: str
    required: bool = True


Check = Callable[[], ComponentHealth]


class Health:
    """The checks by component name and the two handlers that answer them."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.started = time.monotonic()
        self.checks: dict[str, Check] = {
            "store": lambda: store_health(scheduler),
            "engine": lambda: engine_health(scheduler),
        }

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started

    def report(self) -> tuple[bool, dict[str, object]]:
        """Whether every required component is ready, and the body of ``/health``."""
        components: dict[str, dict[str, object]] = {}
        ready = True
        for name, check in self.checks.items():
            try:
                result = check()
            except Exception as error:  # a broken check is a failing component, not a failing endpoint
                log.debug("health check failed", exc_info=True, extra={"component": name})
                result = ComponentHealth(False, f"the check failed: {type(error).__name__}: {error}")
            ready = ready and (result.ok or not result.required)
            components[name] = {
                "status": "ok" if result.ok else "failing",
                "required": result.required,
                "detail": result.detail,
            }
        body = {
            "status": "ready" if ready else "not ready",
            "version": gateway_version(),
            "uptime_s": round(self.uptime_s, 3),
            "components": components,
        }
        return ready, body

    async def ready(self, request: web.BaseRequest) -> web.Response:
        ready, body = self.report()
        return web.Response(
            text=json.dumps(body), status=200 if ready else 503, content_type="application/json", charset="utf-8"
        )

    async def live(self, request: web.BaseRequest) -> web.Response:
        return web.Response(text='{"status": "alive"}', content_type="application/json", charset="utf-8")


def store_health(scheduler: Scheduler) -> ComponentHealth:
    """Ready when the store answers a read, the request queue has room, the machine's available
    memory is over the store's floor (:mod:`broker.headroom`) and, on disk, its file system has
    :data:`MIN_FREE_BYTES` free."""
    store = scheduler.engine.store
    store.query("ASK { ?s ?p ?o }")  # raises if the store cannot be read (reported as failing)
    if scheduler.in_flight >= scheduler.queue_size:
        return ComponentHealth(False, f"the request queue is full ({scheduler.queue_size} requests): new ones get 429")
    headroom = store.headroom
    if headroom is not None and headroom.low:
        return ComponentHealth(
            False,
            f"{headroom.available >> 20 if headroom.available else 0} MiB of memory available, under the floor of "
            f"{headroom.floor_bytes >> 20} MiB: updates that add to the store get 507",
        )
    if store.path is None:
        return ComponentHealth(True, "in memory")
    free = shutil.disk_usage(store.path).free
    where = f"on disk at {store.path}, {free >> 20} MiB free"
    if free < MIN_FREE_BYTES:
        return ComponentHealth(False, f"{where}: less than {MIN_FREE_BYTES >> 20} MiB, updates will fail")
    return ComponentHealth(True, where)


def engine_health(scheduler: Scheduler) -> ComponentHealth:
    """The processing mode; in parallel mode, not ready while a BOOSTER worker is dead or a failure
    waits for recovery: the updates it left unfinished are held (their publishers wait) until every
    SPU is evaluated again, at the next request or at once when nothing else is in flight.

    Why: an attack pass killed a worker; `/health` said ready while subscriptions were wrong and
    updates held. A worker that is stopped (SIGSTOP), not dead, is found only by the reply
    timeout (broker.core.pipeline.REPLY_TIMEOUT_S)."""
    engine = scheduler.engine
    figures = engine.spus.metrics()
    if "workers" not in figures:
        return ComponentHealth(True, "sequential mode" if engine.mode == "incremental" else f"{engine.mode} mode")
    started, alive = figures["workers_started"], figures["workers"]
    detail = (
        f"parallel mode: {alive} of {started} BOOSTER workers alive, {figures['in_flight']} updates in flight, "
        f"{figures['died_total']} died and {figures['recovered_total']} recoveries since start"
    )
    if alive < started or figures["broken"]:
        return ComponentHealth(False, f"{detail}; updates wait until the workers are replaced")
    return ComponentHealth(True, detail)
