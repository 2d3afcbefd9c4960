"""What a page on the HTTPS port may ask besides SPARQL: its client's current rights
(/secure/rights) and, for a client that reads every graph, the metrics (/secure/metrics) and the
SPU table (/secure/spus); and the pages the appliance adds (Gates.add_page) are served on both
ports."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from broker.api import Engine, Gates, Scheduler
from tests.broker.gates.secure_support import ADMIN, SecureClient, receive, secure_config
from tests.broker.gates.test_secure_gates import run_secure

VIEWER = {"identity": "viewer", "read": ["http://example.org/g"], "write": []}
WRITER = {"identity": "writer", "read": ["*"], "write": ["http://example.org/g", "default"]}


async def get(client: SecureClient, path: str, token: str | None) -> tuple[int, dict | str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with client.session.get(client.https_url + path, headers=headers, ssl=client.ssl) as reply:
        return reply.status, await (reply.json() if reply.content_type == "application/json" else reply.text())


def test_rights_say_what_the_client_may_do_now_and_metrics_are_for_readers_of_everything(
    in_process_gateway, tmp_path
) -> None:
    gateway = in_process_gateway(secure_config(ADMIN, VIEWER, WRITER, data_dir=str(tmp_path / "data")))

    async def test(client: SecureClient) -> None:
        admin, viewer, writer = [await client.login(name) for name in ("admin", "viewer", "writer")]
        assert await get(client, "/secure/rights", admin) == (200, {"identity": "admin", "read": ["*"], "write": ["*"]})
        assert await get(client, "/secure/rights", viewer) == (
            200,
            {"identity": "viewer", "read": ["http://example.org/g"], "write": []},
        )
        status, rights = await get(client, "/secure/rights", writer)
        assert status == 200 and rights["write"] == ["http://example.org/g", "urn:x-sepa:default-graph"]
        assert (await get(client, "/secure/rights", None))[0] == 401
        status, text = await get(client, "/secure/metrics", admin)
        assert status == 200 and "sepa_updates_total" in text
        assert (await get(client, "/secure/metrics", viewer))[0] == 403
        assert (await get(client, "/secure/metrics", None))[0] == 401

    run_secure(gateway, test)


def test_the_spu_table_names_every_clients_subscriptions_so_only_readers_of_everything_get_it(
    in_process_gateway, tmp_path
) -> None:
    gateway = in_process_gateway(secure_config(ADMIN, VIEWER, data_dir=str(tmp_path / "data")))
    query = "SELECT ?s WHERE { GRAPH <http://example.org/g> { ?s ?p ?o } }"

    async def test(client: SecureClient) -> None:
        admin, viewer = [await client.login(name) for name in ("admin", "viewer")]
        ws = await client.socket()
        for _ in range(2):  # two subscriptions of one query: one SPU
            await ws.send_json({"subscribe": {"sparql": query, "authorization": f"Bearer {viewer}"}})
            assert "notification" in await receive(ws)
        status, table = await get(client, "/secure/spus", admin)
        assert status == 200 and (table["spus"], table["subscriptions"]) == (1, 2)
        # re-evaluated: a client that may not read every graph is evaluated over its own graphs
        expected = {"kind": "re-evaluated", "query": query, "subscriptions": 2, "notifications": 2, "solutions": 0}
        assert table["shown"] == [{**expected, "owners": ["viewer"], "ask": False}]  # the token's identity
        assert (await get(client, "/secure/spus?limit=0", admin))[0] == 400
        assert (await get(client, "/secure/spus?limit=x", admin))[0] == 400
        assert (await get(client, "/secure/spus?limit=1001", admin))[0] == 400
        assert (await get(client, "/secure/spus", viewer))[0] == 403  # even its own: the table is everyone's
        assert (await get(client, "/secure/spus", None))[0] == 401
        await ws.close()

    run_secure(gateway, test)


def test_an_added_page_is_served_on_the_plain_port_and_sees_which_port() -> None:
    """(tests/gateway/dashboard/test_dashboard_pages.py gets the same page over HTTPS.)"""

    async def main() -> None:
        gates = Gates(Scheduler(Engine()))

        async def page(request: web.BaseRequest) -> web.Response:
            return web.Response(text=f"secure={request.secure}")

        gates.add_page("/hello", page)
        runner = web.ServerRunner(gates.http_server())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/hello") as reply:
                assert (reply.status, await reply.text()) == (200, "secure=False")
        finally:
            await runner.cleanup()
            gates.scheduler.close()

    asyncio.run(main())
