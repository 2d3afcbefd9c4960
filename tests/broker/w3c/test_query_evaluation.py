"""W3C SPARQL 1.1 Query evaluation tests, over real sockets against `sepa-gateway run`.

Protects: the answers of /query (SPARQL 1.1 Protocol) and of a WebSocket subscription's
notification 0 to every Approved mf:QueryEvaluationTest of the folders manifest-sparql11-query.ttl
includes, plus json-res and csv-tsv-res (copied with the W3C licence under tests/broker/w3c/data/).
Both go through the gateway's own parsing, query shape and dataset code before pyoxigraph. The data
is loaded through /update (INSERT DATA per file; qt:graphData files become graphs named by their
file IRI), the store emptied before each test; one gateway serves the module. A SELECT is also
subscribed before its data is loaded: the notifications the loading updates send, applied in order,
must give the same results (the incremental path, not only the first evaluation).

EXPECTED_FAILURES lists the tests that do not pass, each with its reason; they are strict xfails,
so one that starts passing fails the run until it is taken off the list.
"""

from __future__ import annotations

import pytest
from rdflib import Graph

from tools.launcher import RunningGateway

from .gateway_support import (
    approved_params,
    check_followed_subscription,
    check_reply,
    check_subscription,
    expected_result,
    load,
    send_query,
    with_base,
)
from .manifest import QUERY_EVALUATION, QUERY_FOLDERS, ManifestEntry, entries

EXPECTED_FAILURES: dict[str, str] = {
    "functions/bnode01": "pyoxigraph 0.5.13 gives BNODE(str) one blank node per string for the whole query "
    "(_:foo in every solution, also from Store.query alone); SPARQL wants a new one in each solution",
    "csv-tsv-res/tsv03": 'pyoxigraph 0.5.13 stores "-3"^^xsd:negativeInteger as "-3"^^xsd:integer '
    "(Store.update alone does it), so the query returns another datatype than it was given",
}


CASES = approved_params(entries((QUERY_EVALUATION,), QUERY_FOLDERS), EXPECTED_FAILURES)


@pytest.mark.parametrize("case", CASES)
def test_query_evaluation(gateway: RunningGateway, case: ManifestEntry) -> None:
    """/query answers the W3C expected results; for a SELECT, so do notification 0 of a subscription
    made on the data and the notifications of one made before the data was loaded."""
    assert case.result is not None
    query = with_base(case.request)
    expected = expected_result(case.result)
    select = not isinstance(expected, Graph) and expected.type == "SELECT"
    if select:
        check_followed_subscription(gateway, query, case.data, expected)
    else:
        load(gateway, case.data)
    check_reply(send_query(gateway, query), expected, query)
    if select:
        check_subscription(gateway, query, expected)
