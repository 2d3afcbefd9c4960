"""The W3C SPARQL 1.1 Query evaluation tests through the secure gate, for a client with read rights.

Protects: the dataset restriction of access control (broker/core/access.py `restrict_dataset`,
broker/sparql/datasets.py), which rewrites the dataset of every query of a client that may read
only some graphs, keeps the meaning of the W3C queries (GRAPH ?g, FROM, FROM NAMED, EXISTS,
aggregates over graphs). The reader may read the default graph and every graph the tests load, not
a decoy graph that holds data in every test: it must get the W3C results, nothing of the decoy.
One in-process secure gateway serves all the tests (a gateway per test cost 1-2 s each), so this is
one test that lists the ids whose results differ; that list must be exactly the evaluation tests'
expected failures (pyoxigraph's own; a secure-only difference, or one fixed, fails it). Measured
2026-12-07 (`pytest tests/broker/w3c/test_query_read_rights.py --durations=3`, load 4-5): 4.0 s for
the 169 SELECT/ASK tests, 6.5 s with the gateway's start. It has teeth: a reader without the default
graph differs on most tests, one that may read everything on those that show the decoy (GRAPH ?g).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
from rdflib import Graph

from broker.api import DEFAULT_GRAPH_IRI
from gateway.appliance.config import Config
from tests.broker.gates.secure_support import ADMIN, SecureClient, secure_config
from tools.launcher import InProcessGateway

from .gateway_support import dataset_updates, expected_result, parse_results, rows, same_rows, with_base
from .manifest import QUERY_EVALUATION, QUERY_FOLDERS, entries
from .test_query_evaluation import EXPECTED_FAILURES

CASES = [e for e in entries((QUERY_EVALUATION,), QUERY_FOLDERS) if e.approved]
DECOY = "http://example.org/w3c/decoy"
DECOY_DATA = f"INSERT DATA {{ GRAPH <{DECOY}> {{ <{DECOY}#s> <{DECOY}#p> <{DECOY}#o> }} }}"
READER = {
    "identity": "reader",
    "read": [DEFAULT_GRAPH_IRI, *sorted({iri for case in CASES for iri, _ in case.data.named})],
    "write": [],
}


async def _differing(client: SecureClient) -> dict[str, str]:
    """Run every SELECT and ASK test as the reader; {test id: what differed}."""
    admin, reader = await client.login("admin"), await client.login("reader")
    differing = {}
    for case in CASES:
        assert case.result is not None
        expected = expected_result(case.result)
        if isinstance(expected, Graph):
            continue
        for update in ["DROP ALL", *dataset_updates(case.data), DECOY_DATA]:
            status, document = await client.update(admin, update)
            assert status == 200, document
        status, document = await client.query(reader, with_base(case.request))
        if status != 200:
            differing[case.id] = f"{status}: {document}"
            continue
        actual = parse_results(json.dumps(document).encode(), "json")
        if expected.type == "ASK":
            if actual.askAnswer != expected.askAnswer:
                differing[case.id] = f"ASK {actual.askAnswer}"
        elif not same_rows(rows(expected), rows(actual)):
            differing[case.id] = f"rows {rows(actual)}"
    return differing


def test_reader_with_rights_gets_the_w3c_results(
    in_process_gateway: Callable[[Config], InProcessGateway],
) -> None:
    gateway = in_process_gateway(secure_config(ADMIN, READER))
    assert gateway.gateway.secure is not None
    cert = str(gateway.gateway.secure.tls.cert)

    async def main() -> dict[str, str]:
        async with aiohttp.ClientSession() as session:
            return await _differing(SecureClient(session, gateway.https_url, gateway.wss_url, cert))

    differing = asyncio.run(main())
    assert set(differing) == {case.id for case in CASES} & set(EXPECTED_FAILURES), differing
