"""RDF terms <-> SPARQL 1.1 Query Results JSON, and N-Triples style term text.

Rows travel through the engine as tuples of pyoxigraph terms (None where unbound) because
tuples of terms hash and compare exactly as PROTOCOL.md requires (blank nodes by identity,
literals by lexical value, datatype and language). JSON is produced only at the edge.
"""

from __future__ import annotations

import json
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


TEXT_CACHE_SIZE = 1 << 15
# texts longer than this are written each time, not cached: the caches are bounded in entries, and a
# 500,000-character literal joined with 500 rows filled the row cache with 250 MB of texts (a
# sensor reading's row is ~200 characters)
CACHED_TEXT_MAX = 4096
_texts: dict[Term, str] = {}
_row_texts: dict[tuple[tuple[str, ...], Row], str] = {}


def term_json_text(term: Term) -> str:
    """``json.dumps(term_to_json(term))``, cached per term (see :func:`bindings_json_text`)."""
    text = _texts.get(term)
    if text is None:
        text = json.dumps(term_to_json(term))
        if len(text) <= CACHED_TEXT_MAX:
            if len(_texts) >= TEXT_CACHE_SIZE:
                _texts.clear()
            _texts[term] = text
    return text


class TooLarge(ValueError):
    """A text would pass the length it was allowed (:func:`bindings_json_text`'s `limit`)."""


def bindings_json_text(variables: tuple[str, ...], rows: Iterable[Row], limit: int | None = None) -> str:
    """``json.dumps(rows_to_bindings(variables, rows))``, written from cached row and term texts.

    Why: a re-evaluated subscription's first notification repeats the store's rows subscription
    after subscription (and subscriptions that share a result repeat each other's changes).
    Building a dict per binding and encoding it took 43 % of the loop thread while 1,000 such
    subscriptions of 1,000 rows subscribed (py-spy, `bench reeval --rows 1000`). For one
    1,000-row result: dicts + json.dumps 6.4 ms, cached term texts 1.0 ms, a cached row text
    0.13 ms. The caches are emptied when full rather than kept in LRU order: a hit costs one dict
    lookup, and the working set refills them at once; full, they hold ~10 MB (no text past
    CACHED_TEXT_MAX is kept).

    `limit`: :class:`TooLarge` as soon as the rows written pass that many characters, so a result
    too large to send costs no more than the limit to find out.
    """
    texts = _row_texts
    written = []
    if limit is None:
        for row in rows:
            text = texts.get((variables, row))
            if text is None:
                text = row_json_text(variables, row)
            written.append(text)
        return "[" + ", ".join(written) + "]"
    length = 0  # the brackets, and a separator less than rows
    for row in rows:
        text = texts.get((variables, row))
        if text is None:
            text = row_json_text(variables, row)
        length += len(text) + 2
        if length > limit:
            raise TooLarge(limit)
        written.append(text)
    return "[" + ", ".join(written) + "]"


def row_json_text(variables: tuple[str, ...], row: Row) -> str:
    """One binding of :func:`bindings_json_text`, written and cached."""
    text = _row_texts.get((variables, row))
    if text is None:
        terms = _texts.get
        text = (
            "{"
            + ", ".join(
                [
                    json.dumps(var) + ": " + (terms(term) or term_json_text(term))
                    for var, term in zip(variables, row, strict=True)
                    if term is not None
                ]
            )
            + "}"
        )
        if len(text) <= CACHED_TEXT_MAX:
            if len(_row_texts) >= TEXT_CACHE_SIZE:
                _row_texts.clear()
            _row_texts[(variables, row)] = text
    return text


def term_to_sparql(term: Term | DefaultGraph) -> str:
    """The term written as SPARQL/N-Triples text (pyoxigraph's str() is already that syntax)."""
    return str(term)


def quad_to_nquads(quad: Quad) -> str:
    """A quad as one N-Quads line, for journals and logs."""
    if isinstance(quad.graph_name, DefaultGraph):
        return f"{quad.subject} {quad.predicate} {quad.object} ."
    return f"{quad.subject} {quad.predicate} {quad.object} {quad.graph_name} ."
