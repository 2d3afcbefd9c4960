"""The size of a query's response body ([http] max_result_bytes; broker.gates.negotiation.serialize).

What it protects: one short query (a product of a 1,000-triple store with itself) made a 225 MB
JSON body in 4 s and took the gateway's RSS to 710 MB, a reader's way to end a gateway on a 1 GB
board. Past the limit the serialization stops, the client gets 413 naming the setting, and the
gateway goes on serving; within it every result format comes whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from pyoxigraph import NamedNode, Quad, Store

from broker.api import ResultTooLarge
from broker.gates.negotiation import serialize
from tools.launcher import RunningGateway

EX = "http://example.org/"
PRODUCT = f"SELECT * WHERE {{ ?s <{EX}p> ?o . ?a <{EX}p> ?c }}"


def store(triples: int) -> Store:
    ox = Store()
    ox.extend(Quad(NamedNode(f"{EX}s{i}"), NamedNode(f"{EX}p"), NamedNode(f"{EX}o{i}")) for i in range(triples))
    return ox


@pytest.mark.parametrize("accept", [None, "application/sparql-results+xml", "text/csv", "text/tab-separated-values"])
def test_a_result_past_the_limit_stops_being_written(accept: str | None) -> None:
    ox = store(100)  # 10,000 rows
    with pytest.raises(ResultTooLarge, match=r"larger than 20000 bytes .*max_result_bytes"):
        serialize(ox.query(PRODUCT), accept, 20_000)
    body, _ = serialize(ox.query(PRODUCT), accept, 10_000_000)
    assert body == serialize(ox.query(PRODUCT), accept)[0] and len(body) > 20_000


def test_a_graph_result_past_the_limit_stops_being_written() -> None:
    ox = store(100)
    construct = f"CONSTRUCT {{ ?s <{EX}q> ?c }} WHERE {{ ?s <{EX}p> ?o . ?a <{EX}p> ?c }}"
    with pytest.raises(ResultTooLarge):
        serialize(ox.query(construct), "application/n-triples", 20_000)


def test_a_query_past_the_limit_over_real_sockets_gets_413_and_the_gateway_serves_on(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    gateway = start_gateway(toml="[http]\nmax_result_bytes = 50000\n")
    seed = " ".join(f"<{EX}s{i}> <{EX}p> <{EX}o{i}> ." for i in range(100))
    assert gateway.update(f"INSERT DATA {{ {seed} }}").status == 200
    reply = gateway.query(PRODUCT)
    assert reply.status == 413, reply.body[:200]
    assert "max_result_bytes" in json.loads(reply.body)["error_description"]
    assert len(gateway.select(f"{PRODUCT} LIMIT 100")) == 100
