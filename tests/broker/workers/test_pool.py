"""Query workers: replicas that follow the store exactly, and evaluations a time limit really stops."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyoxigraph import DefaultGraph, Literal, NamedNode, Quad, RdfFormat, Store, parse, serialize

import broker.workers.pool as pool_module
from broker.core.engine import Engine
from broker.errors import EvaluationCrashed, SparqlSyntaxError, TimeLimitExceeded, WorkerLost
from broker.store import PROVISIONAL, SETTLED, RdfStore, graph_named
from broker.store.live_copy import SLICE_BYTES
from broker.workers.pool import FEED_INTERVAL_S, QueryWorkers, Worker, batched
from tests.polling import wait_until
from tests.support.traced import traced_peak

EX = "http://example.org/"
# a cartesian product of 15 patterns: never ends on any store of a few quads
ENDLESS = "SELECT (COUNT(*) AS ?n) WHERE { " + " ".join(f"?s{i} ?p{i} ?o{i} ." for i in range(15)) + " }"
EVERYTHING = "SELECT ?g ?s ?p ?o WHERE { { ?s ?p ?o } UNION { GRAPH ?g { ?s ?p ?o } } }"


def _state(pid: int) -> str:
    """The process's state letter in /proc (R, S, T: stopped, Z: a zombie...); "" once reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0]
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return _state(pid) not in ("", "Z")  # a zombie is dead too


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[Engine, QueryWorkers]]:
    store = RdfStore.memory()
    pool = QueryWorkers(store, count=2, time_limit_s=1.0)
    pool.start()
    yield Engine(store, workers=pool), pool
    pool.close()


def _rows(engine: Engine, sparql: str) -> set[tuple[str, ...]]:
    """The rows evaluated by a worker, and the same evaluated on the store itself: they must agree."""
    remote = engine.query(sparql)
    local = engine.queries.materialize(engine.queries.run(sparql))
    as_text = lambda result: {tuple(str(term) for term in row) for row in result.rows}  # noqa: E731
    assert as_text(remote) == as_text(local)
    return as_text(remote)


_UPDATES = st.sampled_from(
    [
        f"INSERT DATA {{ <{EX}a> <{EX}p> 1 . <{EX}b> <{EX}p> 2 }}",
        f"INSERT DATA {{ GRAPH <{EX}g> {{ <{EX}a> <{EX}q> 'x'@en }} }}",
        f"INSERT DATA {{ _:n <{EX}p> 3 }}",
        f"DELETE WHERE {{ ?s <{EX}p> 1 }}",
        f"DELETE {{ ?s <{EX}p> ?o }} INSERT {{ ?s <{EX}r> ?o }} WHERE {{ ?s <{EX}p> ?o FILTER(?o > 1) }}",
        f"INSERT {{ ?s <{EX}copy> ?o }} WHERE {{ ?s ?p ?o OPTIONAL {{ ?s <{EX}none> ?x }} }}",
        f"CREATE SILENT GRAPH <{EX}empty>",
        f"DROP SILENT GRAPH <{EX}g>",
        f"CLEAR SILENT GRAPH <{EX}empty> ; INSERT DATA {{ <{EX}c> <{EX}p> 5 }}",
        "DELETE WHERE { ?s ?p ?o }",
        # a blank node graph name: its label travels to the replicas, not as an IRI
        f"INSERT {{ GRAPH ?x {{ <{EX}a> <{EX}p> 4 }} }} WHERE {{ BIND(BNODE() AS ?x) }}",
        "DROP SILENT ALL",
    ]
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(updates=st.lists(_UPDATES, max_size=8))
def test_a_replica_answers_as_the_store_after_any_updates(
    workers: tuple[Engine, QueryWorkers], updates: list[str]
) -> None:
    """Blank nodes, named graphs (empty ones too), sequences, WHERE clauses run in the workers."""
    engine, _ = workers
    for update in updates:
        engine.update(update)
    _rows(engine, EVERYTHING)
    _rows(engine, "SELECT ?g WHERE { GRAPH ?g { } }")


def test_a_replica_seeded_from_a_store_with_blank_nodes_follows_deltas_that_name_them() -> None:
    """The seed travels raw after its message (broker.workers.pool.Worker) and is loaded keeping
    blank node labels: a delta naming a blank node of the snapshot removes it in the replica too
    (loaded by `Store.load`, which renames them, the replica kept the quad)."""
    store = RdfStore.memory()
    engine = Engine(store)
    engine.update(f"INSERT DATA {{ _:n <{EX}p> 3 . GRAPH <{EX}g> {{ _:m <{EX}q> 'x' }} }}")
    engine.update(f"CREATE GRAPH <{EX}empty>")
    engine.update(
        "INSERT { ?s <"
        + EX
        + "filler> ?i } WHERE { VALUES ?i { "
        + " ".join(map(str, range(2000)))
        + " } BIND(IRI(CONCAT('"
        + EX
        + "s', STR(?i))) AS ?s) }"
    )
    pool = QueryWorkers(store, count=1)
    pool.start()
    try:
        engine = Engine(store, workers=pool)
        assert len(_rows(engine, EVERYTHING)) == 2002
        assert _rows(engine, "SELECT ?g WHERE { GRAPH ?g { } }") == {(f"<{EX}g>",), (f"<{EX}empty>",)}
        engine.update(f"DELETE WHERE {{ ?s <{EX}p> 3 }} ; DELETE WHERE {{ GRAPH <{EX}g> {{ ?s <{EX}q> ?o }} }}")
        assert len(_rows(engine, EVERYTHING)) == 2000
    finally:
        pool.close()


def test_a_query_past_its_limit_is_stopped_and_its_worker_replaced(workers: tuple[Engine, QueryWorkers]) -> None:
    engine, pool = workers
    engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }}")
    pids = {worker.process.pid for worker in pool._workers}
    before = dict(pool.stats)
    started = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        engine.query(ENDLESS)
    assert time.monotonic() - started < pool.time_limit_s + 1
    # the work really stopped: one of the worker processes is gone within the second
    deadline = time.monotonic() + 1
    while all(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not all(_alive(pid) for pid in pids)
    assert pool.stats["timeouts"] == before.get("timeouts", 0) + 1
    # the other worker answers meanwhile, and the successor holds every update made since
    engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 4 }}")
    for _ in range(4):
        assert len(_rows(engine, f"SELECT ?o WHERE {{ <{EX}a> <{EX}p> ?o }}")) >= 4


