"""Observations graph feed rows -> the cloud's flat records, from real observation updates."""

from __future__ import annotations

import json

import pytest
from pyoxigraph import Literal, NamedNode

from broker.api import Engine, Notification, QuadRows, rfc3339
from gateway.observations.latest import LatestCache
from gateway.observations.reading import Reading
from gateway.observations.updates import observation_update
from gateway.observations.vocabulary import GRAPH_OBSERVATIONS, GW, QUDT, SOSA
from gateway.shipper.records import FEED_QUERY, assemble, json_line, key_of, rfc3339_micros

TEMPERATURE = "http://qudt.org/vocab/quantitykind/Temperature"
PRESENCE = "http://w3id.org/sepa-gateway/ns#presence"
DEG_C = "http://qudt.org/vocab/unit/DEG_C"
XSD = "http://www.w3.org/2001/XMLSchema#"
XSD_DATETIME, XSD_INTEGER, XSD_DOUBLE = XSD + "dateTime", XSD + "integer", XSD + "double"


def feed_rows(readings: list[Reading]) -> tuple:
    engine = Engine()
    seen: list[Notification] = []
    engine.subscribe(FEED_QUERY, seen.append)
    engine.update(observation_update(readings, "gw", LatestCache()))
    return seen[-1].added


def test_numeric_boolean_and_timestamped_readings_become_complete_records() -> None:
    readings = [
        Reading("urn:s:1", TEMPERATURE, "urn:room:1", 21.5, DEG_C, "zigbee2mqtt/kitchen", None, "a"),
        Reading("urn:s:2", PRESENCE, "urn:room:1", True, None, "zigbee2mqtt/hall", 1_795_000_000_123_000, "b"),
    ]
    records = {record["sensor"]: record for record in assemble(feed_rows(readings), "gw-1").records}
    numeric, boolean = records["urn:s:1"], records["urn:s:2"]
    assert numeric["value"] == 21.5 and numeric["literal"] is None and numeric["unit"] == DEG_C
    assert numeric["property"] == TEMPERATURE and numeric["feature"] == "urn:room:1" and numeric["sequence"] == 1
    assert numeric["source"] == "zigbee2mqtt/kitchen" and numeric["gateway"] == "gw-1"
    assert numeric["source_time"] is None and numeric["id"].startswith("urn:sepa-gateway:obs:")
    assert len(numeric["result_time"]) == len("2026-11-22T18:30:00.000000Z") and numeric["result_time"].endswith("Z")
    assert boolean["value"] is None and boolean["literal"] == "true" and boolean["unit"] is None
    assert boolean["source_time"] == rfc3339(1_795_000_000_123_000)
    assert set(numeric) == {
        "id", "sensor", "property", "feature", "value", "literal", "unit",
        "result_time", "source_time", "sequence", "gateway", "source",
    }  # fmt: skip
    assert json.loads(json_line(numeric)) == numeric and json_line(numeric).endswith(b"\n")
    assert key_of(numeric) == f"urn:s:1 {TEMPERATURE}"


def test_incomplete_or_unshippable_observations_are_counted_not_shipped() -> None:
    rows = list(feed_rows([Reading("urn:s:1", TEMPERATURE, "urn:f", 1.0, DEG_C, "t", None, "a")]))
    without_sensor = [row for row in rows if row[1].value != "http://www.w3.org/ns/sosa/madeBySensor"]
    assembled = assemble(without_sensor, "gw")
    assert assembled.records == [] and assembled.incomplete == 1
    double = NamedNode("http://www.w3.org/2001/XMLSchema#double")
    nan = [(s, p, Literal("NaN", datatype=double) if p.value.endswith("numericValue") else o) for s, p, o in rows]
    assembled = assemble(nan, "gw")
    assert assembled.records == [] and assembled.incomplete == 1
    assert (
        assemble([(NamedNode("urn:x"), NamedNode("urn:p"), Literal("1"))], "gw").incomplete == 0
    )  # not an observation


def test_times_are_normalised_to_six_fraction_digits_in_utc() -> None:
    assert rfc3339_micros("2026-11-22T18:30:00.5Z") == "2026-11-22T18:30:00.500000Z"
    assert rfc3339_micros("2026-11-22T19:30:00+01:00") == "2026-11-22T18:30:00.000000Z"


def test_the_feeds_quads_and_plain_rows_give_the_same_records() -> None:
    """The in-process feed's lazy rows take the one-pass path; rows of terms (the network) the other."""
    readings = [
        Reading(f"urn:s:{k}", TEMPERATURE, "urn:room:1", k + 0.5, DEG_C, f"t/{k}", None, str(k)) for k in range(20)
    ]
    added = feed_rows(readings)
    assert isinstance(added, QuadRows)
    fast, plain = assemble(added, "gw").records, assemble(tuple(added), "gw").records
    assert len(fast) == 20 and sorted(fast, key=key_of) == sorted(plain, key=key_of)


