"""The ontology files and the vocabulary the code writes.

What it protects: every ontologies/*.ttl parses (pyoxigraph), loading replaces the ontologies
graph without duplicates, every gw: term and QUDT unit the code can write is declared, and the
observable properties in gateway.ttl match the Python table (kinds.py).
"""

from __future__ import annotations

from pyoxigraph import NamedNode, RdfFormat, parse

from broker.api import Engine
from gateway.observations import ontology_update
from gateway.observations.kinds import KINDS, UNITS
from gateway.observations.ontologies import ONTOLOGY_DIR, ontology_files
from gateway.observations.vocabulary import (
    COAP_OBSERVATION,
    COAP_OBSERVATION_TERMS,
    GRAPH_ONTOLOGIES,
    GW,
    LATEST_TERMS,
    MAPPING_TERMS,
    QUDT,
    SOSA,
)

RDF_TYPE = NamedNode("http://www.w3.org/1999/02/22-rdf-syntax-ns#type")


def triples(name: str) -> set[tuple[str, str, str]]:
    return {
        (t.subject.value, t.predicate.value, getattr(t.object, "value", ""))
        for t in parse(path=str(ONTOLOGY_DIR / name), format=RdfFormat.TURTLE)
    }


def declared(name: str) -> set[str]:
    return {s for s, p, _ in triples(name) if p == RDF_TYPE.value}


def test_files_parse_and_load_idempotently() -> None:
    assert [path.name for path in ontology_files()] == ["gateway.ttl", "qudt.ttl", "sosa.ttl", "time.ttl"]
    engine = Engine()
    first = engine.update(ontology_update())
    again = engine.update(ontology_update())
    assert len(first.added) > 500 and not again.added and not again.removed
    graphs = {row[0].value for row in engine.query("SELECT DISTINCT ?g WHERE { GRAPH ?g { ?s ?p ?o } }").rows}
    assert graphs == {GRAPH_ONTOLOGIES}


def test_gateway_terms_are_declared() -> None:
    gateway = declared("gateway.ttl")
    used = {GW + term for term in (*LATEST_TERMS, *MAPPING_TERMS, *COAP_OBSERVATION_TERMS)} | {COAP_OBSERVATION} | {
        GW + t for t in ("hasMqttTopic", "hasCoapResource", "sourceTime", "sequenceNumber", "LatestValue",
                         "TopicMapping", "FieldMapping", "defaultUnit")
    }  # fmt: skip
    assert used <= gateway


def test_observable_properties_match_kinds_table() -> None:
    facts = triples("gateway.ttl")
    for kind in KINDS:
        assert (kind.iri, RDF_TYPE.value, SOSA + "ObservableProperty") in facts
        if kind.quantity_kind:
            assert (kind.iri, QUDT + "hasQuantityKind", kind.quantity_kind) in facts
            assert (kind.iri, GW + "defaultUnit", kind.default_unit) in facts
    properties = {s for s, p, o in facts if p == RDF_TYPE.value and o == SOSA + "ObservableProperty"}
    assert properties == {kind.iri for kind in KINDS}


def test_units_and_quantity_kinds_are_declared() -> None:
    qudt = triples("qudt.ttl")
    units = {s for s, p, o in qudt if p == RDF_TYPE.value and o == QUDT + "Unit"}
    kinds = {s for s, p, o in qudt if p == RDF_TYPE.value and o == QUDT + "QuantityKind"}
    assert units == set(UNITS)
    assert {kind.quantity_kind for kind in KINDS if kind.quantity_kind} <= kinds


def test_sosa_terms_used_are_declared() -> None:
    sosa = declared("sosa.ttl")
    used = ("Observation", "Sensor", "ObservableProperty", "FeatureOfInterest", "madeBySensor", "observedProperty",
            "hasFeatureOfInterest", "hasResult", "hasSimpleResult", "resultTime")  # fmt: skip
    assert {SOSA + term for term in used} <= sosa
