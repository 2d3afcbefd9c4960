"""No request makes the gateway connect anywhere unless the operator allowed it (SERVICE, LOAD).

A plain TCP listener on a local port stands for a device on the plant network: it records every
connection it accepts. Every entry point (query, update, delayed update, subscription) is tried
with SERVICE in many spellings and with LOAD; the listener must see nothing. Then its endpoint is
allow-listed, and the same SERVICE does reach it (so this test can fail), with a clear 400 when it
answers garbage.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import aiohttp
import pytest

from gateway.appliance.config import Config
from tools.launcher import InProcessGateway


class Listener:
    """Accepts connections on 127.0.0.1 and answers each with a non-SPARQL HTTP reply (with `hang`,
    never answers: an endpoint that accepted and went silent)."""

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            if self.hang:
                self.held = connection  # kept open, never answered
                continue
            with connection:
                connection.settimeout(2)
                try:
                    connection.recv(65536)
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nno")
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()
        held = getattr(self, "held", None)
        if held is not None:
            held.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    running = Listener()
    yield running
    running.close()


def spellings(port: int) -> list[tuple[str, str]]:
    """(prologue, group pattern) pairs: each becomes a query, an update's WHERE and a subscription."""
    url = f"http://127.0.0.1:{port}/sparql"
    return [
        ("", f"SERVICE <{url}> {{ ?s ?p ?o }}"),
        ("", f"service silent <{url}> {{ ?s ?p ?o }}"),
        (f"PREFIX dev: <http://127.0.0.1:{port}/>", "SERVICE dev:sparql { ?s ?p ?o }"),
        (f"BASE <http://127.0.0.1:{port}/x/>", "SERVICE <../sparql> { ?s ?p ?o }"),
        ("", f"?a ?b ?c OPTIONAL {{ SERVICE <{url}> {{ ?s ?p ?o }} }}"),
        ("", f"{{ SELECT ?s WHERE {{ SERVICE <{url}> {{ ?s ?p ?o }} }} }}"),
        ("", f"FILTER EXISTS {{ SERVICE <{url}> {{ ?s ?p ?o }} }}"),
        ("", f"BIND(<{url}> AS ?e) SERVICE ?e {{ ?s ?p ?o }}"),
    ]


def run_all(
    gateway: InProcessGateway, listener: Listener, requests: Callable[[int], list[tuple[str, str]]]
) -> list[dict]:
    """Every request through every entry point; the JSON error (or result) of each."""
    replies: list[dict] = []

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(f"{gateway.ws_url}/subscribe")
            for prologue, pattern in requests(listener.port):
                sparql = f"{prologue} SELECT * WHERE {{ {pattern} }}"
                async with session.get(f"{gateway.http_url}/query", params={"query": sparql}) as reply:
                    replies.append({"status": reply.status, **json.loads(await reply.text())})
                update = f"{prologue} INSERT {{ <urn:x> <urn:y> 1 }} WHERE {{ {pattern} }}"
                for params in ({}, {"delay": "50"}):
                    headers = {"Content-Type": "application/sparql-update"}
                    async with session.post(
                        f"{gateway.http_url}/update", data=update, params=params, headers=headers
                    ) as reply:
                        replies.append({"status": reply.status, **json.loads(await reply.text())})
                await ws.send_json({"subscribe": {"sparql": sparql, "alias": "s"}})
                replies.append(json.loads((await ws.receive(timeout=10)).data))
            await ws.close()
        await asyncio.sleep(0.5)  # delayed updates that were (wrongly) accepted fall due

    asyncio.run(main())
    return replies


def test_no_request_reaches_a_local_port_unless_allowed(in_process_gateway, listener: Listener) -> None:
    gateway = in_process_gateway(Config())
    replies = run_all(gateway, listener, spellings)
    assert listener.accepted == 0
    assert all(reply.get("status_code") == 400 or reply.get("status") == 400 for reply in replies), replies
    assert all("SERVICE" in reply["error_description"] for reply in replies), replies


def test_load_stays_refused(in_process_gateway, listener: Listener) -> None:
    gateway = in_process_gateway(Config())

    def loads(port: int) -> list[str]:
        return [
            f"LOAD <http://127.0.0.1:{port}/x.ttl>",
            f"LOAD SILENT <http://127.0.0.1:{port}/x.ttl> INTO GRAPH <urn:g>",
        ]

    async def main() -> list[int]:
        async with aiohttp.ClientSession() as session:
            statuses = []
            for update in loads(listener.port):
                for params in ({}, {"delay": "50"}):
                    headers = {"Content-Type": "application/sparql-update"}
                    async with session.post(
                        f"{gateway.http_url}/update", data=update, params=params, headers=headers
                    ) as reply:
                        statuses.append(reply.status)
            await asyncio.sleep(0.5)
            return statuses

    assert asyncio.run(main()) == [400, 400, 400, 400]
    assert listener.accepted == 0


