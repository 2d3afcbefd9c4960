"""Garbage at every gate: hypothesis-made SPARQL fragments, JSON and frames sent to one gateway over
real sockets. Whatever arrives, the answer is a protocol error (never a dropped socket or a 500 on
the plain gates), the process lives, and a refused update changes nothing."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.launcher import RunningGateway

FRAGMENTS = st.sampled_from(
    [
        "SELECT", "ASK", "INSERT", "DELETE", "DATA", "WHERE", "{", "}", "(", ")", "[", "]", "?s", "?o", "<urn:a>",
        "<rel>", "<urn:p>", "1", "'x'", '"y"@en', ".", ";", ",", "FILTER", "EXISTS", "NOT", "OPTIONAL", "MINUS",
        "UNION", "GRAPH", "SERVICE", "BIND", "AS", "VALUES", "!", "&&", "||", "+", "*", "/", "^", "|", "a", "_:b",
        "PREFIX", "p:", "BASE", "LOAD", "CLEAR", "DROP", "ALL", "COUNT", "GROUP BY", "ORDER BY", "LIMIT 1",
        "\x00", "\\", '"""', "#", "\n", "é", "𝔘",
    ]
)  # fmt: skip
SPARQL = st.lists(FRAGMENTS, max_size=40).map(" ".join) | st.text(max_size=200)
CANARY = "ASK { <urn:canary> <urn:p> 1 }"
COUNT = "SELECT (COUNT(*) AS ?n) WHERE { { ?s ?p ?o } UNION { GRAPH ?g { ?s ?p ?o } } }"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> RunningGateway:
    from tools.launcher import launch_gateway

    with launch_gateway(data_dir=tmp_path_factory.mktemp("fuzz") / "data") as gateway:
        assert gateway.update("INSERT DATA { <urn:canary> <urn:p> 1 }").status == 200
        yield gateway
        assert gateway.running, gateway.stderr_lines[-20:]
        assert gateway.stop() == 0


def _count(gateway: RunningGateway) -> str:
    return gateway.select(COUNT)[0]["n"]


def _protocol_error(reply) -> None:
    assert reply.status < 500 or reply.status in (503, 504), (reply.status, reply.body[:300])
    if reply.status >= 400:
        body = json.loads(reply.body)
        assert {"error", "error_description", "status_code"} <= set(body) and body["status_code"] == reply.status


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sparql=SPARQL)
def test_any_query_text_is_answered_or_refused(target: RunningGateway, sparql: str) -> None:
    _protocol_error(target.query(sparql))
    assert target.ask(CANARY)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sparql=SPARQL)
def test_any_update_text_applies_whole_or_not_at_all(target: RunningGateway, sparql: str) -> None:
    before = _count(target)
    reply = target.update(sparql)
    _protocol_error(reply)
    if reply.status != 200:
        assert _count(target) == before, sparql
    target.update("INSERT DATA { <urn:canary> <urn:p> 1 }")  # the fuzz may have deleted it
    assert target.ask(CANARY)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    frame=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=30) | SPARQL,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
            ["subscribe", "unsubscribe", "sparql", "alias", "spuid", "default-graph-uri", "named-graph-uri", "x"]
        ), inner, max_size=4),
        max_leaves=12,
    )
)  # fmt: skip
def test_any_websocket_frame_gets_frames_back_and_the_socket_lives(target: RunningGateway, frame: object) -> None:
    async def exchange() -> list[dict]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{target.ws_url}/subscribe") as ws:
            await ws.send_str(json.dumps(frame))
            await ws.send_json({"subscribe": {"sparql": CANARY, "alias": "canary"}})
            frames = []
            while True:  # every answer is a frame; the canary's notification comes last
                message = await ws.receive(timeout=15)
                assert message.type == aiohttp.WSMsgType.TEXT, message
                frames.append(json.loads(message.data))
                if frames[-1].get("notification", {}).get("alias") == "canary":
                    return frames

    frames = asyncio.run(exchange())
    for answer in frames[:-1]:
        assert "notification" in answer or "unsubscribed" in answer or answer.get("status_code", 0) < 500, answer
