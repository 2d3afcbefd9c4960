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

Pipelined (``bench parallel``): all n updates are submitted with :meth:`Engine.submit` without
waiting, then waited for. An update's time is then the interval between the completion of the
previous one (the first: from the first submission) and its own, so that the times still sum to
the wall time T_TOTAL from the first submission to the last completion; a notification's latency
is from its update's submission, queueing behind the updates before it included.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from broker.api import Engine, Notification, UpdateResult
from tools.lighting import kpi
from tools.lighting.knowledge_base import iter_quads
from tools.lighting.profiles import EXPERIMENTS, Experiment, experiment

MODES = ("incremental", "naive")
Log = Callable[[str], None]


class Recorder:
    """Collects notifications: which update they belong to, which subscription, how late.

    Why attribution by completion: the engine delivers update i's notifications before it
    completes update i, and completes updates in the order they were submitted, also when several
    are in flight (parallel mode). So the notifications that arrive after update i-1 completed and
    before update i completes are update i's, whoever delivers them; the harness says when each
    update was sent (:meth:`sent`) and completed (:meth:`completed`). Outside :meth:`open` ..
    :meth:`close` a notification is counted as late.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.update: int | None = None
        self.sent_at: dict[int, float] = {}
        self.done_at: dict[int, float] = {}
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
                if self.update is None or self.update not in self.sent_at:
                    self.late += 1
                    return
                self.latencies.append(now - self.sent_at[self.update])
                self.received.setdefault(self.update, Counter())[j] += 1

        return on_notification

    def open(self) -> None:
        """Notifications from now on belong to update 0, until it completes."""
        with self._lock:
            self.update = 0

    def sent(self, update: int) -> None:
        with self._lock:
            self.sent_at[update] = time.perf_counter()

    def completed(self, update: int) -> None:
        """Update `update` completed: its notifications were all delivered, the next ones are the next update's."""
        with self._lock:
            self.done_at[update] = time.perf_counter()
            self.update = update + 1
            self._lock.notify_all()

    def wait(self, update: int) -> None:
        """Until :meth:`completed` ran for `update`: a future's waiters may wake before its callbacks ran."""
        with self._lock:
            self._lock.wait_for(lambda: update in self.done_at)

    def close(self) -> None:
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


@dataclass
class Run:
    """One experiment on its engine, between :func:`prepare` and :func:`finish`.

    Why in steps: ``bench parallel`` measures around the updates (CPU per core) and reads the
    BOOSTER workers' memory before the engine is closed, with the same procedure as here.
    """

    exp: Experiment
    engine: Engine
    recorder: Recorder
    meas: kpi.Measurements


def prepare(exp: Experiment, mode: str, *, boosters: int = 1, log: Log | None = None) -> Run:
    """A fresh engine in `mode` (any of :attr:`Engine.MODES`), the knowledge base loaded, every S_j
    subscribed. Loading comes first: parallel mode's workers start at the first subscription,
    with a snapshot of the store. The caller closes ``run.engine``."""
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
    engine = Engine(mode=mode, boosters=boosters)
    try:
        started = time.perf_counter()
        meas.triples_loaded = load_knowledge_base(engine)
        meas.load_seconds = time.perf_counter() - started
        say(f"{exp.name}/{mode}: {meas.triples_loaded} triples loaded in {meas.load_seconds:.1f} s")

        recorder = Recorder()
        started = time.perf_counter()
        for spec in exp.subscriptions:
            engine.subscribe(spec.sparql, recorder.callback_for(spec.index), alias=spec.name)
        meas.subscribe_seconds = time.perf_counter() - started
        say(f"{exp.name}/{mode}: {exp.m} subscriptions in {meas.subscribe_seconds:.1f} s")
    except BaseException:
        engine.close()
        raise
    return Run(exp, engine, recorder, meas)


def issue(run: Run, *, pipelined: bool = False, log: Log | None = None) -> None:
    """Issue the experiment's updates: one after the other (each waited for), or all submitted
    and then waited for (`pipelined`); record their times and results in ``run.meas``."""
    say = log or (lambda _msg: None)
    exp, engine, recorder, meas = run.exp, run.engine, run.recorder, run.meas
    engine.stats.reset()
    futures: list[Future[UpdateResult]] = []
    recorder.open()
    for i, update in enumerate(exp.updates):
        recorder.sent(i)
        future = engine.submit(update.sparql)
        # registered before update i+1 is submitted, so it runs before any of i+1's notifications
        future.add_done_callback(lambda _done, i=i: recorder.completed(i))
        futures.append(future)
        if not pipelined:
            future.result()
            recorder.wait(i)
            meas.update_seconds.append(recorder.done_at[i] - recorder.sent_at[i])
            if (i + 1) % 50 == 0:
                say(f"{exp.name}/{meas.mode}: {i + 1}/{exp.n} updates, {sum(meas.update_seconds):.1f} s")
    results = [future.result() for future in futures]
    if results:
        recorder.wait(len(results) - 1)
    recorder.close()
    if pipelined and results:
        previous = recorder.sent_at[0]
        for i in range(len(results)):
            meas.update_seconds.append(recorder.done_at[i] - previous)
            previous = recorder.done_at[i]
        say(f"{exp.name}/{meas.mode}: {exp.n} updates pipelined, {sum(meas.update_seconds):.2f} s")
    for result in results:
        for name, value in result.timings.items():
            if name.endswith("_s"):
                meas.stage_seconds[name] = meas.stage_seconds.get(name, 0.0) + value
        meas.lutt_hits += int(result.timings.get("lutt_hits", 0))
        meas.engine_notifications += result.notifications
        meas.triples_changed += len(result.added) + len(result.removed)


def finish(run: Run) -> dict[str, Any]:
    """The KPI dict of :mod:`kpi`, the notifications checked against the profile's."""
    meas, recorder = run.meas, run.recorder
    meas.latencies = recorder.latencies
    meas.notifications = recorder.count
    meas.late_notifications = recorder.late
    meas.unexpected_notifications, meas.missing_notifications, meas.notified_subscriptions = recorder.compare(
        run.exp.notified
    )
    return kpi.compute(meas)


def run_experiment(
    exp: Experiment,
    mode: str,
    log: Log | None = None,
    *,
    pipelined: bool = False,
    boosters: int = 1,
) -> dict[str, Any]:
    """One experiment in one engine mode on a fresh engine; returns the KPI dict of :mod:`kpi`."""
    run = prepare(exp, mode, boosters=boosters, log=log)
    try:
        issue(run, pipelined=pipelined, log=log)
        return finish(run)
    finally:
        run.engine.close()
        del run
        gc.collect()


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
