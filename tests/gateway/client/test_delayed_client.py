"""Delayed updates through the client API (seed 001 §II-C), identically over both transports.

What it protects: `SepaClient.update(..., delay=... | at=...)` schedules the update on the broker
and returns a `Scheduled` (id, due time in UTC) instead of applying it; the broker runs it when
due, never before, and subscriptions are notified then. `scheduled()` lists what is pending (with
its SPARQL), `cancel_scheduled()` removes it and answers not_found (404) for an unknown id, over
the in-process transport (scheduler.delayed) and the network transport (202 /update, GET and
DELETE /scheduled) alike. Bad delays and instants are refused before anything is sent. A
Producer of a JSAP entry with a `delay` schedules; the constructor can override or drop it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import pytest
from aiohttp import web

from gateway.client import (
    Aggregator,
    NetworkTransport,
    Producer,
    Scheduled,
    SepaClient,
    SepaClientError,
    UpdateSummary,
)
from gateway.jsap import Jsap
from tests.gateway.client.client_support import Connect, free_ports, run

EX = "http://example.org/"
PREFIX = f"PREFIX ex: <{EX}>\n"
QUERY = PREFIX + "SELECT ?o WHERE { ex:a ex:p ?o }"
NOW_MICROS = "<http://w3id.org/sepa-gateway/fn#nowMicros>"


def insert(value: int) -> str:
    return PREFIX + f"INSERT DATA {{ ex:a ex:p {value} }}"


def stamped(name: str) -> str:
    """An update that records the engine clock (Unix microseconds) when it runs."""
    return PREFIX + f"INSERT {{ ex:{name} ex:ranAt ?t }} WHERE {{ BIND({NOW_MICROS}() AS ?t) }}"


async def ran_at(client: SepaClient, name: str) -> datetime | None:
    result = await client.query(PREFIX + f"SELECT ?t WHERE {{ ex:{name} ex:ranAt ?t }}")
    return Scheduled.instant(int(result.rows[0][0].value)) if result.rows else None


def test_a_delayed_update_is_scheduled_listed_then_runs_and_notifies(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client:
            sub = await client.subscribe(QUERY, "delayed")
            assert (await sub.next(5)).sequence == 0
            before = datetime.now(UTC)
            scheduled = await client.update(insert(1), delay=300)
            assert isinstance(scheduled, Scheduled)
            assert scheduled.due.tzinfo == UTC and scheduled.update is None and scheduled.created is None
            assert before + timedelta(milliseconds=300) <= scheduled.due <= datetime.now(UTC) + timedelta(seconds=1)
            (listed,) = await client.scheduled()
            assert (listed.id, listed.due, listed.update) == (scheduled.id, scheduled.due, insert(1))
            assert listed.created is not None and listed.created <= listed.due
            assert (await client.query(QUERY)).rows == ()  # not yet
            with pytest.raises(TimeoutError):
                await sub.next(0.1)
            notification = await sub.next(5)
            assert datetime.now(UTC) >= scheduled.due  # never early
            assert notification.sequence == 1 and len(notification.added) == 1
            assert await client.scheduled() == []

    run(body())


def test_every_form_of_delay_and_at(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client:
            soon = datetime.now(timezone(timedelta(hours=1))) + timedelta(milliseconds=250)
            forms = {
                "ms": {"delay": 200},
                "timedelta": {"delay": timedelta(milliseconds=150, microseconds=7)},
                "iso": {"delay": "PT0.2S"},
                "aware": {"at": soon},
                "text": {"at": soon.isoformat()},  # with its +01:00 offset
                "past": {"at": "2020-01-01T00:00:00Z"},  # due at once
            }
            due = {}
            for name, option in forms.items():
                scheduled = await client.update(stamped(name), **option)  # type: ignore[call-overload]
                due[name] = scheduled.due
            assert due["aware"] == due["text"] == soon  # the exact instant, to the microsecond
            assert due["past"] == datetime(2020, 1, 1, tzinfo=UTC)
            for name in forms:
                for _ in range(500):
                    if await ran_at(client, name) is not None:
                        break
                    await asyncio.sleep(0.01)
                when = await ran_at(client, name)
                assert when is not None and when >= due[name], name  # the engine clock when it ran
            assert await client.scheduled() == []

    run(body())


def test_list_and_cancel(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client:
            late = await client.update(insert(2), delay=timedelta(seconds=60))
            early = await client.update(insert(1), at=datetime.now(UTC) + timedelta(seconds=30))
            assert [entry.id for entry in await client.scheduled()] == [early.id, late.id]  # due order
            cancelled = await client.cancel_scheduled(early.id)
            assert (cancelled.id, cancelled.due) == (early.id, early.due)
            assert [entry.id for entry in await client.scheduled()] == [late.id]
            with pytest.raises(SepaClientError) as again:
                await client.cancel_scheduled(early.id)
            assert (again.value.error, again.value.status_code) == ("not_found", 404)
            with pytest.raises(SepaClientError) as unknown:
                await client.cancel_scheduled("no such id/?#")
            assert (unknown.value.error, unknown.value.status_code) == ("not_found", 404)
            assert (await client.cancel_scheduled(late)).id == late.id  # the Scheduled itself
            assert await client.scheduled() == []
            ran = await client.update(insert(3), delay=0)
            for _ in range(500):
                if not await client.scheduled():
                    break
                await asyncio.sleep(0.01)
            with pytest.raises(SepaClientError) as gone:
                await client.cancel_scheduled(ran)  # already run
            assert gone.value.status_code == 404
            assert len((await client.query(QUERY)).rows) == 1  # only the one that ran

    run(body())


BAD = [
    ({"delay": -1}, "negative"),
    ({"delay": timedelta(milliseconds=-1)}, "negative"),
    ({"delay": 1.5}, "not float"),
    ({"delay": True}, "not bool"),
    ({"delay": "soon"}, "ISO 8601 duration"),
    ({"delay": "P1Y"}, "years and months"),
    ({"delay": timedelta(days=4000)}, "ten years"),
    ({"at": datetime(2030, 1, 1)}, "timezone-aware"),
    ({"at": "tomorrow"}, "RFC 3339"),
    ({"at": "2030-01-01"}, "RFC 3339"),
    ({"at": 1_900_000_000}, "not int"),
    ({"at": datetime.now(UTC) + timedelta(days=4000)}, "ten years"),
    ({"delay": 10, "at": "2030-01-01T00:00:00Z"}, "either delay or at"),
]


@pytest.mark.parametrize(("option", "message"), BAD, ids=[message for _, message in BAD])
def test_bad_delays_are_refused_before_anything_is_sent(option: dict[str, object], message: str) -> None:
    async def body() -> None:
        # nothing listens on port 1: a request that went out would fail with connection_failed
        url = "http://127.0.0.1:1"
        async with SepaClient(
            NetworkTransport(f"{url}/query", f"{url}/update", "ws://127.0.0.1:1/subscribe")
        ) as client:
            with pytest.raises(SepaClientError) as refused:
                await client.update(insert(1), **option)  # type: ignore[call-overload]
            assert (refused.value.error, refused.value.status_code) == ("invalid_request", 400)
            assert message in refused.value.error_description

    run(body())


def test_bad_sparql_is_refused_when_scheduled(connect: Connect) -> None:
    async def body() -> None:
        async with connect() as client:
            with pytest.raises(SepaClientError) as refused:
                await client.update("INSERT DATA { <http://a> <http://b> }", delay=100)
            assert (refused.value.error, refused.value.status_code) == ("invalid_request", 400)
            assert await client.scheduled() == []

    run(body())


def delayed_jsap(delay: object) -> Jsap:
    return Jsap.from_dict(
        {
            "namespaces": {"ex": EX},
            "updates": {
                "SET": {
                    "sparql": "DELETE { ex:a ex:p ?old } INSERT { ex:a ex:p ?value } "
                    "WHERE { OPTIONAL { ex:a ex:p ?old } }",
                    "forcedBindings": {"value": {"type": "literal", "datatype": "xsd:integer"}},
                    "delay": delay,
                }
            },
            "queries": {"VALUE": {"sparql": "SELECT ?o WHERE { ex:a ex:p ?o }"}},
        }
    )


def test_producers_and_aggregators_follow_the_jsap_delay(connect: Connect) -> None:
    jsap = delayed_jsap("PT0.2S")

    async def body() -> None:
        async with connect() as client:
            scheduled = await Producer(client, jsap, "SET").produce(value=1)
            assert isinstance(scheduled, Scheduled)
            (listed,) = await client.scheduled()
            assert listed.id == scheduled.id and listed.update == jsap.update_text("SET", {"value": 1})
            assert listed.due - listed.created >= timedelta(milliseconds=190)  # type: ignore[operator]
            now = await Producer(client, jsap, "SET", delay=None).produce(value=2)  # the delay dropped
            assert isinstance(now, UpdateSummary) and now.added == 1
            longer = await Producer(client, jsap, "SET", delay=timedelta(seconds=30)).produce(value=3)
            assert isinstance(longer, Scheduled) and longer.due - listed.due >= timedelta(seconds=29)
            await client.cancel_scheduled(longer)

            # an aggregator's update follows its entry's delay too: each notification schedules one
            aggregator = Aggregator(
                client, jsap, "VALUE", "SET", mapper=lambda n: {"value": 10} if n.sequence == 0 else None
            )
            await aggregator.start()
            for _ in range(500):
                if aggregator.produced:
                    break
                await asyncio.sleep(0.01)
            assert aggregator.produced == 1 and aggregator.failures == 0
            assert len(await client.scheduled()) == 2  # the producer's first, the aggregator's
            results: list[object] = []
            for _ in range(500):
                results = [row[0].value for row in (await client.query(jsap.query_text("VALUE"))).rows]
                if results == ["10"]:
                    break
                await asyncio.sleep(0.01)
            assert results == ["10"]  # 1 ran over 2, then 10 over 1
            assert await client.scheduled() == []
            await aggregator.stop()
            with pytest.raises(SepaClientError) as refused:
                Producer(client, jsap, "SET", delay=-5)  # refused when built, before anything is sent
            assert refused.value.status_code == 400

    run(body())


def test_network_scheduled_url_and_a_broker_without_delayed_updates() -> None:
    async def body() -> None:
        transport = NetworkTransport("http://h:8000/query", "http://h:8000/update", "ws://h:9000/subscribe")
        assert transport.scheduled_url == "http://h:8000/scheduled"
        nested = NetworkTransport("https://h/sepa/q", "https://h/sepa/update", "wss://h/s", scheduled_url="https://x/s")
        assert nested.scheduled_url == "https://x/s"
        assert NetworkTransport("q", "https://h/sepa/update", "s").scheduled_url == "https://h/sepa/scheduled"

        # a SPARQL 1.1 endpoint that ignores `delay` runs the update at once: that is an error
        async def update(request: web.Request) -> web.Response:
            return web.json_response({"added": 1, "removed": 0})

        app = web.Application()
        app.router.add_post("/update", update)
        runner = web.AppRunner(app)
        await runner.setup()
        (port,) = free_ports(1)
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            url = f"http://127.0.0.1:{port}"
            async with SepaClient(NetworkTransport(f"{url}/query", f"{url}/update", f"ws://127.0.0.1:{port}/s")) as c:
                with pytest.raises(SepaClientError) as ran:
                    await c.update(insert(1), delay=100)
                assert (ran.value.error, ran.value.status_code) == ("invalid_response", 502)
                assert "does not support delayed updates" in ran.value.error_description
                with pytest.raises(SepaClientError) as missing:
                    await c.scheduled()
                assert missing.value.status_code == 404
        finally:
            await runner.cleanup()

    run(body())


def test_scheduled_lists_every_pending_update_past_the_brokers_page(connect: Connect) -> None:
    """The broker sends 1,000 pending updates a reply at most (`next` when more follow): the
    network transport reads every page, so `scheduled()` still lists them all."""

    async def body() -> None:
        async with connect() as client:
            for n in range(1002):
                await client.update(insert(n), delay=600_000 + n)
            pending = await client.scheduled()
            assert len(pending) == 1002 and len({entry.id for entry in pending}) == 1002
            assert pending[-1].update == insert(1001)

    run(body())
