"""Subscription quotas per client (all its sockets together) and in total, by count and by bytes."""

from __future__ import annotations

import asyncio
import json

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
