"""Deterministic IRIs for observations and latest-value nodes.

The observation IRI is the deduplication key downstream (issue 7): the same reading seen twice
(an MQTT redelivery of a timestamped payload) gets the same IRI, two different readings never do.
A timestamped reading's value is part of its key: a sensor whose clock stands still (or ticks in
whole seconds) sends different values under one timestamp, and keyed by the time alone the second
one was written onto the first observation (one observation, two numeric values, measured with two
Zigbee2MQTT messages sharing `last_seen`).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from gateway.observations.reading import Reading
from gateway.observations.vocabulary import LATEST_PREFIX, OBSERVATION_PREFIX, URN

SENSOR_PREFIX = URN + "sensor:"  # the ready-made profiles' sensors: <profile>/<device>[/<name>]
# the first level of the MQTT profiles' sensor IRIs (adapters/mqtt/profiles.py), whose second is the login
MQTT_PROFILES = frozenset({"homie", "zigbee2mqtt", "tasmota", "senml", "gateway"})
MAPPING_DEVICE = "mapping:"  # the device of the sensors a deployment's own mapping makes: `mapping:<id>`


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def time_key(reading: Reading) -> str:
    """The source timestamp (Unix µs) and the value when the payload had a timestamp, else the
    adapter's receive key (unique per message)."""
    if reading.source_time_us is None:
        return reading.key
    return f"{reading.source_time_us}|{type(reading.value).__name__}:{reading.value!r}"


def observation_iri(gateway_id: str, reading: Reading) -> str:
    """`urn:sepa-gateway:obs:<sha256-hex-24 of gateway_id|sensor|property|time key>`."""
    return OBSERVATION_PREFIX + _digest(f"{gateway_id}|{reading.sensor}|{reading.property}|{time_key(reading)}")


@lru_cache(maxsize=16_384)  # ~300 bytes an entry (its strings kept alive): ~5 MB at most
def latest_iri(sensor: str, prop: str) -> str:
    """`urn:sepa-gateway:latest:<sha256-hex-24 of sensor|property>`: one node per (sensor, property).

    Cached: every reading asks twice (the writer's bounds, the batch's plan) for a node of a few
    thousand at most, and a SHA-256 and its hex cost ~1.5 us where a cached call costs ~0.1 us."""
    return LATEST_PREFIX + _digest(f"{sensor}|{prop}")


def device_of(sensor: str) -> str:
    """The device a sensor IRI belongs to, for the latest view's per-device bound (ObservationWriter).

    The ready-made profiles name sensors `urn:sepa-gateway:sensor:<profile>/<device>[/<name>]`:
    SenML, Tasmota and Homie mint one sensor per record name or node under one device, whose
    `<device>` comes from the topic level the sensor's login owns (`senml/<login>`, the MQTT ACL),
    or the CoAP path. The MQTT profiles' devices are the login's, whichever convention it used:
    one login publishing SenML, Tasmota, Homie and generic readings is one device, not four
    (`mqtt:<login>`); a CoAP device is `coap/<device>`. Any other IRI (a deployment's own template)
    is its own device here: :func:`device_of_reading` counts it against its mapping.
    """
    if not sensor.startswith(SENSOR_PREFIX):
        return sensor
    levels = sensor[len(SENSOR_PREFIX) :].split("/", 2)
    if levels[0] in MQTT_PROFILES and len(levels) > 1:
        return "mqtt:" + levels[1]
    return SENSOR_PREFIX + "/".join(levels[:2])


def device_of_reading(reading: Reading) -> str:
    """The device a new latest node of `reading` counts against: :func:`device_of` its sensor, but a
    sensor of a deployment's own template (an IRI the profiles do not mint) counts against the mapping
    that read it, `mapping:<id>`. Why: a login granted a templated topic (`plant/+/temperature` to
    `urn:example:{room}`) made every topic level a sensor and a device of its own, bounded by the total
    only: 12,000 topics took all 10,000 latest slots, and every other sensor's new property was
    refused, for as long as the retention age (measured, 2026-12-06). The gateway cannot tell which
    login published a message, but a deployment's mapping is what a grant is written for."""
    device = device_of(reading.sensor)
    if device == reading.sensor and reading.mapping:
        return MAPPING_DEVICE + reading.mapping
    return device


def mapping_of_reading(reading: Reading) -> str | None:
    """The id of the deployment's mapping whose bound a new latest node of `reading` counts against
    (:func:`device_of_reading`), or None: written on the node (`gw:mapping`), so that the count
    survives a restart (gateway.observations.latest)."""
    device = device_of_reading(reading)
    return device.removeprefix(MAPPING_DEVICE) if device.startswith(MAPPING_DEVICE) else None
