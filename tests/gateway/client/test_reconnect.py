"""Reconnection of the network transport: kill -9 the broker under a subscribed client.

What it protects: an application keeps a correct view across a broker crash without seeing a
duplicate or a gap. After the restart the client re-subscribes, diffs the new complete result
against its view and delivers the difference as ONE notification whose sequence number simply
continues; when nothing changed, the application sees nothing at all. Also: backoff delays stay
bounded, a client that gives up ends its subscriptions with a clear error, requests made during
the outage fail (updates, subscribes) or are retried (queries) as documented, and a sequence gap
from a (fake) broker is repaired by the same resynchronisation.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from pyoxigraph import NamedNode

from broker.api import Notification
from gateway.client import (
    NetworkTransport,
    ReconnectPolicy,
    SepaClient,
    SepaClientError,
    SepaConnectionError,
)
from tests.gateway.client.client_support import HOST, GatewayProcess, eventually, free_ports, run
from tools.launcher import RunningGateway

EX = "http://example.org/"
PREFIX = f"PREFIX ex: <{EX}>\n"
QUERY = PREFIX + "SELECT ?s ?o WHERE { ?s ex:p ?o }"
FAST = ReconnectPolicy(initial_delay_s=0.05, max_delay_s=0.3, query_retry_s=5.0)

Make = Callable[..., GatewayProcess]


def ex(local: str) -> NamedNode:
    return NamedNode(EX + local)


def subscriptions_on(gateway: RunningGateway) -> float:
    with urllib.request.urlopen(f"http://{HOST}:{gateway.http_port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            name, _, value = line.rpartition(" ")
            if name == "sepa_subscriptions":
                return float(value)
    return 0.0


def test_kill_restart_delivers_one_diff_and_sequence_continues(restartable: Make) -> None:
    gateway = restartable().start()
    gateway.post_update(PREFIX + "INSERT DATA { ex:a1 ex:p 1 . ex:a2 ex:p 2 . ex:a3 ex:p 3 }")

    async def body() -> None:
        transport = NetworkTransport(*gateway.endpoints, reconnect=FAST)
        seen: list[Notification] = []
        async with SepaClient(transport) as client:
            sub = await client.subscribe(QUERY, "watch", on_notification=seen.append, iterate=True)
            await client.update(PREFIX + "INSERT DATA { ex:a4 ex:p 4 }")
            await eventually(lambda: sub.sequence == 1, what="notification 1")

            gateway.kill()
            await eventually(lambda: transport.state == "reconnecting", what="client noticed the crash")
            # the store changes while this client cannot see the broker: a second gateway on the
            # same data directory (other ports) applies an update, then stops
            other = restartable(ports=tuple(free_ports(2)))
            await asyncio.to_thread(other.start)
            other.post_update(PREFIX + "DELETE DATA { ex:a1 ex:p 1 } ; INSERT DATA { ex:b1 ex:p 5 . ex:b2 ex:p 6 }")
            await asyncio.to_thread(other.stop)

            await asyncio.to_thread(gateway.start)  # same ports, same data
            restarted = time.monotonic()
            await eventually(lambda: sub.sequence == 2, timeout=5, what="the resynchronising notification")
            assert time.monotonic() - restarted < 3.0
            resync = await _last(seen, 2)
            assert resync.extra.get("resync") is True
            assert resync.spuid == sub.spuid and resync.alias == "watch"  # the identity the application knows
            assert sorted(row[0].value for row in resync.added) == [EX + "b1", EX + "b2"]
            assert [row[0] for row in resync.removed] == [ex("a1")]
            assert transport.stats.reconnects == 1 and sub.resyncs == 1

            async with SepaClient(NetworkTransport(*gateway.endpoints)) as publisher:
                await publisher.update(PREFIX + "INSERT DATA { ex:c1 ex:p 7 }")
            await eventually(lambda: sub.sequence == 3, what="notification after the restart")
            await _last(seen, 3)
            assert seen[-1].added == ((ex("c1"), seen[-1].added[0][1]),) and seen[-1].removed == ()

            assert sub.view == await client.query(QUERY)
            assert [n.sequence for n in seen] == [0, 1, 2, 3]  # no gap, no duplicate
            assert sum(1 for n in seen if n.extra.get("resync")) == 1
            assert sub.view.inconsistencies == 0

    run(body(), timeout=45)


async def _last(seen: list[Notification], sequence: int) -> Notification:
    await eventually(lambda: any(n.sequence == sequence for n in seen), what=f"callback of {sequence}")
    return next(n for n in seen if n.sequence == sequence)


def test_requests_during_an_outage_and_a_silent_resync(restartable: Make) -> None:
    gateway = restartable().start()

    async def body() -> None:
        transport = NetworkTransport(*gateway.endpoints, reconnect=FAST)
        async with SepaClient(transport) as client:
            await client.update(PREFIX + "INSERT DATA { ex:a ex:p 1 }")
            kept = await client.subscribe(QUERY, "kept")
            dropped = await client.subscribe(QUERY, "dropped")
            gateway.kill()
            await eventually(lambda: transport.state == "reconnecting", what="client noticed the crash")

            with pytest.raises(SepaConnectionError) as update_error:
                await client.update(PREFIX + "INSERT DATA { ex:b ex:p 2 }")  # never retried
            assert (update_error.value.error, update_error.value.status_code) == ("connection_failed", 503)
            with pytest.raises(SepaConnectionError):
                await client.subscribe(QUERY, "new")
            await client.unsubscribe(dropped)  # succeeds at once: the broker ended it with the socket

            # a query is idempotent: retried until the broker is back (within query_retry_s)
            pending_query = asyncio.create_task(client.query(QUERY))
            await asyncio.sleep(0.3)
            assert not pending_query.done()
            await asyncio.to_thread(gateway.start)
            result = await pending_query
            assert [row[0] for row in result.rows] == [ex("a")]
            assert transport.stats.query_retries >= 1

            await eventually(lambda: kept.resyncs == 1, what="re-subscription")
            assert kept.sequence == 0  # nothing changed: the application saw nothing
            assert subscriptions_on(gateway) == 1  # "dropped" was not restored
            await client.update(PREFIX + "INSERT DATA { ex:b ex:p 2 }")
            assert (await kept.next(5)).sequence == 0
            note = await kept.next(5)
            assert note.sequence == 1 and note.added[0][0] == ex("b")

    run(body(), timeout=45)


def test_gives_up_after_max_attempts_with_a_clear_error(restartable: Make) -> None:
    gateway = restartable(on_disk=False).start()

    async def body() -> None:
        policy = ReconnectPolicy(initial_delay_s=0.05, max_delay_s=0.1, max_attempts=3)
        transport = NetworkTransport(*gateway.endpoints, reconnect=policy)
        async with SepaClient(transport) as client:
            sub = await client.subscribe(QUERY, "doomed")
            assert (await sub.next(5)).sequence == 0
            gateway.kill()
            started = time.monotonic()
            with pytest.raises(SepaConnectionError) as ended:
                await sub.next(5)
            assert time.monotonic() - started < 2.0
            assert ended.value.error == "connection_lost" and "could not be restored" in ended.value.error_description
            assert transport.stats.reconnect_attempts == 3
            assert all(0 < delay <= 0.1 for delay in transport.stats.delays)
            assert sub.closed and client.subscriptions == []
            assert transport.state == "idle"

    run(body())


def test_backoff_is_exponential_jittered_and_bounded() -> None:
    policy = ReconnectPolicy(initial_delay_s=0.1, max_delay_s=2.0, multiplier=2.0, jitter=0.5)
    ceilings = [policy.delay(k, uniform=lambda: 0.0) for k in range(8)]
    assert ceilings == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0])
    floors = [policy.delay(k, uniform=lambda: 1.0) for k in range(8)]
    assert floors == pytest.approx([c / 2 for c in ceilings])
    assert 1.0 <= policy.delay(10_000) <= 2.0  # no overflow, still bounded
    for bad in ({"jitter": 1.5}, {"multiplier": 0.5}, {"initial_delay_s": 6.0}, {"max_attempts": -1}):
        with pytest.raises(ValueError):
            ReconnectPolicy(**bad)  # type: ignore[arg-type]


# -- a misbehaving broker -------------------------------------------------------------------------


def _notification(body: dict[str, Any], spuid: str, sequence: int, added: list[str]) -> str:
    head = {"vars": ["s"]}
    rows = [{"s": {"type": "uri", "value": EX + local}} for local in added]
    return json.dumps(
        {
            "notification": {
                "spuid": spuid,
                "alias": body.get("alias"),
                "sequence": sequence,
                "addedResults": {"head": head, "results": {"bindings": rows}},
                "removedResults": {"head": head, "results": {"bindings": []}},
            }
        }
    )


def test_a_sequence_gap_is_repaired_by_resubscribing_and_a_refusal_ends_the_subscription() -> None:
    """A fake broker skips sequence 1; on the second connection it answers with a new result; on
    the third it refuses the subscription (which the client reports instead of retrying)."""
    connections = 0

    async def handler(request: web.Request) -> web.WebSocketResponse:
        nonlocal connections
        connections += 1
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            body = json.loads(message.data).get("subscribe")
            if body is None:
                continue
            if connections == 1:
                await ws.send_str(_notification(body, "sepa://subscription/one", 0, ["a"]))
                await ws.send_str(_notification(body, "sepa://subscription/one", 2, ["b"]))  # gap
            elif connections == 2:
                await ws.send_str(_notification(body, "sepa://subscription/two", 0, ["a", "c"]))
                await asyncio.sleep(0.2)
                await ws.close()
            else:
                refusal = {"error": "forbidden", "error_description": "no", "status_code": 403}
                await ws.send_str(json.dumps({**refusal, "alias": body["alias"]}))
        return ws

    async def body() -> None:
        app = web.Application()
        app.add_routes([web.get("/subscribe", handler)])
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_ports(1)[0]
        await web.TCPSite(runner, HOST, port).start()
        try:
            url = f"http://{HOST}:{port}"
            ws_url = f"ws://{HOST}:{port}/subscribe"
            transport = NetworkTransport(f"{url}/query", f"{url}/update", ws_url, reconnect=FAST)
            async with SepaClient(transport) as client:
                sub = await client.subscribe(PREFIX + "SELECT ?s WHERE { ?s ex:p ?o }")
                assert (await sub.next(5)).added == ((ex("a"),),)
                repaired = await sub.next(5)
                assert repaired.sequence == 1 and repaired.extra["resync"] is True
                assert repaired.added == ((ex("c"),),) and repaired.removed == ()  # "b" (after the gap) never applied
                assert repaired.spuid == "sepa://subscription/one"
                assert repaired.extra["server_spuid"] == "sepa://subscription/two"
                assert transport.stats.sequence_gaps == 1
                with pytest.raises(SepaClientError) as refused:
                    await sub.next(5)
                assert refused.value.status_code == 403 and refused.value.alias is None
                assert sorted(row[0].value for row in sub.view.rows) == [EX + "a", EX + "c"]
        finally:
            await runner.cleanup()

    run(body())


def test_without_a_view_a_reconnect_delivers_the_complete_result_marked_resync(restartable: Make) -> None:
    gateway = restartable().start()
    gateway.post_update(PREFIX + "INSERT DATA { ex:a1 ex:p 1 }")

    async def body() -> None:
        transport = NetworkTransport(*gateway.endpoints, reconnect=FAST)
        seen: list[Notification] = []
        async with SepaClient(transport) as client:
            sub = await client.subscribe(QUERY, "mirror", on_notification=seen.append, keep_view=False)
            gateway.kill()
            await eventually(lambda: transport.state == "reconnecting", what="client noticed the crash")
            await asyncio.to_thread(gateway.start)
            await eventually(lambda: sub.sequence == 1, timeout=5, what="the resynchronising notification")
            resync = await _last(seen, 1)
            assert resync.extra.get("resync") is True and resync.removed == ()
            assert [row[0] for row in resync.added] == [ex("a1")]  # the whole result: no view to diff against

    run(body(), timeout=45)