def test_the_thread_whose_job_cost_a_worker_can_wait_for_its_successor(workers: tuple[Engine, QueryWorkers]) -> None:
    """await_successor returns once the replacement holds its replica (the pool whole again), and at
    once in a thread whose last job cost no worker (FairShare keeps a client's turn meanwhile)."""
    engine, pool = workers
    # ENDLESS is endless on a few quads; on the empty store it answers 0 at once. Without them the
    # test passed only after other tests of this file (2026-12-07: alone, DID NOT RAISE).
    engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1, 2, 3 }}")
    started = time.monotonic()
    pool.await_successor()  # nothing to wait for
    assert time.monotonic() - started < 0.1
    with pytest.raises(TimeLimitExceeded):
        engine.query(ENDLESS)
    assert pool.running < pool.count  # its successor is loading
    pool.await_successor()
    assert pool.running == pool.count
    started = time.monotonic()
    pool.await_successor()  # waited for once only
    assert time.monotonic() - started < 0.1


def test_an_update_whose_where_runs_past_its_limit_changes_nothing(workers: tuple[Engine, QueryWorkers]) -> None:
    engine, _ = workers
    engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")
    before = _rows(engine, EVERYTHING)
    endless_where = (
        ENDLESS.replace(
            "SELECT (COUNT(*) AS ?n) WHERE", f"INSERT {{ <{EX}z> <{EX}p> ?n }} WHERE {{ SELECT (COUNT(*) AS ?n) WHERE"
        )
        + " }"
    )
    with pytest.raises(TimeLimitExceeded):
        engine.update(endless_where)
    assert _rows(engine, EVERYTHING) == before
    engine.update(f"INSERT DATA {{ <{EX}after> <{EX}p> 1 }}")  # the update path is free again
    assert (f"<{EX}after>",) in _rows(engine, f"SELECT ?s WHERE {{ ?s <{EX}p> 1 }}")


def test_a_worker_that_dies_is_an_error_for_its_job_and_is_replaced(workers: tuple[Engine, QueryWorkers]) -> None:
    """A crash of pyoxigraph in a worker (killed here from outside: the same fault) costs one request."""
    engine, pool = workers
    engine.update(f"INSERT DATA {{ <{EX}many> <{EX}p> 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }}")  # ENDLESS never ends
    time.sleep(1.5)  # successors of earlier tests are up
    victims = {worker.process.pid for worker in pool._workers}

    def kill_soon() -> None:
        time.sleep(0.3)
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    import threading

    killer = threading.Thread(target=kill_soon)
    killer.start()
    with pytest.raises((EvaluationCrashed, TimeLimitExceeded)):
        engine.query(ENDLESS)
    killer.join()  # both victims are dead before the pool is used again
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            assert _rows(engine, "ASK { }") == set()
            break
        except (TimeLimitExceeded, EvaluationCrashed):
            continue
    assert pool.stats["crashes"] >= 1 or pool.stats["timeouts"] >= 1
    assert engine.query("ASK { }").boolean is True


def test_a_stopped_worker_holds_a_request_only_until_it_should_have_started(monkeypatch) -> None:
    """A worker that reads nothing (SIGSTOP, a frozen container) held every request given to it for
    READY_TIMEOUT_S (300 s) against a time limit of 10 s: it never says it started. It is given
    STARTED_TIMEOUT_S (here 2 s) to start, then killed and replaced; the next request is served."""
    monkeypatch.setattr(pool_module, "STARTED_TIMEOUT_S", 2.0)
    store = RdfStore.memory()
    pool = QueryWorkers(store, count=1, time_limit_s=1.0)
    pool.start()
    engine = Engine(store, workers=pool)
    stopped = next(iter(pool._workers)).process.pid
    try:
        os.kill(stopped, signal.SIGSTOP)
        wait_until(lambda: _state(stopped) == "T")  # stopped indeed, not only signalled
        started = time.monotonic()
        try:
            engine.query("ASK { }")
        except TimeLimitExceeded:
            pass
        else:  # once in CI (2026-12-07), not reproduced in 70 runs here: say what served it
            pytest.fail(f"served with its only worker stopped: {dict(pool.stats)}, state {_state(stopped)!r}")
        assert time.monotonic() - started < 5
        wait_until(lambda: not _alive(stopped))
        wait_until(lambda: pool.ready)
        assert engine.query("ASK { }").boolean is True  # its successor
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGCONT)
        pool.close()


