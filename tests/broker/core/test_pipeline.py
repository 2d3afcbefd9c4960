"""Parallel mode (:mod:`broker.core.pipeline`): the BOOSTER in worker processes, updates pipelined.

What must hold, and would not without the mode's machinery: updates with many hits really go to
the workers and several are in flight at once; they complete in submission order, each after its
notifications; the notifications are those of sequential mode; a subscriber joining while updates
are in flight starts from the right result; a worker that dies costs no subscription its
exactness; an update under a budget is never handed to the workers; the workers stop with the engine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from pyoxigraph import DefaultGraph

from broker.core import pipeline
from broker.core.budget import OverBudget
from broker.core.engine import Engine
from broker.core.notification import Notification
from broker.core.pipeline import OFFLOAD_MIN_QUADS
from broker.core.results import UpdateResult
from broker.scheduler import Scheduler
from tests.polling import wait_until

EX = "http://example.org/"
ROOMS = 4
SENSORS = 3 * OFFLOAD_MIN_QUADS  # per room: an update of one room changes more quads than a job's minimum

# the sensors of each room and their values; a subscription per room (one shape group, routed by room)
ROOM_QUERY = f"SELECT ?sensor ?value WHERE {{ ?sensor <{EX}in> <{EX}room%d> . ?sensor <{EX}value> ?value }}"
ASK_QUERY = f"ASK {{ ?sensor <{EX}in> <{EX}room%d> . ?sensor <{EX}value> 7 }}"
OPTIONAL_QUERY = (
    f"SELECT ?sensor ?value WHERE {{ ?sensor <{EX}in> <{EX}room0> OPTIONAL {{ ?sensor <{EX}value> ?value }} }}"
)


def dataset() -> str:
    triples = [
        f"<{EX}s{room}-{index}> <{EX}in> <{EX}room{room}> . <{EX}s{room}-{index}> <{EX}value> 0 ."
        for room in range(ROOMS)
        for index in range(SENSORS)
    ]
    return "INSERT DATA { " + " ".join(triples) + " }"


def set_room(room: int, value: int) -> str:
    """Every sensor of `room` to `value`: 2 x SENSORS changed quads, all hitting the shape's value pattern."""
    return (
        f"DELETE {{ ?sensor <{EX}value> ?old }} INSERT {{ ?sensor <{EX}value> {value} }} "
        f"WHERE {{ ?sensor <{EX}in> <{EX}room{room}> . ?sensor <{EX}value> ?old }}"
    )


