"""Fixtures of the observation-layer tests: a real engine, the default Mapper, and store queries.

What it protects: every update the mapping layer writes is run through broker.core.engine.Engine
(the same single-operation path the adapters use), and checked by SPARQL queries on the store,
never by inspecting the update text.
"""

from __future__ import annotations

import pytest

from broker.api import Engine
from gateway.observations import LATEST_QUERY, LatestCache, Reading, observation_update

PREFIXES = """PREFIX sosa: <http://www.w3.org/ns/sosa/>
PREFIX qudt: <http://qudt.org/schema/qudt/>
PREFIX unit: <http://qudt.org/vocab/unit/>
PREFIX gw: <http://w3id.org/sepa-gateway/ns#>
PREFIX xsd: <http://www.w3.org/2001/XMLSchema#>
"""
OBS = "<http://w3id.org/sepa-gateway/graph/observations>"
LATEST = "<http://w3id.org/sepa-gateway/graph/latest>"


class Store:
    """An engine plus the adapter-side state (the latest mirror), as the MQTT adapter keeps them."""

    def __init__(self, mirror: bool = True) -> None:
        self.engine = Engine()
        self.latest = LatestCache()
        self.mirror = mirror
        if mirror:
            self.latest.load(self.rows(LATEST_QUERY))

    def write(self, readings: list[Reading], gateway_id: str = "gw-test") -> None:
        result = self.engine.update(observation_update(readings, gateway_id, self.latest))
        if self.mirror:
            self.latest.apply(result.added, result.removed)

    def rows(self, query: str) -> list[dict]:
        result = self.engine.query(query if query.startswith("SELECT") else PREFIXES + query)
        return [dict(zip(result.variables, row, strict=True)) for row in result.rows]

    def values(self, query: str) -> list[dict[str, str]]:
        """Rows with each term as its lexical value (IRIs and literals alike)."""
        return [{k: v.value for k, v in row.items() if v is not None} for row in self.rows(PREFIXES + query)]

    def count(self, graph: str) -> int:
        return len(self.rows(f"SELECT * WHERE {{ GRAPH {graph} {{ ?s ?p ?o }} }}"))


@pytest.fixture(params=[True, False], ids=["mirror", "optional"])
def store(request: pytest.FixtureRequest) -> Store:
    """Both ways of deleting the old latest values: constants from the mirror, OPTIONAL patterns."""
    return Store(mirror=request.param)
