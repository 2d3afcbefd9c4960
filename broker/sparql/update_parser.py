"""Recognises the structure of a SPARQL 1.1 Update request.

Only the outer grammar (prologue, operations, their keywords, graph references, quad blocks and
the extent of WHERE clauses) is handled here, in Python; quad blocks go to pyoxigraph's TriG
parser and WHERE clauses to its query parser. Parsed requests are cached by text, since IoT
producers repeat the same request often.

Requests are first read the fast way: tokens only between blocks, each quad block and WHERE group
crossed by :mod:`broker.sparql.fast_blocks` (batch updates are hundreds of KB of quad blocks).
Whenever that reading is unsure or fails, the request is parsed again with every token, which is
the reference behaviour and words every syntax error.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from pyoxigraph import BlankNode, NamedNode, Quad, RdfFormat, Store, parse

from broker.errors import SparqlSyntaxError
from broker.sparql.fast_blocks import blank_node_labels, group_end, scan_block
from broker.sparql.limits import DATA_QUAD_LIMIT, check_structure
from broker.sparql.operations import DataOp, GraphOp, GraphRef, LoadOp, ModifyOp, Operation, ParsedUpdate
from broker.sparql.patterns import (
    ALLOWED_NAMES,
    BlockSyntax,
    QuadPattern,
    block_to_trig,
    ground_quads,
    parse_block,
    parse_quads,
    split_template,
    to_patterns,
)
from broker.sparql.tokens import TOKEN_RE, Token, error_at, matching_brace, tokenize

# what Parser.simple_bgp makes of a WHERE clause: (patterns, pins, OPTIONAL blocks, VALUES), the
# ModifyOp fields where_bgp, where_pins, where_optionals, where_values; NOT_SIMPLE for any other
SimpleWhere = tuple[
    tuple[QuadPattern, ...] | None,
    tuple[tuple[str, NamedNode], ...],
    tuple[tuple[QuadPattern, ...], ...],
    tuple[str, tuple[NamedNode, ...]] | None,
]
NOT_SIMPLE: SimpleWhere = (None, (), (), None)


class _Unsure(Exception):
    """The fast reading cannot vouch for the request: it is parsed again with every token."""


@dataclass(frozen=True, slots=True)
class _Block:
    """A parsed quad block and the offsets of its braces."""

    quads: list[Quad]
    open: int
    close: int
    may_vary: bool


class _Parser:
    def __init__(self, text: str, base_iri: str | None, prefixes: dict[str, str] | None, *, fast: bool) -> None:
        self.text = text
        self.fast = fast
        # Fast: tokens are read on demand, and skipped over blocks; otherwise all of them up front.
        self.tokens = [] if fast else tokenize(text)
        self.scanner = TOKEN_RE.finditer(text) if fast else None
        self.pos = 0
        self.base_iri = base_iri
        self.prologue: list[str] = [f"PREFIX {name}: <{iri}>" for name, iri in (prefixes or {}).items()]
        self.bnode_labels: set[str] = set()

    # -- token helpers ------------------------------------------------------------------------

    def peek(self, offset: int = 0) -> Token | None:
        index = self.pos + offset
        if index >= len(self.tokens) and self.scanner is not None:
            self.read_tokens(index)
        return self.tokens[index] if index < len(self.tokens) else None

    def read_tokens(self, index: int) -> None:
        """Tokenize on until tokens[index] exists or the text ends (fast mode)."""
        tokens = self.tokens
        for match in self.scanner:  # type: ignore[union-attr]
            kind = match.lastgroup
            if kind == "WS" or kind == "COMMENT":
                continue
            if kind == "ERROR":
                raise _Unsure
            tokens.append(Token(kind, match.group(), match.start()))  # type: ignore[arg-type]
            if len(tokens) > index:
                return
        self.scanner = None

    def skip_to(self, offset: int) -> None:
        """Continue after text[:offset], a block the fast scan crossed (fast mode)."""
        del self.tokens[self.pos :]
        self.scanner = TOKEN_RE.finditer(self.text, offset)

    def error(self, message: str, token: Token | None = None) -> SparqlSyntaxError:
        return error_at(self.text, token if token is not None else self.peek(), message)

    def keyword(self, word: str) -> bool:
        token = self.peek()
        if token is not None and token.kind == "NAME" and token.text.upper() == word:
            self.pos += 1
            return True
        return False

    def expect_keyword(self, word: str) -> None:
        if not self.keyword(word):
            raise self.error(f"expected {word}")

    def expect_punct(self, symbol: str) -> Token:
        token = self.peek()
        if token is None or token.kind != "PUNCT" or token.text != symbol:
            raise self.error(f"expected {symbol!r}")
        self.pos += 1
        return token

    # -- terms --------------------------------------------------------------------------------

    def iri(self) -> NamedNode:
        token = self.peek()
        if token is None or token.kind not in ("IRI", "PNAME"):
            raise self.error("expected an IRI")
        self.pos += 1
        return self.iri_of(token)

    def iris_of(self, tokens: list[Token]) -> tuple[NamedNode, ...]:
        """Many IRI tokens at once: one parse (a VALUES block of 1,000 IRIs, one by one, took ~10 ms)."""
        lines = "\n".join(f"<urn:x-sepa:s> <urn:x-sepa:p> {token.text} ." for token in tokens)
        try:
            quads = parse("\n".join([*self.prologue, lines]), format=RdfFormat.TURTLE, base_iri=self.base_iri)
            return tuple(quad.object for quad in quads)  # type: ignore[misc]
        except SyntaxError as error:
            raise self.error(f"invalid IRI ({error})", tokens[0]) from error

    def iri_of(self, token: Token) -> NamedNode:
        document = "\n".join([*self.prologue, f"<urn:x-sepa:s> <urn:x-sepa:p> {token.text} ."])
        try:
            (quad,) = parse(document, format=RdfFormat.TURTLE, base_iri=self.base_iri)
        except SyntaxError as error:
            raise self.error(f"invalid IRI ({error})", token) from error
        return quad.object  # type: ignore[return-value]

    # -- structure ----------------------------------------------------------------------------

    def parse(self) -> ParsedUpdate:
        parsed = ParsedUpdate()
        while True:
            self.parse_prologue()
            if self.peek() is None:
                break
            parsed.operations.append(self.parse_operation())
            if self.peek() is None:
                break
            self.expect_punct(";")
        return parsed

    def parse_prologue(self) -> None:
        while True:
            start = self.peek()
            if self.keyword("PREFIX"):
                name = self.peek()
                if name is None or name.kind != "PNAME" or not name.text.endswith(":") or name.text.count(":") != 1:
                    raise self.error("expected a prefix name such as 'ex:'")
                self.pos += 1
                iri = self.peek()
                if iri is None or iri.kind != "IRI":
                    raise self.error("expected an IRI")
                self.pos += 1
                self.prologue.append(self.text[start.start : iri.start + len(iri.text)])  # type: ignore[union-attr]
            elif self.keyword("BASE"):
                iri = self.peek()
                if iri is None or iri.kind != "IRI":
                    raise self.error("expected an IRI")
                self.pos += 1
                self.prologue.append(self.text[start.start : iri.start + len(iri.text)])  # type: ignore[union-attr]
            else:
                return

    def parse_operation(self) -> Operation:
        token = self.peek()
        word = token.text.upper() if token is not None and token.kind == "NAME" else ""
        if word == "INSERT" and self.is_next_keyword("DATA"):
            self.pos += 2
            return DataOp(True, self.data_block(insert=True))
        if word == "DELETE" and self.is_next_keyword("DATA"):
            self.pos += 2
            return DataOp(False, self.data_block(insert=False))
        if word == "DELETE" and self.is_next_keyword("WHERE"):
            self.pos += 2
            return self.delete_where()
        if word in ("INSERT", "DELETE", "WITH"):
            return self.modify()
        if word == "LOAD":
            self.pos += 1
            silent = self.keyword("SILENT")
            source = self.iri()
            into = None
            if self.keyword("INTO"):
                self.expect_keyword("GRAPH")
                into = self.iri()
            return LoadOp(silent, source, into)
        if word in ("CLEAR", "DROP"):
            self.pos += 1
            silent = self.keyword("SILENT")
            return GraphOp(word, silent, self.graph_ref_all())
        if word == "CREATE":
            self.pos += 1
            silent = self.keyword("SILENT")
            self.expect_keyword("GRAPH")
            return GraphOp(word, silent, self.iri())
        if word in ("ADD", "MOVE", "COPY"):
            self.pos += 1
            silent = self.keyword("SILENT")
            source = self.graph_or_default()
            self.expect_keyword("TO")
            return GraphOp(word, silent, self.graph_or_default(), source)
        raise self.error(
            "expected an update operation (INSERT, DELETE, WITH, LOAD, CLEAR, DROP, CREATE, ADD, MOVE, COPY)"
        )

    def is_next_keyword(self, word: str) -> bool:
        token = self.peek(1)
        return token is not None and token.kind == "NAME" and token.text.upper() == word

    def graph_ref_all(self) -> GraphRef:
        for word in ("DEFAULT", "NAMED", "ALL"):
            if self.keyword(word):
                return word
        self.expect_keyword("GRAPH")
        return self.iri()

    def graph_or_default(self) -> GraphRef:
        if self.keyword("DEFAULT"):
            return "DEFAULT"
        self.keyword("GRAPH")
        return self.iri()

    # -- quad blocks --------------------------------------------------------------------------

    def block(self, *, allow_vars: bool, allow_bnodes: bool, what: str) -> _Block:
        """Parse the `{ ... }` block at the cursor."""
        open_token = self.peek()
        if open_token is None or open_token.text != "{" or open_token.kind != "PUNCT":
            raise self.error("expected '{'")
        if self.fast:
            block = self.fast_block(open_token, allow_vars=allow_vars, allow_bnodes=allow_bnodes, what=what)
            self.skip_to(block.close + 1)
            return block
        open_index = self.pos
        close_index = matching_brace(self.tokens, open_index, self.text)
        try:
            trig = block_to_trig(
                self.text,
                self.tokens,
                open_index,
                close_index,
                allow_vars=allow_vars,
                allow_bnodes=allow_bnodes,
                what=what,
            )
        except BlockSyntax as error:
            raise self.error(error.message, error.token) from None
        try:
            quads = parse_quads(trig, "\n".join(self.prologue), self.base_iri, _data_limit(what))
        except SyntaxError as error:
            raise located_error(self.text, str(error), open_token) from None
        if what == "INSERT DATA":
            labels = {token.text for token in self.tokens[open_index:close_index] if token.kind == "BNODE"}
            if labels & self.bnode_labels:
                raise self.error("a blank node label cannot be shared by two INSERT DATA blocks", open_token)
            self.bnode_labels |= labels
        self.pos = close_index + 1
        return _Block(quads, open_token.start, self.tokens[close_index].start, True)

    def fast_block(self, open_token: Token, *, allow_vars: bool, allow_bnodes: bool, what: str) -> _Block:
        scanned = scan_block(self.text, open_token.start, allow_vars=allow_vars, allow_bnodes=allow_bnodes)
        if scanned is None:
            raise _Unsure
        try:
            quads = parse_quads(scanned.trig, "\n".join(self.prologue), self.base_iri, _data_limit(what))
        except SyntaxError:
            raise _Unsure from None
        if what == "INSERT DATA" and scanned.has_labels:
            labels = blank_node_labels(self.text, open_token.start + 1, scanned.close)
            if labels & self.bnode_labels:
                raise _Unsure
            self.bnode_labels |= labels
        return _Block(quads, open_token.start, scanned.close, scanned.has_variables or scanned.has_blank_nodes)

    def data_block(self, *, insert: bool) -> tuple[Quad, ...]:
        what = "INSERT DATA" if insert else "DELETE DATA"
        return ground_quads(self.block(allow_vars=False, allow_bnodes=insert, what=what).quads)

    def where_text(self, open_offset: int, close_offset: int) -> str:
        body = self.text[open_offset : close_offset + 1]
        return "\n".join([*self.prologue, f"SELECT * WHERE {body}"])

    def delete_where(self) -> ModifyOp:
        block = self.block(allow_vars=True, allow_bnodes=False, what="DELETE WHERE")
        patterns = tuple(to_patterns(block.quads))
        ground, varying = split_template(block.quads, may_vary=block.may_vary)
        where = self.where_text(block.open, block.close)
        return ModifyOp(varying, (), where, patterns, (), None, (), (), delete_ground=ground)

    def template(self, *, delete: bool) -> tuple[tuple[Quad, ...], tuple[QuadPattern, ...]]:
        what = "a DELETE template" if delete else "an INSERT template"
        block = self.block(allow_vars=True, allow_bnodes=not delete, what=what)
        return split_template(block.quads, may_vary=block.may_vary)

    def modify(self) -> ModifyOp:
        with_graph = self.iri() if self.keyword("WITH") else None
        delete: tuple[QuadPattern, ...] = ()
        insert: tuple[QuadPattern, ...] = ()
        delete_ground: tuple[Quad, ...] = ()
        insert_ground: tuple[Quad, ...] = ()
        if self.keyword("DELETE"):
            delete_ground, delete = self.template(delete=True)
            if self.keyword("INSERT"):
                insert_ground, insert = self.template(delete=False)
        elif self.keyword("INSERT"):
            insert_ground, insert = self.template(delete=False)
        else:
            raise self.error("expected DELETE or INSERT")
        using: list[NamedNode] = []
        using_named: list[NamedNode] = []
        while self.keyword("USING"):
            (using_named if self.keyword("NAMED") else using).append(self.iri())
        self.expect_keyword("WHERE")
        open_token = self.peek()
        if open_token is None or open_token.text != "{":
            raise self.error("expected '{' after WHERE")
        if self.fast:
            close = group_end(self.text, open_token.start)
            if close is None:
                raise _Unsure
            body = self.text_tokens(open_token.start + 1, close)
            self.skip_to(close + 1)
            close_token = Token("PUNCT", "}", close)
        else:
            open_index = self.pos
            close_index = matching_brace(self.tokens, open_index, self.text)
            body = iter(self.tokens[open_index + 1 : close_index])
            close_token = self.tokens[close_index]
            self.pos = close_index + 1
        where_bgp, where_pins, where_optionals, where_values = self.simple_bgp(open_token, body, close_token)
        return ModifyOp(
            delete,
            insert,
            self.where_text(open_token.start, close_token.start),
            where_bgp,
            where_pins,
            with_graph,
            tuple(using),
            tuple(using_named),
            delete_ground=delete_ground,
            insert_ground=insert_ground,
            where_optionals=where_optionals,
            where_values=where_values,
        )

    def text_tokens(self, start: int, end: int) -> Iterator[Token]:
        """The tokens of text[start:end], read only as far as the caller goes (fast mode)."""
        for match in TOKEN_RE.finditer(self.text, start, end):
            kind = match.lastgroup
            if kind != "WS" and kind != "COMMENT":
                yield Token(kind, match.group(), match.start())  # type: ignore[arg-type]

    def simple_bgp(self, open_token: Token, body: Iterator[Token], close_token: Token) -> SimpleWhere:
        """The WHERE clause as quad patterns plus `FILTER(?v = <iri>)` pins, then the quad patterns
        of `OPTIONAL { ... }` blocks that follow them, and one `VALUES ?v { <iri> ... }` block,
        when that is all it is.

        Such clauses (the common IoT update: replace one value, or the values of one group; with
        OPTIONAL, one that may not be there yet; with VALUES, delete a list of subjects) are
        evaluated by index lookups from the pinned values instead of by the query engine. `body`
        is read only up to the first token that rules this out (a batch's WHERE may be long).
        """
        kept: list[Token] = [open_token]
        pinned: list[tuple[str, Token]] = []
        values: tuple[str, list[Token]] | None = None
        skipped: list[tuple[int, int]] = []  # text spans of the FILTER and VALUES read here
        optionals: list[list[Token]] = []  # each block's tokens, braces included
        depth = 0  # inside an OPTIONAL block: its GRAPH blocks' braces
        for token in body:
            kind = token.kind
            if kind == "BNODE" or (kind == "PUNCT" and token.text in ("[", "(", "+", "-")):
                return NOT_SIMPLE
            if optionals and depth:
                optionals[-1].append(token)
                if token.text == "{":
                    depth += 1
                elif token.text == "}":
                    depth -= 1
                elif kind == "NAME" and token.text.upper() != "GRAPH" and token.text.lower() not in ALLOWED_NAMES:
                    return NOT_SIMPLE
                continue
            if kind == "NAME" and token.text.upper() == "OPTIONAL":
                opening = next(body, None)
                if opening is None or opening.text != "{":
                    return NOT_SIMPLE
                optionals.append([opening])
                depth = 1
                continue
            if optionals and token.text == ".":
                continue
            if optionals:
                return NOT_SIMPLE  # a pattern after an OPTIONAL joins with it: not this shape
            if kind == "NAME":
                word = token.text.upper()
                if word == "FILTER":
                    tokens = list(islice(body, 5))
                    pin = _pin(tokens)
                    if pin is None:
                        return NOT_SIMPLE
                    pinned.append(pin)
                    skipped.append((token.start, tokens[-1].start + len(tokens[-1].text)))
                    continue
                if word == "VALUES" and values is None:
                    found = _values(body)
                    if found is None:
                        return NOT_SIMPLE
                    values, end = found
                    skipped.append((token.start, end))
                    continue
                if word != "GRAPH" and token.text.lower() not in ALLOWED_NAMES:
                    return NOT_SIMPLE  # block_to_trig would refuse it
            kept.append(token)
        if depth:
            return NOT_SIMPLE
        kept.append(close_token)
        try:
            patterns = self._block_patterns(kept, skipped)
            blocks = tuple(self._block_patterns(block) for block in optionals)
        except (BlockSyntax, SyntaxError, SparqlSyntaxError):
            return NOT_SIMPLE
        if not all(blocks):
            return NOT_SIMPLE
        variables = {name for pattern in patterns for name in pattern.variables()}
        pins: dict[str, NamedNode] = {}
        for name, iri_token in pinned:
            iri = self.iri_of(iri_token)
            # two pins of one variable to different IRIs never both hold: the query engine says so
            # (a dict of them kept the last one, and an update deleted what its WHERE ruled out)
            if name not in variables or pins.setdefault(name, iri) != iri:
                return NOT_SIMPLE
        if values is None:
            return patterns, tuple(pins.items()), blocks, None
        name, iri_tokens = values
        return patterns, tuple(pins.items()), blocks, (name, self.iris_of(iri_tokens))

    def _block_patterns(self, tokens: list[Token], skipped: Sequence[tuple[int, int]] = ()) -> tuple[QuadPattern, ...]:
        """The quad patterns of a `{ ... }` group of triples (and GRAPH blocks); the `skipped` spans
        of the text (FILTER pins, VALUES, read apart) are blanked, offsets kept."""
        text = self.text
        if skipped:
            parts, cursor = [], 0
            for start, end in skipped:
                parts += [text[cursor:start], " " * (end - start)]
                cursor = end
            text = "".join([*parts, text[cursor:]])
        trig = block_to_trig(text, tokens, 0, len(tokens) - 1, allow_vars=True, allow_bnodes=False, what="WHERE")
        return tuple(parse_block(trig, "\n".join(self.prologue), self.base_iri))


def _values(body: Iterator[Token]) -> tuple[tuple[str, list[Token]], int] | None:
    """The rest of `VALUES ?v { <iri> ... }` as ((variable name, IRI tokens), offset of its end);
    None for any other VALUES (several variables, literals, UNDEF): the query engine evaluates those."""
    variable, opening = next(body, None), next(body, None)
    if variable is None or variable.kind != "VAR" or opening is None or opening.text != "{":
        return None
    iris = []
    for token in body:
        if token.text == "}":
            return (variable.text[1:], iris), token.start + 1
        if token.kind not in ("IRI", "PNAME"):
            return None
        iris.append(token)
    return None


def _pin(tokens: list[Token]) -> tuple[str, Token] | None:
    """`( ?v = <iri> )` or `( <iri> = ?v )` as (variable name, IRI token)."""
    if len(tokens) != 5 or tokens[0].text != "(" or tokens[2].text != "=" or tokens[4].text != ")":
        return None
    if tokens[1].kind == "VAR" and tokens[3].kind in ("IRI", "PNAME"):
        return tokens[1].text[1:], tokens[3]
    if tokens[3].kind == "VAR" and tokens[1].kind in ("IRI", "PNAME"):
        return tokens[3].text[1:], tokens[1]
    return None


def located_error(text: str, message: str, fallback: Token | None) -> SparqlSyntaxError:
    """Best syntax error for `text`: pyoxigraph's own parser names the exact line and column.

    The request is parsed (never run) by executing it against a scratch empty store only when
    it holds no LOAD, so nothing can be fetched.
    """
    if "load" not in text.lower():
        try:
            Store().update(text)
        except SyntaxError as error:
            from broker.core.query_processor import syntax_error

            return syntax_error(error, text)
        except Exception:  # noqa: BLE001 - any run-time failure means the syntax was fine
            pass
    return error_at(text, fallback, message.removeprefix("error at "))


_SHAPES: dict[tuple[str, str | None, tuple[tuple[str, str], ...]], ParsedUpdate | None] = {}
SHAPE_CACHE_SIZE = 4096
_TEXTS: dict[tuple[str, str | None, tuple[tuple[str, str], ...]], ParsedUpdate] = {}
TEXT_CACHE_SIZE = 4096
# Hashes of texts and shapes seen once: a plan is cached only when its key comes back. Sensor
# readings make every observation update (and its shape) new; cached anyway, 4,096 of them held
# ~1.2M GC-tracked objects (pyoxigraph quads and patterns), and each full collection walked them
# for ~370 ms holding the GIL (measured, batches of 5 readings). Hashes are ints: untracked.
_SEEN: set[int] = set()
SEEN_SIZE = 65_536


def _second_sighting(key: object) -> bool:
    """Whether this cache key was seen before (and forget the oldest sightings in bulk)."""
    digest = hash(key)
    if digest in _SEEN:
        return True
    if len(_SEEN) >= SEEN_SIZE:
        _SEEN.clear()
    _SEEN.add(digest)
    return False


def _data_limit(what: str) -> int | None:
    """The quads a block may have (see DATA_QUAD_LIMIT): a DATA block's only."""
    return DATA_QUAD_LIMIT.get() if what.endswith(" DATA") else None


# Only requests up to this size are cached or split into shapes: the IoT requests that repeat are
# small, and a cached bulk INSERT DATA would hold its whole plan in memory (a Pi has little).
CACHED_REQUEST_CHARS = 8192


def parse_update(text: str, base_iri: str | None = None, prefixes: dict[str, str] | None = None) -> ParsedUpdate:
    """Parse an update request; raises SparqlSyntaxError with line and column, and InvalidRequest
    for a request beyond :mod:`broker.sparql.limits` (checked before any parser runs).

    Cached by exact text (producers repeat requests), then by shape (see
    :mod:`broker.sparql.update_shapes`), falling back to a full parse. A cached text passed the
    limits when it was parsed, so a hit is not checked again.
    """
    prefix_items = tuple(sorted(prefixes.items())) if prefixes else ()
    if len(text) > CACHED_REQUEST_CHARS:
        check_structure(text)
        return _parse(text, base_iri, prefixes)
    key = (text, base_iri, prefix_items)
    seen = _TEXTS.get(key)
    if seen is not None:
        return seen
    check_structure(text)
    parsed = _parse_shaped(text, base_iri, prefixes, prefix_items)
    if _second_sighting(key):
        if len(_TEXTS) >= TEXT_CACHE_SIZE:
            _TEXTS.clear()
        _TEXTS[key] = parsed
    return parsed


def _parse_shaped(
    text: str, base_iri: str | None, prefixes: dict[str, str] | None, prefix_items: tuple[tuple[str, str], ...]
) -> ParsedUpdate:
    from broker.sparql.update_shapes import instantiate, split_shape

    split = split_shape(text)
    if split is not None:
        shape, originals, constants = split
        key = (shape, base_iri, prefix_items)
        plan = _SHAPES.get(key, False)
        if plan is False:
            if not _second_sighting(key):
                return _parse(text, base_iri, prefixes)
            try:
                plan = _parse(shape, base_iri, prefixes)
            except SparqlSyntaxError:
                plan = None  # report the error on the real text below
            if len(_SHAPES) >= SHAPE_CACHE_SIZE:
                _SHAPES.clear()
            _SHAPES[key] = plan
        if plan is not None:
            return instantiate(plan, originals, constants)  # type: ignore[arg-type]
    return _parse(text, base_iri, prefixes)


def _parse(text: str, base_iri: str | None, prefixes: dict[str, str] | None) -> ParsedUpdate:
    """The fast reading when it is sure, else (and for every error) the reading of every token."""
    try:
        return _Parser(text, base_iri, prefixes, fast=True).parse()
    except (_Unsure, SparqlSyntaxError, SyntaxError, BlockSyntax, ValueError):
        return _Parser(text, base_iri, prefixes, fast=False).parse()


def fresh_blank_nodes(quads: tuple[Quad, ...]) -> list[Quad]:
    """INSERT DATA semantics: every blank node label stands for a new blank node."""
    mapping: dict[BlankNode, BlankNode] = {}

    def fresh(term):  # type: ignore[no-untyped-def]
        if isinstance(term, BlankNode):
            if term not in mapping:
                mapping[term] = BlankNode()
            return mapping[term]
        return term

    if not any(isinstance(t, BlankNode) for quad in quads for t in (quad.subject, quad.object, quad.graph_name)):
        return list(quads)
    return [Quad(fresh(q.subject), q.predicate, fresh(q.object), fresh(q.graph_name)) for q in quads]
