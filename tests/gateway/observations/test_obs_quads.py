"""observation_quads (the update as the engine's objects) against observation_update (its text).

What it protects: for any batch the update syntax tree takes, the engine computes exactly the delta
the text gives (same quads added and removed, same latest view, same sequence numbers), over
consecutive batches that move the latest view; its `sparql()` is the text as it was when the
update was made (later commits do not change it); it returns None for batches that need the
WHERE clause; it refuses what the text refuses; and the literal it builds for a float is the one
the store keeps (no round trip needed).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyoxigraph import Literal, NamedNode

from broker.api import Engine, EngineClock, canonical
from gateway.observations import (
    LATEST_QUERY,
    LatestCache,
    PayloadError,
    Reading,
    observation_quads,
    observation_update,
)
from gateway.observations.quads import stored_query, stored_terms
from tests.gateway.observations.batches import UNIT, reading, readings, values

XSD_DOUBLE = NamedNode("http://www.w3.org/2001/XMLSchema#double")
FIXED_NS = 1_795_000_000_123_456_000


class Side:
    """An engine with a fixed clock and the adapter's latest mirror."""

    def __init__(self) -> None:
        self.engine = Engine()
        self.engine.store.clock = EngineClock(lambda: FIXED_NS)
        self.latest = LatestCache()
        result = self.engine.query(LATEST_QUERY)
        self.latest.load(dict(zip(result.variables, row, strict=True)) for row in result.rows)

    def run(self, request: object) -> tuple[frozenset, frozenset]:
        result = self.engine.update(request)  # type: ignore[arg-type]
        self.latest.apply(result.added, result.removed)
        return result.added, result.removed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(readings, min_size=1, max_size=12), min_size=1, max_size=4))
def test_same_delta_as_the_text(batches: list[list[Reading]]) -> None:
    text_side, quads_side, printed_side = Side(), Side(), Side()
    for batch in batches:
        text = observation_update(batch, "gw", text_side.latest)
        tree = observation_quads(batch, "gw", quads_side.latest)
        assert tree is not None
        delta = text_side.run(text)
        assert quads_side.run(tree) == delta
        assert printed_side.run(tree.to_sparql()) == delta  # the tree's printout says the same
    assert text_side.engine.store.quads() == quads_side.engine.store.quads() == printed_side.engine.store.quads()


# Two sensors whose readings change feature, unit and mapping from one reading to the next: the
# quads a latest node gets every time are cached per node (quads._node_quads) and must follow.
moving = st.builds(
    lambda sensor, value, unit, key, room, mapping: dataclasses.replace(
        reading(sensor, value, unit, key), feature=f"urn:example:room{room}", mapping=mapping
    ),
    st.integers(0, 1),
    values,
    st.sampled_from([None, UNIT + "DEG_C", UNIT + "PERCENT"]),
    st.sampled_from(["k1", "k2", "k3"]),
    st.integers(0, 2),
    st.sampled_from(["", "m1", "m2"]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(moving, min_size=1, max_size=6), min_size=2, max_size=5))
def test_a_node_whose_feature_unit_or_mapping_changes_gets_the_delta_of_the_text(batches: list[list[Reading]]) -> None:
    text_side, quads_side = Side(), Side()
    for batch in batches:
        delta = text_side.run(observation_update(batch, "gw", text_side.latest))
        tree = observation_quads(batch, "gw", quads_side.latest)
        assert tree is not None
        assert quads_side.run(tree) == delta
    assert text_side.engine.store.quads() == quads_side.engine.store.quads()


def timestamped(reading: Reading, second: int) -> Reading:
    return dataclasses.replace(reading, source_time_us=1_700_000_000_000_000 + second * 1_000_000)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(st.tuples(readings, st.integers(0, 5), st.booleans()), min_size=1, max_size=12), min_size=1, max_size=4
    )
)
def test_timestamped_batches_give_the_delta_of_the_text(batches: list[list[tuple[Reading, int, bool]]]) -> None:
    """Source times from a small set, so batches send observations again (an MQTT redelivery): a
    stored one keeps its first resultTime and sequence number, found by `stored_query` instead of
    the text's OPTIONAL per reading. The clocks differ per batch, so a kept time shows."""
    text_side, quads_side = Side(), Side()
    for number, batch in enumerate(batches):
        for side in (text_side, quads_side):
            side.engine.store.clock = EngineClock(lambda number=number: FIXED_NS + number * 1_000_000_000)
        chosen = [timestamped(item, second) if timed else item for item, second, timed in batch]
        text = observation_update(chosen, "gw", text_side.latest)
        query = stored_query(chosen, "gw")
        stored = None
        if query is not None:
            result = quads_side.engine.query(query)
            stored = stored_terms(dict(zip(result.variables, row, strict=True)) for row in result.rows)
        tree = observation_quads(chosen, "gw", quads_side.latest, stored=stored)
        assert tree is not None
        assert (tree.digest is None) == (query is not None)  # the digest has no source time
        assert quads_side.run(tree) == text_side.run(text)
    assert text_side.engine.store.quads() == quads_side.engine.store.quads()


def test_batches_that_need_the_where_clause_are_left_to_the_text() -> None:
    side = Side()
    timestamped = Reading("urn:example:s", "urn:example:p", "urn:example:f", 1.0, None, "t", 1_700_000_000_000_000, "k")
    assert observation_quads([timestamped], "gw", side.latest) is None  # without what is stored of it
    assert observation_quads([reading(1, 2.0, None, "k")], "gw", LatestCache()) is None  # no mirror loaded


@pytest.mark.parametrize("value", [math.nan, math.inf, 10**400])
def test_refuses_what_the_text_refuses(value: float | int) -> None:
    bad = reading(1, value, None, "k")
    with pytest.raises(PayloadError):
        observation_update([bad], "gw", Side().latest)
    with pytest.raises(PayloadError):
        observation_quads([bad], "gw", Side().latest)


def test_refuses_an_invalid_iri_and_a_lone_surrogate() -> None:
    latest = Side().latest
    with pytest.raises(PayloadError):
        observation_quads([Reading("not an iri", "urn:p", "urn:f", 1.0, None, "t", None, "k")], "gw", latest)
    with pytest.raises(PayloadError):
        observation_quads([reading(1, "\ud800", None, "k")], "gw", latest)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_literal_is_the_stored_form(number: float) -> None:
    text = repr(number)
    written = Literal(text if "e" in text else text + "e0", datatype=XSD_DOUBLE)
    assert canonical(written) == Literal(number)
