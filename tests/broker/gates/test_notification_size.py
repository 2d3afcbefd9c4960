"""A notification too large to send ends its subscription, not the gateway's memory.

What it protects (`[websocket] max_notification_bytes`, broker/gates/websocket.py
WebSocketGate._deliver): rows are bounded where a subscription's results are made, their size is
not. One long literal joined with many triples made one notification of rows × literal: a
500,000-character literal and 500 triples were a 250 MB frame, RSS 193 MB -> 1.29 GB, the event loop
busy 4 s writing it. Past the limit the subscription ends with a 413 error frame naming the
setting, its spuid and alias; the update applies, the socket and its other subscriptions live on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from tests.broker.gates.subscribe_support import (
    RunningGateway,
    post_update,
    receive_json,
    subscribe,
    wait_for_metric,
)

EX = "http://example.org/size/"
LIMIT = 100_000
JOINED = f"SELECT ?x ?o WHERE {{ <{EX}s> <{EX}big> ?o . ?x <{EX}k> ?y }}"
SMALL = f"SELECT ?o WHERE {{ <{EX}s> <{EX}small> ?o }}"


def test_a_notification_past_the_limit_ends_its_subscription_and_the_socket_lives_on(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """50 triples joined with a 10,000-character literal: ~500,000 characters, past 100,000."""
    gateway = start_gateway(toml=f"[websocket]\nmax_notification_bytes = {LIMIT}\n")

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as ws:
            keys = " ".join(f"<{EX}x{i}> <{EX}k> {i} ." for i in range(50))
            await post_update(session, gateway, f"INSERT DATA {{ {keys} }}")
            joined = await subscribe(ws, {"sparql": JOINED, "alias": "joined"})
            await subscribe(ws, {"sparql": SMALL, "alias": "small"})
            await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 2)
            # a literal that fits alone: its one row is sent
            await post_update(session, gateway, f'INSERT DATA {{ <{EX}s> <{EX}small> "{"y" * 10_000}" }}')
            frame = await receive_json(ws)
            assert frame["notification"]["alias"] == "small", frame
            await post_update(session, gateway, f'INSERT DATA {{ <{EX}s> <{EX}big> "{"z" * 10_000}" }}')
            frame = await receive_json(ws)
            assert frame.get("status_code") == 413 and frame["error"] == "result_too_large", frame
            assert "max_notification_bytes" in frame["error_description"], frame
            assert frame["alias"] == "joined" and frame["spuid"] == joined["spuid"], frame
            await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 1)
            await wait_for_metric(session, gateway, "sepa_ws_notifications_too_large_total", lambda value: value == 1)
            # the ended subscription sends nothing more; the other one is served on the same socket
            await post_update(session, gateway, f"DELETE WHERE {{ <{EX}s> <{EX}big> ?o }}")
            await post_update(session, gateway, f'INSERT DATA {{ <{EX}s> <{EX}small> "after" }}')
            frame = await receive_json(ws)
            assert frame["notification"]["alias"] == "small", frame
            assert frame["notification"]["addedResults"]["results"]["bindings"] == [
                {"o": {"type": "literal", "value": "after"}}
            ]
            await ws.send_json({"unsubscribe": {"spuid": joined["spuid"], "alias": "joined"}})
            frame = await receive_json(ws)
            assert frame["status_code"] == 404, frame  # it is no longer this connection's

    asyncio.run(scenario())
    assert gateway.ask(f'ASK {{ <{EX}s> <{EX}small> "after" }}')
    assert gateway.process.poll() is None


def test_a_first_notification_past_the_limit_refuses_the_subscription(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """The rows a subscription has when it subscribes come in its first notification: too large,
    the subscribe is told so (after its confirmation would have been), and nothing is held."""
    gateway = start_gateway(toml=f"[websocket]\nmax_notification_bytes = {LIMIT}\n")

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as ws:
            keys = " ".join(f"<{EX}x{i}> <{EX}k> {i} ." for i in range(50))
            await post_update(session, gateway, f'INSERT DATA {{ {keys} <{EX}s> <{EX}big> "{"z" * 10_000}" }}')
            await ws.send_json({"subscribe": {"sparql": JOINED, "alias": "joined"}})
            frame = await receive_json(ws)
            assert frame.get("status_code") == 413 and "max_notification_bytes" in frame["error_description"], frame
            assert frame["alias"] == "joined", frame
            await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 0)
            small = await subscribe(ws, {"sparql": SMALL, "alias": "small"})
            assert small["alias"] == "small"

    asyncio.run(scenario())
