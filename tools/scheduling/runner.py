"""The scheduling benchmark: how late delayed updates fire while the lighting LAMP profile runs.

Procedure:

1. A gateway core in this process (engine, scheduler, delayed-update timer) over the ~334k-triple
   lighting knowledge base, on disk by default (RocksDB store and SQLite pending table in a
   temporary data directory, as deployed), with the 1,004 subscriptions of profile S.
2. N delayed updates are scheduled (through the same call the HTTP gate makes), due uniformly
   over a window that opens after a lead time long enough to schedule them all: each sets a
   lamp's dimming to "0" (the OFF of the smart-lighting example), so the subscribed ones notify.
3. During the window, C clients send the U_LAMP update stream back to back through the scheduler
   (the LAMP profile, cycled): delayed updates compete with a saturated update path.
4. Lateness of each delayed update = the engine-clock instant of its own request minus its due
   time (what the timer, the queue behind LAMP updates and the update processor add together).
   An update that ran early would show a negative lateness: the report counts them (must be 0).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.api import Engine, PendingUpdates, RdfStore, Scheduler, now_micros
from tools.lighting.knowledge_base import N_ROADS, lamp_uri, lamps_in_road
from tools.lighting.profiles import PREFIX
from tools.wire.workload import kb_quads, subscriptions, update_stream

Log = Callable[[str], None]


@dataclass(frozen=True)
class SchedulingOptions:
    """What one run does; the defaults are the benchmark's (issue 5)."""

    delayed: int = 10_000
    window_s: float = 20.0  # the delayed updates fall due uniformly over this window
    lead_s: float = 10.0  # the window opens this long after scheduling starts
    concurrency: int = 4
    lamps_per_road: int | None = None  # None: the full knowledge base
    on_disk: bool = True
    seed: int = 5


def off_update(x: int, y: int) -> str:
    """The delayed OFF of lamp Y of road X (dimming "0")."""
    lamp = lamp_uri(x, y)
    return (
        f'{PREFIX}DELETE {{ <{lamp}> ns:hasDimmingValue ?d }} INSERT {{ <{lamp}> ns:hasDimmingValue "0" }} '
        f"WHERE {{ <{lamp}> ns:hasDimmingValue ?d }}"
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _run(options: SchedulingOptions, directory: str | None, log: Log) -> dict[str, Any]:
    store = RdfStore.open(directory) if directory else RdfStore.memory()
    started = time.perf_counter()
    store.ox.bulk_extend(kb_quads(options.lamps_per_road))
    triples = len(store.ox)
    log(f"knowledge base: {triples:,} triples loaded in {time.perf_counter() - started:.1f} s")
    pending = PendingUpdates(directory)
    scheduler = Scheduler(Engine(store), queue_size=100_000, pending=pending, max_pending=options.delayed + 1)
    delayed = scheduler.delayed
    try:
        for spec in subscriptions():
            await scheduler.subscribe(spec.sparql, lambda _notification: None, alias=spec.name)
        log(f"subscriptions: {scheduler.engine.subscription_count:,}")

        rng = random.Random(options.seed)
        lamps_cap = options.lamps_per_road
        lamps = [
            (x, y)
            for x in range(1, N_ROADS + 1)
            for y in range(1, min(lamps_in_road(x), lamps_cap or lamps_in_road(x)) + 1)
        ]
        window_us = int(options.window_s * 1_000_000)
        opens = now_micros() + int(options.lead_s * 1_000_000)
        started = time.perf_counter()
        for _ in range(options.delayed):
            await delayed.schedule(off_update(*rng.choice(lamps)), opens + rng.randrange(window_us))
        schedule_s = time.perf_counter() - started
        log(f"scheduled {options.delayed:,} delayed updates in {schedule_s:.2f} s")
        if now_micros() >= opens:
            raise RuntimeError(f"scheduling took longer than the {options.lead_s} s lead: raise --lead")

        stream = [update.sparql for update in update_stream(10 * N_ROADS)]
        closes = (opens + window_us) / 1_000_000
        sent = 0

        async def lamp_client(offset: int) -> None:
            nonlocal sent
            k = offset
            while time.time() < closes:
                await scheduler.update(stream[k % len(stream)])
                sent += 1
                k += options.concurrency

        load_started = time.perf_counter()
        await asyncio.gather(*(lamp_client(i) for i in range(options.concurrency)))
        load_s = time.perf_counter() - load_started
        deadline = time.monotonic() + 60
        while delayed.count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        lateness_ms = [value / 1000 for value in delayed.stats.lateness_us]
        log(f"LAMP load: {sent:,} updates in {load_s:.1f} s; delayed fired: {delayed.stats.fired:,}")
        return {
            "delayed": options.delayed,
            "fired": delayed.stats.fired,
            "failed": delayed.stats.failed,
            "still_pending": delayed.count,
            "early": sum(1 for value in lateness_ms if value < 0),
            "lateness_p50_ms": round(statistics.median(lateness_ms), 3) if lateness_ms else None,
            "lateness_p99_ms": round(_percentile(lateness_ms, 0.99), 3) if lateness_ms else None,
            "lateness_max_ms": round(max(lateness_ms), 3) if lateness_ms else None,
            "window_s": options.window_s,
            "lamp_updates": sent,
            "lamp_ups": round(sent / load_s, 1) if load_s else None,
            "concurrency": options.concurrency,
            "subscriptions": scheduler.engine.subscription_count,
            "triples": triples,
            "store": "disk" if directory else "memory",
            "schedule_per_s": round(options.delayed / schedule_s, 1) if schedule_s else None,
        }
    finally:
        await delayed.stop()
        await asyncio.get_running_loop().run_in_executor(None, scheduler.close)
        pending.close()
        store.close()


def run(options: SchedulingOptions, log: Log | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the report dict."""
    say = log or (lambda _message: None)
    if not options.on_disk:
        return asyncio.run(_run(options, None, say))
    with tempfile.TemporaryDirectory(prefix="sepa-bench-scheduling-") as directory:
        return asyncio.run(_run(options, directory, say))