class Inbox:
    """A subscriber's notifications, and a view rebuilt from them."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []

    def __call__(self, notification: Notification) -> None:
        self.notifications.append(notification)

    def view(self) -> set[tuple[object, ...]]:
        rows: set[tuple[object, ...]] = set()
        for notification in self.notifications:
            rows -= set(notification.removed)
            rows |= set(notification.added)
        return rows

    def summary(self) -> list[tuple[int, list[str], list[str], bool | None]]:
        return [
            (note.sequence, sorted(map(str, note.added)), sorted(map(str, note.removed)), note.boolean)
            for note in self.notifications
        ]


@pytest.fixture
def parallel() -> Iterator[Engine]:
    engine = Engine(mode="parallel", boosters=2)
    engine.update(dataset())
    yield engine
    engine.close()


def subscribe_rooms(engine: Engine) -> list[Inbox]:
    """A subscription per room and an ASK; their callbacks never wait (an event loop may run them)."""
    inboxes = []
    for room in range(ROOMS):
        inbox = Inbox()
        engine.subscribe(ROOM_QUERY % room, inbox, alias=f"room{room}", nonblocking=True)
        inboxes.append(inbox)
    ask = Inbox()
    engine.subscribe(ASK_QUERY % 1, ask, alias="ask", nonblocking=True)
    return [*inboxes, ask]


def current(engine: Engine, room: int) -> set[tuple[object, ...]]:
    return {tuple(row) for row in engine.query(ROOM_QUERY % room).rows}


def test_updates_are_pipelined_complete_in_order_and_notify_as_sequential_mode(parallel: Engine) -> None:
    sequential = Engine(mode="sequential")
    sequential.update(dataset())
    inboxes = {"parallel": subscribe_rooms(parallel), "sequential": subscribe_rooms(sequential)}
    updates = [set_room(step % ROOMS, step + 1) for step in range(12)] + [set_room(1, 7)]
    completed: list[int] = []
    seen_at_completion: list[int] = []
    futures: list[Future[UpdateResult]] = []
    for index, update in enumerate(updates):
        future = parallel.submit(update)

        def record(_: object, index: int = index) -> None:
            completed.append(index)
            seen_at_completion.append(sum(len(inbox.notifications) for inbox in inboxes["parallel"]))

        future.add_done_callback(record)
        futures.append(future)
    peak = parallel.spus.in_flight  # type: ignore[attr-defined]
    results = [future.result(timeout=30) for future in futures]
    for update in updates:
        sequential.update(update)
    assert parallel.spus.counters["pipelined"] == len(updates)  # type: ignore[attr-defined]
    assert peak > 1 or completed, "nothing was ever in flight"
    assert completed == list(range(len(updates)))
    # each completion came after its own notification: room subscriptions gain one per update
    assert all(seen >= index + 1 + ROOMS + 1 for index, seen in enumerate(seen_at_completion))
    assert all(result.notifications >= 1 for result in results)
    for mine, theirs in zip(inboxes["parallel"], inboxes["sequential"], strict=True):
        assert mine.summary() == theirs.summary()
    for room in range(ROOMS):
        assert inboxes["parallel"][room].view() == current(parallel, room)
    assert inboxes["parallel"][-1].notifications[-1].boolean is True
    sequential.close()


def test_a_subscriber_joining_while_updates_are_in_flight_starts_from_the_right_result(parallel: Engine) -> None:
    subscribe_rooms(parallel)
    futures = [parallel.submit(set_room(0, value)) for value in range(1, 6)]
    late = Inbox()
    parallel.subscribe(ROOM_QUERY % 0, late, alias="late")
    assert late.view() == current(parallel, 0) == {(row[0], row[1]) for row in late.notifications[0].added}
    for future in futures:
        future.result(timeout=30)
    parallel.submit(set_room(0, 42)).result(timeout=30)
    assert late.view() == current(parallel, 0)
    assert {str(value) for _, value in late.view()} == {'"42"^^<http://www.w3.org/2001/XMLSchema#integer>'}


def test_a_dead_worker_is_replaced_and_no_subscription_is_left_wrong(parallel: Engine) -> None:
    inboxes = subscribe_rooms(parallel)
    manager = parallel.spus
    pids = [worker.process.pid for worker in manager.boosters]  # type: ignore[attr-defined]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    # its answers are lost: the update still completes (nothing hangs), applied to the store
    result = parallel.submit(set_room(2, 5)).result(timeout=30)
    assert result.added
    parallel.submit(set_room(3, 6)).result(timeout=30)  # recovers first: every SPU evaluated again
    assert manager.counters["died"] >= 1 and manager.counters["recovered"] == 1  # type: ignore[attr-defined]
    new_pids = [worker.process.pid for worker in manager.boosters]  # type: ignore[attr-defined]
    assert new_pids and not set(new_pids) & set(pids)
    parallel.submit(set_room(2, 8)).result(timeout=30)
    for room in range(ROOMS):
        assert inboxes[room].view() == current(parallel, room)
    assert manager.counters["pipelined"] >= 2  # type: ignore[attr-defined]


def test_an_update_a_dead_worker_left_unfinished_completes_with_every_view_right(parallel: Engine) -> None:
    """With one of two workers gone, the subscribers got the other's share of the update (20 rows of
    40) and the publisher its reply; nothing put them right until another request came (an attack
    pass). Now the reply comes once every SPU is evaluated again: no request follows it here."""
    inboxes = subscribe_rooms(parallel)
    manager = parallel.spus
    doomed = manager.boosters[0].process  # type: ignore[attr-defined]
    os.kill(doomed.pid, signal.SIGKILL)
    time.sleep(0.2)
    result = parallel.submit(set_room(2, 5)).result(timeout=30)
    assert result.added
    for room in range(ROOMS):
        assert inboxes[room].view() == current(parallel, room)
    assert manager.counters["died"] == 1 and manager.counters["recovered"] == 1  # type: ignore[attr-defined]
    wait_until(lambda: manager.metrics()["workers"] == 2, timeout=30)  # type: ignore[attr-defined]


def test_a_worker_that_stops_answering_is_given_up_after_the_reply_timeout(
    parallel: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped worker (SIGSTOP) held every update and subscribe behind it for 600 s."""
    monkeypatch.setattr(pipeline, "REPLY_TIMEOUT_S", 1.0)
    inboxes = subscribe_rooms(parallel)
    stopped = parallel.spus.boosters[0].process  # type: ignore[attr-defined]
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        parallel.submit(set_room(1, 9)).result(timeout=30)
        for room in range(ROOMS):
            assert inboxes[room].view() == current(parallel, room)
        assert stopped.wait(10) == -signal.SIGKILL  # killed, not left stopped beside its replacement
    finally:
        if stopped.poll() is None:
            stopped.kill()


