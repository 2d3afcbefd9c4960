"""RDF terms as plain Python values, to cross between the engine and its BOOSTER workers.

Why not pickle the pyoxigraph terms: pickling one costs ~2.7 us and unpickling ~0.9 us (1,000
solutions of four terms: 11 ms and 3.6 ms on the test machine), as much as evaluating them. An IRI
travels as its string, any other term as a small tuple, and the receiving side keeps the terms it
made in a cache, so a term seen again (a lamp, a sensor, a property) is one dict lookup.
"""

from __future__ import annotations

from typing import Any

from pyoxigraph import (
    BlankNode,
    DefaultGraph,
    Literal,
    NamedNode,
    Quad,
    QueryResultsFormat,
    Triple,
    parse_query_results,
)

XSD_STRING = "http://www.w3.org/2001/XMLSchema#string"
CACHE_MAX = 200_000  # terms kept by a decoder; past it the cache starts again (bounded memory)

Code = Any  # str (an IRI), a tuple, or None (unbound)
# a BOOSTER job's hits for one (group, branch, pattern): each quad by its index in the update's removed
# or added quads, with the parameter values (codes) of the one SPU it concerns, or None for any SPU;
# the solutions a hit may have (None: any; see broker.core.spu.ShapeGroup.collect); and whether its
# group is bounded (a network client's: its lookups stop at the job's deadline)
Item = tuple[int, int, int, list[tuple[int, tuple[Code, ...] | None]], int | None, bool]
# per item, per hit: its solutions (codes), None for none, OVER for more than the item's limit, or
# TIMED_OUT when the job's deadline passed before the hit was looked up
Answers = list[list[list[tuple[Code, ...]] | str | None]]
OVER = "over"
TIMED_OUT = "timeout"


def encode(term: object) -> Code:
    """`term` (or None) as a picklable plain value; :meth:`Decoder.term` makes it back."""
    kind = type(term)
    if kind is NamedNode:
        return term.value  # type: ignore[attr-defined]
    if kind is Literal:
        language = term.language  # type: ignore[attr-defined]
        if language:
            return ("@", term.value, language)  # type: ignore[attr-defined]
        datatype = term.datatype.value  # type: ignore[attr-defined]
        return ("l", term.value) if datatype == XSD_STRING else ("t", term.value, datatype)  # type: ignore[attr-defined]
    if term is None:
        return None
    if kind is BlankNode:
        return ("b", term.value)  # type: ignore[attr-defined]
    if kind is DefaultGraph:
        return ("d",)
    if kind is Triple:
        return ("<<", encode(term.subject), encode(term.predicate), encode(term.object))  # type: ignore[attr-defined]
    raise TypeError(f"not an RDF term: {term!r}")


def encode_all(terms: tuple[object, ...]) -> tuple[Code, ...]:
    return tuple(map(encode, terms))


def encode_quad(quad: Quad) -> tuple[Code, ...]:
    return (encode(quad.subject), encode(quad.predicate), encode(quad.object), encode(quad.graph_name))


class Decoder:
    """Makes terms back from their codes, each distinct one once (see the module docstring)."""

    def __init__(self) -> None:
        self._terms: dict[Code, object] = {None: None}

    def term(self, code: Code) -> Any:
        try:
            return self._terms[code]
        except KeyError:
            if len(self._terms) >= CACHE_MAX:
                self._terms = {None: None}
            found = self._terms[code] = self._make(code)
            return found

    def terms(self, codes: tuple[Code, ...]) -> tuple[Any, ...]:
        cache = self._terms
        try:  # every term seen before: the common case, a lookup each
            return tuple([cache[code] for code in codes])
        except KeyError:
            return tuple(map(self.term, codes))

    def quad(self, codes: tuple[Code, ...]) -> Quad:
        subject, predicate, obj, graph = map(self.term, codes)
        return Quad(subject, predicate, obj, graph)

    def _make(self, code: Code) -> object:
        if isinstance(code, str):
            return NamedNode(code)
        kind = code[0]
        if kind == "l":
            return Literal(code[1])
        if kind == "t":
            return Literal(code[1], datatype=NamedNode(code[2]))
        if kind == "@":
            return Literal(code[1], language=code[2])
        if kind == "b":
            return BlankNode(code[1])
        if kind == "d":
            return DefaultGraph()
        if kind == "<<":
            return Triple(self.term(code[1]), self.term(code[2]), self.term(code[3]))
        raise ValueError(f"not a term code: {code!r}")


def rows_from_tsv(text: bytes) -> tuple[tuple[Any, ...], ...]:
    """The rows of a SPARQL TSV result (pyoxigraph's writer and reader: exact terms), in the
    header's variable order, None where unbound."""
    return tuple(map(tuple, parse_query_results(text, format=QueryResultsFormat.TSV)))


def tsv_variables(header: bytes) -> tuple[str, ...]:
    """The variables of a SPARQL TSV header line."""
    results = parse_query_results(header + b"\n", format=QueryResultsFormat.TSV)
    return tuple(variable.value for variable in results.variables)
