"""The canonical-literal cache must hold nothing the cyclic garbage collector walks.

What it protects: the MQTT bench's p99 notification latency. Almost every sensor value, time and
sequence number is a new literal; when the cache held pyoxigraph terms (GC-tracked objects), it
filled with ~200k of them and every full collection walked them all while holding the GIL
(100-190 ms pauses every few seconds in the bench). The canonical forms themselves must not change.
"""

from __future__ import annotations

import gc

from pyoxigraph import Literal, NamedNode

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
