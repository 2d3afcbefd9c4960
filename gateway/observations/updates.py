"""SPARQL updates for observations: one update per batch of readings, and retention pruning.

`observation_update` writes ONE DELETE/INSERT/WHERE operation (the engine's single-operation
path): the INSERT template holds every observation and the new latest node per (sensor,
property); the DELETE template removes the old latest triples as constants taken from the
LatestCache mirror. Keys the mirror does not know fall back to one OPTIONAL group per key in the
WHERE clause; each matches at most one row (a latest node has one value of each term), so the
WHERE clause always has exactly one solution and the templates are instantiated once.

The text is kept short because the engine's parse time grows with it: PREFIXes for the IRIs a
batch repeats (sensors, properties, features, units), bare `21.5e0` doubles. Times come from the
engine clock (`fn:now()`), never the adapter's.

Each observation gets `gw:sequenceNumber` (1, 2, 3... per sensor and property; the latest node
holds the last one), which lets retention (`pruning`) keep the newest N per sensor and property
with one linear join instead of ranking observations by time.

Every IRI is validated (gateway.jsap.terms.iri_term) and written inside `<>` once, in a PREFIX
declaration; every string is escaped by `quote`: a topic or payload cannot change the structure
of the update, whatever its characters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import lru_cache

from broker.api import rfc3339
from gateway.jsap.terms import TermError, iri_term, quote
from gateway.observations.batch import plan
from gateway.observations.errors import PayloadError
from gateway.observations.iris import mapping_of_reading
from gateway.observations.latest import LatestCache
from gateway.observations.reading import Reading
from gateway.observations.vocabulary import (
    FN,
    GRAPH_LATEST,
    GRAPH_OBSERVATIONS,
    GW,
    HAS_MQTT_TOPIC,
    LATEST_PREFIX,
    OBSERVATION_PREFIX,
    QUDT,
    SOSA,
    XSD,
)

PROLOGUE = (
    f"PREFIX s: <{SOSA}>\nPREFIX q: <{QUDT}>\nPREFIX g: <{GW}>\nPREFIX x: <{XSD}>\n"
    f"PREFIX o: <{OBSERVATION_PREFIX}>\nPREFIX l: <{LATEST_PREFIX}>\n"
)
_OLD_TERMS = ("value", "observation", "featureOfInterest", "resultTime", "sequenceNumber")


@lru_cache(maxsize=65_536)
def iri_text(iri: str) -> str:
    """`<iri>`, validated once per distinct IRI (readings repeat the same few sensors)."""
    return iri_term(iri).text


def finite_number(value: float | int) -> float:
    """A numeric reading value as the double it is stored as; PayloadError if no double can hold it."""
    try:
        number = float(value)
    except OverflowError:
        raise PayloadError("a reading value is out of range") from None
    if not math.isfinite(number):
        raise PayloadError("a reading value must be a finite number")
    return number


def value_text(value: float | int | bool | str) -> str:
    """The literal for a reading value: an xsd:double (`21.5e0`), `true`/`false`, or a string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        text = repr(finite_number(value))
        return text if "e" in text else text + "e0"
    return quote(value)


_XSD_SUFFIX = re.compile(r"\^\^<http://www\.w3\.org/2001/XMLSchema#([A-Za-z]+)>$")


def _short(term: str) -> str:
    """A term from the mirror (N-Triples, written by pyoxigraph) in the batch's short names."""
    if term.startswith("<" + OBSERVATION_PREFIX) and term.endswith(">") and "/" not in term:
        return "o:" + term[len(OBSERVATION_PREFIX) + 1 : -1]
    if term.startswith("<" + GW) and term[len(GW) + 1 : -1].isalnum():
        return "g:" + term[len(GW) + 1 : -1]
    return _XSD_SUFFIX.sub(r"^^x:\1", term) if term.startswith('"') else term


def _numeric(reading: Reading) -> bool:
    return not isinstance(reading.value, bool | str)


