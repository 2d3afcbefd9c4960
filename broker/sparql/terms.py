"""RDF terms <-> SPARQL 1.1 Query Results JSON, and N-Triples style term text.

Rows travel through the engine as tuples of pyoxigraph terms (None where unbound) because
tuples of terms hash and compare exactly as PROTOCOL.md requires (blank nodes by identity,
literals by lexical value, datatype and language). JSON is produced only at the edge.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pyoxigraph import BlankNode, DefaultGraph, Literal, NamedNode, Quad, Triple

Term = NamedNode | BlankNode | Literal | Triple
Row = tuple[Term | None, ...]

XSD_STRING = "http://www.w3.org/2001/XMLSchema#string"
RDF_LANG_STRING = "http://www.w3.org/1999/02/22-rdf-syntax-ns#langString"


def term_to_json(term: Term) -> dict[str, Any]:
    """One binding value in the W3C SPARQL 1.1 Query Results JSON format."""
    if isinstance(term, NamedNode):
        return {"type": "uri", "value": term.value}
    if isinstance(term, BlankNode):
        return {"type": "bnode", "value": term.value}
    if isinstance(term, Literal):
        out: dict[str, Any] = {"type": "literal", "value": term.value}
        if term.language:
            out["xml:lang"] = term.language
        elif term.datatype.value != XSD_STRING:
            out["datatype"] = term.datatype.value
        return out
    if isinstance(term, Triple):
        return {
            "type": "triple",
            "value": {
                "subject": term_to_json(term.subject),
                "predicate": term_to_json(term.predicate),
                "object": term_to_json(term.object),
            },
        }
    raise TypeError(f"not an RDF term: {term!r}")


def term_from_json(value: dict[str, Any]) -> Term:
    """Inverse of :func:`term_to_json` (accepts the legacy `typed-literal` type too)."""
    kind = value["type"]
    if kind == "uri":
        return NamedNode(value["value"])
    if kind == "bnode":
        return BlankNode(value["value"])
    if kind in ("literal", "typed-literal"):
        if "xml:lang" in value:
            return Literal(value["value"], language=value["xml:lang"])
        if "datatype" in value:
            return Literal(value["value"], datatype=NamedNode(value["datatype"]))
        return Literal(value["value"])
    if kind == "triple":
        inner = value["value"]
        return Triple(
            term_from_json(inner["subject"]), term_from_json(inner["predicate"]), term_from_json(inner["object"])
        )
    raise ValueError(f"unknown binding type {kind!r}")


def rows_to_bindings(variables: Sequence[str], rows: Iterable[Row]) -> list[dict[str, Any]]:
    """Rows as the `results.bindings` list of SPARQL JSON (unbound variables left out)."""
    return [
        {var: term_to_json(term) for var, term in zip(variables, row, strict=True) if term is not None} for row in rows
    ]


def term_to_sparql(term: Term | DefaultGraph) -> str:
    """The term written as SPARQL/N-Triples text (pyoxigraph's str() is already that syntax)."""
    return str(term)


def quad_to_nquads(quad: Quad) -> str:
    """A quad as one N-Quads line, for journals and logs."""
    if isinstance(quad.graph_name, DefaultGraph):
        return f"{quad.subject} {quad.predicate} {quad.object} ."
    return f"{quad.subject} {quad.predicate} {quad.object} {quad.graph_name} ."
