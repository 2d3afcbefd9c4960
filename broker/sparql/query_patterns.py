"""Triple patterns of any SPARQL query, for the LUTT entries of re-evaluated subscriptions.

Re-evaluating SPUs are exact whatever the query; the LUTT only has to be *conservative*: every
quad that can change the result must hit one of these patterns (no false negatives). rdflib's
full SPARQL 1.1 parser gives the algebra; every triple pattern in it counts, wherever it sits
(OPTIONAL, MINUS, EXISTS, subqueries), with its GRAPH context. Variables, blank nodes and, to be
safe against rdflib's literal normalisation, literals are wildcards; property paths contribute
one pattern per IRI they mention; paths that can match zero steps or negated sets match anything.

rdflib's parser is slow (pyparsing: ~5 ms for a one-line OPTIONAL query, half of subscribing 1,000
of them took), and subscriptions often differ only in constants. So the text is abstracted first
(:func:`_abstracted`): IRIs and prefixed names become numbered slot IRIs, strings and numbers one
placeholder each (literals are wildcards anyway); the patterns of the abstract text are cached,
and the slots put back. Every replacement keeps the token's grammatical class (an IRI for an
IRI or a prefixed name, a string for a string, a number for a number), so the abstract text parses
exactly as the original does, with the same structure.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from pyoxigraph import NamedNode
from pyparsing import ParseResults
from rdflib import URIRef
from rdflib.paths import AlternativePath, InvPath, MulPath, NegatedPath, Path, SequencePath
from rdflib.plugins.sparql.algebra import translatePath, translateQuery, traverse
from rdflib.plugins.sparql.parser import parseQuery
from rdflib.plugins.sparql.parserutils import CompValue

from broker.errors import SparqlSyntaxError
from broker.sparql.limits import operator_count
from broker.sparql.tokens import tokenize

DEFAULT = "default"  # the query's default graph
NAMED = "named"  # any named graph (GRAPH ?g)
ANY = "any"  # any graph at all

GraphKey = str | NamedNode


@dataclass(frozen=True, slots=True)
class LoosePattern:
    """A triple pattern for filtering: None is a wildcard; graph is DEFAULT, NAMED, ANY or an IRI."""

    graph: GraphKey
    subject: NamedNode | None
    predicate: NamedNode | None
    object: NamedNode | None


EVERYTHING = (LoosePattern(ANY, None, None, None),)
SLOT = "urn:sepa-gateway:slot:"
# a longer text is not parsed: it may be woken by anything (EVERYTHING, re-evaluated on every update).
# Why: rdflib takes ~35 us a byte (a subscription of 1 MiB, the WebSocket message limit, ~40 s of
# the GIL), and its cache would keep every abstract text it read
MAX_CHARS = 64 * 1024
# nor is a text of more operators than this in all (each within the per-chain limit of
# broker.sparql.limits): pyparsing spends ~0.8 ms an operator, and 30 chains of 499 `+` (60 KB)
# took 10.8 s, holding the parsing lock every other subscriber waits for (/tmp/rdfp.py); 1,000 take ~0.8 s
MAX_OPERATORS = 1_000
# one parse at a time: pyparsing's parser state is shared, and parses on two threads (probes of
# subscriptions in the query threads) failed now and then, each failure a subscription woken by
# every update
_PARSING = threading.Lock()
_ABSOLUTE = re.compile(r"<[A-Za-z][A-Za-z0-9+.\-]*:[^<>\"{}|^`\\\x00-\x20]*>")


def _iri(term: object) -> NamedNode | None:
    return NamedNode(str(term)) if isinstance(term, URIRef) else None


def _path_iris(path: object) -> tuple[list[NamedNode], bool]:
    """IRIs in a property path, and whether the path may match anything (zero steps, negation)."""
    if isinstance(path, URIRef):
        return [NamedNode(str(path))], False
    if isinstance(path, NegatedPath):
        return [], True
    if isinstance(path, MulPath):
        iris, wild = _path_iris(path.path)
        return iris, wild or bool(path.zero)
    if isinstance(path, InvPath):
        return _path_iris(path.arg)
    if isinstance(path, SequencePath | AlternativePath):
        found: list[NamedNode] = []
        wild = False
        for arg in path.args:
            more, more_wild = _path_iris(arg)
            found += more
            wild = wild or more_wild
        return found, wild
    return [], True


def _parsed_path(predicate: object) -> object:
    """A predicate rdflib left as a parse-tree node, as the algebra has it: an IRI or a Path.

    rdflib translates paths only in the WHERE clause; an EXISTS in a projection, HAVING, ORDER BY
    or GROUP BY expression keeps them as parse-tree nodes (a plain IRI too, as a one-step
    PathAlternative). Read as an IRI with its subject and object constants, `?x ^ex:p ex:s1` was
    keyed on the object ex:s1 and `ex:s1 ex:p/ex:q ?z` on the subject ex:s1, so the quads that
    change them (ex:s1 ex:p ?x, ?y ex:q ?z) never woke the subscription. What cannot be
    translated is returned as it is (a wildcard in _triple)."""
    if not isinstance(predicate, CompValue | list | ParseResults):
        return predicate
    try:
        return traverse(predicate, visitPost=translatePath)
    except Exception:  # noqa: BLE001 - rdflib's own checks ("Denkfehler!"): match everything
        return predicate


def _triple(triple: object, graph: GraphKey) -> Iterator[LoosePattern]:
    subject, predicate, obj = triple  # type: ignore[misc]
    predicate = _parsed_path(predicate)
    if isinstance(predicate, CompValue | list | ParseResults):
        yield LoosePattern(graph, None, None, None)
        return
    if isinstance(predicate, Path):
        iris, wild = _path_iris(predicate)
        if wild:
            yield LoosePattern(graph, None, None, None)
            return
        for iri in iris:
            yield LoosePattern(graph, None, iri, None)
        return
    yield LoosePattern(graph, _iri(subject), _iri(predicate), _iri(obj))


def _walk(node: object, graph: GraphKey) -> Iterator[LoosePattern]:
    if isinstance(node, CompValue):
        if node.name in ("Graph", "GraphGraphPattern"):
            inner: GraphKey = ANY if graph == ANY else (_iri(node.get("term")) or NAMED)
            for key, value in node.items():
                if key != "term":
                    yield from _walk(value, inner)
            return
        if node.name == "ServiceGraphPattern":
            return
        triples = node.get("triples")
        if isinstance(triples, list):
            for triple in triples:
                # inside an EXISTS, rdflib may leave the parse tree: a subject with property and
                # object lists is one flat list of 3k terms, its paths untranslated (_parsed_path
                # translates them) and prefixed names unresolved (wildcards in _triple: wider,
                # never narrower)
                for start in range(0, len(triple) - 2, 3):
                    yield from _triple(triple[start : start + 3], graph)
        for key, value in node.items():
            if key != "triples":
                yield from _walk(value, graph)
    elif isinstance(node, list | tuple):
        for item in node:
            yield from _walk(item, graph)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _walk(value, graph)


_EXISTS = ("Builtin_EXISTS", "Builtin_NOTEXISTS")


def _exists_count(node: object) -> int:
    """How many [NOT] EXISTS a parse tree or an algebra holds."""
    if isinstance(node, CompValue):
        return (node.name in _EXISTS) + sum(_exists_count(value) for value in node.values())
    if isinstance(node, list | tuple | ParseResults):
        return sum(_exists_count(item) for item in node)
    if isinstance(node, dict):
        return sum(_exists_count(value) for value in node.values())
    return 0


def _abstracted(text: str) -> tuple[str, tuple[NamedNode, ...]]:
    """`text` with its constants replaced (see the module docstring), and the IRI of each slot.

    Left as they are: the IRIs of PREFIX and BASE declarations and datatypes (after ``^^``),
    relative IRIs (they depend on BASE), prefixed names whose prefix the text does not declare
    with an absolute IRI or whose local part has escapes, and typed literals' strings."""
    try:
        tokens = tokenize(text)
    except SparqlSyntaxError:
        return text, ()
    declared: dict[str, str] = {}
    slots: dict[str, int] = {}
    parts: list[str] = []
    end = 0
    for index, token in enumerate(tokens):
        kind, value, start = token
        before = tokens[index - 1].text.upper() if index else ""
        declaring = index > 1 and tokens[index - 2].text.upper() == "PREFIX"
        after = tokens[index + 1].text if index + 1 < len(tokens) else ""
        replacement = None
        if kind == "IRI" and before not in ("BASE", "^^") and not declaring:
            if _ABSOLUTE.fullmatch(value):
                replacement = value[1:-1]
        elif kind == "PNAME" and before != "PREFIX":
            prefix, _, local = value.partition(":")
            if prefix in declared and "\\" not in local:
                replacement = declared[prefix] + local
        elif kind == "STRING" and after != "^^":  # rdflib logs an ill-typed literal
            parts += [text[end:start], '"s"']
            end = start + len(value)
        elif kind == "NUMBER":
            parts += [text[end:start], "0"]
            end = start + len(value)
        if kind == "IRI" and declaring and _ABSOLUTE.fullmatch(value):
            declared[tokens[index - 1].text[:-1]] = value[1:-1]
        if replacement is not None:
            slot = slots.setdefault(replacement, len(slots))
            parts += [text[end:start], f"<{SLOT}{slot}>"]
            end = start + len(value)
    parts.append(text[end:])
    return "".join(parts), tuple(NamedNode(iri) for iri in slots)


