"""Graph feeds: ``SELECT ?s ?p ?o WHERE { GRAPH <g> { ?s ?p ?o } }`` served from the delta alone.

The differential tests (tests/differential, queries ``graph_feed*``) check the notifications
against re-evaluation over random updates; these check that such queries really take the feed
path (no shape group, no counts) and that other shapes do not.
"""

from __future__ import annotations

import pytest
from pyoxigraph import NamedNode

from broker.core.budget import OverBudget
from broker.core.engine import Engine
from broker.core.notification import Notification, QuadRows
from broker.core.spu import GraphFeedSpu

EX = "http://example.org/"
G = f"<{EX}g>"


def rows(rows: tuple[tuple[object, ...], ...]) -> set[tuple[str, ...]]:
    return {tuple(str(term) for term in row) for row in rows}


@pytest.fixture
def engine() -> Engine:
    engine = Engine()
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ GRAPH ex:g {{ ex:a ex:p 1 }} GRAPH ex:h {{ ex:b ex:p 2 }} }}")
    return engine


def test_a_feed_query_takes_the_feed_path_and_notifies_the_graphs_delta(engine: Engine) -> None:
    seen: list[Notification] = []
    subscription = engine.subscribe(f"SELECT ?o ?s ?p WHERE {{ GRAPH {G} {{ ?s ?p ?o }} }}", seen.append)
    spu = engine.spus.subscriptions[subscription.spuid][1]
    assert isinstance(spu, GraphFeedSpu) and not engine.spus.groups
    assert rows(seen[0].added) == {('"1"^^<http://www.w3.org/2001/XMLSchema#integer>', f"<{EX}a>", f"<{EX}p>")}
    engine.update(
        f"PREFIX ex: <{EX}> DELETE DATA {{ GRAPH ex:g {{ ex:a ex:p 1 }} }} ; "
        f"INSERT DATA {{ GRAPH ex:g {{ ex:c ex:q ex:d }} GRAPH ex:h {{ ex:c ex:q ex:d }} }}"
    )
    assert rows(seen[1].added) == {(f"<{EX}d>", f"<{EX}c>", f"<{EX}q>")}  # projected order, graph h left out
    assert rows(seen[1].removed) == {('"1"^^<http://www.w3.org/2001/XMLSchema#integer>', f"<{EX}a>", f"<{EX}p>")}
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ GRAPH ex:h {{ ex:x ex:y ex:z }} }}")
    assert len(seen) == 2  # nothing changed in g: no notification
    engine.update(f"DROP GRAPH {G}")
    assert rows(seen[2].removed) == {(f"<{EX}d>", f"<{EX}c>", f"<{EX}q>")} and not seen[2].added


def test_a_late_subscriber_gets_the_graph_from_the_store_and_unsubscribing_ends_the_feed(engine: Engine) -> None:
    query = f"SELECT ?s ?p ?o WHERE {{ GRAPH {G} {{ ?s ?p ?o }} }}"
    first = engine.subscribe(query, lambda notification: None)
    engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ GRAPH ex:g {{ ex:e ex:p ex:f }} }}")
    late: list[Notification] = []
    second = engine.subscribe(query, late.append)
    assert engine.spus.subscriptions[first.spuid][1] is engine.spus.subscriptions[second.spuid][1]  # shared
    assert len(late[0].added) == 2
    engine.unsubscribe(first.spuid)
    engine.unsubscribe(second.spuid)
    assert engine.spus.feeds == {}


@pytest.mark.parametrize(
    "where",
    [
        "SELECT ?s ?p WHERE { GRAPH <http://example.org/g> { ?s ?p ?o } }",  # projection drops ?o: a multiset
        "SELECT ?s ?o WHERE { GRAPH <http://example.org/g> { ?s <http://example.org/p> ?o } }",
        "SELECT ?s ?p ?o WHERE { GRAPH <http://example.org/g> { ?s ?p ?o FILTER(?o > 0) } }",
        "SELECT * WHERE { GRAPH <http://example.org/g> { ?s ?p ?s } }",
        "SELECT ?s ?p ?o WHERE { ?s ?p ?o }",
        "SELECT ?g ?s ?p ?o WHERE { GRAPH ?g { ?s ?p ?o } }",
    ],
)
def test_other_shapes_are_not_feeds(engine: Engine, where: str) -> None:
    subscription = engine.subscribe(where, lambda notification: None)
    assert not isinstance(engine.spus.subscriptions[subscription.spuid][1], GraphFeedSpu)
    assert engine.spus.feeds == {}


def test_feed_of_a_graph_named_by_a_protocol_dataset_is_not_a_feed(engine: Engine) -> None:
    subscription = engine.subscribe(
        "SELECT ?s ?p ?o WHERE { GRAPH <http://example.org/g> { ?s ?p ?o } }",
        lambda notification: None,
        named_graph_uri=[EX + "h"],
    )
    assert not isinstance(engine.spus.subscriptions[subscription.spuid][1], GraphFeedSpu)
    assert NamedNode(EX + "g") not in engine.spus.feeds


def test_feed_rows_are_the_graphs_quads_read_lazily(engine: Engine) -> None:
    seen: list[Notification] = []
    engine.subscribe(f"SELECT ?o ?s ?p WHERE {{ GRAPH {G} {{ ?s ?p ?o }} }}", seen.append)
    engine.update(
        f"PREFIX ex: <{EX}> INSERT DATA {{ GRAPH ex:g {{ ex:c ex:q ex:d }} GRAPH ex:h {{ ex:e ex:q ex:f }} }}"
    )
    added = seen[1].added
    assert isinstance(added, QuadRows) and added.graph == NamedNode(EX + "g")
    assert len(added.source) == 2  # the update's own quads, both graphs: nothing filtered on the update thread
    assert [str(quad.subject) for quad in added.quads()] == [f"<{EX}c>"]
    row = (NamedNode(EX + "d"), NamedNode(EX + "c"), NamedNode(EX + "q"))
    assert added and len(added) == 1 and added == (row,) and list(added) == [row] and added[0] == row
    assert not seen[1].removed and seen[1].removed == ()
    assert seen[1].to_json()["notification"]["addedResults"]["results"]["bindings"] == [
        {
            "o": {"type": "uri", "value": EX + "d"},
            "s": {"type": "uri", "value": EX + "c"},
            "p": {"type": "uri", "value": EX + "q"},
        }
    ]
    assert not QuadRows(added.source, NamedNode(EX + "nowhere"), (0, 1, 2))


def test_a_bounded_update_hands_a_feed_over_only_when_it_touches_the_graph(engine: Engine) -> None:
    """Under a budget a feed whose subscriber may block is refused (the update goes to the update thread),
    but only for the updates that change its graph."""
    seen: list[Notification] = []
    engine.subscribe(f"SELECT ?s ?p ?o WHERE {{ GRAPH {G} {{ ?s ?p ?o }} }}", seen.append)
    before = engine.store.quads()
    with pytest.raises(OverBudget):
        engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ GRAPH ex:g {{ ex:x ex:p 2 }} }}", budget=1000)
    assert engine.store.quads() == before and len(seen) == 1
    result = engine.update(f"PREFIX ex: <{EX}> INSERT DATA {{ GRAPH ex:h {{ ex:x ex:p 3 }} }}", budget=1000)
    assert len(result.added) == 1 and len(seen) == 1
