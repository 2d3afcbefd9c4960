"""Which remote endpoints a request's ``SERVICE`` clauses would call, and whether that is allowed.

Why: pyoxigraph evaluates ``SERVICE <url>`` by fetching the URL from the gateway itself, so any
client that may query could make the gateway connect anywhere on the plant network (server-side
request forgery), and a hanging endpoint would hang the query that waits for it. SERVICE is refused
unless its endpoint is on the operator's allow-list (``[engine] service_allow``); ``SERVICE ?var``
(an endpoint chosen by the data) is always refused.

The endpoints are found with the request tokenizer (:mod:`broker.sparql.tokens`), so a SERVICE
inside a string, an IRI or a comment is not one, and a keyword in any case, ``SILENT``, a prefixed
name (``PREFIX`` declarations of the request and the caller's prefixes) or a relative IRI (``BASE``
or the request's base IRI) are all seen as pyoxigraph will see them. A request without the letters
"service" in it costs one case-folding search.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from broker.errors import InvalidRequest, SparqlSyntaxError
from broker.sparql.prologue import Prologue
from broker.sparql.tokens import tokenize

_SERVICE = re.compile("service", re.IGNORECASE)


def service_endpoints(
    sparql: str, base_iri: str | None = None, prefixes: dict[str, str] | None = None
) -> list[str | None]:
    """The endpoint IRI of every SERVICE clause of `sparql`, in order (None for ``SERVICE ?var``)."""
    if not _SERVICE.search(sparql):
        return []
    try:
        tokens = tokenize(sparql)
    except SparqlSyntaxError:
        return []  # not SPARQL: the parser refuses it before anything is fetched
    prologue = Prologue(prefixes, base_iri)
    endpoints: list[str | None] = []
    index = 0
    while index < len(tokens):
        kind, text, _ = tokens[index]
        word = text.upper() if kind == "NAME" else ""
        following = tokens[index + 1 : index + 3]
        if prologue.follow(word, following):
            pass
        elif word == "SERVICE":
            target = index + 1
            if target < len(tokens) and tokens[target].kind == "NAME" and tokens[target].text.upper() == "SILENT":
                target += 1
            endpoint = tokens[target] if target < len(tokens) else None
            if endpoint is None:
                pass
            elif endpoint.kind in ("IRI", "PNAME"):
                iri = prologue.iri(endpoint, unescape=False)
                endpoints.append(iri if iri is not None else endpoint.text)  # an undeclared prefix: as written
            else:
                endpoints.append(None)
        index += 1
    return endpoints


def check_services(
    sparql: str,
    allowed: Sequence[str],
    base_iri: str | None = None,
    prefixes: dict[str, str] | None = None,
    *,
    where: str | None = None,
) -> bool:
    """Raise InvalidRequest (400) unless every SERVICE endpoint of `sparql` is allowed: equal to an
    entry of `allowed`, or starting with an entry that ends with ``*``. Returns whether there is one.

    `where` names a context that refuses SERVICE whatever the allow-list says ("updates",
    "subscriptions"): there the request holds the update lock, or is evaluated again on every
    update, so one slow endpoint would hold every update. pyoxigraph offers no time limit on the
    call, so only queries may make it, and their client waits at most ``service_timeout_s``."""
    endpoints = service_endpoints(sparql, base_iri, prefixes)
    if endpoints and where is not None:
        raise InvalidRequest(f"SERVICE is not allowed in {where} (query the endpoint, then update with the result)")
    for endpoint in endpoints:
        if endpoint is None:
            raise InvalidRequest("SERVICE with a variable endpoint is not allowed")
        if not any(endpoint == entry or (entry.endswith("*") and endpoint.startswith(entry[:-1])) for entry in allowed):
            raise InvalidRequest(f"SERVICE to <{endpoint}> is not allowed (see [engine] service_allow)")
    return bool(endpoints)
