"""The WebSocket gate speaks the SPARQL 1.1 SE subscribe language of PROTOCOL.md, over real sockets.

What it protects (PROTOCOL.md "WebSocket: subscribe language" and "Notification semantics"):

- the subscribe reply is notification 0 in exactly the documented shape: a `sepa://subscription/`
  spuid, the alias, the complete current results as `addedResults` and an empty `removedResults`
  with the same `vars`;
- later notifications carry only what was added / removed, `sequence` + 1 each, alias repeated, and
  nothing at all is sent for an update that leaves the result unchanged;
- `"alias": null` and a missing alias, `default-graph-uri` / `named-graph-uri`, ASK subscriptions,
  many subscriptions on one socket (each with its own spuid and sequence, even for equal queries);
- unsubscribe answers `{"unsubscribed": {"spuid", "alias"}}` and stops the notifications; a socket
  cannot end another socket's subscription; closing a socket ends all of its subscriptions;
- unknown members are ignored; when subscribes race updates, every subscription still starts at
  sequence 0, has no gap, and the rows rebuilt from its notifications equal the query endpoint's;
- the gate is also served on the HTTP port;
- every bad message gets the JSON error (`error`, `error_description`, `status_code`, `alias` of the
  request when it has one) and neither closes the socket nor disturbs its other subscriptions.

"Nothing was sent" is checked without sleeping: after the update that must stay silent, a second
update that must notify is made, and the next message must be exactly that second notification
(messages on one socket are delivered in order).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.broker.gates.subscribe_support import (
    RawWebSocket,
    RunningGateway,
    post_update,
    receive_json,
    subscribe,
    wait_for_metric,
)

EX = "http://example.org/ws-gate/"
XSD_INTEGER = "http://www.w3.org/2001/XMLSchema#integer"
SPUID = re.compile(r"^sepa://subscription/[0-9A-Za-z._~:-]+$")
ERROR_KEYS = {"error", "error_description", "status_code"}


def iri(value: str) -> dict[str, str]:
    return {"type": "uri", "value": value}


def integer(value: int) -> dict[str, str]:
    return {"type": "literal", "value": str(value), "datatype": XSD_INTEGER}


def literal(value: str) -> dict[str, str]:
    return {"type": "literal", "value": value}


def canonical(bindings: list[dict[str, Any]]) -> list[str]:
    """Bindings as a sorted list of JSON strings: the order of rows carries no meaning."""
    return sorted(json.dumps(row, sort_keys=True) for row in bindings)


def results(variables: list[str], bindings: list[dict[str, Any]]) -> dict[str, Any]:
    return {"head": {"vars": variables}, "results": {"bindings": bindings}}


def normalized(notification: dict[str, Any]) -> dict[str, Any]:
    """A notification with its bindings in canonical order, for exact comparison."""
    copy = json.loads(json.dumps(notification))
    for member in ("addedResults", "removedResults"):
        part = copy.get(member, {})
        if "results" in part:
            part["results"]["bindings"] = canonical(part["results"]["bindings"])
    return copy


def expect(notification: dict[str, Any], **expected: Any) -> None:
    """`notification` (the inner object) equals `expected`, rows compared as multisets."""
    assert normalized(notification) == normalized(expected)


def run(scenario: Callable[[aiohttp.ClientSession], Any]) -> Any:
    async def main() -> Any:
        async with aiohttp.ClientSession() as session:
            return await scenario(session)

    return asyncio.run(main())


def test_subscribe_reply_is_notification_zero_in_the_documented_shape(gateway: RunningGateway) -> None:
    base = f"{EX}shape/"

    async def scenario(session: aiohttp.ClientSession) -> None:
        await post_update(
            session,
            gateway,
            f'INSERT DATA {{ <{base}s1> <{base}p> "a" . <{base}s2> <{base}p> 2 . <{base}s1> <{base}q> "other" }}',
        )
        async with session.ws_connect(gateway.subscribe_url) as ws:
            await ws.send_json({"subscribe": {"sparql": f"SELECT ?s ?o WHERE {{ ?s <{base}p> ?o }}", "alias": "all"}})
            reply = await receive_json(ws)
            assert set(reply) == {"notification"}
            notification = reply["notification"]
            assert set(notification) == {"spuid", "alias", "sequence", "addedResults", "removedResults"}
            assert SPUID.match(notification["spuid"]), notification["spuid"]
            expect(
                notification,
                spuid=notification["spuid"],
                alias="all",
                sequence=0,
                addedResults=results(
                    ["s", "o"],
                    [{"s": iri(f"{base}s1"), "o": literal("a")}, {"s": iri(f"{base}s2"), "o": integer(2)}],
                ),
                removedResults=results(["s", "o"], []),
            )

    run(scenario)


def test_later_notifications_carry_only_the_difference_in_sequence(gateway: RunningGateway) -> None:
    base = f"{EX}delta/"
    s1, s2, s3, p = (f"<{base}{name}>" for name in ("s1", "s2", "s3", "p"))
    query = f"SELECT ?s ?o WHERE {{ ?s {p} ?o }}"

    async def scenario(session: aiohttp.ClientSession) -> None:
        await post_update(session, gateway, f'INSERT DATA {{ {s1} {p} "a" . {s2} {p} 2 }}')
        async with session.ws_connect(gateway.subscribe_url) as ws:
            first = await subscribe(ws, {"sparql": query, "alias": "delta"})
            spuid = first["spuid"]
            view = Counter(canonical(first["addedResults"]["results"]["bindings"]))
            steps = [
                (f'INSERT DATA {{ {s3} {p} "c" }}', [{"s": iri(f"{base}s3"), "o": literal("c")}], []),
                (f'DELETE DATA {{ {s1} {p} "a" }}', [], [{"s": iri(f"{base}s1"), "o": literal("a")}]),
                (
                    f"DELETE {{ {s2} {p} ?o }} INSERT {{ {s2} {p} 3 }} WHERE {{ {s2} {p} ?o }}",
                    [{"s": iri(f"{base}s2"), "o": integer(3)}],
                    [{"s": iri(f"{base}s2"), "o": integer(2)}],
                ),
            ]
            for sequence, (update, added, removed) in enumerate(steps, start=1):
                await post_update(session, gateway, update)
                message = await receive_json(ws)
                expect(
                    message["notification"],
                    spuid=spuid,
                    alias="delta",
                    sequence=sequence,
                    addedResults=results(["s", "o"], added),
                    removedResults=results(["s", "o"], removed),
                )
                view -= Counter(canonical(removed))
                view += Counter(canonical(added))
            # A client applying the notifications in order holds what the query endpoint answers now.
            async with session.post(gateway.query_url, data={"query": query}) as response:
                now = (await response.json())["results"]["bindings"]
            assert sorted(view.elements()) == canonical(now)

    run(scenario)


def test_nothing_is_sent_when_an_update_leaves_the_result_unchanged(gateway: RunningGateway) -> None:
    base = f"{EX}quiet/"
    s, p, q, other = (f"<{base}{name}>" for name in ("s", "p", "q", "other"))

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url) as ws:
            query = f"SELECT DISTINCT ?o WHERE {{ ?x {p} ?o FILTER(?o != 0) }}"
            first = await subscribe(ws, {"sparql": query, "alias": "quiet"})
            await post_update(session, gateway, f"INSERT DATA {{ {s} {p} 1 }}")
            assert (await receive_json(ws))["notification"]["sequence"] == 1
            for silent in (
                f"INSERT DATA {{ {s} {p} 1 }}",  # already there: the store does not change
                f"INSERT DATA {{ {s} {q} 1 }}",  # the store changes, not the pattern
                f"INSERT DATA {{ {other} {p} 1 }}",  # a matching quad, but DISTINCT keeps the rows
                f"INSERT DATA {{ {other} {p} 0 }}",  # a matching quad, filtered out
                f"DELETE DATA {{ {other} {p} 1 }}",  # a matching quad goes, 1 is still there
                f"DELETE DATA {{ {s} {p} 99 }}",  # nothing to delete
                f"DELETE {{ {s} {p} ?o }} INSERT {{ {s} {p} ?o }} WHERE {{ {s} {p} ?o }}",  # the same rows back
            ):
                await post_update(session, gateway, silent)
            await post_update(session, gateway, f"INSERT DATA {{ {s} {p} 2 }}")
            expect(
                (await receive_json(ws))["notification"],
                spuid=first["spuid"],
                alias="quiet",
                sequence=2,
                addedResults=results(["o"], [{"o": integer(2)}]),
                removedResults=results(["o"], []),
            )

    run(scenario)


@pytest.mark.parametrize("alias_member", [{"alias": None}, {}], ids=["alias-null", "alias-absent"])
def test_subscription_without_alias(gateway: RunningGateway, alias_member: dict[str, Any]) -> None:
    base = f"{EX}no-alias/{len(alias_member)}/"

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url) as ws:
            first = await subscribe(ws, {"sparql": f"SELECT ?o WHERE {{ <{base}s> <{base}p> ?o }}", **alias_member})
            assert first.get("alias") is None
            assert SPUID.match(first["spuid"])
            await post_update(session, gateway, f"INSERT DATA {{ <{base}s> <{base}p> 1 }}")
            later = (await receive_json(ws))["notification"]
            assert later["sequence"] == 1 and later["spuid"] == first["spuid"]
            assert later.get("alias") is None
            await ws.send_json({"unsubscribe": {"spuid": first["spuid"]}})
            assert await receive_json(ws) == {"unsubscribed": {"spuid": first["spuid"], "alias": None}}

    run(scenario)


def test_null_graph_lists_are_no_lists(gateway: RunningGateway) -> None:
    """`"default-graph-uri": null` (JSAP-driven clients send the members they have, null or not) is
    no dataset, as a null alias is no alias: it was a 400."""
    base = f"{EX}null-graphs/"

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url) as ws:
            sparql = f"SELECT ?o WHERE {{ <{base}s> <{base}p> ?o }}"
            first = await subscribe(
                ws, {"sparql": sparql, "alias": "n", "default-graph-uri": None, "named-graph-uri": None}
            )
            assert first["alias"] == "n" and SPUID.match(first["spuid"])
            await post_update(session, gateway, f"INSERT DATA {{ <{base}s> <{base}p> 1 }}")
            assert (await receive_json(ws))["notification"]["sequence"] == 1

    run(scenario)


def test_default_and_named_graph_uri_select_the_dataset(gateway: RunningGateway) -> None:
    base = f"{EX}graphs/"
    s, p, g1, g2 = (f"<{base}{name}>" for name in ("s", "p", "g1", "g2"))

    async def scenario(session: aiohttp.ClientSession) -> None:
        await post_update(
            session, gateway, f'INSERT DATA {{ GRAPH {g1} {{ {s} {p} "one" }} GRAPH {g2} {{ {s} {p} "two" }} }}'
        )
        async with session.ws_connect(gateway.subscribe_url) as ws:
            default = await subscribe(
                ws,
                {"sparql": f"SELECT ?o WHERE {{ {s} {p} ?o }}", "alias": "dg", "default-graph-uri": [f"{base}g1"]},
            )
            expect(
                default,
                spuid=default["spuid"],
                alias="dg",
                sequence=0,
                addedResults=results(["o"], [{"o": literal("one")}]),
                removedResults=results(["o"], []),
            )
            named = await subscribe(
                ws,
                {
                    "sparql": f"SELECT ?g ?o WHERE {{ GRAPH ?g {{ {s} {p} ?o }} }}",
                    "alias": "ng",
                    "named-graph-uri": [f"{base}g2"],
                },
            )
            expect(
                named,
                spuid=named["spuid"],
                alias="ng",
                sequence=0,
                addedResults=results(["g", "o"], [{"g": iri(f"{base}g2"), "o": literal("two")}]),
                removedResults=results(["g", "o"], []),
            )
            # A change in g2 reaches only the named-graph subscription, one in g1 only the default one.
            await post_update(session, gateway, f'INSERT DATA {{ GRAPH {g2} {{ {s} {p} "two more" }} }}')
            expect(
                (await receive_json(ws))["notification"],
                spuid=named["spuid"],
                alias="ng",
                sequence=1,
                addedResults=results(["g", "o"], [{"g": iri(f"{base}g2"), "o": literal("two more")}]),
                removedResults=results(["g", "o"], []),
            )
            await post_update(session, gateway, f'INSERT DATA {{ GRAPH {g1} {{ {s} {p} "one more" }} }}')
            expect(
                (await receive_json(ws))["notification"],
                spuid=default["spuid"],
                alias="dg",
                sequence=1,
                addedResults=results(["o"], [{"o": literal("one more")}]),
                removedResults=results(["o"], []),
            )

    run(scenario)


def test_many_subscriptions_on_one_socket_each_with_its_own_spuid_and_sequence(gateway: RunningGateway) -> None:
    base = f"{EX}many/"
    s1, s2, p = (f"<{base}{name}>" for name in ("s1", "s2", "p"))
    every = f"SELECT ?s ?o WHERE {{ ?s {p} ?o }}"
    only_s1 = f"SELECT ?o WHERE {{ {s1} {p} ?o }}"

    async def receive_batch(ws: aiohttp.ClientWebSocketResponse, count: int) -> dict[str, dict[str, Any]]:
        batch = [(await receive_json(ws))["notification"] for _ in range(count)]
        by_spuid = {notification["spuid"]: notification for notification in batch}
        assert len(by_spuid) == count, batch
        return by_spuid

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url) as ws:
            subscriptions = {
                alias: await subscribe(ws, {"sparql": sparql, "alias": alias})
                for alias, sparql in (("every", every), ("s1", only_s1), ("s1-again", only_s1))
            }
            spuids = {alias: first["spuid"] for alias, first in subscriptions.items()}
            assert len(set(spuids.values())) == 3  # equal queries still get their own subscription
            assert all(first["alias"] == alias for alias, first in subscriptions.items())

            await post_update(session, gateway, f"INSERT DATA {{ {s1} {p} 1 }}")
            batch = await receive_batch(ws, 3)
            for alias, spuid in spuids.items():
                assert batch[spuid]["sequence"] == 1 and batch[spuid]["alias"] == alias

            await post_update(session, gateway, f"INSERT DATA {{ {s2} {p} 2 }}")  # only "every" sees it
            batch = await receive_batch(ws, 1)
            assert batch[spuids["every"]]["sequence"] == 2

            await post_update(session, gateway, f"INSERT DATA {{ {s1} {p} 3 }}")
            batch = await receive_batch(ws, 3)
            assert {alias: batch[spuid]["sequence"] for alias, spuid in spuids.items()} == {
                "every": 3,
                "s1": 2,
                "s1-again": 2,
            }
            for alias in ("s1", "s1-again"):
                assert batch[spuids[alias]]["addedResults"]["results"]["bindings"] == [{"o": integer(3)}]

    run(scenario)


def test_messages_of_one_socket_are_handled_side_by_side_and_subscribes_keep_their_order(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """A slow subscribe does not hold the socket's next messages (a bad one is answered first), and
    a burst of subscribes is confirmed in the order sent, each starting at sequence 0.

    A gateway of its own: on the module's, the slow query's cost (cubic in the store) grew with
    what earlier tests left, and on a loaded machine it outlasted the receive timeout."""
    gateway = start_gateway()
    base = f"{EX}side-by-side/"
    triples = " ".join(f"<{base}s{i}> <{base}p{i % 7}> {i} ." for i in range(100))
    # 1 million solutions counted: long enough (probe and evaluation) to be overtaken
    slow = "SELECT (COUNT(*) AS ?n) WHERE { ?a ?b ?c . ?d ?e ?f . ?g ?h ?i }"

    async def scenario(session: aiohttp.ClientSession) -> None:
        await post_update(session, gateway, f"INSERT DATA {{ {triples} }}")
        async with session.ws_connect(gateway.subscribe_url) as ws:
            await ws.send_json({"subscribe": {"sparql": slow, "alias": "slow"}})
            await ws.send_json({"subscribe": {"sparql": "SELECT nonsense", "alias": "bad"}})
            for i in range(5):
                await ws.send_json(
                    {"subscribe": {"sparql": f"SELECT ?o WHERE {{ <{base}s{i}> ?p ?o }}", "alias": f"a{i}"}}
                )
            first = await receive_json(ws)
            assert first.get("alias") == "bad" and first["status_code"] == 400, first
            order = [(await receive_json(ws, timeout=60))["notification"] for _ in range(6)]
            assert [n["alias"] for n in order] == ["slow", "a0", "a1", "a2", "a3", "a4"]
            assert all(n["sequence"] == 0 for n in order)
            assert order[1]["addedResults"]["results"]["bindings"] == [{"o": integer(0)}]

    run(scenario)


def test_ask_subscription_notifies_when_the_boolean_changes(gateway: RunningGateway) -> None:
    base = f"{EX}ask/"
    s, p = f"<{base}s>", f"<{base}p>"

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url) as ws:
            first = await subscribe(ws, {"sparql": f"ASK {{ {s} {p} ?o }}", "alias": "ask"})
            assert first["alias"] == "ask" and SPUID.match(first["spuid"])
            assert first["addedResults"] == {"head": {}, "boolean": False}
            # the same shape as later notifications' (PROTOCOL.md): removed is the empty result, false
            assert first["removedResults"] == {"head": {}, "boolean": False}

            await post_update(session, gateway, f"INSERT DATA {{ {s} {p} 1 }}")
            became_true = (await receive_json(ws))["notification"]
            assert (became_true["sequence"], became_true["addedResults"].get("boolean")) == (1, True)
            assert became_true["removedResults"] == {"head": {}, "boolean": False}
            assert became_true["alias"] == "ask" and became_true["spuid"] == first["spuid"]

            await post_update(session, gateway, f"INSERT DATA {{ {s} {p} 2 }}")  # still true: silent
            await post_update(session, gateway, f"DELETE DATA {{ {s} {p} 1 }}")  # still true: silent
            await post_update(session, gateway, f"DELETE DATA {{ {s} {p} 2 }}")
            became_false = (await receive_json(ws))["notification"]
            assert (became_false["sequence"], became_false["addedResults"].get("boolean")) == (2, False)

    run(scenario)


def test_unsubscribe_answers_and_stops_notifications(gateway: RunningGateway) -> None:
    base = f"{EX}unsubscribe/"
    s, p = f"<{base}s>", f"<{base}p>"
    query = f"SELECT ?o WHERE {{ {s} {p} ?o }}"

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url) as ws:
            leaving = await subscribe(ws, {"sparql": query, "alias": "leaving"})
            staying = await subscribe(ws, {"sparql": query, "alias": "staying"})  # same query: same updates
            await ws.send_json({"unsubscribe": {"spuid": leaving["spuid"]}})
            assert await receive_json(ws) == {"unsubscribed": {"spuid": leaving["spuid"], "alias": "leaving"}}
            for sequence, value in ((1, 1), (2, 2)):
                await post_update(session, gateway, f"INSERT DATA {{ {s} {p} {value} }}")
                notification = (await receive_json(ws))["notification"]
                assert (notification["spuid"], notification["sequence"]) == (staying["spuid"], sequence)
            # Ending it again is an error, with the request's alias (sepa-js matches errors by it),
            # and the socket still works.
            await ws.send_json({"unsubscribe": {"spuid": leaving["spuid"], "alias": "leaving"}})
            error = await receive_json(ws)
            assert set(error) >= ERROR_KEYS and error["status_code"] == 404 and error["alias"] == "leaving"
            await ws.send_json({"unsubscribe": {"spuid": 7, "alias": "typo"}})
            error = await receive_json(ws)
            assert (error["status_code"], error["alias"]) == (400, "typo")
            await post_update(session, gateway, f"INSERT DATA {{ {s} {p} 3 }}")
            notification = (await receive_json(ws))["notification"]
            assert (notification["spuid"], notification["sequence"]) == (staying["spuid"], 3)

    run(scenario)


def test_a_socket_cannot_unsubscribe_another_sockets_subscription(gateway: RunningGateway) -> None:
    base = f"{EX}foreign/"
    s, p = f"<{base}s>", f"<{base}p>"

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with (
            session.ws_connect(gateway.subscribe_url) as owner,
            session.ws_connect(gateway.subscribe_url) as intruder,
        ):
            owned = await subscribe(owner, {"sparql": f"SELECT ?o WHERE {{ {s} {p} ?o }}", "alias": "owned"})
            await intruder.send_json({"unsubscribe": {"spuid": owned["spuid"]}})
            error = await receive_json(intruder)
            assert ERROR_KEYS <= set(error) <= ERROR_KEYS | {"alias"}
            assert error["status_code"] in (403, 404) and isinstance(error["error"], str) and error["error"]
            await post_update(session, gateway, f"INSERT DATA {{ {s} {p} 1 }}")
            notification = (await receive_json(owner))["notification"]
            assert (notification["spuid"], notification["sequence"]) == (owned["spuid"], 1)
            # The refused socket is still usable.
            await subscribe(intruder, {"sparql": f"ASK {{ {s} {p} ?o }}", "alias": "own"})

    run(scenario)


def test_closing_the_socket_ends_its_subscriptions(gateway: RunningGateway) -> None:
    base = f"{EX}close/"

    async def scenario(session: aiohttp.ClientSession) -> None:
        # Sockets of earlier tests are closed; wait until the gateway has ended their subscriptions.
        await wait_for_metric(session, gateway, "sepa_ws_connections", lambda value: value == 0)
        await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 0)
        async with session.ws_connect(gateway.subscribe_url) as ws:
            for index in range(3):
                await subscribe(ws, {"sparql": f"SELECT ?o WHERE {{ <{base}s{index}> <{base}p> ?o }}"})
            await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 3)
            await wait_for_metric(session, gateway, "sepa_ws_connections", lambda value: value == 1)
        await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 0)
        await wait_for_metric(session, gateway, "sepa_ws_connections", lambda value: value == 0)

    run(scenario)


def test_the_gate_is_also_served_on_the_http_port(gateway: RunningGateway) -> None:
    base = f"{EX}http-port/"

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url_on_http_port) as ws:
            first = await subscribe(ws, {"sparql": f"SELECT ?o WHERE {{ <{base}s> <{base}p> ?o }}", "alias": "h"})
            await post_update(session, gateway, f"INSERT DATA {{ <{base}s> <{base}p> 1 }}")
            later = (await receive_json(ws))["notification"]
            assert (later["spuid"], later["sequence"], later["alias"]) == (first["spuid"], 1, "h")
            await ws.send_json({"unsubscribe": {"spuid": first["spuid"]}})
            assert await receive_json(ws) == {"unsubscribed": {"spuid": first["spuid"], "alias": "h"}}

    run(scenario)


def test_unknown_members_are_ignored(gateway: RunningGateway) -> None:
    base = f"{EX}unknown-members/"

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url) as ws:
            body = {"sparql": f"ASK {{ <{base}s> ?p ?o }}", "alias": "u", "x-client": {"version": 3}, "sepa": None}
            await ws.send_json({"subscribe": body, "x-trace": "abc"})
            first = (await receive_json(ws))["notification"]
            assert (first["sequence"], first["alias"]) == (0, "u")
            await ws.send_json({"unsubscribe": {"spuid": first["spuid"], "x-reason": "done"}})
            assert await receive_json(ws) == {"unsubscribed": {"spuid": first["spuid"], "alias": "u"}}

    run(scenario)


def test_sequence_zero_comes_first_when_updates_race_the_subscribes(gateway: RunningGateway) -> None:
    """Subscribes and updates interleave freely; every subscription still starts at 0, has no gap,
    and the rows rebuilt from its notifications are what the query endpoint answers at the end."""
    base = f"{EX}race/"
    s, p = f"<{base}s>", f"<{base}p>"
    query = f"SELECT ?o WHERE {{ {s} {p} ?o }}"
    count = 12

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url) as ws:

            async def subscribes() -> None:
                for index in range(count):
                    await ws.send_json({"subscribe": {"sparql": query, "alias": f"race-{index}"}})
                    await asyncio.sleep(0)

            async def updates() -> None:
                for index in range(count):
                    await post_update(
                        session,
                        gateway,
                        f"DELETE {{ {s} {p} ?o }} INSERT {{ {s} {p} {index} }} WHERE {{ OPTIONAL {{ {s} {p} ?o }} }}",
                    )

            await asyncio.gather(subscribes(), updates())
            await post_update(session, gateway, f'INSERT DATA {{ {s} {p} "last" }}')
            views: dict[str, Counter[str]] = {}
            sequences: dict[str, list[int]] = {}
            last = json.dumps(literal("last"), sort_keys=True)
            while len(views) < count or any(not any(last in row for row in view.elements()) for view in views.values()):
                notification = (await receive_json(ws))["notification"]
                spuid = notification["spuid"]
                sequences.setdefault(spuid, []).append(notification["sequence"])
                view = views.setdefault(spuid, Counter())
                view -= Counter(canonical(notification["removedResults"]["results"]["bindings"]))
                view += Counter(canonical(notification["addedResults"]["results"]["bindings"]))
            async with session.post(gateway.query_url, data={"query": query}) as response:
                now = canonical((await response.json())["results"]["bindings"])
            for spuid, seen in sequences.items():
                assert seen == list(range(len(seen))), (spuid, seen)
                assert sorted(views[spuid].elements()) == now

    run(scenario)


# -- bad messages ---------------------------------------------------------------------------------

GOOD = f"SELECT ?o WHERE {{ <{EX}bad/s> <{EX}bad/p> ?o }}"
NO_ALIAS = object()  # the error may carry "alias": null or no alias member
ANY_ALIAS = object()  # the request's alias was itself invalid: null, absent or echoed are all fine

BAD_MESSAGES: list[tuple[str, Any, int, object, str]] = [
    # (id, what is sent, status, alias expected in the error, regex on the description)
    (
        "syntax-error",
        {"subscribe": {"sparql": "SELECT ?s\nWHERE { ?s ?p ?o }\nLIMIT x", "alias": "syntax"}},
        400,
        "syntax",
        r"line 3, column 7",
    ),
    (
        "construct",
        {"subscribe": {"sparql": "CONSTRUCT WHERE { ?s ?p ?o }", "alias": "construct"}},
        400,
        "construct",
        "",
    ),
    ("describe", {"subscribe": {"sparql": f"DESCRIBE <{EX}x>", "alias": "describe"}}, 400, "describe", ""),
    ("missing-sparql", {"subscribe": {"alias": "no-sparql"}}, 400, "no-sparql", "sparql"),
    ("sparql-not-string", {"subscribe": {"sparql": [GOOD], "alias": "list"}}, 400, "list", "sparql"),
    ("alias-number", {"subscribe": {"sparql": GOOD, "alias": 7}}, 400, ANY_ALIAS, "alias"),
    (
        "default-graph-not-array",
        {"subscribe": {"sparql": GOOD, "alias": "dg", "default-graph-uri": 42}},
        400,
        "dg",
        "default-graph-uri",
    ),
    (
        "named-graph-not-iris",
        {"subscribe": {"sparql": GOOD, "alias": "ng", "named-graph-uri": [1, 2]}},
        400,
        "ng",
        "named-graph-uri",
    ),
    ("bad-json", '{"subscribe": {"sparql": ', 400, NO_ALIAS, ""),
    ("unknown-message", {"publish": {"sparql": GOOD}}, 400, NO_ALIAS, ""),
    ("subscribe-not-object", {"subscribe": GOOD}, 400, NO_ALIAS, ""),
    ("not-an-object", [{"subscribe": {"sparql": GOOD}}], 400, NO_ALIAS, ""),
    ("unsubscribe-without-spuid", {"unsubscribe": {}}, 400, NO_ALIAS, "spuid"),
    (  # the subscribe alone was run, the unsubscribe dropped without a frame
        "subscribe-and-unsubscribe",
        {"subscribe": {"sparql": GOOD, "alias": "both"}, "unsubscribe": {"spuid": "sepa://spuid/x"}},
        400,
        NO_ALIAS,
        "not both",
    ),
    ("binary-frame", json.dumps({"subscribe": {"sparql": GOOD}}).encode(), 400, NO_ALIAS, ""),
    (  # an unpaired surrogate: was a 500 internal_error without the alias
        "lone-surrogate",
        '{"subscribe": {"sparql": "SELECT * WHERE { ?s ?p \\"\\ud800\\" }", "alias": "surrogate"}}',
        400,
        "surrogate",
        "surrogate",
    ),
    ("lone-surrogate-in-token", '{"subscribe": {"sparql": "ASK {}", "authorization": "\\udfff"}}', 400, NO_ALIAS, ""),
    # an alias or a dataset is kept as long as the subscription: 1,500 subscriptions of ASK {} with
    # a 1 MB alias held 1.5 GB; 15,000 named graphs a subscribe held ~3.5 MB each
    ("alias-too-long", {"subscribe": {"sparql": GOOD, "alias": "a" * 1025}}, 400, NO_ALIAS, "1024 characters"),
    (
        "too-many-graphs",
        {"subscribe": {"sparql": GOOD, "alias": "many", "named-graph-uri": [f"{EX}g{n}" for n in range(101)]}},
        400,
        "many",
        "at most 100 graphs",
    ),
]


async def send_raw(ws: aiohttp.ClientWebSocketResponse, message: Any) -> None:
    if isinstance(message, bytes):
        await ws.send_bytes(message)
    elif isinstance(message, str):
        await ws.send_str(message)
    else:
        await ws.send_json(message)


def check_error(error: dict[str, Any], status: int, alias: object, description: str) -> None:
    assert ERROR_KEYS <= set(error) <= ERROR_KEYS | {"alias"}, error
    assert error["status_code"] == status
    assert isinstance(error["error"], str) and error["error"]
    assert isinstance(error["error_description"], str) and error["error_description"]
    assert re.search(description, error["error_description"]), error["error_description"]
    if alias is NO_ALIAS:
        assert error.get("alias") is None
    elif alias is not ANY_ALIAS:
        assert error.get("alias") == alias


async def survives(
    session: aiohttp.ClientSession, gateway: RunningGateway, ws: aiohttp.ClientWebSocketResponse, keep: dict[str, Any]
) -> None:
    """The socket is open, its subscription `keep` still notifies and a new subscribe works."""
    assert not ws.closed
    await post_update(session, gateway, f"INSERT DATA {{ <{EX}bad/s> <{EX}bad/p> <{keep['spuid']}> }}")
    notification = (await receive_json(ws))["notification"]
    assert (notification["spuid"], notification["sequence"]) == (keep["spuid"], 1)
    await subscribe(ws, {"sparql": f"ASK {{ <{EX}bad/s> ?p ?o }}", "alias": "after"})


@pytest.mark.parametrize(
    ("message", "status", "alias", "description"),
    [case[1:] for case in BAD_MESSAGES],
    ids=[case[0] for case in BAD_MESSAGES],
)
def test_a_bad_message_gets_an_error_and_the_socket_keeps_working(
    gateway: RunningGateway, message: Any, status: int, alias: object, description: str
) -> None:
    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url) as ws:
            keep = await subscribe(ws, {"sparql": GOOD + " # keep", "alias": "keep"})
            await send_raw(ws, message)
            check_error(await receive_json(ws), status, alias, description)
            await survives(session, gateway, ws, keep)

    run(scenario)


def test_a_message_over_max_message_bytes_gets_413(start_gateway: Callable[..., RunningGateway]) -> None:
    limit = 2048
    small = start_gateway(toml=f"[websocket]\nmax_message_bytes = {limit}\n")
    padded = GOOD + " #" + "x" * limit  # a valid subscribe, only too long

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(small.subscribe_url) as ws:
            keep = await subscribe(ws, {"sparql": GOOD + " # keep", "alias": "keep"})
            message = {"subscribe": {"sparql": padded, "alias": "big"}}
            assert limit < len(json.dumps(message)) < 2 * limit
            await ws.send_json(message)
            error = await receive_json(ws)
            check_error(error, 413, ANY_ALIAS, str(limit))
            assert error.get("alias") in (None, "big")
            await survives(session, small, ws, keep)
            # Just under the limit is accepted.
            await subscribe(ws, {"sparql": GOOD + " #" + "x" * (limit - 200), "alias": "fits"})

    run(scenario)


def test_nothing_but_frames_reach_the_socket_whatever_the_message(gateway: RunningGateway) -> None:
    """Deep JSON, a query 999 groups deep, EXISTS with an object list: before, some of these made the
    gateway write a raw `HTTP/1.1 500` into the upgraded socket, ending it and all its subscriptions.
    Each now gets a frame (a notification or an error) and the same socket keeps working."""
    deep_json = "[" * 100_000 + "]" * 100_000
    deep_query = "SELECT * WHERE " + "{" * 999 + "}" * 999
    exists_list = "ASK { FILTER EXISTS { ?s ?p 1 , 2 } }"

    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url, max_msg_size=0) as ws:
            await ws.send_str(deep_json)
            reply = await receive_json(ws, timeout=30)
            assert reply["error"] == "invalid_request", reply
            for alias, sparql in (("deep", deep_query), ("exists", exists_list)):
                await ws.send_json({"subscribe": {"sparql": sparql, "alias": alias}})
                reply = await receive_json(ws, timeout=60)
                assert reply.get("alias") == alias or reply.get("notification", {}).get("alias") == alias, reply
            keep = await subscribe(ws, {"sparql": "SELECT ?o WHERE { <urn:frames> <urn:p> ?o }", "alias": "alive"})
            assert keep["sequence"] == 0
            await post_update(session, gateway, "INSERT DATA { <urn:frames> <urn:p> 1 }")
            while True:  # the socket still carries notifications (after the earlier subscriptions' own)
                note = await receive_json(ws, timeout=10)
                if note.get("notification", {}).get("alias") == "alive":
                    assert note["notification"]["sequence"] == 1
                    break

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            await scenario(session)

    asyncio.run(main())
    assert gateway.running


def gateway_cpu_s(gateway: RunningGateway) -> float:
    """User and system CPU seconds the gateway process has used so far."""
    fields = Path(f"/proc/{gateway.process.pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settled_cpu_s(gateway: RunningGateway, timeout: float = 15.0) -> float:
    """The gateway's CPU seconds once it has been idle for half a second (its backlog done)."""
    deadline = time.monotonic() + timeout
    used = gateway_cpu_s(gateway)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = gateway_cpu_s(gateway)
        if now - used < 0.02:
            break
        used = now
    return used


