"""Exactly once from MQTT into the store: committed deliveries are recorded with their observations.

The ingestor acknowledges a message after its batch is committed (adapters.mqtt.ingest), so a
process killed between the commit and the acknowledgement's write gets the message again after
the restart (QoS 1, persistent session, DUP set): 168 of 3,000 readings were stored twice with
1,000 in flight. QoS 2 only moves that window (paho sends PUBREC at the same point).

So each batch's update also writes one quad per delivered message into the deliveries graph,
`<urn:sepa-gateway:mqtt-delivery:MID> gw:deliveryDigest "DIGEST"` (DIGEST: SHA-256 of topic and
payload, 16 hex digits): in the same update, so it is in the store exactly when the observations
are. A redelivered message (DUP set) whose MID and digest are recorded was committed: it is
acknowledged and not stored again. The quads of a batch are deleted two batches later, in that
batch's update: by then its acknowledgements were written to the broker's socket long ago, and
the broker never redelivers an acknowledged message; a packet identifier is reused only after
65,535 others, far more than two batches, so an identifier and digest pair names one delivery.
"""

from __future__ import annotations

import hashlib
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
    """The deliveries recorded in the store, and the quads to add to each batch's update."""

    def __init__(self) -> None:
        self.recorded: dict[int, set[str]] = {}
        self._batches: deque[list[Quad]] = deque()  # the quads of the last batches, oldest first
        self.duplicates = 0  # redelivered messages recognised as committed

    def load(self, rows: Iterable[dict[str, object]]) -> None:
        """What the store holds (at start): recognised, and deleted with the next batch."""
        quads = []
        for row in rows:
            subject, value = str(getattr(row["d"], "value", "")), str(getattr(row["digest"], "value", ""))
            if subject.startswith(SUBJECT) and subject[len(SUBJECT) :].isdigit():
                mid = int(subject[len(SUBJECT) :])
                self.recorded.setdefault(mid, set()).add(value)
                quads.append(_quad(mid, value))
        if quads:
            self._batches.append(quads)

    def committed(self, message: Message) -> bool:
        """Whether this redelivered message was committed already (then it is only acknowledged)."""
        if message.dup and digest(message) in self.recorded.get(message.mid, ()):
            self.duplicates += 1
            return True
        return False

    def record(self, request: Update | str, messages: Sequence[Message]) -> tuple[Update | str, list[Quad], list[Quad]]:
        """`request` with the batch's deliveries recorded and the oldest batch's deleted: (request,
        quads added, quads deleted). Call :meth:`settle` once it is committed."""
        added = [_quad(message.mid, digest(message)) for message in messages if message.qos > 0]
        deleted = self._batches[0] if len(self._batches) >= KEPT_BATCHES else []
        return with_quads(request, added, deleted), added, deleted

    def settle(self, added: list[Quad], deleted: list[Quad]) -> None:
        """The batch's update was committed: remember its deliveries, forget the deleted ones."""
        if deleted and self._batches and self._batches[0] is deleted:
            self._batches.popleft()
        for quad in deleted:
            mid = int(quad.subject.value[len(SUBJECT) :])
            values = self.recorded.get(mid)
            if values is not None:
                values.discard(quad.object.value)
                if not values:
                    del self.recorded[mid]
        for quad in added:
            self.recorded.setdefault(int(quad.subject.value[len(SUBJECT) :]), set()).add(quad.object.value)
        self._batches.append(added)
