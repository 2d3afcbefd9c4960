"""Sockets reset (TCP RST) while their subscribes are in flight leave no subscription behind.

What it protects (the WebSocket gate's "closing a socket ends all of its subscriptions", and
`sepa_subscriptions`, which counts toward `websocket.max_subscriptions`): a client sends several
subscribes and its socket is reset before it reads the replies (a flaky Wi-Fi link, a killed
process). Its subscribes are probed, queued and confirmed after the socket is gone, at any of
those moments. Whichever it is, every subscription it made ends: before the fix, 3,000 such
sockets left 119-194 subscriptions a round that no client held (`sepa_ws_connections` 0), each
re-evaluated at every update until a restart, because their unsubscribes were refused with 429
by a queue full of the dead sockets' own probes.

A small `scheduler.queue_size` fills the queue with a few hundred sockets, so the test takes
seconds; a bystander subscribed throughout must keep its one subscription and its notifications.
"""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp

from gateway.appliance.config import Config
from tests.broker.gates.subscribe_support import (
    RawWebSocket,
    RunningGateway,
    metric_now,
    post_update,
    receive_json,
    subscribe,
    wait_for_metric,
)
from tools.launcher import InProcessGateway

EX = "http://example.org/reset/"
SOCKETS = 300
SUBSCRIBES_EACH = 5  # in flight together on one socket; 1 or 2 never left one behind
QUEUE_SIZE = 20
CLIENTS_AT_ONCE = 16


def reset_with_subscribes_in_flight(gateway: RunningGateway, index: int) -> None:
    """Open a socket, send SUBSCRIBES_EACH subscribes, read one reply and reset it.

    Why one reply: the gateway has then taken the others off the socket (three are handled at once,
    broker.gates.websocket.MESSAGES_AHEAD), so they are in flight when the reset comes. Reset at
    once, the frames not yet read went with the socket and the gateway mostly ran one subscribe each:
    without the fix, 0 subscriptions left behind in 300 sockets, 74-117 after one reply."""
    client = RawWebSocket(gateway.ws_port)
    for number in range(SUBSCRIBES_EACH):
        client.send_json({"subscribe": {"sparql": f"SELECT ?o WHERE {{ <{EX}s{index}> <{EX}p{number}> ?o }}"}})
    client.receive_json()  # a notification, or a 429 error frame: the queue is full
    client.reset()


def test_sockets_reset_with_subscribes_in_flight_end_all_their_subscriptions(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    gateway = start_gateway(toml=f"[scheduler]\nqueue_size = {QUEUE_SIZE}\n")

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as bystander:
            await subscribe(bystander, {"sparql": f"SELECT ?o WHERE {{ <{EX}kept> <{EX}p> ?o }}"})
            with ThreadPoolExecutor(CLIENTS_AT_ONCE) as clients:
                loop = asyncio.get_running_loop()
                resets = (
                    loop.run_in_executor(clients, reset_with_subscribes_in_flight, gateway, i) for i in range(SOCKETS)
                )
                await asyncio.gather(*resets)
            await wait_for_metric(session, gateway, "sepa_ws_connections", lambda value: value == 1, timeout=30)
            await wait_for_metric(session, gateway, "sepa_scheduler_in_flight", lambda value: value == 0, timeout=30)
            rejected = await metric_now(session, gateway, "sepa_scheduler_rejected_total")
            assert rejected > 0, "the churn never filled the queue: the race was not run"
            await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 1, timeout=10)
            await post_update(session, gateway, f"INSERT DATA {{ <{EX}kept> <{EX}p> 1 }}")
            notification = (await receive_json(bystander))["notification"]
            assert notification["sequence"] == 1 and len(notification["addedResults"]["results"]["bindings"]) == 1

    asyncio.run(scenario())
    assert "level=error" not in gateway.log(), gateway.log()


def test_a_socket_closed_while_its_subscribe_fails_to_commit_leaves_no_subscription(
    in_process_gateway: Callable[[Config], InProcessGateway], tmp_path: Path
) -> None:
    """The group commit of a subscribe fails (an fdatasync of the journal that fails: EIO, which a
    test cannot make a disk do without root, so the store's sync raises it here) after its socket
    closed. The engine made the subscription, the gate did not register it for a socket that was
    gone, and the failure's error frame was all it did: the subscription lived on for no client,
    counted in `sepa_subscriptions` (1 for 0 before the fix) and re-evaluated at every update."""
    config = Config()
    config.store.data_dir = str(tmp_path / "data")
    gateway = in_process_gateway(config)
    scheduler = gateway.gateway.scheduler
    entered, closed = threading.Event(), threading.Event()
    subscribe, sync = scheduler.engine.subscribe, scheduler.engine.store.sync

    def subscribe_once_closed(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert closed.wait(30), "the socket never closed"
        return subscribe(*args, **kwargs)

    def failing_sync() -> None:
        if closed.is_set():
            raise OSError(errno.EIO, "Input/output error")
        sync()

    scheduler.engine.subscribe, scheduler.engine.store.sync = subscribe_once_closed, failing_sync

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            before = await metric_now(session, gateway, "sepa_subscriptions")
            async with session.ws_connect(gateway.subscribe_url) as client:
                await client.send_json({"subscribe": {"sparql": f"SELECT ?o WHERE {{ <{EX}s> <{EX}p> ?o }}"}})
                assert await asyncio.to_thread(entered.wait, 30), "the subscribe never reached the engine"
            await wait_for_metric(session, gateway, "sepa_ws_connections", lambda value: value == 0)
            closed.set()
            await wait_for_metric(session, gateway, "sepa_scheduler_in_flight", lambda value: value == 0)
            await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == before)

    asyncio.run(scenario())
