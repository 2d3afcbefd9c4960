"""One base IRI for relative IRIs, whatever gate, host name or transport a request came by."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp

from tools.launcher import RunningGateway


def _query_via(gateway: RunningGateway, host: str, sparql: str) -> dict:
    url = gateway.http_url.replace("127.0.0.1", host) + gateway.query_path
    request = urllib.request.Request(
        url, sparql.encode(), {"Content-Type": "application/sparql-query", "Accept": "application/sparql-results+json"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def test_relative_iris_mean_the_same_through_any_host_name_and_the_websocket(start_gateway) -> None:
    gateway = start_gateway(toml='[engine]\nbase_iri = "http://plant.example/gw/"\n')
    assert gateway.update("INSERT DATA { <integration> <p> 1 }").status == 200  # through 127.0.0.1
    rows = _query_via(gateway, "localhost", "SELECT ?s WHERE { ?s <p> 1 }")["results"]["bindings"]
    assert [row["s"]["value"] for row in rows] == ["http://plant.example/gw/integration"]
    assert _query_via(gateway, "localhost", "ASK { <http://plant.example/gw/integration> <p> 1 }")["boolean"]
    # a request's own BASE still wins
    assert _query_via(gateway, "127.0.0.1", "BASE <http://other/> ASK { <integration> ?p 1 }")["boolean"] is False

    async def subscribe() -> tuple[dict, dict]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{gateway.ws_url}/subscribe") as ws:
            await ws.send_json({"subscribe": {"sparql": "SELECT ?o WHERE { <integration> <p> ?o }", "alias": "rel"}})
            first = json.loads((await ws.receive(timeout=10)).data)
            assert gateway.update("INSERT DATA { <integration> <p> 2 }").status == 200
            second = json.loads((await ws.receive(timeout=10)).data)
            return first, second

    first, second = asyncio.run(subscribe())
    added = lambda frame: [row["o"]["value"] for row in frame["notification"]["addedResults"]["results"]["bindings"]]  # noqa: E731
    assert added(first) == ["1"] and added(second) == ["2"], (first, second)


def test_the_default_base_is_the_gateways_own_and_stable(start_gateway) -> None:
    gateway = start_gateway(toml='[observations]\ngateway_id = "boiler-room"\n')
    assert gateway.update("INSERT DATA { <x> <p> 1 }").status == 200
    assert gateway.ask("ASK { <urn:sepa-gateway:boiler-room/x> <urn:sepa-gateway:boiler-room/p> 1 }")


def test_a_base_that_is_not_an_absolute_iri_is_a_configuration_error(gateway_command, tmp_path) -> None:
    import subprocess

    config = tmp_path / "gateway.toml"
    config.write_text('[engine]\nbase_iri = "relative/"\n')
    done = subprocess.run(
        [*gateway_command, "run", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "engine.base_iri" in done.stderr