def _filled(term: object, iris: tuple[NamedNode, ...]) -> object:
    if isinstance(term, NamedNode) and term.value.startswith(SLOT):
        return iris[int(term.value[len(SLOT) :])]
    return term


@lru_cache(maxsize=1024)
def cached_patterns(text: str, prefixes: tuple[tuple[str, str], ...]) -> tuple[LoosePattern, ...]:
    """The patterns of `text` as rdflib reads it, cached (query_patterns calls it with abstract texts)."""
    try:
        with _PARSING:
            parsed = parseQuery(text)
            written = _exists_count(parsed)  # before translation, which works on the parse tree
            query = translateQuery(parsed, initNs=dict(prefixes))
    except Exception:  # noqa: BLE001 - anything rdflib cannot read: match everything
        return EVERYTHING
    if _exists_count(query.algebra) < written:
        # rdflib's translation drops a FILTER [NOT] EXISTS nested in another one's group (rdflib
        # 7): its patterns would be missing, and the subscription never told of their changes
        return EVERYTHING
    # FROM / FROM NAMED move the default graph: be conservative about graphs then
    graph = ANY if query.algebra.get("datasetClause") else DEFAULT
    try:
        patterns = tuple(dict.fromkeys(_walk(query.algebra, graph)))
    except ValueError:
        # an IRI rdflib made that pyoxigraph refuses, from valid SPARQL: rdflib keeps the escape of
        # a prefixed name (ex:s\-1 as http://example.org/s\-1) and does not resolve a relative BASE
        # against the one before; the subscribe failed with a bare ValueError. Such a query is
        # woken by every update (correct, slower)
        return EVERYTHING
    return patterns or EVERYTHING


def query_patterns(text: str, prefixes: dict[str, str] | None = None) -> tuple[LoosePattern, ...]:
    """Conservative triple patterns of `text` (at least one); past MAX_CHARS or MAX_OPERATORS, match
    everything."""
    if len(text) > MAX_CHARS or operator_count(text) > MAX_OPERATORS:
        return EVERYTHING
    abstract, iris = _abstracted(text)
    patterns = cached_patterns(abstract, tuple(sorted((prefixes or {}).items())))
    if not iris:
        return patterns
    return tuple(
        dict.fromkeys(
            LoosePattern(*(_filled(term, iris) for term in (each.graph, each.subject, each.predicate, each.object)))  # type: ignore[arg-type]
            for each in patterns
        )
    )
