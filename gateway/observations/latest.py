"""A mirror of the latest-value graph, so that an update deletes old values as constants.

Deleting a known old triple is a constant in the DELETE template, which costs the engine nothing
to evaluate; deleting an unknown one needs OPTIONAL patterns in the WHERE clause. The adapter
keeps the mirror exact with two calls:

* `load(rows)` with the rows of LATEST_QUERY (the whole latest graph) at start-up, which makes the
  mirror *complete*: a (sensor, property) it does not hold has no node in the store;
* `apply(added, removed)` with the exact quads each committed update added and removed (the
  engine's UpdateResult, which the in-process client returns in `UpdateSummary.result`).

Without a complete mirror, `unknown(latest IRIs of a batch)` + `nodes_query` + `learn` fetch just
the nodes a batch touches before its update is built.

This is exact as long as nobody else writes the latest graph (it belongs to the adapters; retention
deletes silent nodes through the writer, which applies that delta too). A node deleted by anyone
else (an operator's SPARQL update) stays in the mirror until the writer notices at a refusal
(gateway.observations.writer) and loads it again: until then its next reading writes it whole
anyway (every update inserts a node's fixed triples), so the store stays right. When a
commit's outcome is unknown, or no delta is available (network transport), `clear()`: updates
then fall back to OPTIONAL patterns, slower but exact, until the next `load`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from pyoxigraph import Literal, NamedNode, Quad

from broker.api import term_from_json
from gateway.observations.iris import MAPPING_DEVICE, device_of
from gateway.observations.vocabulary import GRAPH_LATEST, GW, LATEST_PREFIX, MADE_BY_MAPPING, RDF_TYPE

LATEST_QUERY = f"SELECT ?latest ?p ?o WHERE {{ GRAPH <{GRAPH_LATEST}> {{ ?latest ?p ?o }} }}"
# The gw:sensor triples of the latest graph, as many as the mirror's `per_sensor.total()` while it is exact.
SENSOR_COUNT_QUERY = f"SELECT (COUNT(*) AS ?n) WHERE {{ GRAPH <{GRAPH_LATEST}> {{ ?latest <{GW}sensor> ?sensor }} }}"


def nodes_query(iris: Iterable[str]) -> str:
    """LATEST_QUERY restricted to some latest nodes (for `learn`); the IRIs are hash IRIs we minted."""
    values = " ".join(f"<{iri}>" for iri in iris if iri.startswith(LATEST_PREFIX) and iri.isascii() and ">" not in iri)
    return f"SELECT ?latest ?p ?o WHERE {{ VALUES ?latest {{ {values} }} GRAPH <{GRAPH_LATEST}> {{ ?latest ?p ?o }} }}"


# Triples of a latest node that never change (its IRI is a hash of sensor and property).
FIXED_PREDICATES = frozenset({RDF_TYPE, GW + "sensor", GW + "property", MADE_BY_MAPPING})
SEQUENCE = GW + "sequenceNumber"
SENSOR = GW + "sensor"
MAX_ENTRIES = 200_000  # nodes the mirror follows; past it, it stops (and with it the writer's bounds)
_XSD_INTEGER = NamedNode("http://www.w3.org/2001/XMLSchema#integer")
_GRAPH = NamedNode(GRAPH_LATEST)


class LatestCache:
    """Latest node IRI -> its quads in the latest graph; see the module docstring.

    The quads are the engine's own (from deltas and query rows): an update can delete them as they
    are, and following a delta costs no conversion.
    """

    def __init__(self, *, max_entries: int = MAX_ENTRIES) -> None:
        # node IRI -> its quads -> their predicate IRI. Why the predicate: each reading of a batch asks
        # for its node's changing quads and sequence number, and reading a quad's predicate makes two
        # Python objects (~0.25 us); a scan of the node's ~10 quads for them was ~5 us a reading on the
        # event loop (observation_quads; py-spy of `nlphase.py` at 1,000 readings/s, 2026-12-07)
        self.nodes: dict[str, dict[Quad, str]] = {}
        self.complete = False
        self.max_entries = max_entries
        # nodes per sensor IRI (by their gw:sensor triple): the writer bounds them (ObservationWriter)
        self.per_sensor: Counter[str] = Counter()
        self.per_device: Counter[str] = Counter()  # nodes per device (gateway.observations.iris.device_of)
        # the sensors whose device is not `device_of` their IRI (`assign`): kept across `clear` and
        # `load`, so a reload counts a mapping's sensors against it again, and found again by `load`
        # in the nodes' gw:mapping (a restart); dropped with their last node
        self.devices: dict[str, str] = {}

    def device(self, sensor: str) -> str:
        """The device the nodes of `sensor` count against."""
        return self.devices.get(sensor) or device_of(sensor)

    def assign(self, sensor: str, device: str) -> None:
        """Count the nodes of `sensor` against `device` from now on (those it holds move with it)."""
        old = self.device(sensor)
        if old == device:
            return
        held = self.per_sensor[sensor]
        if held:
            self.per_device[old] -= held
            if self.per_device[old] <= 0:
                del self.per_device[old]
            self.per_device[device] += held
        self.devices[sensor] = device

    def _add(self, quads: dict[Quad, str], quad: Quad) -> None:
        predicate = quad.predicate.value
        if predicate == SENSOR and quad not in quads:
            self.per_sensor[quad.object.value] += 1
            self.per_device[self.device(quad.object.value)] += 1
        quads[quad] = predicate

    def _discard(self, quads: dict[Quad, str], quad: Quad) -> None:
        if quads.pop(quad, None) == SENSOR:
            sensor = quad.object.value
            device = self.device(sensor)
            self.per_sensor[sensor] -= 1
            if self.per_sensor[sensor] <= 0:
                del self.per_sensor[sensor]
                self.devices.pop(sensor, None)
            self.per_device[device] -= 1
            if self.per_device[device] <= 0:
                del self.per_device[device]

    def known(self, iri: str) -> bool:
        """Whether the mirror knows exactly what the store holds for this node (maybe nothing)."""
        return iri in self.nodes or self.complete

    def changing_quads(self, iri: str) -> list[Quad]:
        """The node's quads an update must delete (all but the fixed ones)."""
        return [quad for quad, predicate in self.nodes.get(iri, {}).items() if predicate not in FIXED_PREDICATES]

    def changing(self, iri: str) -> list[tuple[str, str]]:
        """The node's triples an update must delete, as sorted (predicate IRI, object as SPARQL text)."""
        return sorted((quad.predicate.value, str(quad.object)) for quad in self.changing_quads(iri))

    def sequence(self, iri: str) -> int:
        """The node's gw:sequenceNumber (0 for a node the store does not have)."""
        for quad, predicate in self.nodes.get(iri, {}).items():
            if predicate == SEQUENCE:
                obj = quad.object
                ok = isinstance(obj, Literal) and obj.datatype == _XSD_INTEGER and obj.value.isascii()
                return int(obj.value) if ok and obj.value.isdigit() else 0
        return 0

    def snapshot(self, iris: Iterable[str]) -> LatestCache:
        """The mirror of just these nodes, as it is now, for nodes it knows (later deltas leave it alone)."""
        copy = LatestCache(max_entries=self.max_entries)
        copy.devices = dict(self.devices)
        for iri in iris:
            if iri in self.nodes and iri not in copy.nodes:
                quads = copy.nodes[iri] = {}
                for quad in self.nodes[iri]:
                    copy._add(quads, quad)
        copy.complete = self.complete
        return copy

    def unknown(self, iris: Iterable[str]) -> list[str]:
        """Those of these latest nodes the mirror does not know (query them with `nodes_query`)."""
        return [iri for iri in dict.fromkeys(iris) if not self.known(iri)]

    def learn(self, iris: Iterable[str], rows: Iterable[dict[str, Any]]) -> None:
        """Record the current content of these nodes: the rows of `nodes_query(iris)` (none = absent)."""
        for iri in iris:
            if len(self.nodes) < self.max_entries:
                quads = self.nodes.setdefault(iri, {})
                for quad in list(quads):
                    self._discard(quads, quad)
        for row in rows:
            quad = _quad(row)
            if quad is None:
                continue
            quads = self.nodes.get(quad.subject.value)
            if quads is not None:
                self._add(quads, quad)

    def clear(self) -> None:
        """Forget everything: updates use OPTIONAL patterns until the next `load`."""
        self.nodes.clear()
        self.per_sensor.clear()
        self.per_device.clear()
        self.complete = False

    def load(self, rows: Iterable[dict[str, Any]]) -> None:
        """Replace the mirror with the rows of LATEST_QUERY (terms or SPARQL JSON objects)."""
        self.nodes.clear()
        self.per_sensor.clear()
        self.per_device.clear()
        quads = [quad for quad in map(_quad, rows) if quad is not None]
        self._assign_mappings(quads)
        for quad in quads:
            self._add(self.nodes.setdefault(quad.subject.value, {}), quad)
        self.devices = {sensor: device for sensor, device in self.devices.items() if sensor in self.per_sensor}
        self.complete = len(self.nodes) <= self.max_entries
        if not self.complete:
            self.nodes.clear()
            self.per_sensor.clear()
            self.per_device.clear()

    def _assign_mappings(self, quads: list[Quad]) -> None:
        """Count the sensors whose nodes name a deployment's mapping (gw:mapping) against it. Why: the
        assignment lived in memory only, so after a restart a mapping's sensors counted as devices of
        their own, and a login granted plant/+/temperature took the mapping's bound anew at each
        restart (bound 5: 10 sensors after one restart, measured; with the defaults 1,000 more a
        restart, up to all 10,000 slots)."""
        sensor_of = {quad.subject.value: quad.object.value for quad in quads if quad.predicate.value == SENSOR}
        for quad in quads:
            if quad.predicate.value == MADE_BY_MAPPING and quad.subject.value in sensor_of:
                self.devices.setdefault(sensor_of[quad.subject.value], MAPPING_DEVICE + quad.object.value)

    def apply(self, added: Iterable[Quad], removed: Iterable[Quad]) -> None:
        """Follow one committed update's exact delta (quads outside the latest graph are ignored)."""
        nodes = self.nodes
        for quad, iri in _of_nodes(removed):
            quads = nodes.get(iri)
            if quads is not None:
                self._discard(quads, quad)
                if not quads:  # a node deleted whole (retention's eviction) frees its slot
                    del nodes[iri]
        for quad, iri in _of_nodes(added):
            quads = nodes.get(iri)
            if quads is None:
                if not self.complete:
                    continue  # a node first seen in a delta may have unchanged triples we never saw
                if len(nodes) >= self.max_entries:
                    self.complete = False  # we stop tracking: absence can no longer be assumed
                    continue
                quads = nodes[iri] = {}
            self._add(quads, quad)


def _of_nodes(quads: Iterable[Quad]) -> Iterator[tuple[Quad, str]]:
    """The quads of the latest graph whose subject is an IRI (a node's), each with that IRI. Each
    quad's graph and subject are read once: a term read from a quad is a new Python object."""
    graph = _GRAPH
    for quad in quads:
        if quad.graph_name == graph:
            subject = quad.subject
            if isinstance(subject, NamedNode):
                yield quad, subject.value


def _quad(row: dict[str, Any]) -> Quad | None:
    """A row of LATEST_QUERY as its quad in the latest graph (None for what no node of ours holds)."""
    subject, predicate, obj = _term(row["latest"]), _term(row["p"]), _term(row["o"])
    if not isinstance(subject, NamedNode) or not isinstance(predicate, NamedNode):
        return None
    return Quad(subject, predicate, obj, _GRAPH)


def _term(value: Any) -> Any:
    return term_from_json(value) if isinstance(value, dict) else value