class _Names:
    """PREFIX declarations for the IRIs a batch repeats: each is written (validated) once."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.declarations: list[str] = []

    def __call__(self, iri: str) -> str:
        name = self.names.get(iri)
        if name is None:
            name = self.names[iri] = f"i{len(self.names)}:"
            self.declarations.append(f"PREFIX {name} {iri_text(iri)}\n")
        return name


def observation_update(
    readings: Sequence[Reading],
    gateway_id: str,
    latest: LatestCache,
    *,
    source_property: str = HAS_MQTT_TOPIC,
) -> str:
    """ONE SPARQL update inserting every reading's observation and moving the latest view in place.

    A repeated observation IRI in the batch keeps its last reading; of several readings of one
    (sensor, property), the last becomes the latest value. `source_property` is gw:hasMqttTopic
    (default) or gw:hasCoapResource. Raises PayloadError for a reading no update can carry (an
    invalid IRI, a non-finite number); Mapper readings never are. After the commit, feed the
    engine's delta to `latest.apply(added, removed)`.
    """
    if not readings:
        raise ValueError("observation_update needs at least one reading")
    try:
        return _build(readings, gateway_id, latest, source_property)
    except TermError as error:
        raise PayloadError(f"a reading cannot be written: {error}") from None


def _build(readings: Sequence[Reading], gateway_id: str, cache: LatestCache, source_property: str) -> str:
    keys, placed = plan(readings, gateway_id, cache)
    names = _Names()
    source = names(source_property)
    delete: list[str] = []
    insert: list[str] = []
    where: list[str] = [f"BIND(<{FN}now>() AS ?now)"]
    for key in keys:
        local = "l:" + key.node.removeprefix(LATEST_PREFIX)
        reading = key.reading
        if key.known:
            delete.extend(
                f"{local} {_short(iri_text(predicate))} {_short(obj)} .\n"
                for predicate, obj in cache.changing(key.node)
            )
            sequence = str(cache.sequence(key.node) + key.count)
        else:
            n = key.number
            delete.append(
                f"{local} g:value ?v{n} ; g:observation ?o{n} ; g:featureOfInterest ?f{n} ; "
                f"g:resultTime ?t{n} ; g:sequenceNumber ?s{n} ; g:unit ?u{n} .\n"
            )
            where.append(
                f"OPTIONAL {{ GRAPH <{GRAPH_LATEST}> {{ {local} g:value ?v{n} ; g:observation ?o{n} ; "
                f"g:featureOfInterest ?f{n} ; g:resultTime ?t{n} ; g:sequenceNumber ?s{n} "
                f"OPTIONAL {{ {local} g:unit ?u{n} }} }} }}\n"
                f"BIND(COALESCE(?s{n}, 0) AS ?b{n})\n"
            )
            sequence = f"?n{n}"
            where.append(f"BIND(?b{n} + {key.count} AS ?n{n})\n")
        unit = f"g:unit {names(reading.unit)} ; " if reading.unit is not None and _numeric(reading) else ""
        mapping = mapping_of_reading(reading)
        unit += f"g:mapping {quote(mapping)} ; " if mapping is not None else ""
        insert.append(
            f"{local} a g:LatestValue ; g:sensor {names(reading.sensor)} ; g:property {names(reading.property)} ; "
            f"g:featureOfInterest {names(reading.feature)} ; g:value {value_text(reading.value)} ; {unit}"
            f"g:resultTime ?now ; g:observation o:{key.observation.removeprefix(OBSERVATION_PREFIX)} ; "
            f"g:sequenceNumber {sequence} .\n"
        )
    latest_part = "".join(insert)
    insert.clear()
    for index, item in enumerate(placed):
        key = item.key
        if key.known:
            sequence = str(cache.sequence(key.node) + item.position + 1)
        else:
            sequence = f"?q{index}"
            where.append(f"BIND(?b{key.number} + {item.position + 1} AS ?q{index})\n")
        insert.append(_observation(item.iri, item.reading, sequence, source, index, names, where))
    return "".join(
        [
            PROLOGUE,
            *names.declarations,
            f"DELETE {{ GRAPH <{GRAPH_LATEST}> {{\n",
            *delete,
            f"}} }}\nINSERT {{ GRAPH <{GRAPH_OBSERVATIONS}> {{\n",
            *insert,
            f"}}\nGRAPH <{GRAPH_LATEST}> {{\n",
            latest_part,
            "} }\nWHERE {\n",
            *where,
            "}\n",
        ]
    )


def _observation(
    iri: str, reading: Reading, sequence: str, source: str, index: int, names: _Names, where: list[str]
) -> str:
    """One observation's triples. A timestamped one may already exist (an MQTT redelivery): it then
    keeps its first resultTime and sequence number, so writing it again changes nothing."""
    node = "o:" + iri.removeprefix(OBSERVATION_PREFIX)
    result_time = "?now"
    source_time = ""
    if reading.source_time_us is not None:
        where.append(
            f"OPTIONAL {{ GRAPH <{GRAPH_OBSERVATIONS}> {{ {node} s:resultTime ?e{index} ; "
            f"g:sequenceNumber ?g{index} }} }}\n"
            f"BIND(COALESCE(?e{index}, ?now) AS ?r{index})\nBIND(COALESCE(?g{index}, {sequence}) AS ?k{index})\n"
        )
        result_time, sequence = f"?r{index}", f"?k{index}"
        source_time = f'g:sourceTime "{rfc3339(reading.source_time_us)}"^^x:dateTime ; '
    head = (
        f"{node} a s:Observation ; s:madeBySensor {names(reading.sensor)} ; "
        f"s:observedProperty {names(reading.property)} ; s:hasFeatureOfInterest {names(reading.feature)} ; "
        f"s:resultTime {result_time} ; g:sequenceNumber {sequence} ; {source} {quote(reading.source)} ; {source_time}"
    )
    if not _numeric(reading):
        return f"{head}s:hasSimpleResult {value_text(reading.value)} .\n"
    result = iri_text(iri + "/result")
    unit = f" ; q:unit {names(reading.unit)}" if reading.unit is not None else ""
    value = value_text(reading.value)
    return f"{head}s:hasResult {result} .\n{result} a q:QuantityValue ; q:numericValue {value}{unit} .\n"
