"""Observation updates run through the real engine, checked by SPARQL on the store.

What it protects: the exact SOSA/QUDT triples of numeric and boolean observations, the acceptance
example (zigbee2mqtt/kitchen -> 21.5 unit:DEG_C), one latest value per (sensor, property) after
batches with repeats (with the latest mirror and with OPTIONAL fallback), stable observation IRIs,
idempotent redelivery of timestamped readings, and that no topic or payload text can change the
structure of an update (hypothesis).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.mqtt.profiles import default_profiles
from gateway.observations import (
    Mapper,
    PayloadError,
    Reading,
    latest_iri,
    nodes_query,
    observation_iri,
    observation_update,
)
from tests.gateway.observations.conftest import LATEST, OBS, Store

GW = "http://w3id.org/sepa-gateway/ns#"
ARRIVAL = 1_800_000_000_000_000  # 2027-01-15: the payloads' times (2026) are in its past, as a sensor's are
UNIT = "http://qudt.org/vocab/unit/"
Read = Callable[..., list[Reading]]


def test_acceptance_zigbee2mqtt_kitchen(store: Store, read: Read) -> None:
    store.write(read("zigbee2mqtt/kitchen", '{"temperature": 21.5}'))
    rows = store.values(
        f"""SELECT ?obs ?sensor ?foi ?time ?topic WHERE {{ GRAPH {OBS} {{
          ?obs a sosa:Observation ; sosa:madeBySensor ?sensor ; sosa:observedProperty gw:temperature ;
               sosa:hasFeatureOfInterest ?foi ; sosa:resultTime ?time ; gw:hasMqttTopic ?topic ;
               sosa:hasResult ?r .
          ?r a qudt:QuantityValue ; qudt:numericValue ?v ; qudt:unit unit:DEG_C . FILTER(?v = 21.5) }} }}"""
    )
    assert len(rows) == 1
    row = rows[0]
    assert row["sensor"] == "urn:sepa-gateway:sensor:zigbee2mqtt/kitchen"
    assert row["foi"] == "urn:sepa-gateway:feature:zigbee2mqtt/kitchen"
    assert row["topic"] == "zigbee2mqtt/kitchen"
    assert row["obs"].startswith("urn:sepa-gateway:obs:") and len(row["obs"]) == len("urn:sepa-gateway:obs:") + 24


def test_exact_triples(store: Store, read: Read) -> None:
    readings = read("zigbee2mqtt/hall", '{"temperature": 19, "occupancy": false}')
    store.write(readings)
    temperature, occupancy = (observation_iri("gw-test", r) for r in readings)
    triples = {
        (row["s"].value, row["p"].value.rsplit("/", 1)[-1].rsplit("#", 1)[-1], str(row["o"]))
        for row in store.rows(f"SELECT ?s ?p ?o WHERE {{ GRAPH {OBS} {{ ?s ?p ?o }} }}")
    }
    time = next(o for s, p, o in triples if p == "resultTime")
    sensor, foi = "<urn:sepa-gateway:sensor:zigbee2mqtt/hall>", "<urn:sepa-gateway:feature:zigbee2mqtt/hall>"
    double = "^^<http://www.w3.org/2001/XMLSchema#"
    expected = set()
    for obs, prop, seq in ((temperature, "temperature", 1), (occupancy, "occupancy", 1)):
        expected |= {
            (obs, "22-rdf-syntax-ns#type"[-4:], "<http://www.w3.org/ns/sosa/Observation>"),
            (obs, "madeBySensor", sensor),
            (obs, "observedProperty", f"<{GW}{prop}>"),
            (obs, "hasFeatureOfInterest", foi),
            (obs, "resultTime", time),
            (obs, "sequenceNumber", f'"{seq}"{double}integer>'),
            (obs, "hasMqttTopic", '"zigbee2mqtt/hall"'),
        }
    expected |= {
        (temperature, "hasResult", f"<{temperature}/result>"),
        (temperature + "/result", "type", "<http://qudt.org/schema/qudt/QuantityValue>"),
        (temperature + "/result", "numericValue", f'"19"{double}double>'),
        (temperature + "/result", "unit", f"<{UNIT}DEG_C>"),
        (occupancy, "hasSimpleResult", f'"false"{double}boolean>'),
    }
    expected = {(s, "type" if p.endswith("type") else p, o) for s, p, o in expected}
    assert triples == expected


def latest_table(store: Store) -> dict[tuple[str, str], dict[str, list[str]]]:
    table: dict[tuple[str, str], dict[str, list[str]]] = {}
    for row in store.rows(
        f"SELECT ?l ?s ?p ?pred ?o WHERE {{ GRAPH {LATEST} {{ ?l <{GW}sensor> ?s ; <{GW}property> ?p ; ?pred ?o }} }}"
    ):
        key = (row["s"].value.rsplit("/", 1)[-1], row["p"].value.removeprefix(GW))
        table.setdefault(key, {}).setdefault(row["pred"].value.rsplit("#", 1)[-1], []).append(row["o"].value)
    return table


def test_latest_has_one_value_per_sensor_and_property(store: Store, read: Read) -> None:
    batch = []
    for value in (20.0, 21.0, 22.0):
        batch += read("zigbee2mqtt/a", f'{{"temperature": {value}, "humidity": {value + 20}}}')
    batch += read("zigbee2mqtt/b", '{"temperature": 5}')
    store.write(batch)
    store.write(
        read("zigbee2mqtt/a", '{"temperature": 23, "occupancy": true}') + read("zigbee2mqtt/a", '{"temperature": 24}')
    )
    store.write(read("zigbee2mqtt/a", '{"temperature": 24, "occupancy": false}'))  # same value again
    table = latest_table(store)
    assert set(table) == {("a", "temperature"), ("a", "relativeHumidity"), ("a", "occupancy"), ("b", "temperature")}
    for predicates in table.values():
        assert all(len(values) == 1 for values in predicates.values()), predicates
    assert table[("a", "temperature")]["value"] == ["24"]
    assert table[("a", "temperature")]["sequenceNumber"] == ["6"]
    assert table[("a", "relativeHumidity")]["value"] == ["42"]
    assert table[("a", "occupancy")]["value"] == ["false"] and "unit" not in table[("a", "occupancy")]
    assert table[("b", "temperature")]["unit"] == [UNIT + "DEG_C"]
    last = store.values(f"SELECT ?o WHERE {{ GRAPH {LATEST} {{ ?l gw:value 24e0 ; gw:observation ?o }} }}")
    assert store.values(
        f"SELECT ?v WHERE {{ GRAPH {OBS} {{ <{last[0]['o']}> sosa:hasResult/qudt:numericValue ?v }} }}"
    ) == [{"v": "24"}]
    assert len(store.values(f"SELECT ?o WHERE {{ GRAPH {OBS} {{ ?o a sosa:Observation }} }}")) == 12


def test_latest_switches_between_number_and_boolean(store: Store) -> None:
    def reading(value: object, key: str) -> Reading:
        unit = None if isinstance(value, bool | str) else UNIT + "PERCENT"
        return Reading("urn:s:x", GW + "dimmingLevel", "urn:f:x", value, unit, "t", None, key)  # type: ignore[arg-type]

    store.write([reading(40.0, "1")])
    store.write([reading(True, "2")])
    store.write([reading("broken", "3")])
    assert latest_table(store)[("urn:s:x", "dimmingLevel")]["value"] == ["broken"]
    assert "unit" not in latest_table(store)[("urn:s:x", "dimmingLevel")]


def test_observation_iris_are_stable() -> None:
    reading = Reading("urn:s:1", GW + "temperature", "urn:f:1", 1.0, None, "t", None, "t|1|0")
    timed = Reading("urn:s:1", GW + "temperature", "urn:f:1", 2.0, None, "t", 1_700_000_000_000_000, "t|9|0")
    assert observation_iri("gw", reading) == observation_iri("gw", reading)
    assert observation_iri("gw", reading) != observation_iri("gw2", reading)
    redelivered = Reading("urn:s:1", GW + "temperature", "urn:f:1", 2.0, None, "t", 1_700_000_000_000_000, "t|10|0")
    assert observation_iri("gw", timed) == observation_iri("gw", redelivered)  # the source time is the key
    digest = hashlib.sha256(f"gw|urn:s:1|{GW}temperature|1700000000000000|float:2.0".encode()).hexdigest()[:24]
    assert observation_iri("gw", timed) == "urn:sepa-gateway:obs:" + digest
    # another value under the same source time (a clock that stands still) is another observation
    frozen = Reading("urn:s:1", GW + "temperature", "urn:f:1", 2.5, None, "t", 1_700_000_000_000_000, "t|11|0")
    assert observation_iri("gw", frozen) != observation_iri("gw", timed)


def test_redelivered_timestamped_reading_changes_nothing(store: Store, mapper: Mapper) -> None:
    payload = b'{"Time": "2026-11-22T10:00:00Z", "SI7021": {"Temperature": 18.5}}'
    first = mapper.readings("tele/t/SENSOR", payload, ARRIVAL)
    store.write(first)
    before = store.rows(f"SELECT ?s ?p ?o WHERE {{ GRAPH {OBS} {{ ?s ?p ?o }} }}")
    store.write(mapper.readings("tele/t/SENSOR", payload, ARRIVAL + 1))  # an MQTT redelivery, later
    after = store.rows(f"SELECT ?s ?p ?o WHERE {{ GRAPH {OBS} {{ ?s ?p ?o }} }}")
    assert sorted(map(str, after)) == sorted(map(str, before))
    assert store.values(f"SELECT ?t WHERE {{ GRAPH {OBS} {{ ?o gw:sourceTime ?t }} }}") == [
        {"t": "2026-11-22T10:00:00Z"}
    ]


def test_two_values_under_one_source_time_are_two_observations(store: Store, mapper: Mapper) -> None:
    """A clock that stands still: before, the second value was written onto the first observation."""
    for index, value in enumerate((18.5, 19.5)):
        payload = b'{"Time": "2026-11-22T10:00:00Z", "SI7021": {"Temperature": %.1f}}' % value
        store.write(mapper.readings("tele/t/SENSOR", payload, ARRIVAL + index))
    rows = store.values(f"SELECT ?o ?v WHERE {{ GRAPH {OBS} {{ ?o sosa:hasResult ?r . ?r qudt:numericValue ?v }} }}")
    assert len(rows) == 2 and len({row["o"] for row in rows}) == 2, rows
    assert sorted(float(row["v"]) for row in rows) == [18.5, 19.5]


def test_many_distinct_sensors_in_one_batch_without_mirror() -> None:
    store = Store(mirror=False)
    mapper = Mapper(default_profiles())
    readings = [r for i in range(500) for r in mapper.readings(f"gateway/s{i}/temperature", b"20", i)]
    store.write(readings)
    store.write(readings[:1] + [r for i in range(500) for r in mapper.readings(f"gateway/s{i}/temperature", b"21", i)])
    assert store.count(LATEST) == 500 * 9


def test_invalid_readings_are_refused() -> None:
    from gateway.observations import LatestCache

    bad_iri = Reading("urn:s:a b", GW + "temperature", "urn:f", 1.0, None, "t", None, "k")
    with pytest.raises(PayloadError, match="cannot be written"):
        observation_update([bad_iri], "gw", LatestCache())
    nan = Reading("urn:s:a", GW + "temperature", "urn:f", float("nan"), None, "t", None, "k")
    with pytest.raises(PayloadError, match="finite"):
        observation_update([nan], "gw", LatestCache())


nasty = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
INJECTIONS = ['"} } ; DROP ALL ; #', "a>b", "x\ny", "}", "\\u0022", "'", "?now", "<urn:x>", "\x00"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(nasty, st.sampled_from(INJECTIONS)), text=st.one_of(nasty, st.sampled_from(INJECTIONS)))
def test_topics_and_payloads_cannot_change_the_update(name: str, text: str) -> None:
    store = Store()
    mapper = Mapper(default_profiles())
    topic = f"homie/5/{name.replace('/', '_').replace('+', '_').replace('#', '_')}/node/mode"
    if any(level.startswith("$") or not level for level in topic.split("/")[2:]):
        return
    try:
        readings = mapper.readings(topic, text.encode("utf-8", "surrogatepass"), 1)
    except PayloadError:
        return
    if not readings:
        return
    store.write(readings)
    rows = store.values(
        f"SELECT ?topic ?v WHERE {{ GRAPH {OBS} {{ ?o gw:hasMqttTopic ?topic ; sosa:hasSimpleResult ?v }} }}"
    )
    numeric = store.values(
        f"SELECT ?topic ?v WHERE {{ GRAPH {OBS} {{ ?o gw:hasMqttTopic ?topic ; "
        f"sosa:hasResult/qudt:numericValue ?v }} }}"
    )
    assert len(rows) + len(numeric) == 1
    assert (rows or numeric)[0]["topic"] == topic
    if rows and isinstance(readings[0].value, str):
        assert rows[0]["v"] == readings[0].value
    assert store.count(OBS) in (8, 10, 11)  # exactly one observation's triples, nothing else
    assert store.count(LATEST) in (8, 9)


def test_learning_only_the_nodes_a_batch_touches(read: Read) -> None:
    store = Store()
    store.write(read("zigbee2mqtt/a", '{"temperature": 1, "humidity": 2}'))
    store.latest.clear()  # e.g. after a commit whose outcome is unknown
    batch = read("zigbee2mqtt/a", '{"temperature": 3}')
    missing = store.latest.unknown(latest_iri(r.sensor, r.property) for r in batch)
    assert len(missing) == 1
    store.latest.learn(missing, store.rows(nodes_query(missing)))
    assert "OPTIONAL" not in observation_update(batch, "gw-test", store.latest)
    result = store.engine.update(observation_update(batch, "gw-test", store.latest))
    store.latest.apply(result.added, result.removed)
    assert latest_table(store)[("a", "temperature")]["value"] == ["3"]
    assert all(len(v) == 1 for predicates in latest_table(store).values() for v in predicates.values())
