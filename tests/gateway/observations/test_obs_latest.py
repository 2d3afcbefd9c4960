"""The latest mirror's counts of nodes per sensor and per device, which the writer bounds, and its index of
each node's changing quads and sequence number, which every batch reads, follow every delta."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from pyoxigraph import Literal, NamedNode, Quad

from gateway.observations import LatestCache
from gateway.observations.iris import SENSOR_PREFIX, device_of
from gateway.observations.latest import FIXED_PREDICATES
from gateway.observations.vocabulary import GRAPH_LATEST, GW, LATEST_PREFIX

GRAPH = NamedNode(GRAPH_LATEST)


def _sensor(sensor: int) -> str:
    """Sensors 0-2 are named by a profile, two of them on one device; 3 by a deployment's template."""
    return f"urn:sensor:{sensor}" if sensor == 3 else f"{SENSOR_PREFIX}senml/d{sensor % 2}/n{sensor}"


def _quads(node: int, sensor: int) -> list[Quad]:
    subject = NamedNode(f"{LATEST_PREFIX}{node}")
    return [
        Quad(subject, NamedNode(GW + "sensor"), NamedNode(_sensor(sensor)), GRAPH),
        Quad(subject, NamedNode(GW + "value"), Literal(str(node)), GRAPH),
        Quad(subject, NamedNode(GW + "sequenceNumber"), Literal(node + 10 * sensor), GRAPH),
    ]


_steps = st.lists(
    st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 3)),  # add or remove, node, its sensor
    max_size=40,
)


@given(steps=_steps, reload_at=st.integers(0, 40))
@settings(max_examples=60, deadline=None)
def test_nodes_per_sensor_is_what_the_nodes_say(steps: list[tuple[bool, int, int]], reload_at: int) -> None:
    cache = LatestCache()
    cache.load([])  # complete: new nodes are followed
    held: set[Quad] = set()
    for index, (add, node, sensor) in enumerate(steps):
        quads = _quads(node, sensor)
        if add:
            fresh = [quad for quad in quads if quad not in held]
            cache.apply(fresh, [])
            held.update(fresh)
        else:
            gone = [quad for quad in quads if quad in held]
            cache.apply([], gone)
            held.difference_update(gone)
        if index == reload_at:  # a reload from the store's rows counts the same
            cache.load({"latest": q.subject, "p": q.predicate, "o": q.object} for q in held)
    expected = Counter(q.object.value for q in held if q.predicate.value == GW + "sensor")
    assert cache.per_sensor == expected
    devices: Counter[str] = Counter()
    for sensor, count in expected.items():
        devices[device_of(sensor)] += count
    assert cache.per_device == devices
    for iri, quads in cache.nodes.items():  # what the index says is what a scan of the node finds
        scanned = {quad for quad in quads if quad.predicate.value not in FIXED_PREDICATES}
        assert set(cache.changing_quads(iri)) == scanned
        numbers = [int(quad.object.value) for quad in scanned if quad.predicate.value == GW + "sequenceNumber"]
        assert cache.sequence(iri) in (numbers or [0])


def test_the_device_of_a_profile_sensor_is_its_first_two_levels_and_any_other_sensor_its_own() -> None:
    # an MQTT login is one device whichever convention it publishes in
    assert device_of(f"{SENSOR_PREFIX}senml/boiler/temp") == "mqtt:boiler"
    assert device_of(f"{SENSOR_PREFIX}homie/boiler/node") == "mqtt:boiler"
    assert device_of(f"{SENSOR_PREFIX}tasmota/boiler/AM2301") == "mqtt:boiler"
    assert device_of(f"{SENSOR_PREFIX}gateway/boiler") == "mqtt:boiler"
    assert device_of(f"{SENSOR_PREFIX}coap/boiler/temp") == f"{SENSOR_PREFIX}coap/boiler"
    assert device_of(f"{SENSOR_PREFIX}plant/boiler/temp") == f"{SENSOR_PREFIX}plant/boiler"
    assert device_of("http://example.org/plant/boiler/temp") == "http://example.org/plant/boiler/temp"
