"""Re-evaluations pipelined off the update thread (`SpuManager.submit` with a re-evaluation worker):
an update that re-evaluates nothing does not wait for one that does, and every subscription
still gets every update's delta, in order, computed on the store as that update left it."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from broker.core.engine import Engine
from broker.core.notification import Notification
from broker.store import RdfStore
from broker.workers.pool import QueryWorkers
from tests.polling import wait_until

EX = "http://example.org/"
SLOW_QUADS = 48  # 48^4 rows counted: ~1 s on the test machine
SLOW = "{ SELECT (COUNT(*) AS ?n) WHERE { " + " ".join(f"?s{i} <{EX}slow> ?o{i} ." for i in range(4)) + " } }"
# OPTIONAL: re-evaluated; the slow count makes each re-evaluation take about a second (once a ?s
# matches: with none, the join ends before the count is evaluated)
SLOW_VIEW = f"SELECT ?s ?o ?n WHERE {{ ?s <{EX}p> ?o OPTIONAL {{ ?s <{EX}q> ?x }} {SLOW} }}"
QUICK_VIEW = f"SELECT ?s ?o WHERE {{ ?s <{EX}p> ?o OPTIONAL {{ ?s <{EX}q> ?x }} }}"
INCREMENTAL = f"SELECT ?s ?o WHERE {{ ?s <{EX}r> ?o }}"
# The workers' time limit and the waits for a result. Why 300 s, not 30: at load 13 on the shared
# 2-core machine (2026-12-07) the slow view's re-evaluation (~1 s quiet) ran to the 30 s limit
# (0 notifications) and result(timeout=30) raised TimeoutError: 3 runs of 3. No test here is
# about the limit; the waits end as soon as the result is there.
LIMIT_S = 300.0


@pytest.fixture
def engine() -> Iterator[Engine]:
    store = RdfStore.memory()
    workers = QueryWorkers(store, count=1, time_limit_s=LIMIT_S)
    reevaluators = QueryWorkers(store, count=1, time_limit_s=LIMIT_S)
    workers.start()
    reevaluators.start()
    engine = Engine(store, workers=workers, reevaluators=reevaluators)
    engine.update("INSERT DATA { " + " ".join(f"<{EX}x{n}> <{EX}slow> {n} ." for n in range(SLOW_QUADS)) + " }")
    try:
        yield engine
    finally:
        engine.close()
        workers.close()


class View:
    """A client's view rebuilt from its notifications, which must come 0, 1, 2... in order."""

    def __init__(self, engine: Engine, sparql: str) -> None:
        self.sparql = sparql
        self.rows: Counter[tuple[str, ...]] = Counter()
        self.sequences: list[int] = []
        self.added: list[set[tuple[str, ...]]] = []
        self.events: list[str] = []
        self.subscription = engine.subscribe(sparql, self, limited=True)

    def __call__(self, notification: Notification) -> None:
        assert notification.sequence == len(self.sequences), (notification.sequence, self.sequences)
        assert notification.ended is None, notification.ended
        self.sequences.append(notification.sequence)
        self.added.append({tuple(str(term) for term in row) for row in notification.added})
        self.events.append(f"notified {notification.sequence}")
        removed = Counter(tuple(str(term) for term in row) for row in notification.removed)
        assert not removed - self.rows
        self.rows = self.rows - removed + Counter(tuple(str(term) for term in row) for row in notification.added)

    def check(self, engine: Engine) -> None:
        result = engine.query(self.sparql, trusted=True)
        assert self.rows == Counter(tuple(str(term) for term in row) for row in result.rows)


