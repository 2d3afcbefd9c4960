"""What the in-process client transport adds to the engine's update path (the LAMP profile).

Why this measurement: adapters publish through :class:`gateway.client.InProcessTransport`
(ARCHITECTURE.md principle 1) instead of calling the engine, so the transport's cost (the hop to
the scheduler's update thread and back, handing notifications to the event loop, maintaining
every subscription's ResultView) is paid on every sensor reading. The bar is < 20 % over calling
``Engine.update`` directly.

Procedure: the LAMP experiment of the lighting benchmark (seed 001: 310 single-lamp updates
against 1,004 subscriptions on the ~334k-triple knowledge base). Each run gets a fresh engine over
a freshly bulk-loaded store (every update sets a dimming value for good, so a store cannot be
reused). "direct" subscribes with ``Engine.subscribe`` and calls ``Engine.update``; "client"
subscribes and updates through ``SepaClient(InProcessTransport(engine))`` on an asyncio loop and
waits until every notification has reached its view. Only the update loop is timed; the modes
take turns in one process, in an order rotated each round, so drift and warm-up hit all of them.

Two more modes explain the figure: "scheduler" awaits ``Scheduler.update`` with no client at all
(the hop to the update thread and back that every asyncio caller pays, the HTTP gate included,
and that ARCHITECTURE.md principle 2 makes mandatory), so "client" minus "scheduler" is the
client layer's own cost; "client_pipelined" submits the 310 updates at once (the scheduler's FIFO
keeps their order), which is how a producer with a burst of readings amortizes the hop;
"client_inline" is the in-process transport with ``inline=True`` (engine calls on the loop thread).
Garbage collection is paused during the timed loop only.

Run: ``python -m tools.client_overhead [--runs N] [--experiment LAMP|ROAD]``; prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from broker.api import Engine, Notification, Scheduler
from gateway.client import InProcessTransport, SepaClient
from tools.lighting.knowledge_base import iter_quads
from tools.lighting.profiles import Experiment, experiment

MODES = ("direct", "scheduler", "client", "client_pipelined", "client_inline")


def _fresh_engine() -> Engine:
    engine = Engine()
    engine.store.ox.bulk_extend(iter_quads())
    return engine


@contextlib.contextmanager
def _timed(into: dict[str, Any]) -> Iterator[None]:
    gc.collect()
    gc.disable()
    started = time.perf_counter()
    try:
        yield
    finally:
        into["seconds"] = time.perf_counter() - started
        gc.enable()


def run_direct(exp: Experiment) -> dict[str, Any]:
    """The update loop straight on the engine (the benchmark runner's way)."""
    engine = _fresh_engine()
    received = 0

    def on_notification(notification: Notification) -> None:
        nonlocal received
        if notification.sequence:
            received += 1

    for spec in exp.subscriptions:
        engine.subscribe(spec.sparql, on_notification, alias=spec.name)
    result: dict[str, Any] = {}
    with _timed(result):
        for update in exp.updates:
            engine.update(update.sparql)
    result["notifications"] = received
    return result


async def _run_scheduler(exp: Experiment) -> dict[str, Any]:
    scheduler = Scheduler(_fresh_engine())
    received = 0

    def on_notification(notification: Notification) -> None:
        nonlocal received
        if notification.sequence:
            received += 1

    for spec in exp.subscriptions:
        await scheduler.subscribe(spec.sparql, on_notification, alias=spec.name)
    result: dict[str, Any] = {}
    with _timed(result):
        for update in exp.updates:
            await scheduler.update(update.sparql)
        while received < exp.expected_notifications:
            await asyncio.sleep(0)
    result["notifications"] = received
    await asyncio.to_thread(scheduler.close)
    return result


async def _run_client(exp: Experiment, pipelined: bool, inline: bool = False) -> dict[str, Any]:
    scheduler = Scheduler(_fresh_engine())
    client = SepaClient(InProcessTransport(scheduler, inline=inline))
    subscriptions = [await client.subscribe(spec.sparql, spec.name, iterate=False) for spec in exp.subscriptions]
    result: dict[str, Any] = {}
    with _timed(result):
        if pipelined:  # all submitted at once: the scheduler's FIFO keeps their order
            await asyncio.gather(*(client.update(update.sparql) for update in exp.updates))
        else:
            for update in exp.updates:
                await client.update(update.sparql)
        while sum(sub.sequence for sub in subscriptions) < exp.expected_notifications:
            await asyncio.sleep(0)  # notifications still on their way to the views
    result["notifications"] = sum(sub.sequence for sub in subscriptions)
    await client.close()
    await asyncio.to_thread(scheduler.close)
    return result


def run(mode: str, exp: Experiment) -> dict[str, Any]:
    """One run of one mode on a fresh engine: {"seconds": update loop, "notifications": count}."""
    if mode == "direct":
        result = run_direct(exp)
    elif mode == "scheduler":
        result = asyncio.run(_run_scheduler(exp))
    else:
        result = asyncio.run(_run_client(exp, pipelined=(mode == "client_pipelined"), inline=(mode == "client_inline")))
    gc.collect()
    return result


def measure(runs: int = 5, exp: Experiment | str = "LAMP", modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """Every mode `runs` times, interleaved and rotated; returns the figures as a dict."""
    exp = experiment(exp) if isinstance(exp, str) else exp
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    notifications: dict[str, set[int]] = {mode: set() for mode in modes}
    for index in range(runs):
        shift = index % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            result = run(mode, exp)
            times[mode].append(result["seconds"])
            notifications[mode].add(result["notifications"])
    median = {mode: statistics.median(values) for mode, values in times.items()}
    direct = median["direct"]
    return {
        "experiment": exp.name,
        "updates": exp.n,
        "subscriptions": exp.m,
        "runs_per_mode": runs,
        "expected_notifications": exp.expected_notifications,
        "notifications": {mode: sorted(counts) for mode, counts in notifications.items()},
        "seconds": {mode: [round(value, 4) for value in values] for mode, values in times.items()},
        "median_ms_per_update": {mode: round(1000 * value / exp.n, 4) for mode, value in median.items()},
        "added_cost_percent": {
            mode: round(100 * (value / direct - 1), 1) for mode, value in median.items() if mode != "direct"
        },
        "bar_percent": 20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per mode (default 5)")
    parser.add_argument("--experiment", choices=("LAMP", "ROAD"), default="LAMP")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.runs, args.experiment), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
