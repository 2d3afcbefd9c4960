"""Actuation: a subscription whose added rows become MQTT publishes (`[[mqtt.actuators]]`).

Example (a lamp status changing in the store publishes `cmnd/<lamp>/POWER ON`)::

    [[mqtt.actuators]]
    id = "lamp-power"
    query = '''SELECT ?lamp ?power WHERE { GRAPH <urn:lights> { ?lamp <urn:on> ?on }
                                      BIND(IF(?on, "ON", "OFF") AS ?power) }'''
    topic = "cmnd/{lamp}/POWER"
    payload = "{power}"

`{name}` in `topic` and `payload` is the row's value of ?name: a literal's lexical form, or an
IRI's last segment (after the last `/`, `#` or `:`; gateway/actuation.py, shared with CoAP). A value
that would change the topic's structure (`/`, `+`, `#`, empty) is refused for that row (counted and
logged), never published. Only changes are published: the rows present when the gateway starts
(sequence 0) are not, unless `initial = true` (then the current state is re-sent at every start).

A command is a state to reach, so the newest command for a topic wins: each topic has at most one
publish waiting for the broker's PUBACK and one command after it, which a newer command replaces
(counted: `superseded`). Why: while the broker is away a publish waits for it, and before this
every store change queued one more (2,000 changes with the broker down: 2,000 pending publishes,
all sent in a burst of stale commands on reconnect); now a lamp toggled 2,000 times gets its
oldest waiting command and then its latest.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.actuation import ActuatorError, added_rows, checked_entry, fill, row_values

if TYPE_CHECKING:  # only annotations: `sepa-gateway check-config` checks the entries without paho and the client
    from adapters.mqtt.connection import MqttConnection
    from gateway.client import ClientSubscription, SepaClient

log = logging.getLogger(__name__)

_KEYS = {"id", "query", "topic", "payload", "qos", "retain", "initial"}


@dataclass
class Actuator:
    """One subscription → MQTT publish mapping."""

    id: str
    query: str
    topic: str
    payload: str
    qos: int = 1
    retain: bool = False
    initial: bool = False
    published: int = 0
    refused: int = 0
    superseded: int = 0  # commands replaced by a newer one for the same topic before they were sent
    _subscription: ClientSubscription | None = field(default=None, repr=False)
    _connection: MqttConnection | None = field(default=None, repr=False)
    _pending: set[asyncio.Task[None]] = field(default_factory=set, repr=False)
    _in_flight: set[str] = field(default_factory=set, repr=False)  # topics with a publish waiting for its PUBACK
    _next: dict[str, str] = field(default_factory=dict, repr=False)  # topic -> payload after the one in flight

    @classmethod
    def from_config(cls, entry: Any, position: int) -> Actuator:
        name = f"mqtt.actuators[{position}]"
        entry = checked_entry(entry, name, _KEYS, ("id", "query", "topic", "payload"))
        if entry.get("qos", 1) not in (0, 1, 2) or isinstance(entry.get("qos", 1), bool):
            raise ActuatorError(f"{name}: qos must be 0, 1 or 2")
        for key in ("retain", "initial"):
            if not isinstance(entry.get(key, False), bool):
                raise ActuatorError(f"{name}: {key} must be true or false")
        if "+" in entry["topic"] or "#" in entry["topic"]:
            raise ActuatorError(f"{name}: topic cannot contain MQTT wildcards")
        return cls(
            entry["id"],
            entry["query"],
            entry["topic"],
            entry["payload"],
            entry.get("qos", 1),
            entry.get("retain", False),
            entry.get("initial", False),
        )

    async def start(self, client: SepaClient, connection: MqttConnection) -> None:
        self._connection = connection
        self._subscription = await client.subscribe(
            self.query, f"mqtt-actuator-{self.id}", on_notification=self._notified
        )

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def render(self, variables: tuple[str, ...], row: tuple[Any, ...]) -> tuple[str, str] | None:
        """(topic, payload) for one row, or None when a value cannot go into the topic."""
        values = row_values(variables, row)
        topic, payload = fill(self.topic, values, _topic_level), fill(self.payload, values)
        return None if topic is None or payload is None else (topic, payload)

    def _notified(self, notification: Any) -> None:
        for row in added_rows(notification, self.initial):
            rendered = self.render(notification.variables, row)
            if rendered is None:
                self.refused += 1
                log.warning("mqtt actuator: a row cannot be published", extra={"actuator": self.id})
                continue
            self._command(*rendered)

    def _command(self, topic: str, payload: str) -> None:
        """Publish `payload` to `topic` now, or after the publish in flight there (the newest wins)."""
        if topic in self._in_flight:
            if topic in self._next:
                self.superseded += 1
            self._next[topic] = payload
            return
        self._in_flight.add(topic)
        task = asyncio.get_running_loop().create_task(self._publish(topic, payload))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish(self, topic: str, payload: str | None) -> None:
        assert self._connection is not None
        try:
            while payload is not None:
                try:
                    await self._connection.publish(topic, payload.encode("utf-8"), qos=self.qos, retain=self.retain)
                    self.published += 1
                except Exception as error:  # the broker is away: the command is lost, say so
                    log.warning("mqtt actuator: publish failed", extra={"actuator": self.id, "error": str(error)})
                payload = self._next.pop(topic, None)
        finally:
            self._in_flight.discard(topic)


def _topic_level(value: str) -> bool:
    """A value that stays one topic level: not empty, no separator or wildcard."""
    return bool(value) and not any(c in value for c in "/+#\0")
