"""Mappings from the config file and as RDF (the Topics Manager).

What it protects: the `[[mqtt.mappings]]` TOML shape, MappingErrors that name the entry, and the
round trip config -> RDF in the mappings graph -> MAPPINGS_QUERY rows -> the same Mappings, so a
mapping added or changed with SPARQL is what the adapter's Mapper gets.
"""

from __future__ import annotations

import tomllib

import pytest

from adapters.mqtt.profiles import default_profiles
from gateway.observations import (
    MAPPINGS_QUERY,
    Mapper,
    MappingError,
    PayloadError,
    mappings_from_config,
    mappings_from_rdf,
    mappings_update,
    payloads,
)
from tests.gateway.observations.conftest import Store

CONFIG = """
[[mqtt.mappings]]
id = "boiler"
topic = "plant/{room}/boiler"
extract = "json"
path = "sensors[0].value"
property = "temperature"
unit = "degF"
sensor = "urn:example:boiler/{room}"
feature = "urn:example:room/{room}"
time_path = "ts"

[[mqtt.mappings]]
id = "leak"
topic = "plant/{room}/leak"
extract = "boolean"
true_words = ["wet"]
false_words = ["dry"]
property = "gw:waterLeak"
sensor = "urn:example:leak/{room}"
order = -1

[[mqtt.mappings]]
id = "meter"
topic = "meters/{id}"
extract = "fields"
sensor = "urn:example:meter/{id}"
[[mqtt.mappings.fields]]
key = "P"
property = "power"
unit = "kW"
[[mqtt.mappings.fields]]
key = "E.total"
property = "energy"
"""


def test_config_shape() -> None:
    mappings = mappings_from_config(tomllib.loads(CONFIG)["mqtt"]["mappings"])
    assert [m.id for m in mappings] == ["boiler", "leak", "meter"]
    mapper = Mapper(mappings)
    (reading,) = mapper.readings("meters/7", b'{"P": 1.5}', 1)
    assert reading.unit == "http://qudt.org/vocab/unit/KiloW"
    assert mapper.readings("plant/attic/leak", b"dry", 1)[0].value is False


