"""`values_quads`, the retention delete's lookups, finds what `evaluate_bgp` finds.

What it protects: the retention agent's `DELETE { P } WHERE { VALUES ?s { ... } P }` takes the quads
P matched for each value without building a solution per quad (broker.core.bgp.values_quads); a
difference from the general evaluation would delete the wrong quads. Random one-pattern BGPs
(constants, variables, a variable twice, GRAPH of a constant, a variable or the default graph),
pins, datasets and values over a tiny store are compared with `evaluate_bgp(capture=True,
quads_only=True)` run once per value.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyoxigraph import DefaultGraph, Literal, NamedNode, Quad, Store

import broker.core.update_processor
from broker.core.bgp import Dataset, evaluate_bgp, values_quads
from broker.core.engine import Engine
from broker.sparql.patterns import QuadPattern, Var

EX = "http://example.org/"
IRIS = [NamedNode(f"{EX}{name}") for name in ("a", "b", "c")]
GRAPHS = [NamedNode(f"{EX}g1"), NamedNode(f"{EX}g2")]
TERMS = [*IRIS, Literal("a"), Literal("1")]
VARIABLES = ("s", "p", "o", "g")


def _store(quads: list[Quad]) -> Store:
    store = Store()
    store.extend(quads)
    return store


quads = st.lists(
    st.builds(
        Quad,
        st.sampled_from(IRIS),
        st.sampled_from(IRIS),
        st.sampled_from(TERMS),
        st.sampled_from([*GRAPHS, DefaultGraph()]),
    ),
    max_size=30,
)
positions = st.one_of(st.sampled_from(VARIABLES).map(Var), st.sampled_from(TERMS))
graphs = st.one_of(st.sampled_from(VARIABLES).map(Var), st.sampled_from([*GRAPHS, DefaultGraph()]))
datasets = st.builds(
    Dataset,
    st.sampled_from([None, DefaultGraph(), *GRAPHS]),
    st.sampled_from([None, frozenset(), frozenset(GRAPHS[:1]), frozenset(GRAPHS)]),
)


@settings(max_examples=300, deadline=None)
@given(
    data=quads,
    pattern=st.builds(QuadPattern, positions, positions, positions, graphs),
    name=st.sampled_from(VARIABLES),
    values=st.lists(st.sampled_from([*IRIS, *GRAPHS]), max_size=4),
    pins=st.dictionaries(st.sampled_from(VARIABLES), st.sampled_from([*IRIS, *GRAPHS]), max_size=2),
    dataset=datasets,
)
def test_values_quads_finds_what_evaluate_bgp_finds(
    data: list[Quad],
    pattern: QuadPattern,
    name: str,
    values: list[NamedNode],
    pins: dict[str, object],
    dataset: Dataset,
) -> None:
    store = _store(data)
    found = values_quads(store, pattern, pins, name, values, dataset)
    expected = [
        solution[0]
        for value in values
        if pins.get(name, value) == value
        for solution in evaluate_bgp(store, (pattern,), {**pins, name: value}, dataset, capture=True, quads_only=True)
    ]
    if found is None:  # only when a variable is bound twice by the lookup: each solution holds more
        names = [term.name for term in pattern.positions() if isinstance(term, Var) and term.name not in pins]
        assert len([each for each in names if each != name]) > len({each for each in names if each != name})
        return
    assert found == expected


def test_the_retention_delete_does_not_build_a_solution_per_quad(monkeypatch: pytest.MonkeyPatch) -> None:
    """The delete of gateway.observations.pruning takes values_quads: evaluate_bgp is not called."""
    engine = Engine()
    graph = GRAPHS[0]
    engine.store.ox.extend(Quad(subject, IRIS[1], Literal(str(k)), graph) for subject in IRIS for k in range(3))

    def refused(*_: object, **__: object) -> list[dict[str, object]]:
        raise AssertionError("evaluate_bgp was called")

    monkeypatch.setattr(broker.core.update_processor, "evaluate_bgp", refused)
    pattern = f"GRAPH <{graph.value}> {{ ?s ?p ?o }}"
    result = engine.update(f"DELETE {{ {pattern} }} WHERE {{ VALUES ?s {{ <{EX}a> <{EX}c> }} {pattern} }}")
    assert {quad.subject for quad in result.removed} == {IRIS[0], IRIS[2]}
    assert len(result.removed) == 6
    assert {quad.subject for quad in engine.store.ox} == {IRIS[1]}
