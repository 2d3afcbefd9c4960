"""The default profiles with payloads as the ecosystems publish them.

What it protects: Zigbee2MQTT, Tasmota, SenML, Homie 5 (units from `$unit` and `$description`)
and the generic `gateway/<sensor>/<property>` convention each give the right sensor, property,
unit, value and source time; bad payloads raise PayloadError and give no reading at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from adapters.mqtt.profiles import default_profiles
from gateway.observations import Mapper, Mapping, PayloadError, Reading, UnmappedTopic
from gateway.observations.learned_units import MAX_PER_DEVICE, LearnedUnits

GW = "http://w3id.org/sepa-gateway/ns#"
UNIT = "http://qudt.org/vocab/unit/"
Read = Callable[..., list[Reading]]


def table(readings: list[Reading]) -> dict[str, tuple]:
    return {r.property.removeprefix(GW): (r.value, r.unit and r.unit.removeprefix(UNIT)) for r in readings}


def test_zigbee2mqtt(read: Read) -> None:
    readings = read(
        "zigbee2mqtt/kitchen",
        '{"temperature": 21.5, "humidity": 40, "occupancy": true, "linkquality": 120, "battery": 97, "state": "ON"}',
    )
    assert table(readings) == {
        "temperature": (21.5, "DEG_C"),
        "relativeHumidity": (40.0, "PERCENT_RH"),
        "occupancy": (True, None),
        "batteryLevel": (97.0, "PERCENT"),
        "onOff": (True, None),
    }
    first = readings[0]
    assert first.sensor == "urn:sepa-gateway:sensor:zigbee2mqtt/kitchen"
    assert first.feature == "urn:sepa-gateway:feature:zigbee2mqtt/kitchen"
    assert first.source == "zigbee2mqtt/kitchen" and first.source_time_us is None
    assert len({r.key for r in readings}) == len(readings)


def test_zigbee2mqtt_friendly_names_are_encoded(read: Read) -> None:
    (reading,) = read("zigbee2mqtt/Living Room ü", '{"contact": false}')
    assert reading.sensor == "urn:sepa-gateway:sensor:zigbee2mqtt/Living%20Room%20%C3%BC"
    assert reading.value is False and reading.unit is None


def test_zigbee2mqtt_bridge_is_ignored(read: Read) -> None:
    assert read("zigbee2mqtt/bridge/state", '{"state": "online"}') == []
    assert read("zigbee2mqtt/bridge/devices", "[]") == []


def test_zigbee2mqtt_bad_field_rejects_the_whole_message(read: Read) -> None:
    with pytest.raises(PayloadError, match="'humidity'"):
        read("zigbee2mqtt/kitchen", '{"temperature": 21.5, "humidity": "wet"}')


def test_tasmota(read: Read) -> None:
    payload = {
        "Time": "2026-11-22T10:00:00",
        "AM2301": {"Temperature": 21.5, "Humidity": 40, "DewPoint": 7.3},
        "ENERGY": {"TotalStartTime": "2026-01-01T00:00:00", "Total": 12.5, "Today": 0.2, "Power": 45,
                   "Voltage": 230, "Current": 0.2, "Factor": 0.9},
        "TempUnit": "C",
    }  # fmt: skip
    readings = read("tele/plug1/SENSOR", json.dumps(payload))
    by_sensor = {(r.sensor.rsplit("/", 1)[1], r.property.removeprefix(GW)): (r.value, r.unit) for r in readings}
    assert by_sensor == {
        ("AM2301", "temperature"): (21.5, UNIT + "DEG_C"),
        ("AM2301", "relativeHumidity"): (40.0, UNIT + "PERCENT_RH"),
        ("AM2301", "dewPoint"): (7.3, UNIT + "DEG_C"),
        ("ENERGY", "energy"): (12.5, UNIT + "KiloW-HR"),
        ("ENERGY", "power"): (45.0, UNIT + "W"),
        ("ENERGY", "voltage"): (230.0, UNIT + "V"),
        ("ENERGY", "current"): (0.2, UNIT + "A"),
    }
    assert {r.source_time_us for r in readings} == {1_795_341_600_000_000}
    assert readings[0].sensor == "urn:sepa-gateway:sensor:tasmota/plug1/AM2301"
    assert readings[0].feature == "urn:sepa-gateway:feature:tasmota/plug1"


def test_tasmota_fahrenheit(read: Read) -> None:
    (reading,) = read("tele/t/SENSOR", '{"DS18B20": {"Temperature": 70.1}, "TempUnit": "F"}')
    assert reading.unit == UNIT + "DEG_F"


@pytest.mark.parametrize(
    ("topic", "payload"),
    [
        ("tele/boiler/SENSOR", '{"../kitchen/AM2301": {"Temperature": -40}}'),  # kitchen's sensor, normalised
        ("tele/boiler/SENSOR", '{"AM2301/.": {"Temperature": -40}}'),
        ("tele/boiler/SENSOR", json.dumps({"A" * 257: {"Temperature": 1}})),  # 60 KB names grew the gateway
        ("homie/5/boiler/../temperature", "11"),
        ("homie/5/boiler/./temperature", "12"),
        ("homie/5/boiler/n/..", "13"),
    ],
)
def test_captured_names_get_the_checks_senml_names_get(read: Read, topic: str, payload: str) -> None:
    """A name captured from a topic level or a Tasmota object becomes a sensor IRI like a SenML
    record's name: no '.' or '..' segment, at most MAX_NAME_BYTES; else bad input, no reading.
    Before, `.../tasmota/boiler/../kitchen/AM2301` was stored, and 60 KB Tasmota names."""
    with pytest.raises(PayloadError, match=r"'\.' or '\.\.' segment|longer than 256 bytes"):
        read(topic, payload)


def test_captured_names_with_dots_inside_levels_or_of_256_bytes_are_taken(read: Read) -> None:
    (dotted,) = read("tele/t/SENSOR", '{"DS18B20-1.2": {"Temperature": 20}}')
    assert dotted.sensor == "urn:sepa-gateway:sensor:tasmota/t/DS18B20-1.2"
    (longest,) = read("tele/t/SENSOR", json.dumps({"A" * 256: {"Temperature": 20}}))
    assert longest.sensor.endswith("A" * 256)
    (homie,) = read("homie/5/b.1/n..x/temperature", "20")
    assert homie.sensor == "urn:sepa-gateway:sensor:homie/b.1/n..x"


def test_senml(read: Read) -> None:
    pack = [
        {"bn": "urn:dev:ow:10e2073a01080063:", "bt": 1.320067464e09, "bu": "Cel", "n": "temp", "v": 23.1},
        {"n": "humidity", "u": "%RH", "v": 41, "t": 10},
        {"n": "door", "vb": True},
        {"n": "pressure", "u": "hPa", "v": 1013.2},
    ]
    readings = read("senml/node7", json.dumps(pack))
    assert table(readings) == {
        "temperature": (23.1, "DEG_C"),
        "relativeHumidity": (41.0, "PERCENT_RH"),
        "urn:sepa-gateway:property:senml/urn%3Adev%3Aow%3A10e2073a01080063%3Adoor": (True, None),
        "pressure": (1013.2, "HectoPA"),
    }
    assert readings[0].source_time_us == 1_320_067_464_000_000
    assert readings[1].source_time_us == 1_320_067_474_000_000
    assert readings[0].sensor == "urn:sepa-gateway:sensor:senml/node7/urn%3Adev%3Aow%3A10e2073a01080063%3Atemp"


def test_a_senml_name_of_256_bytes_is_taken(read: Read) -> None:
    (reading,) = read("senml/n", json.dumps([{"bn": "d" * 200, "n": "t" * 56, "u": "Cel", "v": 1}]))
    assert reading.sensor.endswith("d" * 200 + "t" * 56)


def test_unit_names_without_case_are_still_taken(read: Read) -> None:
    readings = read("senml/n", '[{"n": "t", "u": "CELSIUS", "v": 1}, {"n": "e", "u": "KWH", "v": 2}]')
    assert [reading.unit for reading in readings] == [UNIT + "DEG_C", UNIT + "KiloW-HR"]


def test_senml_names_with_dots_inside_segments_are_read(read: Read) -> None:
    (reading,) = read("senml/n", '[{"bn": "urn:dev:mac:0024befffe804ff1.", "n": "v1.2..x", "v": 3}]')
    assert reading.sensor.endswith("0024befffe804ff1.v1.2..x") and reading.value == 3.0


def test_senml_relative_times_are_not_source_times(read: Read) -> None:
    (reading,) = read("senml/n", '[{"n": "lux", "u": "lx", "v": 300, "t": -5}]')
    assert reading.source_time_us is None and reading.unit == UNIT + "LUX"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('[{"n": "x", "u": "furlongs", "v": 1}]', "unknown unit"),
        # mega units are not milli ones (MV was stored as mV: 10^9 off)
        ('[{"n": "voltage", "u": "MV", "v": 5}]', "unknown unit"),
        ('[{"n": "current", "u": "MA", "v": 5}]', "unknown unit"),
        ('[{"n": "x", "v": "hot"}]', "not a number"),
        ('[{"v": 1}]', "no name"),
        ("[1]", "not a JSON object"),
        # a name becomes a sensor IRI kept in the store and the caches: 60 KB names were ~0.7 MB a reading
        (json.dumps([{"bn": "d" * 200, "n": "t" * 57, "u": "Cel", "v": 1}]), "longer than 256 bytes"),
        (json.dumps([{"n": "é" * 129, "v": 1}]), "longer than 256 bytes"),
        # kept verbatim in the sensor IRI: bob's sensor to whatever normalises the path downstream
        ('[{"bn": "alice/../bob/", "n": "temperature", "u": "Cel", "v": 1}]', "'..' segment"),
        ('[{"n": "./temperature", "v": 1}]', "'..' segment"),
        ('[{"bn": "a/", "n": "..", "v": 1}]', "'..' segment"),
    ],
)
def test_senml_bad_packs(read: Read, payload: str, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        read("senml/n", payload)


def test_homie_unit_attribute(read: Read) -> None:
    assert read("homie/5/boiler/sensor/flow-temp/$unit", "°F") == []
    (reading,) = read("homie/5/boiler/sensor/flow-temp", "140.5")
    assert reading.unit == UNIT + "DEG_F"
    assert reading.property == "urn:sepa-gateway:property:homie/flow-temp"
    assert reading.sensor == "urn:sepa-gateway:sensor:homie/boiler/sensor"


def test_homie_description_and_defaults(read: Read) -> None:
    description = {
        "homie": "5.0",
        "nodes": {"env": {"properties": {"temperature": {"datatype": "float", "unit": "°C"},
                                         "pressure": {"datatype": "float", "unit": "kPa"}}}},
    }  # fmt: skip
    assert read("homie/5/weather/$description", json.dumps(description)) == []
    assert table(read("homie/5/weather/env/pressure", "101.3")) == {"pressure": (101.3, "KiloPA")}
    assert table(read("homie/5/weather/env/temperature", "20")) == {"temperature": (20.0, "DEG_C")}
    assert table(read("homie/5/other/env/humidity", "55")) == {"relativeHumidity": (55.0, "PERCENT_RH")}
    assert read("homie/5/weather/env/mode", "eco")[0].value == "eco"
    assert read("homie/5/weather/env/on", "true")[0].value is True
    assert read("homie/5/weather/$alert/x", "boom") == []


def test_homie_units_survive_a_rebuild(mapper: Mapper) -> None:
    mapper.readings("homie/5/b/s/t/$unit", b"K", 1)
    rebuilt = mapper.rebuild(default_profiles())
    assert rebuilt.readings("homie/5/b/s/t", b"300", 2)[0].unit == UNIT + "K"


def describe(properties: dict[str, str]) -> str:
    """A Homie 5 $description of one node with these property ids and unit symbols."""
    nodes = {"n": {"properties": {name: {"unit": unit} for name, unit in properties.items()}}}
    return json.dumps({"homie": "5.0", "nodes": nodes})


def test_one_homie_device_cannot_fill_the_units_of_every_other(read: Read) -> None:
    """Before, one table of 65,536 topics for all devices, new ones silently ignored past it: a login
    that filled it from its own $description made another device's °F readings °C."""
    filler = {f"p{i}": "°C" for i in range(MAX_PER_DEVICE + 200)}
    with pytest.raises(PayloadError, match=f"at most {MAX_PER_DEVICE} units"):
        read("homie/5/filler/$description", describe(filler))
    for round_ in range(3):  # again and again: each description replaces the last one's units
        with pytest.raises(PayloadError):
            read("homie/5/filler/$description", describe({f"{k}-{round_}": v for k, v in filler.items()}))
    read("homie/5/oven/n/temperature/$unit", "°F")
    assert table(read("homie/5/oven/n/temperature", "71.5")) == {"temperature": (71.5, "DEG_F")}
    (kept,) = read("homie/5/filler/n/p3-2", "20")  # the first ones of the last description were learned
    assert kept.unit == UNIT + "DEG_C"


