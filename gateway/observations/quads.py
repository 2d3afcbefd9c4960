"""Observation updates as a public update syntax tree, for in-process clients (broker.api.Update).

The common batch (the mirror knows every latest node it touches, no payload carries a timestamp)
is ground but for the request's instant: its quads are built here directly, with `?now`, bound by
the engine clock's fn:now() in the WHERE clause, as the only variable. That is what the text of
`observation_update` says, quad for quad (the observation tests compare the deltas); skipping the
text and its parse more than halves the engine's work per reading.

A batch with timestamped readings (a sensor's own time: SenML `bt`/`t`) holds observations that
may already be stored (an MQTT redelivery, a sensor sending its buffer again), which keep their
first resultTime and sequence number. The text finds them with one OPTIONAL group per reading, and
pyoxigraph evaluates a chain of n OPTIONALs in O(n^2): 20 ms for 100, 330 ms for 400, ~2 s for the
1,000 readings of one update, so a backlog of SenML packs drained at 250-370 readings/s against
3,500 for untimed readings. Here `stored_query` asks for them first (one VALUES join, linear) and
`observation_quads(..., stored=...)` writes what it found as constants. The writer's lock keeps
the query and the update of a batch together; only retention pruning may delete one of those
observations in between, and the batch then writes it back with its first time, as the text
would have written it with a new one. Such a batch carries no digest (the digest has no source
time): the shipper reads its quads.

Other batches (a node the mirror does not know) need the WHERE clause of the text:
`observation_quads` returns None for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from pyoxigraph import Literal, NamedNode, Quad

from broker.api import Modify, QuadPattern, Update, Var, micros_to_datetime, term_from_json
from gateway.jsap.terms import TermError, quote
from gateway.observations.batch import LatestKey, Placed, plan
from gateway.observations.digest import DigestEntry, ObservationDigest
from gateway.observations.errors import PayloadError
from gateway.observations.iris import mapping_of_reading, observation_iri
from gateway.observations.latest import LatestCache
from gateway.observations.nquads import integer_text, literal_quads
from gateway.observations.reading import Reading
from gateway.observations.updates import finite_number, iri_text
from gateway.observations.vocabulary import (
    FN,
    GRAPH_LATEST,
    GRAPH_OBSERVATIONS,
    GW,
    HAS_MQTT_TOPIC,
    LATEST_VALUE,
    MADE_BY_MAPPING,
    QUDT,
    RDF_TYPE,
    SOSA,
    SOURCE_TIME,
)

NOW_WHERE = f"{{ BIND(<{FN}now>() AS ?now) }}"
_NOW = Var("now")
_OBSERVATIONS = NamedNode(GRAPH_OBSERVATIONS)
_LATEST = NamedNode(GRAPH_LATEST)
_A = NamedNode(RDF_TYPE)
_OBSERVATION = NamedNode(SOSA + "Observation")
_MADE_BY = NamedNode(SOSA + "madeBySensor")
_OBSERVED = NamedNode(SOSA + "observedProperty")
_FEATURE = NamedNode(SOSA + "hasFeatureOfInterest")
_RESULT_TIME = NamedNode(SOSA + "resultTime")
_RESULT = NamedNode(SOSA + "hasResult")
_SIMPLE_RESULT = NamedNode(SOSA + "hasSimpleResult")
_QUANTITY_VALUE = NamedNode(QUDT + "QuantityValue")
_NUMERIC_VALUE = NamedNode(QUDT + "numericValue")
_QUDT_UNIT = NamedNode(QUDT + "unit")
_SEQUENCE = NamedNode(GW + "sequenceNumber")
_LATEST_VALUE = NamedNode(LATEST_VALUE)
_L_SENSOR = NamedNode(GW + "sensor")
_L_PROPERTY = NamedNode(GW + "property")
_L_FEATURE = NamedNode(GW + "featureOfInterest")
_L_VALUE = NamedNode(GW + "value")
_L_UNIT = NamedNode(GW + "unit")
_L_RESULT_TIME = NamedNode(GW + "resultTime")
_L_OBSERVATION = NamedNode(GW + "observation")
_L_MAPPING = NamedNode(MADE_BY_MAPPING)
_SOURCE_TIME = NamedNode(SOURCE_TIME)
# N-Triples forms, for the lines of the quads with a literal object (gateway.observations.nquads)
_LATEST_TEXT = str(_LATEST)
_OBSERVATIONS_TEXT = str(_OBSERVATIONS)
_L_VALUE_TEXT = str(_L_VALUE)
_SEQUENCE_TEXT = str(_SEQUENCE)
_SIMPLE_RESULT_TEXT = str(_SIMPLE_RESULT)
_NUMERIC_VALUE_TEXT = str(_NUMERIC_VALUE)


@lru_cache(maxsize=65_536)
def _iri(iri: str) -> NamedNode:
    """Validated as the text validates it (TermError), built once per distinct IRI."""
    iri_text(iri)
    return NamedNode(iri)


@lru_cache(maxsize=65_536)
def _string(text: str) -> Literal:
    """A string literal, refused (TermError) where the text path refuses it; sources (topics) repeat."""
    quote(text)
    return Literal(text)


@lru_cache(maxsize=65_536)
def _string_text(text: str) -> str:
    """`_string(text)` in its N-Triples form."""
    return str(_string(text))


# (latest node, sensor, property, feature, unit, mapping) -> what `_node_quads` makes of them
_NodeKey = tuple[str, str, str, str, str | None, str]
_NodeQuads = tuple[NamedNode, tuple[Quad, ...], tuple[Quad, ...]]
# entries, emptied when full (as the mapper's topic cache): one is ~3.6 KB (pyoxigraph quads own
# copies of their terms' strings; 10,000 entries took 36 MB, measured 2026-12-07), so at most ~15 MB
# on a board of 1 GB; a deployment with more latest nodes in use than this gains nothing from it
NODE_CACHE_SIZE = 4_096
_node_cache: dict[_NodeKey, _NodeQuads] = {}


def _node_quads(node: str, reading: Reading, unit: str | None) -> _NodeQuads:
    """A latest node's term, and the quads of it every batch inserts with the same values: its type,
    sensor, property and feature (before the value), its unit and mapping (after the sequence).

    Why cached: they are the same for every reading of a sensor and property but for a change of
    feature, unit or mapping (all in the key), and making them (six quads, the node's IRI checked
    again, the sensor's device worked out) was ~10 us a reading on the event loop, where the MQTT
    ingest builds each batch; 1,000 readings/s are 100 sensors over and over (py-spy of the gateway
    in `nlphase.py` at 1,000 readings/s, 2026-12-07). Quads are immutable: shared, they cannot change.
    """
    key = (node, reading.sensor, reading.property, reading.feature, unit, reading.mapping)
    found = _node_cache.get(key)
    if found is not None:
        return found
    term = NamedNode(node)
    head = (
        Quad(term, _A, _LATEST_VALUE, _LATEST),
        Quad(term, _L_SENSOR, _iri(reading.sensor), _LATEST),
        Quad(term, _L_PROPERTY, _iri(reading.property), _LATEST),
        Quad(term, _L_FEATURE, _iri(reading.feature), _LATEST),
    )
    tail: list[Quad] = []
    if unit is not None:
        tail.append(Quad(term, _L_UNIT, _iri(unit), _LATEST))
    mapping = mapping_of_reading(reading)
    if mapping is not None:
        tail.append(Quad(term, _L_MAPPING, _string(mapping), _LATEST))
    found = (term, head, tuple(tail))
    if len(_node_cache) >= NODE_CACHE_SIZE:
        _node_cache.clear()
    _node_cache[key] = found
    return found


def _value(value: float | int | bool | str) -> Literal:
    """The literal the text's value parses to, in the store's canonical form.

    A float's Literal is the canonical xsd:double (checked against the store for 40,000 values by
    test_obs_quads.py), so no round trip through a scratch store is needed.
    """
    if isinstance(value, bool):
        return Literal(value)
    if isinstance(value, int | float):
        return Literal(finite_number(value))
    quote(value)
    return Literal(value)


def observation_quads(
    readings: Sequence[Reading],
    gateway_id: str,
    latest: LatestCache,
    *,
    source_property: str = HAS_MQTT_TOPIC,
    stored: Mapping[str, tuple[Any, Any]] | None = None,
) -> Update | None:
    """`observation_update` as an Update syntax tree, or None when the batch needs its WHERE clause.

    Same arguments, same PayloadError, same delta; it carries the batch's ObservationDigest unless
    a reading is timestamped. A batch with timestamped readings needs `stored` (`stored_terms` of
    the rows of `stored_query`): without it, None.
    """
    if not readings:
        raise ValueError("observation_quads needs at least one reading")
    timed = any(reading.source_time_us is not None for reading in readings)
    if timed and stored is None:
        return None
    try:
        keys, placed = plan(readings, gateway_id, latest)
        if not all(key.known for key in keys):
            return None
        operation, digest = _operation(keys, placed, latest, _iri(source_property), stored or {})
    except TermError as error:
        raise PayloadError(f"a reading cannot be written: {error}") from None
    return Update((operation,), None if timed else ObservationDigest(_OBSERVATIONS, tuple(digest)))


def stored_query(readings: Sequence[Reading], gateway_id: str) -> str | None:
    """The query for the resultTime and sequence number of the batch's timestamped observations
    that the store already holds (None when no reading is timestamped). Raises PayloadError for a
    reading no update can carry."""
    iris = {observation_iri(gateway_id, reading) for reading in readings if reading.source_time_us is not None}
    if not iris:
        return None
    try:
        values = " ".join(iri_text(iri) for iri in sorted(iris))
    except TermError as error:
        raise PayloadError(f"a reading cannot be written: {error}") from None
    return (
        f"SELECT ?o ?t ?n WHERE {{ VALUES ?o {{ {values} }} GRAPH <{GRAPH_OBSERVATIONS}> {{ "
        f"?o <{SOSA}resultTime> ?t ; <{GW}sequenceNumber> ?n }} }}"
    )


def stored_terms(rows: Iterable[dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    """The rows of `stored_query` (terms, or their JSON from a network transport) by observation IRI."""
    stored: dict[str, tuple[Any, Any]] = {}
    for row in rows:
        iri, time, sequence = (_term(row[name]) for name in "otn")
        stored[iri.value] = (time, sequence)
    return stored


def _term(value: Any) -> Any:
    return term_from_json(value) if isinstance(value, dict) else value


def _operation(
    keys: list[LatestKey],
    placed: list[Placed],
    latest: LatestCache,
    source: NamedNode,
    stored: Mapping[str, tuple[Any, Any]],
) -> tuple[Modify, list[DigestEntry]]:
    """The batch's operation, and its digest (gateway.observations.digest): the same values, flat.
    An observation in `stored` keeps the resultTime and sequence number it has."""
    delete: list[Quad] = []
    insert: list[Quad] = []
    timed: list[QuadPattern] = []
    digest: list[DigestEntry] = []
    first: dict[str, int] = {}
    lines: list[str] = []  # the quads with a literal object (gateway.observations.nquads)
    source_text = str(source)
    for key in keys:
        reading = key.reading
        unit = None if isinstance(reading.value, bool | str) else reading.unit
        node, head, tail = _node_quads(key.node, reading, unit)
        first[key.node] = latest.sequence(key.node)
        delete.extend(latest.changing_quads(key.node))
        insert += head
        insert.append(Quad(node, _L_OBSERVATION, NamedNode(key.observation), _LATEST))
        insert += tail
        sequence = integer_text(first[key.node] + key.count)
        lines.append(
            f"<{key.node}> {_L_VALUE_TEXT} {_value(reading.value)} {_LATEST_TEXT} .\n"
            f"<{key.node}> {_SEQUENCE_TEXT} {sequence} {_LATEST_TEXT} .\n"
        )
        timed.append(QuadPattern(node, _L_RESULT_TIME, _NOW, _LATEST))
    for item in placed:
        reading = item.reading
        node = NamedNode(item.iri)
        sequence = first[item.key.node] + item.position + 1
        insert += [
            Quad(node, _A, _OBSERVATION, _OBSERVATIONS),
            Quad(node, _MADE_BY, _iri(reading.sensor), _OBSERVATIONS),
            Quad(node, _OBSERVED, _iri(reading.property), _OBSERVATIONS),
            Quad(node, _FEATURE, _iri(reading.feature), _OBSERVATIONS),
        ]
        lines.append(f"<{item.iri}> {source_text} {_string_text(reading.source)} {_OBSERVATIONS_TEXT} .\n")
        if reading.source_time_us is not None:
            insert.append(Quad(node, _SOURCE_TIME, micros_to_datetime(reading.source_time_us), _OBSERVATIONS))
        kept = stored.get(item.iri)
        if kept is None:
            lines.append(f"<{item.iri}> {_SEQUENCE_TEXT} {integer_text(sequence)} {_OBSERVATIONS_TEXT} .\n")
            timed.append(QuadPattern(node, _RESULT_TIME, _NOW, _OBSERVATIONS))
        else:
            insert += [Quad(node, _RESULT_TIME, kept[0], _OBSERVATIONS), Quad(node, _SEQUENCE, kept[1], _OBSERVATIONS)]
        value = reading.value
        if isinstance(value, bool | str):
            simple = _value(value)
            lines.append(f"<{item.iri}> {_SIMPLE_RESULT_TEXT} {simple} {_OBSERVATIONS_TEXT} .\n")
            number, literal, unit = None, simple.value, None
        else:
            result = NamedNode(item.iri + "/result")
            insert += [
                Quad(node, _RESULT, result, _OBSERVATIONS),
                Quad(result, _A, _QUANTITY_VALUE, _OBSERVATIONS),
            ]
            lines.append(f"<{item.iri}/result> {_NUMERIC_VALUE_TEXT} {_value(value)} {_OBSERVATIONS_TEXT} .\n")
            if reading.unit is not None:
                insert.append(Quad(result, _QUDT_UNIT, _iri(reading.unit), _OBSERVATIONS))
            number, literal, unit = finite_number(value), None, reading.unit
        digest.append(
            DigestEntry(
                item.iri,
                reading.sensor,
                reading.property,
                reading.feature,
                number,
                literal,
                unit,
                sequence,
                reading.source,
            )
        )
    operation = Modify(delete=tuple(delete), insert=(*insert, *literal_quads(lines), *timed), where=NOW_WHERE)
    return operation, digest
