"""A re-evaluation in a query worker travels as SPARQL TSV: the rows read back are exactly the
rows the store's own evaluation gives, for any term (IRIs, blank nodes, literals of any datatype,
language, lexical form or escape, quoted triples) and unbound values."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from pyoxigraph import Literal, NamedNode, Quad, Store

from broker.core.query_processor import QueryProcessor
from broker.core.spu import ReevalSpu, evaluate_rows
from broker.store import RdfStore
from broker.workers.codec import rows_from_tsv
from broker.workers.jobs import subscription_rows
from tests.broker.sparql.test_terms import TERMS

XSD = "http://www.w3.org/2001/XMLSchema#"
ODD = st.sampled_from(
    [
        Literal("01", datatype=NamedNode(XSD + "integer")),
        Literal("+1", datatype=NamedNode(XSD + "integer")),
        Literal("abc", datatype=NamedNode(XSD + "integer")),
        Literal("1.0E0", datatype=NamedNode(XSD + "double")),
        Literal("NaN", datatype=NamedNode(XSD + "double")),
        Literal(".5", datatype=NamedNode(XSD + "decimal")),
        Literal("true", datatype=NamedNode(XSD + "boolean")),
        Literal("1", datatype=NamedNode(XSD + "boolean")),
        Literal("a\tb\nc\\d\"e'"),
        Literal("", language="en"),
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(TERMS, ODD), min_size=1, max_size=8))
def test_rows_read_back_from_tsv_equal_the_evaluation(objects) -> None:
    store = RdfStore(Store())
    quads = [Quad(NamedNode(f"urn:s:{i}"), NamedNode("urn:p"), term) for i, term in enumerate(objects)]
    quads += [Quad(NamedNode("urn:s:lonely"), NamedNode("urn:q"), NamedNode("urn:o"))]
    store.apply(quads, [], [], [])
    sparql = "SELECT ?s ?o WHERE { ?s ?any ?x OPTIONAL { ?s <urn:p> ?o } }"
    variables, text, boolean = subscription_rows(QueryProcessor(store), sparql, None, {})
    assert isinstance(text, bytes) and boolean is None
    expected_variables, expected, _ = evaluate_rows(store, sparql, None, {})
    assert variables == expected_variables
    assert Counter(rows_from_tsv(text)) == Counter(expected)


def test_ask_and_results_without_variables() -> None:
    store = RdfStore(Store())
    store.apply([Quad(NamedNode("urn:a"), NamedNode("urn:p"), NamedNode("urn:b"))], [], [], [])
    processor = QueryProcessor(store)
    assert subscription_rows(processor, "ASK { ?s ?p ?o }", None, {}) == ((), [], True)
    variables, text, _ = subscription_rows(processor, "SELECT * WHERE { ?s ?p ?o . FILTER(false) }", None, {})
    assert sorted(variables) == ["o", "p", "s"] and rows_from_tsv(text) == ()
    assert text.decode().split() == [f"?{name}" for name in variables]  # the header, in the same order
    assert subscription_rows(processor, "SELECT * WHERE { }", None, {}) == ((), [()], None)


POOL = ["<urn:1>", "<urn:2>", '"x"', "7", '"y"@en', "UNDEF"]
ROWS_OF_POOL = st.lists(st.tuples(st.sampled_from(POOL), st.sampled_from(POOL)), max_size=6)
RESULTS = st.lists(ROWS_OF_POOL, min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(RESULTS, st.booleans())
def test_a_re_evaluation_read_as_tsv_lines_notifies_exactly_the_difference(results, one_variable) -> None:
    """ReevalSpu.replace_text: the notifications rebuild every result, whatever repeats, order,
    unbound values or empty lines the results have."""
    store = RdfStore(Store())
    width = 1 if one_variable else 2
    variables = " ".join(f"?v{i}" for i in range(width))

    def text_of(rows: list[tuple[str, str]]) -> bytes:
        values = " ".join("(" + " ".join(row[:width]) + ")" for row in rows)
        sparql = f"SELECT {variables} WHERE {{ VALUES ({variables}) {{ {values} }} }}"
        return subscription_rows(QueryProcessor(store), sparql, None, {})[1]

    spu = ReevalSpu(("k",), "SELECT", {}, None)
    spu.variables = tuple(f"v{i}" for i in range(width))
    held: Counter = Counter()

    def rebuild(added, removed, _boolean, _previous) -> None:
        held.subtract(Counter(removed))
        held.update(Counter(added))

    spu.notify = lambda added, removed, boolean, previous: rebuild(added, removed, boolean, previous) or 1  # type: ignore[method-assign]
    for rows in results:
        text = text_of(rows)
        spu.replace_text(text)
        expected = Counter(rows_from_tsv(text))
        assert +held == expected
        assert Counter(spu.current_rows()) == expected
