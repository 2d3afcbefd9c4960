"""The SPU table (broker.core.spu_table): one row per SPU, its figures those of its subscriptions
and of the query evaluated again."""

from __future__ import annotations

import pytest

from broker.core.engine import Engine
from broker.core.notification import Notification

EX = "http://example.org/"
PREFIX = f"PREFIX ex: <{EX}> "
INCREMENTAL = PREFIX + "SELECT ?s ?v WHERE { ?s ex:p ?v }"
DISTINCT = PREFIX + "SELECT DISTINCT ?v WHERE { ?s ex:p ?v }"
REEVALUATED = PREFIX + "SELECT ?s ?w WHERE { ?s ex:p ?v OPTIONAL { ?s ex:q ?w } }"
ASK = PREFIX + "ASK { ?s ex:p 3 }"
FEED = f"SELECT ?s ?p ?o WHERE {{ GRAPH <{EX}g> {{ ?s ?p ?o }} }}"


@pytest.fixture
def engine() -> Engine:
    engine = Engine()
    engine.update(PREFIX + "INSERT DATA { ex:a ex:p 1 . ex:b ex:p 1 . ex:c ex:p 2 }")
    return engine


def _by_query(table: dict[str, object]) -> dict[str, dict[str, object]]:
    return {row["query"]: row for row in table["shown"]}  # type: ignore[index,union-attr]


def test_each_spu_is_one_row_with_its_kind_subscriptions_notifications_and_solutions(engine: Engine) -> None:
    seen: list[Notification] = []
    for query in (INCREMENTAL, INCREMENTAL, DISTINCT, REEVALUATED, ASK, FEED):
        engine.subscribe(query, seen.append)
    engine.update(PREFIX + "INSERT DATA { ex:d ex:p 3 . ex:e ex:p 3 } ; DELETE DATA { ex:a ex:p 1 }")
    engine.update(PREFIX + "INSERT DATA { GRAPH ex:g { ex:e ex:p ex:f } }")

    table = engine.spus.table(10)
    rows = _by_query(table)
    assert (table["spus"], table["subscriptions"]) == (5, 6)
    assert [row["query"] for row in table["shown"]][0] == INCREMENTAL  # the most subscriptions first
    assert {query: row["kind"] for query, row in rows.items()} == {
        INCREMENTAL: "incremental",
        DISTINCT: "incremental",
        REEVALUATED: "re-evaluated",
        ASK: "incremental",
        FEED: "graph feed",
    }
    assert rows[INCREMENTAL]["subscriptions"] == 2
    # per subscription: notification 0, then one per update that changed its result
    assert rows[INCREMENTAL]["notifications"] == 2 * 2
    assert rows[DISTINCT]["notifications"] == 2  # values {1, 2} -> {1, 2, 3}
    assert rows[ASK]["notifications"] == 2  # false -> true
    assert rows[FEED]["notifications"] == 2  # empty graph, then the insertion into it
    assert sum(row["notifications"] for row in table["shown"]) == len(seen)
    # the solutions held are those of the query evaluated now
    for query in (INCREMENTAL, DISTINCT, REEVALUATED):
        assert rows[query]["solutions"] == len(engine.query(query).rows)
    assert rows[ASK]["solutions"] == 1 and rows[ASK]["ask"] is True
    assert rows[FEED]["solutions"] is None  # not counted: that would be a scan of the graph


def test_the_table_is_limited_and_follows_unsubscriptions(engine: Engine) -> None:
    subscriptions = [engine.subscribe(PREFIX + f"SELECT ?s WHERE {{ ?s ex:p {n} }}", lambda _n: None) for n in range(5)]
    table = engine.spus.table(2)
    assert (table["spus"], table["subscriptions"], len(table["shown"])) == (5, 5, 2)
    for subscription in subscriptions[1:]:
        engine.unsubscribe(subscription.spuid)
    table = engine.spus.table(100)
    assert (table["spus"], table["subscriptions"]) == (1, 1)
    assert table["shown"][0]["query"] == PREFIX + "SELECT ?s WHERE { ?s ex:p 0 }"
    assert table["shown"][0]["solutions"] == 0


def test_the_owners_are_named_most_subscriptions_first_a_crowd_counted(engine: Engine) -> None:
    for owner in ("b", "a", "b", None, "c", "d", "e", "f"):
        engine.subscribe(INCREMENTAL, lambda _n: None, owner=owner)
    (row,) = engine.spus.table(10)["shown"]
    assert row["owners"] == ["b", "a", "c", "d", "e", "and 2 more"]  # f and the gateway's own ("in process")
    engine.subscribe(DISTINCT, lambda _n: None)
    assert _by_query(engine.spus.table(10))[DISTINCT]["owners"] == ["in process"]


def test_a_long_query_is_cut(engine: Engine) -> None:
    query = INCREMENTAL + " #" + "x" * 5000
    engine.subscribe(query, lambda _n: None)
    shown = engine.spus.table(1)["shown"][0]["query"]
    assert shown.startswith(INCREMENTAL) and shown.endswith("…") and len(shown) == 2001
