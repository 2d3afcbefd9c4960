"""A query worker's memory limit: an evaluation that allocates past `memory_bytes` is stopped at
once with MemoryLimitExceeded (counted), whichever of Python or pyoxigraph ran out, and the worker
goes on (or is replaced); the replica itself is not counted against its jobs.

Why the sizes and the waits: a worker copies its replica at niceness 10, below the broker, on
purpose. With a replica of ~150 MB (100,000 rows of 1 KB, a 64 MB limit), a core saturated by
another process (`taskset -c 0` and a busy loop there) took the fixture's setup from 7 s to 113 s
and the module past 150 s (170 s in CI), and a run after a worker was replaced waited for the new replica out of
its own 60 s time limit. So the replica is a quarter of that (still more than twice the limit),
and a test waits for the pool to hold a worker again (an event, however long it takes) rather
than for a time; that the memory limit, not the time limit, stopped a job is told by the error and
the pool's counters, not by a wall clock."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from pyoxigraph import Literal, NamedNode, Quad

from broker.errors import MemoryLimitExceeded, WorkerLost
from broker.store import RdfStore
from broker.workers.pool import QueryWorkers

EX = "http://example.org/"
LIMIT_BYTES = 16 << 20
THOUSAND = " ".join(str(i) for i in range(1000))
# a million rows sorted: pyoxigraph holds them all (~2.5 s and several hundred MB without a limit)
SORTED_PRODUCT = (
    f"SELECT ?a ?b WHERE {{ VALUES ?a {{ {THOUSAND} }} VALUES ?b {{ {THOUSAND} }} }} ORDER BY DESC(?a) ?b LIMIT 1"
)
LONG_ROWS = 25_000  # quads of ~1 KB each: a replica of ~37 MB, more than twice the limit
REPLICA_WAIT_S = 600.0  # a new replica under a saturated core: an event to wait for, not a bound


@pytest.fixture(scope="module")
def bounded() -> Iterator[QueryWorkers]:
    store = RdfStore.memory()
    store.ox.bulk_extend(
        Quad(NamedNode(f"{EX}s{i}"), NamedNode(f"{EX}p"), Literal("x" * 1000 + str(i))) for i in range(LONG_ROWS)
    )
    pool = QueryWorkers(store, count=1, time_limit_s=60.0, memory_bytes=LIMIT_BYTES)
    pool.start()
    yield pool
    pool.close()


def holding_a_worker(pool: QueryWorkers) -> QueryWorkers:
    """`pool` once it holds a worker with its replica again (one replaced after a job past the
    limit loads its own), so that the next job's time limit is spent on the job."""
    deadline = time.monotonic() + REPLICA_WAIT_S
    while not pool.ready:
        assert time.monotonic() < deadline, "no worker loaded its replica"
        time.sleep(0.05)
    return pool


def test_a_sort_past_the_limit_is_stopped_at_once_and_the_worker_replaced(bounded: QueryWorkers) -> None:
    counted = ("memory_limits", "timeouts", "crashes")
    before = {name: bounded.stats[name] for name in counted}
    with pytest.raises(MemoryLimitExceeded, match="memory limit of 16 MB"):
        bounded.run("materialized", SORTED_PRODUCT)
    # the memory stopped it, not the 60 s time limit (nor a crash)
    assert bounded.stats["memory_limits"] == before["memory_limits"] + 1
    assert (bounded.stats["timeouts"], bounded.stats["crashes"]) == (before["timeouts"], before["crashes"])
    count = holding_a_worker(bounded).run("materialized", "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }")
    assert count.rows[0][0].value == str(LONG_ROWS)


def test_the_replica_is_not_counted_against_a_job(bounded: QueryWorkers) -> None:
    """The worker holds ~37 MB of replica, more than twice the limit: small jobs still run."""
    for _ in range(3):
        rows = holding_a_worker(bounded).run("materialized", f"SELECT ?o WHERE {{ <{EX}s7> ?p ?o }}").rows
        assert rows[0][0].value.endswith("x7")


def test_a_result_past_the_limit_is_refused(bounded: QueryWorkers) -> None:
    """Every long row at once (~37 MB as Python objects): refused, whichever side ran out first."""
    with pytest.raises(MemoryLimitExceeded):
        holding_a_worker(bounded).run("materialized", "SELECT ?s ?o WHERE { ?s ?p ?o }")
    assert holding_a_worker(bounded).run("materialized", "ASK { ?s ?p ?o }").boolean is True


def test_dispatched_jobs_past_the_limit_fail_with_it(bounded: QueryWorkers) -> None:
    calls = [((SORTED_PRODUCT,), {}), (("ASK { ?s ?p ?o }",), {})]
    failed, fine = holding_a_worker(bounded).dispatch("materialized", calls)
    assert isinstance(failed.exception(timeout=REPLICA_WAIT_S), MemoryLimitExceeded)
    # queued behind it on the one worker: lost with it if pyoxigraph aborted, answered if Python ran out
    assert fine.exception(timeout=REPLICA_WAIT_S) is None or isinstance(fine.exception(), WorkerLost)
    assert holding_a_worker(bounded).run("materialized", "ASK { ?s ?p ?o }").boolean is True


def test_without_a_limit_the_same_sort_completes() -> None:
    """The control: the sort above is a query that ends, so the limit is what stopped it."""
    # its time limit is no bound on the sort: a starved worker sorts a million rows slowly
    pool = QueryWorkers(RdfStore.memory(), count=1, time_limit_s=REPLICA_WAIT_S, memory_bytes=0)
    pool.start()
    try:
        assert pool.run("materialized", SORTED_PRODUCT).rows[0][0].value == "999"
    finally:
        pool.close()