def test_an_error_in_a_worker_comes_back_as_the_same_error(workers: tuple[Engine, QueryWorkers]) -> None:
    engine, _ = workers
    bad = "SELECT ?s WHERE { ?s ?p ?o } GROUP BY ?o"
    with pytest.raises(SparqlSyntaxError) as remote:
        engine.query(bad)
    with pytest.raises(SparqlSyntaxError) as local:
        engine.queries.run(bad)
    assert remote.value.description == local.value.description and remote.value.status_code == 400


def test_a_store_on_disk_is_replicated_from_a_checkpoint(tmp_path: Path) -> None:
    store = RdfStore.open(tmp_path)
    store.ox.update(f"INSERT DATA {{ <{EX}before> <{EX}p> 1 }}")
    pool = QueryWorkers(store, count=1, time_limit_s=5.0)
    pool.start()
    try:
        engine = Engine(store, workers=pool)
        engine.update(f"INSERT DATA {{ <{EX}after> <{EX}p> 2 }}")
        assert _rows(engine, f"SELECT ?s WHERE {{ ?s <{EX}p> ?o }}") == {(f"<{EX}before>",), (f"<{EX}after>",)}
        assert len(list((tmp_path / "replicas").iterdir())) == 1
    finally:
        pool.close()
        store.close()
    assert not (tmp_path / "replicas").exists()


def test_a_worker_seeded_from_an_unchanged_store_on_disk_is_told_the_quads_its_checkpoint_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each query worker counted its replica at its seed, a full scan of the store at every start on
    RocksDB (1.2 s of CPU in each of two workers for 2.4 million quads, beside the gateway's own
    count at open): now the seed carries the gateway's count, which is what the checkpoint holds."""
    setup = RdfStore.open(tmp_path)
    setup.ox.extend(Quad(NamedNode(f"{EX}s{n}"), NamedNode(f"{EX}p"), Literal(n)) for n in range(25))
    setup.close()
    del setup  # RocksDB's lock goes with the last reference
    store = RdfStore.open(tmp_path)
    seeds: list[tuple[object, ...]] = []
    send = Worker._send

    def recorded(worker: Worker, message: tuple[object, ...] | None) -> bool:
        if message is not None and message[0] == "seed":
            told = message[4] if len(message) > 4 else None
            seeds.append((message[1], told, len(Store.read_only(str(message[2])))))
        return send(worker, message)

    monkeypatch.setattr(Worker, "_send", recorded)
    pool = QueryWorkers(store, count=2, time_limit_s=5.0)
    pool.start()
    try:
        assert seeds == [("directory", 25, 25)] * 2  # (its kind, the count it was told, what it holds)
    finally:
        pool.close()
        store.close()


def test_two_pools_over_one_store_on_disk_keep_their_checkpoints_apart(tmp_path: Path) -> None:
    """The query workers and the re-evaluation worker: each pool empties its checkpoints' directory
    when it starts, so a shared one lost the first pool's replicas (its next query crashed)."""
    store = RdfStore.open(tmp_path)
    store.ox.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")
    queries = QueryWorkers(store, count=1, time_limit_s=5.0)
    queries.start()
    reevaluators = QueryWorkers(store, count=1, time_limit_s=5.0, name="reeval")
    reevaluators.start()
    try:
        engine = Engine(store, workers=queries, reevaluators=reevaluators)
        engine.update(f"INSERT DATA {{ <{EX}b> <{EX}p> 2 }}")
        assert _rows(engine, f"SELECT ?s WHERE {{ ?s <{EX}p> ?o }}") == {(f"<{EX}a>",), (f"<{EX}b>",)}
        [job] = reevaluators.dispatch("subscription_rows", [((f"SELECT ?s WHERE {{ ?s <{EX}p> 2 }}", None, {}), {})])
        assert job.result(30)[1].count(b"\n") == 2  # the header and <b>
        assert len(list((tmp_path / "replicas").iterdir())) == 1
        assert len(list((tmp_path / "replicas-reeval").iterdir())) == 1
    finally:
        engine.close()
        queries.close()
        store.close()


@settings(max_examples=200, deadline=None)
@given(
    changes=st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(0, 5), max_size=4), st.sampled_from([None, "g", "h"])),
        max_size=12,
    )
)
def test_a_batch_of_deltas_has_the_effect_of_the_deltas_in_order(changes) -> None:
    """The catch-up message a worker gets for many deltas leaves its replica as the deltas would."""
    store, replica, deltas = Store(), Store(), []
    for add, values, graph in changes:
        name = NamedNode(f"{EX}{graph}") if graph else DefaultGraph()
        quads = {Quad(NamedNode(f"{EX}s"), NamedNode(f"{EX}p"), Literal(str(value)), name) for value in values}
        if add:
            delta = ([q for q in quads if q not in store], [], [], [])
        elif graph == "h":  # a graph drop: all of it goes
            delta = ([], list(store.quads_for_pattern(None, None, None, name)), [], [name])
        else:
            delta = ([], [q for q in quads if q in store], [], [])
        for quad in delta[1]:
            store.remove(quad)
        store.extend(delta[0])
        deltas.append(delta)
    kind, steps = batched(deltas)
    assert kind == "apply"
    for added, removed, created, dropped in steps:
        for quad in parse(removed, format=RdfFormat.N_QUADS) if removed else ():
            replica.remove(quad)
        for graph in dropped:
            replica.remove_graph(graph_named(graph))
        replica.extend(parse(added, format=RdfFormat.N_QUADS) if added else ())
        for graph in created:
            replica.add_graph(graph_named(graph))
    assert set(replica) == set(store)


