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
"""

from __future__ import annotations

import hashlib
import itertools
from collections import deque
from collections.abc import Iterable, Sequence

from pyoxigraph import Literal, NamedNode, Quad

from adapters.mqtt.connection import Message
from broker.api import Update
from gateway.observations.amend import with_quads

GRAPH = NamedNode("http://w3id.org/sepa-gateway/graph/deliveries")
DIGEST = NamedNode("http://w3id.org/sepa-gateway/ns#deliveryDigest")
SUBJECT = "urn:sepa-gateway:mqtt-delivery:"
QUERY = f"SELECT ?d ?digest WHERE {{ GRAPH <{GRAPH.value}> {{ ?d <{DIGEST.value}> ?digest }} }}"
KEPT_BATCHES = 2


def digest(message: Message) -> str:
    return hashlib.sha256(message.topic.encode() + b"\0" + message.payload).hexdigest()[:16]


def _quad(mid: int, value: str) -> Quad:
    return Quad(NamedNode(f"{SUBJECT}{mid}"), DIGEST, Literal(value), GRAPH)


class Deliveries:
    """The deliveries recorded in the store, and the quads to add to each update of a batch.

    A batch may be stored by several updates (MqttAdapter.commit cuts it at batch_max_readings), and
    its messages are acknowledged only once the last of them is committed: so the records are
    grouped by the batch they belong to (numbered, :meth:`close_batch` ends one), and an update
    deletes the records of batches closed KEPT_BATCHES batches ago or more, never those of the batch
    under way (its messages are not acknowledged yet: deleting their records before, a kill between
    that update and the acknowledgement stored them twice at the redelivery).
    """

    def __init__(self) -> None:
        self.recorded: dict[int, set[str]] = {}
        # (batch number, quads) of each update that recorded deliveries, oldest first
        self._groups: deque[tuple[int, list[Quad]]] = deque()
        self._batch = 0  # the number of the batch being stored
        self.duplicates = 0  # redelivered messages recognised as committed

    def load(self, rows: Iterable[dict[str, object]]) -> None:
        """What the store holds (at start): recognised, and deleted with the second batch."""
        quads = []
        for row in rows:
            subject, value = str(getattr(row["d"], "value", "")), str(getattr(row["digest"], "value", ""))
            if subject.startswith(SUBJECT) and subject[len(SUBJECT) :].isdigit():
                mid = int(subject[len(SUBJECT) :])
                self.recorded.setdefault(mid, set()).add(value)
                quads.append(_quad(mid, value))
        if quads:
            self._groups.append((self._batch - 1, quads))

    def committed(self, message: Message) -> bool:
        """Whether this redelivered message was committed already (then it is only acknowledged)."""
        if message.dup and digest(message) in self.recorded.get(message.mid, ()):
            self.duplicates += 1
            return True
        return False

    def record(self, request: Update | str, messages: Sequence[Message]) -> tuple[Update | str, list[Quad], list[Quad]]:
        """`request` with these messages' deliveries recorded and the old batches' deleted: (request,
        quads added, quads deleted). Call :meth:`settle` once it is committed."""
        added = [_quad(message.mid, digest(message)) for message in messages if message.qos > 0]
        deleted = [quad for _, quads in self._old() for quad in quads]
        return with_quads(request, added, deleted), added, deleted

    def settle(self, added: list[Quad], deleted: list[Quad]) -> None:
        """The update :meth:`record` amended was committed: remember its deliveries, forget the deleted ones."""
        if deleted:
            for _ in self._old():
                self._groups.popleft()
        for quad in deleted:
            mid = int(quad.subject.value[len(SUBJECT) :])
            values = self.recorded.get(mid)
            if values is not None:
                values.discard(quad.object.value)
                if not values:
                    del self.recorded[mid]
        for quad in added:
            self.recorded.setdefault(int(quad.subject.value[len(SUBJECT) :]), set()).add(quad.object.value)
        self._groups.append((self._batch, added))

    def close_batch(self) -> None:
        """The batch is stored (its messages are acknowledged next): later updates belong to the next."""
        self._batch += 1

    def _old(self) -> list[tuple[int, list[Quad]]]:
        """The groups of batches closed KEPT_BATCHES batches ago or more (at the front)."""
        return list(itertools.takewhile(lambda group: group[0] <= self._batch - KEPT_BATCHES, self._groups))
