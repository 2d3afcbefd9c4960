"""The public update syntax tree (broker.api.Update): what it runs is what its printout says.

What it protects: a producer that builds a tree instead of text (the observation layer) gets the
same delta, the same store and the same errors as a client that sends `to_sparql()` over the
network; and a Digest reaches the graph's feed only when the update added all it describes.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyoxigraph import BlankNode, DefaultGraph, Literal, NamedNode, Quad

from broker.api import DeleteData, Digest, Engine, InsertData, Modify, QuadPattern, Update, Var

SUBJECTS = [NamedNode(f"urn:s{i}") for i in range(3)]
PREDICATES = [NamedNode(f"urn:p{i}") for i in range(2)]
OBJECTS = [Literal(i) for i in range(3)] + [Literal('a b " \\ é'), NamedNode("urn:o")]
GRAPHS = [DefaultGraph(), NamedNode("urn:g")]

quads = st.builds(
    Quad, st.sampled_from(SUBJECTS), st.sampled_from(PREDICATES), st.sampled_from(OBJECTS), st.sampled_from(GRAPHS)
)
patterns = st.builds(
    QuadPattern,
    st.sampled_from([*SUBJECTS, Var("s")]),
    st.sampled_from(PREDICATES),
    st.sampled_from([*OBJECTS, Var("o")]),
    st.sampled_from(GRAPHS),
)
templates = st.lists(st.one_of(quads, patterns), max_size=4).map(tuple)
wheres = st.sampled_from(
    [
        "{}",
        "{ ?s <urn:p0> ?o }",
        "{ GRAPH <urn:g> { ?s ?p ?o } }",
        "{ VALUES (?s ?o) { (<urn:s1> 7) (<urn:s2> <urn:o>) } }",
        "{ ?s <urn:p1> ?o FILTER(isLiteral(?o)) }",
    ]
)
operations = st.one_of(
    st.builds(InsertData, st.lists(quads, max_size=4).map(tuple)),
    st.builds(DeleteData, st.lists(quads, max_size=4).map(tuple)),
    st.builds(Modify, templates, templates, wheres),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(operations, min_size=1, max_size=3), min_size=1, max_size=4))
def test_the_tree_and_its_printout_change_the_store_alike(requests: list[list[object]]) -> None:
    tree_side, text_side = Engine(), Engine()
    for operations_ in requests:
        update = Update(tuple(operations_))  # type: ignore[arg-type]
        by_tree, by_text = tree_side.update(update), text_side.update(update.to_sparql())
        assert (by_tree.added, by_tree.removed) == (by_text.added, by_text.removed)
    assert set(tree_side.store.quads()) == set(text_side.store.quads())


def test_a_blank_node_in_a_ground_template_is_that_node_and_has_no_printout() -> None:
    node = BlankNode()
    update = Update((Modify(insert=(Quad(node, PREDICATES[0], OBJECTS[0]),), where="{ VALUES ?x { 1 2 } }"),))
    assert Engine().update(update).added == {Quad(node, PREDICATES[0], OBJECTS[0])}  # once, not per solution
    with pytest.raises(ValueError):
        update.to_sparql()


def test_where_must_be_a_group() -> None:
    with pytest.raises(ValueError):
        Modify(where="?s ?p ?o")


def test_a_digest_reaches_the_feed_only_when_everything_it_describes_was_added() -> None:
    graph = NamedNode("urn:g")
    engine = Engine()
    seen: list[object] = []
    engine.subscribe("SELECT ?s ?p ?o WHERE { GRAPH <urn:g> { ?s ?p ?o } }", lambda n: seen.append(n.added.digest))
    now = "{ BIND(1 AS ?x) }"
    first = Quad(SUBJECTS[0], PREDICATES[0], OBJECTS[0], graph)
    digest = Digest(graph)
    engine.update(Update((Modify(insert=(first,), where=now),), digest))
    engine.update(
        Update((Modify(insert=(first, Quad(SUBJECTS[1], PREDICATES[0], OBJECTS[0], graph)), where=now),), digest)
    )
    assert seen[-2] is digest  # all new: the feed carries the producer's digest
    assert seen[-1] is None  # one was stored already: consumers read the quads