def test_a_source_time_more_than_a_day_ahead_of_the_gateway_is_refused_or_left_out_on_a_usual_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/adapters.md "Source times": the rule MQTT and CoAP share (both map through a Mapper).
    Before, any time up to the year 9999 was stored as the reading's own. The gateway's clock is
    synchronised here (the kernel's answer is set: this machine's may say either)."""
    monkeypatch.setattr(payloads, "synchronised_lately", lambda: True)
    mapper = Mapper([*mappings_from_config(tomllib.loads(CONFIG)["mqtt"]["mappings"]), *default_profiles()])
    now = 1_800_000_000_000_000  # the gateway's clock at the message's arrival, Unix µs
    day = 86_400
    taken = b'{"ts": %d, "sensors": [{"value": 70}]}' % (now // 1_000_000 + day)  # a day ahead: taken
    assert mapper.readings("plant/attic/boiler", taken, now)[0].source_time_us == now + day * 1_000_000
    with pytest.raises(PayloadError, match="after the gateway's clock"):  # time_path: required, so refused
        mapper.readings("plant/attic/boiler", b'{"ts": %d, "sensors": [{"value": 70}]}' % (now // 10**6 + day + 1), now)
    with pytest.raises(PayloadError, match="9999-12-31T23:59:59Z is .* s after the gateway's clock"):  # SenML `t`
        mapper.readings("senml/kitchen", b'[{"n": "temperature", "u": "Cel", "v": 21, "t": 253402300799}]', now)
    tasmota = b'{"Time": "2100-01-01T00:00:00", "SI7021": {"Temperature": 18.5}}'  # a usual key: left out
    assert [r.source_time_us for r in mapper.readings("tele/t/SENSOR", tasmota, now)] == [None]


def test_a_source_time_ahead_of_a_clock_the_kernel_says_is_unsynchronised_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A board with no real-time clock boots at its last shutdown's time, days behind, and with no
    NTP server in reach it stays there: refusing times a day ahead of it refused every reading of
    a sensor with a clock of its own (an MQTT reading is acknowledged: lost). While the kernel says
    the clock is unsynchronised, the sensor's time is taken."""
    monkeypatch.setattr(payloads, "synchronised_lately", lambda: False)
    mapper = Mapper([*mappings_from_config(tomllib.loads(CONFIG)["mqtt"]["mappings"]), *default_profiles()])
    behind = 1_800_000_000_000_000  # the board's clock, ten days behind the sensor's
    sensor_s = behind // 1_000_000 + 10 * 86_400
    pack = b'[{"n": "temperature", "u": "Cel", "v": 21, "t": %d}]' % sensor_s
    assert [r.source_time_us for r in mapper.readings("senml/kitchen", pack, behind)] == [sensor_s * 1_000_000]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"id": "x", "topic": "a", "extract": "number"}, r"mqtt.mappings\[0\] \(id 'x'\): 'sensor'"),
        ({"topic": "a", "extract": "number"}, "'id' is required"),
        ({"id": "x", "topic": "a/#/b", "extract": "ignore"}, "last level"),
        ({"id": "x", "topic": "a", "extract": "xml"}, "unknown extract 'xml'"),
        (
            {"id": "x", "topic": "a", "extract": "regex", "sensor": "urn:s", "property": "temperature", "pattern": "("},
            "pattern",
        ),
        (
            {
                "id": "x",
                "topic": "a",
                "extract": "regex",
                "sensor": "urn:s",
                "property": "temperature",
                "pattern": "[0-9]+",
            },
            "named group",
        ),
        ({"id": "x", "topic": "a", "extract": "json", "sensor": "urn:s", "property": "temperature"}, "'path'"),
        (
            {"id": "x", "topic": "a/{r}", "extract": "number", "sensor": "urn:s/{room}", "property": "temperature"},
            "{room}",
        ),
        (
            {"id": "x", "topic": "a", "extract": "number", "sensor": "not an iri", "property": "temperature"},
            "absolute IRI",
        ),
        ({"id": "x", "topic": "a", "extract": "number", "sensor": "urn:s", "property": "flux"}, "known property"),
        (
            {
                "id": "x",
                "topic": "a",
                "extract": "number",
                "sensor": "urn:s",
                "property": "temperature",
                "unit": "furlong",
            },
            "unit",
        ),
        ({"id": "x", "topic": "a", "extract": "number", "sensor": "urn:s>", "property": "temperature"}, "IRI"),
        ({"id": "x", "topic": "a", "extract": "number", "colour": "red"}, "unknown key"),
    ],  # fmt: skip
)
def test_config_errors_name_the_entry(entry: dict, message: str) -> None:
    with pytest.raises(MappingError, match=message):
        mappings_from_config([entry])


def test_duplicate_ids() -> None:
    entry = {"id": "x", "topic": "a", "extract": "ignore"}
    with pytest.raises(MappingError, match="used twice"):
        mappings_from_config([entry, entry])


def rows(store: Store) -> list[dict]:
    return store.rows(MAPPINGS_QUERY)


def test_rdf_round_trip_through_the_store() -> None:
    store = Store()
    mappings = [*mappings_from_config(tomllib.loads(CONFIG)["mqtt"]["mappings"]), *default_profiles()]
    store.engine.update(mappings_update(mappings))
    back = mappings_from_rdf(rows(store))
    assert sorted(back, key=lambda m: m.id) == sorted(mappings, key=lambda m: m.id)
    assert Mapper(back).subscriptions() == Mapper(mappings).subscriptions()
    store.engine.update(mappings_update(mappings))  # rewriting is idempotent
    assert sorted(mappings_from_rdf(rows(store)), key=lambda m: m.id) == sorted(mappings, key=lambda m: m.id)


