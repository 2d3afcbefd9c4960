"""Quad patterns: the common currency of templates, WHERE fast paths and subscriptions.

A position of a pattern is either an RDF term or a :class:`Var`. Pieces of SPARQL that are only
"triples and GRAPH blocks" (INSERT DATA blocks, DELETE/INSERT templates, simple WHERE clauses)
are parsed by pyoxigraph's Rust TriG parser after variables are rewritten as reserved IRIs, so
literal escapes, numbers, collections and prefixes are all handled by a real parser, fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from pyoxigraph import BlankNode, DefaultGraph, Literal, NamedNode, Quad, RdfFormat, parse

from broker.sparql.canonical import canonical
from broker.sparql.tokens import Token, matching_brace

VAR_IRI = "urn:x-sepa-var:"


@dataclass(frozen=True, slots=True)
class Var:
    """A SPARQL variable (or a query blank node treated as one)."""

    name: str

    def __str__(self) -> str:
        return f"?{self.name}"


Position = NamedNode | BlankNode | Literal | DefaultGraph | Var


@dataclass(frozen=True, slots=True)
class QuadPattern:
    subject: Position
    predicate: Position
    object: Position
    graph: Position

    def positions(self) -> tuple[Position, Position, Position, Position]:
        return (self.subject, self.predicate, self.object, self.graph)

    def variables(self) -> set[str]:
        return {position.name for position in self.positions() if isinstance(position, Var)}

    def to_sparql(self) -> str:
        """The pattern as SPARQL text (GRAPH block unless it is in the default graph)."""
        triple = f"{self.subject} {self.predicate} {self.object} ."
        if isinstance(self.graph, DefaultGraph):
            return triple
        return f"GRAPH {self.graph} {{ {triple} }}"


def pattern_skeleton(patterns: tuple[QuadPattern, ...]) -> tuple[tuple[str | None, ...], ...]:
    """Which positions of the patterns are which variables (None: a term); BGP join plans depend
    only on this (:func:`broker.core.bgp.plan`)."""
    return tuple(
        tuple(position.name if isinstance(position, Var) else None for position in pattern.positions())
        for pattern in patterns
    )


ALLOWED_NAMES = frozenset({"a", "true", "false"})
ALLOWED_PUNCT = frozenset({".", ";", ",", "[", "]", "(", ")", "^^", "+", "-"})


class BlockSyntax(Exception):
    """A token that cannot appear in a quad block; carries the token for the error position."""

    def __init__(self, token: Token | None, message: str) -> None:
        super().__init__(message)
        self.token = token
        self.message = message


def _check_token(token: Token, allow_vars: bool, allow_bnodes: bool, what: str) -> None:
    kind = token.kind
    if kind == "VAR":
        if not allow_vars:
            raise BlockSyntax(token, f"variables are not allowed in {what}")
    elif kind == "BNODE" or (kind == "PUNCT" and token.text in ("[", "(")):
        if not allow_bnodes:
            raise BlockSyntax(token, f"blank nodes are not allowed in {what}")
    elif kind == "NAME":
        if token.text not in ALLOWED_NAMES and token.text.lower() not in ALLOWED_NAMES:
            raise BlockSyntax(token, f"unexpected keyword in {what}")
    elif kind == "PUNCT" and token.text not in ALLOWED_PUNCT:
        raise BlockSyntax(token, f"unexpected symbol in {what}")


def block_to_trig(
    text: str,
    tokens: list[Token],
    open_index: int,
    close_index: int,
    *,
    allow_vars: bool,
    allow_bnodes: bool,
    what: str,
) -> str:
    """Rewrite the quad block tokens[open_index..close_index] (braces included) as a TriG document.

    Triples outside GRAPH go into `{ }` default-graph blocks, variables become reserved IRIs, the
    optional dot after a GRAPH block is dropped; anything that is not triples or GRAPH blocks
    raises BlockSyntax.
    """
    out: list[str] = []
    segment_open = False
    index = open_index + 1
    cursor = tokens[open_index].start + 1

    def copy_until(token: Token, replacement: str | None = None) -> None:
        nonlocal cursor
        out.append(text[cursor : token.start])
        out.append(token.text if replacement is None else replacement)
        cursor = token.start + len(token.text)

    while index < close_index:
        token = tokens[index]
        if token.kind == "NAME" and token.text.upper() == "GRAPH":
            if segment_open:
                out.append(" }")
                segment_open = False
            name = tokens[index + 1] if index + 1 < close_index else None
            brace = tokens[index + 2] if index + 2 < close_index else None
            if name is None or name.kind not in ("IRI", "PNAME", "VAR"):
                raise BlockSyntax(name, "expected a graph IRI or variable after GRAPH")
            if brace is None or brace.text != "{":
                raise BlockSyntax(brace, "expected '{' after GRAPH name")
            end = matching_brace(tokens, index + 2, text)
            if end > close_index:
                raise BlockSyntax(tokens[close_index], "unbalanced braces")
            _check_token(name, allow_vars, allow_bnodes, what)
            copy_until(token)
            copy_until(name, f"<{VAR_IRI}{name.text[1:]}>" if name.kind == "VAR" else None)
            copy_until(brace)
            for inner in tokens[index + 3 : end]:
                if inner.text in ("{", "}") and inner.kind == "PUNCT":
                    raise BlockSyntax(inner, f"nested blocks are not allowed in {what}")
                if inner.kind == "NAME" and inner.text.upper() == "GRAPH":
                    raise BlockSyntax(inner, f"nested GRAPH is not allowed in {what}")
                _check_token(inner, allow_vars, allow_bnodes, what)
                copy_until(inner, f"<{VAR_IRI}{inner.text[1:]}>" if inner.kind == "VAR" else None)
            copy_until(tokens[end])
            index = end + 1
            if index < close_index and tokens[index].text == "." and tokens[index].kind == "PUNCT":
                copy_until(tokens[index], "")
                index += 1
            continue
        if token.kind == "PUNCT" and token.text in ("{", "}"):
            raise BlockSyntax(token, f"unexpected brace in {what}")
        _check_token(token, allow_vars, allow_bnodes, what)
        if not segment_open:
            out.append(text[cursor : token.start])
            cursor = token.start
            out.append("{ ")
            segment_open = True
        copy_until(token, f"<{VAR_IRI}{token.text[1:]}>" if token.kind == "VAR" else None)
        index += 1
    if segment_open:
        out.append(" }")
    return "".join(out)


def _position(term: NamedNode | BlankNode | Literal | DefaultGraph) -> Position:
    if isinstance(term, NamedNode) and term.value.startswith(VAR_IRI):
        return Var(term.value[len(VAR_IRI) :])
    return canonical(term)  # type: ignore[return-value]


def parse_quads(trig: str, prologue: str, base_iri: str | None, limit: int | None = None) -> list[Quad]:
    """Parse a block produced by :func:`block_to_trig` (or the fast scanner); raises SyntaxError,
    and UpdateFailed past `limit` quads, read no further (broker.sparql.limits.DATA_QUAD_LIMIT)."""
    document = f"{prologue}\n{trig}" if prologue else trig
    if limit is None:
        return list(parse(document, format=RdfFormat.TRIG, base_iri=base_iri))
    quads = list(islice(parse(document, format=RdfFormat.TRIG, base_iri=base_iri), limit + 1))
    if len(quads) > limit:
        from broker.sparql.limits import too_many_data_quads

        raise too_many_data_quads(limit)
    return quads


def to_patterns(quads: list[Quad]) -> list[QuadPattern]:
    """Parsed quads as patterns: reserved IRIs back to variables, literals in canonical form."""
    return [
        QuadPattern(_position(q.subject), _position(q.predicate), _position(q.object), _position(q.graph_name))
        for q in quads
    ]


def parse_block(trig: str, prologue: str, base_iri: str | None) -> list[QuadPattern]:
    """Parse a block produced by :func:`block_to_trig` into quad patterns (raises SyntaxError)."""
    return to_patterns(parse_quads(trig, prologue, base_iri))


def split_template(quads: list[Quad], *, may_vary: bool = True) -> tuple[tuple[Quad, ...], tuple[QuadPattern, ...]]:
    """(ground quads, patterns) of a template: the quads that are the same for every solution
    are kept as pyoxigraph quads (a 500-reading batch has thousands; converting and instantiating
    each as a pattern cost more than parsing it), the ones with a variable or a blank node (fresh
    per solution) as patterns. `may_vary=False` (the scanner saw neither) skips looking.
    """
    ground: list[Quad] = []
    varying: list[Quad] = []
    for quad in quads:
        if may_vary:
            text = str(quad)
            if VAR_IRI in text or "_:" in text:  # a string may hold either: then it is a pattern, still right
                varying.append(quad)
                continue
        obj = quad.object
        if type(obj) is Literal:
            new = canonical(obj)
            if new is not obj:
                quad = Quad(quad.subject, quad.predicate, new, quad.graph_name)  # type: ignore[arg-type]
        ground.append(quad)
    return tuple(ground), tuple(to_patterns(varying))


def ground_quads(quads: list[Quad]) -> tuple[Quad, ...]:
    """INSERT/DELETE DATA quads with their literals in the store's canonical form."""
    out = []
    for quad in quads:
        obj = quad.object
        if type(obj) is Literal:
            new = canonical(obj)
            if new is not obj:
                quad = Quad(quad.subject, quad.predicate, new, quad.graph_name)  # type: ignore[arg-type]
        out.append(quad)
    return tuple(out)
