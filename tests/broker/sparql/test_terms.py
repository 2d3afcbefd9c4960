"""The notification's wire text written from cached term texts is exactly ``json.dumps(to_json())``."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from pyoxigraph import BlankNode, Literal, NamedNode, Triple

from broker.core.notification import Notification
from broker.sparql import terms

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
IRIS = st.sampled_from(["urn:a", "urn:b", "http://example.org/\u00e9t\u00e9", "urn:x:%22q"]).map(NamedNode)
BNODES = st.sampled_from(["b0", "b1", "x"]).map(BlankNode)
LITERALS = st.one_of(
    TEXT.map(Literal),
    st.tuples(TEXT, st.sampled_from(["en", "fr-be"])).map(lambda pair: Literal(pair[0], language=pair[1])),
    st.tuples(TEXT, IRIS).map(lambda pair: Literal(pair[0], datatype=pair[1])),
    st.integers().map(Literal),
)
SIMPLE = st.one_of(IRIS, BNODES, LITERALS)
TERMS = st.one_of(SIMPLE, st.tuples(st.one_of(IRIS, BNODES), IRIS, SIMPLE).map(lambda t: Triple(*t)))
VARIABLES = ("s", "p", "o")
ROWS = st.lists(st.tuples(*(st.none() | TERMS for _ in VARIABLES)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(ROWS, ROWS, st.none() | st.text(max_size=8), st.integers(0, 10**6))
def test_text_equals_json_dumps(added, removed, alias, sequence) -> None:
    notification = Notification("urn:spu:1", alias, sequence, VARIABLES, tuple(added), tuple(removed))
    assert notification.to_json_text() == json.dumps(notification.to_json())


def test_ask_text_equals_json_dumps() -> None:
    for boolean, previous, sequence in ((True, None, 0), (False, True, 3)):
        notification = Notification("urn:spu:2", "a", sequence, (), boolean=boolean, previous=previous)
        assert notification.to_json_text() == json.dumps(notification.to_json())


def test_cache_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(terms, "TEXT_CACHE_SIZE", 10)
    for i in range(25):
        assert json.loads(terms.term_json_text(NamedNode(f"urn:n:{i}"))) == {"type": "uri", "value": f"urn:n:{i}"}
        assert len(terms._texts) <= 10
    rows = [(NamedNode(f"urn:n:{i}"),) for i in range(25)]
    assert json.loads(terms.bindings_json_text(("x",), rows)) == [
        {"x": {"type": "uri", "value": f"urn:n:{i}"}} for i in range(25)
    ]
    assert len(terms._row_texts) <= 10


def test_row_texts_are_per_variable_names() -> None:
    row = (NamedNode("urn:a"), None)
    assert json.loads(terms.bindings_json_text(("a", "b"), [row])) == [{"a": {"type": "uri", "value": "urn:a"}}]
    assert json.loads(terms.bindings_json_text(("b", "a"), [row])) == [{"b": {"type": "uri", "value": "urn:a"}}]


def test_a_long_text_is_written_each_time_and_never_cached() -> None:
    """The caches are bounded in entries: a long literal in each of many rows would fill them with
    copies of it (500 rows of a 500,000-character literal were 250 MB of cached texts)."""
    variables = ("s", "o")
    long = Literal("l" * (terms.CACHED_TEXT_MAX + 1))
    rows = [(NamedNode(f"http://example.org/cache/{index}"), long) for index in range(20)]
    text = terms.bindings_json_text(variables, rows)
    assert json.loads(text) == terms.rows_to_bindings(variables, rows)
    assert all(row not in {key[1] for key in terms._row_texts} for row in rows)
    assert long not in terms._texts
    short = (NamedNode("http://example.org/cache/short"), Literal("s"))
    terms.bindings_json_text(variables, [short])
    assert (variables, short) in terms._row_texts


def test_bindings_stop_being_written_once_past_their_limit() -> None:
    variables = ("o",)
    rows = [(Literal(f"{index}-" + "x" * 100),) for index in range(100)]
    whole = terms.bindings_json_text(variables, rows)
    assert terms.bindings_json_text(variables, rows, limit=len(whole)) == whole
    try:
        terms.bindings_json_text(variables, rows, limit=len(whole) - 1)
    except terms.TooLarge:
        pass
    else:
        raise AssertionError("a text past its limit was written")
    notification = Notification("s", None, 1, variables, added=tuple(rows[:50]), removed=tuple(rows[50:]))
    assert json.loads(notification.to_json_text(limit=len(whole))) == notification.to_json()
    try:
        notification.to_json_text(limit=len(whole) // 2)
    except terms.TooLarge:
        pass
    else:
        raise AssertionError("added and removed together passed the limit unnoticed")
