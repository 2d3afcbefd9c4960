"""The size of one network client's update (broker.core.update_processor.MAX_UPDATE_QUADS).

What it protects: a 60-byte update whose WHERE clause is a product of the store with itself wrote
250,000 quads from a 500-triple store, the gateway's RSS 105 -> 541 MB: on a 1 GB board one request
could end the gateway. Past `max_update_quads` quads changed (or WHERE solutions) the request is
refused with 400 and nothing of it is applied, whatever its form (a WHERE clause, a template that
multiplies each solution, DELETE WHERE, a graph operation, several operations together); the
gateway's own code (trusted requests) is not bounded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from broker.api import Engine, UpdateFailed
from broker.core.update_processor import where_solutions
from tests.support.bystander import bystander_wait
from tools.launcher import RunningGateway

EX = "http://example.org/"
SEED = " ".join(f"<{EX}s{i}> <{EX}p> {i} ." for i in range(40))  # 40 triples
PRODUCT = f"INSERT {{ GRAPH <{EX}g> {{ ?s <{EX}q> ?o }} }} WHERE {{ ?s <{EX}p> ?x . ?a <{EX}p> ?o }}"  # 1,600


def seeded(limit: int) -> Engine:
    engine = Engine(max_update_quads=limit)
    engine.update(f"INSERT DATA {{ {SEED} }}")
    return engine


@pytest.mark.parametrize(
    "update",
    [
        PRODUCT,  # 1,600 solutions
        # 40 solutions, 30 quads each: 1,200 quads from the template
        f"INSERT {{ {' '.join(f'?s <{EX}t{k}> ?o .' for k in range(30))} }} WHERE {{ ?s <{EX}p> ?o }}",
        f"INSERT DATA {{ {SEED} }} ; ADD DEFAULT TO <{EX}a> ; ADD DEFAULT TO <{EX}b> ; ADD DEFAULT TO <{EX}c>",
    ],
    ids=["where-product", "template", "operations"],
)
def test_a_network_update_past_the_limit_is_refused_whole(update: str) -> None:
    engine = seeded(100)
    before = engine.store.quads()
    with pytest.raises(UpdateFailed, match=r"more than 100 .*max_update_quads"):
        engine.update(update)
    assert engine.store.quads() == before


def test_within_the_limit_and_from_the_gateway_itself_updates_are_applied() -> None:
    engine = seeded(100)
    assert len(engine.update(f"DELETE WHERE {{ ?s <{EX}p> ?o }}").removed) == 40  # 40 <= 100
    engine = seeded(100)
    assert len(engine.update(PRODUCT, trusted=True).added) == 1600  # code of this process


def test_a_product_over_real_sockets_is_refused_at_once_and_the_gateway_serves_on(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """Through the HTTP gate and a query worker (where the WHERE clause runs for a network client):
    400 naming the setting, nothing applied, and the next requests served."""
    gateway = start_gateway(toml="[engine]\nmax_update_quads = 1000\n")
    assert gateway.update(f"INSERT DATA {{ {SEED} }}").status == 200
    reply = gateway.update(PRODUCT)
    assert reply.status == 400, reply.body
    body = json.loads(reply.body)
    assert body["error"] == "update_failed" and "max_update_quads" in body["error_description"]
    count = f"SELECT (COUNT(*) AS ?n) WHERE {{ GRAPH <{EX}g> {{ ?s ?p ?o }} }}"
    assert gateway.select(count)[0]["n"] == "0"
    assert gateway.update(f"INSERT DATA {{ GRAPH <{EX}g> {{ <{EX}x> <{EX}y> 1 }} }}").status == 200
    assert gateway.select(count)[0]["n"] == "1"


def test_template_tries_that_make_nothing_are_bounded_too() -> None:
    """Every template pattern is tried on every solution; a try that makes nothing (a variable the
    WHERE never binds) was not counted, so 1,936 solutions x 20,000 such patterns held the update
    thread for 10.5 s with a 3 s time limit. The tries are bounded as the quads are: refused before
    any is made, nothing applied; the gateway's own requests are not bounded."""
    engine = seeded(100)
    before = engine.store.quads()
    nothing = " ".join(f"?u{k} <{EX}q> ?o ." for k in range(5))  # ?u0..?u4 are never bound
    update = f"INSERT {{ {nothing} }} WHERE {{ ?s <{EX}p> ?o }}"  # 40 solutions x 5 patterns = 200 tries
    with pytest.raises(UpdateFailed, match=r"tried more than 100 times .*max_update_quads"):
        engine.update(update)
    assert engine.store.quads() == before
    assert len(engine.update(update, trusted=True).added) == 0
    within = f"INSERT {{ {' '.join(f'?u{k} <{EX}q> ?o .' for k in range(2))} }} WHERE {{ ?s <{EX}p> ?o }}"
    assert len(engine.update(within).added) == 0  # 80 tries


