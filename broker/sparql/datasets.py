"""The FROM / FROM NAMED clauses of a query, read with the request tokenizer.

Why: a client that may read only some graphs is evaluated over a protocol dataset made of them,
and a protocol dataset replaces the query's own FROM clauses. To keep what FROM means for such a
client, its FROM graphs become the protocol dataset (each one checked against its rights).
Only queries that contain the word FROM are read, so others pay one substring search.

Why the tokenizer (:mod:`broker.sparql.tokens`) and not a parser: this runs on the event loop for
every query and subscription of such a client, and ``FROM`` is a keyword nowhere but in a dataset
clause, so the tokens say it all. rdflib's parser, used before, took 3.8 s for a query of 20,000
VALUES (110 KB) and about 40 s for 1 MiB, with every other client waiting; the tokenizer reads
1 MiB in about 0.2 s. What is read here only chooses the protocol dataset, which replaces the
query's own: a clause misread gives a dataset of other readable graphs (or a 403), never more.
"""

from __future__ import annotations

import re
from functools import lru_cache

from broker.errors import SparqlSyntaxError
from broker.sparql.prologue import Prologue
from broker.sparql.tokens import tokenize

_FROM = re.compile(r"\bFROM\b", re.IGNORECASE)
# queries up to this size are cached (a dashboard asks the same ones again and again); larger ones
# are read each time, so that the cache cannot hold 256 bodies of a megabyte
CACHED_CHARS = 8192


def dataset_clauses(
    sparql: str, base_iri: str | None = None, prefixes: dict[str, str] | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(FROM graphs, FROM NAMED graphs) of `sparql`; empty when it has none or cannot be read
    (then the query is refused later by the engine, or runs on the dataset it was given)."""
    if not _FROM.search(sparql):
        return (), ()
    declared = tuple(sorted((prefixes or {}).items()))
    if len(sparql) > CACHED_CHARS:
        return _read(sparql, base_iri, declared)
    return _cached(sparql, base_iri, declared)


def _read(
    sparql: str, base_iri: str | None, prefixes: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    try:
        tokens = tokenize(sparql)
    except SparqlSyntaxError:
        return (), ()
    prologue = Prologue(dict(prefixes), base_iri)
    default: list[str] = []
    named: list[str] = []
    for index, (kind, text, _) in enumerate(tokens):
        word = text.upper() if kind == "NAME" else ""
        following = tokens[index + 1 : index + 3]
        if prologue.follow(word, following):
            continue
        if word == "FROM" and following:
            into = default
            if following[0].is_keyword("NAMED"):
                into, following = named, following[1:]
            iri = prologue.iri(following[0]) if following else None
            if iri is None:
                return (), ()  # not a dataset clause pyoxigraph will take: it refuses the query
            into.append(iri)
    return tuple(default), tuple(named)


_cached = lru_cache(maxsize=256)(_read)
