"""A re-evaluation's rows held as TSV lines (TsvRows) read and write exactly as the rows they stand for."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from pyoxigraph import NamedNode, Quad, Store

from broker.core import notification as notification_module
from broker.core.notification import Notification, TsvRows
from broker.core.query_processor import QueryProcessor
from broker.store import RdfStore
from broker.workers.codec import rows_from_tsv
from broker.workers.jobs import subscription_rows
from tests.broker.sparql.test_terms import TERMS
from tests.broker.workers.test_subscription_rows import ODD


def _tsv(objects: list) -> bytes:
    store = RdfStore(Store())
    quads = [Quad(NamedNode(f"urn:s:{i % 3}"), NamedNode("urn:p"), term) for i, term in enumerate(objects)]
    quads += [Quad(NamedNode("urn:s:lonely"), NamedNode("urn:q"), NamedNode("urn:o"))]
    store.apply(quads, [], [], [])
    sparql = "SELECT ?s ?o WHERE { ?s ?any ?x OPTIONAL { ?s <urn:p> ?o } }"
    return subscription_rows(QueryProcessor(store), sparql, None, {})[1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(TERMS, ODD), min_size=1, max_size=8), st.integers(0, 5))
def test_tsv_rows_write_the_json_of_their_rows(objects, cached) -> None:
    text = _tsv(objects)
    lines = text.split(b"\n")
    expected = rows_from_tsv(text)
    # some lines written before (the cache), the others not
    TsvRows(lines[0], lines[1:-1][:cached]).json_text(("s", "o"))
    rows = TsvRows(lines[0], lines[1:-1])
    assert rows.rows() == expected and len(rows) == len(expected) and list(rows) == list(expected)
    lazy = Notification("urn:spu:1", "a", 3, ("s", "o"), rows, TsvRows(lines[0], lines[-2:-1]))
    plain = Notification("urn:spu:1", "a", 3, ("s", "o"), expected, expected[-1:])
    assert lazy.to_json_text() == json.dumps(plain.to_json()) == json.dumps(lazy.to_json())


def test_the_line_cache_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(notification_module, "TEXT_CACHE_SIZE", 4)
    text = _tsv([NamedNode(f"urn:o:{i}") for i in range(12)])
    lines = text.split(b"\n")
    body = lines[1:-1]
    for start in range(len(body)):
        rows = TsvRows(lines[0], body[start : start + 2])
        assert (
            json.loads(rows.json_text(("s", "o")))
            == json.loads(Notification("x", None, 0, ("s", "o"), rows.rows()).to_json_text())["notification"][
                "addedResults"
            ]["results"]["bindings"]
        )
        assert len(notification_module._line_texts[lines[0]]) <= 4 + 2


def test_the_line_cache_is_bounded_over_every_header_together(monkeypatch) -> None:
    """Bounded per header only, 64 headers (variable lists) of TEXT_CACHE_SIZE texts each could be
    held: ~1 GB at the default size, found by a memory soak's reading of the code."""
    monkeypatch.setattr(notification_module, "TEXT_CACHE_SIZE", 6)
    monkeypatch.setattr(notification_module, "_line_texts", {})
    text = _tsv([NamedNode(f"urn:o:{i}") for i in range(12)])
    lines = text.split(b"\n")
    for number in range(20):
        head = lines[0] + str(number).encode()  # another variable list (?o0, ?o1...), the same lines
        TsvRows(head, lines[1:3]).json_text(("s", "o"))
        rows = TsvRows(head, lines[1:5])  # two lines cached, two not: the cache is emptied meanwhile
        expected = Notification("x", None, 0, ("s", "o"), rows.rows()).to_json_text()
        assert (
            json.loads(rows.json_text(("s", "o")))
            == json.loads(expected)["notification"]["addedResults"]["results"]["bindings"]
        )
        assert sum(map(len, notification_module._line_texts.values())) <= 6
