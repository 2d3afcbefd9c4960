"""The engine clock (seed 001 §II-C): SPARQL functions with one value for the whole of a request."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyoxigraph import Literal, NamedNode

from broker.core.clock import FUNCTIONS_NS, micros_to_datetime, rfc3339
from broker.core.engine import Engine
from broker.errors import SepaError
from broker.sparql.canonical import canonical

NOW = f"<{FUNCTIONS_NS}now>"
MICROS = f"<{FUNCTIONS_NS}nowMicros>"


def _values(engine: Engine, predicate: str) -> list[str]:
    rows = engine.query(f"SELECT ?v WHERE {{ <urn:s> <urn:{predicate}> ?v }}").rows
    return [row[0].value for row in rows]  # type: ignore[union-attr]


def test_one_value_for_a_whole_update_request() -> None:
    engine = Engine()
    before = time.time_ns() // 1000
    engine.update(
        f"INSERT {{ <urn:s> <urn:a> ?a ; <urn:b> ?b }} WHERE {{ BIND({MICROS}() AS ?a) BIND({MICROS}() AS ?b) }} ; "
        f"INSERT {{ <urn:s> <urn:c> ?c ; <urn:t> ?t }} WHERE {{ BIND({MICROS}() AS ?c) BIND({NOW}() AS ?t) }}"
    )
    after = time.time_ns() // 1000
    (a,), (b,), (c,), (t,) = (_values(engine, name) for name in ("a", "b", "c", "t"))
    assert a == b == c
    assert before <= int(a) <= after
    stamp = datetime.fromisoformat(t.replace("Z", "+00:00"))
    assert round(stamp.timestamp() * 1_000_000) == int(a)


def test_queries_read_the_clock_and_it_moves_between_requests() -> None:
    engine = Engine()
    first = engine.query(f"SELECT ({MICROS}() AS ?x) ({MICROS}() AS ?y) WHERE {{}}").rows[0]
    assert first[0] == first[1]
    time.sleep(0.002)
    second = engine.query(f"SELECT ({MICROS}() AS ?x) WHERE {{}}").rows[0]
    assert int(second[0].value) > int(first[0].value)  # type: ignore[union-attr]


def test_subscriptions_see_the_clock_of_the_update_that_triggers_them() -> None:
    engine = Engine()
    seen = []
    engine.subscribe(f"SELECT ?v ?now WHERE {{ <urn:s> <urn:v> ?v BIND({MICROS}() AS ?now) }}", seen.append)
    result = engine.update(f"INSERT {{ <urn:s> <urn:v> ?x }} WHERE {{ BIND({MICROS}() AS ?x) }}")
    (quad,) = result.added
    (row,) = seen[-1].added
    assert row[1] == quad.object  # re-evaluated within the update's request: the same instant


def test_a_failed_or_refused_update_leaves_the_clock_unpinned() -> None:
    """The engine pins the clock per update and must unpin it on every way out, errors included."""
    engine = Engine()
    for bad in ("INSERT DATA { <urn:s> <urn:p> ", "LOAD <http://example.org/nowhere>"):
        with pytest.raises(SepaError):
            engine.update(bad)
        first = engine.store.clock.micros()
        time.sleep(0.002)
        assert engine.store.clock.micros() > first


WHOLE_SECONDS = st.integers(0, 253_402_300_799).map(lambda seconds: seconds * 1_000_000)
FEW_DIGITS = st.tuples(st.integers(0, 253_402_300_799), st.sampled_from([0, 1, 10, 100_000, 120_000, 123_450])).map(
    lambda pair: pair[0] * 1_000_000 + pair[1]
)


@settings(max_examples=2000)
@given(st.integers(0, 253_402_300_799_999_999) | WHOLE_SECONDS | FEW_DIGITS)
def test_the_clocks_datetime_is_the_form_the_store_gives_back(micros: int) -> None:
    """micros_to_datetime writes the canonical form itself (no store round trip per instant):
    it must be what the store makes of the plain RFC 3339 text, trailing zeros and all."""
    asked = canonical(Literal(rfc3339(micros), datatype=NamedNode("http://www.w3.org/2001/XMLSchema#dateTime")))
    assert micros_to_datetime(micros) == asked
