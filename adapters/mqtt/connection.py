"""An asyncio facade over paho-mqtt that never blocks the event loop and acknowledges only on request.

paho runs its network loop on its own thread (`loop_start`, connecting with `connect_async`, so neither DNS nor
the TCP/TLS handshake ever runs on the event loop). Its callbacks only append to a deque and, when the event loop
has not been told yet, wake it with `call_soon_threadsafe`: one wake-up per burst, not one per message.

Messages are received with `manual_ack=True`: a QoS 1 message stays unacknowledged at the broker, in a persistent
session, until `ack` is called for it, which the ingestor does only once the message is committed. The number of
unacknowledged messages is bounded by `receive_maximum` (see `MqttSettings`), which bounds the memory held here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from adapters.mqtt.settings import MqttSettings
from gateway.observations.sources import unsendable

log = logging.getLogger(__name__)

SESSION_TAKEN_OVER = 0x8E  # MQTT 5 reason code of a DISCONNECT sent because another client took the session
# A connection the broker ends sooner than this after it was made counts as "short". Two in a row are taken
# for a session takeover: MQTT 3.1.1 has no reason code, and Mosquitto 2.0.11 (Debian 12) just closes the
# socket of the client it replaces, even on MQTT 5. A broker restart ends one connection, not two in a row.
SHORT_CONNECTION_S = 10.0
# While the session keeps being taken, backoff grows to this many times reconnect_max_s (60 s by default):
# the other client (a second gateway with our id) is backing off too, and each reconnect takes its readings.
TAKEOVER_BACKOFF_FACTOR = 2.0


class _NoFilteredCallbacks:
    """Stands in for paho's per-topic callback matcher, which the gateway never uses (one
    `on_message` takes every message).

    Why: paho looks every message up in that matcher, and `MQTTMatcher.iter_match` builds a
    recursive closure that refers to itself: five objects of cyclic garbage a message (paho 2.2),
    which only the cyclic collector frees. At 1,000 readings/s that was ~24,000 objects a
    collection pass and passes of 13-68 ms with the GIL held, in the notification tail (found with
    gc.DEBUG_SAVEALL in bench mqtt: all 66,000 collected objects in 8 s were those closures).
    Adding a per-topic callback (paho's message_callback_add) would fail loudly here.
    """

    def iter_match(self, _topic: str) -> tuple[()]:
        return ()

    def __setitem__(self, _topic: str, _callback: object) -> None:
        raise NotImplementedError("the gateway takes every message in on_message")


_NO_FILTERED_CALLBACKS = _NoFilteredCallbacks()


class MqttError(RuntimeError):
    """The broker refused something (a publish, a TLS file, a connection) or the connection is stopped."""


def check_filter(topic_filter: str) -> str:
    """Return the filter if MQTT allows it; a malformed one would make the broker drop the connection, again at
    every reconnect, so it is refused here with a clear message."""
    levels = topic_filter.split("/")
    if (
        not topic_filter
        or unsendable(topic_filter) is not None
        or len(topic_filter.encode("utf-8")) > 65535
        or any("#" in level and (level != "#" or i != len(levels) - 1) for i, level in enumerate(levels))
        or any("+" in level and level != "+" for level in levels)
    ):
        raise MqttError(f"mqtt: invalid topic filter {topic_filter!r} ('+' and '#' must fill a level, '#' only last)")
    return topic_filter


@dataclass(frozen=True, slots=True)
class Message:
    """One received message. `connection` numbers the connection that delivered it: its `mid` means nothing on
    any other connection, so an acknowledgement for it is only sent on that one."""

    topic: str
    payload: bytes
    mid: int
    qos: int
    dup: bool
    retain: bool
    arrival_us: int
    connection: int


@dataclass
class ConnectionStats:
    """Counters for /metrics; each is written by one thread only (paho's or the event loop's)."""

    connected: bool = False
    # The broker acknowledged the filters sent at connect (or kept them in a resumed session): only from then on
    # does a reading published to a fresh session reach the gateway, so this, not `connected`, is readiness.
    subscribed: bool = False
    connects: int = 0
    reconnects: int = 0
    connect_failures: int = 0
    messages: int = 0
    acked: int = 0
    stale_acks: int = 0  # not sent: the message came on an earlier connection, the broker redelivers it
    window_waits: int = 0  # the broker sent more than receive_maximum unacknowledged messages: paho's thread waited
    subscribe_failures: int = 0
    published: int = 0
    session_takeovers: int = 0  # disconnects by another client with our client id (reason 0x8E, or short in a row)
    short_connections: int = 0  # connections the broker ended within SHORT_CONNECTION_S (backed off)
    last_error: str | None = None


class MqttConnection:
    """One MQTT client connection with a persistent session, usable from asyncio."""

    def __init__(self, settings: MqttSettings, wants_retained: Callable[[str], bool] = lambda _filter: True) -> None:
        """`wants_retained(filter)`: whether the broker is to send the retained messages of `filter` when it
        is subscribed (MQTT 5 Retain Handling 0), or none (2; MQTT 3.1.1 cannot ask, it gets them all)."""
        self.settings = settings
        self._wants_retained = wants_retained
        self.stats = ConnectionStats()
        self._client: mqtt.Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._filters: list[str] = []
        self._inbox: deque[Message] = deque()
        self._arrived = asyncio.Event()
        self._wake_pending = False
        # Inbox length at which paho's thread wakes the event loop; None while no receive() waits. Waking a loop
        # that is not waiting (the ingestor is committing) cost a self-pipe write and a loop turn per message.
        self._wanted: int | None = None
        self._connected = asyncio.Event()
        self._publishes: dict[int, asyncio.Future[None]] = {}
        # Guards the connection number and the unacknowledged count; paho's thread waits on it when the window is full.
        self._lock = threading.Condition()
        self._connection = 0
        self._unacked = 0
        self._failed_attempts = 0
        self._short_in_a_row = 0  # connections in a row that ended within SHORT_CONNECTION_S
        self._taken_over = False  # the session is being taken by another client: said once, backed off longer
        self._refusal: str | None = None  # why the broker refused the connection being closed
        self._connected_at = 0.0
        # The connection whose first message came last, and how long after its CONNACK it came (monotonic): a
        # message that came within a second was queued by the broker while the gateway was away
        # (adapters.mqtt.shares). By the wall clock (Message.arrival_us), a clock step between the two (NTP
        # setting a board's clock after boot) declared a backlog an hour later, or hid one.
        self._first_message: tuple[int, float] = (0, math.inf)
        self._connack_at = 0.0
        self.session_resumed = False  # the broker kept the session of the connection delivering now (CONNACK)
        self._first_connect = True
        self._subscribe_mid: int | None = None  # the SUBSCRIBE sent at connect (see ConnectionStats.subscribed)
        self._subscribing: dict[int, list[str]] = {}  # message id of each SUBSCRIBE in flight -> its filters
        self._refused: set[str] = set()  # filters whose last SUBACK was a failure (see refused_filters)
        # Filter changes made at run time that the broker's session has not had (filter: True to subscribe, False
        # to unsubscribe; the last change wins), and the (UN)SUBSCRIBEs sent for them and not yet acknowledged. A
        # change made while the broker is away is sent when the next connection resumes the session: it once
        # waited for a connection that made a new one, and a mapping added during an outage was never delivered.
        self._unsent: dict[str, bool] = {}
        self._awaited: set[int] = set()
        self._changes_lock = threading.Lock()
        self._stopping = False

    # -- lifecycle (event loop) --

    async def start(self, filters: Iterable[str]) -> None:
        """Start connecting in the background (it retries with backoff until `stop`) and subscribe to `filters`."""
        if self._client is not None:
            raise MqttError("mqtt: connection already started")
        self._loop = asyncio.get_running_loop()
        self._filters = [check_filter(f) for f in dict.fromkeys(filters)]
        # tls_set reads certificate files: off the event loop like every other blocking call.
        self._client = await asyncio.to_thread(self._make_client)
        s = self.settings
        if s.protocol == "5":
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = s.session_expiry_s
            properties.ReceiveMaximum = s.receive_maximum
            self._client.connect_async(s.host, s.port, s.keepalive, clean_start=False, properties=properties)
        else:
            self._client.connect_async(s.host, s.port, s.keepalive)
        self._client.reconnect_delay_set(self._next_delay(), s.reconnect_max_s)
        self._client.loop_start()

    async def stop(self) -> None:
        """Disconnect (the broker keeps the session and every unacknowledged message) and end paho's thread."""
        client = self._client
        if client is None or self._stopping:
            return
        self._stopping = True
        with self._lock:
            self._lock.notify_all()
        client.disconnect()
        await asyncio.to_thread(client.loop_stop)
        self._connected.clear()
        self.stats.connected = self.stats.subscribed = False
        for future in self._publishes.values():
            if not future.done():
                future.set_exception(MqttError("mqtt: connection stopped before the broker acknowledged the publish"))
        self._publishes.clear()
        self._arrived.set()

    async def wait_connected(self) -> None:
        """Return once connected (use asyncio.timeout to bound it)."""
        await self._connected.wait()

    # -- subscriptions, messages, acknowledgements (event loop) --

    async def subscribe(self, filters: Iterable[str]) -> None:
        """Add filters (mappings added at run time); sent now if connected, else at the next connect."""
        known = set(self._filters)  # not the list: 2,500 filters added to 10,000 were 25 million comparisons
        new = [check_filter(f) for f in dict.fromkeys(filters) if f not in known]
        self._filters.extend(new)
        if new:
            self._change(dict.fromkeys(new, True))

    async def unsubscribe(self, filters: Iterable[str]) -> None:
        """Remove filters (mappings removed at run time), from the broker's session too."""
        known = set(self._filters)
        gone = [f for f in dict.fromkeys(filters) if f in known]
        removed = set(gone)
        self._filters = [f for f in self._filters if f not in removed]
        if gone:
            self._change(dict.fromkeys(gone, False))

    def _change(self, changes: dict[str, bool]) -> None:
        """Record filter changes; sent now if connected, else when the next connection resumes the session."""
        with self._changes_lock:
            self._unsent.update(changes)
        if self._client is not None and self._client.is_connected():
            self._send_changes()

    def _send_changes(self) -> None:
        """Send the unsent filter changes (either thread); those paho could not send (the connection
        just went) stay unsent."""
        with self._changes_lock:
            changes, self._unsent = self._unsent, {}
        failed: dict[str, bool] = {}
        for subscribe in (True, False):
            filters = [f for f, on in changes.items() if on is subscribe]
            if not filters:
                continue
            if subscribe:
                result, mid = self._send_subscribe(filters)
            else:
                result, mid = self._client.unsubscribe(filters)
            with self._changes_lock:
                if result == mqtt.MQTT_ERR_SUCCESS:
                    self._awaited.add(mid)
                else:
                    failed.update(dict.fromkeys(filters, subscribe))
        if failed:
            with self._changes_lock:
                self._unsent = {**failed, **self._unsent}

    async def receive(self, limit: int, timeout: float | None = None, fill: bool = False) -> list[Message]:
        """Up to `limit` messages in arrival order, or [] after `timeout` or `stop`.

        Returns as soon as one message is there, or with `fill` once `limit` are there or the receive window is
        full (the broker sends nothing more until acknowledgements): paho's thread wakes the event loop once per
        batch instead of once per message, which keeps the two threads from fighting over the GIL under load.
        """
        wanted = limit if fill else 1
        if len(self._inbox) < wanted and not (fill and self.window_full) and not self._stopping:
            self._wanted = wanted
            self._arrived.clear()
            try:
                async with asyncio.timeout(timeout):
                    while len(self._inbox) < wanted and not (fill and self.window_full) and not self._stopping:
                        await self._arrived.wait()
                        self._arrived.clear()
            except TimeoutError:
                pass
            finally:
                self._wanted = None
        return [self._inbox.popleft() for _ in range(min(limit, len(self._inbox)))]

    @property
    def number(self) -> int:
        """Numbers the connection up now (odd; even while disconnected): `Message.connection` of what it delivers."""
        return self._connection

    @property
    def queued(self) -> int:
        """Messages delivered and not yet taken by `receive`."""
        return len(self._inbox)

    @property
    def window_full(self) -> bool:
        """True when the broker will send nothing more until something is acknowledged: a batch waiting for
        more messages would only wait for its timer."""
        return self._unacked >= self.settings.receive_maximum

    def ack(self, messages: Iterable[Message]) -> int:
        """Acknowledge messages to the broker, in order; thread-safe. Returns how many acknowledgements were sent.

        A message delivered on an earlier connection is not acknowledged here (its mid may now name another
        message): the broker redelivers it in the resumed session, where the adapter recognises it as committed
        (adapters.mqtt.deliveries).
        """
        client = self._client
        sent = 0
        with self._lock:
            for message in messages:
                if message.qos == 0:
                    continue
                if client is None or message.connection != self._connection:
                    self.stats.stale_acks += 1
                    continue
                client.ack(message.mid, message.qos)
                self._unacked = max(0, self._unacked - 1)
                sent += 1
            if sent:
                self._lock.notify_all()
        self.stats.acked += sent
        return sent

    async def publish(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False) -> None:
        """Publish; for QoS 1, return once the broker's PUBACK arrived (queued across reconnects until then)."""
        if self._client is None or self._loop is None or self._stopping:
            raise MqttError("mqtt: publish on a connection that is not started")
        info = self._client.publish(topic, payload, qos, retain)
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            raise MqttError(f"mqtt: publish to {topic!r} failed: {mqtt.error_string(info.rc)}")
        if qos == 0:
            self.stats.published += 1
            return
        # on_publish reaches the event loop through call_soon_threadsafe, so it cannot run before this line.
        future = self._publishes[info.mid] = self._loop.create_future()
        await future

    def metrics(self) -> dict[str, Any]:
        """Counters and state for /metrics."""
        with self._changes_lock:
            pending = len(self._unsent) + len(self._awaited)
        # filter changes not yet acknowledged by the broker (sent, or waiting for a connection)
        return {
            **asdict(self.stats),
            "unacked": self._unacked,
            "queued": self.queued,
            "pending_filters": pending,
            "refused_filters": len(self.refused_filters()),
        }

    # -- paho's thread --

    def _make_client(self) -> mqtt.Client:
        s = self.settings
        v5 = s.protocol == "5"
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=s.client_id,
            clean_session=None if v5 else False,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            manual_ack=True,
        )
        if s.username is not None:
            client.username_pw_set(s.username, s.password)
        if s.tls is not None:
            try:
                client.tls_set(ca_certs=s.tls.ca, certfile=s.tls.cert, keyfile=s.tls.key, cert_reqs=ssl.CERT_REQUIRED)
            except (OSError, ssl.SSLError) as error:
                raise MqttError(f"mqtt: cannot load the TLS files: {error}") from error
            client.tls_insecure_set(s.tls.insecure)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.on_unsubscribe = self._on_unsubscribe
        client.on_publish = self._on_publish
        if hasattr(client, "_on_message_filtered"):
            client._on_message_filtered = _NO_FILTERED_CALLBACKS
        return client

    def _next_delay(self) -> float:
        """Exponential backoff with jitter (half fixed, half random) so that gateways do not reconnect in step."""
        s = self.settings
        cap = s.reconnect_max_s * (TAKEOVER_BACKOFF_FACTOR if self._taken_over else 1.0)
        ceiling = min(cap, s.reconnect_min_s * 2 ** min(self._failed_attempts, 30))
        return random.uniform(ceiling / 2, ceiling)

    def _schedule_retry(self, client: mqtt.Client, why: str) -> None:
        delay = self._next_delay()
        self._failed_attempts += 1
        # paho waits min_delay before its next attempt; setting both bounds makes it wait exactly our delay.
        client.reconnect_delay_set(delay, delay)
        self.stats.last_error = why
        # during a takeover the warning was given once; each retry is only news at info level
        log.log(
            logging.INFO if self._taken_over else logging.WARNING,
            "mqtt connection lost; retrying",
            extra={**self._where(), "reason": why, "retry_s": round(delay, 2)},
        )

    def _where(self) -> dict[str, Any]:
        """The fields that say which connection a log line is about."""
        return {"broker": f"{self.settings.host}:{self.settings.port}", "client_id": self.settings.client_id}

    def _on_connect(self, client: mqtt.Client, _userdata: Any, flags: Any, reason: Any, _properties: Any) -> None:
        if reason.is_failure:
            self.stats.connect_failures += 1
            self._refusal = self.stats.last_error = f"broker refused the connection: {reason}"
            return  # paho closes the socket and calls on_disconnect, which schedules the retry
        with self._lock:
            self._connection += 1
            self._unacked = 0
        self._failed_attempts = self._short_in_a_row  # a broker that keeps ending us is backed off from
        self._connected_at = self._connack_at = time.monotonic()
        self.session_resumed = bool(flags.session_present)
        self.stats.connected = True
        self.stats.connects += 1
        self.stats.reconnects = self.stats.connects - 1
        # The first connect always subscribes (the configured filters may have changed since the session was made);
        # later ones only when the broker lost the session, since subscribing again resends retained messages.
        fresh = self._first_connect or not flags.session_present
        if fresh:  # the SUBSCRIBE of every filter below is all the session needs
            with self._changes_lock:
                self._unsent.clear()
                self._awaited.clear()
                self._subscribing.clear()  # an earlier connection's SUBSCRIBEs are answered no more
        if fresh and self._filters:
            self._subscribe_mid = self._send_subscribe(self._filters)[1]
            self.stats.subscribed = False
        else:
            self.stats.subscribed = True
            if not fresh:
                self._send_changes()
        self._first_connect = False
        log.info("mqtt connected", extra={**self._where(), "session": "resumed" if flags.session_present else "new"})
        self._call(self._connected.set)

    def _on_connect_fail(self, client: mqtt.Client, _userdata: Any) -> None:
        self.stats.connect_failures += 1
        if not self._stopping:
            self._schedule_retry(client, "cannot connect")

    def _on_disconnect(self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any, _properties: Any) -> None:
        with self._lock:
            self._connection += 1
            self._unacked = 0
            self._lock.notify_all()
        self.stats.connected = self.stats.subscribed = False
        self._call(self._connected.clear)
        if self._stopping:
            return
        why = self._refusal or f"disconnected ({reason})"
        self._refusal = None
        short = bool(self._connected_at) and time.monotonic() - self._connected_at < SHORT_CONNECTION_S
        if short:
            self._short_in_a_row += 1
            self.stats.short_connections += 1
        elif self._connected_at:
            self._short_in_a_row = 0
            self._taken_over = False
        self._connected_at = 0.0
        coded = getattr(reason, "value", None) == SESSION_TAKEN_OVER
        if coded or self._short_in_a_row >= 2:
            self.stats.session_takeovers += 1
            why = "session taken over by another client with the same client id"
            if not self._taken_over:
                self._taken_over = True
                log.warning(
                    "mqtt session taken over: another client connected with our client id; backing off "
                    "(give each gateway its own [mqtt] client_id, or leave it empty to derive one)",
                    extra={
                        **self._where(),
                        "evidence": "reason 0x8E" if coded else f"{self._short_in_a_row} connections ended early",
                    },
                )
        # a broker that keeps ending us is backed off from: each short connection doubles the wait
        self._failed_attempts = max(self._failed_attempts, self._short_in_a_row + (2 if self._taken_over else 0))
        self._schedule_retry(client, why)

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        arrival_us = time.time_ns() // 1000
        with self._lock:
            connection = self._connection
            if msg.qos > 0:
                if self._unacked >= self.settings.receive_maximum and not self._stopping:
                    # Only a broker that ignores the window gets here (MQTT 3.1.1 with a larger broker limit).
                    # Waiting stops paho reading the socket, so TCP holds the rest; the timeout lets paho's loop
                    # run keepalives now and then if nothing gets acknowledged.
                    self.stats.window_waits += 1
                    self._lock.wait_for(
                        lambda: (
                            self._unacked < self.settings.receive_maximum
                            or self._stopping
                            or connection != self._connection
                        ),
                        timeout=self.settings.keepalive / 2,
                    )
                    connection = self._connection
                self._unacked += 1
            if self._first_message[0] != connection:
                self._first_message = (connection, time.monotonic() - self._connack_at)
        try:
            topic = msg.topic
        except UnicodeDecodeError:
            topic = msg._topic.decode("utf-8", "replace")
        self._inbox.append(
            Message(topic, msg.payload, msg.mid, msg.qos, bool(msg.dup), bool(msg.retain), arrival_us, connection)
        )
        self.stats.messages += 1
        wanted = self._wanted
        if (
            not self._wake_pending
            and wanted is not None
            and (len(self._inbox) >= wanted or self._unacked >= self.settings.receive_maximum)
        ):
            self._wake_pending = True
            self._call(self._wake)

    def first_message_after_s(self, connection: int) -> float:
        """Seconds from connection number `connection`'s CONNACK to its first message (inf: not known)."""
        number, after_s = self._first_message
        return after_s if number == connection else math.inf

    def _on_subscribe(self, _client: mqtt.Client, _userdata: Any, mid: int, reasons: list[Any], _props: Any) -> None:
        if mid == self._subscribe_mid:
            self.stats.subscribed = True
        with self._changes_lock:
            self._awaited.discard(mid)
            filters = self._subscribing.pop(mid, [])
            refused = [(f, str(reason)) for f, reason in zip(filters, reasons, strict=False) if reason.is_failure]
            self._refused.difference_update(filters)
            self._refused.update(f for f, _ in refused)
        failed = [str(reason) for reason in reasons if reason.is_failure]
        if failed:
            self.stats.subscribe_failures += len(failed)
            named = ", ".join(f"{f} ({reason})" for f, reason in refused) or ", ".join(failed)
            self.stats.last_error = f"broker refused subscriptions: {named}"
            log.error("mqtt: the broker refused subscriptions", extra={**self._where(), "refused": named})

    def _on_publish(self, _client: mqtt.Client, _userdata: Any, mid: int, reason: Any, _properties: Any) -> None:
        self._call(self._published, mid, str(reason) if reason.is_failure else None)

    def _on_unsubscribe(self, _client: mqtt.Client, _userdata: Any, mid: int, _reasons: Any, _props: Any) -> None:
        with self._changes_lock:
            self._awaited.discard(mid)

    def _options(self, topic_filter: str) -> Any:
        """The SUBSCRIBE options of `topic_filter`: the QoS, and with MQTT 5 whether to send its retained messages."""
        if self.settings.protocol != "5":
            return self.settings.qos
        handling = 0 if self._wants_retained(topic_filter) else 2
        return SubscribeOptions(qos=self.settings.qos, retainHandling=handling)

    def _send_subscribe(self, filters: list[str]) -> tuple[int, int]:
        """Send one SUBSCRIBE for `filters`; paho's result and the message id (its SUBACK carries it).
        The filters are noted under the lock the SUBACK's callback takes, so that it finds them even
        when paho's thread reads the SUBACK before this returns."""
        with self._changes_lock:
            result, mid = self._client.subscribe([(each, self._options(each)) for each in filters])
            if result == mqtt.MQTT_ERR_SUCCESS:
                self._subscribing[mid] = filters
        return result, mid

    def refused_filters(self) -> list[str]:
        """The filters the broker refused when last asked (its ACL, a shared subscription it does not
        support...) and still wanted: readings on them never come. A filter the broker takes at a
        later SUBSCRIBE (every fresh session asks for all) leaves the list."""
        with self._changes_lock:
            refused = set(self._refused)
        return [f for f in self._filters if f in refused]

    def _call(self, callback: Any, *args: Any) -> None:
        """Hand a callback to the event loop from paho's thread; after the loop closed there is no one to tell."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(callback, *args)

    # -- event loop, called from paho's thread through _call --

    def _wake(self) -> None:
        self._wake_pending = False
        self._arrived.set()

    def _published(self, mid: int, failure: str | None) -> None:
        future = self._publishes.pop(mid, None)
        if future is None or future.done():
            return
        if failure is None:
            self.stats.published += 1
            future.set_result(None)
        else:
            future.set_exception(MqttError(f"mqtt: the broker refused the publish: {failure}"))
