"""Coalesced notifications (broker.gates.coalesce, the subscribe's `coalesce_ms`).

What it protects: the notifications sent, merged or not, keep PROTOCOL.md's contract (applied in
order they give what the query returns now), and there are at most one per interval, the first
after a quiet interval sent at once; a bad `coalesce_ms` is a 400 frame; a subscription that does
not ask gets every notification."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.notification import Notification
from broker.gates.coalesce import Coalescing, NetChange
from tests.broker.gates.subscribe_support import RunningGateway, post_update, receive_json, subscribe
from tests.broker.gates.test_websocket_gate import canonical, run

EX = "http://example.org/coalesce/"

# a subscription's result over time: each step a multiset of rows (rows: tuples of small ints)
results = st.lists(st.lists(st.tuples(st.integers(0, 4)), max_size=6), min_size=2, max_size=12)


def _notifications(states: list[list[tuple[int]]]) -> list[Notification]:
    """The engine's notifications between successive states that differ (PROTOCOL.md: multiset
    differences, none for an update that changed nothing)."""
    out: list[Notification] = []
    for before, after in zip(states, states[1:], strict=False):
        old, new = Counter(before), Counter(after)
        if old != new:
            added, removed = tuple((new - old).elements()), tuple((old - new).elements())
            out.append(Notification("s", None, len(out) + 1, ("x",), added, removed))
    return out


@settings(max_examples=200, deadline=None)
@given(results, st.lists(st.floats(0, 1), min_size=12, max_size=12))
def test_the_notifications_sent_applied_in_order_give_the_last_result(
    states: list[list[tuple[int]]], gaps: list[float]
) -> None:
    coalescing = Coalescing(0.25)
    now = 0.0
    held = Counter(states[0])
    sent_at: list[float] = []
    sequences: list[int] = []

    def apply(notification: Notification | None) -> None:
        nonlocal held
        if notification is None:
            return
        assert notification.added or notification.removed  # an empty net change is not sent
        assert not Counter(notification.removed) - held  # only what the client holds is removed
        held = held - Counter(notification.removed) + Counter(notification.added)
        sent_at.append(now)
        sequences.append(notification.sequence)

    for notification, gap in zip(_notifications(states), gaps, strict=False):
        now += gap
        if coalescing.timer is not None and now >= coalescing.due_at():
            now_then, now = now, coalescing.due_at()
            apply(coalescing.flush(now))
            now = now_then
        apply(coalescing.offer(notification, now))
        if coalescing.held is not None and coalescing.timer is None:
            coalescing.timer = object()  # as the gate does: one flush pending
    if coalescing.held is not None:
        now = max(now, coalescing.due_at())
        apply(coalescing.flush(now))
    assert held == Counter(states[-1])
    assert all(later - earlier >= 0.25 - 1e-9 for earlier, later in zip(sent_at, sent_at[1:], strict=False))
    assert sequences == sorted(sequences)


def test_what_is_held_is_the_net_change_not_every_row_that_came_and_went() -> None:
    change = NetChange(Notification("s", None, 1, ("x",), ((0,),), ()))
    for sequence in range(2, 1002):  # each update replaces the row with a new one
        change.add(Notification("s", None, sequence, ("x",), ((sequence - 1,),), ((sequence - 2,),)))
    assert change.counts == {(1000,): 1}
    merged = change.notification()
    assert merged is not None and (merged.added, merged.removed, merged.sequence) == (((1000,),), (), 1001)


def test_an_ask_subscription_is_told_the_value_only_when_it_changed_over_the_merged() -> None:
    flips = [Notification("a", None, n, (), boolean=n % 2 == 1, previous=n % 2 == 0) for n in range(1, 4)]
    change = NetChange(flips[0])
    change.add(flips[1])
    assert change.notification() is None  # true then false again: nothing changed for the client
    change.add(flips[2])
    merged = change.notification()
    assert merged is not None and (merged.previous, merged.boolean, merged.sequence) == (False, True, 3)


async def _drain(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> list[tuple[float, dict[str, Any]]]:
    """Every message for `seconds`, with its arrival time."""
    out = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = await ws.receive(timeout=left)
        except TimeoutError:
            break
        out.append((time.monotonic(), message.json()))
    return out


def test_a_coalescing_subscription_gets_the_net_change_at_most_once_per_interval(gateway: RunningGateway) -> None:
    base = f"{EX}net/"
    query = f"SELECT ?s ?v WHERE {{ ?s <{base}v> ?v }}"
    interval_s = 0.8

    async def scenario(session: aiohttp.ClientSession) -> None:
        await post_update(session, gateway, f"INSERT DATA {{ <{base}a> <{base}v> 0 . <{base}gone> <{base}v> 0 }}")
        async with session.ws_connect(gateway.subscribe_url) as ws, session.ws_connect(gateway.subscribe_url) as plain:
            first = await subscribe(ws, {"sparql": query, "alias": "net", "coalesce_ms": interval_s * 1000})
            await subscribe(plain, {"sparql": query, "alias": "every"})
            view = Counter(canonical(first["addedResults"]["results"]["bindings"]))
            await asyncio.sleep(interval_s + 0.1)
            # after a quiet interval, the first change goes at once
            started = time.monotonic()
            await post_update(session, gateway, f"DELETE DATA {{ <{base}gone> <{base}v> 0 }}")
            lone = await receive_json(ws, timeout=interval_s)
            assert time.monotonic() - started < interval_s / 2
            messages = [(time.monotonic(), lone)]
            burst = time.monotonic()
            for value in range(1, 21):  # 20 changes of one value, then one more node
                await post_update(
                    session, gateway, f"DELETE {{ <{base}a> <{base}v> ?v }} INSERT {{ <{base}a> <{base}v> {value} }} "
                    f"WHERE {{ <{base}a> <{base}v> ?v }}",
                )  # fmt: skip
            await post_update(session, gateway, f"INSERT DATA {{ <{base}b> <{base}v> 1 }}")
            burst = time.monotonic() - burst  # ~0.1 s; a loaded machine may take longer
            messages += await _drain(ws, interval_s * 2.5)
            every = await _drain(plain, 0.5)
            assert len(every) == 22  # without coalesce_ms: every notification
            times = [at for at, _ in messages]
            # the lone one, then one per interval the burst lasted into, at most (without: 22)
            assert 2 <= len(messages) <= 3 + int(burst / interval_s), [message for _, message in messages]
            # spaced by the interval where they were sent; arrival can shift one (a loaded machine)
            assert all(later - earlier >= interval_s * 0.5 for earlier, later in zip(times, times[1:], strict=False))
            for _, message in messages:
                notification = message["notification"]
                view -= Counter(canonical(notification["removedResults"]["results"]["bindings"]))
                view += Counter(canonical(notification["addedResults"]["results"]["bindings"]))
            # the engine re-evaluated the query once per notification sent (Engine.subscribe's
            # coalesce_s), not at each of the 22 updates: no gaps in the sequence (before: 22)
            assert [message["notification"]["sequence"] for _, message in messages] == list(range(1, len(messages) + 1))
            async with session.post(gateway.query_url, data={"query": query}) as response:
                now = (await response.json())["results"]["bindings"]
            assert sorted(view.elements()) == canonical(now)

    run(scenario)


@pytest.mark.parametrize("value", [-1, 10_001, "250", True, [250], float("nan")])
def test_a_bad_coalesce_ms_is_a_400_frame_and_the_socket_lives(gateway: RunningGateway, value: Any) -> None:
    async def scenario(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(gateway.subscribe_url) as ws:
            body = {"sparql": "ASK {}", "alias": "bad", "coalesce_ms": value}
            await ws.send_str(json.dumps({"subscribe": body}))  # NaN as JSON texts in the field write it
            reply = await receive_json(ws)
            assert reply["status_code"] == 400 and "coalesce_ms" in reply["error_description"], reply
            assert reply["alias"] == "bad"
            await subscribe(ws, {"sparql": "ASK {}", "alias": "good", "coalesce_ms": 250})

    run(scenario)
