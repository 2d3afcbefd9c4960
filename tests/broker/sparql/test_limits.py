"""Requests that would overflow pyoxigraph's stack get an error, and the process lives on.

Measured before the limits: a 1.1 MB observation update over HTTP (2,500 readings with new sensors)
killed the gateway with SIGSEGV inside pyoxigraph, as do deeply nested braces. Real sockets and a
real gateway process: the crash these tests guard against would end the process, not raise."""

from __future__ import annotations

import pytest

from broker.core.engine import Engine
from broker.errors import InvalidRequest
from broker.sparql.limits import MAX_GROUP_ELEMENTS, MAX_NESTING, check_structure
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
    """2,000 BINDs needed more than a default 8 MB thread stack: SIGSEGV before WORKER_STACK_BYTES."""
    gateway = launch_gateway("--no-mqtt")
    try:
        binds = " ".join(f"BIND({i} AS ?v{i})" for i in range(9_000))
        reply = gateway.request(
            "POST", gateway.update_path, f"INSERT {{ <urn:a> <urn:b> ?v7 }} WHERE {{ {binds} }}".encode(), UPDATE
        )
        assert reply.status == 200 and reply.json()["added"] == 1
    finally:
        assert gateway.stop() == 0


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