def test_the_feeding_thread_keeps_idle_workers_current_and_the_log_short() -> None:
    """A long stretch of updates without a query: the workers are sent the deltas as they come
    (a tick at a time), so the log holds a tick's worth at most and no worker is ever re-seeded."""
    import broker.workers.pool as pool_module

    store = RdfStore.memory()
    pool = QueryWorkers(store, count=2, time_limit_s=10.0)
    pool.start()
    try:
        engine = Engine(store, workers=pool)
        for value in range(50):
            engine.update(f"INSERT DATA {{ <{EX}s> <{EX}p> {value} }}")
        deadline = time.monotonic() + 5
        while pool._log and time.monotonic() < deadline:
            time.sleep(pool_module.FEED_INTERVAL_S)
        assert pool._log == [] and {worker.position for worker in pool._workers} == {pool._log_start}
        for _ in range(3):
            assert len(_rows(engine, f"SELECT ?o WHERE {{ <{EX}s> <{EX}p> ?o }}")) == 50
        assert pool.stats["replaced"] == 0
    finally:
        pool.close()


@contextlib.contextmanager
def _burst_past_a_stopped_worker() -> Iterator[tuple[Engine, QueryWorkers, Worker]]:
    """Two workers; one stopped (SIGSTOP: it reads nothing) and left behind by a burst of updates."""
    import broker.workers.pool as pool_module

    store = RdfStore.memory()
    pool = QueryWorkers(store, count=2, time_limit_s=10.0)
    pool.start()
    stopped = next(iter(pool._workers))
    try:
        engine = Engine(store, workers=pool)
        os.kill(stopped.process.pid, signal.SIGSTOP)
        padding = "x" * 2_000
        for value in range(1_500):  # ~3 MB of N-Quads: more than the socket pair buffers
            engine.update(f"INSERT DATA {{ <{EX}s> <{EX}p> {value} . <{EX}s{value}> <{EX}pad> '{padding}' }}")
            if value % 100 == 0:
                time.sleep(pool_module.FEED_INTERVAL_S)
        deadline = time.monotonic() + 5
        while pool.stats["lagging"] == 0 and time.monotonic() < deadline:
            time.sleep(pool_module.FEED_INTERVAL_S)
        assert pool.stats["lagging"] == 1
        yield engine, pool, stopped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped.process.pid, signal.SIGCONT)
        pool.close()


def test_a_worker_that_takes_no_deltas_stops_being_fed_and_starts_afresh(monkeypatch) -> None:
    """A stopped worker (SIGSTOP: it reads nothing) must not have deltas pile up in the gateway:
    past the backlog bound it is fed no more, the log is kept short for the other worker, and the
    stale one is replaced when next picked, with every delta."""
    import broker.workers.pool as pool_module

    monkeypatch.setattr(pool_module, "FEED_MAX_BACKLOG_BYTES", 200_000)
    monkeypatch.setattr(pool_module, "QUIET_S", 60.0)  # replaced when picked, not before (the test below)
    with _burst_past_a_stopped_worker() as (engine, pool, stopped):
        assert stopped.position < pool._log_start and stopped.backlog <= 2 * pool_module.FEED_MAX_BACKLOG_BYTES
        time.sleep(3 * pool_module.FEED_INTERVAL_S)
        assert len(pool._log) < 100  # the other worker is fed, so the log is forgotten as it goes
        os.kill(stopped.process.pid, signal.SIGCONT)
        for _ in range(3):  # both workers, the stale one replaced first
            assert len(_rows(engine, f"SELECT ?o WHERE {{ <{EX}s> <{EX}p> ?o }}")) == 1_500
        assert pool.stats["stale"] == 1


def test_a_stale_idle_worker_is_replaced_once_the_store_is_quiet_before_any_job(monkeypatch) -> None:
    """A burst left a worker behind (stopped here: it reads nothing): once the store is quiet for
    QUIET_S, it is replaced with no job asking, so a query that comes a little later does not wait
    for a new replica (a seed of 1.3 million quads takes 4-5 s)."""
    import broker.workers.pool as pool_module

    monkeypatch.setattr(pool_module, "FEED_MAX_BACKLOG_BYTES", 200_000)
    # 2 KB literals: this load is busy by its bytes, which the quiet rule does not count
    monkeypatch.setattr(pool_module, "QUIET_QUADS_PER_S", 100)
    with _burst_past_a_stopped_worker() as (engine, pool, stopped):
        quiet_from = time.monotonic()
        deadline = quiet_from + 30
        while not (pool.stats["refreshed"] == 1 and pool.running == 2) and time.monotonic() < deadline:
            time.sleep(pool_module.FEED_INTERVAL_S)
        assert pool.stats["refreshed"] == 1 and pool.running == 2, pool.stats
        assert time.monotonic() - quiet_from >= pool_module.QUIET_S - 0.2  # not while the store changed
        assert stopped not in pool._workers and stopped.process.poll() is not None
        assert all(worker.position >= pool._log_start for worker in pool._workers)
        for _ in range(3):
            assert len(_rows(engine, f"SELECT ?o WHERE {{ <{EX}s> <{EX}p> ?o }}")) == 1_500
        assert pool.stats["stale"] == 1 and pool.stats["replaced"] == 1


