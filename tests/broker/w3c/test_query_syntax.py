"""W3C SPARQL 1.1 Query syntax tests, over real sockets against `sepa-gateway run`.

Protects: /query and the WebSocket subscribe gate accept every Approved mf:PositiveSyntaxTest11 of
syntax-query/ and refuse every Approved mf:NegativeSyntaxTest11 of the query folders with a
400-class error, never a 500 or a dropped connection (a client must learn what was wrong with its
query). The store is empty: a valid query is only parsed and run. A CONSTRUCT or DESCRIBE cannot
be subscribed (docs/protocol.md): its subscribe must get that documented 400 frame. Tests that do
not pass are listed in EXPECTED_FAILURES, each with its reason, as strict xfails.
"""

from __future__ import annotations

import pytest

from tools.launcher import RunningGateway

from .gateway_support import approved_params, send_query, subscribe, with_base
from .manifest import NEGATIVE_QUERY_SYNTAX, POSITIVE_QUERY_SYNTAX, QUERY_FOLDERS, ManifestEntry, entries

EXPECTED_FAILURES: dict[str, str] = {
    "syntax-query/test_4": "pyoxigraph 0.5.13 refuses a query calling an unknown function (`The custom function "
    "<http://example/function> is not supported`, also from Store.query alone) where SPARQL makes the call an "
    "expression error",
}
GRAPH_FORM_REFUSED = "only SELECT and ASK queries can be subscribed"


@pytest.fixture(scope="module", autouse=True)
def empty_store(gateway: RunningGateway) -> None:
    gateway.post_update("DROP ALL")


@pytest.mark.parametrize("case", approved_params(entries((POSITIVE_QUERY_SYNTAX,), QUERY_FOLDERS), EXPECTED_FAILURES))
def test_positive_query_syntax(gateway: RunningGateway, case: ManifestEntry) -> None:
    """A valid query is answered by /query, and a subscription to it gets its notification 0."""
    query = with_base(case.request)
    reply = send_query(gateway, query)
    assert reply.status == 200, f"{reply.status}: {reply.body[:500]!r}"
    frame = subscribe(gateway, query)
    if reply.media_type == "application/n-triples":  # CONSTRUCT, DESCRIBE: a graph
        assert frame.get("status_code") == 400, frame
        assert GRAPH_FORM_REFUSED in frame["error_description"], frame
    else:
        assert "notification" in frame, frame


@pytest.mark.parametrize("case", approved_params(entries((NEGATIVE_QUERY_SYNTAX,), QUERY_FOLDERS), EXPECTED_FAILURES))
def test_negative_query_syntax(gateway: RunningGateway, case: ManifestEntry) -> None:
    """A malformed query gets a 400-class error from /query and an error frame from subscribe."""
    query = with_base(case.request)
    reply = send_query(gateway, query)
    assert 400 <= reply.status < 500, f"{reply.status}: {reply.body[:500]!r}"
    frame = subscribe(gateway, query)
    assert "notification" not in frame, frame
    assert 400 <= frame.get("status_code", 0) < 500, frame