def test_an_update_that_re_evaluates_nothing_does_not_wait_for_one_that_does(engine: Engine) -> None:
    slow = View(engine, SLOW_VIEW)
    incremental: list[Notification] = []
    engine.subscribe(INCREMENTAL, incremental.append, limited=True)
    assert engine.spus.reeval and not engine.spus.reevaluations_queued
    started = time.monotonic()
    first = engine.submit(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")
    first.add_done_callback(lambda _: slow.events.append("first done"))
    second = engine.submit(f"INSERT DATA {{ <{EX}b> <{EX}r> 2 }}")
    # the update thread did not wait for the re-evaluation (about a second)
    assert time.monotonic() - started < 0.5
    assert second.done() and not first.done() and engine.spus.reevaluations_queued == 1
    assert [n.sequence for n in incremental] == [0, 1]
    assert first.result(timeout=LIMIT_S).notifications == 1
    # its reply comes after end of processing: after the notification it caused
    assert slow.events == ["notified 0", "notified 1", "first done"]
    slow.check(engine)


def test_every_update_reaches_each_subscription_in_order(engine: Engine) -> None:
    """Updates submitted back to back, each re-evaluating the same subscriptions: each
    re-evaluation sees the store as its update left it (not the latest), so the views pass through
    every state and end equal to the query's answer."""
    views = [View(engine, SLOW_VIEW), View(engine, QUICK_VIEW)]
    started = time.monotonic()
    futures: list[Future] = []
    for value in range(3):
        futures.append(engine.submit(f"INSERT DATA {{ <{EX}s{value}> <{EX}p> {value} }}"))
        futures.append(engine.submit(f"INSERT DATA {{ <{EX}t{value}> <{EX}r> {value} }}"))
    assert time.monotonic() - started < 1.0  # three re-evaluations of ~1 s each: none waited for
    for future in futures:
        future.result(timeout=60)
    for view in views:
        assert view.sequences == [0, 1, 2, 3]
        view.check(engine)
    # the quick view's jobs ran after all three updates (behind the slow ones), yet notification k
    # holds update k's row alone
    assert views[1].added[1:] == [
        {(f"<{EX}s{value}>", f'"{value}"^^<http://www.w3.org/2001/XMLSchema#integer>')} for value in range(3)
    ]
    assert not engine.spus.reevaluations_queued


def test_a_subscriber_joining_while_re_evaluations_are_queued_gets_them_next(engine: Engine) -> None:
    """Subscribe does not wait for the queued re-evaluations (it would hold the update thread):
    notification 0 is the shared SPU's result as last applied, and the queued update's delta
    follows as notification 1, to both subscribers; an unsubscribe meanwhile frees its SPU and the
    queued job of it is skipped."""
    engine.update(f"INSERT DATA {{ <{EX}z> <{EX}p> 0 }}")  # SLOW_VIEW evaluates its count only with a ?s
    View(engine, SLOW_VIEW)
    first = View(engine, QUICK_VIEW)
    before = first.rows
    leaving: list[Notification] = []
    gone = engine.subscribe(QUICK_VIEW + " LIMIT 10", leaving.append, limited=True)
    slow = engine.submit(f"INSERT DATA {{ <{EX}x99> <{EX}slow> 99 }}")  # a slow job, the SLOW_VIEW's alone
    behind = engine.submit(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")  # the quick views' jobs: behind it
    second = View(engine, QUICK_VIEW)  # shares the SPU
    engine.unsubscribe(gone.spuid)
    assert not slow.done() and not behind.done()
    assert second.sequences == [0] and second.rows == before  # the SPU's result before the queued update
    assert behind.result(timeout=LIMIT_S).notifications == 3  # the slow view, both quick subscribers
    assert first.sequences == [0, 1] and second.sequences == [0, 1] and first.rows == second.rows
    assert [n.sequence for n in leaving] == [0]
    engine.update(f"INSERT DATA {{ <{EX}b> <{EX}p> 2 }}")
    assert first.sequences == [0, 1, 2] and second.sequences == [0, 1, 2]
    second.check(engine)


def test_a_re_evaluation_past_its_limit_ends_its_subscription_and_those_behind_it_are_run_again() -> None:
    """The time limit kills the re-evaluation worker: the subscription whose job ran past it ends
    with an error; the job queued behind it (another update's) is lost, run again in a query worker,
    and its notification is right."""
    store = RdfStore.memory()
    workers = QueryWorkers(store, count=1, time_limit_s=LIMIT_S)
    reevaluators = QueryWorkers(store, count=1, time_limit_s=1.0)
    workers.start()
    reevaluators.start()
    engine = Engine(store, workers=workers, reevaluators=reevaluators)
    try:
        growing = "SELECT (COUNT(*) AS ?n) WHERE { " + " ".join(f"?s{i} <{EX}x> ?o{i} ." for i in range(8)) + " }"
        ended: list[Notification] = []
        engine.subscribe(growing, ended.append, limited=True)
        quick = View(engine, QUICK_VIEW)
        many = engine.submit("INSERT DATA { " + " ".join(f"<{EX}n{i}> <{EX}x> {i} ." for i in range(300)) + " }")
        behind = engine.submit(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")
        assert behind.result(timeout=LIMIT_S).notifications == 1 and many.done()
        assert [n.sequence for n in ended] == [0, 1] and ended[1].ended is not None
        assert ended[1].ended.error == "timeout"
        assert quick.sequences == [0, 1]
        quick.check(engine)
        assert reevaluators.stats["timeouts"] == 1 and reevaluators.stats["lost"] == 1
        assert engine.subscription_count == 1
    finally:
        engine.close()
        workers.close()


def test_an_inline_update_is_refused_while_the_collector_holds_the_state(engine: Engine) -> None:
    """A budgeted (event loop) update must not wait: while the collector applies a re-evaluation
    it is refused (OverBudget) and runs on the update thread instead."""
    from broker.core.budget import OverBudget

    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with engine.spus._state:
            held.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    try:
        with pytest.raises(OverBudget):
            engine.update(f"INSERT DATA {{ <{EX}b> <{EX}r> 2 }}", budget=1_000)
    finally:
        release.set()
        holder.join()
    assert engine.update(f"INSERT DATA {{ <{EX}b> <{EX}r> 2 }}", budget=1_000).added


def test_an_on_demand_worker_serves_network_subscriptions_only_while_there_are_some() -> None:
    """The appliance's pool starts no process until a network client's subscription is
    re-evaluated; until its worker is ready the query workers re-evaluate (the update waits); then
    the worker does; a moment after the last such subscription ends its process is gone, and the
    next subscription starts it again. Every notification is the right one throughout."""
    store = RdfStore.memory()
    workers = QueryWorkers(store, count=1, time_limit_s=LIMIT_S)
    reevaluators = QueryWorkers(store, count=1, time_limit_s=LIMIT_S, name="reeval", on_demand=True)
    workers.start()
    reevaluators.start()
    engine = Engine(store, workers=workers, reevaluators=reevaluators)
    engine.spus.rest_after_s = 0.3
    try:
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 0 }}")
        engine.subscribe(QUICK_VIEW, lambda _: None)  # in process: not limited, no worker wanted
        assert reevaluators.running == 0
        for round_ in range(2):
            view = View(engine, QUICK_VIEW + " LIMIT 100")
            engine.update(f"INSERT DATA {{ <{EX}b{round_}> <{EX}p> 1 }}")  # worker not ready yet, or is
            wait_until(lambda: reevaluators.ready)
            jobs = reevaluators.stats["jobs"]
            update = engine.submit(f"INSERT DATA {{ <{EX}c{round_}> <{EX}p> 2 }}")
            assert update.result(timeout=LIMIT_S).notifications == 2
            assert reevaluators.stats["jobs"] == jobs + 1  # pipelined, in the worker
            assert view.sequences == [0, 1, 2]
            view.check(engine)
            engine.unsubscribe(view.subscription.spuid)
            wait_until(lambda: reevaluators.stats["rested"] == round_ + 1)  # noqa: B023 - waited for here
            assert reevaluators.running == 0
        assert engine.subscription_count == 1
    finally:
        engine.close()
        workers.close()