def test_compressed_messages_cost_the_gateway_no_more_than_their_size(gateway: RunningGateway) -> None:
    """permessage-deflate is declined: 4 KB of deflate inflate to 4 MiB (the frame limit), which
    aiohttp inflated on the event loop, then the gate decoded and measured, ~20 ms of CPU each.
    Before, 178 kB/s of such frames from two sockets (no token needed on the secure port: the
    upgrade is not authenticated) raised other clients' update latency from 1.4 ms to 344 ms
    (median) and 892 ms (p95). Now the offer gets no extension, and a compressed frame is a
    protocol error that ends the connection unread."""
    bomb = zlib.compressobj(9, zlib.DEFLATED, -15)
    payload = (bomb.compress(b" " * (4 * 1024 * 1024 - 100)) + bomb.flush(zlib.Z_SYNC_FLUSH))[:-4]
    frame = bytes([0x80 | 0x40 | 0x1, 0x80 | 126]) + len(payload).to_bytes(2, "big") + b"\0\0\0\0" + payload
    client = socket.create_connection(("127.0.0.1", gateway.ws_port), timeout=10)
    try:
        client.sendall(
            b"GET /subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += client.recv(4096)
        assert b" 101 " in head.split(b"\r\n")[0], head
        assert b"permessage-deflate" not in head.lower(), head
        before = gateway_cpu_s(gateway)
        sent = 0
        with contextlib.suppress(ConnectionError):
            for sent in range(1, 101):  # noqa: B007 (how many went out before the gateway closed)
                client.sendall(frame)
        assert settled_cpu_s(gateway) - before < 0.5, f"{sent} compressed frames sent"
    finally:
        client.close()
    gateway.wait_for_metric("sepa_ws_connections", lambda value: value == 0)


@pytest.mark.parametrize("values", [8_000, 40_000])
def test_a_large_subscription_does_not_hold_the_updates(
    start_gateway: Callable[..., RunningGateway], values: int
) -> None:
    """What a re-evaluated subscription may be woken by is read with rdflib's SPARQL parser, ~35 us
    a byte: 8,000 VALUES (43 KB) take ~1.5 s, 40,000 (220 KB) ~7 s, 1 MiB (the message limit)
    about 40 s. It ran on the update thread, where every update waited for it (an update sent beside a
    subscription of 20,000 VALUES took 12 s). Now it runs where the probe runs, and a text past
    query_patterns.MAX_CHARS is not parsed at all (it may be woken by anything).
    Limits far past its cost: at load 9-13 (2026-12-07) the 40,000's probe took ~3.6 s, past the
    2 s max_reeval_seconds_per_client (429 too_costly: KeyError 'notification'), and ~7 s quiet
    is near the default 10 s time limit."""
    gateway = start_gateway(toml="[engine]\ntime_limit_s = 60\n[websocket]\nmax_reeval_seconds_per_client = 60\n")
    numbers = " ".join(str(number) for number in range(values))
    sparql = f"SELECT (COUNT(*) AS ?n) WHERE {{ ?s <{EX}big> ?o {{ VALUES ?x {{ {numbers} }} }} }}"

    async def test(session: aiohttp.ClientSession) -> None:
        ws = await session.ws_connect(gateway.ws_url + "/subscribe")
        await ws.send_json({"subscribe": {"sparql": sparql, "alias": "large"}})
        reply = asyncio.ensure_future(ws.receive_json(timeout=60))
        waited, sent = 0.0, 0
        while not reply.done():  # updates all along, until the subscription is confirmed
            before = time.monotonic()
            await post_update(session, gateway, f"INSERT DATA {{ <{EX}other> <{EX}p> {values} }}")
            waited, sent = max(waited, time.monotonic() - before), sent + 1
            await asyncio.sleep(0.05)
        confirmed = await reply
        assert confirmed.get("notification", {}).get("alias") == "large", str(confirmed)[:300]
        # the bar means something only if an update met the subscribe: confirmed before the first
        # one was sent, `waited` stays 0.0 whatever the updates would have waited
        assert sent >= 1, "the subscription was confirmed before any update was sent"
        assert waited < 1.0, f"an update waited {waited:.1f} s behind a subscribe"
        await ws.close()

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            await test(session)

    asyncio.run(main())


def _upgrade(port: int, key: bytes, protocols: bytes = b"") -> bytes:
    """The status line of a raw WebSocket upgrade to /subscribe on `port`."""
    head = (
        b"GET /subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + b"\r\n"
    )
    if protocols:
        head += b"Sec-WebSocket-Protocol: " + protocols + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head + b"\r\n")
        return sock.recv(4096).split(b"\r\n", 1)[0]


