"""`VALUES ?v { <iri> ... }` beside a basic graph pattern is evaluated by index lookups.

What it protects: the retention agent deletes observations with one such update per chunk
(gateway.observations.pruning.delete_update). Through the query engine every solution was read back
into Python and every quad built again from it (~17 us a quad, 190 us an observation); looked up
from each value, the quads matched are removed as found. The differential test of the update
processor (tests/broker/differential) draws VALUES blocks at random; these pin the shapes that take
the lookup path, and that a cached request shape gives each request its own values.
"""

from __future__ import annotations

from pyoxigraph import Literal, NamedNode, Quad, Store

from broker.core.engine import Engine
from broker.sparql import update_parser
from broker.sparql.update_parser import parse_update

EX = "http://example.org/"
G = NamedNode(f"{EX}observations")


def _engine(subjects: int) -> Engine:
    engine = Engine()
    quads = []
    for index in range(subjects):
        subject = NamedNode(f"{EX}obs{index}")
        quads += [Quad(subject, NamedNode(f"{EX}p{k}"), Literal(str(index * k)), G) for k in range(3)]
        quads.append(Quad(subject, NamedNode(f"{EX}same"), NamedNode(f"{EX}obs{index}"), G))
    engine.store.ox.extend(quads)
    return engine


def _delete(names: list[str]) -> str:
    values = " ".join(f"<{EX}{name}>" for name in names)
    pattern = f"GRAPH <{G.value}> {{ ?s ?p ?o }}"
    return f"DELETE {{ {pattern} }} WHERE {{ VALUES ?s {{ {values} }} {pattern} }}"


def test_the_retention_request_is_planned_as_lookups() -> None:
    operation = parse_update(_delete(["obs1", "obs2"])).operations[0]
    assert operation.where_bgp is not None
    assert operation.where_values == ("s", (NamedNode(f"{EX}obs1"), NamedNode(f"{EX}obs2")))
    assert operation.delete_matches == (0,)


def test_it_removes_exactly_what_pyoxigraph_removes() -> None:
    engine = _engine(20)
    oracle = Store()
    oracle.extend(engine.store.ox)
    request = _delete(["obs3", "obs5", "obs5", "missing"])
    before = frozenset(engine.store.ox)
    result = engine.update(request)
    oracle.update(request)
    assert frozenset(engine.store.ox) == frozenset(oracle)
    assert result.removed == before - frozenset(oracle)
    assert len(result.removed) == 8  # two observations of four quads; a duplicate value changes nothing


def test_a_cached_shape_gives_each_request_its_own_values() -> None:
    update_parser._TEXTS.clear()
    update_parser._SHAPES.clear()
    engine = _engine(10)
    removed = [engine.update(_delete([f"obs{index}", f"obs{index + 5}"])).removed for index in range(4)]
    for index, quads in enumerate(removed):
        assert {quad.subject.value for quad in quads} == {f"{EX}obs{index}", f"{EX}obs{index + 5}"}
    assert update_parser._SHAPES  # the later ones came from the cached shape


def test_values_with_literals_or_several_variables_still_go_to_the_query_engine() -> None:
    for where in (
        'VALUES ?o { "0" } ?s ?p ?o',
        "VALUES (?s ?p) { (<http://example.org/obs1> <http://example.org/p1>) } ?s ?p ?o",
        "VALUES ?s { UNDEF } ?s ?p ?o",
    ):
        operation = parse_update(f"DELETE {{ ?s ?p ?o }} WHERE {{ {where} }}").operations[0]
        assert operation.where_bgp is None and operation.where_values is None, where


def test_a_filter_pin_before_the_patterns_is_a_lookup_too() -> None:
    engine = _engine(5)
    request = (
        f"DELETE {{ GRAPH <{G.value}> {{ ?s ?p ?o }} }} "
        f"WHERE {{ FILTER(?s = <{EX}obs2>) GRAPH <{G.value}> {{ ?s ?p ?o }} }}"
    )
    assert parse_update(request).operations[0].where_pins == (("s", NamedNode(f"{EX}obs2")),)
    assert {quad.subject.value for quad in engine.update(request).removed} == {f"{EX}obs2"}


def test_two_pins_of_one_variable_must_both_hold() -> None:
    """Two FILTER pins of ?s to different IRIs: nothing matches (the query engine answers it); the
    same IRI twice is still a lookup."""
    engine = _engine(5)
    oracle = Store()
    oracle.extend(engine.store.ox)
    pattern = f"GRAPH <{G.value}> {{ ?s ?p ?o }}"
    never = f"DELETE {{ {pattern} }} WHERE {{ {pattern} FILTER(?s = <{EX}obs1>) FILTER(?s = <{EX}obs2>) }}"
    assert parse_update(never).operations[0].where_bgp is None
    assert engine.update(never).removed == frozenset()
    oracle.update(never)
    assert frozenset(engine.store.ox) == frozenset(oracle)
    twice = f"DELETE {{ {pattern} }} WHERE {{ {pattern} FILTER(?s = <{EX}obs1>) FILTER(<{EX}obs1> = ?s) }}"
    assert parse_update(twice).operations[0].where_pins == (("s", NamedNode(f"{EX}obs1")),)
    assert {quad.subject.value for quad in engine.update(twice).removed} == {f"{EX}obs1"}