def test_the_where_solutions_stop_being_read_past_the_limit() -> None:
    """A WHERE clause's solutions are refused as soon as one more than the limit is read: they are
    what a query worker sends back, before any template makes quads of them."""
    engine = seeded(100)
    query = f"SELECT * WHERE {{ ?s <{EX}p> ?x . ?a <{EX}p> ?o }}"
    with pytest.raises(UpdateFailed, match="more than 100 solutions"):
        where_solutions(engine.store, query, limit=100)
    assert len(where_solutions(engine.store, query, limit=1600)) == 1600


class CountingStore:
    """The store, counting the quads its quads_for_pattern hands out."""

    def __init__(self, ox: object) -> None:
        self._ox = ox
        self.read = 0

    def quads_for_pattern(self, *pattern: object) -> Iterator[object]:
        for quad in self._ox.quads_for_pattern(*pattern):  # type: ignore[attr-defined]
            self.read += 1
            yield quad

    def __getattr__(self, name: str) -> object:
        return getattr(self._ox, name)


@pytest.mark.parametrize(
    "operation",
    [
        f"DROP GRAPH <{EX}big>",
        "CLEAR ALL",
        f"COPY <{EX}big> TO <{EX}other>",
        f"MOVE <{EX}big> TO <{EX}other>",
        f"ADD <{EX}big> TO DEFAULT",
        f"COPY DEFAULT TO <{EX}big>",  # 40 quads to copy, but the target's 1,000 to drop first
    ],
)
def test_a_graph_operation_stops_reading_a_graph_past_the_limit(operation: str) -> None:
    """A graph operation's delta is a whole graph: ADD of a 1,000,000-quad graph held the update
    thread 13.5 s before it was refused; now it is refused after reading one quad past the limit."""
    engine = seeded(100)
    data = " ".join(f"<{EX}b{i}> <{EX}p> {i} ." for i in range(1000))
    engine.update(f"INSERT DATA {{ GRAPH <{EX}big> {{ {data} }} }}", trusted=True)
    before = engine.store.quads()
    counting = CountingStore(engine.store.ox)
    engine.store.ox = counting  # type: ignore[assignment]
    try:
        with pytest.raises(UpdateFailed, match=r"more than 100 .*max_update_quads"):
            engine.update(operation)
    finally:
        engine.store.ox = counting._ox  # type: ignore[assignment]
    assert counting.read <= 101 + 40
    assert engine.store.quads() == before


def test_a_graph_operation_within_the_limit_applies() -> None:
    engine = seeded(100)
    engine.update(f"COPY DEFAULT TO <{EX}copy>")
    assert len(engine.update(f"MOVE <{EX}copy> TO <{EX}moved>").added) == 40
    assert len(engine.update(f"DROP GRAPH <{EX}moved>").removed) == 40


# -- the size of what a request copies (broker.core.held.quad_weight) -------------------------

LONG = "y" * 2560  # a quad or solution carrying it counts 1 + 10


def with_long_literal(limit: int) -> Engine:
    """An engine whose store holds the long literal once and 20 short triples to join it with."""
    engine = Engine(max_update_quads=limit)
    engine.update(f'INSERT DATA {{ <{EX}s> <{EX}big> "{LONG}" }}')
    engine.update("INSERT DATA { " + " ".join(f"<{EX}x{i}> <{EX}k> {i} ." for i in range(20)) + " }")
    return engine


def test_a_template_that_copies_a_long_term_is_weighed_by_it() -> None:
    """Each quad a template makes holds its own copy of its terms: one INSERT WHERE of 150
    characters copied a 900,000-character literal into 500 quads, the gateway 193 -> 1,058 MB."""
    engine = with_long_literal(100)
    before = engine.store.quads()
    copy = f"INSERT {{ ?x <{EX}copy> ?o }} WHERE {{ <{EX}s> <{EX}big> ?o . ?x <{EX}k> ?y }}"  # 20 quads of 11
    with pytest.raises(UpdateFailed, match=r"more than 100 quads \(each counting once more for each 256"):
        engine.update(copy)
    assert engine.store.quads() == before
    assert len(engine.update(copy, trusted=True).added) == 20  # the gateway's own code: not bounded
    short = f"INSERT {{ ?x <{EX}copy2> ?y }} WHERE {{ <{EX}s> <{EX}big> ?o . ?x <{EX}k> ?y }}"
    assert len(engine.update(short).added) == 20  # the same solutions, short quads: within 100


def test_where_solutions_that_carry_a_long_term_are_weighed_by_it() -> None:
    engine = with_long_literal(100)
    query = f"SELECT * WHERE {{ <{EX}s> <{EX}big> ?o . ?x <{EX}k> ?y }}"
    with pytest.raises(UpdateFailed, match="more than 100 solutions"):
        where_solutions(engine.store, query, limit=100)
    assert len(where_solutions(engine.store, query, limit=220)) == 20