def test_an_unknown_unit_in_a_homie_description_is_bad_input_and_the_known_ones_are_learned(read: Read) -> None:
    """It was ignored without a word, and that property's readings stored without a unit, where
    an unknown `$unit` topic is counted as bad input."""
    with pytest.raises(PayloadError, match="unknown Homie unit '°C\\\\x00' and 1 more in the \\$description"):
        read("homie/5/odd/$description", describe({"temperature": "°F", "a": "°C\u0000", "b": "furlongs"}))
    assert table(read("homie/5/odd/n/temperature", "70")) == {"temperature": (70.0, "DEG_F")}


def test_a_homie_description_replaces_the_last_ones_units(read: Read) -> None:
    read("homie/5/probe/$description", describe({"temperature": "°F"}))
    assert table(read("homie/5/probe/n/temperature", "70")) == {"temperature": (70.0, "DEG_F")}
    read("homie/5/probe/$description", describe({"humidity": "%"}))
    assert table(read("homie/5/probe/n/temperature", "21")) == {"temperature": (21.0, "DEG_C")}  # the default


def test_learned_units_are_bounded_in_all_with_an_error() -> None:
    units = LearnedUnits(max_total=3, max_per_device=2)
    units.learn("a", "a/x", "K")
    units.learn("a", "a/y", "K")
    units.learn("b", "b/x", "K")
    with pytest.raises(PayloadError, match="at most 3 learned units"):
        units.learn("c", "c/x", "K")
    units.learn("a", "a/y", "DEG_C")  # a unit changed: no new entry
    assert (len(units), units.get("a/y")) == (3, "DEG_C")
    units.forget("b/x")
    units.learn("c", "c/x", "K")
    units.forget_device("a")
    assert (len(units), units.get("a/x"), units.get("c/x")) == (1, None, "K")


