"""Hostile and buggy MQTT input against a real `sepa-gateway run` and a real Mosquitto: a
mapping written into the mappings graph, or a message, that no update can carry costs that
message only; the other sensors' readings, in the same batch or after it, are stored."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from adapters.mqtt.adapter import MqttAdapter
from adapters.mqtt.settings import MqttSettings
from broker.api import Engine, Scheduler
from gateway.client import InProcessTransport, SepaClient
from gateway.observations.writer import RESYNC_INTERVAL_S, ObservationWriter
from tests.support.bystander import asking_meanwhile
from tools.launcher import RunningGateway, launch_gateway
from tools.mosquitto import Mosquitto, until

PREFIXES = (
    "PREFIX sosa: <http://www.w3.org/ns/sosa/> PREFIX qudt: <http://qudt.org/schema/qudt/> "
    "PREFIX gw: <http://w3id.org/sepa-gateway/ns#> "
)
MAPPINGS = "<http://w3id.org/sepa-gateway/graph/mappings>"
LATEST = "<http://w3id.org/sepa-gateway/graph/latest>"


def config_file(tmp_path: Path, broker: Mosquitto, extra: str = "") -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(f'[mqtt]\nport = {broker.port}\nclient_id = "gw-{broker.port}"\n{extra}')
    return path


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def values(gateway: RunningGateway, topic: str) -> list[float]:
    rows = gateway.select(
        PREFIXES + "SELECT ?v WHERE { GRAPH <http://w3id.org/sepa-gateway/graph/observations> { "
        f'?obs gw:hasMqttTopic "{topic}" ; sosa:hasResult ?r . ?r qudt:numericValue ?v }} }}'
    )
    return sorted(float(row["v"]) for row in rows)


def bad_by_topic(gateway: RunningGateway) -> dict[str, float]:
    return {
        name.split('"')[1]: count
        for name, count in gateway.metrics().items()
        if name.startswith("sepa_mqtt_ingest_bad_input_by_topic{")
    }


def publish(port: int, messages: Sequence[tuple[str, bytes]]) -> None:
    """QoS 1 messages on one connection, back to back, each acknowledged by the broker."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{uuid.uuid4().hex[:8]}")
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for info in [client.publish(topic, payload, qos=1) for topic, payload in messages]:
            info.wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def test_a_reading_no_update_can_carry_costs_its_message_not_the_batch_nor_the_ingestion(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A mapping from the graph whose sensor template is `{sensor}:x`: valid for the sample the
    compiler fills (`x:x`), but `1abc:x` (a topic level starting with a digit) is no IRI. The
    writer refused the whole batch (PayloadError), the ingestor took that for a store failure and
    retried the same batch every 5 s for ever: no reading of any sensor was stored again."""
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto, "batch_wait_ms = 300\n"))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        added = gateway.update(
            PREFIXES + f"INSERT DATA {{ GRAPH {MAPPINGS} {{ "
            '<urn:sepa-gateway:mapping:evil> a gw:TopicMapping ; gw:mappingId "evil" ; '
            'gw:topicFilter "evil/{sensor}" ; gw:extract "number" ; '
            'gw:sensorTemplate "{sensor}:x" ; gw:propertyTemplate "temperature" } }'
        )
        assert added.status == 200, added.body
        time.sleep(0.3)  # the adapter subscribes to the new topic
        # one batch (batch_wait_ms): good readings around the bad one
        publish(
            mosquitto.port,
            [
                ("gateway/s1/temperature", b"19.5"),
                ("evil/1abc", b"20"),
                ("evil/abc", b"21"),
                ("gateway/s2/temperature", b"22"),
            ],
        )
        wait_for(lambda: values(gateway, "gateway/s2/temperature"))
        assert values(gateway, "gateway/s1/temperature") == [19.5]
        assert values(gateway, "evil/abc") == [21]
        assert values(gateway, "evil/1abc") == []
        assert bad_by_topic(gateway) == {"evil/1abc": 1}
        publish(mosquitto.port, [("gateway/s1/temperature", b"23")])  # ingestion goes on
        wait_for(lambda: values(gateway, "gateway/s1/temperature") == [19.5, 23])
        assert gateway.metrics().get("sepa_mqtt_ingest_commit_failures", 0) == 0
    finally:
        assert gateway.stop() == 0


def mapping_triples(first: int, count: int) -> str:
    return "".join(
        f'<urn:example:mapping:{i}> a gw:TopicMapping ; gw:mappingId "m{i}" ; gw:topicFilter "site{i}/{{sensor}}" ; '
        'gw:extract "number" ; gw:sensorTemplate "urn:example:{sensor}" ; gw:propertyTemplate "temperature" .\n'
        for i in range(first, first + count)
    )


def test_ten_thousand_mappings_in_the_graph_do_not_freeze_the_gateway_at_each_change(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Every change of the mappings graph rebuilds the adapter's Mapper on the event loop. With
    10,000 mappings written there (four updates within the 1 MB request limit), one more mapping
    held every HTTP request 3.5 s (duplicate ids and the changed MQTT filters found by quadratic
    list scans, every mapping compiled twice); then ~0.2 s. On 2026-12-02 the slowest request took
    0.79-1.50 s on the 2-core test machine, at 5dac945 and 94c166a alike (a CI run failed on the
    bar of 1 s; why it grew is not investigated): the bar is 2 s, which still catches the 3.5 s."""
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        for first in range(0, 10_000, 2_500):
            added = gateway.update(
                PREFIXES + f"INSERT DATA {{ GRAPH {MAPPINGS} {{ {mapping_triples(first, 2_500)} }} }}"
            )
            assert added.status == 200, added.body
        slowest = []
        for first in (10_000, 10_001):
            with asking_meanwhile(gateway) as asked:
                time.sleep(0.3)
                mapping = mapping_triples(first, 1)
                added = gateway.update(PREFIXES + f"INSERT DATA {{ GRAPH {MAPPINGS} {{ {mapping} }} }}")
                assert added.status == 200, added.body
                time.sleep(1.0)  # the rebuild, had the update returned before it
            slowest.append(max(asked.waits))
        # the better of two changes: one ask stretched by a loaded machine (2.16 and 3.12 s in two of
        # a helper's runs at load 6-8) fails neither, a rebuild of 3.5 s fails both
        assert min(slowest) < 2.0, f"an HTTP request waited {slowest} s"
        time.sleep(0.3)  # the adapter subscribes to the new topic
        publish(mosquitto.port, [("site10000/boiler", b"61.5")])  # the new mapping works
        wait_for(lambda: values(gateway, "site10000/boiler") == [61.5])
        assert gateway.metrics().get("sepa_mqtt_mapping_errors", 0) == 0
    finally:
        assert gateway.stop() == 0


def test_a_mapping_with_many_values_per_attribute_costs_its_size_not_their_product(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """One mapping node with 3 values for each of its 10 optional attributes (a 1.5 KB update).
    The mappings query joined one OPTIONAL per attribute, so the subscription's result was their
    product: 59,049 rows, the update took 1.8 s; 4 values each would be 1,048,576 rows, 5 nearly
    10 million. Now one row per triple: the mapping is refused (counted), the others work."""
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        attributes = (
            "sensorTemplate propertyTemplate featureTemplate unit jsonPath pattern trueWords falseWords timePath order"
        )
        triples = "".join(f'; gw:{name} "v{j}" ' for name in attributes.split() for j in range(3))
        started = time.monotonic()
        added = gateway.update(
            PREFIXES + f"INSERT DATA {{ GRAPH {MAPPINGS} {{ <urn:example:mapping:wide> a gw:TopicMapping ; "
            f'gw:mappingId "wide" ; gw:topicFilter "wide/{{sensor}}" ; gw:extract "number" {triples} . }} }}'
        )
        assert added.status == 200, added.body
        assert time.monotonic() - started < 1.0
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_mapping_errors", 0) >= 1)
        publish(mosquitto.port, [("gateway/s1/temperature", b"19.5")])
        wait_for(lambda: values(gateway, "gateway/s1/temperature") == [19.5])
    finally:
        assert gateway.stop() == 0


def resident_mb(gateway: RunningGateway) -> float:
    for line in Path(f"/proc/{gateway.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_long_topics_are_dropped_not_remembered(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """1,000 Homie `$unit` messages on distinct 60 KB topics (one sensor login may publish under
    homie/5/<login>/#): the mapper learned each topic's unit and cached each topic, and the
    gateway grew by 172 MB in 2 s (65,536 units allowed: ~11 GB). Now a topic over 256 bytes is
    counted and dropped, like an oversize payload."""
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        before = resident_mb(gateway)
        node = "n" * 60_000
        for first in range(0, 1_000, 100):
            publish(
                mosquitto.port,
                [(f"homie/5/dev/{node}{i}/temperature/$unit", "°C".encode()) for i in range(first, first + 100)],
            )
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_ingest_acked", 0) >= 1_000, timeout=30)
        grown = resident_mb(gateway) - before
        assert grown < 50, f"the gateway grew by {grown:.0f} MB"
        assert gateway.metrics()["sepa_mqtt_ingest_dropped_long_topic"] == 1_000
        assert bad_by_topic(gateway) == {f"homie/5/dev/{'n' * 52}...": 1_000}
        publish(mosquitto.port, [("gateway/s1/temperature", b"19.5")])  # the others go on
        wait_for(lambda: values(gateway, "gateway/s1/temperature") == [19.5])
    finally:
        assert gateway.stop() == 0


def test_unusable_mappings_in_the_graph_are_logged_once_not_at_every_change(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """200 mappings no adapter can use, written into the mappings graph, then five changes of
    other mappings: each change rebuilt the Mapper and logged every unusable mapping again, 1,200
    warnings (200 per change, whatever changed). Now each is logged when it appears."""
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        broken = "".join(
            f'<urn:example:broken:{i}> a gw:TopicMapping ; gw:mappingId "b{i}" ; gw:topicFilter "b/{i}" ; '
            'gw:extract "no-such-extractor" .\n'
            for i in range(200)
        )
        assert gateway.update(PREFIXES + f"INSERT DATA {{ GRAPH {MAPPINGS} {{ {broken} }} }}").status == 200
        for i in range(5):
            added = gateway.update(PREFIXES + f"INSERT DATA {{ GRAPH {MAPPINGS} {{ {mapping_triples(i, 1)} }} }}")
            assert added.status == 200, added.body
        time.sleep(0.5)
        publish(mosquitto.port, [("site4/boiler", b"61.5")])  # the last change is in effect
        wait_for(lambda: values(gateway, "site4/boiler") == [61.5])
        warnings = gateway.log().count("a mapping in the store is unusable")
        assert warnings == 200, warnings
    finally:
        assert gateway.stop() == 0


def test_a_mapping_whose_filter_brokers_refuse_costs_the_other_mappings_nothing(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A topic filter holding U+0001 went into the SUBSCRIBE with the filters added beside it;
    Mosquitto dropped the connection as "malformed" and none of them was subscribed (after a lost
    session, no filter at all: every reading stopped, the gateway still "connected")."""
    malformed = mosquitto.log.read_text().lower().count("malformed")
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        control = (
            '<urn:example:control> a gw:TopicMapping ; gw:mappingId "control" ; '
            'gw:topicFilter "evil\\u0001x/{sensor}" ; '
            'gw:extract "number" ; gw:sensorTemplate "urn:example:{sensor}" ; gw:propertyTemplate "temperature" .\n'
        )
        added = gateway.update(PREFIXES + f"INSERT DATA {{ GRAPH {MAPPINGS} {{ {control}{mapping_triples(70, 1)} }} }}")
        assert added.status == 200, added.body
        time.sleep(0.5)
        publish(mosquitto.port, [("site70/boiler", b"21.5")])
        wait_for(lambda: values(gateway, "site70/boiler") == [21.5])
        assert "which MQTT brokers refuse" in gateway.log()
        assert mosquitto.log.read_text().lower().count("malformed") == malformed
    finally:
        assert gateway.stop() == 0


def test_a_store_failure_while_a_refused_batch_is_stored_in_halves_stores_nothing_twice(
    mosquitto: Mosquitto,
) -> None:
    """The writer refuses a batch with one unwritable reading, so it is stored in halves; the
    store then fails once (a fault injected into the writer: the broker's own failures cannot be
    caused on demand) after the first half was stored. The ingestor retries the whole batch: the
    first half was stored again (its observation got a second gw:sequenceNumber)."""

    async def scenario() -> None:
        scheduler = Scheduler(Engine())
        client = SepaClient(InProcessTransport(scheduler))
        writer = ObservationWriter(client, "gw")
        settings = MqttSettings(
            host="127.0.0.1", port=mosquitto.port, client_id="gw-halves", reconnect_min_s=0.05, batch_wait_ms=300
        )
        adapter = MqttAdapter(client, settings, writer=writer)
        commit, calls = writer.commit, 0

        async def failing_once(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 5:  # the batch, its first half, [s1], [evil/1abc]: then the second half
                raise RuntimeError("the store failed")
            return await commit(*args, **kwargs)

        writer.commit = failing_once  # type: ignore[method-assign]
        await client.update(
            PREFIXES + f"INSERT DATA {{ GRAPH {MAPPINGS} {{ "
            '<urn:sepa-gateway:mapping:evil> a gw:TopicMapping ; gw:mappingId "evil" ; '
            'gw:topicFilter "evil/{sensor}" ; gw:extract "number" ; '
            'gw:sensorTemplate "{sensor}:x" ; gw:propertyTemplate "temperature" } }'
        )
        await adapter.start()
        try:
            await asyncio.wait_for(adapter.connection.wait_connected(), 10)
            await asyncio.sleep(0.3)  # subscribed
            messages = [
                ("gateway/s1/temperature", b"19.5"),
                ("evil/1abc", b"20"),
                ("evil/abc", b"21"),
                ("gateway/s2/temperature", b"22"),
            ]
            await asyncio.to_thread(publish, mosquitto.port, messages)
            await until(lambda: adapter.ingestor.stats.acked >= 4, what="the batch acknowledged")
            result = await client.query(
                PREFIXES + "SELECT ?topic ?sequence WHERE { GRAPH <http://w3id.org/sepa-gateway/graph/observations> "
                "{ ?obs gw:hasMqttTopic ?topic ; gw:sequenceNumber ?sequence } }"
            )
            stored = sorted((row[0].value, row[1].value) for row in result.rows)
            assert stored == [("evil/abc", "1"), ("gateway/s1/temperature", "1"), ("gateway/s2/temperature", "1")]
            assert adapter.ingestor.stats.commit_failures == 1
        finally:
            await adapter.stop()
            await client.close()
            scheduler.close()

    asyncio.run(scenario())


def test_a_time_key_too_large_for_a_double_is_ignored_like_any_unreadable_time(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A usual time key (`last_seen`, `ts`...) that cannot be read is ignored: the reading is
    stored with the gateway's time (`"last_seen": "yesterday"` is). A JSON integer of 400 digits
    raised OverflowError instead of PayloadError, and the whole message was refused."""
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        huge = b"9" * 400
        publish(mosquitto.port, [("zigbee2mqtt/hall", b'{"temperature": 21.5, "last_seen": ' + huge + b"}")])
        publish(mosquitto.port, [("gateway/s1/temperature", b"19.5")])  # processed after it
        wait_for(lambda: values(gateway, "gateway/s1/temperature") == [19.5])
        assert values(gateway, "zigbee2mqtt/hall") == [21.5]
        assert bad_by_topic(gateway) == {}
    finally:
        assert gateway.stop() == 0


def test_new_sensor_properties_past_the_bounds_are_counted_and_dropped_not_the_batch(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """The latest view is never pruned, so a sensor login naming endless properties (a JSON
    payload's keys, SenML record names, topic levels) grew it until memory ran out. Past the
    configured bounds a reading of a new sensor/property is counted on its topic and acknowledged;
    the readings beside it in the batch, and every known pair, are stored. A batch of refused
    readings only writes nothing."""
    extra = "batch_wait_ms = 300\n[observations]\nmax_sensor_properties = 4\nmax_properties_per_sensor = 2\n"
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto, extra))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        publish(
            mosquitto.port,
            [
                ("gateway/s1/temperature", b"1"),
                ("gateway/s1/humidity", b"2"),
                ("gateway/s1/pressure", b"3"),  # s1's third property
                ("gateway/s2/temperature", b"4"),
                ("gateway/s2/humidity", b"5"),
                ("gateway/s3/temperature", b"6"),  # a fifth pair in all
            ],
        )
        wait_for(lambda: values(gateway, "gateway/s2/humidity"))
        publish(mosquitto.port, [("gateway/s9/temperature", b"7")])  # a batch with nothing to store
        wait_for(lambda: "gateway/s9/temperature" in bad_by_topic(gateway))
        publish(mosquitto.port, [("gateway/s1/temperature", b"8")])
        wait_for(lambda: values(gateway, "gateway/s1/temperature") == [1, 8])
        assert bad_by_topic(gateway) == {
            "gateway/s1/pressure": 1,
            "gateway/s3/temperature": 1,
            "gateway/s9/temperature": 1,
        }
        for topic in ("gateway/s1/pressure", "gateway/s3/temperature", "gateway/s9/temperature"):
            assert values(gateway, topic) == []
        assert [values(gateway, f"gateway/{topic}") for topic in ("s1/humidity", "s2/temperature")] == [[2], [4]]
        metrics = gateway.metrics()
        assert metrics.get("sepa_mqtt_ingest_commit_failures", 0) == 0 and metrics["sepa_mqtt_ingest_acked"] == 8
    finally:
        assert gateway.stop() == 0


def latest_sensors(gateway: RunningGateway) -> list[str]:
    rows = gateway.select(PREFIXES + f"SELECT ?s WHERE {{ GRAPH {LATEST} {{ ?n gw:sensor ?s }} }}")
    return sorted(row["s"].rsplit("/", 1)[-1] for row in rows)


def full_view(broker: Mosquitto, tmp_path: Path, sensors: list[str], extra: str = "") -> RunningGateway:
    """A gateway of two latest slots, both taken by `sensors`, that has refused sensor `new`."""
    bounds = "batch_wait_ms = 100\n[observations]\nmax_sensor_properties = 2\nmax_properties_per_sensor = 1\n"
    gateway = launch_gateway(config=config_file(tmp_path, broker, bounds + extra))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        publish(broker.port, [(f"gateway/{sensor}/temperature", b"1") for sensor in sensors])
        wait_for(lambda: latest_sensors(gateway) == sorted(sensors))
        publish(broker.port, [("gateway/new/temperature", b"3")])
        wait_for(lambda: "gateway/new/temperature" in bad_by_topic(gateway))
    except BaseException:
        gateway.stop()
        raise
    return gateway


def test_the_latest_graph_deleted_by_sparql_frees_the_slots_without_a_restart(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Sensor churn filled the latest view (13,361 refusals in one churn pass), and the operator's
    fix, deleting the latest graph by SPARQL, left every new sensor refused until a restart: the
    writer admitted by its mirror, which never saw the deletion. Now a refused new sensor makes
    the writer check the store (at most once a second) and it is stored; the sensors in place
    write their latest values whole again."""
    gateway = full_view(mosquitto, tmp_path, ["s1", "s2"])
    try:
        assert gateway.update(f"DELETE WHERE {{ GRAPH {LATEST} {{ ?s ?p ?o }} }}").status == 200
        time.sleep(RESYNC_INTERVAL_S)  # past the refusal's own check
        publish(mosquitto.port, [("gateway/new/temperature", b"4"), ("gateway/s1/temperature", b"5")])
        wait_for(lambda: values(gateway, "gateway/s1/temperature") == [1, 5])
        assert values(gateway, "gateway/new/temperature") == [4]
        assert latest_sensors(gateway) == ["new", "s1"]
        assert bad_by_topic(gateway) == {"gateway/new/temperature": 1}
    finally:
        assert gateway.stop() == 0


def test_sensors_silent_for_longer_than_the_retention_age_free_their_slots(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Retention pruned observations but never a latest node, so devices replaced or renamed over
    months (or ~10 logins of 1,000 names each) filled max_sensor_properties for good. A sensor
    silent for longer than retain_age_s now loses its latest value too (its observations are
    gone already) and a new sensor takes its slot; a sensor that speaks keeps its node."""
    gateway = full_view(mosquitto, tmp_path, ["kept", "old"], "retain_age_s = 3\nprune_interval_s = 0.5\n")
    try:
        deadline = time.monotonic() + 10
        while latest_sensors(gateway) != ["kept"]:  # kept speaks every second, old is silent
            assert time.monotonic() < deadline, latest_sensors(gateway)
            publish(mosquitto.port, [("gateway/kept/temperature", b"2")])
            time.sleep(1)
        publish(mosquitto.port, [("gateway/new/temperature", b"4")])
        wait_for(lambda: values(gateway, "gateway/new/temperature") == [4])
        assert latest_sensors(gateway) == ["kept", "new"]
    finally:
        assert gateway.stop() == 0


def test_one_device_minting_a_sensor_per_record_name_is_bounded_per_device(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """SenML (and Tasmota, Homie) mint a sensor per record name under one device, so the
    per-sensor bound never held one login: a SenML login filled all 10,000 latest nodes with 40
    names of 256 properties, and every new sensor was refused for good. Past
    max_properties_per_device, a device's new names are counted on its topic and dropped; the
    other devices still add theirs."""
    extra = "batch_wait_ms = 300\n[observations]\nmax_sensor_properties = 300\nmax_properties_per_device = 4\n"
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto, extra))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        greedy = json.dumps([{"n": f"k{k}", "u": "Cel", "v": k} for k in range(7)]).encode()
        publish(mosquitto.port, [("senml/d1", greedy)])
        wait_for(lambda: "senml/d1" in bad_by_topic(gateway))
        publish(mosquitto.port, [("senml/d2", json.dumps([{"n": "a", "u": "Cel", "v": 1}]).encode())])
        publish(mosquitto.port, [("gateway/d1/humidity", b"40")])  # the same login in another convention
        publish(mosquitto.port, [("gateway/s1/temperature", b"5")])
        wait_for(lambda: values(gateway, "gateway/s1/temperature") == [5])
        assert values(gateway, "senml/d1") == [0, 1, 2, 3]
        assert values(gateway, "senml/d2") == [1]
        assert values(gateway, "gateway/d1/humidity") == []
        assert bad_by_topic(gateway) == {"senml/d1": 3, "gateway/d1/humidity": 1}
    finally:
        assert gateway.stop() == 0


PLANT_MAPPING = (
    '[[mqtt.mappings]]\nid = "plant"\ntopic = "plant/{room}/temperature"\nextract = "number"\n'
    'property = "temperature"\nunit = "degC"\nsensor = "urn:example:plant/{room}"\n'
)


def test_a_publisher_granted_a_templated_topic_cannot_take_every_latest_slot(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A login granted `plant/#` for a mapping `plant/{room}/temperature` makes a sensor per topic
    level, and each sensor of a deployment's own template was a device of its own: only the total
    bound held it. 12,000 such topics took all 10,000 latest slots (measured with the defaults), and
    every other sensor's new property was refused until the retention age. Now the sensors one
    mapping makes are bounded together (max_properties_per_mapping), and another sensor still gets in."""
    bounds = "[observations]\nmax_sensor_properties = 8\nmax_properties_per_sensor = 1\n"
    bounds += "max_properties_per_mapping = 5\n"
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto, "batch_wait_ms = 100\n" + PLANT_MAPPING + bounds))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        publish(mosquitto.port, [(f"plant/r{room}/temperature", b"20") for room in range(12)])
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_ingest_acked", 0) >= 12)
        publish(mosquitto.port, [("gateway/bob/temperature", b"21")])
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_ingest_acked", 0) >= 13)
        assert values(gateway, "gateway/bob/temperature") == [21]
        assert len([s for s in latest_sensors(gateway) if s.startswith("r")]) == 5
        refused = bad_by_topic(gateway)
        assert len(refused) == 7 and all(topic.startswith("plant/") for topic in refused)
        publish(mosquitto.port, [("plant/r0/temperature", b"22")])  # a known sensor of the mapping goes on
        wait_for(lambda: 22 in values(gateway, "plant/r0/temperature"))
    finally:
        assert gateway.stop() == 0


def test_a_templated_grant_gets_no_new_slots_at_a_restart(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """Which mapping made a sensor was kept in memory only: after a restart the 5 sensors a mapping
    had made counted as devices of their own, and the same login took 5 new slots on top of them at
    each restart (10 sensors after one, measured; with the defaults 1,000 more a restart, up to all
    10,000 slots). Now the latest node names its mapping (gw:mapping), and the bound holds across
    restarts."""
    bounds = "[observations]\nmax_sensor_properties = 12\nmax_properties_per_sensor = 1\n"
    bounds += "max_properties_per_mapping = 5\n"
    config = config_file(tmp_path, mosquitto, "batch_wait_ms = 100\n" + PLANT_MAPPING + bounds)

    def start(rooms: range) -> RunningGateway:
        """A gateway on the same data dir after `rooms` of the mapping published a reading each."""
        gateway = launch_gateway(config=config, data_dir=tmp_path / "data")
        try:
            wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
            publish(mosquitto.port, [(f"plant/r{room}/temperature", b"20") for room in rooms])
            wait_for(lambda: gateway.metrics().get("sepa_mqtt_ingest_acked", 0) >= len(rooms))
        except BaseException:
            gateway.stop()
            raise
        return gateway

    first = start(range(6))
    try:
        assert len([sensor for sensor in latest_sensors(first) if sensor.startswith("r")]) == 5
    finally:
        assert first.stop() == 0
    again = start(range(6, 12))
    try:
        assert len([sensor for sensor in latest_sensors(again) if sensor.startswith("r")]) == 5
        publish(mosquitto.port, [("plant/r0/temperature", b"22")])  # a known sensor of the mapping goes on
        wait_for(lambda: 22 in values(again, "plant/r0/temperature"))
    finally:
        assert again.stop() == 0


def test_a_publishers_junk_on_a_templated_topic_leaves_the_other_sensors_counted_by_topic(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Bad input is counted per topic for 1,000 topics, 100 a device, the rest as `(other topics)`. A
    topic of a deployment's own mapping was a device of its own (its first two levels), so 1,100 junk
    readings on `plant/<n>/temperature` took every slot, and another sensor's bad reading was only
    part of `(other topics)`: the operator could not see which sensor failed. Now a mapping's topics
    are one device."""
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto, "batch_wait_ms = 100\n" + PLANT_MAPPING))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        publish(mosquitto.port, [(f"plant/r{room}/temperature", b"junk") for room in range(1_100)])
        publish(mosquitto.port, [("gateway/bob/temperature", b"junk")])
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_ingest_bad_input", 0) >= 1_101, timeout=30)
        counted = bad_by_topic(gateway)
        assert counted.get("gateway/bob/temperature") == 1
        assert len([topic for topic in counted if topic.startswith("plant/")]) == 100
        assert counted["(other topics)"] == 1_000
    finally:
        assert gateway.stop() == 0


def senml_pack(device: int, records: int) -> tuple[str, bytes]:
    """One SenML pack of `records` timestamped temperature readings (distinct times: each its own observation)."""
    pack = [{"bn": f"urn:dev:{device}:", "bt": 1_700_000_000, "n": "temperature", "u": "Cel", "v": 20.0, "t": 0}]
    pack += [{"n": "temperature", "u": "Cel", "v": 20.0 + k, "t": k} for k in range(1, records)]
    return f"senml/d{device}", json.dumps(pack).encode()


def test_a_batch_of_senml_packs_is_stored_in_updates_of_bounded_size(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """A batch is up to batch_max messages, and a 64 KB SenML pack ~3,500 readings: one sensor
    login's packs made one update of up to 1.75 million readings (ten packs: 35,000, the update
    thread held 12-15 s). A batch is now cut between messages at batch_max_readings (a larger pack
    is an update of its own), every reading is stored, and all of it is acknowledged once."""
    extra = "batch_wait_ms = 500\nbatch_max_readings = 50\n"
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto, extra))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        messages = [senml_pack(1, 30), senml_pack(2, 30), senml_pack(3, 80)]
        messages += [(f"gateway/s{k}/temperature", str(k).encode()) for k in range(5)]
        publish(mosquitto.port, messages)
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_ingest_acked") == len(messages))
        stored = gateway.select(
            PREFIXES + "SELECT (COUNT(?obs) AS ?n) WHERE { GRAPH <http://w3id.org/sepa-gateway/graph/observations> "
            "{ ?obs a sosa:Observation } }"
        )
        metrics = gateway.metrics()
        assert int(stored[0]["n"]) == 30 + 30 + 80 + 5
        assert metrics["sepa_mqtt_ingest_batches"] == 1 and metrics["sepa_mqtt_ingest_largest_batch"] == len(messages)
        # groups [30], [30], [80] (alone past the bound) and the five single readings
        assert metrics["sepa_mqtt_largest_update_readings"] == 80
        assert metrics.get("sepa_mqtt_ingest_commit_failures", 0) == 0
    finally:
        assert gateway.stop() == 0


def test_a_senml_pack_of_3000_timestamped_records_is_stored_and_holds_back_no_one(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """50 KB: the update text had an OPTIONAL per timestamped reading, past the engine's limits; the
    commit was refused (400) and retried for ever, and no other sensor's reading was stored again."""
    records = [{"bn": "big/a", "bt": 1_700_000_000, "u": "Cel", "v": 0}] + [{"t": i, "v": i} for i in range(1, 3000)]
    gateway = launch_gateway(config=config_file(tmp_path, mosquitto))
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        pack = json.dumps(records, separators=(",", ":")).encode()  # 58 KB, under max_payload_bytes
        publish(mosquitto.port, [("senml/big", pack), ("gateway/other/temperature", b"5")])
        wait_for(lambda: values(gateway, "gateway/other/temperature") == [5.0], timeout=20)
        assert len(values(gateway, "senml/big")) == 3000
        assert bad_by_topic(gateway) == {}
    finally:
        assert gateway.stop() == 0