def test_a_stopped_worker_cannot_hold_the_engine_on_a_send(parallel: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a re-evaluated subscription, updates feed the workers their deltas with no job the
    collector waits for: a stopped worker (SIGSTOP) filled its socket, and the engine's next send
    blocked every update for as long as it was stopped (99.8 s in an attack pass). A send stuck past
    the reply timeout kills the worker; the updates complete and the subscriptions stay right."""
    monkeypatch.setattr(pipeline, "REPLY_TIMEOUT_S", 1.0)
    inboxes = subscribe_rooms(parallel)
    count = Inbox()
    parallel.subscribe(f"SELECT (COUNT(*) AS ?n) WHERE {{ ?s <{EX}value> ?v }}", count, alias="n", nonblocking=True)
    stopped = parallel.spus.boosters[0].process  # type: ignore[attr-defined]
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        for value in range(2 * pipeline.LOG_FLUSH_DELTAS):  # the log flushed, ~1.5 MB: past a socket's buffer
            parallel.submit(set_room(value % ROOMS, value)).result(timeout=30)
        for room in range(ROOMS):
            assert inboxes[room].view() == current(parallel, room)
        assert stopped.wait(10) == -signal.SIGKILL
    finally:
        if stopped.poll() is None:
            stopped.kill()


def test_a_worker_that_dies_while_the_gateway_is_idle_is_replaced_at_once(parallel: Engine) -> None:
    """Found only at the next request before: /health said "not ready" meanwhile, and the next
    update paid the recovery (an attack pass)."""
    inboxes = subscribe_rooms(parallel)
    manager = parallel.spus
    victim = manager.boosters[0].process  # type: ignore[attr-defined]
    victim.kill()
    wait_until(lambda: manager.counters["recovered"] == 1, timeout=10)  # type: ignore[attr-defined]
    wait_until(lambda: manager.metrics()["workers"] == 2, timeout=30)  # type: ignore[attr-defined]
    assert manager.counters["died"] == 1  # type: ignore[attr-defined]
    parallel.submit(set_room(2, 5)).result(timeout=30)
    for room in range(ROOMS):
        assert inboxes[room].view() == current(parallel, room)


def test_an_update_under_a_budget_is_never_handed_to_the_workers(parallel: Engine) -> None:
    inboxes = subscribe_rooms(parallel)
    with pytest.raises(OverBudget):
        parallel.update(set_room(1, 9), budget=100_000)
    assert current(parallel, 1) == inboxes[1].view()  # nothing applied, nothing notified
    sensor = f"<{EX}s1-0> <{EX}value>"
    small = f"DELETE {{ {sensor} ?v }} INSERT {{ {sensor} 3 }} WHERE {{ {sensor} ?v }}"
    result = parallel.update(small, budget=100_000)  # few hits, nothing in flight: done here, inline
    assert result.notifications == 1 and parallel.spus.counters["pipelined"] == 0  # type: ignore[attr-defined]
    assert inboxes[1].view() == current(parallel, 1)


def test_re_evaluated_and_incremental_subscriptions_of_one_update(parallel: Engine) -> None:
    room = Inbox()
    optional = Inbox()
    parallel.subscribe(ROOM_QUERY % 0, room, alias="room")
    parallel.subscribe(OPTIONAL_QUERY, optional, alias="optional")
    assert parallel.spus.reeval  # type: ignore[attr-defined]
    futures = [parallel.submit(set_room(0, value)) for value in (1, 2, 3)]
    for future in futures:
        future.result(timeout=30)
    expected = current(parallel, 0)
    assert room.view() == expected
    assert {(row[0], row[1]) for row in optional.view()} == expected
    assert [note.sequence for note in optional.notifications] == [0, 1, 2, 3]


def test_the_workers_stop_with_the_engine() -> None:
    engine = Engine(mode="parallel", boosters=1)
    engine.subscribe(ROOM_QUERY % 0, Inbox())
    processes = [worker.process for worker in engine.spus.boosters]  # type: ignore[attr-defined]
    assert processes and all(process.poll() is None for process in processes)
    engine.close()
    assert all(process.poll() is not None for process in processes)


def test_the_scheduler_replies_to_a_pipelined_update_after_its_notifications() -> None:
    async def scenario() -> tuple[list[int], int]:
        engine = Engine(mode="parallel", boosters=1)
        scheduler = Scheduler(engine)
        try:
            await scheduler.update(dataset())
            subscription = await scheduler.subscribe(ROOM_QUERY % 2, alias="room2")
            await anext(subscription)  # sequence 0
            results = await asyncio.gather(*(scheduler.update(set_room(2, value)) for value in range(1, 9)))
            sequences = []
            while not subscription.queue.empty():
                sequences.append(subscription.queue.get_nowait().sequence)
            return sequences, sum(result.notifications for result in results)
        finally:
            scheduler.close()

    sequences, notified = asyncio.run(scenario())
    assert sequences == list(range(1, 9))  # all delivered by the time the last reply came
    assert notified == 8


def test_the_replicas_hold_only_the_graphs_the_groups_read_and_grow_when_a_group_needs_more() -> None:
    """A graph no group reads is not fed to the workers (bench mqtt's observations graph: 10 of 11
    quads a reading); a subscription that reads it makes them start again on a wider snapshot, in
    the same processes (a new process cost that subscribe 1.1-1.7 s more)."""
    engine = Engine(mode="parallel", boosters=1)
    try:
        engine.update(dataset())
        other = f"<{EX}elsewhere>"
        engine.update(
            f"INSERT DATA {{ GRAPH {other} {{ <{EX}s0-0> <{EX}in> <{EX}room0> . <{EX}s0-0> <{EX}value> 0 }} }}"
        )
        room = Inbox()
        engine.subscribe(ROOM_QUERY % 0, room, alias="room0")
        manager = engine.spus
        assert manager._graphs == frozenset({DefaultGraph()})  # type: ignore[attr-defined]  # noqa: SLF001
        for value in range(1, 4):
            engine.update(f"INSERT DATA {{ GRAPH {other} {{ <{EX}s0-{value}> <{EX}value> {value} }} }}")
        assert all(not entry[0] for entry in manager._log)  # type: ignore[attr-defined]  # noqa: SLF001
        elsewhere = Inbox()
        query = f"SELECT ?sensor ?value WHERE {{ GRAPH {other} {{ ?sensor <{EX}value> ?value }} }}"
        pids = [worker.process.pid for worker in manager.boosters]  # type: ignore[attr-defined]
        engine.subscribe(query, elsewhere, alias="elsewhere")
        assert manager.counters["reseeded"] == 1  # type: ignore[attr-defined]
        assert [worker.process.pid for worker in manager.boosters] == pids  # type: ignore[attr-defined]
        bulk = " ".join(f"<{EX}s0-{index}> <{EX}value> {index}" + " ." for index in range(10, 40))
        futures = [engine.submit(f"INSERT DATA {{ GRAPH {other} {{ {bulk} }} }}"), engine.submit(set_room(0, 9))]
        for future in futures:
            future.result(timeout=30)
        assert manager.counters["pipelined"] == 2  # type: ignore[attr-defined]
        assert room.view() == current(engine, 0)
        assert elsewhere.view() == {tuple(row) for row in engine.query(query).rows}
    finally:
        engine.close()
