"""Observation mapping shared by the MQTT and CoAP adapters: messages -> readings -> SOSA/QUDT updates.

Protocol-neutral: nothing here knows MQTT or CoAP. Layout: `mapping` (the declarative Mapping),
`mapping_config` (the TOML array), `compiler` (checks and compiles a mapping), `sources` (source
filters with captures, IRI templates), `payloads`, `extractors` (the registry of ways to read a
value; adapters add their ecosystems' own), `senml`, `mapper` (source -> readings), `batch` /
`updates` / `quads` / `latest` / `iris` / `pruning` (updates for the store, as SPARQL text or as a
public update syntax tree), `rdf` (the Topics Manager), `ontologies` (loading ontologies/*.ttl), `kinds` and
`vocabulary` (names and IRIs).
"""

from gateway.observations.errors import MappingError, NodeLimit, PayloadError, UnmappedTopic
from gateway.observations.iris import latest_iri, observation_iri
from gateway.observations.latest import LATEST_QUERY, LatestCache, nodes_query
from gateway.observations.mapper import Mapper
from gateway.observations.mapping import FieldMap, Mapping
from gateway.observations.mapping_config import mappings_from_config
from gateway.observations.ontologies import ontology_update
from gateway.observations.quads import observation_quads
from gateway.observations.rdf import MAPPINGS_QUERY, mappings_from_rdf, mappings_to_rdf, mappings_update
from gateway.observations.reading import Reading
from gateway.observations.updates import observation_update

__all__ = [
    "LATEST_QUERY",
    "MAPPINGS_QUERY",
    "FieldMap",
    "LatestCache",
    "Mapper",
    "Mapping",
    "MappingError",
    "NodeLimit",
    "PayloadError",
    "Reading",
    "UnmappedTopic",
    "latest_iri",
    "mappings_from_config",
    "mappings_from_rdf",
    "mappings_to_rdf",
    "mappings_update",
    "nodes_query",
    "observation_iri",
    "observation_quads",
    "observation_update",
    "ontology_update",
]