def test_on_disk_the_log_is_dropped_past_its_bound_and_lagging_workers_start_afresh(monkeypatch, tmp_path) -> None:
    """On disk there is no feed (a replica would write every delta again): a long stretch of
    updates without a query drops the log, and the workers that lack it get a new checkpoint."""
    import broker.workers.pool as pool_module

    monkeypatch.setattr(pool_module, "LOG_MAX_DELTAS", 20)
    store = RdfStore.open(tmp_path / "data")
    pool = QueryWorkers(store, count=2, time_limit_s=10.0)
    pool.start()
    try:
        engine = Engine(store, workers=pool)
        for value in range(50):
            engine.update(f"INSERT DATA {{ <{EX}s> <{EX}p> {value} }}")
        assert pool.stats["dropped_logs"] >= 2 and len(pool._log) < 20
        for _ in range(3):
            assert len(_rows(engine, f"SELECT ?o WHERE {{ <{EX}s> <{EX}p> ?o }}")) == 50
        assert pool.stats["stale"] >= 1
    finally:
        pool.close()
        store.close()


def test_a_large_delta_is_serialized_a_slice_at_a_time(monkeypatch) -> None:
    import broker.workers.pool as pool_module

    monkeypatch.setattr(pool_module, "SLICE", 3)
    quads = [Quad(NamedNode(f"{EX}s{n}"), NamedNode(f"{EX}p"), Literal(str(n))) for n in range(10)]
    _kind, [(added, removed, _created, _dropped)] = batched([(quads, [], [], [])])
    assert set(parse(added, format=RdfFormat.N_QUADS)) == set(quads) and removed == b""


# ~0.5-1 s on the test machine: 40^4 rows counted (the SLOW quads only)
SLOW = "SELECT (COUNT(*) AS ?n) WHERE { " + " ".join(f"?s{i} <{EX}slow> ?o{i} ." for i in range(4)) + " }"


def _count(future: Future) -> int:
    return len(future.result(timeout=30).rows)


def test_dispatched_jobs_see_the_store_as_it_was_when_queued() -> None:
    """Jobs queued behind a slow one run after later updates, yet each sees the store as it was
    when it was queued; the replies come back in order; the worker goes back to idle after."""
    store = RdfStore.memory()
    pool = QueryWorkers(store, count=1, time_limit_s=30.0)
    pool.start()
    try:
        engine = Engine(store)
        engine.update("INSERT DATA { " + " ".join(f"<{EX}x{n}> <{EX}slow> {n} ." for n in range(40)) + " }")
        count = f"SELECT ?o WHERE {{ <{EX}a> <{EX}p> ?o }}"
        futures = pool.dispatch("materialized", [((SLOW,), {})])
        for value in range(5):
            futures += pool.dispatch("materialized", [((count,), {}), ((count,), {})])
            engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> {value} }}")
        assert not futures[-1].done()  # still behind the slow job: the updates did not wait for it
        assert futures[0].result(timeout=30).rows[0][0].value == str(40**4)
        assert [_count(future) for future in futures[1:]] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
        deadline = time.monotonic() + 5
        while pool._idle.qsize() != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool._idle.qsize() == 1 and not pool._streaming
        assert pool.run("materialized", count).rows and pool.stats["replaced"] == 0
    finally:
        pool.close()


def test_a_dispatched_job_past_its_limit_fails_and_those_behind_it_are_lost() -> None:
    store = RdfStore.memory()
    pool = QueryWorkers(store, count=1, time_limit_s=1.0)
    pool.start()
    try:
        engine = Engine(store)
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }}")
        ask = ((f"ASK {{ <{EX}a> <{EX}p> 1 }}",), {})
        pid = next(iter(pool._workers)).process.pid
        started = time.monotonic()
        first, endless, *behind = pool.dispatch("materialized", [ask, ((ENDLESS,), {}), ask, ask])
        assert first.result(timeout=10).boolean is True
        with pytest.raises(TimeLimitExceeded):
            endless.result(timeout=10)
        assert time.monotonic() - started < pool.time_limit_s + 1
        for future in behind:
            with pytest.raises(WorkerLost):
                future.result(timeout=1)
        assert pool.stats["timeouts"] == 1 and pool.stats["lost"] == 2
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(pid)
        deadline = time.monotonic() + 30  # the successor
        while pool.stats["replaced"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 11 }}")
        (again,) = pool.dispatch("materialized", [((f"ASK {{ <{EX}a> <{EX}p> 11 }}",), {})])
        assert again.result(timeout=10).boolean is True
    finally:
        pool.close()


