"""A subscription ends once on the wire: the engine's "ended" notification for a subscription the
client no longer has (it ended in the gate, was unsubscribed or revoked meanwhile) sends nothing.

These races (the engine ends a subscription while the gate or the client ends it too) cannot be
caused on demand over a socket, so the gate's handler is driven directly here, on a loop, with a
Connection whose queue is read instead of written."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from broker.core.notification import Notification
from broker.errors import TimeLimitExceeded
from broker.gates.websocket import Connection, WebSocketGate


def _frames(connection: Connection) -> list[dict]:
    return [json.loads(text) for text, _ in connection.pending]


def _ended(spuid: str) -> Notification:
    return Notification(spuid, "a", 3, ("x",), ended=TimeLimitExceeded("ran past its limit"))


def _setting(subscribed: list[str]) -> tuple[WebSocketGate, Connection]:
    gate = WebSocketGate(None, Counter())  # type: ignore[arg-type]  # no message reaches the scheduler here
    connection = Connection(None, 100, "test")  # type: ignore[arg-type]  # its queue is read, never written
    for spuid in subscribed:
        connection.subscriptions[spuid] = "a"
    return gate, connection


def test_the_engine_ending_a_subscription_twice_is_one_frame() -> None:
    async def main() -> list[dict]:
        gate, connection = _setting(["s1"])
        gate.subscription_ended(connection, _ended("s1"))
        gate.subscription_ended(connection, _ended("s1"))
        return _frames(connection)

    frames = asyncio.run(main())
    assert len(frames) == 1 and frames[0]["error"] == "timeout" and frames[0]["spuid"] == "s1", frames


def test_a_subscription_the_client_no_longer_has_ends_silently() -> None:
    """Unsubscribed (or ended by the gate) before the engine's ending reached the loop: no frame
    about a spuid the client was already told is gone; the other subscription is still ended."""

    async def main() -> tuple[list[dict], dict]:
        gate, connection = _setting(["gone", "kept"])
        gate.forget(connection, "gone")
        gate.subscription_ended(connection, _ended("gone"))
        gate.subscription_ended(connection, _ended("kept"))
        return _frames(connection), dict(connection.subscriptions)

    frames, left = asyncio.run(main())
    assert [frame["spuid"] for frame in frames] == ["kept"] and left == {}, frames