def test_topics_manager_edits_with_sparql() -> None:
    store = Store()
    store.engine.update(mappings_update(default_profiles()))
    store.engine.update(
        """PREFIX gw: <http://w3id.org/sepa-gateway/ns#>
        INSERT DATA { GRAPH <http://w3id.org/sepa-gateway/graph/mappings> {
          <urn:sepa-gateway:mapping:pepoli> a gw:TopicMapping ; gw:mappingId "pepoli" ;
            gw:topicFilter "pepoli/6lowpan/network/{node}/Temperature" ; gw:extract "number" ;
            gw:sensorTemplate "urn:arces:pepoli/{node}" ; gw:propertyTemplate "temperature" ; gw:order -5 .
          <urn:sepa-gateway:mapping:broken> a gw:TopicMapping ; gw:mappingId "broken" ;
            gw:topicFilter "x/#/y" ; gw:extract "ignore" .
        } }"""
    )
    errors: list[MappingError] = []
    mapper = Mapper(mappings_from_rdf(rows(store), errors))
    assert len(errors) == 1 and "broken" in str(errors[0]) and "last level" in str(errors[0])
    (reading,) = mapper.readings("pepoli/6lowpan/network/NODO1/Temperature", b"23.4", 1)
    assert reading.sensor == "urn:arces:pepoli/NODO1"
    with pytest.raises(MappingError, match="broken"):
        mappings_from_rdf(rows(store))
    store.engine.update(
        """DELETE WHERE { GRAPH <http://w3id.org/sepa-gateway/graph/mappings> {
          <urn:sepa-gateway:mapping:zigbee2mqtt> ?p ?o } }"""
    )
    remaining = {m.id for m in mappings_from_rdf(rows(store), [])}
    assert "zigbee2mqtt" not in remaining and "pepoli" in remaining


def test_one_id_on_two_nodes_stops_those_mappings_and_no_other() -> None:
    """Any client that may write the mappings graph could give a second node an existing id: the
    Mapper refused the whole set, and the adapters ignored every later change of the graph."""
    store = Store()
    store.engine.update(mappings_update(default_profiles()))
    twice = """PREFIX gw: <http://w3id.org/sepa-gateway/ns#>
        INSERT DATA { GRAPH <http://w3id.org/sepa-gateway/graph/mappings> {
          <urn:sepa-gateway:mapping:a> a gw:TopicMapping ; gw:mappingId "twin" ;
            gw:topicFilter "a/{node}/t" ; gw:extract "number" ; gw:sensorTemplate "urn:a:{node}" ;
            gw:propertyTemplate "temperature" .
          <urn:sepa-gateway:mapping:b> a gw:TopicMapping ; gw:mappingId "twin" ;
            gw:topicFilter "b/{node}/t" ; gw:extract "number" ; gw:sensorTemplate "urn:b:{node}" ;
            gw:propertyTemplate "temperature" .
          <urn:sepa-gateway:mapping:c> a gw:TopicMapping ; gw:mappingId "later" ;
            gw:topicFilter "c/{node}/t" ; gw:extract "number" ; gw:sensorTemplate "urn:c:{node}" ;
            gw:propertyTemplate "temperature" .
        } }"""
    store.engine.update(twice)
    errors: list[MappingError] = []
    mapper = Mapper(mappings_from_rdf(rows(store), errors))  # the Mapper takes the rest
    assert [str(error) for error in errors] == ["mapping id 'twin' is on 2 mapping nodes: none of them is used"]
    assert mapper.readings("c/n1/t", b"1.5", 1)[0].sensor == "urn:c:n1"
    assert mapper.match("a/n1/t") is None and mapper.match("b/n1/t") is None
    with pytest.raises(MappingError, match="twin"):
        mappings_from_rdf(rows(store))


def test_two_values_for_one_term_are_an_error() -> None:
    store = Store()
    store.engine.update(mappings_update(default_profiles()[-1:]))
    store.engine.update(
        """INSERT DATA { GRAPH <http://w3id.org/sepa-gateway/graph/mappings> {
          <urn:sepa-gateway:mapping:gateway-generic> <http://w3id.org/sepa-gateway/ns#extract> "json" } }"""
    )
    with pytest.raises(MappingError, match="2 values for gw:extract"):
        mappings_from_rdf(rows(store))
