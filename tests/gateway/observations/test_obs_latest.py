"""The latest mirror's count of nodes per sensor, which the writer bounds, follows every delta."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from pyoxigraph import Literal, NamedNode, Quad

from gateway.observations import LatestCache
from gateway.observations.vocabulary import GRAPH_LATEST, GW, LATEST_PREFIX

GRAPH = NamedNode(GRAPH_LATEST)


def _quads(node: int, sensor: int) -> list[Quad]:
    subject = NamedNode(f"{LATEST_PREFIX}{node}")
    return [
        Quad(subject, NamedNode(GW + "sensor"), NamedNode(f"urn:sensor:{sensor}"), GRAPH),
        Quad(subject, NamedNode(GW + "value"), Literal(str(node)), GRAPH),
    ]


_steps = st.lists(
    st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 2)),  # add or remove, node, its sensor
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