def test_a_worker_that_dies_fails_its_running_dispatched_job_as_crashed() -> None:
    store = RdfStore.memory()
    pool = QueryWorkers(store, count=1, time_limit_s=30.0)
    pool.start()
    try:
        engine = Engine(store)
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }}")
        victim = next(iter(pool._workers)).process.pid
        endless, behind = pool.dispatch("materialized", [((ENDLESS,), {}), ((ENDLESS,), {})])
        time.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(EvaluationCrashed):
            endless.result(timeout=10)
        with pytest.raises(WorkerLost):
            behind.result(timeout=1)
        # no worker until its successor is up: a job given meanwhile is lost at once
        deadline = time.monotonic() + 30
        while pool.stats["replaced"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        (after,) = pool.dispatch("materialized", [((f"ASK {{ <{EX}a> <{EX}p> 10 }}",), {})])
        assert after.result(timeout=10).boolean is True
    finally:
        pool.close()


@pytest.mark.parametrize("on_disk", [False, True])
def test_an_on_demand_pool_starts_its_workers_when_woken_and_stops_them_at_rest(on_disk: bool, tmp_path: Path) -> None:
    """No process until woken; woken, a worker with the store as it is then and every delta after;
    at rest, no process and no delta kept; woken again, a fresh replica with what changed meanwhile."""
    store = RdfStore.open(str(tmp_path / "store")) if on_disk else RdfStore.memory()
    pool = QueryWorkers(store, count=1, time_limit_s=30.0, name="reeval", on_demand=True)
    pool.start()
    engine = Engine(store)
    values = f"SELECT ?o WHERE {{ <{EX}a> <{EX}p> ?o }}"
    try:
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")
        assert pool.running == 0 and not pool.ready
        with pytest.raises(WorkerLost):  # no worker to queue it on
            pool.dispatch("materialized", [((values,), {})])[0].result(timeout=1)
        pool.wake()
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 2 }}")  # before or after its snapshot: either way
        wait_until(lambda: pool.ready)
        pids = [worker.process.pid for worker in pool._workers]
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 3 }}")
        [job] = pool.dispatch("materialized", [((values,), {})])
        assert _count(job) == 3 and pool.running == 1
        pool.rest()
        assert pool.running == 0 and not pool.ready and not pool._log
        assert not any(_alive(pid) for pid in pids)
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 4 }}")
        assert not pool._log  # not following the store at rest
        pool.wake()
        wait_until(lambda: pool.ready)
        [job] = pool.dispatch("materialized", [((values,), {})])
        assert _count(job) == 4 and pool.stats["woken"] == 2 and pool.stats["rested"] == 1
    finally:
        pool.close()


def test_a_worker_does_not_import_from_the_directory_it_was_started_in(tmp_path: Path, monkeypatch) -> None:
    """Attack pass: started by the installer without systemd, the gateway kept the installer's
    directory, and its workers' `python -m` put that directory first on their path: run from the
    checkout, the installed service's workers imported `broker` from there (or a `json.py` of
    whoever could write it). The workers start with -P: the directory is not on their path."""
    planted = tmp_path / "cwd"
    for name in ("broker", "json"):
        (planted / name).mkdir(parents=True)
        (planted / name / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'a').write({name!r})\n")
    monkeypatch.chdir(planted)
    store = RdfStore.memory()
    store.ox.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")
    pool = QueryWorkers(store, count=1, time_limit_s=5.0)
    pool.start()
    try:
        assert _rows(Engine(store, workers=pool), f"SELECT ?s WHERE {{ ?s <{EX}p> 1 }}") == {(f"<{EX}a>",)}
    finally:
        pool.close()
    assert not (tmp_path / "ran").exists(), (tmp_path / "ran").read_text()


@contextlib.contextmanager
def _started(pool: QueryWorkers) -> Iterator[QueryWorkers]:
    pool.start()
    try:
        yield pool
    finally:
        pool.close()


def _asked(pool: QueryWorkers, sparql: str) -> bool:
    return bool(pool.run("materialized", sparql).boolean)


def test_a_request_s_provisional_operations_are_seen_by_its_own_jobs_only() -> None:
    """A request of several operations applies each before computing the next, and undoes them at
    its end. Its later WHERE clauses (jobs of its own thread) see the earlier operations; no other
    thread's job does, however long the request runs, nor does a worker started meanwhile, whose
    snapshot holds them. Before, every replica had them at the next feed tick."""
    store = RdfStore.memory()
    other = ThreadPoolExecutor(1)
    with _started(QueryWorkers(store, count=2, time_limit_s=0.5)) as pool:
        provisional = Quad(NamedNode(f"{EX}provisional"), NamedNode(f"{EX}p"), Literal("1"))
        store.apply([Quad(NamedNode(f"{EX}kept"), NamedNode(f"{EX}p"), Literal(str(n))) for n in range(10)], [])
        seen = f"ASK {{ <{EX}provisional> ?p ?o }}"
        store.apply([provisional], [], sequence=PROVISIONAL)  # this thread is the request's
        assert _asked(pool, seen)  # its own job sees it
        time.sleep(4 * FEED_INTERVAL_S)  # ticks of the feeding thread
        assert not any(other.submit(_asked, pool, seen).result() for _ in range(6))
        with pytest.raises(TimeLimitExceeded):  # its own job costs its worker (it held the delta)
            pool.run("materialized", ENDLESS)
        pool.await_successor()  # started from a snapshot that holds the provisional delta
        assert pool.stats["replaced"] == 1
        assert not any(other.submit(_asked, pool, seen).result() for _ in range(6))
        assert _asked(pool, seen)
        store.apply([], [provisional], sequence=SETTLED)  # the request's undo
        time.sleep(4 * FEED_INTERVAL_S)
        both = {other.submit(_asked, pool, seen).result() for _ in range(8)} | {_asked(pool, seen)}
        assert both == {False} and pool._idle.qsize() == 2
        assert _asked(pool, f"ASK {{ <{EX}kept> ?p ?o }}")
    other.shutdown()