def test_an_allowed_endpoint_is_called_and_a_garbage_answer_is_a_400(in_process_gateway, listener: Listener) -> None:
    config = Config()
    config.engine.service_allow = [f"http://127.0.0.1:{listener.port}/*"]
    gateway = in_process_gateway(config)

    async def main() -> tuple[int, dict]:
        async with aiohttp.ClientSession() as session:
            query = f"SELECT * WHERE {{ SERVICE <http://127.0.0.1:{listener.port}/sparql> {{ ?s ?p ?o }} }}"
            async with session.get(f"{gateway.http_url}/query", params={"query": query}) as reply:
                return reply.status, json.loads(await reply.text())

    status, reply = asyncio.run(main())
    deadline = time.monotonic() + 5
    while listener.accepted == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listener.accepted >= 1
    assert (status, reply["error"]) == (400, "invalid_request"), reply


def test_allowed_service_only_in_queries_and_only_as_long_as_the_time_limit(in_process_gateway) -> None:
    silent = Listener(hang=True)
    try:
        config = Config()
        config.engine.service_allow = [f"http://127.0.0.1:{silent.port}/*"]
        config.engine.service_timeout_s = 1.0
        gateway = in_process_gateway(config)
        pattern = f"SERVICE <http://127.0.0.1:{silent.port}/sparql> {{ ?s ?p ?o }}"

        async def main() -> tuple[int, dict, float, int, dict, dict]:
            async with aiohttp.ClientSession() as session:
                started = time.monotonic()
                params = {"query": f"SELECT * WHERE {{ {pattern} }}"}
                async with session.get(f"{gateway.http_url}/query", params=params) as reply:
                    status, body = reply.status, json.loads(await reply.text())
                waited = time.monotonic() - started
                async with session.get(f"{gateway.http_url}/query", params={"query": "ASK {}"}) as reply:
                    other = reply.status  # the gateway still answers
                headers = {"Content-Type": "application/sparql-update"}
                update = f"INSERT {{ <urn:x> <urn:y> 1 }} WHERE {{ {pattern} }}"
                async with session.post(f"{gateway.http_url}/update", data=update, headers=headers) as reply:
                    refused_update = json.loads(await reply.text())
                ws = await session.ws_connect(f"{gateway.ws_url}/subscribe")
                await ws.send_json({"subscribe": {"sparql": f"SELECT * WHERE {{ {pattern} }}"}})
                refused_subscription = json.loads((await ws.receive(timeout=10)).data)
                await ws.close()
                return status, body, waited, other, refused_update, refused_subscription

        status, body, waited, other, refused_update, refused_subscription = asyncio.run(main())
        assert (status, body["error"]) == (504, "service_timeout") and 0.9 < waited < 5, (status, body, waited)
        assert other == 200
        assert refused_update["status_code"] == 400 and "not allowed in updates" in refused_update["error_description"]
        assert refused_subscription["status_code"] == 400
        assert "not allowed in subscriptions" in refused_subscription["error_description"]
    finally:
        silent.close()


def test_sigterm_stops_the_gateway_while_a_service_call_hangs(tmp_path) -> None:
    from tools.launcher import launch_gateway

    silent = Listener(hang=True)
    try:
        config = tmp_path / "gateway.toml"
        config.write_text(f'[engine]\nservice_allow = ["http://127.0.0.1:{silent.port}/*"]\nservice_timeout_s = 0.5\n')
        with launch_gateway(config=config, mqtt=False) as gateway:
            query = f"SELECT * WHERE {{ SERVICE <http://127.0.0.1:{silent.port}/sparql> {{ ?s ?p ?o }} }}"
            assert gateway.query(query).status == 504
            # the evaluation was stopped with its client's wait: its worker was killed, not left hanging
            deadline = time.monotonic() + 3
            while gateway.metrics().get("sepa_query_worker_timeouts_total") != 1:
                assert time.monotonic() < deadline, "the worker of the hanging SERVICE call was not stopped"
                time.sleep(0.05)
            started = time.monotonic()
            assert gateway.stop() == 0
            assert time.monotonic() - started < 10
    finally:
        silent.close()
