"""Analysis of a subscription query into a parameterized *shape* for incremental processing.

Queries of the form SELECT [DISTINCT] vars|* / ASK over a group made of triple patterns, GRAPH,
nested groups, UNION and FILTER (without EXISTS) are rewritten as a union of conjunctive
*branches*. Their delta can be derived exactly from the changed quads (seed 001, BOOSTER).

Constants in subject, object and graph positions (not predicates, not rdf:type classes) and
IRI constants of `FILTER(?x = <iri>)` become *parameters*: all subscriptions that differ only in
those constants share one shape. The LUTT indexes a shape's patterns with each subscription's
parameter values, and a changed quad is evaluated once per shape, its solutions routed to the
subscriptions by parameter values, so the cost does not grow with the number of subscriptions.

Anything outside this subset raises :class:`NotIncremental`; such queries are re-evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyoxigraph import DefaultGraph, Literal, NamedNode, RdfFormat, parse

from broker.core.clock import FUNCTIONS_NS
from broker.sparql.canonical import canonical
from broker.sparql.patterns import QuadPattern, Var
from broker.sparql.tokens import matching_brace, tokenize

RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
PARAM_PREFIX = "__sepa_p"
BNODE_PREFIX = "__sepa_b_"
# what the names above start with: a query with a variable of its own so named is re-evaluated,
# its variable would otherwise be taken for a parameter or a blank node of the shape
INTERNAL_PREFIX = "__sepa_"
PATH_SYMBOLS = frozenset({"/", "|", "^", "*", "+", "?", "!", "("})


# functions whose result may be longer than their arguments, nested: each level multiplies. A
# FILTER is evaluated by pyoxigraph per solution, and an incremental subscription's on the update
# thread (or a BOOSTER worker) with no bound but the one a lookup's budget puts on the solutions:
# REPLACE(?o, "x", "xxxxxxxxxx") six levels deep held the update thread 13.5 s for 400 quads, eight
# levels took 1.26 GB for one quad. Such a subscription is re-evaluated instead: for a network
# client, in a worker under the time limit, killed past it.
STRING_BUILDERS = frozenset(("REPLACE", "CONCAT", "ENCODE_FOR_URI"))
# functions whose value is not the data's: the time (and the gateway's own, FUNCTIONS_NS), random
# numbers, fresh identifiers. An incremental subscription evaluates a FILTER once per solution, when
# a quad of the solution changes, and keeps the verdict: a row of `FILTER(?d > NOW())` stayed after
# ?d passed, while the query run again drops it. Such a subscription is re-evaluated at each update
# its patterns see, as the contract has it (docs/protocol.md, "Notification semantics").
NONDETERMINISTIC = frozenset(("NOW", "RAND", "UUID", "STRUUID", "BNODE"))


class NotIncremental(Exception):
    """The query is valid SPARQL outside the incremental subset (it will be re-evaluated)."""


@dataclass
class _Filter:
    text: str
    variables: frozenset[str]
    param: tuple[str, str] | None  # (variable, constant text) for FILTER(?v = <iri>)


@dataclass
class _BranchPart:
    patterns: list[tuple[object, object, object, object]] = field(default_factory=list)
    filters: list[_Filter] = field(default_factory=list)
    bound: set[str] = field(default_factory=set)

    def join(self, other: _BranchPart) -> _BranchPart:
        return _BranchPart(self.patterns + other.patterns, self.filters + other.filters, self.bound | other.bound)


@dataclass(frozen=True)
class Branch:
    """One conjunctive branch of a shape: patterns (with parameter variables) and residual filters."""

    patterns: tuple[QuadPattern, ...]
    filters: tuple[str, ...]
    param_vars: tuple[str, ...]
    variables: tuple[str, ...]

    def query_text(self, prologue: str) -> str:
        body = " ".join(pattern.to_sparql() for pattern in self.patterns)
        filters = " ".join(f"FILTER {text}" for text in self.filters)
        return f"{prologue}\nSELECT * WHERE {{ {body} {filters} }}"


@dataclass(frozen=True)
class Shape:
    """What the subscriptions of one group share."""

    kind: str  # "select" or "ask"
    distinct: bool
    branches: tuple[Branch, ...]
    prologue: str

    def key(self) -> tuple[object, ...]:
        """What subscriptions must have in common to share a group.

        A branch's parameter variables are part of it: two queries whose patterns and filters
        are the same may pin different variables (FILTER(?p = ex:q) and FILTER(?s = ex:s1)), and
        a group binds each subscription's values to its shape's `param_vars` by position."""
        return (
            self.kind,
            self.distinct,
            self.prologue,
            tuple((tuple(b.patterns), b.filters, b.param_vars) for b in self.branches),
        )


@dataclass(frozen=True)
class ShapedQuery:
    """A subscription query as shape + its own parameter values (one tuple per branch)."""

    shape: Shape
    params: tuple[tuple[object, ...], ...]


class _QueryParser:
    def __init__(self, text: str, prefixes: dict[str, str] | None) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.prologue: list[str] = [f"PREFIX {name}: <{iri}>" for name, iri in (prefixes or {}).items()]
        self.constants: list[str] = []
        self.calls: list[str] = []  # the IRIs (as written) of the functions FILTERs call

    def constant(self, text: str) -> int:
        self.constants.append(text)
        return len(self.constants) - 1

    def parse(self) -> tuple[str, bool, list[_BranchPart]]:
        tokens = self.tokens
        if any(token.kind == "VAR" and token.text[1:].startswith(INTERNAL_PREFIX) for token in tokens):
            raise NotIncremental(f"a variable named ?{INTERNAL_PREFIX}...")
        index = 0
        while index < len(tokens) and tokens[index].kind == "NAME" and tokens[index].text.upper() in ("PREFIX", "BASE"):
            end = index + (3 if tokens[index].text.upper() == "PREFIX" else 2)
            self.prologue.append(self.text[tokens[index].start : tokens[end - 1].start + len(tokens[end - 1].text)])
            index = end
        if index >= len(tokens) or tokens[index].kind != "NAME":
            raise NotIncremental("not a SELECT or ASK query")
        form = tokens[index].text.upper()
        index += 1
        distinct = False
        if form == "SELECT":
            if tokens[index].kind == "NAME" and tokens[index].text.upper() == "DISTINCT":
                distinct = True
                index += 1
            if tokens[index].text == "*":
                index += 1
            else:
                while index < len(tokens) and tokens[index].kind == "VAR":
                    index += 1
        elif form != "ASK":
            raise NotIncremental(f"{form} query")
        if index < len(tokens) and tokens[index].kind == "NAME" and tokens[index].text.upper() == "WHERE":
            index += 1
        if index >= len(tokens) or tokens[index].text != "{":
            raise NotIncremental("projection expressions, dataset clauses or REDUCED")
        branches, index = self.group(index, ("default", None), top=True)
        if index != len(tokens):
            raise NotIncremental("solution modifiers")
        return form.lower(), distinct, branches

    # -- group graph patterns -----------------------------------------------------------------

    def group(self, index: int, graph: tuple[str, object], top: bool) -> tuple[list[_BranchPart], int]:
        tokens = self.tokens
        close = matching_brace(tokens, index, self.text)
        current = [_BranchPart()]
        filters: list[_Filter] = []
        index += 1
        while index < close:
            token = tokens[index]
            word = token.text.upper() if token.kind == "NAME" else ""
            if token.kind == "PUNCT" and token.text == ".":
                index += 1
            elif word == "FILTER":
                found, index = self.filter(index + 1)
                filters.append(found)
            elif word == "GRAPH":
                name = tokens[index + 1]
                if name.kind == "VAR":
                    inner_graph: tuple[str, object] = ("var", name.text[1:])
                elif name.kind in ("IRI", "PNAME"):
                    inner_graph = ("const", self.constant(name.text))
                else:
                    raise NotIncremental("GRAPH name")
                if tokens[index + 2].text != "{":
                    raise NotIncremental("GRAPH syntax")
                sub, index = self.group(index + 2, inner_graph, top=False)
                if any(not part.patterns for part in sub):
                    raise NotIncremental("empty GRAPH group")
                if name.kind == "VAR":
                    for part in sub:
                        part.bound.add(name.text[1:])
                current = [a.join(b) for a in current for b in sub]
            elif token.kind == "PUNCT" and token.text == "{":
                alternatives, index = self.group(index, graph, top=False)
                while index < close and tokens[index].kind == "NAME" and tokens[index].text.upper() == "UNION":
                    more, index = self.group(index + 1, graph, top=False)
                    alternatives += more
                current = [a.join(b) for a in current for b in alternatives]
            elif (
                token.kind in ("VAR", "IRI", "PNAME", "BNODE", "STRING", "NUMBER")
                or word in ("TRUE", "FALSE")
                or (token.kind == "PUNCT" and token.text in ("+", "-"))
            ):
                patterns, index = self.triples(index, graph)
                for part in current:
                    part.patterns.extend(patterns)
                    for pattern in patterns:
                        part.bound.update(p[1] for p in pattern[:3] if isinstance(p, tuple) and p[0] == "var")
            else:
                raise NotIncremental(f"{token.text} in a group")
        for part in current:
            for found in filters:
                if not top and not found.variables <= part.bound:
                    raise NotIncremental("FILTER on variables outside its group")
                part.filters.append(found)
        return current, close + 1

    def filter(self, index: int) -> tuple[_Filter, int]:
        tokens = self.tokens
        start = tokens[index]
        if start.text == "(":
            end = matching_brace(tokens, index, self.text)
        elif start.kind in ("NAME", "IRI", "PNAME") and index + 1 < len(tokens) and tokens[index + 1].text == "(":
            if start.text.upper() in ("EXISTS", "NOT"):
                raise NotIncremental("EXISTS")
            end = matching_brace(tokens, index + 1, self.text)
        else:
            raise NotIncremental("FILTER syntax")
        inner = tokens[index : end + 1]
        for token in inner:
            if (token.kind == "NAME" and token.text.upper() in ("EXISTS", "NOT")) or token.text == "{":
                raise NotIncremental("EXISTS")
            if token.kind == "NAME" and token.text.upper() in STRING_BUILDERS:
                raise NotIncremental(f"{token.text.upper()} in a FILTER")
            if token.kind == "NAME" and token.text.upper() in NONDETERMINISTIC:
                raise NotIncremental(f"{token.text.upper()} in a FILTER")
        self.calls += [
            token.text
            for token, after in zip(inner, inner[1:], strict=False)
            if token.kind in ("IRI", "PNAME") and after.text == "("
        ]
        variables = frozenset(token.text[1:] for token in inner if token.kind == "VAR")
        param = None
        texts = [token.text for token in inner]
        kinds = [token.kind for token in inner]
        if len(inner) == 5 and texts[0] == "(" and texts[2] == "=" and texts[4] == ")":
            if kinds[1] == "VAR" and kinds[3] in ("IRI", "PNAME"):
                param = (texts[1][1:], texts[3])
            elif kinds[3] == "VAR" and kinds[1] in ("IRI", "PNAME"):
                param = (texts[3][1:], texts[1])
        text = self.text[start.start : tokens[end].start + 1]
        return _Filter(text, variables, param), end + 1

    # -- triples ------------------------------------------------------------------------------

    def term(self, index: int, position: str) -> tuple[object, int]:
        tokens = self.tokens
        token = tokens[index]
        if token.kind == "VAR":
            return ("var", token.text[1:]), index + 1
        if token.kind == "BNODE":
            return ("var", BNODE_PREFIX + token.text[2:]), index + 1
        if token.kind in ("IRI", "PNAME"):
            return ("const", self.constant(token.text)), index + 1
        if position == "predicate":
            if token.kind == "NAME" and token.text == "a":
                return ("const", self.constant(f"<{RDF_TYPE}>")), index + 1
            raise NotIncremental("property path")
        if token.kind == "STRING":
            end = index + 1
            if end < len(tokens) and tokens[end].kind == "LANG":
                end += 1
            elif end < len(tokens) and tokens[end].text == "^^":
                end += 2
            text = self.text[token.start : tokens[end - 1].start + len(tokens[end - 1].text)]
            return ("const", self.constant(text)), end
        if token.kind == "NUMBER":
            return ("const", self.constant(token.text)), index + 1
        if (
            token.kind == "PUNCT"
            and token.text in ("+", "-")
            and index + 1 < len(tokens)
            and tokens[index + 1].kind == "NUMBER"
        ):
            return ("const", self.constant(token.text + tokens[index + 1].text)), index + 2
        if token.kind == "NAME" and token.text.lower() in ("true", "false"):
            return ("const", self.constant(token.text.lower())), index + 1
        raise NotIncremental(f"{token.text} as a term")

    def triples(self, index: int, graph: tuple[str, object]) -> tuple[list[tuple[object, ...]], int]:
        tokens = self.tokens
        out: list[tuple[object, ...]] = []
        subject, index = self.term(index, "subject")
        while True:
            predicate, index = self.term(index, "predicate")
            if index < len(tokens) and tokens[index].kind == "PUNCT" and tokens[index].text in PATH_SYMBOLS:
                raise NotIncremental("property path")
            while True:
                obj, index = self.term(index, "object")
                out.append((subject, predicate, obj, graph))
                if tokens[index].text == "," and tokens[index].kind == "PUNCT":
                    index += 1
                    continue
                break
            if tokens[index].text == ";" and tokens[index].kind == "PUNCT":
                while tokens[index].text == ";":
                    index += 1
                if tokens[index].text in (".", "}"):
                    return out, index
                continue
            return out, index


def _resolve_constants(texts: list[str], prologue: str) -> list[object]:
    """Constant term texts -> pyoxigraph terms, by one real Turtle parse (prefixes, escapes, numbers)."""
    if not texts:
        return []
    body = "\n".join(f"<urn:x-sepa:{index}> <urn:x-sepa:p> {text} ." for index, text in enumerate(texts))
    try:
        quads = list(parse(f"{prologue}\n{body}", format=RdfFormat.TURTLE))
    except SyntaxError as error:
        raise NotIncremental(f"constant terms: {error}") from error
    resolved: list[object] = [None] * len(texts)
    for quad in quads:
        resolved[int(quad.subject.value.rsplit(":", 1)[1])] = canonical(quad.object)
    return resolved


def shape_query(text: str, prefixes: dict[str, str] | None = None) -> ShapedQuery:
    """Analyse a subscription query; raises NotIncremental outside the subset."""
    parser = _QueryParser(text, prefixes)
    try:
        kind, distinct, parts = parser.parse()
    except RecursionError:
        # groups nested deeper than this thread's recursion limit, under broker.sparql.limits' (990
        # braces): the subscription was refused, and each logged an ERROR with a traceback
        raise NotIncremental("groups nested too deep to be shaped") from None
    prologue = "\n".join(parser.prologue)
    for function in _resolve_constants(parser.calls, prologue):
        if isinstance(function, NamedNode) and function.value.startswith(FUNCTIONS_NS):
            raise NotIncremental(f"{function} in a FILTER")  # fn:now, fn:nowMicros: see NONDETERMINISTIC
    constants = _resolve_constants(parser.constants, prologue)
    branches: list[Branch] = []
    params: list[tuple[object, ...]] = []
    for part in parts:
        if not part.patterns:
            raise NotIncremental("a branch without triple patterns")
        param_vars: list[str] = []
        values: list[object] = []
        residual: list[str] = []
        pinned: dict[str, object] = {}
        for found in part.filters:
            if found.param is not None and found.param[0] in part.bound:
                variable, constant_text = found.param
                value = _resolve_constants([constant_text], prologue)[0]
                if variable in pinned and pinned[variable] != value:
                    residual.append(found.text)  # contradictory pins: keep as a real filter
                    continue
                if variable not in pinned:
                    pinned[variable] = value
                    param_vars.append(variable)
                    values.append(value)
            else:
                residual.append(found.text)

        patterns = []
        for subject, predicate, obj, graph in part.patterns:
            predicate_term = _position(predicate, False, constants, param_vars, values)
            is_type = isinstance(predicate_term, NamedNode) and predicate_term.value == RDF_TYPE
            patterns.append(
                QuadPattern(
                    _position(subject, not _is_literal(subject, constants), constants, param_vars, values),
                    predicate_term,
                    _position(obj, not is_type, constants, param_vars, values),
                    _position(graph, True, constants, param_vars, values),
                )
            )
        variables = sorted({name for pattern in patterns for name in pattern.variables()} | set(pinned))
        branches.append(Branch(tuple(patterns), tuple(residual), tuple(param_vars), tuple(variables)))
        params.append(tuple(values))
    return ShapedQuery(Shape(kind, distinct, tuple(branches), prologue), tuple(params))


def _position(raw: object, allow_param: bool, constants: list[object], param_vars: list[str], values: list[object]):
    """A pattern position: a variable, the default graph, a constant, or a new parameter variable."""
    kind, value = raw  # type: ignore[misc]
    if kind == "var":
        return Var(value)
    if kind == "default":
        return DefaultGraph()
    term = constants[value]
    if not allow_param:
        return term
    name = f"{PARAM_PREFIX}{len(param_vars)}"
    param_vars.append(name)
    values.append(term)
    return Var(name)


def _is_literal(raw: object, constants: list[object]) -> bool:
    kind, value = raw  # type: ignore[misc]
    return kind == "const" and isinstance(constants[value], Literal)