def test_a_request_that_fails_late_showed_its_first_operation_to_no_reader() -> None:
    """`INSERT DATA {...} ; INSERT {...} WHERE {slow}` through the engine, a reader asking all along."""
    store = RdfStore.memory()
    with _started(QueryWorkers(store, count=2, time_limit_s=1.0)) as pool:
        engine = Engine(store, workers=pool)
        engine.update(f"INSERT DATA {{ <{EX}many> <{EX}p> 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }}")
        endless_where = ENDLESS.replace(
            "SELECT (COUNT(*) AS ?n) WHERE", f"INSERT {{ <{EX}z> <{EX}p> ?n }} WHERE {{ SELECT (COUNT(*) AS ?n) WHERE"
        )
        request = f"INSERT DATA {{ <{EX}first> <{EX}p> 1 }} ; {endless_where} }}"
        answers: list[bool] = []
        running = ThreadPoolExecutor(1).submit(engine.update, request)
        while not running.done():
            answers.append(_asked(pool, f"ASK {{ <{EX}first> ?p ?o }}"))
        with pytest.raises(TimeLimitExceeded):
            running.result()
        assert len(answers) >= 5 and not any(answers)  # before: True from the first tick on
        assert not _asked(pool, f"ASK {{ <{EX}first> ?p ?o }}")


def test_a_request_that_fails_late_showed_its_first_operation_to_no_trusted_reader() -> None:
    """The same request; the reader is this process's own code (a `trusted` query, evaluated on the
    store itself). It waits for the undo instead. Before: True at every ask while the WHERE ran."""
    store = RdfStore.memory()
    with _started(QueryWorkers(store, count=2, time_limit_s=1.0)) as pool:
        engine = Engine(store, workers=pool)
        endless_where = ENDLESS.replace(
            "SELECT (COUNT(*) AS ?n) WHERE", f"INSERT {{ <{EX}z> <{EX}p> ?n }} WHERE {{ SELECT (COUNT(*) AS ?n) WHERE"
        )
        engine.update(f"INSERT DATA {{ <{EX}many> <{EX}p> 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }}")
        running = ThreadPoolExecutor(1).submit(
            engine.update, f"INSERT DATA {{ <{EX}first> <{EX}p> 1 }} ; {endless_where} }}"
        )
        first = NamedNode(f"{EX}first")
        while not any(store.ox.quads_for_pattern(first, None, None)) and not running.done():
            time.sleep(0.001)  # the first operation is in the store
        answers: list[bool] = []
        while not running.done():
            answers.append(bool(engine.query(f"ASK {{ <{EX}first> ?p ?o }}", trusted=True).boolean))
        with pytest.raises(TimeLimitExceeded):
            running.result()
        assert answers and not any(answers)
        assert not engine.query(f"ASK {{ <{EX}first> ?p ?o }}", trusted=True).boolean
        assert engine.query(f"ASK {{ <{EX}many> ?p 10 }}", trusted=True).boolean


def test_a_later_operation_s_where_sees_the_earlier_ones_in_a_worker() -> None:
    store = RdfStore.memory()
    with _started(QueryWorkers(store, count=1, time_limit_s=10.0)) as pool:
        engine = Engine(store, workers=pool)
        engine.update(
            f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }} ; INSERT DATA {{ <{EX}b> <{EX}p> 2 }} ; "
            f"INSERT {{ <{EX}n> <{EX}count> ?n }} WHERE {{ SELECT (COUNT(*) AS ?n) WHERE {{ ?s <{EX}p> ?o }} }}"
        )
        rows = pool.run("materialized", f"SELECT ?n WHERE {{ <{EX}n> <{EX}count> ?n }}").rows
        assert [row[0].value for row in rows] == ["2"]
        assert _asked(pool, f"ASK {{ <{EX}a> <{EX}p> 1 . <{EX}b> <{EX}p> 2 }}")


def test_a_large_deltas_n_quads_for_the_workers_are_made_without_a_second_copy() -> None:
    """A delta of more than SLICE quads was serialized a slice at a time and the slices joined: two
    copies of its N-Quads at once (60,000 quads, 8.4 MB of N-Quads: 16.9 MB allocated). Written into
    one buffer, about one copy, and the same bytes."""
    quads = [
        Quad(NamedNode(f"urn:s{index}"), NamedNode("urn:p"), Literal("x" * 100 + str(index)))
        for index in range(3 * pool_module.SLICE)
    ]
    expected = serialize(quads, format=RdfFormat.N_QUADS)
    tracemalloc.start()
    try:
        nquads = pool_module._nquads(quads)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert nquads == expected
    assert peak < 1.3 * len(expected), f"{peak / 1e6:.1f} MB allocated for {len(expected) / 1e6:.1f} MB of N-Quads"


def test_a_large_delta_goes_to_a_worker_without_a_pickled_copy_of_its_n_quads() -> None:
    """Pickled, an ``apply`` message's N-Quads were copied into its bytes once per worker (each
    feeding thread pickles its own) and held while the worker, at its lower priority, read them:
    26.4 MB of N-Quads, 29.7 MB allocated to send them to one worker. Sent raw after the message,
    nothing of that size is allocated, and the replica holds the delta."""
    store = RdfStore.memory()
    with _started(QueryWorkers(store, count=1)) as pool:
        quads = [
            Quad(NamedNode(f"{EX}s{index}"), NamedNode(f"{EX}p"), Literal("x" * 100 + str(index)))
            for index in range(60_000)
        ]
        message = batched([(quads, [], [], [])])
        size = pool_module._size(message)
        worker = next(iter(pool._workers))
        tracemalloc.start()
        try:
            with pool._lock:
                worker.queued_bytes += size
            worker.outbox.put(message)
            wait_until(lambda: worker.sent_bytes >= size, timeout=60)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 0.2 * size, f"{peak / 1e6:.1f} MB allocated to send {size / 1e6:.1f} MB of N-Quads"
        rows = pool.run("materialized", "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }").rows
        assert rows[0][0].value == "60000"


