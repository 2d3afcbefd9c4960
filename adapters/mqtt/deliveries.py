"""Exactly once from MQTT into the store: committed deliveries are recorded with their observations.

The ingestor acknowledges a message after its batch is committed (adapters.mqtt.ingest), so a
process killed between the commit and the acknowledgement's write gets the message again after
the restart (QoS 1, persistent session, DUP set): 168 of 3,000 readings were stored twice with
1,000 in flight. QoS 2 only moves that window (paho sends PUBREC at the same point).

So the update that stores a message's readings also writes one quad for it into the deliveries
graph, `<urn:sepa-gateway:mqtt-delivery:MID> gw:deliveryDigest "DIGEST"` (DIGEST: SHA-256 of topic
and payload, 16 hex digits): in the same update, so it is in the store exactly when the
observations are. A redelivered message (DUP set) whose MID and digest are recorded was committed:
it is acknowledged and not stored again. The quads of a batch are deleted two batches later, by
that batch's first update (a batch may take several: see :class:`Deliveries`): by then its
acknowledgements were written to the broker's socket long ago, and the broker never redelivers
an acknowledged message; a packet identifier is reused only after 65,535 others, far more than
two batches, so an identifier and digest pair names one delivery.

That holds only while the connection the acknowledgements went out on is still up. Records of a
connection that has ended (the process killed, or the broker gone) are kept until the connection
after it has delivered a message without DUP: a broker resends a resumed session's unacknowledged
messages first (MQTT 5 §4.4), so by then every redelivery has come. Deleted two batches after the
restart instead, the records were gone when the redeliveries spread over more than two batches
(up to receive_maximum, 1,000, at 500 a batch or fewer): a kill -9 test stored one reading twice in
3,000.

Batches can follow each other within milliseconds, and an acknowledgement handed to paho reaches
the broker only once paho's thread has written it: so records also stay HOLD_S after their batch
was acknowledged (and after the redeliveries of a later connection were over). At 1,000 readings
a second that is ~2,000 more quads in the deliveries graph.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pyoxigraph import Literal, NamedNode, Quad

from adapters.mqtt.connection import Message
from broker.api import Update
from gateway.observations.amend import with_quads
from gateway.observations.nquads import literal_quads

GRAPH = NamedNode("http://w3id.org/sepa-gateway/graph/deliveries")
DIGEST = NamedNode("http://w3id.org/sepa-gateway/ns#deliveryDigest")
SUBJECT = "urn:sepa-gateway:mqtt-delivery:"
_DIGEST_TEXT, _GRAPH_TEXT = str(DIGEST), str(GRAPH)  # their N-Triples forms, for `_quads`
QUERY = f"SELECT ?d ?digest WHERE {{ GRAPH <{GRAPH.value}> {{ ?d <{DIGEST.value}> ?digest }} }}"
KEPT_BATCHES = 2
HOLD_S = 2.0


def digest(message: Message) -> str:
    return hashlib.sha256(message.topic.encode() + b"\0" + message.payload).hexdigest()[:16]


def _quad(mid: int, value: str) -> Quad:
    return Quad(NamedNode(f"{SUBJECT}{mid}"), DIGEST, Literal(value), GRAPH)


def _quads(records: Iterable[tuple[int, str]]) -> list[Quad]:
    """`_quad` of each (mid, digest), from N-Quads lines: a quad with a literal object costs ~7x
    more made by `Quad(...)` (gateway.observations.nquads); one a message, on the event loop. A
    digest is hexadecimal, so its text needs no escaping."""
    return literal_quads([f'<{SUBJECT}{mid}> {_DIGEST_TEXT} "{value}" {_GRAPH_TEXT} .\n' for mid, value in records])


@dataclass(eq=False, slots=True)
class _Group:
    """The records one update wrote: its batch's number, the newest connection its messages came on,
    and when its batch was acknowledged (None while under way)."""

    batch: int
    connection: int
    quads: list[Quad]
    closed_at: float | None = None


class Deliveries:
    """The deliveries recorded in the store, and the quads to add to each update of a batch.

    A batch may be stored by several updates (MqttAdapter.commit cuts it at batch_max_readings), and
    its messages are acknowledged only once the last of them is committed: so the records are
    grouped by the batch they belong to (numbered, :meth:`close_batch` ends one), and an update
    deletes the records of batches closed KEPT_BATCHES batches ago or more, never those of the batch
    under way (its messages are not acknowledged yet: deleting their records before, a kill between
    that update and the acknowledgement stored them twice at the redelivery). Records of a
    connection that is no longer the live one wait for the redeliveries (see the module's doc).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, hold_s: float = HOLD_S) -> None:
        self._clock = clock
        self._hold_s = hold_s
        self.recorded: dict[int, set[str]] = {}
        self._groups: list[_Group] = []  # oldest first
        self._batch = 0  # the number of the batch being stored
        self._resumed = 0  # the newest connection known to have delivered all its redeliveries
        self._resumed_at = 0.0  # when it was known
        self._forgetting: list[_Group] = []  # the groups the update being made deletes
        self._connection = 0  # the newest connection of the messages the update being made records
        self._batch_seen: dict[tuple[int, str], int] = {}  # (mid, digest) of the batch's messages: connection
        self.duplicates = 0  # redelivered messages recognised as committed
        # id(message) -> (message, its digest), found by `committed` for `record` (a SHA-256 less a
        # message); the message is held so its id names no other until `close_batch` forgets them
        self._digests: dict[int, tuple[Message, str]] = {}

    def load(self, rows: Iterable[dict[str, object]]) -> None:
        """What the store holds (at start): recognised until the redeliveries are over, then deleted."""
        quads = []
        for row in rows:
            subject, value = str(getattr(row["d"], "value", "")), str(getattr(row["digest"], "value", ""))
            if subject.startswith(SUBJECT) and subject[len(SUBJECT) :].isdigit():
                mid = int(subject[len(SUBJECT) :])
                self.recorded.setdefault(mid, set()).add(value)
                quads.append(_quad(mid, value))
        if quads:
            # connection 0: older than any of this process
            self._groups.append(_Group(self._batch - 1, 0, quads, self._clock()))

    def committed(self, message: Message) -> bool:
        """Whether this message is a redelivery of one committed already (then it is only acknowledged).

        Called for every message of a batch in arrival order: one without DUP says its connection's
        redeliveries are over. A batch may hold a message twice: received on a connection that
        then dropped, and redelivered on the next before the first copy was committed."""
        if message.qos == 0:
            return False
        key = digest(message)
        self._digests[id(message)] = (message, key)
        twin = self._batch_seen.setdefault((message.mid, key), message.connection)
        if not message.dup:
            if message.connection > self._resumed:
                self._resumed, self._resumed_at = message.connection, self._clock()
            return False
        if key in self.recorded.get(message.mid, ()) or twin < message.connection:
            self.duplicates += 1
            return True
        return False

    def record(
        self, request: Update | str, messages: Sequence[Message], live: int
    ) -> tuple[Update | str, list[Quad], list[Quad]]:
        """`request` with these messages' deliveries recorded and the old batches' deleted: (request,
        quads added, quads deleted). `live` numbers the connection up now (MqttConnection.number).
        Call :meth:`settle` once it is committed."""
        added = _quads((message.mid, self._digest(message)) for message in messages if message.qos > 0)
        self._connection = max((message.connection for message in messages), default=0)
        ago = self._clock() - self._hold_s
        self._forgetting = [group for group in self._groups if self._forgettable(group, live, ago)]
        deleted = [quad for group in self._forgetting for quad in group.quads]
        return with_quads(request, added, deleted), added, deleted

    def _digest(self, message: Message) -> str:
        known = self._digests.get(id(message))
        return known[1] if known is not None and known[0] is message else digest(message)

    def settle(self, added: list[Quad], deleted: list[Quad]) -> None:
        """The update :meth:`record` amended was committed: remember its deliveries, forget the deleted ones."""
        if deleted:
            gone = {id(group) for group in self._forgetting}
            self._groups = [group for group in self._groups if id(group) not in gone]
        for quad in deleted:
            mid = int(quad.subject.value[len(SUBJECT) :])
            values = self.recorded.get(mid)
            if values is not None:
                values.discard(quad.object.value)
                if not values:
                    del self.recorded[mid]
        for quad in added:
            self.recorded.setdefault(int(quad.subject.value[len(SUBJECT) :]), set()).add(quad.object.value)
        self._groups.append(_Group(self._batch, self._connection, added))

    def close_batch(self) -> None:
        """The batch is stored (its messages are acknowledged next): later updates belong to the next."""
        now = self._clock()
        for group in reversed(self._groups):
            if group.closed_at is not None:
                break
            group.closed_at = now
        self._batch += 1
        self._batch_seen.clear()
        self._digests.clear()

    def _forgettable(self, group: _Group, live: int, ago: float) -> bool:
        """Closed KEPT_BATCHES batches and HOLD_S ago or more, and no redelivery can come for it: its
        connection is still up (its acknowledgements went out on it), or a later one has delivered
        its redeliveries HOLD_S ago (`ago`: the time HOLD_S ago)."""
        if group.batch > self._batch - KEPT_BATCHES or group.closed_at is None or group.closed_at > ago:
            return False
        return group.connection == live or (group.connection < self._resumed and self._resumed_at <= ago)