def test_homie_unknown_unit(read: Read) -> None:
    with pytest.raises(PayloadError, match="unknown Homie unit"):
        read("homie/5/b/s/t/$unit", "cubits")


@pytest.mark.parametrize(
    ("topic", "payload", "expected"),
    [
        ("gateway/greenhouse/temperature", "21.5", ("temperature", 21.5, "DEG_C")),
        ("gateway/greenhouse/soil_moisture", "33", ("soilMoisture", 33.0, "PERCENT")),
        ("gateway/greenhouse/co2", "612", ("co2Concentration", 612.0, "PPM")),
        ("gateway/greenhouse/pressure", "1013", ("pressure", 1013.0, "HectoPA")),
        ("gateway/hall/presence", "on", ("presence", True, None)),
        ("gateway/door/contact", "closed", ("contact", False, None)),
    ],
)
def test_generic_convention(read: Read, topic: str, payload: str, expected: tuple) -> None:
    (reading,) = read(topic, payload)
    name, value, unit = expected
    assert (reading.property, reading.value, reading.unit) == (GW + name, value, unit and UNIT + unit)
    assert reading.sensor == "urn:sepa-gateway:sensor:gateway/" + topic.split("/")[1]


@pytest.mark.parametrize("payload", ["NaN", "inf", "21,5", "", "twenty", "1e400", b"\xff\xfe"])
def test_generic_bad_numbers(read: Read, payload: str | bytes) -> None:
    with pytest.raises(PayloadError):
        read("gateway/greenhouse/temperature", payload)


