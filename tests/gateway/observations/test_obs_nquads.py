"""literal_quads: a quad made from its N-Quads line is the quad `Quad(...)` makes of the same terms.

What it protects: the observation batches and the MQTT delivery records make their quads with a
literal object from lines written with the terms' N-Triples forms (gateway.observations.nquads);
any literal a reading can carry (text with quotes, escapes, control and non-BMP characters,
doubles of any size, integers, booleans) must come back equal, in order.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pyoxigraph import Literal, NamedNode, Quad

from gateway.observations.nquads import integer_text, literal_quads
from gateway.observations.updates import finite_number

SUBJECT = NamedNode("urn:sepa-gateway:obs:0123456789abcdef01234567")
PREDICATE = NamedNode("http://w3id.org/sepa-gateway/ns#value")
GRAPH = NamedNode("http://w3id.org/sepa-gateway/graph/observations")
# the writers refuse lone surrogates before they make a literal
texts = st.text().filter(lambda text: not any(0xD800 <= ord(c) <= 0xDFFF for c in text))
values = st.one_of(
    texts,
    st.floats(allow_nan=False, allow_infinity=False).map(finite_number),
    st.integers(min_value=-(10**15), max_value=10**15).map(float),
    st.booleans(),
)


@given(st.lists(values, max_size=8))
def test_a_line_gives_the_quad_of_its_terms(objects: list[str | float | bool]) -> None:
    literals = [Literal(value) for value in objects]
    lines = [f"{SUBJECT} {PREDICATE} {literal} {GRAPH} .\n" for literal in literals]
    assert literal_quads(lines) == [Quad(SUBJECT, PREDICATE, literal, GRAPH) for literal in literals]


@given(st.integers(min_value=0, max_value=10**18))
def test_an_integer_text_is_the_integer_literal(number: int) -> None:
    (quad,) = literal_quads([f"{SUBJECT} {PREDICATE} {integer_text(number)} {GRAPH} .\n"])
    assert quad.object == Literal(number)
