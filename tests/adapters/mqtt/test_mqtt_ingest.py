"""The MQTT client layer against a real mosquitto: order, commit-then-ack, retries, sessions, restarts, limits.

"Nothing acknowledged early" is checked with the broker itself: a fresh connection with the same client id
receives exactly the messages the previous one had not acknowledged.
"""

from __future__ import annotations

import asyncio
import gc
import types
import uuid

import pytest

from adapters.mqtt.connection import Message, MqttConnection
from adapters.mqtt.ingest import Ingestor
from adapters.mqtt.settings import MqttSettings
from tools.mosquitto import Mosquitto, paho_publish, until

PROTOCOLS = ["3.1.1", "5"]


def settings(broker: Mosquitto, **overrides) -> MqttSettings:
    values = {
        "host": "127.0.0.1",
        "port": broker.port,
        "client_id": f"gw-{uuid.uuid4().hex[:10]}",
        "reconnect_min_s": 0.05,
        "reconnect_max_s": 0.5,
        "batch_wait_ms": 5,
    }
    return MqttSettings(**{**values, **overrides})


class Store:
    """A commit that records what it was given; `failures` first attempts raise."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.attempts = 0
        self.batches: list[list[Message]] = []
        self.connection: MqttConnection | None = None
        self.acked_early: list[Message] = []

    async def commit(self, batch: list[Message]) -> None:
        self.attempts += 1
        # Every message of a batch being committed is still unacknowledged at the broker.
        if self.connection is not None and self.connection.metrics()["unacked"] < len(batch):
            self.acked_early.extend(batch)
        if self.attempts <= self.failures:
            raise ConnectionError("store unavailable")
        self.batches.append(batch)

    @property
    def messages(self) -> list[Message]:
        return [message for batch in self.batches for message in batch]

    def payloads(self, topic: str | None = None) -> list[str]:
        return [m.payload.decode() for m in self.messages if topic is None or m.topic == topic]


class Gateway:
    """MqttConnection + Ingestor + Store, started and stopped together."""

    def __init__(self, mqtt_settings: MqttSettings, store: Store | None = None, filters=("t/#",)) -> None:
        self.connection = MqttConnection(mqtt_settings)
        self.store = store or Store()
        self.store.connection = self.connection
        self.ingestor = Ingestor(self.connection, self.store.commit)
        self.filters = list(filters)

    async def __aenter__(self) -> Gateway:
        await self.connection.start(self.filters)
        self.task = asyncio.create_task(self.ingestor.run())
        async with asyncio.timeout(5):
            await self.connection.wait_connected()
            while not self.connection.stats.subscribed:  # a message published before the SUBACK may never come
                await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *_exc) -> None:
        await self.ingestor.stop()
        await self.connection.stop()
        await self.task


async def redelivered(broker: Mosquitto, client_id: str, protocol: str, wait: float = 0.5) -> list[str]:
    """What the broker still holds unacknowledged for `client_id` (consumed and acknowledged by this call)."""
    async with Gateway(settings(broker, client_id=client_id, protocol=protocol)) as fresh:
        await asyncio.sleep(wait)
    return fresh.store.payloads()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_in_order_per_topic_committed_then_acked(mosquitto: Mosquitto, protocol: str) -> None:
    async def scenario() -> None:
        gw_settings = settings(mosquitto, protocol=protocol)
        async with Gateway(gw_settings) as gw:
            a = [str(i) for i in range(300)]
            b = [f"b{i}" for i in range(300)]
            c = [f"c{i}".encode() for i in range(200)]
            await asyncio.gather(
                asyncio.to_thread(mosquitto.pub, "t/a", *a),
                asyncio.to_thread(mosquitto.pub, "t/b", *b),
                asyncio.to_thread(paho_publish, mosquitto.port, "t/c", c, protocol),
            )
            await until(lambda: len(gw.store.messages) == 800, what="800 messages committed")
            await until(lambda: gw.connection.stats.acked == 800, what="800 acks")
            assert gw.store.payloads("t/a") == a
            assert gw.store.payloads("t/b") == b
            assert gw.store.payloads("t/c") == [p.decode() for p in c]
            assert gw.store.acked_early == []
            assert gw.ingestor.stats.committed == 800
            assert gw.ingestor.stats.batches < 800  # batched
        assert await redelivered(mosquitto, gw_settings.client_id, protocol) == []

    asyncio.run(scenario())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_failed_commit_acks_nothing_and_the_broker_redelivers(mosquitto: Mosquitto, protocol: str) -> None:
    async def scenario() -> None:
        gw_settings = settings(mosquitto, protocol=protocol)
        sent = [str(i) for i in range(50)]
        async with Gateway(gw_settings, Store(failures=10**6)) as gw:
            await asyncio.to_thread(mosquitto.pub, "t/x", *sent)
            await until(lambda: gw.store.attempts >= 2, what="two failed commits")
            assert gw.connection.stats.acked == 0
            assert gw.ingestor.stats.commit_failures >= 2
        # Stopped while still failing: the broker holds all 50 unacknowledged and redelivers them, in order.
        assert await redelivered(mosquitto, gw_settings.client_id, protocol) == sent

    asyncio.run(scenario())


def test_commit_that_fails_then_succeeds_loses_nothing(mosquitto: Mosquitto) -> None:
    async def scenario() -> None:
        gw_settings = settings(mosquitto)
        sent = [str(i) for i in range(50)]
        async with Gateway(gw_settings, Store(failures=2)) as gw:
            await asyncio.to_thread(mosquitto.pub, "t/x", *sent)
            await until(lambda: gw.connection.stats.acked == 50, timeout=5, what="50 acks after the retries")
            assert gw.store.payloads() == sent
            assert gw.store.attempts >= 3
            assert gw.store.acked_early == []
        assert await redelivered(mosquitto, gw_settings.client_id, "5") == []

    asyncio.run(scenario())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_persistent_session_delivers_what_was_published_while_stopped(mosquitto: Mosquitto, protocol: str) -> None:
    async def scenario() -> None:
        gw_settings = settings(mosquitto, protocol=protocol)
        async with Gateway(gw_settings):
            pass
        sent = [str(i) for i in range(100)]
        await asyncio.to_thread(mosquitto.pub, "t/offline", *sent)
        async with Gateway(gw_settings) as gw:
            await until(lambda: len(gw.store.messages) == 100, what="the 100 messages queued in the session")
            assert gw.store.payloads() == sent

    asyncio.run(scenario())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_reconnects_after_a_broker_restart(mosquitto: Mosquitto, protocol: str) -> None:
    async def scenario() -> None:
        async with Gateway(settings(mosquitto, protocol=protocol)) as gw:
            await asyncio.to_thread(mosquitto.pub, "t/r", *[f"before{i}" for i in range(10)])
            await until(lambda: len(gw.store.messages) == 10, what="messages before the restart")
            await asyncio.to_thread(mosquitto.restart)
            async with asyncio.timeout(10):
                await until(lambda: gw.connection.stats.reconnects >= 1 and gw.connection.stats.connected)
            await asyncio.sleep(0.1)
            await asyncio.to_thread(mosquitto.pub, "t/r", *[f"after{i}" for i in range(10)])
            await until(lambda: len(gw.store.messages) == 20, what="messages after the restart")
            assert gw.connection.stats.last_error is not None

    asyncio.run(scenario())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_filters_changed_while_the_broker_is_away_are_sent_when_the_session_resumes(
    mosquitto: Mosquitto, protocol: str
) -> None:
    """A mapping added (or removed) while the broker was down was "sent at the next connect", but a
    connect that resumes the session sent nothing: the new topic was never delivered until the
    gateway restarted (and a removed one kept coming)."""

    async def scenario() -> None:
        async with Gateway(settings(mosquitto, protocol=protocol), filters=("t/#", "old/#")) as gw:
            await asyncio.to_thread(mosquitto.stop)
            await until(lambda: not gw.connection.stats.connected, what="the broker gone")
            await gw.connection.subscribe(["new/#"])
            await gw.connection.unsubscribe(["old/#"])
            await asyncio.to_thread(mosquitto.start)
            await until(lambda: gw.connection.stats.connected and gw.connection.stats.subscribed, what="resumed")
            assert gw.connection.session_resumed
            await until(lambda: gw.connection.metrics().get("pending_filters", 0) == 0, what="the changes acknowledged")
            await asyncio.to_thread(mosquitto.pub, "old/x", "gone")
            await asyncio.to_thread(mosquitto.pub, "new/x", "added")
            await asyncio.to_thread(mosquitto.pub, "t/x", "kept")
            await until(lambda: len(gw.store.messages) == 2, what="the new topic's message")
            await asyncio.sleep(0.3)
            assert sorted(gw.store.payloads()) == ["added", "kept"]

    asyncio.run(scenario())


def test_oversize_payload_is_counted_and_dropped_without_stopping_ingestion(mosquitto: Mosquitto) -> None:
    async def scenario() -> None:
        gw_settings = settings(mosquitto, max_payload_bytes=100)
        async with Gateway(gw_settings) as gw:
            await asyncio.to_thread(mosquitto.pub, "t/big", "small1", "x" * 1000, "small2")
            await until(lambda: gw.connection.stats.acked == 3, what="3 acks")
            assert gw.store.payloads() == ["small1", "small2"]
            assert gw.ingestor.stats.dropped_oversize == 1
            assert gw.ingestor.counters.counts == {"t/big": 1}
        assert await redelivered(mosquitto, gw_settings.client_id, "5") == []

    asyncio.run(scenario())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unacknowledged_messages_in_memory_are_bounded_by_the_receive_window(
    mosquitto: Mosquitto, protocol: str
) -> None:
    """MQTT 5: the broker honours Receive Maximum. MQTT 3.1.1: this broker allows 1000 in flight, more than the
    gateway's 50, so the connection holds paho's thread until acknowledgements free the window."""

    async def scenario() -> None:
        release = asyncio.Event()
        store = Store()
        original = store.commit

        async def slow_commit(batch: list[Message]) -> None:
            await release.wait()
            await original(batch)

        store.commit = slow_commit
        gw_settings = settings(mosquitto, protocol=protocol, receive_maximum=50, batch_max=25)
        async with Gateway(gw_settings, store) as gw:
            publishing = asyncio.create_task(asyncio.to_thread(mosquitto.pub, "t/w", *map(str, range(300))))
            await until(lambda: gw.connection.metrics()["unacked"] == 50, what="a full window")
            await asyncio.sleep(0.3)
            assert gw.connection.metrics()["unacked"] == 50
            assert gw.connection.stats.messages <= 51  # at most one message held by the paused paho thread
            assert (gw.connection.stats.window_waits > 0) == (protocol == "3.1.1")
            release.set()
            await publishing
            await until(lambda: len(gw.store.messages) == 300, what="all 300 committed")
            assert gw.store.payloads() == [str(i) for i in range(300)]
            assert gw.ingestor.stats.largest_batch == 25

    asyncio.run(scenario())


def test_publish_waits_for_the_puback(mosquitto: Mosquitto) -> None:
    async def scenario() -> None:
        async with Gateway(settings(mosquitto), filters=["cmnd/#"]) as gw:
            async with asyncio.timeout(5):
                await gw.connection.publish("cmnd/lamp1/POWER", "ON")
            assert gw.connection.stats.published == 1
            await until(lambda: gw.store.payloads() == ["ON"], what="the command echoed back")

    asyncio.run(scenario())


def test_a_message_leaves_no_cyclic_garbage_behind(mosquitto: Mosquitto) -> None:
    """paho looks every message up in its per-topic callback matcher, whose lookup builds a closure
    that refers to itself: cyclic garbage at the message rate, which only collector passes (holding
    the GIL) free. The connection takes every message in on_message and leaves the matcher out."""

    async def scenario() -> None:
        async with Gateway(settings(mosquitto)) as gw:
            gc.collect()
            gc.disable()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                await asyncio.to_thread(mosquitto.pub, "t/a", *[str(i) for i in range(300)])
                await until(lambda: len(gw.store.messages) == 300, what="300 messages committed")
                gc.collect()
                from_paho = [o for o in gc.garbage if isinstance(o, types.FunctionType) and "paho" in o.__module__]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
            assert from_paho == []

    asyncio.run(scenario())
