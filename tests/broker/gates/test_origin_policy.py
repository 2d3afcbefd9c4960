"""What a web page the user opens can do to the gateway: CORS only for listed origins, and no
state-changing request nor WebSocket from another origin (see broker/gates/dispatch.py)."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import aiohttp
import pytest

from gateway.appliance.config import Config
from tools.launcher import InProcessGateway

DASHBOARD = "http://dashboard.example:8080"
EVIL = "http://evil.example"
EX = "http://example.org/origin/"


@pytest.fixture
def gateway(in_process_gateway) -> InProcessGateway:
    config = Config()
    config.http.cors_origins = [DASHBOARD]
    return in_process_gateway(config)


def count(gateway: InProcessGateway, name: str) -> int:
    return len(gateway.select(f"SELECT * WHERE {{ <{EX}{name}> ?p ?o }}"))


async def post_form(session: aiohttp.ClientSession, url: str, name: str, headers: dict[str, str]) -> int:
    data = {"update": f"INSERT DATA {{ <{EX}{name}> <{EX}p> 1 }}"}
    async with session.post(url, data=data, headers=headers) as reply:
        return reply.status


def test_cors_headers_name_a_listed_origin_only(gateway: InProcessGateway) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            url = f"{gateway.http_url}/query?query=ASK%7B%7D"
            async with session.get(url, headers={"Origin": DASHBOARD}) as reply:
                assert reply.headers["Access-Control-Allow-Origin"] == DASHBOARD
                assert "Origin" in reply.headers["Vary"]
            async with session.get(url, headers={"Origin": EVIL}) as reply:
                assert reply.status == 200 and "Access-Control-Allow-Origin" not in reply.headers
            preflight = {"Origin": DASHBOARD, "Access-Control-Request-Method": "POST"}
            async with session.options(f"{gateway.http_url}/update", headers=preflight) as reply:
                assert reply.status == 204 and reply.headers["Access-Control-Allow-Origin"] == DASHBOARD
                assert "POST" in reply.headers["Access-Control-Allow-Methods"]
            async with session.options(f"{gateway.http_url}/update", headers={**preflight, "Origin": EVIL}) as reply:
                assert "Access-Control-Allow-Origin" not in reply.headers

    asyncio.run(main())


def test_cross_origin_writes_are_refused_and_change_nothing(gateway: InProcessGateway) -> None:
    update = f"{gateway.http_url}/update"
    port = urlsplit(gateway.http_url).port

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            assert await post_form(session, update, "evil", {"Origin": EVIL}) == 403
            assert await post_form(session, update, "evil", {"Origin": "null"}) == 403
            assert await post_form(session, update, "evil", {"Sec-Fetch-Site": "cross-site"}) == 403
            # DNS rebinding: same origin by name, but the name is not ours
            rebound = {"Origin": f"http://evil.example:{port}", "Host": f"evil.example:{port}"}
            assert await post_form(session, update, "evil", rebound) == 403
            async with session.delete(f"{gateway.http_url}/scheduled/x", headers={"Origin": EVIL}) as reply:
                assert reply.status == 403
            assert await post_form(session, update, "listed", {"Origin": DASHBOARD}) == 200
            assert await post_form(session, update, "same", {"Origin": f"http://127.0.0.1:{port}"}) == 200
            assert await post_form(session, update, "plain", {}) == 200  # curl, SEPA clients: no Origin

    asyncio.run(main())
    assert count(gateway, "evil") == 0
    assert (count(gateway, "listed"), count(gateway, "same"), count(gateway, "plain")) == (1, 1, 1)
    metrics = gateway.request("GET", "/metrics").body.decode()
    assert 'sepa_errors_total{error="forbidden",status="403"} 5' in metrics


def test_a_foreign_page_cannot_open_a_subscription(gateway: InProcessGateway) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            for base in (gateway.http_url.replace("http", "ws"), gateway.ws_url):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(f"{base}/subscribe", headers={"Origin": EVIL})
                assert refused.value.status == 403
                ws = await session.ws_connect(f"{base}/subscribe", headers={"Origin": DASHBOARD})
                await ws.send_json({"subscribe": {"sparql": "ASK {}"}})
                assert "notification" in json.loads((await ws.receive(timeout=10)).data)
                await ws.close()

    asyncio.run(main())
