"""Mappings as RDF in the mappings graph: the paper's Topics Manager.

Anyone can add, change or remove a mapping with a SPARQL update on the mappings graph; the adapter
subscribes to MAPPINGS_QUERY, keeps the current rows (added minus removed), and rebuilds its
Mapper from `mappings_from_rdf(rows)` on every notification. Shape of one mapping:

    <urn:sepa-gateway:mapping:kitchen-temp> a gw:TopicMapping ;
        gw:mappingId "kitchen-temp" ; gw:topicFilter "home/kitchen/temp" ; gw:extract "number" ;
        gw:sensorTemplate "urn:example:kitchen-thermometer" ; gw:propertyTemplate "temperature" ;
        gw:unit "degC" ; gw:order 0 .

Optional: gw:featureTemplate, gw:jsonPath, gw:pattern, gw:trueWords / gw:falseWords (words
separated by spaces), gw:timePath, gw:field (nodes with gw:key, gw:propertyTemplate, gw:unit).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from gateway.jsap.terms import iri_term, quote
from gateway.observations.compiler import compile_mapping
from gateway.observations.errors import MappingError
from gateway.observations.mapping import FieldMap, Mapping
from gateway.observations.payloads import DEFAULT_FALSE_WORDS, DEFAULT_TRUE_WORDS
from gateway.observations.sources import encode
from gateway.observations.vocabulary import GRAPH_MAPPINGS, GW, MAPPING_PREFIX

_SINGLE = {
    "id": "mappingId",
    "topic": "topicFilter",
    "extract": "extract",
    "sensor": "sensorTemplate",
    "property": "propertyTemplate",
    "feature": "featureTemplate",
    "unit": "unit",
    "path": "jsonPath",
    "pattern": "pattern",
    "true_words": "trueWords",
    "false_words": "falseWords",
    "time_path": "timePath",
    "order": "order",
}
_REQUIRED = ("mappingId", "topicFilter", "extract")

# One row per triple of a mapping (?field unbound) or of one of its fields. Why not one OPTIONAL per
# attribute: their results multiply, and one mapping node with 3 values for each of its 10 optional
# attributes (a 1.5 KB update) made 59,049 rows, 1.8 s of the broker's time; 4 values each would have
# made 1,048,576. As triples, a mapping costs its size. The broker joins patterns in the order written:
# the changed triple's own pattern first, then the lookups it binds (type first: 13 s for 1,000 mappings).
MAPPINGS_QUERY = (
    "SELECT ?mapping ?field ?p ?o WHERE {\n"
    + f"  GRAPH <{GRAPH_MAPPINGS}> {{\n"
    + f"    {{ ?mapping ?p ?o . ?mapping a <{GW}TopicMapping> }}\n"
    + f"    UNION {{ ?field ?p ?o . ?mapping <{GW}field> ?field . ?mapping a <{GW}TopicMapping> }}\n"
    + "  }\n}"
)


def mapping_iri(mapping_id: str) -> str:
    return MAPPING_PREFIX + encode(mapping_id).replace("/", "%2F")


def mappings_to_rdf(mappings: Iterable[Mapping]) -> str:
    """The mappings as Turtle-compatible N-Triples lines (for INSERT DATA into the mappings graph)."""
    lines: list[str] = []
    for mapping in mappings:
        node = iri_term(mapping_iri(mapping.id)).text
        lines.append(f"{node} <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> <{GW}TopicMapping> .")
        for attribute, predicate in _SINGLE.items():
            value = getattr(mapping, attribute)
            if attribute in ("true_words", "false_words"):
                default = DEFAULT_TRUE_WORDS if attribute == "true_words" else DEFAULT_FALSE_WORDS
                if tuple(value) == default:
                    continue
                value = " ".join(value)
            if value is None or value == "" or (attribute == "order" and value == 0):
                continue
            literal = f'"{value}"^^<http://www.w3.org/2001/XMLSchema#integer>' if attribute == "order" else quote(value)
            lines.append(f"{node} <{GW}{predicate}> {literal} .")
        for index, item in enumerate(mapping.fields):
            field_node = iri_term(f"{mapping_iri(mapping.id)}/field/{index}").text
            lines.append(f"{node} <{GW}field> {field_node} .")
            lines.append(f"{field_node} <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> <{GW}FieldMapping> .")
            lines.append(f"{field_node} <{GW}key> {quote(item.key)} .")
            lines.append(f"{field_node} <{GW}propertyTemplate> {quote(item.property)} .")
            if item.unit is not None:
                lines.append(f"{field_node} <{GW}unit> {quote(item.unit)} .")
    return "\n".join(lines) + ("\n" if lines else "")


def mappings_update(mappings: Sequence[Mapping]) -> str:
    """An update (re)writing these mappings in the mappings graph, leaving the others alone."""
    graph = f"<{GRAPH_MAPPINGS}>"
    operations = []
    for mapping in mappings:
        node = iri_term(mapping_iri(mapping.id)).text
        operations.append(f"DELETE WHERE {{ GRAPH {graph} {{ {node} <{GW}field> ?field . ?field ?p ?o }} }}")
        operations.append(f"DELETE WHERE {{ GRAPH {graph} {{ {node} ?p ?o }} }}")
    operations.append(f"INSERT DATA {{ GRAPH {graph} {{\n{mappings_to_rdf(mappings)}}} }}")
    return " ;\n".join(operations)


def mappings_from_rdf(rows: Iterable[dict[str, Any]], errors: list[MappingError] | None = None) -> list[Mapping]:
    """Mappings from the rows of MAPPINGS_QUERY (terms, SPARQL JSON objects or plain strings).

    A node without gw:mappingId, gw:topicFilter or gw:extract is not a mapping yet (being written)
    and is skipped. A mapping that cannot work raises MappingError naming it; with an `errors`
    list, it is appended there and skipped instead, so one bad edit does not stop the others.
    Mappings of one id on several nodes are such an error, all of them (which one was meant is
    not known): before, the Mapper refused the whole set, and the adapters ignored every later
    change of the mappings graph until the duplicate went (any client that may write that graph
    could so freeze the mappings).
    """
    grouped: dict[str, dict[str | None, dict[str, set[str]]]] = {}
    for row in rows:
        field = row.get("field")
        node = grouped.setdefault(_text(row["mapping"]), {})
        values = node.setdefault(None if field is None else _text(field), {})
        values.setdefault(_text(row["p"]), set()).add(_text(row["o"]))
    mappings: list[Mapping] = []
    for node, triples in grouped.items():
        own = triples.get(None, {})
        if not all(GW + name in own for name in _REQUIRED):
            continue
        try:
            mappings.append(_mapping(node, own, {field: values for field, values in triples.items() if field}))
        except MappingError as error:
            if errors is None:
                raise
            errors.append(error)
    nodes = Counter(mapping.id for mapping in mappings)
    shared = sorted(identifier for identifier, count in nodes.items() if count > 1)
    for identifier in shared:
        error = MappingError(f"mapping id {identifier!r} is on {nodes[identifier]} mapping nodes: none of them is used")
        if errors is None:
            raise error
        errors.append(error)
    return [mapping for mapping in mappings if nodes[mapping.id] == 1] if shared else mappings


def _one(values: dict[str, set[str]], name: str, what: str) -> str | None:
    found = values.get(GW + name, set())
    if len(found) > 1:
        raise MappingError(f"{what}: {len(found)} values for gw:{name}, expected one")
    return next(iter(found), None)


def _mapping(node: str, own: dict[str, set[str]], field_triples: dict[str, dict[str, set[str]]]) -> Mapping:
    values: dict[str, Any] = {}
    for attribute, name in _SINGLE.items():
        value = _one(own, name, f"mapping <{node}>")
        if value is not None:
            values[attribute] = value
    label = f"mapping <{node}> (id {values.get('id')!r})"
    if "order" in values:
        try:
            values["order"] = int(values["order"])
        except ValueError:
            raise MappingError(f"{label}: gw:order must be an integer") from None
    for attribute in ("true_words", "false_words"):
        if attribute in values:
            values[attribute] = tuple(values[attribute].split())
    fields: dict[str, FieldMap] = {}
    for name in own.get(GW + "field", ()):
        triples = field_triples.get(name, {})
        key = _one(triples, "key", f"{label}: field <{name}>")
        if key is None:
            continue
        prop = _one(triples, "propertyTemplate", f"{label}: field {key!r}")
        if prop is None:
            raise MappingError(f"{label}: field {key!r} has no gw:propertyTemplate")
        fields[name] = FieldMap(key, prop, _one(triples, "unit", f"{label}: field {key!r}"))
    if fields:
        values["fields"] = tuple(fields[name] for name in sorted(fields, key=_field_order))
    mapping = Mapping(**values)
    try:
        compile_mapping(mapping)
    except MappingError as error:
        raise MappingError(f"{label}: {error}") from None
    return mapping


def _field_order(name: str) -> tuple[int, str]:
    """Fields written by mappings_to_rdf keep their order (…/field/<n>); others sort by IRI."""
    tail = name.rsplit("/", 1)[-1]
    return (int(tail), name) if tail.isdigit() else (1 << 30, name)


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value["value"])
    return value if isinstance(value, str) else str(value.value)