def test_generic_unknown_property(read: Read) -> None:
    with pytest.raises(PayloadError, match="not a known property name"):
        read("gateway/greenhouse/flux", "1")


def test_unmapped_and_oversized(mapper: Mapper) -> None:
    with pytest.raises(UnmappedTopic):
        mapper.readings("nobody/listens/here", b"1", 1)
    with pytest.raises(PayloadError, match="over the limit"):
        mapper.readings("gateway/a/temperature", b"1" * 70_000, 1)


def test_config_mapping_wins_over_profiles() -> None:
    mine = Mapping("mine", "zigbee2mqtt/{device}", "json", path="t", property="temperature",
                   unit="degF", sensor="urn:example:{device}")  # fmt: skip
    mapper = Mapper([mine, *default_profiles()])
    (reading,) = mapper.readings("zigbee2mqtt/x", b'{"t": 70}', 1)
    assert (reading.sensor, reading.unit) == ("urn:example:x", UNIT + "DEG_F")


def test_regex_and_json_extractors() -> None:
    mapper = Mapper(
        [
            Mapping(
                "re",
                "lab/{room}/raw",
                "regex",
                pattern=r"T=(?P<value>-?[0-9.]+)C",
                property="temperature",
                sensor="urn:lab:{room}",
            ),
            Mapping(
                "js",
                "lab/{room}/json",
                "json",
                path="ENERGY.Power",
                property="power",
                sensor="urn:lab:{room}",
                time_path="ts",
            ),
            Mapping(
                "sw",
                "lab/{room}/switch",
                "boolean",
                true_words=("wet",),
                false_words=("dry",),
                property="waterLeak",
                sensor="urn:lab:{room}",
            ),
        ]  # fmt: skip
    )
    assert mapper.readings("lab/a/raw", b"id=4;T=-2.5C;ok", 1)[0].value == -2.5
    (power,) = mapper.readings("lab/a/json", b'{"ts": 1700000000000, "ENERGY": {"Power": 12}}', 1_800_000_000_000_000)
    assert (power.value, power.unit, power.source_time_us) == (12.0, UNIT + "W", 1_700_000_000_000_000)
    assert mapper.readings("lab/a/switch", b"WET", 1)[0].value is True
    with pytest.raises(PayloadError, match="does not match the pattern"):
        mapper.readings("lab/a/raw", b"T=?", 1)
    with pytest.raises(PayloadError, match="no key 'ts'"):
        mapper.readings("lab/a/json", b'{"ENERGY": {"Power": 12}}', 1)


def test_subscriptions(mapper: Mapper) -> None:
    assert mapper.subscriptions() == [
        "homie/5/+/+/+",
        "homie/5/+/+/+/$unit",
        "homie/5/+/$description",
        "zigbee2mqtt/bridge/#",
        "zigbee2mqtt/+",
        "tele/+/SENSOR",
        "senml/+",
        "gateway/+/+",
    ]


@pytest.mark.parametrize(
    "payload", ['{"temperature": true}', '{"temperature": false, "humidity": 40}', '{"temperature": null}']
)
def test_wrong_typed_values_are_refused_not_stored(read: Read, payload: str) -> None:
    """A boolean is not a temperature (it was stored as one) and a lone null is not a reading (it was
    neither stored nor counted): the message is refused, which the adapter counts per topic."""
    with pytest.raises(PayloadError, match="not a value"):
        read("zigbee2mqtt/kitchen", payload)


def test_a_null_beside_real_values_is_a_partial_update(read: Read) -> None:
    (reading,) = read("zigbee2mqtt/kitchen", '{"temperature": null, "humidity": 40}')
    assert (reading.property, reading.value) == (GW + "relativeHumidity", 40.0)
