"""Requests that would overflow pyoxigraph's stack get an error, and the process lives on.

Measured before the limits: a 1.1 MB observation update over HTTP (2,500 readings with new sensors)
killed the gateway with SIGSEGV inside pyoxigraph, as do deeply nested braces. Real sockets and a
real gateway process: the crash these tests guard against would end the process, not raise."""

from __future__ import annotations

import pytest

from broker.core.engine import Engine
from broker.errors import InvalidRequest
from broker.sparql.limits import MAX_GROUP_ELEMENTS, MAX_NESTING, MAX_OPERATORS, check_structure
from tools.launcher import launch_gateway

NESTED = "INSERT { <urn:a> <urn:b> 1 } WHERE " + "{" * 100_000 + "}" * 100_000
BINDS = "INSERT { <urn:a> <urn:b> ?x } WHERE { " + " ".join(f"BIND({i} AS ?v{i})" for i in range(40_000)) + " }"
UPDATE = {"Content-Type": "application/sparql-update"}
QUERY = {"Content-Type": "application/sparql-query"}


@pytest.mark.parametrize("text", [NESTED, BINDS], ids=["nested", "binds"])
def test_a_request_that_would_overflow_the_stack_gets_a_400_and_the_gateway_lives(text: str) -> None:
    gateway = launch_gateway("--no-mqtt")
    try:
        gateway.update("INSERT DATA { <urn:s> <urn:p> 1 }")
        reply = gateway.request("POST", gateway.update_path, text.encode(), UPDATE)
        assert reply.status == 400 and "at most" in reply.json()["error_description"]
        deep_query = "SELECT * WHERE " + "{" * 5000 + "}" * 5000
        assert gateway.request("POST", gateway.query_path, deep_query.encode(), QUERY).status == 400
        assert gateway.select("SELECT ?o WHERE { <urn:s> <urn:p> ?o }") == [{"o": "1"}]  # alive, unchanged
    finally:
        assert gateway.stop() == 0


def test_a_large_flat_update_within_the_limits_runs_on_the_engine_threads() -> None:
    """2,000 BINDs needed more than a default 8 MB thread stack: SIGSEGV before WORKER_STACK_BYTES.
    3,000 (SIGSEGV on a default stack, measured): pyoxigraph's time grows with the square of the
    BINDs (1.1 s here; 9,000 took 11.5 s on a slower machine, past the 10 s limit)."""
    gateway = launch_gateway("--no-mqtt")
    try:
        binds = " ".join(f"BIND({i} AS ?v{i})" for i in range(3_000))
        reply = gateway.request(
            "POST", gateway.update_path, f"INSERT {{ <urn:a> <urn:b> ?v7 }} WHERE {{ {binds} }}".encode(), UPDATE
        )
        assert reply.status == 200 and reply.json()["added"] == 1
    finally:
        assert gateway.stop() == 0


def test_a_subscription_nested_just_under_the_limit_is_taken_and_logs_no_error(caplog) -> None:
    """Groups 990 deep pass the limit and pyoxigraph takes them; the incremental shaper's recursion
    did not: the subscribe failed and logged an ERROR traceback each time (an attack pass)."""
    engine = Engine()
    nested = "SELECT * WHERE " + "{" * (MAX_NESTING - 10) + "}" * (MAX_NESTING - 10)
    with caplog.at_level("ERROR"):
        subscription = engine.subscribe(nested, lambda _notification: None, limited=True)
    assert subscription.spuid and not [record for record in caplog.records if record.levelname == "ERROR"]


def test_limits_count_structure_not_strings_and_let_real_requests_through() -> None:
    engine = Engine()
    braces_in_a_string = '"' + "{" * (MAX_NESTING + 10) + '"'
    engine.update(f"INSERT DATA {{ <urn:s> <urn:p> {braces_in_a_string} }}")  # a literal is not structure
    check_structure("SELECT * WHERE { " + " ".join(f"BIND({i} AS ?v{i})" for i in range(MAX_GROUP_ELEMENTS)) + " }")
    with pytest.raises(InvalidRequest):
        check_structure("SELECT * WHERE " + "{" * (MAX_NESTING + 1) + "}" * (MAX_NESTING + 1))
    with pytest.raises(InvalidRequest):
        engine.update("INSERT { <urn:a> <urn:b> 1 } WHERE " + "{" * 2000 + "}" * 2000)
    with pytest.raises(InvalidRequest):
        check_structure("SELECT * WHERE { " + "OPTIONAL { } " * (MAX_GROUP_ELEMENTS + 1) + "}")


OPERATOR_CHAINS = {
    "not": "ASK { FILTER(" + "!" * 100_000 + "true) }",
    "and": "ASK { FILTER(" + " && ".join(["true"] * 10_000) + ") }",
    "plus": "ASK { FILTER(" + " + ".join(["1"] * 10_000) + " > 0) }",
    "path": "ASK { ?s " + "/".join(["<p:a>"] * 1_500) + " ?o }",
    "alternatives": "ASK { ?s " + "|".join(["<p:a>"] * 20_000) + " ?o }",
}


@pytest.mark.parametrize("query", OPERATOR_CHAINS.values(), ids=OPERATOR_CHAINS.keys())
def test_operator_chains_that_would_overflow_the_stack_are_refused_on_every_gate(query: str) -> None:
    """Each of these killed the process with SIGSEGV (pyoxigraph 0.5, measured): from /query, from
    /update (also as a delayed update, accepted with 202 and then killing the gateway at every
    restart) and from a WebSocket subscribe. Now: 400 or an error frame, the process alive."""
    import asyncio

    import aiohttp

    gateway = launch_gateway("--no-mqtt")
    try:
        gateway.update("INSERT DATA { <urn:s> <urn:p> 1 }")
        assert gateway.request("POST", gateway.query_path, query.encode(), QUERY).status == 400
        update = f"INSERT {{ <urn:a> <urn:b> 1 }} WHERE {{ {query[6:-2]} }}"
        assert gateway.request("POST", gateway.update_path, update.encode(), UPDATE).status == 400
        delayed = gateway.request("POST", gateway.update_path + "?delay=100", update.encode(), UPDATE)
        assert delayed.status == 400  # refused when scheduled, never stored to crash later

        async def subscribe() -> dict:
            async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as ws:
                await ws.send_json({"subscribe": {"sparql": query, "alias": "chain"}})
                return await ws.receive_json(timeout=30)

        answer = asyncio.run(subscribe())
        assert answer["error"] == "invalid_request" and answer["alias"] == "chain", answer
        assert gateway.running
        assert gateway.select("SELECT ?o WHERE { <urn:s> <urn:p> ?o }") == [{"o": "1"}]  # alive, unchanged
    finally:
        assert gateway.stop() == 0


def test_operators_in_data_and_in_real_queries_are_not_counted_against_them() -> None:
    data = " ".join(
        f'<urn:s{i}> <urn:p> "1.5e+3"^^<http://www.w3.org/2001/XMLSchema#double> , 2.5e+3 , -4 , +5 .'
        for i in range(3_000)
    )
    check_structure(f"INSERT DATA {{ {data} }}")  # typed literals (^^), exponents, signs: no operators
    check_structure("SELECT * WHERE { ?s <p:a>/<p:b>|^<p:c> ?o FILTER(!BOUND(?x) && ?o * 2 + 1 > 3) }")
    with pytest.raises(InvalidRequest, match="operators"):
        check_structure("ASK { ?s " + "/".join(["<p:a>"] * (MAX_OPERATORS + 2)) + " ?o }")
