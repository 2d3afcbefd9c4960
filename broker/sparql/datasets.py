"""The FROM / FROM NAMED clauses of a query, read with rdflib's SPARQL parser.

Why: a client that may read only some graphs is evaluated over a protocol dataset made of them,
and a protocol dataset replaces the query's own FROM clauses. To keep what FROM means for such a
client, its FROM graphs become the protocol dataset (each one checked against its rights).
Only queries that contain the word FROM are parsed, so others pay one substring search.
"""

from __future__ import annotations

import re
from functools import lru_cache

from rdflib.plugins.sparql.algebra import translateQuery
from rdflib.plugins.sparql.parser import parseQuery

_FROM = re.compile(r"\bFROM\b", re.IGNORECASE)


def dataset_clauses(
    sparql: str, base_iri: str | None = None, prefixes: dict[str, str] | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(FROM graphs, FROM NAMED graphs) of `sparql`; empty when it has none or cannot be read
    (then the query is refused later by the engine, or runs on the dataset it was given)."""
    if not _FROM.search(sparql):
        return (), ()
    return _parsed(sparql, base_iri, tuple(sorted((prefixes or {}).items())))


@lru_cache(maxsize=256)
def _parsed(
    sparql: str, base_iri: str | None, prefixes: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    try:
        query = translateQuery(parseQuery(sparql), base=base_iri, initNs=dict(prefixes))
    except Exception:  # noqa: BLE001 - anything rdflib cannot read has no clauses we can use
        return (), ()
    default: list[str] = []
    named: list[str] = []
    for clause in query.algebra.get("datasetClause") or ():
        if "default" in clause:
            default.append(str(clause["default"]))
        elif "named" in clause:
            named.append(str(clause["named"]))
    return tuple(default), tuple(named)
