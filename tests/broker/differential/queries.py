"""The fixed pool of subscription queries the differential tests subscribe, all at once.

Why a fixed pool rather than random queries: the contract (PROTOCOL.md, "Notification
semantics") must hold for every SELECT form, and a hand-written pool guarantees each form is
present in every example, while random *updates* (strategies.py) do the exploring. The queries
use the vocabulary of strategies.py so that updates actually change their results.

Each query is deterministic for a given store content (no RAND/NOW/UUID/BNODE(), no SAMPLE or
GROUP_CONCAT, and ORDER BY keys that are total on the rows a LIMIT/OFFSET cuts), because the
oracle is "the same query run again now": a query whose answer may legitimately differ between two
runs on the same data would make the comparison meaningless. Queries about empty named graphs
(``GRAPH ?g {}``) are left out on purpose: CREATE GRAPH changes their answer without changing a
quad, which the "no change, no notification" rule of the test cannot express.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.core.access import NO_GRAPH_IRI
from tests.broker.differential.strategies import G1, G2, PROLOGUE


@dataclass(frozen=True, slots=True)
class PoolQuery:
    """One subscription: a name for reports, the query text and its protocol-level dataset."""

    name: str
    sparql: str
    default_graph_uri: tuple[str, ...] = ()
    named_graph_uri: tuple[str, ...] = ()

    @property
    def is_ask(self) -> bool:
        return self.sparql.removeprefix(PROLOGUE).lstrip().startswith("ASK")


def _q(
    name: str, body: str, default_graph_uri: tuple[str, ...] = (), named_graph_uri: tuple[str, ...] = ()
) -> PoolQuery:
    return PoolQuery(name, PROLOGUE + body, default_graph_uri, named_graph_uri)


# ORDER BY keys that break every tie between distinct terms of equal value (1 / 1.0 / 1e0).
_TOTAL_ORDER = "STR(?o) STR(DATATYPE(?o)) LANG(?o)"

POOL: tuple[PoolQuery, ...] = (
    # -- basic graph patterns and joins
    _q("bgp_all", "SELECT ?s ?p ?o WHERE { ?s ?p ?o }"),
    _q("bgp_one_predicate", "SELECT ?s ?o WHERE { ?s ex:p ?o }"),
    _q("bgp_constant_subject", "SELECT ?p ?o WHERE { ex:s1 ?p ?o }"),
    _q("join_chain", "SELECT ?s ?x ?o WHERE { ?s ex:p ?x . ?x ex:q ?o }"),
    _q("join_star_select_star", "SELECT * WHERE { ?s ex:p ?o1 ; ex:q ?o2 }"),
    _q("join_repeated_variable", "SELECT ?s WHERE { ?s ?p ?s }"),
    # -- projections that drop variables: multiplicities matter
    _q("project_subject", "SELECT ?s WHERE { ?s ?p ?o }"),
    _q("project_predicate_join", "SELECT ?p WHERE { ?s ?p ?o . ?s ex:p ?x }"),
    # -- FILTERs on literal values, datatypes, languages, term kinds
    _q("filter_greater", "SELECT ?s ?o WHERE { ?s ?p ?o FILTER(?o > 0) }"),
    _q("filter_equal_value", "SELECT ?s ?o WHERE { ?s ?p ?o FILTER(?o = 1) }"),
    _q("filter_same_term", 'SELECT ?s ?o WHERE { ?s ?p ?o FILTER(sameTerm(?o, "a")) }'),
    _q("filter_lang", 'SELECT ?s ?o WHERE { ?s ?p ?o FILTER(langMatches(lang(?o), "en")) }'),
    _q("filter_str_and_kind", 'SELECT ?o WHERE { ?s ?p ?o FILTER(isLiteral(?o) && str(?o) = "a") }'),
    _q("filter_datatype", "SELECT ?s ?o WHERE { ?s ?p ?o FILTER(datatype(?o) = xsd:integer) }"),
    _q("filter_blank", "SELECT ?s ?o WHERE { ?s ?p ?o FILTER(isBlank(?s) || isBlank(?o)) }"),
    _q(
        "filter_in_regex",
        'SELECT ?s ?o WHERE { ?s ex:q ?o FILTER(?o IN (ex:o, 2) || regex(str(?o), "^a")) }',
    ),
    # -- UNION and GRAPH
    _q("union", "SELECT ?s ?o WHERE { { ?s ex:p ?o } UNION { ?s ex:q ?o } }"),
    _q("union_default_named", "SELECT ?s ?o WHERE { { ?s ex:p ?o } UNION { GRAPH ex:g1 { ?s ex:p ?o } } }"),
    _q("graph_var", "SELECT ?g ?s ?p ?o WHERE { GRAPH ?g { ?s ?p ?o } }"),
    _q("graph_var_projected", "SELECT ?g WHERE { GRAPH ?g { ?s ex:p ?o } }"),
    _q("graph_iri", "SELECT ?s ?o WHERE { GRAPH ex:g2 { ?s ?p ?o } }"),
    # graph feeds (every triple of one named graph): the engine serves them from the delta alone
    _q("graph_feed", "SELECT ?s ?p ?o WHERE { GRAPH ex:g1 { ?s ?p ?o } }"),
    _q("graph_feed_reordered_distinct", "SELECT DISTINCT ?o ?s ?p WHERE { GRAPH ex:g3 { ?s ?p ?o } }"),
    _q("graph_join_default", "SELECT ?s ?g ?x WHERE { ?s ex:p ?o . GRAPH ?g { ?s ex:q ?x } }"),
    # -- OPTIONAL, MINUS, EXISTS
    _q("optional", "SELECT ?s ?o ?x WHERE { ?s ex:p ?o OPTIONAL { ?o ex:q ?x } }"),
    _q("optional_filter", "SELECT ?s ?o ?x WHERE { ?s ex:p ?o OPTIONAL { ?s ex:q ?x FILTER(?x != ?o) } }"),
    _q("optional_not_bound", "SELECT ?s WHERE { ?s ex:p ?o OPTIONAL { ?s ex:r ?x } FILTER(!bound(?x)) }"),
    _q("minus", "SELECT ?s ?o WHERE { ?s ex:p ?o MINUS { ?s ex:q ?x } }"),
    _q("minus_graph", "SELECT ?s ?p ?o WHERE { ?s ?p ?o MINUS { GRAPH ?g { ?s ?p ?o } } }"),
    _q("exists", "SELECT ?s ?o WHERE { ?s ex:p ?o FILTER EXISTS { ?o ?p ?x } }"),
    _q("not_exists", "SELECT ?s ?p ?o WHERE { ?s ?p ?o FILTER NOT EXISTS { GRAPH ex:g1 { ?s ?p ?o } } }"),
    # nested and listed [NOT] EXISTS, and EXISTS inside OPTIONAL, MINUS and subqueries (issue 16: an
    # inner EXISTS's patterns were missing from the LUTT, and ; or , inside EXISTS broke the analyser)
    _q("ask_nested_exists", "ASK { FILTER EXISTS { ?a ex:p ?o FILTER EXISTS { ?b ex:q ?o } } }"),
    _q(
        "nested_not_exists",
        "SELECT ?s WHERE { ?s ex:p ?o FILTER NOT EXISTS { ?o ?p ?x FILTER EXISTS { ?x ex:r ?y } } }",
    ),
    _q("exists_lists", "SELECT ?s WHERE { ?s ?p ?o FILTER EXISTS { ?s ex:p ex:s1 , ex:s2 ; ex:q ?x } }"),
    _q("ask_exists_lists", "ASK { FILTER EXISTS { ?s ex:p ex:o , ex:s1 ; ex:q ?x } }"),
    _q("optional_exists", "SELECT ?s ?x WHERE { ?s ex:p ?o OPTIONAL { ?o ex:q ?x FILTER NOT EXISTS { ?x ex:r ?z } } }"),
    _q("minus_exists", "SELECT ?s WHERE { ?s ex:p ?o MINUS { ?s ex:q ?x FILTER EXISTS { ?x ex:p ?y } } }"),
    _q(
        "subquery_exists",
        "SELECT ?s ?n WHERE { ?s ex:p ?o { SELECT ?s (COUNT(*) AS ?n) WHERE { ?s ?p ?x "
        "FILTER EXISTS { ?x ?q ?y } } GROUP BY ?s } }",
    ),
    _q("exists_in_graph", "SELECT ?g ?s WHERE { GRAPH ?g { ?s ex:p ?o FILTER EXISTS { ?o ex:q ?x } } }"),
    _q("exists_path", "SELECT ?s WHERE { ?s ex:p ?o FILTER EXISTS { ?o (ex:p|ex:q)+ ?z } }"),
    # an EXISTS outside the WHERE clause keeps rdflib's parse tree, paths untranslated
    _q(
        "exists_path_in_projection",
        "SELECT (EXISTS { ?x ^ex:p ex:s1 } AS ?e) (EXISTS { ex:s1 ex:p/ex:q ?z } AS ?f) WHERE { }",
    ),
    # -- property paths
    _q("path_sequence", "SELECT ?s ?o WHERE { ?s ex:p/ex:q ?o }"),
    _q("path_alternative", "SELECT ?s ?o WHERE { ?s ex:p|ex:r ?o }"),
    _q("path_star", "SELECT ?s ?o WHERE { ?s ex:p* ?o }"),
    _q("path_plus_alternative", "SELECT ?o WHERE { ex:s1 (ex:p|ex:q)+ ?o }"),
    _q("path_inverse_sequence", "SELECT ?s ?o WHERE { ?s ex:p/^ex:p ?o }"),
    _q("path_negated", "SELECT ?s ?o WHERE { ?s !(ex:p|^ex:q) ?o }"),
    _q("path_in_graph", "SELECT ?g ?o WHERE { GRAPH ?g { ?s ex:p+ ?o } }"),
    # -- aggregates and subqueries
    _q("count_group", "SELECT ?s (COUNT(*) AS ?n) WHERE { ?s ?p ?o } GROUP BY ?s"),
    _q(
        "count_sum_having",
        "SELECT ?p (COUNT(DISTINCT ?o) AS ?n) (SUM(?o) AS ?sum) WHERE { ?s ?p ?o } GROUP BY ?p HAVING (COUNT(?o) > 1)",
    ),
    _q(
        "min_max_avg_no_group",
        "SELECT (MIN(?o) AS ?min) (MAX(?o) AS ?max) (AVG(?o) AS ?avg) (COUNT(?o) AS ?c) WHERE { ?s ex:q ?o }",
    ),
    _q(
        "subquery_aggregate_join",
        "SELECT ?s ?n WHERE { ?s ex:p ?o . { SELECT ?s (COUNT(*) AS ?n) WHERE { ?s ?p ?x } GROUP BY ?s } }",
    ),
    _q(
        "subquery_limit",
        "SELECT ?s ?p ?o WHERE { { SELECT DISTINCT ?s WHERE { ?s ex:p ?x FILTER(isIRI(?s)) } "
        "ORDER BY DESC(?s) LIMIT 1 } ?s ?p ?o }",
    ),
    # -- solution modifiers
    _q("distinct", "SELECT DISTINCT ?s WHERE { ?s ?p ?o }"),
    _q("distinct_literals", "SELECT DISTINCT ?o WHERE { GRAPH ?g { ?s ?p ?o } FILTER isLiteral(?o) }"),
    _q("reduced", "SELECT REDUCED ?p WHERE { ?s ?p ?o }"),
    _q(
        "order_limit",
        f"SELECT ?s ?o WHERE {{ ?s ?p ?o FILTER(!isBlank(?s) && !isBlank(?o)) }} ORDER BY ?s ?o {_TOTAL_ORDER} LIMIT 2",
    ),
    _q(
        "order_desc_limit_offset",
        f"SELECT ?o WHERE {{ ?s ?p ?o FILTER(!isBlank(?o)) }} ORDER BY DESC(?o) {_TOTAL_ORDER} LIMIT 3 OFFSET 1",
    ),
    # -- VALUES and BIND
    _q("values", "SELECT ?s ?p ?o WHERE { VALUES ?p { ex:p ex:q } ?s ?p ?o }"),
    _q("values_undef", "SELECT * WHERE { VALUES (?s ?o) { (ex:s1 UNDEF) (UNDEF ex:s2) } ?s ex:p ?o }"),
    _q("bind", "SELECT ?s ?len WHERE { ?s ex:p ?o BIND(STRLEN(STR(?o)) AS ?len) }"),
    _q("bind_if", "SELECT ?s ?t WHERE { ?s ?p ?o BIND(IF(isLiteral(?o), DATATYPE(?o), ?p) AS ?t) }"),
    # -- blank nodes in query patterns (they act as undistinguished variables)
    _q("blank_node_pattern", "SELECT ?s ?o WHERE { ?s ex:p _:x . _:x ex:q ?o }"),
    _q("blank_node_brackets", "SELECT ?s WHERE { ?s ex:p [ ?p ?o ] }"),
    # -- same shape, different constants: incremental engines group these and route rows by the
    #    constants' values, so "1" / 01 / 1.0 / "1" and "a"@EN / "a"^^xsd:string must route right
    _q("twin_other_predicate", "SELECT ?s ?o WHERE { ?s ex:q ?o }"),
    _q("twin_other_subject", "SELECT ?p ?o WHERE { ex:s2 ?p ?o }"),
    _q("twin_other_graph", "SELECT ?s ?o WHERE { GRAPH ex:g1 { ?s ?p ?o } }"),
    _q("twin_filter_other_value", "SELECT ?s ?o WHERE { ?s ?p ?o FILTER(?o = 2) }"),
    # same patterns, a FILTER(?v = <iri>) pinning another variable (or none): not one group, whose
    # values are bound to its parameter variables by position
    _q("pinned_predicate", "SELECT * WHERE { ?s ?p ?o FILTER(?p = ex:q) }"),
    _q("pinned_subject", "SELECT * WHERE { ?s ?p ?o FILTER(?s = ex:s1) }"),
    _q("pinned_graph", "SELECT ?g ?s ?p ?o WHERE { GRAPH ?g { ?s ?p ?o } FILTER(?g = ex:g1) }"),
    _q("object_integer_1", "SELECT ?s WHERE { ?s ?p 1 }"),
    _q("object_integer_01", "SELECT ?s WHERE { ?s ?p 01 }"),
    _q("object_decimal_1", "SELECT ?s WHERE { ?s ?p 1.0 }"),
    _q("object_string_1", 'SELECT ?s WHERE { ?s ?p "1" }'),
    _q("object_lang_upper", 'SELECT ?s ?p WHERE { ?s ?p "a"@EN }'),
    _q("object_typed_string", 'SELECT ?s ?p WHERE { ?s ?p "a"^^xsd:string }'),
    # -- other spellings (the engine parses subscriptions itself to find incremental shapes)
    _q("spelled_full_datatype_iri", 'SELECT ?s WHERE { ?s ?p "2"^^<http://www.w3.org/2001/XMLSchema#integer> }'),
    _q("spelled_string_datatype_iri", 'SELECT ?s WHERE { ?s ?p "a"^^<http://www.w3.org/2001/XMLSchema#string> }'),
    _q("spelled_escape", r'SELECT ?s ?p WHERE { ?s ?p "\u0061" }'),
    _q(
        "spelled_lowercase_iris",
        "select ?s ?o where { ?s <http://example.org/p> ?o filter(?o != <http://example.org/o>) }",
    ),
    _q("spelled_object_list", "SELECT ?s WHERE { ?s ex:p ex:s1 , ex:s2 }"),
    _q("spelled_a", "SELECT ?s WHERE { ?s a ?o }"),
    # -- ASK
    _q("ask_value", "ASK { ?s ?p ?o FILTER(?o = 1) }"),
    _q("ask_graph", "ASK { GRAPH ex:g2 { ?s ?p ?o } }"),
    _q("ask_not_exists", "ASK { FILTER NOT EXISTS { ?s ex:r ?o } }"),
    # -- datasets given by the protocol (default-graph-uri / named-graph-uri) and by FROM
    _q("dataset_default_merge", "SELECT ?s ?o WHERE { ?s ex:p ?o }", default_graph_uri=(G1, G2)),
    _q("dataset_named_only", "SELECT ?g ?s WHERE { GRAPH ?g { ?s ?p ?o } }", named_graph_uri=(G1,)),
    # named-graph-uri alone replaces the dataset: its default graph is empty (SPARQL 1.1 Query 13.2)
    _q("dataset_named_only_default_empty", "SELECT ?s ?o WHERE { ?s ex:p ?o }", named_graph_uri=(G1,)),
    _q(
        "dataset_both",
        "SELECT ?g ?s ?o WHERE { { ?s ex:q ?o } UNION { GRAPH ?g { ?s ex:q ?o } } }",
        default_graph_uri=(G2,),
        named_graph_uri=(G1, G2),
    ),
    _q("dataset_ask", "ASK { ?s ex:p ?o }", default_graph_uri=(G1,)),
    # the marker of an explicitly empty graph list, as a client may send it: no graph, not the store's
    # default graph (counted as one graph, it was evaluated incrementally over the store's default graph)
    _q("dataset_no_graph", "SELECT ?s ?o WHERE { ?s ex:p ?o }", default_graph_uri=(NO_GRAPH_IRI,)),
    _q("dataset_no_graph_and_g1", "SELECT ?s ?o WHERE { ?s ex:p ?o }", default_graph_uri=(NO_GRAPH_IRI, G1)),
    _q(
        "from_and_from_named",
        "SELECT ?g ?s ?o FROM ex:g1 FROM NAMED ex:g2 WHERE { { ?s ex:p ?o } UNION { GRAPH ?g { ?s ex:p ?o } } }",
    ),
)

# Queries whose answer depends on which named graphs exist, not only on quads: CREATE GRAPH changes
# it without a quad (so the main test's "no change, no notification" rule cannot hold for them),
# and so does the first quad written into a graph, which creates it; nothing but the graph's
# existence wakes them (an empty GRAPH group, OPTIONAL, MINUS, NOT EXISTS). The first quad went
# unseen: found by a differential pass over real sockets, in sequential and parallel modes.
GRAPH_POOL: tuple[PoolQuery, ...] = (
    _q("graph_empty_group_joined", "SELECT ?g ?s WHERE { ?s ex:p ?o . GRAPH ?g { } }"),
    _q("graph_optional", "SELECT ?g ?o WHERE { GRAPH ?g { OPTIONAL { ?s ex:p ?o } } }"),
    _q("graph_not_exists", "SELECT ?g WHERE { GRAPH ?g { FILTER NOT EXISTS { ?s ex:p ?o } } }"),
    _q("graph_minus", "SELECT ?g WHERE { GRAPH ?g { MINUS { ?s ex:p ?o } } }"),
    _q("graph_bind", "SELECT ?g ?x WHERE { GRAPH ?g { BIND(1 AS ?x) } }"),
    _q("graph_exists_filter", "SELECT ?s WHERE { ?s ex:p ?o FILTER EXISTS { GRAPH ex:g3 { } } }"),
    _q("graph_ask", "ASK { ?s ex:p ?o . GRAPH ex:g3 { } }"),
)
