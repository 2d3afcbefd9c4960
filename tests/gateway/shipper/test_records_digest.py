"""The records the shipper makes from a batch's digest against the records its quads give.

What it protects: an observation batch written as an Update syntax tree carries a digest
(gateway.observations.digest) that the engine hands to the observations graph's feed only when the
batch added every quad it inserts; the shipper then builds its records from the digest without
reading the quads. Over random batch sequences (numbers, integers, booleans, text, units or none,
repeated observation IRIs, consecutive batches moving the latest view), those records equal the
ones read from the quads, field for field; a batch that was not stored in full carries no digest.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.api import Engine, Notification, QuadRows
from gateway.observations import LATEST_QUERY, LatestCache, Reading, observation_quads
from gateway.observations.digest import ObservationDigest
from gateway.shipper.records import FEED_QUERY, assemble, assemble_feed
from tests.gateway.observations.batches import UNIT, reading, readings


class Side:
    """An engine fed batches the way the MQTT adapter writes them, with the shipper's feed on it."""

    def __init__(self) -> None:
        self.engine = Engine()
        self.latest = LatestCache()
        result = self.engine.query(LATEST_QUERY)
        self.latest.load(dict(zip(result.variables, row, strict=True)) for row in result.rows)
        self.seen: list[Notification] = []
        self.engine.subscribe(FEED_QUERY, self.seen.append)

    def write(self, batch: list[Reading]) -> QuadRows | None:
        """Store one batch; the feed's added rows it caused (None: it added no observation triple)."""
        prepared = observation_quads(batch, "gw", self.latest)
        assert prepared is not None
        before = len(self.seen)
        result = self.engine.update(prepared)
        self.latest.apply(result.added, result.removed)
        if len(self.seen) == before:
            return None
        rows = self.seen[-1].added
        assert isinstance(rows, QuadRows)
        return rows


def by_id(records: list[dict]) -> dict[str, dict]:
    return {record["id"]: record for record in records}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(readings, min_size=1, max_size=12), min_size=1, max_size=4))
def test_records_from_the_digest_are_the_records_from_the_quads(batches: list[list[Reading]]) -> None:
    side = Side()
    for batch in batches:
        rows = side.write(batch)
        if rows is None or rows.digest is None:
            continue
        from_digest = assemble(rows, "gw-1")
        from_quads = assemble_feed(rows, "gw-1")
        assert from_quads.incomplete == 0 and from_digest.incomplete == 0
        assert len(from_digest.records) == len(from_quads.records)
        assert by_id(from_digest.records) == by_id(from_quads.records)


def test_a_batch_stored_in_full_carries_its_digest_to_the_feed() -> None:
    side = Side()
    batch = [
        reading(1, 21.5, UNIT + "DEG_C", "a", "temperature"),
        reading(2, True, None, "b", "presence"),
        reading(3, "open", None, "c", "state"),
        reading(1, 7, None, "d", "humidity"),
    ]
    rows = side.write(batch)
    assert rows is not None and isinstance(rows.digest, ObservationDigest)
    assert rows.instant_us is not None
    records = assemble(rows, "gw-1").records
    assert len(records) == 4
    assert by_id(records) == by_id(assemble_feed(rows, "gw-1").records)


def test_a_batch_not_stored_in_full_carries_no_digest() -> None:
    """The same batch again: its observations are already stored (stable IRIs), so the delta lacks
    quads the request inserts, and the feed's rows are read from the quads alone."""
    side = Side()
    batch = [reading(1, 21.5, UNIT + "DEG_C", "a", "temperature"), reading(2, 3.0, None, "b", "temperature")]
    assert side.write(batch) is not None
    again = side.write(batch + [reading(3, 4.0, None, "c", "temperature")])
    assert again is not None and again.digest is None
    shipped = assemble(again, "gw-1")
    assert shipped.records == assemble_feed(again, "gw-1").records
    assert {record["sensor"] for record in shipped.records} >= {"urn:example:sensor3"}


def test_consecutive_batches_of_the_same_sensors_carry_their_digests() -> None:
    """The steady state: the latest view's fixed triples are stored already (so the request inserts
    quads that are not new), yet every observation triple is new, and the digest goes to the feed."""
    side = Side()
    for round_index in range(3):
        batch = [
            reading(sensor, 20.0 + round_index, UNIT + "DEG_C", f"r{round_index}", "temperature") for sensor in (1, 2)
        ]
        rows = side.write(batch)
        assert rows is not None and isinstance(rows.digest, ObservationDigest)
        records = assemble(rows, "gw-1").records
        assert [record["sequence"] for record in records] == [round_index + 1] * 2
        assert by_id(records) == by_id(assemble_feed(rows, "gw-1").records)
