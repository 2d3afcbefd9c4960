"""Observations graph rows -> flat records, the schema the cloud landing endpoint accepts.

The shipper subscribes to every triple of the observations graph (a graph feed: the engine serves
it from each update's delta, see broker.core.spu.GraphFeedSpu), so a notification holds the triples
of the observations an update added; all of one observation's triples come in the same update.
They are grouped by subject here: the observation node and its `<obs>/result` quantity value.

Three entries, one result: :func:`assemble` takes rows of terms (any transport);
:func:`assemble_feed` takes the in-process feed's :class:`~broker.core.notification.QuadRows` and
reads each quad once, taking only the strings a record needs (~11 quads per observation, each a
cache miss on first touch); :func:`assemble_digest` reads none, when the feed carries the batch's
digest (gateway.observations.digest: an observation batch stored in full), which says the same.

A record (one JSON line): id, sensor, property, feature, value (double) or literal (text), unit,
result_time, source_time (RFC 3339 UTC, microseconds), sequence, gateway, source.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from json.encoder import encode_basestring
from typing import Any

from broker.api import QuadRows, rfc3339
from gateway.observations.digest import ObservationDigest
from gateway.observations.vocabulary import (
    GRAPH_OBSERVATIONS,
    HAS_COAP_RESOURCE,
    HAS_MQTT_TOPIC,
    QUDT,
    RDF_TYPE,
    SEQUENCE_NUMBER,
    SOSA,
    SOURCE_TIME,
)
from gateway.shipper.contract import record_problem

FEED_QUERY = f"SELECT ?s ?p ?o WHERE {{ GRAPH <{GRAPH_OBSERVATIONS}> {{ ?s ?p ?o }} }}"

OBSERVATION = SOSA + "Observation"
HAS_RESULT = SOSA + "hasResult"
MADE_BY_SENSOR = SOSA + "madeBySensor"
OBSERVED_PROPERTY = SOSA + "observedProperty"
HAS_FEATURE = SOSA + "hasFeatureOfInterest"
RESULT_TIME = SOSA + "resultTime"
HAS_SIMPLE_RESULT = SOSA + "hasSimpleResult"
NUMERIC_VALUE = QUDT + "numericValue"
UNIT = QUDT + "unit"
_WANTED = frozenset(
    (RDF_TYPE, HAS_RESULT, MADE_BY_SENSOR, OBSERVED_PROPERTY, HAS_FEATURE, RESULT_TIME, SOURCE_TIME, SEQUENCE_NUMBER)
    + (HAS_MQTT_TOPIC, HAS_COAP_RESOURCE, HAS_SIMPLE_RESULT, NUMERIC_VALUE, UNIT)
)
_NOTHING: dict[str, str] = {}


@lru_cache(maxsize=4096)  # an update's observations share one resultTime
def rfc3339_micros(lexical: str) -> str:
    """An xsd:dateTime lexical form as RFC 3339 UTC with exactly six fraction digits (one format
    for the Spark job to parse, whatever the store's canonical form trimmed)."""
    instant = datetime.fromisoformat(lexical)
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=UTC)
    return instant.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Assembled:
    """The records of one notification, and how many observations could not be flattened."""

    __slots__ = ("records", "incomplete", "from_digest")

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.incomplete = 0
        self.from_digest = False  # built from the batch's digest, not read from its quads


def assemble(rows: Iterable[Sequence[Any]], gateway: str) -> Assembled:
    """Flatten the observations among `rows` ((s, p, o) terms); results and anything else are joined
    to their observation or ignored. An observation missing a required term is counted, not shipped."""
    if isinstance(rows, QuadRows) and rows.order == (0, 1, 2):
        digest = rows.digest
        if isinstance(digest, ObservationDigest) and rows.instant_us is not None:
            return assemble_digest(digest, rows.instant_us, gateway)
        return assemble_feed(rows, gateway)
    subjects: dict[str, dict[str, str]] = {}
    for subject, predicate, obj in rows:
        _note(subjects, subject.value, predicate.value, obj.value)
    return _records(subjects, gateway)


def assemble_feed(rows: QuadRows, gateway: str) -> Assembled:
    """:func:`assemble` over a graph feed's quads, in one pass that reads a term only if needed."""
    subjects: dict[str, dict[str, str]] = {}
    graph = rows.graph
    for subject, predicate, obj, graph_name in rows.source:  # one call makes the four terms
        if graph is not None and graph_name != graph:
            continue
        iri = predicate.value
        if iri in _WANTED:  # inline, not _note(): this loop runs ~11 times per observation
            value = obj.value
            if iri == RDF_TYPE and value != OBSERVATION:
                continue
            key = subject.value
            terms = subjects.get(key)
            if terms is None:
                terms = subjects[key] = {}
            terms[iri] = value
    return _records(subjects, gateway)


