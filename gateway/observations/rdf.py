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
_OPTIONAL = [name for name in _SINGLE.values() if name not in ("mappingId", "topicFilter", "extract")]

MAPPINGS_QUERY = (
    "SELECT ?mapping ?"
    + " ?".join(_SINGLE.values())
    + " ?field ?fieldKey ?fieldProperty ?fieldUnit WHERE {\n"
    + f"  GRAPH <{GRAPH_MAPPINGS}> {{\n"
    + f"    ?mapping a <{GW}TopicMapping> ; <{GW}mappingId> ?mappingId ; <{GW}topicFilter> ?topicFilter ;"
    + f" <{GW}extract> ?extract .\n"
    + "".join(f"    OPTIONAL {{ ?mapping <{GW}{name}> ?{name} }}\n" for name in _OPTIONAL)
    + f"    OPTIONAL {{ ?mapping <{GW}field> ?field . ?field <{GW}key> ?fieldKey .\n"
    + f"      OPTIONAL {{ ?field <{GW}propertyTemplate> ?fieldProperty }}\n"
    + f"      OPTIONAL {{ ?field <{GW}unit> ?fieldUnit }} }}\n"
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

    A mapping that cannot work raises MappingError naming it; with an `errors` list, it is
    appended there and skipped instead, so one bad edit does not stop the others.
    """
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(_text(row["mapping"]), []).append(row)
    mappings: list[Mapping] = []
    for node, node_rows in grouped.items():
        try:
            mappings.append(_mapping(node, node_rows))
        except MappingError as error:
            if errors is None:
                raise
            errors.append(error)
    return mappings


def _mapping(node: str, rows: list[dict[str, Any]]) -> Mapping:
    values: dict[str, Any] = {}
    for attribute, variable in _SINGLE.items():
        found = {_text(row[variable]) for row in rows if row.get(variable) is not None}
        if len(found) > 1:
            raise MappingError(f"mapping <{node}>: {len(found)} values for gw:{variable}, expected one")
        if found:
            values[attribute] = found.pop()
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
    for row in rows:
        if row.get("field") is None:
            continue
        key = _text(row["fieldKey"])
        prop = row.get("fieldProperty")
        if prop is None:
            raise MappingError(f"{label}: field {key!r} has no gw:propertyTemplate")
        unit = row.get("fieldUnit")
        fields[_text(row["field"])] = FieldMap(key, _text(prop), None if unit is None else _text(unit))
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
