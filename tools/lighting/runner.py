"""Runs the lighting experiments against the in-process engine and measures them (seed 001 §V-C).

Why in-process: the paper measures the SUB engine, not the client protocol (its T_PROT is overhead
and excluded), so the harness calls :class:`broker.core.engine.Engine` directly. Each experiment
and each engine mode gets a fresh engine over a freshly bulk-loaded knowledge base, so runs cannot
influence each other (every update sets dimming values for good).

Procedure, as in the paper: load the store, subscribe every S_j, then issue the n updates one after
the other. Each update is timed from call to return (the engine returns after every subscription
processed it); the engine's per-update stage timings and LUTT hits are summed; each notification
(sequence 0, the reply to subscribe, excluded) is timestamped in its callback and checked against
the subscriptions the profile says the update must notify.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from broker.api import Engine, Notification
from tools.lighting import kpi
from tools.lighting.knowledge_base import iter_quads
from tools.lighting.profiles import EXPERIMENTS, Experiment, experiment

MODES = ("incremental", "naive")
Log = Callable[[str], None]


class _Recorder:
    """Collects notifications: which update they belong to, which subscription, how late."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.update: int | None = None
        self.started = 0.0
        self.latencies: list[float] = []
        self.received: dict[int, Counter[int]] = {}
        self.count = 0
        self.late = 0

    def callback_for(self, j: int) -> Callable[[Notification], None]:
        def on_notification(notification: Notification) -> None:
            if notification.sequence == 0:
                return
            now = time.perf_counter()
            with self._lock:
                self.count += 1
                if self.update is None:
                    self.late += 1
                    return
                self.latencies.append(now - self.started)
                self.received.setdefault(self.update, Counter())[j] += 1

        return on_notification

    def begin(self, update: int) -> None:
        with self._lock:
            self.update, self.started = update, time.perf_counter()

    def end(self) -> None:
        with self._lock:
            self.update = None

    def compare(self, expected: tuple[tuple[int, ...], ...]) -> tuple[int, int, int]:
        """(unexpected, missing, distinct subscriptions notified) against the profile's model."""
        unexpected = missing = 0
        notified: set[int] = set()
        for i, wanted in enumerate(expected):
            got = self.received.get(i, Counter())
            notified.update(got)
            want = Counter(wanted)
            unexpected += sum((got - want).values())
            missing += sum((want - got).values())
        return unexpected, missing, len(notified)


def load_knowledge_base(engine: Engine) -> int:
    """Bulk-load the generated quads into the engine's store (much faster than INSERT DATA)."""
    engine.store.ox.bulk_extend(iter_quads())
    return len(engine.store.ox)


def run_experiment(exp: Experiment, mode: str, log: Log | None = None) -> dict[str, Any]:
    """One experiment in one engine mode on a fresh engine; returns the KPI dict of :mod:`kpi`."""
    say = log or (lambda _msg: None)
    meas = kpi.Measurements(
        exp.name,
        mode,
        exp.n,
        exp.m,
        exp.nu_avg,
        expected_notifications=exp.expected_notifications,
        expected_lhr_percent=exp.lhr_percent,
    )
    engine = Engine(mode=mode)
    started = time.perf_counter()
    meas.triples_loaded = load_knowledge_base(engine)
    meas.load_seconds = time.perf_counter() - started
    say(f"{exp.name}/{mode}: {meas.triples_loaded} triples loaded in {meas.load_seconds:.1f} s")

    recorder = _Recorder()
    started = time.perf_counter()
    for spec in exp.subscriptions:
        engine.subscribe(spec.sparql, recorder.callback_for(spec.index), alias=spec.name)
    meas.subscribe_seconds = time.perf_counter() - started
    say(f"{exp.name}/{mode}: {exp.m} subscriptions in {meas.subscribe_seconds:.1f} s")

    engine.stats.reset()
    for i, update in enumerate(exp.updates):
        recorder.begin(i)
        started = time.perf_counter()
        result = engine.update(update.sparql)
        meas.update_seconds.append(time.perf_counter() - started)
        recorder.end()
        for name, value in result.timings.items():
            if name.endswith("_s"):
                meas.stage_seconds[name] = meas.stage_seconds.get(name, 0.0) + value
        meas.lutt_hits += int(result.timings.get("lutt_hits", 0))
        meas.engine_notifications += result.notifications
        meas.triples_changed += len(result.added) + len(result.removed)
        if (i + 1) % 50 == 0:
            say(f"{exp.name}/{mode}: {i + 1}/{exp.n} updates, {sum(meas.update_seconds):.1f} s")

    meas.latencies = recorder.latencies
    meas.notifications = recorder.count
    meas.late_notifications = recorder.late
    meas.unexpected_notifications, meas.missing_notifications, meas.notified_subscriptions = recorder.compare(
        exp.notified
    )
    del engine
    gc.collect()
    return kpi.compute(meas)


def run_benchmark(
    experiments: Iterable[str] = EXPERIMENTS,
    modes: Iterable[str] = MODES,
    *,
    all_subscribed: bool = False,
    log: Log | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every requested (experiment, mode) pair, each on its own fresh engine.

    A run that raises is reported as ``{"error": ...}`` so the other runs' figures survive it.
    """
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name in experiments:
        exp = experiment(name, all_subscribed=all_subscribed)
        for mode in modes:
            try:
                results.setdefault(name, {})[mode] = run_experiment(exp, mode, log)
            except Exception as exc:  # a benchmark reports a failed run, it does not crash
                results.setdefault(name, {})[mode] = {"error": f"{type(exc).__name__}: {exc}"}
                if log:
                    log(f"{name}/{mode}: failed: {type(exc).__name__}: {exc}")
    return results