def test_a_hostile_upgrade_is_refused_or_served_without_a_line_in_the_log(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """A Sec-WebSocket-Key that is not ASCII was a 500 and an ERROR traceback (aiohttp decodes it
    unguarded); protocols that match none were a ~9.7 KB WARNING quoting them, per upgrade, no
    token needed (300 upgrades: 2.9 MB of log in 0.8 s)."""
    gateway = start_gateway()
    assert _upgrade(gateway.ws_port, "\u00e9t\u00e9".encode() * 4).startswith(b"HTTP/1.1 400")
    protocols = b", ".join(b"protocol-%05d" % number for number in range(400))
    assert _upgrade(gateway.ws_port, b"dGhlIHNhbXBsZSBub25jZQ==", protocols).startswith(b"HTTP/1.1 101")
    time.sleep(0.2)
    assert "protocol-00001" not in gateway.log() and "Traceback" not in gateway.log(), gateway.log()[-2000:]


def test_an_unmasked_client_frame_ends_the_connection(gateway: RunningGateway) -> None:
    """RFC 6455 5.1: a server MUST close the connection on a client frame that is not masked.
    aiohttp took one as any other; the frame watch (broker/gates/slow.py) now aborts the socket
    before aiohttp parses it, counted as a request it could not parse."""
    counter = 'sepa_errors_total{error="invalid_request",status="400"}'
    before = gateway.metric(counter)
    subscribe = {"subscribe": {"sparql": "SELECT * WHERE { ?s ?p ?o }", "alias": "unmasked"}}
    client = RawWebSocket(gateway.ws_port)
    try:
        client.send_frame(0x1, json.dumps(subscribe).encode(), masked=False)
        with pytest.raises(ConnectionError):
            client.receive_json()
    finally:
        client.close()
    assert gateway.metric(counter) == before + 1
    masked = RawWebSocket(gateway.ws_port)
    try:
        masked.send_json(subscribe)
        assert masked.receive_json()["notification"]["sequence"] == 0
    finally:
        masked.close()