def test_a_graph_operation_over_long_terms_is_weighed_by_them() -> None:
    engine = Engine(max_update_quads=100)
    data = " ".join(f'<{EX}b{i}> <{EX}p> "{LONG}" .' for i in range(20))
    engine.update(f"INSERT DATA {{ GRAPH <{EX}big> {{ {data} }} }}", trusted=True)
    before = engine.store.quads()
    with pytest.raises(UpdateFailed, match=r"more than 100 .*max_update_quads"):
        engine.update(f"ADD <{EX}big> TO DEFAULT")
    assert engine.store.quads() == before


def test_a_long_plain_where_goes_to_the_query_worker_not_the_planner() -> None:
    """The update thread's join planner (broker.core.bgp.plan) is quadratic in the triple patterns
    and ran before any budget or time limit: a WHERE of 4,000 held the update thread 6.97-12 s with
    a 3 s limit. A network client's WHERE of more than MAX_PLANNED_PATTERNS goes to the query worker
    (under the time limit) as a WHERE that is not a plain BGP does; shorter ones, and the gateway's
    own, are evaluated here."""
    from broker.core.update_processor import MAX_PLANNED_PATTERNS

    engine = seeded(100_000)
    sent: list[str] = []

    def worker(query, default_graphs, named_graphs, limit, /, *, time_limit_s=None):  # noqa: ANN001, ANN202
        sent.append(query)
        return where_solutions(engine.store, query, default_graphs, named_graphs, limit)

    engine.updates.where_evaluator = worker

    def update(patterns: int, **trusted: bool) -> int:
        where = " ".join(f"?s <{EX}p> ?o{k} ." for k in range(patterns))
        return len(engine.update(f"INSERT {{ ?s <{EX}q> ?o0 }} WHERE {{ {where} }}", **trusted).added)

    assert update(MAX_PLANNED_PATTERNS) == 40 and not sent
    engine.update(f"DELETE WHERE {{ ?s <{EX}q> ?o }}")
    assert update(MAX_PLANNED_PATTERNS + 1) == 40 and len(sent) == 1
    engine.update(f"DELETE WHERE {{ ?s <{EX}q> ?o }}")
    assert update(MAX_PLANNED_PATTERNS + 1, trusted=True) == 40 and len(sent) == 1


def test_a_data_block_is_read_no_further_than_the_limit(start_gateway: Callable[..., RunningGateway]) -> None:
    """`INSERT DATA { <a> <b> ( 1 1 1 ... ) }`: two characters an item, two quads each. 300,000
    items (600 KB) were parsed in full on the update thread, 2.3-2.5 s while a bystander's update
    waited, before the size limit refused them; the DATA block is now read no further than the
    limit (broker.sparql.limits.DATA_QUAD_LIMIT): 400 in about 0.3 s."""
    gateway = start_gateway(toml="[engine]\nmax_update_quads = 2000\n")
    hostile = f"INSERT DATA {{ <{EX}a> <{EX}b> ( {' '.join(['1'] * 400_000)} ) }}"
    reply, waited = bystander_wait(gateway, hostile, head_start_s=0.2)
    assert waited < 1.5, waited  # 2.9 s before
    assert reply.status == 400 and "max_update_quads" in json.loads(reply.body)["error_description"]
    assert gateway.select(f"SELECT (COUNT(*) AS ?n) WHERE {{ <{EX}a> ?p ?o }}")[0]["n"] == "0"
    # within the limit, and the gateway's own DATA blocks whatever their size, are read whole
    assert gateway.update(f"INSERT DATA {{ <{EX}a> <{EX}b> ( {' '.join(['1'] * 999)} ) }}").status == 200
    engine = Engine(max_update_quads=10)
    assert len(engine.update(f"INSERT DATA {{ <{EX}a> <{EX}b> ( 1 2 3 4 5 6 ) }}", trusted=True).added) == 13
    with pytest.raises(UpdateFailed, match="more than 10 quads"):
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}b> ( 1 2 3 4 5 6 ) }}")


def test_a_delayed_data_block_is_read_no_further_than_the_limit_when_scheduled(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """A delayed update is checked when it is scheduled, and runs as a network client's when due:
    its DATA block was parsed in full at scheduling (2.3 s of the update thread for 300,000 items
    while a bystander waited), before the size limit refused it when due, unseen. It is now read
    no further than the limit, and refused at once."""
    gateway = start_gateway(toml="[engine]\nmax_update_quads = 2000\n")
    hostile = f"INSERT DATA {{ <{EX}a> <{EX}b> ( {' '.join(['1'] * 400_000)} ) }}"
    reply, waited = bystander_wait(gateway, hostile, head_start_s=0.2, params=[("delay", "60000")])
    assert waited < 1.5, waited
    assert reply.status == 400 and "max_update_quads" in json.loads(reply.body)["error_description"]
    assert json.loads(gateway.request("GET", "/scheduled").body)["scheduled"] == []
    within = f"INSERT DATA {{ <{EX}a> <{EX}b> ( {' '.join(['1'] * 999)} ) }}"
    assert gateway.update(within, params=[("delay", "60000")]).status == 202
