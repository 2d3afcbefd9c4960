"""Property test of read rights (secure gates): a client never sees a row of a graph it may not read.

Why this oracle: a client allowed to read the graphs R must see exactly what it would see if the
store held nothing but the quads of R. So after the random data and after every random update,
for every query of the pool, subscribed through the dataset restriction the secure gates apply
(:meth:`GraphAccess.restrict_dataset`), the view rebuilt from notifications and the answer of a
query must both equal the answer of the same query on a second engine loaded with the readable
quads only. Random policies: every non-empty subset of {default graph, g1, g2, g3}.
"""

from __future__ import annotations

import contextlib

from hypothesis import given, note
from hypothesis import strategies as st
from pyoxigraph import DefaultGraph

from broker.core.access import DEFAULT_GRAPH_IRI, NO_GRAPH_IRI, GraphAccess
from broker.core.engine import Engine
from broker.errors import Forbidden, SepaError
from tests.broker.differential.queries import POOL, PoolQuery
from tests.broker.differential.strategies import G1, G2, G3, Scenario, budget, scenarios
from tests.broker.differential.test_notifications import ClientView, comparable, normalize

GRAPHS = (DEFAULT_GRAPH_IRI, G1, G2, G3)


def readable_only(engine: Engine, access: GraphAccess) -> Engine:
    """A new engine holding only the quads of the graphs `access` may read."""
    oracle = Engine(mode="naive")
    readable = access.readable_terms()
    assert readable is not None
    for quad in engine.store.ox:
        if quad.graph_name in readable or (isinstance(quad.graph_name, DefaultGraph) and DefaultGraph() in readable):
            oracle.store.ox.add(quad)
    return oracle


def oracle_query(query: PoolQuery) -> PoolQuery:
    """The pool query with its protocol dataset as the restriction reads it: a default graph given
    alone means no named graphs (SPARQL 1.1 Protocol §2.1.4)."""
    if query.default_graph_uri and not query.named_graph_uri:
        return PoolQuery(query.name, query.sparql, query.default_graph_uri, (NO_GRAPH_IRI,))
    return query


@budget(60)
@given(scenario=scenarios(max_updates=6), readable=st.sets(st.sampled_from(GRAPHS), min_size=1))
def test_a_reader_sees_exactly_the_readable_graphs(scenario: Scenario, readable: set[str]) -> None:
    access = GraphAccess(read=frozenset(readable))
    engine = Engine()
    engine.update(scenario.dataset)
    views: list[tuple[ClientView, PoolQuery]] = []
    for query in POOL:
        try:
            default, named = access.restrict_dataset(query.default_graph_uri, query.named_graph_uri, query.sparql)
        except Forbidden:
            assert set(query.default_graph_uri + query.named_graph_uri) - readable or "FROM" in query.sparql
            continue
        view = ClientView(oracle_query(query), query.name)
        engine.subscribe(query.sparql, view, alias=query.name, default_graph_uri=default, named_graph_uri=named)
        view.drain()
        views.append((view, PoolQuery(query.name, query.sparql, default, named)))
    for request in (None, *scenario.updates):
        if request is not None:
            note(f"update: {request}")
            with contextlib.suppress(SepaError):  # a refused update changes nothing: still checked below
                engine.update(
                    request.sparql,
                    using_graph_uri=request.using_graph_uri,
                    using_named_graph_uri=request.using_named_graph_uri,
                )
        oracle = readable_only(engine, access)
        for view, restricted in views:
            view.drain()
            view.check_against(oracle)
            if not restricted.sparql.lstrip().upper().startswith("ASK"):
                answer = engine.query(
                    restricted.sparql,
                    default_graph_uri=restricted.default_graph_uri,
                    named_graph_uri=restricted.named_graph_uri,
                )
                expected = oracle.query(
                    view.query.sparql,
                    default_graph_uri=view.query.default_graph_uri,
                    named_graph_uri=view.query.named_graph_uri,
                )
                name = view.query.name
                assert comparable(name, normalize(answer.variables, answer.rows)) == comparable(
                    name, normalize(expected.variables, expected.rows)
                )
