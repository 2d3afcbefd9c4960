"""How a batch of readings maps onto observations and latest nodes, before it is written down.

Shared by the two ways a batch is written (SPARQL text in updates.py, the engine's own objects in
quads.py) so that they cannot disagree on which reading wins, or on sequence numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.observations.iris import latest_iri, observation_iri
from gateway.observations.latest import LatestCache
from gateway.observations.reading import Reading


@dataclass(slots=True)
class LatestKey:
    """One latest node in a batch: its last reading and how many readings the batch has for it."""

    number: int
    node: str
    reading: Reading
    observation: str
    count: int
    known: bool


@dataclass(frozen=True, slots=True)
class Placed:
    """One observation of the batch: its IRI, reading, latest node, and rank among that node's readings."""

    iri: str
    reading: Reading
    key: LatestKey
    position: int


def plan(readings: Sequence[Reading], gateway_id: str, cache: LatestCache) -> tuple[list[LatestKey], list[Placed]]:
    """The batch's latest nodes (in first-seen order) and observations (in order).

    A repeated observation IRI keeps its last reading (in the last one's place); of several
    readings of one (sensor, property), the last becomes the latest value.
    """
    unique: dict[str, Reading] = {}
    for reading in readings:
        iri = observation_iri(gateway_id, reading)
        unique.pop(iri, None)
        unique[iri] = reading
    keys: dict[str, LatestKey] = {}
    placed: list[Placed] = []
    for iri, reading in unique.items():
        node = latest_iri(reading.sensor, reading.property)
        key = keys.get(node)
        if key is None:
            key = keys[node] = LatestKey(len(keys), node, reading, iri, 0, cache.known(node))
        placed.append(Placed(iri, reading, key, key.count))
        key.reading, key.observation = reading, iri
        key.count += 1
    return list(keys.values()), placed
