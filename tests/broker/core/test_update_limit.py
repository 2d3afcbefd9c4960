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
from collections.abc import Callable

import pytest

from broker.api import Engine, UpdateFailed
from broker.core.update_processor import where_solutions
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


def test_the_where_solutions_stop_being_read_past_the_limit() -> None:
    """A WHERE clause's solutions are refused as soon as one more than the limit is read: they are
    what a query worker sends back, before any template makes quads of them."""
    engine = seeded(100)
    query = f"SELECT * WHERE {{ ?s <{EX}p> ?x . ?a <{EX}p> ?o }}"
    with pytest.raises(UpdateFailed, match="more than 100 solutions"):
        where_solutions(engine.store, query, limit=100)
    assert len(where_solutions(engine.store, query, limit=1600)) == 1600