def assemble_digest(digest: ObservationDigest, instant_us: int, gateway: str) -> Assembled:
    """The records of a batch from its digest (gateway.observations.digest): the values its quads
    hold, without reading the quads. Every observation of a digest is complete, and none has a
    source time (batches with source times are written as text, without a digest)."""
    out = Assembled()
    out.from_digest = True
    result_time = rfc3339(instant_us)
    out.records = [
        {
            "id": entry.iri,
            "sensor": entry.sensor,
            "property": entry.property,
            "feature": entry.feature,
            "value": entry.value,
            "literal": entry.literal,
            "unit": entry.unit,
            "result_time": result_time,
            "source_time": None,
            "sequence": entry.sequence,
            "gateway": gateway,
            "source": entry.source,
        }
        for entry in digest.entries
    ]
    return out


def _note(subjects: dict[str, dict[str, str]], subject: str, predicate: str, value: str) -> None:
    """Keep one triple's value under its subject; of the types, only sosa:Observation matters."""
    if predicate == RDF_TYPE and value != OBSERVATION:
        return
    terms = subjects.get(subject)
    if terms is None:
        terms = subjects[subject] = {}
    terms[predicate] = value


def _records(subjects: dict[str, dict[str, str]], gateway: str) -> Assembled:
    out = Assembled()
    for iri, terms in subjects.items():
        if RDF_TYPE not in terms:
            continue
        result = terms.get(HAS_RESULT)
        try:
            record = _record(iri, terms, _NOTHING if result is None else subjects.get(result, _NOTHING), gateway)
        except (KeyError, ValueError, OverflowError):  # OverflowError: a time whose UTC is outside years 1-9999
            out.incomplete += 1
            continue
        if record_problem(record) is None:  # clients write this graph too (gateway.shipper.contract)
            out.records.append(record)
        else:
            out.incomplete += 1
    return out


def _record(iri: str, terms: dict[str, str], result: dict[str, str], gateway: str) -> dict[str, Any]:
    """One observation's record; KeyError, ValueError or OverflowError when it cannot be flattened (the
    caller then checks the rest of the contract)."""
    value = result.get(NUMERIC_VALUE)
    literal = terms.get(HAS_SIMPLE_RESULT)
    if (value is None) == (literal is None):
        raise ValueError("an observation has one result: a number or a literal")
    number = None if value is None else float(value)
    if number is not None and not math.isfinite(number):
        raise ValueError("JSON has no NaN or infinity")
    source = terms.get(HAS_COAP_RESOURCE)
    source_time = terms.get(SOURCE_TIME)
    return {
        "id": iri,
        "sensor": terms[MADE_BY_SENSOR],
        "property": terms[OBSERVED_PROPERTY],
        "feature": terms[HAS_FEATURE],
        "value": number,
        "literal": literal,
        "unit": result.get(UNIT),
        "result_time": rfc3339_micros(terms[RESULT_TIME]),
        "source_time": None if source_time is None else rfc3339_micros(source_time),
        "sequence": int(terms[SEQUENCE_NUMBER]),
        "gateway": gateway,
        "source": terms[HAS_MQTT_TOPIC] if source is None else source,
    }


def json_line(record: dict[str, Any]) -> bytes:
    """One record as a compact JSON line (UTF-8), the bytes ``json.dumps(record, ensure_ascii=False,
    separators=(",", ":"))`` gives, written out field by field (a third of its CPU time)."""
    value, literal, unit, source_time = record["value"], record["literal"], record["unit"], record["source_time"]
    return (
        f'{{"id":{encode_basestring(record["id"])},"sensor":{encode_basestring(record["sensor"])},'
        f'"property":{encode_basestring(record["property"])},"feature":{encode_basestring(record["feature"])},'
        f'"value":{"null" if value is None else repr(value)},'
        f'"literal":{"null" if literal is None else encode_basestring(literal)},'
        f'"unit":{"null" if unit is None else encode_basestring(unit)},'
        f'"result_time":{encode_basestring(record["result_time"])},'
        f'"source_time":{"null" if source_time is None else encode_basestring(source_time)},'
        f'"sequence":{int(record["sequence"])},"gateway":{encode_basestring(record["gateway"])},'
        f'"source":{encode_basestring(record["source"])}}}\n'
    ).encode()


def key_of(record: dict[str, Any]) -> str:
    """The resume cursor's key: sequence numbers count per sensor and property (IRIs hold no space)."""
    return f"{record['sensor']} {record['property']}"
