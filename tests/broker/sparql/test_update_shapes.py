"""A request read through its cached shape is the request read in full, unquoted numbers included.

What it protects: every update a producer sends more than once with other constants (a sensor's
reading, a lamp's dimming value). Unquoted numbers are constants of the shape since they stopped
making each reading's update a new shape (3x the parse time); a number put in the wrong place, typed
wrongly, or put back wrongly in the WHERE text would change what the update does, silently.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import SparqlSyntaxError
from broker.sparql import update_parser
from broker.sparql.operations import ModifyOp
from broker.sparql.update_shapes import instantiate, split_shape

EX = "http://example.org/"

# Each template's {0}, {1} are numbers; the rest of the text holds digits a number must not be
# taken from: names, variables, blank node labels, language tags, IRIs, comments and LIMIT/OFFSET.
TEMPLATES = [
    "INSERT DATA {{ <urn:s1> <urn:p2> {0} , {1} }}",
    "PREFIX ex5: <http://example.org/5/> INSERT DATA {{ GRAPH ex5:g7 {{ ex5:lamp9 ex5:p1 {0} . _:b3 ex5:p2 {1} }} }}",
    'DELETE DATA {{ <urn:s> <urn:p> {0} . <urn:s> <urn:q> "3"@en-1 }}',
    "PREFIX ex: <http://example.org/> DELETE {{ ex:lamp12 ex:dim ?v1 }} INSERT {{ ex:lamp12 ex:dim {0} }} "
    "WHERE {{ OPTIONAL {{ ex:lamp12 ex:dim ?v1 }} }}",
    "INSERT {{ <urn:s> <urn:p> ?v }} WHERE {{ <urn:s> <urn:q> ?x2 FILTER(?x2 > {0}) BIND(?x2 * {1} AS ?v) }}",
    "INSERT {{ <urn:s> <urn:p> ?x }} WHERE {{ VALUES ?x {{ {0} {1} 7 }} }}  # comment 42",
    "INSERT {{ <urn:s> <urn:p> ?o }} WHERE {{ {{ SELECT ?o WHERE {{ <urn:s> <urn:q> ?o }} LIMIT 3 OFFSET 1 }} }}"
    " ; INSERT DATA {{ <urn:t> <urn:p> {0} }}",
    "INSERT {{ <urn:s> <urn:p> ?v }} WHERE {{ <urn:s> <urn:q> ?x FILTER(?x -{0} < {1}) BIND(?x - {1} AS ?v) }}",
    "WITH <urn:g> DELETE {{ ?s <urn:p> {0} }} INSERT {{ ?s <urn:p> {1} }} WHERE {{ ?s <urn:p> {0} }}",
    'INSERT DATA {{ <urn:s> <urn:p> {0}, "x-{1}", <urn:x-{1}> . <urn:s> <urn:q> "{0}"^^<{xsd}decimal> }}',
]

XSD = "http://www.w3.org/2001/XMLSchema#"

digits = st.text("0123456789", min_size=1, max_size=25)
numbers = st.one_of(
    st.builds(lambda s, d: s + d, st.sampled_from(["", "+", "-"]), digits),  # INTEGER, leading zeros too
    st.builds(lambda s, a, b: f"{s}{a}.{b}", st.sampled_from(["", "+", "-"]), digits | st.just(""), digits),
    st.builds(
        lambda m, e, x: f"{m}{e}{x}",
        st.sampled_from(["1", "1.", "1.5", ".5", "-2.25", "+0"]),
        st.sampled_from(["e", "E"]),
        st.sampled_from(["3", "+3", "-3", "07", "400"]),
    ),
)


def _shaped(text: str) -> update_parser.ParsedUpdate | None:
    split = split_shape(text)
    if split is None:
        return None
    shape, originals, constants = split
    try:
        plan = update_parser._parse(shape, None, None)
    except SparqlSyntaxError:
        return None  # the cache keeps "no plan" for this shape: its requests take the full parse
    return instantiate(plan, originals, constants)


def _without_simple_where(shaped: object, full: object) -> object:
    """`shaped` without its simple WHERE reading when the full reading has none: the simple reader
    takes only canonical numbers (it leaves "+0" to the query engine), and a placeholder is one.
    Both readings keep the same WHERE text, which decides; the simple reading is its shortcut."""
    if isinstance(shaped, ModifyOp) and isinstance(full, ModifyOp) and full.where_bgp is None:
        return replace(shaped, where_bgp=None, where_pins=(), where_optionals=(), where_values=None)
    return shaped


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(TEMPLATES), numbers, numbers)
def test_a_request_read_through_its_shape_is_the_request_read_in_full(template: str, a: str, b: str) -> None:
    text = template.format(a, b, xsd=XSD)
    try:
        full = update_parser._parse(text, None, None)
    except SparqlSyntaxError:
        return  # "-5" right after "?x " is one of them: both readings refuse it
    shaped = _shaped(text)
    if shaped is not None:
        pairs = zip(shaped.operations, full.operations, strict=True)
        assert [_without_simple_where(a, b) for a, b in pairs] == full.operations


def test_a_reading_s_update_keeps_its_shape_whatever_its_value() -> None:
    """The case it is for: one sensor's update, a new decimal each time, parsed in full twice (its
    first and second sighting) and from its shape after that."""
    update_parser._TEXTS.clear()
    update_parser._SHAPES.clear()
    update_parser._SEEN.clear()
    template = (
        f"PREFIX ex: <{EX}> DELETE {{ ex:boiler ex:temperature ?v }} INSERT {{ ex:boiler ex:temperature {{}} }} "
        "WHERE { OPTIONAL { ex:boiler ex:temperature ?v } }"
    )
    full_parses = 0
    real = update_parser._parse

    def counted(*args: object) -> update_parser.ParsedUpdate:
        nonlocal full_parses
        full_parses += 1
        return real(*args)  # type: ignore[arg-type]

    update_parser._parse = counted  # type: ignore[assignment]
    try:
        for value in ("21.5", "21.75", "-3.0", "+22.0", "023.125", "21.5"):
            (operation,) = update_parser.parse_update(template.replace("{}", value)).operations
            (quad,) = operation.insert_ground
            assert quad.object == real(template.replace("{}", value), None, None).operations[0].insert_ground[0].object
    finally:
        update_parser._parse = real  # type: ignore[assignment]
    # first sighting of the shape: the text in full; second: the shape, parsed once; then none
    # (the checks' own full parses are not counted: `real`)
    assert full_parses == 2


def test_numbers_inside_names_variables_labels_and_counts_stay_in_the_shape() -> None:
    text = (
        'PREFIX ex5: <urn:x5:> INSERT { ex5:a1 ex5:p2 ?v3 . _:b4 ex5:q "s"@en-6 } '
        "WHERE { { SELECT ?v3 WHERE { ?s7 ex5:p ?v3 } LIMIT 8 OFFSET 9 } }  # 10"
    )
    split = split_shape(text)
    assert split is not None
    shape, originals, _ = split
    assert originals == ['"s"']
    for kept in ("ex5:a1", "ex5:p2", "?v3", "_:b4", "@en-6", "?s7", "LIMIT 8", "OFFSET 9", "# 10"):
        assert kept in shape