def test_deltas_whose_parts_go_raw_and_pickled_in_one_message_reach_the_replica_in_order(monkeypatch) -> None:
    """Parts over RAW_BYTES follow their message raw, the others stay in it: a replica caught up on
    deltas of both in one message answers as the store (RAW_BYTES lowered so that small deltas mix them)."""
    monkeypatch.setattr(pool_module, "RAW_BYTES", 120)
    store = RdfStore.memory()
    with _started(QueryWorkers(store, count=1)) as pool:
        engine = Engine(store, workers=pool)
        pool._stopping.set()  # no feed: the job's catch-up sends every delta below in one message
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 . <{EX}b> <{EX}p> 2 . <{EX}c> <{EX}p> 3 }}")
        engine.update(f"DELETE {{ ?s <{EX}p> ?o }} WHERE {{ ?s <{EX}p> ?o FILTER(?o < 3) }}")  # a job: caught up
        engine.update(f"INSERT DATA {{ <{EX}d> <{EX}p> 4 }}")
        engine.update(f"DELETE DATA {{ <{EX}c> <{EX}p> 3 }} ; INSERT DATA {{ GRAPH <{EX}g> {{ <{EX}e> <{EX}p> 5 }} }}")
        engine.update(f"INSERT DATA {{ <{EX}f> <{EX}p> 6 . <{EX}h> <{EX}p> 7 . <{EX}i> <{EX}p> 8 }}")
        message = batched(pool._log)
        assert any(part is None for step in pool_module._raw_parts(message[1])[0] for part in step[:2])
        assert any(part for step in pool_module._raw_parts(message[1])[0] for part in step[:2])
        rows = _rows(engine, EVERYTHING)  # the worker's rows, checked against the store's
        assert {row[1] for row in rows} == {f"<{EX}{name}>" for name in "defhi"}


def test_the_workers_seeds_are_streamed_a_slice_at_a_time_not_held_whole_in_the_gateway() -> None:
    """Each query worker was seeded with a `bytes` of the whole store's N-Quads, which its feeding
    thread held until its next message: at a start after a kill both seeds (42 MB each, 231,100
    quads) were in the gateway together until after "serving", its RSS 159 -> 244 MB (2026-12-07,
    docs/architecture.md "Restart after a kill"). Now the dump goes to each worker in slices as it
    is made (broker.store.nquads_slices), and the worker loads them as they come: what the gateway
    allocates for the seeds is a few slices, however large the store (tracemalloc; pyoxigraph's
    store is not traced): 4.2 MB here, two slices in flight a worker, where two seeds of 16 MB
    were held before. Each replica is whole all the same."""
    store = RdfStore.memory()
    padding = "x" * 100
    store.ox.extend(Quad(NamedNode(f"{EX}s{n}"), NamedNode(f"{EX}p"), Literal(f"{padding}{n}")) for n in range(100_000))
    size = len(store.ox.dump(format=RdfFormat.N_QUADS))
    pool = QueryWorkers(store, count=2, time_limit_s=30.0)
    try:
        _, peak = traced_peak(pool.start)
        engine = Engine(store, workers=pool)
        for _ in range(2):  # each worker in turn
            assert _rows(engine, "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }") == {
                ('"100000"^^<http://www.w3.org/2001/XMLSchema#integer>',)
            }
    finally:
        pool.close()
    assert peak < 6 * SLICE_BYTES, f"{peak / 1e6:.2f} MB allocated to seed two workers, a store of {size / 1e6:.1f} MB"


def test_a_feeding_thread_lets_go_of_a_large_delta_once_it_is_sent() -> None:
    """A worker's feeding thread kept the last message it sent until the next came: the two seeds
    of a start (42 MB each) stayed in the gateway until the first feed after "serving", and a large
    delta's N-Quads stay until the store changes again (none, on a quiet store). Once the worker
    has it, nothing of it is left in the gateway."""
    store = RdfStore.memory()
    pool = QueryWorkers(store, count=1, time_limit_s=30.0)
    pool.start()
    try:
        (worker,) = pool._workers
        quads = [Quad(NamedNode(f"{EX}s{n}"), NamedNode(f"{EX}p"), Literal(f"{'x' * 100}{n}")) for n in range(20_000)]
        size = len(serialize(quads, format=RdfFormat.N_QUADS))
        tracemalloc.start()
        try:
            store.apply(quads, [])
            del quads
            wait_until(lambda: not pool._log and worker.backlog == 0 and worker.sent_bytes > 0, timeout=30)
            left = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert _rows(Engine(store, workers=pool), "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }") == {
            ('"20000"^^<http://www.w3.org/2001/XMLSchema#integer>',)
        }
    finally:
        pool.close()
    assert left < size / 4, f"{left / 1e6:.2f} MB still held after a delta of {size / 1e6:.1f} MB was sent"
