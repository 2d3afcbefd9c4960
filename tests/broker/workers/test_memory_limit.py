"""A query worker's memory limit: an evaluation that allocates past `memory_bytes` is stopped at
once with MemoryLimitExceeded (counted), whichever of Python or pyoxigraph ran out, and the worker
goes on (or is replaced); the replica itself is not counted against its jobs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from pyoxigraph import Literal, NamedNode, Quad

from broker.errors import MemoryLimitExceeded, WorkerLost
from broker.store import RdfStore
from broker.workers.pool import QueryWorkers

EX = "http://example.org/"
LIMIT_BYTES = 64 << 20
THOUSAND = " ".join(str(i) for i in range(1000))
# a million rows sorted: pyoxigraph holds them all (~2.5 s and several hundred MB without a limit)
SORTED_PRODUCT = (
    f"SELECT ?a ?b WHERE {{ VALUES ?a {{ {THOUSAND} }} VALUES ?b {{ {THOUSAND} }} }} ORDER BY DESC(?a) ?b LIMIT 1"
)
LONG_ROWS = 100_000  # quads of ~1 KB each: a replica of ~150 MB, far past the limit


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


def test_a_sort_past_the_limit_is_stopped_at_once_and_the_worker_replaced(bounded: QueryWorkers) -> None:
    before = bounded.stats["memory_limits"]
    started = time.monotonic()
    with pytest.raises(MemoryLimitExceeded, match="memory limit of 64 MB"):
        bounded.run("materialized", SORTED_PRODUCT)
    assert time.monotonic() - started < 10  # the memory stopped it, not the 60 s time limit
    assert bounded.stats["memory_limits"] == before + 1
    assert bounded.run("materialized", "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }").rows[0][0].value == str(LONG_ROWS)


def test_the_replica_is_not_counted_against_a_job(bounded: QueryWorkers) -> None:
    """The worker holds ~150 MB of replica, more than twice the limit: small jobs still run."""
    for _ in range(3):
        rows = bounded.run("materialized", f"SELECT ?o WHERE {{ <{EX}s7> ?p ?o }}").rows
        assert rows[0][0].value.endswith("x7")


def test_a_result_past_the_limit_is_refused(bounded: QueryWorkers) -> None:
    """Every long row at once (~150 MB as Python objects): refused, whichever side ran out first."""
    with pytest.raises(MemoryLimitExceeded):
        bounded.run("materialized", "SELECT ?s ?o WHERE { ?s ?p ?o }")
    assert bounded.run("materialized", "ASK { ?s ?p ?o }").boolean is True


def test_dispatched_jobs_past_the_limit_fail_with_it(bounded: QueryWorkers) -> None:
    failed, fine = bounded.dispatch("materialized", [((SORTED_PRODUCT,), {}), (("ASK { ?s ?p ?o }",), {})])
    assert isinstance(failed.exception(timeout=30), MemoryLimitExceeded)
    # queued behind it on the one worker: lost with it if pyoxigraph aborted, answered if Python ran out
    assert fine.exception(timeout=30) is None or isinstance(fine.exception(), WorkerLost)
    assert bounded.run("materialized", "ASK { ?s ?p ?o }").boolean is True


def test_without_a_limit_the_same_sort_completes() -> None:
    """The control: the sort above is a query that ends, so the limit is what stopped it."""
    pool = QueryWorkers(RdfStore.memory(), count=1, time_limit_s=60.0, memory_bytes=0)
    pool.start()
    try:
        assert pool.run("materialized", SORTED_PRODUCT).rows[0][0].value == "999"
    finally:
        pool.close()
