"""One client's re-evaluated subscriptions cannot hold every publisher's replies: what they cost
each update together (by their probes) is bounded per client, over real TLS sockets."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

import aiohttp

from tests.broker.gates.secure_support import SecureClient, receive, secure_config
from tests.broker.gates.test_secure_gates import run_secure
from tests.polling import wait_until
from tools.launcher import InProcessGateway, RunningGateway

READER = {"identity": "reader", "read": ["*"], "write": []}
WRITER = {"identity": "writer", "read": ["*"], "write": ["*"]}
BUDGET_S = 0.5
EX = "http://example.org/"


def test_a_reader_cannot_make_every_update_wait_for_its_reevaluations(
    in_process_gateway: Callable[..., InProcessGateway],
) -> None:
    """60 distinct counts of a product over 20,000 triples (~0.1-0.3 s each, re-evaluated in full
    on every update): before, a writer's one-triple update waited for all of them (7.7-12.9 s for
    40 on this machine); now the reader's subscriptions past BUDGET_S are refused."""
    config = secure_config(READER, WRITER)
    config.websocket.max_reeval_seconds_per_client = BUDGET_S
    gateway = in_process_gateway(config)

    async def test(client: SecureClient) -> None:
        reader, writer = await client.login("reader"), await client.login("writer")
        for batch in range(4):
            triples = " ".join(f'<http://e/s{batch}_{i}> <http://e/p{i % 7}> "v{i}" .' for i in range(5000))
            assert (await client.update(writer, f"INSERT DATA {{ {triples} }}"))[0] == 200
        ws = await client.socket()
        for index in range(60):
            count = f"SELECT (COUNT(*) AS ?c{index}) WHERE {{ ?s ?p ?o . ?s ?p2 ?o2 }}"
            await ws.send_json({"subscribe": {"sparql": count, "alias": f"a{index}", "authorization": reader}})
        frames = [await receive(ws, timeout=60) for _ in range(60)]
        refused = [frame for frame in frames if frame.get("error") == "too_costly"]
        assert refused and len(refused) + sum("notification" in frame for frame in frames) == 60, frames[:3]
        assert refused[0]["status_code"] == 429 and "max_reeval_seconds_per_client" in refused[0]["error_description"]
        started = time.monotonic()
        assert (await client.update(writer, 'INSERT DATA { <http://b/x> <http://b/y> "z" }'))[0] == 200
        assert time.monotonic() - started < 3.0
        await ws.close()

    run_secure(gateway, test)
    costs = gateway.gateway.engine.spus.costs
    wait_until(lambda: not costs.by_client)  # the socket closed: every charge released


def test_a_cheap_subscription_is_not_charged_the_wait_for_a_busy_query_worker(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """The dashboard's tiles (a coalesced UNION over the latest view, re-evaluated) were refused as
    too costly after a burst of readings: their probe was charged 6.0-6.8 s, the wait for a query
    worker, against a 2-11 ms evaluation. Here the only query worker counts 60^4 rows for another
    client meanwhile; the subscription is charged its evaluation, and taken."""
    budget = f"[websocket]\nmax_reeval_seconds_per_client = {BUDGET_S}\n"
    gateway = start_gateway(toml=f"[engine]\nquery_workers = 1\ntime_limit_s = 60\n{budget}")
    slow = " ".join(f"<{EX}x{n}> <{EX}slow> {n} ." for n in range(60))
    tiles = " ".join(f"<{EX}n{n}> <{EX}value> {n} ; <{EX}time> {n} ." for n in range(100))
    assert gateway.update(f"INSERT DATA {{ {slow} GRAPH <{EX}latest> {{ {tiles} }} }}").status == 200
    union = f"SELECT * WHERE {{ GRAPH <{EX}latest> {{ {{ ?n <{EX}value> ?v }} UNION {{ ?n <{EX}time> ?t }} }} }}"
    count = "SELECT (COUNT(*) AS ?n) WHERE { " + " ".join(f"?s{i} <{EX}slow> ?o{i} ." for i in range(4)) + " }"
    ended: list[float] = []
    holder = threading.Thread(target=lambda: (gateway.query(count), ended.append(time.monotonic())))

    async def main() -> tuple[dict, float]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{gateway.ws_url}/subscribe") as ws:
            holder.start()
            await asyncio.sleep(0.5)  # the count is in the worker
            sent = time.monotonic()
            await ws.send_json({"subscribe": {"sparql": union, "alias": "tiles", "coalesce_ms": 250}})
            return json.loads((await ws.receive(timeout=60)).data), sent

    frame, sent = asyncio.run(main())
    holder.join(60)
    assert ended and ended[0] > sent + BUDGET_S, "the subscription's probe did not wait for the worker"
    assert "error" not in frame, frame
    assert len(frame["notification"]["addedResults"]["results"]["bindings"]) == 200
