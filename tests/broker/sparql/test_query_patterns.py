"""The LUTT patterns of re-evaluated subscriptions: queries that differ in constants share one parse."""

from __future__ import annotations

from pyoxigraph import NamedNode

from broker.sparql.query_patterns import DEFAULT, EVERYTHING, LoosePattern, cached_patterns, query_patterns

EX = "http://example.org/"


def _query(sensor: str, kind: str, threshold: float) -> str:
    return (
        f"PREFIX ex: <{EX}> SELECT ?v WHERE {{ <{EX}{sensor}> a ex:{kind} "
        f'OPTIONAL {{ <{EX}{sensor}> ex:value ?v ; ex:label "a {sensor}"@en }} FILTER(?v > {threshold}) }}'
    )


def test_queries_that_differ_in_constants_are_parsed_once_and_keep_their_own_iris() -> None:
    cached_patterns.cache_clear()
    first = query_patterns(_query("s1", "Sensor", 1.5))
    second = query_patterns(_query("s2", "Probe", 70))
    assert cached_patterns.cache_info().misses == 1 and cached_patterns.cache_info().hits == 1
    rdf_type = NamedNode("http://www.w3.org/1999/02/22-rdf-syntax-ns#type")
    assert LoosePattern(DEFAULT, NamedNode(f"{EX}s1"), rdf_type, NamedNode(f"{EX}Sensor")) in first
    assert LoosePattern(DEFAULT, NamedNode(f"{EX}s2"), rdf_type, NamedNode(f"{EX}Probe")) in second
    assert LoosePattern(DEFAULT, NamedNode(f"{EX}s2"), NamedNode(f"{EX}value"), None) in second
    assert not any("slot" in str(pattern) for pattern in first + second)


def test_what_is_not_abstracted_still_counts() -> None:
    """Relative IRIs (BASE), graph names, datatypes and undeclared prefixes come out as rdflib reads them."""
    patterns = query_patterns(
        'BASE <http://b/> SELECT * { GRAPH <http://g/1> { <rel> ?p "1"^^<http://www.w3.org/2001/XMLSchema#int> } }'
    )
    assert patterns == (LoosePattern(NamedNode("http://g/1"), NamedNode("http://b/rel"), None, None),)
    given = query_patterns("SELECT * { ?s ex:p ?o }", {"ex": EX})
    assert given == (LoosePattern(DEFAULT, None, NamedNode(f"{EX}p"), None),)


def test_a_text_of_more_operators_than_rdflib_reads_in_a_second_matches_everything_unparsed() -> None:
    """30 chains of 499 `+` (each within the per-chain limit, 60 KB in all) took rdflib 10.8 s, holding
    the lock every other subscriber's parse waits for; now the text is not parsed at all."""
    chains = " ".join("FILTER(" + " + ".join(["1"] * 500) + " > 0)" for _ in range(30))
    cached_patterns.cache_clear()
    assert query_patterns(f"SELECT * WHERE {{ ?s <{EX}p> ?o {chains} }}") == EVERYTHING
    assert cached_patterns.cache_info().misses == 0
    few = " ".join("FILTER(" + " + ".join(["1"] * 50) + " > 0)" for _ in range(3))
    assert query_patterns(f"SELECT * WHERE {{ ?s <{EX}p> ?o {few} }}") == (
        LoosePattern(DEFAULT, None, NamedNode(f"{EX}p"), None),
    )


def _wakes(patterns: tuple[LoosePattern, ...], subject: str, predicate: str, obj: str) -> bool:
    """Whether a change of the default-graph triple (subject, predicate, obj) hits one of `patterns`."""
    terms = (NamedNode(EX + subject), NamedNode(EX + predicate), NamedNode(EX + obj))
    return any(
        pattern.graph in (DEFAULT, "any")
        and all(
            want is None or want == term
            for want, term in zip((pattern.subject, pattern.predicate, pattern.object), terms, strict=True)
        )
        for pattern in patterns
    )


def test_paths_of_an_exists_outside_the_where_clause_wake_on_every_step() -> None:
    """rdflib leaves an EXISTS in a projection, HAVING or ORDER BY expression as a parse tree, its
    predicate a path node: it was read as an IRI keeping the subject and object constants, so the
    subscription was keyed on ex:s1 and never woken by ex:s1 ex:p ex:a (behind ^) or ex:a ex:q ex:b
    (the second step of a sequence)."""
    prologue = f"PREFIX ex: <{EX}> "
    inverse = query_patterns(prologue + "SELECT (EXISTS { ?x ^ex:p ex:s1 } AS ?e) WHERE { }")
    assert _wakes(inverse, "s1", "p", "a")
    for query in (
        "SELECT (EXISTS { ex:s1 ex:p/ex:q ?z } AS ?e) WHERE { }",
        "SELECT ?s WHERE { ?s ex:r ?o } GROUP BY ?s HAVING (EXISTS { ex:s1 ex:p/ex:q ?z })",
        "SELECT ?s WHERE { ?s ex:r ?o } ORDER BY (EXISTS { ex:s1 ex:p/ex:q ?z })",
    ):
        assert _wakes(query_patterns(prologue + query), "a", "q", "b"), query
    # a one-step path is still an IRI: its constants narrow the pattern
    plain = query_patterns(prologue + "SELECT (EXISTS { ex:s1 ex:p ?z } AS ?e) WHERE { }")
    assert plain == (LoosePattern(DEFAULT, NamedNode(f"{EX}s1"), NamedNode(f"{EX}p"), None),)


def test_an_iri_rdflib_makes_but_pyoxigraph_refuses_matches_everything() -> None:
    """Valid SPARQL that rdflib reads into an invalid IRI (a prefixed name's escape kept, a relative
    BASE not resolved against the one before): the subscribe failed with a bare ValueError."""
    escaped = f"PREFIX ex: <{EX}> SELECT (COUNT(*) AS ?c) WHERE {{ ex:s\\-1 ex:p ?o }}"
    relative_base = f"BASE <{EX}a/> BASE <../> SELECT (COUNT(*) AS ?c) WHERE {{ <s1> <p> ?o }}"
    assert query_patterns(escaped) == EVERYTHING
    assert query_patterns(relative_base) == EVERYTHING
