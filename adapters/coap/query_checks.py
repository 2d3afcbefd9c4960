"""The subscriptions the config file names (`[[coap.subscriptions]]`) and the bounds on those CoAP
clients create: checked without aiocoap.

Why a module apart from adapters/coap/queries.py: `sepa-gateway check-config` checks these, and the
resource that serves them imports aiocoap and the client (see adapters/coap/plugin.py). pyoxigraph
is needed: its parser is the check of a query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pyoxigraph import QueryBoolean, QuerySolutions, Store

from broker.api import InvalidRequest, SparqlSyntaxError, check_structure, tokenize

NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_KEYS = {"name", "sparql"}


@dataclass(frozen=True)
class QueryLimits:
    """Bounds on what CoAP clients may create and follow."""

    max_created: int = 100  # subscriptions created by POST and alive at once
    max_sparql_bytes: int = 65_536  # the SPARQL of one created subscription
    max_observers: int = 1_000  # observations of /q/NAME at once
    # ...of them, by one network peer (an OSCORE sensor, else an address): one sensor key held all
    # 1,000 (every other peer got 5.03), and its ~980 observers took another sensor's readings from
    # p95 18 to 277 ms; peers on this board are not counted against it
    max_observers_per_peer: int = 100


def check_query(sparql: str) -> None:
    """Raise ValueError unless `sparql` is a SELECT or ASK query a subscription can take.

    For the config file, so a mistake is one line at start-up rather than a failed start: the
    engine's structure bounds (a crash otherwise), the query form, no SERVICE (the broker refuses it
    in subscriptions), then pyoxigraph's parser (on an empty store: nothing is evaluated that costs).
    """
    try:
        check_structure(sparql)
        tokens = tokenize(sparql)
    except (InvalidRequest, SparqlSyntaxError) as error:
        raise ValueError(str(error)) from None
    position = 0
    while position < len(tokens) and tokens[position].upper in ("BASE", "PREFIX"):
        position += 3 if tokens[position].upper == "PREFIX" else 2
    form = tokens[position].upper if position < len(tokens) else ""
    if form not in ("SELECT", "ASK"):
        raise ValueError(f"a subscription is a SELECT or ASK query, not {form or 'empty text'}")
    if any(token.is_keyword("SERVICE") for token in tokens):
        raise ValueError("SERVICE is not allowed in subscriptions")
    try:
        result = Store().query(sparql, base_iri="http://localhost/")
    except SyntaxError as error:
        raise ValueError(f"SPARQL syntax error: {error}") from None
    if not isinstance(result, QuerySolutions | QueryBoolean):
        raise ValueError("a subscription is a SELECT or ASK query")


def configured_queries(entries: Any, label: str = "coap.subscriptions") -> list[tuple[str, str]]:
    """`[[coap.subscriptions]]` as (name, sparql) pairs; ValueError naming the entry otherwise."""
    if not isinstance(entries, list):
        raise ValueError(f"{label} must be a list of tables")
    found: list[tuple[str, str]] = []
    for position, entry in enumerate(entries):
        where = f"{label}[{position}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a table with name and sparql")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: name, sparql")
        name, sparql = entry.get("name"), entry.get("sparql")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"{where}: name must be 1-64 of A-Z a-z 0-9 . _ - (got {name!r})")
        if any(name == other for other, _ in found):
            raise ValueError(f"{where}: name {name!r} is used twice")
        if not isinstance(sparql, str) or not sparql.strip():
            raise ValueError(f"{where} ({name}): sparql is required (a SELECT or ASK query)")
        try:
            check_query(sparql)
        except ValueError as error:
            raise ValueError(f"{where} ({name}): {error}") from None
        found.append((name, sparql))
    return found
