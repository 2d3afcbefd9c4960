"""The IRIs the observation layer writes: namespaces, the four named graphs, and the gw: terms.

One place for them so that the update text, the ontology files and the tests cannot drift apart
(tests/gateway/observations/test_obs_ontologies.py checks that gateway.ttl declares every gw: term used here).
"""

from __future__ import annotations

GW = "http://w3id.org/sepa-gateway/ns#"
FN = "http://w3id.org/sepa-gateway/fn#"
SOSA = "http://www.w3.org/ns/sosa/"
SSN = "http://www.w3.org/ns/ssn/"
QUDT = "http://qudt.org/schema/qudt/"
UNIT = "http://qudt.org/vocab/unit/"
QUANTITY_KIND = "http://qudt.org/vocab/quantitykind/"
TIME = "http://www.w3.org/2006/time#"
XSD = "http://www.w3.org/2001/XMLSchema#"
RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"

GRAPH_ONTOLOGIES = "http://w3id.org/sepa-gateway/graph/ontologies"
GRAPH_MAPPINGS = "http://w3id.org/sepa-gateway/graph/mappings"
GRAPH_OBSERVATIONS = "http://w3id.org/sepa-gateway/graph/observations"
GRAPH_LATEST = "http://w3id.org/sepa-gateway/graph/latest"
GRAPH_STATE = "http://w3id.org/sepa-gateway/graph/state"  # the gateway's own bookkeeping (the shipper's marker)

# Instance IRIs minted by the gateway (observations, latest nodes, mappings, profile sensors).
URN = "urn:sepa-gateway:"
OBSERVATION_PREFIX = URN + "obs:"
LATEST_PREFIX = URN + "latest:"
SHIPPER_NODE = URN + "shipper"

# The cloud shipper's marker: which spool counted this store's observations.
SPOOL_ID = GW + "spoolId"
MAPPING_PREFIX = URN + "mapping:"

# Observation provenance (the paper's arces-monitor:hasMqttTopic, in our namespace).
HAS_MQTT_TOPIC = GW + "hasMqttTopic"
# on a latest node of a sensor a deployment's own mapping made: that mapping's id (gateway.observations.latest)
MADE_BY_MAPPING = GW + "mapping"
HAS_COAP_RESOURCE = GW + "hasCoapResource"
SOURCE_TIME = GW + "sourceTime"
SEQUENCE_NUMBER = GW + "sequenceNumber"

# Latest-value view.
LATEST_VALUE = GW + "LatestValue"
LATEST_TERMS = ("sensor", "property", "featureOfInterest", "value", "unit", "resultTime", "observation")

# Observable properties and the unit a bare number is taken in.
DEFAULT_UNIT = GW + "defaultUnit"

# Topic mappings (the Topics Manager).
TOPIC_MAPPING = GW + "TopicMapping"
FIELD_MAPPING = GW + "FieldMapping"
MAPPING_TERMS = (
    "mappingId",
    "topicFilter",
    "extract",
    "jsonPath",
    "pattern",
    "trueWords",
    "falseWords",
    "sensorTemplate",
    "propertyTemplate",
    "featureTemplate",
    "unit",
    "timePath",
    "order",
    "field",
    "key",
)

# CoAP resources the gateway observes (RFC 7641), kept in the mappings graph next to the topic mappings:
# <node> a gw:CoapObservation ; gw:uri "coap://host:port/path" ; gw:source "s/boiler/temperature" (optional).
COAP_OBSERVATION = GW + "CoapObservation"
COAP_OBSERVATION_TERMS = ("uri", "source")
