"""Actuation over CoAP: a subscription whose added rows become confirmable PUTs (`[[coap.actuators]]`).

The CoAP twin of `[[mqtt.actuators]]` (a lamp status changing in the store PUTs `ON` to the lamp)::

    [[coap.actuators]]
    id = "lamp-power"
    query = '''SELECT ?lamp ?power WHERE { GRAPH <urn:lights> { ?lamp <urn:on> ?on }
                                      BIND(IF(?on, "ON", "OFF") AS ?power) }'''
    uri = "coap://[2001:db8::7]/{lamp}/power"
    payload = "{power}"
    content_format = 0      # optional: the payload's CoAP content format, 0 (text/plain) by default

`{name}` is the row's value of ?name (gateway/actuation.py, as for MQTT). In `uri` a value is taken
only when made of letters, digits, `-._~` and `:` (an IPv6 address between brackets): it can name a
host or a path level, never add a level, a query or a user; a row with another value is refused
(counted and logged), never sent. Only changes are sent, unless `initial = true`.

Why a queue per actuator: the subscription's callback runs on the broker's notification path, so it
only renders and enqueues; one sender per actuator PUTs in order (a lamp gets ON then OFF, not the
reverse) and waits for each answer at most PUT_TIMEOUT_S. The queue holds QUEUE_MAX commands: past
that, while a device is away, a new command is dropped and counted rather than kept in memory.

Why aiocoap is imported where a PUT is sent, not at the top: `sepa-gateway check-config` checks the
entries with `CoapActuator.from_config`, and this module's imports (aiocoap, the client and the
broker's pipeline) were 1.2 s of its 2.1 CPU-s (2026-12-07, `-X importtime`); the installer runs it
at every install and upgrade, on a Raspberry Pi 5-8x slower.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gateway.actuation import PLACEHOLDER, ActuatorError, added_rows, checked_entry, fill, row_values

if TYPE_CHECKING:
    import aiocoap

    from gateway.client import ClientSubscription, SepaClient

log = logging.getLogger(__name__)

QUEUE_MAX = 100
PUT_TIMEOUT_S = 15.0  # the first three transmissions of a confirmable request (RFC 7252 §4.2)
_KEYS = {"id", "query", "uri", "payload", "content_format", "initial"}
_URI_VALUE = re.compile(r"[A-Za-z0-9._~:-]+")


def _uri_value(value: str) -> bool:
    return _URI_VALUE.fullmatch(value) is not None


def _coap_uri(uri: str) -> bool:
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018  # raises ValueError for a port that is not a number in range
    except ValueError:
        return False
    return parts.scheme == "coap" and bool(parts.hostname) and parts.username is None and not parts.fragment


def _example(template: str) -> str:
    """The template with sample values, to check its shape: `::1` in an IPv6 host, `x` elsewhere."""
    in_brackets = re.sub(r"\[[^\]]*\]", lambda m: "[::1]" if PLACEHOLDER.search(m.group()) else m.group(), template)
    return PLACEHOLDER.sub("x", in_brackets)


@dataclass
class CoapActuator:
    """One subscription → CoAP PUT mapping, with its queue and counters."""

    id: str
    query: str
    uri: str
    payload: str
    content_format: int = 0
    initial: bool = False
    sent: int = 0  # PUTs answered with a success code
    failed: int = 0  # PUTs answered with an error code, or not answered
    refused: int = 0  # rows whose values cannot make a URI
    dropped: int = 0  # commands that found the queue full
    _subscription: ClientSubscription | None = field(default=None, repr=False)
    _queue: asyncio.Queue[tuple[str, bytes]] | None = field(default=None, repr=False)
    _sender: asyncio.Task[None] | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, entry: Any, position: int) -> CoapActuator:
        name = f"coap.actuators[{position}]"
        entry = checked_entry(entry, name, _KEYS, ("id", "query", "uri", "payload"))
        content_format = entry.get("content_format", 0)
        if not isinstance(content_format, int) or isinstance(content_format, bool) or not 0 <= content_format <= 65535:
            raise ActuatorError(f"{name}: content_format must be a CoAP content format number (0 to 65535)")
        if not isinstance(entry.get("initial", False), bool):
            raise ActuatorError(f"{name}: initial must be true or false")
        if not _coap_uri(_example(entry["uri"])):
            raise ActuatorError(f"{name}: uri {entry['uri']!r} is not a coap://host[:port]/path template")
        initial = entry.get("initial", False)
        return cls(entry["id"], entry["query"], entry["uri"], entry["payload"], content_format, initial)

    def render(self, variables: Sequence[str], row: Sequence[Any]) -> tuple[str, str] | None:
        """(uri, payload) for one row, or None when its values cannot make a coap:// URI."""
        values = row_values(variables, row)
        uri, payload = fill(self.uri, values, _uri_value), fill(self.payload, values)
        if uri is None or payload is None or not _coap_uri(uri):
            return None
        return uri, payload

    async def start(self, client: SepaClient, context: aiocoap.Context) -> None:
        self._queue = asyncio.Queue(QUEUE_MAX)
        self._sender = asyncio.get_running_loop().create_task(self._send(context), name=f"coap-actuator {self.id}")
        self._subscription = await client.subscribe(
            self.query, f"coap-actuator-{self.id}", on_notification=self._notified
        )

    async def stop(self) -> None:
        """Unsubscribe; commands still queued are not sent (the devices may be away for long)."""
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    @property
    def queued(self) -> int:
        return 0 if self._queue is None else self._queue.qsize()

    def _notified(self, notification: Any) -> None:
        if self._queue is None:
            return
        for row in added_rows(notification, self.initial):
            rendered = self.render(notification.variables, row)
            if rendered is None:
                self.refused += 1
                log.warning("coap actuator: a row cannot make a coap:// URI", extra={"actuator": self.id})
                continue
            try:
                self._queue.put_nowait((rendered[0], rendered[1].encode("utf-8")))
            except asyncio.QueueFull:
                self.dropped += 1
                log.warning("coap actuator: queue full, command dropped", extra={"actuator": self.id})

    async def _send(self, context: aiocoap.Context) -> None:
        import aiocoap  # see the module's docstring
        from aiocoap import Code

        assert self._queue is not None
        while True:
            uri, payload = await self._queue.get()
            message = aiocoap.Message(code=Code.PUT, uri=uri, payload=payload, content_format=self.content_format)
            try:
                response = await asyncio.wait_for(context.request(message).response, PUT_TIMEOUT_S)
            except (TimeoutError, aiocoap.error.Error, OSError) as error:
                self.failed += 1
                log.warning("coap actuator: PUT failed", extra={"actuator": self.id, "uri": uri, "error": str(error)})
                continue
            if response.code.is_successful():
                self.sent += 1
            else:
                self.failed += 1
                log.warning(
                    "coap actuator: PUT refused",
                    extra={"actuator": self.id, "uri": uri, "code": response.code.dotted},
                )


