"""Subscription quotas per client (all its sockets together) and in total, by count and by bytes."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp

from tools.launcher import RunningGateway

TOML = "[websocket]\nmax_subscriptions_per_client = 3\nmax_subscription_bytes_per_client = 400\n"


async def _frame(ws: aiohttp.ClientWebSocketResponse) -> dict:
    return json.loads((await ws.receive(timeout=10)).data)


async def _subscribe(ws: aiohttp.ClientWebSocketResponse, alias: str, sparql: str | None = None) -> dict:
    await ws.send_json({"subscribe": {"sparql": sparql or f"SELECT * WHERE {{ ?s <urn:{alias}> ?o }}", "alias": alias}})
    return await _frame(ws)


def test_one_client_holds_at_most_its_quota_across_sockets(start_gateway) -> None:
    gateway: RunningGateway = start_gateway(toml=TOML)

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            first = await session.ws_connect(f"{gateway.ws_url}/subscribe")
            second = await session.ws_connect(f"{gateway.ws_url}/subscribe")
            held = [await _subscribe(first, "a"), await _subscribe(first, "b"), await _subscribe(second, "c")]
            assert all("notification" in frame for frame in held), held
            refused = await _subscribe(second, "d")
            assert (refused["status_code"], refused["error"], refused["alias"]) == (429, "too_many_subscriptions", "d")
            # the socket lives, and ending one subscription makes room
            spuid = held[2]["notification"]["spuid"]
            await second.send_json({"unsubscribe": {"spuid": spuid}})
            assert "unsubscribed" in await _frame(second)
            assert "notification" in await _subscribe(second, "e")
            # a closed socket gives its subscriptions back
            await first.close()
            await asyncio.sleep(0.3)
            assert "notification" in await _subscribe(second, "f")
            assert "notification" in await _subscribe(second, "g")
            # bytes: one long query past the client's 400 bytes
            await second.close()
            third = await session.ws_connect(f"{gateway.ws_url}/subscribe")
            long = "SELECT * WHERE { ?s ?p ?o " + "FILTER(?o != 1) " * 30 + "}"
            refused = await _subscribe(third, "long", long)
            assert refused["status_code"] == 429 and "bytes" in refused["error_description"], refused
            await third.close()

    asyncio.run(main())
    metrics = gateway.metrics()
    assert metrics['sepa_errors_total{error="ws_too_many_subscriptions",status="429"}'] == 2


def test_an_unsubscribe_sent_on_the_confirmation_finds_its_subscription(start_gateway) -> None:
    """The update thread settles the calls it ran back to back together (group commit), so a
    subscribe's confirmation reaches the socket while the update queued after it still runs. The
    gate recorded the subscription as the connection's only when the subscribe was settled: an
    unsubscribe sent on reading the confirmation got not_found (seen in a loaded CI run), and the
    subscription lived on with its quota. Here: a large update U1 holds the update thread, the
    subscribe queues behind it, a second large update U2 behind the subscribe."""
    gateway: RunningGateway = start_gateway(toml="[http]\nmax_request_bytes = 16777216\n")
    big = [" ".join(f"<urn:b{k}-{n}> <urn:big> {n} ." for n in range(60_000)) for k in (1, 2)]

    def post(body: str) -> None:
        request = urllib.request.Request(gateway.update_url, data=f"INSERT DATA {{ {body} }}".encode(), method="POST")
        request.add_header("Content-Type", "application/sparql-update")
        urllib.request.urlopen(request, timeout=60).read()

    async def main() -> dict:
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(f"{gateway.ws_url}/subscribe")
            first = loop.run_in_executor(None, post, big[0])
            await asyncio.sleep(0.3)  # U1 runs
            await ws.send_json({"subscribe": {"sparql": "SELECT * WHERE { ?s <urn:q> ?o }", "alias": "q"}})
            await asyncio.sleep(0.3)  # the subscribe waits behind U1
            second = loop.run_in_executor(None, post, big[1])
            confirmation = await _frame(ws)
            await ws.send_json({"unsubscribe": {"spuid": confirmation["notification"]["spuid"]}})
            reply = await _frame(ws)
            await first
            await second
            await ws.close()
            return reply

    reply = asyncio.run(main())
    assert "unsubscribed" in reply, reply
    assert gateway.metrics()["sepa_subscriptions"] == 0
