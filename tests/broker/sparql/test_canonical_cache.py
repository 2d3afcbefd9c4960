"""The canonical-literal cache must hold nothing the cyclic garbage collector walks.

What it protects: the MQTT bench's p99 notification latency. Almost every sensor value, time and
sequence number is a new literal; when the cache held pyoxigraph terms (GC-tracked objects), it
filled with ~200k of them and every full collection walked them all while holding the GIL
(100-190 ms pauses every few seconds in the bench). The canonical forms themselves must not change.
"""

from __future__ import annotations

import gc

from hypothesis import given, settings
from hypothesis import strategies as st
from pyoxigraph import Literal, NamedNode, Quad, Store

from broker.sparql.canonical import XSD, canonical


def test_canonical_forms() -> None:
    integer = Literal("1", datatype=NamedNode(XSD + "integer"))
    assert canonical(Literal("01", datatype=NamedNode(XSD + "int"))) == integer
    assert canonical(Literal("PT60S", datatype=NamedNode(XSD + "dayTimeDuration"))) == Literal(
        "PT1M", datatype=NamedNode(XSD + "dayTimeDuration")
    )
    unchanged = Literal("21.5", datatype=NamedNode(XSD + "decimal"))
    assert canonical(unchanged) is unchanged
    text = Literal("01")
    assert canonical(text) is text  # xsd:string is stored as written


def test_the_cache_adds_no_tracked_objects() -> None:
    gc.collect()
    before = len(gc.get_objects())
    for i in range(5000):
        canonical(Literal(f"{i}.50e0", datatype=NamedNode(XSD + "double")))
        canonical(Literal(f"0{i}", datatype=NamedNode(XSD + "integer")))
    gc.collect()
    assert len(gc.get_objects()) - before < 1000  # was ~3 tracked objects per distinct literal: 30,000


INTEGER_TEXTS = st.integers(-(10**20), 10**20).map(str) | st.from_regex(r"[+-]?0*[0-9]{1,20}", fullmatch=True)


@settings(max_examples=1000)
@given(INTEGER_TEXTS)
def test_integers_are_given_back_as_the_store_gives_them(text: str) -> None:
    """The xsd:integer shortcut (no store round trip for a canonical one) agrees with the store,
    for canonical and non-canonical texts alike (signs, leading zeros, beyond 64 bits)."""
    literal = Literal(text, datatype=NamedNode(XSD + "integer"))
    scratch = Store()
    scratch.add(Quad(NamedNode("urn:s"), NamedNode("urn:p"), literal))
    (stored,) = scratch.quads_for_pattern(None, None, None, None)
    assert canonical(literal) == stored.object
