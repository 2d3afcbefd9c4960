"""Hypothesis strategies for the differential tests: tiny datasets and SPARQL 1.1 Update requests.

Why a deliberately tiny vocabulary: random updates only find bugs when they collide with the data
and with the subscription queries. With 3 IRI subjects, 2 blank nodes, 3 predicates, a dozen
literal spellings and 2 named graphs (+ one that starts out missing), almost every generated
update touches something a query in ``queries.py`` looks at, and shrunk counterexamples stay short.

The literal spellings are chosen to hit the places where "the same value" and "the same term"
part ways: ``"a"`` / ``"a"^^xsd:string`` (one RDF term, two spellings), ``"a"@en`` / ``"a"@EN``
(language tags are case-insensitive), ``1`` / ``01`` / ``"+1"`` integers (different lexical forms
of one value; Oxigraph canonicalizes them when storing), ``1.0`` decimal and ``1e0`` double
(equal value, different datatype) and an ill-typed ``"abc"^^xsd:integer``.

Every update form of SPARQL 1.1 Update is generated: INSERT DATA, DELETE DATA, DELETE/INSERT
WHERE (optionally with WITH, USING, USING NAMED, GRAPH ?g templates, blank nodes in INSERT
templates, FILTERs), DELETE WHERE, CLEAR / DROP (GRAPH, DEFAULT, NAMED, ALL, SILENT), CREATE,
ADD, MOVE, COPY, and ``;``-separated multi-operation requests (random ones, and fixed ones whose
operations interact). Some requests change nothing and some fail (CREATE of an existing graph,
DROP of a missing graph, syntax errors, a failing last operation of a multi-operation request),
because "a failed request changes nothing and notifies no one" is part of the contract.

The engine parses SPARQL itself, so the same grammar is also spelled differently: a fixed list of
syntax variants (lists with ``;`` / ``,``, quotes and escapes, ``a``, BASE, comments, full
datatype IRIs, WHERE clauses with UNION / OPTIONAL / MINUS / paths / subqueries ...) and a random
respelling of generated requests (prefixed names as full IRIs, lower-case keywords).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EX = "http://example.org/"
XSD = "http://www.w3.org/2001/XMLSchema#"
PROLOGUE = f"PREFIX ex: <{EX}>\nPREFIX xsd: <{XSD}>\n"

G1 = EX + "g1"
G2 = EX + "g2"
G3 = EX + "g3"  # starts out missing: target of CREATE / MOVE / COPY, so graphs come and go
MISSING = EX + "missing"  # never created by any generated update: DROP of it always fails

NAMED_GRAPHS = ("ex:g1", "ex:g2")
GRAPH_TARGETS = ("ex:g1", "ex:g2", "ex:g3")

IRI_SUBJECTS = ("ex:s1", "ex:s2", "ex:s3")
BLANK_SUBJECTS = ("_:b1", "_:b2")
PREDICATES = ("ex:p", "ex:q", "ex:r")
LITERALS = (
    '"a"',
    '"a"^^xsd:string',
    '"a"@en',
    '"a"@EN',
    '"b"',
    '"1"',
    "1",
    "01",
    '"+1"^^xsd:integer',
    "2",
    "1.0",
    "1e0",
    '"true"^^xsd:boolean',
    '"abc"^^xsd:integer',
)
OBJECT_IRIS = ("ex:s1", "ex:s2", "ex:o")
ODD_ONE = "01"  # the non-canonical integer used in patterns and templates (canonical: "1")

# -- example budgets ---------------------------------------------------------------------------
# The whole folder must run in about three minutes on two cores; SEPA_DIFF_EXAMPLES scales every
# budget (e.g. SEPA_DIFF_EXAMPLES=10 for a long local bug hunt).
_SCALE = float(os.environ.get("SEPA_DIFF_EXAMPLES", "1"))
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def budget(max_examples: int) -> settings:
    """Hypothesis settings for one test: no deadline (engine calls vary a lot), scaled examples."""
    return settings(
        max_examples=max(1, int(max_examples * _SCALE)),
        deadline=None,
        suppress_health_check=_HEALTH,
    )


# -- ground data ---------------------------------------------------------------------------------

TextQuad = tuple[str | None, str, str, str]  # (graph or None for the default graph, s, p, o) as SPARQL text


def _quads(*, blank_nodes: bool, graphs: tuple[str, ...] = NAMED_GRAPHS) -> st.SearchStrategy[TextQuad]:
    """Ground quads, biased towards a few "hot" terms so that data, updates and queries collide.

    Half of the objects are nodes (IRIs / blank nodes, so joins and paths chain), half literals.
    """
    subjects = ("ex:s1", "ex:s1", *IRI_SUBJECTS) + (BLANK_SUBJECTS if blank_nodes else ())
    nodes = OBJECT_IRIS + (BLANK_SUBJECTS if blank_nodes else ())
    return st.tuples(
        st.sampled_from((None, None, *graphs)),
        st.sampled_from(subjects),
        st.sampled_from(("ex:p", *PREDICATES)),
        st.one_of(st.sampled_from(nodes), st.sampled_from(LITERALS)),
    )


def quad_block(quads: list[TextQuad] | tuple[TextQuad, ...]) -> str:
    """The body of an INSERT DATA / DELETE DATA block, default-graph triples first."""
    default = [f"{s} {p} {o} ." for g, s, p, o in quads if g is None]
    named: dict[str, list[str]] = {}
    for g, s, p, o in quads:
        if g is not None:
            named.setdefault(g, []).append(f"{s} {p} {o} .")
    parts = default + [f"GRAPH {g} {{ {' '.join(ts)} }}" for g, ts in named.items()]
    return " ".join(parts)


def dataset_text(quads: tuple[TextQuad, ...]) -> str:
    """A dataset as the one INSERT DATA request that loads it."""
    return f"{PROLOGUE}INSERT DATA {{ {quad_block(quads)} }}"


def dataset_quads(max_quads: int = 16) -> st.SearchStrategy[tuple[TextQuad, ...]]:
    """Initial data: default graph + ex:g1 + ex:g2, blank nodes included; empty one time in 8.

    Hypothesis favours short lists, and updates over 0-3 quads nearly always match nothing, so
    the size has a floor except for the deliberate empty store.
    """
    sized = st.lists(_quads(blank_nodes=True), min_size=5, max_size=max_quads, unique=True).map(tuple)
    return st.one_of(sized, sized, sized, sized, sized, sized, sized, st.just(()))


def datasets(max_quads: int = 16) -> st.SearchStrategy[str]:
    """An initial dataset as INSERT DATA text."""
    return dataset_quads(max_quads).map(dataset_text)


# -- update requests -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    """One generated update request.

    sparql / using_graph_uri / using_named_graph_uri are what the engine receives.
    oracle_sparql is the same request with the protocol-level USING parameters written into the
    text, because pyoxigraph.Store.update has no such parameters. deterministic is False when the
    request inserts blank nodes (fresh labels make two stores differ), so the pyoxigraph oracle
    test never draws those.
    """

    sparql: str
    using_graph_uri: tuple[str, ...] = ()
    using_named_graph_uri: tuple[str, ...] = ()
    oracle_sparql: str = ""
    deterministic: bool = True

    def __repr__(self) -> str:  # what hypothesis prints in a falsifying example: the bare request
        params = ""
        if self.using_graph_uri or self.using_named_graph_uri:
            params = (
                f"  [using-graph-uri={list(self.using_graph_uri)} "
                f"using-named-graph-uri={list(self.using_named_graph_uri)}]"
            )
        return repr(self.sparql.removeprefix(PROLOGUE) + params)

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class Scenario:
    """Initial data plus a sequence of updates drawn knowing that data (see :func:`scenarios`)."""

    dataset: str
    updates: tuple[UpdateRequest, ...]

    def __repr__(self) -> str:
        lines = [f"dataset: {self.dataset.removeprefix(PROLOGUE)!r}"]
        lines += [f"  update {i}: {request!r}" for i, request in enumerate(self.updates)]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Op:
    """One operation of a request, plus whether it inserts blank nodes."""

    text: str
    bnodes: bool = False


FILTERS = (
    "isLiteral(?o)",
    "?o > 1",
    "?o = 1",
    'lang(?o) = "en"',
    "?s != ex:s1",
    "isBlank(?s)",
    "isIRI(?o)",
    'str(?o) = "a"',
    "?o IN (ex:s1, ex:o, 2)",
    "!bound(?x)",
    # pins (`?v = <iri>`): the engine answers a WHERE of patterns and pins by index lookups
    "?s = ex:s1",
    "ex:s2 = ?s",
    "?o = ex:o",
)


# VALUES rows: IRIs (index lookups in the engine), and terms only the query engine takes
VALUES_TERMS = ("ex:s1", "ex:s2", "ex:o", "ex:g1", "ex:p", "<http://example.org/s1>", '"a"', "1", "UNDEF")


def _one_in(n: int) -> st.SearchStrategy[bool]:
    """True with probability 1/n (a readable knob for how often an optional part appears)."""
    return st.integers(0, n - 1).map(lambda i: i == n - 1)  # not i == 0: Hypothesis favours 0


@dataclass(frozen=True, slots=True)
class _Where:
    """A generated WHERE group and what templates need to know about it."""

    group: str
    matched: str  # the first triple pattern as a template in the same graph scope
    bound: tuple[str, ...]  # variables the group binds (templates mostly use these)


@st.composite
def _where(draw: st.DrawFn) -> _Where:
    """A WHERE group over ?s ?o (?x, ?p, ?g), with an optional second pattern, GRAPH and FILTER."""
    predicate = draw(st.sampled_from((*PREDICATES, "?p")))
    obj = draw(st.sampled_from(("?o", "?o", "?o", "?o", "ex:o", ODD_ONE, '"a"')))
    first = f"?s {predicate} {obj}"
    triples = [first]
    if draw(_one_in(3)):
        triples.append(
            draw(st.sampled_from(("?o", "?s")))
            + f" {draw(st.sampled_from(PREDICATES))} "
            + draw(st.sampled_from(("?x", "?x", "ex:s1", '"a"')))
        )
    body = " . ".join(triples)
    scope = draw(st.sampled_from(("", "", "", "?g", "ex:g1", "ex:g2")))
    matched = f"{first} ."
    if scope:
        body = f"GRAPH {scope} {{ {body} }}"
        matched = f"GRAPH {scope} {{ {matched} }}"
    for _ in range(draw(st.sampled_from((0, 0, 0, 0, 0, 0, 1, 1, 2)))):  # two: both must hold
        condition = f"FILTER({draw(st.sampled_from(FILTERS))})"
        body = f"{condition} {body}" if draw(st.booleans()) else f"{body} {condition}"
    if draw(_one_in(4)):  # inline data, before or after the patterns (a join either way)
        variable = draw(st.sampled_from(("?s", "?s", "?o", "?g", "?p", "?z")))
        rows = draw(st.lists(st.sampled_from(VALUES_TERMS), max_size=4))
        values = f"VALUES {variable} {{ {' '.join(rows)} }}"
        body = f"{values} {body}" if draw(st.booleans()) else f"{body} {values}"
    for _ in range(draw(st.sampled_from((0, 0, 1, 2)))):  # left joins: values that may be missing
        optional = (
            draw(st.sampled_from(("?s", "?o", "?y")))
            + f" {draw(st.sampled_from(PREDICATES))} "
            + draw(st.sampled_from(("?y", "?y", "?x", '"a"')))
        )
        if draw(_one_in(3)):
            optional = f"GRAPH {draw(st.sampled_from(('ex:g1', '?g2')))} {{ {optional} }}"
        body += f" OPTIONAL {{ {optional} }}"
    bound = tuple(v for v in ("?s", "?o", "?p", "?x", "?g", "?y") if v in body)
    return _Where(body, matched, bound)


TEMPLATE_OBJECTS = ("ex:o", '"a"', ODD_ONE, "2")


@st.composite
def _template(draw: st.DrawFn, where: _Where, *, bnodes: bool) -> tuple[str, bool]:
    """A DELETE or INSERT template over mostly bound variables; returns (text, uses a blank node).

    One variable in eight may be unbound on purpose: such template triples must be skipped.
    """
    bound = tuple(v for v in where.bound if v != "?g") or ("?s",)

    def term(constants: tuple[str, ...]) -> str:
        kind = draw(st.integers(0, 7))  # Hypothesis favours small values: the common case first
        if kind == 7:
            return "?unbound"
        return draw(st.sampled_from(bound if kind <= 4 else constants))

    subjects: tuple[str, ...] = ("ex:s1", "ex:s2") + (("_:new", "_:new") if bnodes else ())
    predicates = PREDICATES if "?p" not in where.bound else (*PREDICATES, "?p", "?p")
    triples = [
        f"{term(subjects)} {draw(st.sampled_from(predicates))} {term(TEMPLATE_OBJECTS)} ."
        for _ in range(draw(st.integers(1, 2)))
    ]
    body = " ".join(triples)
    scopes = ("", "", "", "ex:g1", "ex:g2", "ex:g3") + (("?g", "?g", "?g") if "?g" in where.bound else ())
    scope = draw(st.sampled_from(scopes))
    if scope:
        body = f"GRAPH {scope} {{ {body} }}"
    return body, "_:new" in body


@st.composite
def _modify(draw: st.DrawFn, *, bnodes: bool) -> _Op:
    """DELETE/INSERT ... WHERE, optionally with WITH, USING and USING NAMED."""
    where = draw(_where())
    kind = draw(st.sampled_from(("delete-insert", "insert", "delete")))
    parts = []
    used_bnode = False
    if draw(_one_in(5)):
        parts.append(f"WITH {draw(st.sampled_from(GRAPH_TARGETS))}")
    if kind in ("delete-insert", "delete"):
        delete = where.matched if draw(st.booleans()) else draw(_template(where, bnodes=False))[0]
        parts.append(f"DELETE {{ {delete} }}")
    if kind in ("delete-insert", "insert"):
        text, used_bnode = draw(_template(where, bnodes=bnodes))
        parts.append(f"INSERT {{ {text} }}")
    if draw(_one_in(5)):
        parts.append(f"USING {draw(st.sampled_from((*NAMED_GRAPHS, 'ex:g3')))}")
    if draw(_one_in(6)):
        parts.append(f"USING NAMED {draw(st.sampled_from(NAMED_GRAPHS))}")
    parts.append(f"WHERE {{ {where.group} }}")
    return _Op(" ".join(parts), used_bnode)


_DELETE_WHERE_OBJECTS = ("?o", "?o", "?o", "ex:o", '"a"', "1", "?x")


@st.composite
def _delete_where(draw: st.DrawFn) -> _Op:
    """DELETE WHERE { quad pattern } (no blank nodes: they are not allowed there)."""
    triples = []
    for _ in range(1 + draw(_one_in(4))):
        triples.append(
            f"{draw(st.sampled_from(('?s', '?s', '?s', 'ex:s1', 'ex:s2')))} "
            f"{draw(st.sampled_from((*PREDICATES, '?p')))} "
            f"{draw(st.sampled_from(_DELETE_WHERE_OBJECTS))} ."
        )
    body = " ".join(triples)
    scope = draw(st.sampled_from(("", "", "?g", "ex:g1", "ex:g2")))
    if scope:
        body = f"GRAPH {scope} {{ {body} }}"
    return _Op(f"DELETE WHERE {{ {body} }}")


def _data_quads(known: tuple[TextQuad, ...], *, blank_nodes: bool) -> st.SearchStrategy[list[TextQuad]]:
    """1-4 ground quads, most of them (when there is data) quads the store already holds."""
    fresh = _quads(blank_nodes=blank_nodes, graphs=GRAPH_TARGETS)
    element = st.one_of(st.sampled_from(known), st.sampled_from(known), fresh) if known else fresh
    return st.lists(element, min_size=1, max_size=4)


@st.composite
def _insert_data(draw: st.DrawFn, *, bnodes: bool, known: tuple[TextQuad, ...]) -> _Op:
    quads = draw(_data_quads(known, blank_nodes=bnodes))
    return _Op(f"INSERT DATA {{ {quad_block(quads)} }}", any("_:" in s + o for _, s, _, o in quads))


@st.composite
def _delete_data(draw: st.DrawFn, *, known: tuple[TextQuad, ...]) -> _Op:
    quads = draw(_data_quads(known, blank_nodes=False))
    return _Op(f"DELETE DATA {{ {quad_block(quads)} }}")


def _graph_ref() -> st.SearchStrategy[str]:
    return st.sampled_from(tuple(f"GRAPH {g}" for g in GRAPH_TARGETS) + ("DEFAULT", "NAMED", "ALL"))


def _silent() -> st.SearchStrategy[str]:
    return st.sampled_from(("", " SILENT"))


@st.composite
def _graph_management(draw: st.DrawFn) -> _Op:
    """CLEAR / DROP / CREATE / ADD / MOVE / COPY, with and without SILENT."""
    kind = draw(st.sampled_from(("CLEAR", "DROP", "CREATE", "ADD", "MOVE", "COPY")))
    silent = draw(_silent())
    if kind in ("CLEAR", "DROP"):
        return _Op(f"{kind}{silent} {draw(_graph_ref())}")
    if kind == "CREATE":
        return _Op(f"CREATE{silent} GRAPH {draw(st.sampled_from(GRAPH_TARGETS))}")
    endpoints = ("DEFAULT", *GRAPH_TARGETS, "GRAPH ex:g1")
    source = draw(st.sampled_from(endpoints))
    target = draw(st.sampled_from(endpoints))
    return _Op(f"{kind}{silent} {source} TO {target}")


# Requests that must fail and change nothing: variables / blank nodes where the grammar forbids
# them, truncated text, and runtime failures that do not depend on the current data.
FAILING = (
    "INSERT DATA { ?x ex:p ex:o }",
    "DELETE DATA { _:b ex:p ex:o }",
    "DELETE WHERE { _:b ex:p ?o }",
    "INSERT DATA { ex:s1 ex:p }",
    "DROP GRAPH ex:missing",
    "CLEAR GRAPH ex:missing",
    "MOVE ex:missing TO DEFAULT",
    "CREATE GRAPH ex:g1 ; CREATE GRAPH ex:g1",
    "DELETE { ?s ex:p ?o } WHERE { ?s ex:p ?o FILTER(",
)

# Requests that change nothing whatever the data: the engine must send no notification at all.
NO_CHANGE = (
    "INSERT DATA { }",
    "DELETE DATA { ex:nothing ex:p ex:o }",
    "DELETE WHERE { ex:nothing ?p ?o }",
    "DELETE { ?s ex:p ?o } INSERT { ?s ex:p ?o } WHERE { ?s ex:p ?o }",
    "DELETE { GRAPH ?g { ?s ?p ?o } } INSERT { GRAPH ?g { ?s ?p ?o } } WHERE { GRAPH ?g { ?s ?p ?o } }",
    "INSERT { ?s ?p ?o } WHERE { ?s ?p ?o }",
    "CLEAR SILENT GRAPH ex:missing",
    "DROP SILENT GRAPH ex:missing",
    "ADD DEFAULT TO DEFAULT",
    "MOVE SILENT GRAPH ex:g1 TO ex:g1",
    "COPY ex:g2 TO ex:g2",
)


def _operation(*, bnodes: bool, known: tuple[TextQuad, ...]) -> st.SearchStrategy[_Op]:
    """One operation; weighted so that data keeps coming in while deletions and clears thin it."""
    insert_data = _insert_data(bnodes=bnodes, known=known)
    modify = _modify(bnodes=bnodes)
    return st.one_of(
        modify,
        insert_data,
        modify,
        _delete_data(known=known),
        insert_data,
        modify,
        _delete_where(),
        insert_data,
        _graph_management(),
    )


@st.composite
def _protocol_using(draw: st.DrawFn, *, bnodes: bool) -> UpdateRequest:
    """A single DELETE/INSERT WHERE with the dataset given as using-graph-uri parameters."""
    where = draw(_where())
    delete = where.matched if draw(st.booleans()) else draw(_template(where, bnodes=False))[0]
    insert, used_bnode = draw(_template(where, bnodes=bnodes))
    using = tuple(draw(st.lists(st.sampled_from((G1, G2)), min_size=1, max_size=2, unique=True)))
    using_named = tuple(draw(st.lists(st.sampled_from((G1, G2)), max_size=1)))
    head = f"DELETE {{ {delete} }} INSERT {{ {insert} }}"
    clauses = " ".join([f"USING <{g}>" for g in using] + [f"USING NAMED <{g}>" for g in using_named])
    return UpdateRequest(
        sparql=f"{PROLOGUE}{head} WHERE {{ {where.group} }}",
        using_graph_uri=using,
        using_named_graph_uri=using_named,
        oracle_sparql=f"{PROLOGUE}{head} {clauses} WHERE {{ {where.group} }}",
        deterministic=not used_bnode,
    )


def _plain(text: str, *, bnodes: bool = False) -> UpdateRequest:
    return UpdateRequest(PROLOGUE + text, oracle_sparql=PROLOGUE + text, deterministic=not bnodes)


# Multi-operation requests whose operations interact (each sees the previous ones): the net delta
# must cancel a quad deleted and re-inserted, and count one inserted and deleted again as nothing.
INTERACTING = (
    "INSERT DATA { ex:s1 ex:r ex:o } ; DELETE WHERE { ex:s1 ex:r ?o }",
    'DELETE WHERE { ?s ex:p ?o } ; INSERT DATA { ex:s1 ex:p ex:s1 . ex:s1 ex:p "a" }',
    "INSERT { ?s ex:r ?o } WHERE { ?s ex:p ?o } ; DELETE { ?s ex:p ?o } WHERE { ?s ex:r ?o }",
    'CLEAR DEFAULT ; INSERT DATA { ex:s1 ex:p ex:s2 . ex:s2 ex:q "a" }',
    "CREATE SILENT GRAPH ex:g3 ; INSERT DATA { GRAPH ex:g3 { ex:s1 ex:p ex:o } } ; DROP GRAPH ex:g3",
    "MOVE SILENT DEFAULT TO ex:g3 ; MOVE SILENT ex:g3 TO DEFAULT",
    "COPY DEFAULT TO ex:g1 ; ADD ex:g1 TO ex:g2 ; DROP SILENT GRAPH ex:g1",
    "DELETE { ?s ?p ?o } INSERT { ?s ?p ?o } WHERE { ?s ?p ?o } ; INSERT DATA { ex:s3 ex:q 2 }",
    "INSERT DATA { ex:s1 ex:p 01 } ; DELETE DATA { ex:s1 ex:p 1 }",
    'INSERT DATA { ex:s2 ex:p "a" } ; DELETE DATA { ex:s2 ex:p "a"^^xsd:string }',
)

# Other spellings of the same grammar, because the engine parses updates itself: keyword case,
# predicate-object lists, quoting and escapes, numeric / boolean shorthands, `a`, BASE, a prefix
# redefinition, comments, full datatype IRIs, an empty GRAPH block, a trailing `;`, and WHERE
# clauses beyond basic graph patterns (UNION, OPTIONAL, MINUS, NOT EXISTS, property paths, BIND,
# VALUES, subqueries). The flag says whether the request inserts blank nodes.
SYNTAX: tuple[tuple[str, bool], ...] = (
    ("insert data { ex:s1 ex:p ex:o . graph ex:g1 { ex:s2 ex:q ex:s1 } }", False),
    ('INSERT DATA { ex:s1 ex:p ex:o , ex:s2 ; ex:q "a" , "b" . }', False),
    ("INSERT DATA { ex:s1 ex:p 'a' , '''b''' , \"\"\"c\"\"\" }", False),
    (r'INSERT DATA { ex:s1 ex:p "\u0061" , "a\"b" , "t\tx" }', False),
    ("INSERT DATA { ex:s1 ex:p true , -1 , +2 , 1.5e0 , .5 }", False),
    ("INSERT DATA { ex:s1 a ex:o }", False),
    ('INSERT DATA { ex:s1 ex:p "a"@en-GB , "2"^^<http://www.w3.org/2001/XMLSchema#integer> }', False),
    ('INSERT DATA { ex:s2 ex:q "x"^^ex:myType , "1"^^<http://www.w3.org/2001/XMLSchema#decimal> }', False),
    ("# a comment\nINSERT DATA { ex:s1 ex:p ex:o } # trailing comment", False),
    ("BASE <http://example.org/>\nINSERT DATA { <s1> <p> <o> . GRAPH <g1> { <s2> <q> <s1> } }", False),
    ("PREFIX : <http://example.org/>\nINSERT DATA { :s1 :p :s2 }", False),
    ("PREFIX ex: <http://other.example/>\nINSERT DATA { ex:s1 ex:p ex:o }", False),
    ("INSERT DATA { GRAPH ex:g1 { ex:s1 ex:p ex:o } . ex:s2 ex:p ex:o . GRAPH ex:g2 { } }", False),
    ("INSERT DATA { ex:s1 ex:p ex:o } ;", False),
    ('INSERT DATA { ex:s1 ex:p [ ex:q "a" ] }', True),
    ('INSERT DATA { ex:s1 ex:p ( ex:s1 "a" ) }', True),
    ("INSERT DATA { [] ex:p ex:o }", True),
    (
        "DELETE DATA { <http://example.org/s1> <http://example.org/p> "
        '"1"^^<http://www.w3.org/2001/XMLSchema#integer> , "a"^^<http://www.w3.org/2001/XMLSchema#string> }',
        False,
    ),
    ("DELETE WHERE { ?s ex:p ?o ; ex:q ?x }", False),
    ("INSERT { ?s ex:r ?o } WHERE { ?s ex:p ?o . FILTER (?o != ex:o) }", False),
    ("INSERT { ?s ex:r ?o } WHERE { { ?s ex:p ?o } UNION { ?s ex:q ?o } }", False),
    ("INSERT { ?s ex:r ?n } WHERE { { SELECT ?s (COUNT(*) AS ?n) WHERE { ?s ?p ?o } GROUP BY ?s } }", False),
    ("DELETE { ?s ex:p ?o } WHERE { ?s ex:p ?o OPTIONAL { ?o ex:q ?x } FILTER(!bound(?x)) }", False),
    ("DELETE { ?s ex:p ?o } WHERE { ?s ex:p ?o MINUS { ?s ex:q ?x } }", False),
    ("DELETE { ex:s1 ex:p ?o } INSERT { ex:s1 ex:p 2 } WHERE { OPTIONAL { ex:s1 ex:p ?o } }", False),
    (
        "DELETE { ?s ex:q ?x } INSERT { ?s ex:q 3 } "
        "WHERE { ?s ex:p ?o OPTIONAL { ?s ex:q ?x } . OPTIONAL { GRAPH ex:g1 { ?o ex:p ?y } } }",
        False,
    ),
    ("INSERT { ?s ex:r ?y } WHERE { ?s ex:p ?o OPTIONAL { ?s ex:q ?x } OPTIONAL { ?x ex:p ?y } }", False),
    ("INSERT { ?s ex:r ?x } WHERE { ?s ex:p ?o OPTIONAL { ?o ex:q ?x . ?x ex:p ?y } FILTER(?s = ex:s1) }", False),
    ("DELETE { ?s ex:p ?o } WHERE { ?s ex:p ?o FILTER NOT EXISTS { ?o ?p2 ?x } }", False),
    ("INSERT { ?s ex:r ?o } WHERE { ?s ex:p+ ?o }", False),
    ("INSERT { ?s ex:r ?o } WHERE { ?s ex:p/ex:q|^ex:q ?o }", False),
    ("INSERT { ?s ex:r ?len } WHERE { ?s ex:p ?o BIND(STRLEN(STR(?o)) AS ?len) }", False),
    ("DELETE { ?s ?p ?o } WHERE { VALUES (?s ?p) { (ex:s1 ex:p) (ex:s2 ex:q) } ?s ?p ?o }", False),
    ("INSERT { GRAPH ?g { ?s ex:r ?o } } WHERE { GRAPH ?g { ?s ex:p ?o } FILTER(?g = ex:g1) }", False),
    ("INSERT { ?s ex:r ?o } WHERE { GRAPH ex:g1 { ?s ?p ?o } ?s ex:p ?x }", False),
    ("DELETE { ?s ex:p ?o } INSERT { ?o ex:p ?s } WHERE { ?s ex:p ?o }", False),
    (
        "INSERT { ?s ex:q ?o } WHERE { SELECT ?s ?o WHERE { ?s ex:p ?o FILTER(isIRI(?s) && isIRI(?o)) } "
        "ORDER BY ?s ?o LIMIT 1 }",
        False,
    ),
    ('INSERT { ?s ex:q ?o } WHERE { ?s ex:p ?o FILTER(?o = "1"^^<http://www.w3.org/2001/XMLSchema#integer>) }', False),
    ('INSERT { ?s ex:q "2"^^<http://www.w3.org/2001/XMLSchema#integer> } WHERE { ?s ex:p ?o }', False),
    ("INSERT { _:n ex:p ?o . _:n ex:q ?s } WHERE { ?s ex:p ?o }", True),
    ("ADD GRAPH ex:g1 TO GRAPH ex:g2", False),
    ("clear silent graph ex:g1 ; drop silent named", False),
)

_KEYWORDS = re.compile(
    r"\b(PREFIX|BASE|INSERT|DELETE|DATA|WHERE|GRAPH|WITH|USING|NAMED|DEFAULT|ALL|SILENT|CLEAR|DROP|"
    r"CREATE|ADD|MOVE|COPY|TO|FILTER|IN)\b"
)


def respell(text: str, *, full_iris: bool, lowercase: bool) -> str:
    """The same request with prefixed names written as full IRIs and/or lower-case keywords."""
    if full_iris:
        text = re.sub(r"\bex:([A-Za-z0-9_]+)", rf"<{EX}\1>", text)
        text = re.sub(r"\bxsd:([A-Za-z0-9_]+)", rf"<{XSD}\1>", text)
    if lowercase:
        text = _KEYWORDS.sub(lambda m: m.group(1).lower(), text)
    return text


@st.composite
def update_requests(draw: st.DrawFn, *, bnodes: bool = True, known: tuple[TextQuad, ...] = ()) -> UpdateRequest:
    """Any SPARQL 1.1 Update request, sometimes respelled (full IRIs, lower-case keywords).

    bnodes=False: no request inserts blank nodes. known: quads of the initial data, so that
    DELETE DATA / INSERT DATA often name quads that exist (else they would nearly always be no-ops).
    """
    request = draw(_update_request(bnodes=bnodes, known=known))
    spelling = draw(st.integers(0, 7))
    if spelling >= 6:
        full_iris, lowercase = spelling == 6, spelling == 7
        request = replace(
            request,
            sparql=respell(request.sparql, full_iris=full_iris, lowercase=lowercase),
            oracle_sparql=respell(request.oracle_sparql, full_iris=full_iris, lowercase=lowercase),
        )
    return request


@st.composite
def _update_request(draw: st.DrawFn, *, bnodes: bool, known: tuple[TextQuad, ...]) -> UpdateRequest:
    known = tuple(q for q in known if "_:" not in q[1] + q[3])
    choice = draw(st.integers(0, 21))  # Hypothesis favours small values: the common case first
    if choice == 21:
        return _plain(draw(st.sampled_from(FAILING)))
    if choice == 20:
        return _plain(draw(st.sampled_from(NO_CHANGE)))
    if choice == 19:
        return _plain(draw(st.sampled_from(INTERACTING)))
    if choice == 18:
        text, uses_bnodes = draw(st.sampled_from([entry for entry in SYNTAX if bnodes or not entry[1]]))
        return _plain(text, bnodes=uses_bnodes)
    if choice == 17:
        return draw(_protocol_using(bnodes=bnodes))
    if choice >= 14:
        # Multi-operation request; sometimes ending with an operation that fails, so the whole
        # request must be rolled back (atomicity).
        ops = draw(st.lists(_operation(bnodes=bnodes, known=known), min_size=2, max_size=3))
        texts = [op.text for op in ops]
        if draw(_one_in(4)):
            texts.append(draw(st.sampled_from(("DROP GRAPH ex:missing", "CREATE GRAPH ex:g1"))))
        return _plain(" ;\n".join(texts), bnodes=any(op.bnodes for op in ops))
    op = draw(_operation(bnodes=bnodes, known=known))
    return _plain(op.text, bnodes=op.bnodes)


@st.composite
def scenarios(draw: st.DrawFn, *, min_updates: int = 1, max_updates: int = 8, bnodes: bool = True) -> Scenario:
    """Initial data and a sequence of updates that know that data."""
    quads = draw(dataset_quads())
    updates = draw(st.lists(update_requests(bnodes=bnodes, known=quads), min_size=min_updates, max_size=max_updates))
    return Scenario(dataset_text(quads), tuple(updates))