class CoapActuators:
    """The `[[coap.actuators]]`, on one client context of their own."""

    def __init__(self, client: SepaClient, actuators: Iterable[CoapActuator] = ()) -> None:
        self.client = client
        self.actuators = list(actuators)
        self.context: aiocoap.Context | None = None

    async def start(self) -> None:
        if not self.actuators:
            return
        import aiocoap  # see the module's docstring

        self.context = await aiocoap.Context.create_client_context(transports=["udp6"], loggername="sepa-coap-actuate")
        for actuator in self.actuators:
            await actuator.start(self.client, self.context)

    async def stop(self) -> None:
        for actuator in self.actuators:
            await actuator.stop()
        if self.context is not None:
            await self.context.shutdown()
            self.context = None

    def metrics(self) -> dict[str, int]:
        return {
            f"actuator_{name}": sum(getattr(actuator, name) for actuator in self.actuators)
            for name in ("sent", "failed", "refused", "dropped", "queued")
        }

    def health(self) -> dict[str, Any]:
        return {
            "actuators": [
                {
                    "id": a.id,
                    "sent": a.sent,
                    "failed": a.failed,
                    "refused": a.refused,
                    "dropped": a.dropped,
                    "queued": a.queued,
                }
                for a in self.actuators
            ]  # fmt: skip
        }