def test_triples_of_other_graphs_never_join_an_observation() -> None:
    """A quad in another graph with the observation as subject is not the observation's."""
    engine = Engine()
    seen: list[Notification] = []
    engine.subscribe(FEED_QUERY, seen.append)
    reading = Reading("urn:s:1", TEMPERATURE, "urn:room:1", 21.5, DEG_C, "t", None, "a")
    engine.update(observation_update([reading], "gw", LatestCache()))
    obs = assemble(seen[-1].added, "gw").records[0]["id"]
    engine.update(
        f"DELETE DATA {{ GRAPH <{GRAPH_OBSERVATIONS}> {{ <{obs}> <{SOSA}madeBySensor> <urn:s:1> }} }} ; "
        f"INSERT DATA {{ GRAPH <urn:other> {{ <{obs}> <{SOSA}madeBySensor> <urn:s:other> ; a <{SOSA}Observation> }} "
        f"GRAPH <{GRAPH_OBSERVATIONS}> {{ <urn:obs:2> a <{SOSA}Observation> ; <{SOSA}madeBySensor> <urn:s:2> }} }}"
    )
    added = seen[-1].added
    assert isinstance(added, QuadRows) and len(added.source) == 4 and len(added) == 2
    assembled = assemble(added, "gw")
    assert assembled.records == [] and assembled.incomplete == 1  # urn:obs:2 lacks most terms; obs is not new


@pytest.mark.parametrize("value", [21.5, -0.0, 1e16, 1.5e-7, 123456789.123, None])
def test_json_lines_are_the_bytes_json_dumps_gives(value: float | None) -> None:
    """json_line writes the line by hand for speed: it must stay byte for byte the compact json.dumps form."""
    record = {
        "id": "urn:obs:1",
        "sensor": 'urn:s:"quoted"\\back',
        "property": "urn:p:température",
        "feature": "urn:f:\u2028",
        "value": value,
        "literal": None if value is not None else "on\toff\n\x01",
        "unit": None if value is None else DEG_C,
        "result_time": "2026-11-22T18:30:00.123456Z",
        "source_time": None if value else "2026-11-22T18:30:00.000000Z",
        "sequence": 2**63 - 1,
        "gateway": "gw-ü",
        "source": "zigbee2mqtt/💡",
    }
    expected = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    assert json_line(record) == expected


def _client_observation(subject: str, result_time: str = "2026-11-22T18:30:00Z", sequence: str = "1") -> str:
    """An observation as a client may write it into the observations graph, in Turtle-like SPARQL."""
    return (
        f"{subject} a <{SOSA}Observation> ; <{SOSA}madeBySensor> <urn:s:c> ; <{SOSA}observedProperty> <{TEMPERATURE}> ;"
        f' <{SOSA}hasFeatureOfInterest> <urn:f> ; <{SOSA}resultTime> "{result_time}"^^<{XSD_DATETIME}> ;'
        f' <{GW}sequenceNumber> "{sequence}"^^<{XSD_INTEGER}> ; <{GW}hasMqttTopic> "t" ;'
        f' <{SOSA}hasResult> [ <{QUDT}numericValue> "1.5"^^<{XSD_DOUBLE}> ] .'
    )


@pytest.mark.parametrize(
    ("subject", "result_time", "sequence"),
    [
        ("<urn:obs:bad>", "0001-01-01T00:00:00+01:00", "1"),  # UTC falls in year 0: OverflowError lost the update
        ("<urn:obs:bad>", "9999-12-31T23:30:00-01:00", "1"),  # and year 10000
        ("_:bad", "2026-11-22T18:30:00Z", "1"),  # a blank node: the landing refuses a non-IRI id
        ("<urn:obs:bad>", "2026-11-22T18:30:00Z", "0"),  # sequences count from 1
        ("<urn:obs:bad>", "2026-11-22T18:30:00Z", str(2**63)),  # past Spark's LongType
    ],
)
def test_an_observation_the_landing_would_refuse_is_counted_and_the_others_of_its_update_ship(
    subject: str, result_time: str, sequence: str
) -> None:
    """Clients write the observations graph too: one bad observation used to stop every record of its
    notification (an OverflowError) or get its whole segment refused by the landing."""
    engine = Engine()
    seen: list[Notification] = []
    engine.subscribe(FEED_QUERY, seen.append)
    good, bad = _client_observation("<urn:obs:good>", sequence="7"), _client_observation(subject, result_time, sequence)
    engine.update(f"INSERT DATA {{ GRAPH <{GRAPH_OBSERVATIONS}> {{ {good} {bad} }} }}")
    assembled = assemble(seen[-1].added, "gw")
    assert [record["id"] for record in assembled.records] == ["urn:obs:good"]
    assert assembled.incomplete == 1
