"""The engine clock (seed 001 §II-C): SPARQL functions with one value for the whole of a request."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from broker.core.clock import FUNCTIONS_NS
from broker.core.engine import Engine
from broker.errors import SepaError

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
