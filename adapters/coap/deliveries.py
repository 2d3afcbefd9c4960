"""A confirmable request retransmitted across a gateway restart is recognised: deliveries are recorded.

aiocoap answers a retransmission (same endpoint, same message ID) with the first response from its
memory, which a kill -9 or a restart empties. A sensor retransmits for up to MAX_TRANSMIT_SPAN
(45 s with RFC 7252's defaults) after its first send, and the installed service is back within
seconds (RestartSec=2): a reading committed just before the kill, whose 2.04 never left, would be
stored again when its retransmission reaches the new process.

So each committed batch also writes one quad per confirmable request into the deliveries graph,
`<urn:sepa-gateway:coap-delivery:HOST:PORT:MID> gw:deliveryDigest "DIGEST"` (SHA-256 of path and
payload, 16 hex digits), in the same update as its observations: it is in the store exactly when
they are. A request whose endpoint, message ID and digest are recorded was committed: it is answered
2.04 and not stored again. A record is deleted by the first batch after EXCHANGE_LIFETIME (247 s,
RFC 7252 §4.8.2), after which the sensor may reuse the message ID; until then it is kept but no
longer recognised (a quiet gateway holds it past the lifetime: a sleepy sensor that restarted its
message IDs and sent the same value was answered 2.04 and its reading dropped).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from urllib.parse import quote, unquote

from pyoxigraph import Literal, NamedNode, Quad

from broker.api import Update
from gateway.observations.amend import with_quads

GRAPH = NamedNode("http://w3id.org/sepa-gateway/graph/deliveries")
DIGEST = NamedNode("http://w3id.org/sepa-gateway/ns#deliveryDigest")
SUBJECT = "urn:sepa-gateway:coap-delivery:"
QUERY = (
    f"SELECT ?d ?digest WHERE {{ GRAPH <{GRAPH.value}> {{ ?d <{DIGEST.value}> ?digest "
    f'FILTER(STRSTARTS(STR(?d), "{SUBJECT}")) }} }}'
)
EXCHANGE_LIFETIME_S = 247.0

Delivery = tuple[str, str]  # (endpoint and message ID, digest)


def delivery(endpoint: str, mid: int, path: str, payload: bytes) -> Delivery:
    digest = hashlib.sha256(path.encode() + b"\0" + payload).hexdigest()[:16]
    return f"{endpoint}:{mid}", digest


def _quad(key: str, digest: str) -> Quad:
    """The record's quad; the endpoint percent-encoded in its IRI (an IPv6 one, `[fe80::1%eth0]:5683`,
    is no IRI: every confirmable reading from an IPv6 sensor was refused 5.03)."""
    return Quad(NamedNode(SUBJECT + quote(key, safe=":")), DIGEST, Literal(digest), GRAPH)


class Deliveries:
    """The confirmable requests committed in the last EXCHANGE_LIFETIME, in the store and here."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.recorded: dict[str, tuple[str, float]] = {}  # key -> (digest, committed at)
        self._ages: deque[tuple[float, str, str]] = deque()  # (committed at, key, digest), oldest first
        self.duplicates = 0

    def load(self, rows: Iterable[dict[str, object]]) -> None:
        """What the store holds at start: recognised for a full lifetime from now, then deleted."""
        now = self._clock()
        for row in rows:
            subject, digest = str(getattr(row["d"], "value", "")), str(getattr(row["digest"], "value", ""))
            if subject.startswith(SUBJECT):
                key = unquote(subject[len(SUBJECT) :])
                self.recorded[key] = digest, now
                self._ages.append((now, key, digest))

    def committed(self, item: Delivery) -> bool:
        """Whether this request was committed within EXCHANGE_LIFETIME (then it is only answered)."""
        key, digest = item
        record = self.recorded.get(key)
        if record is not None and record[0] == digest and record[1] >= self._clock() - EXCHANGE_LIFETIME_S:
            self.duplicates += 1
            return True
        return False

    def amend(self, request: Update | str, items: list[Delivery]) -> tuple[Update | str, list[tuple[float, str, str]]]:
        """`request` recording `items` and deleting the expired records; (request, the expired)."""
        horizon = self._clock() - EXCHANGE_LIFETIME_S
        # _ages is in commit order: only its head can have expired (a scan of all of it was 6 % of the
        # event loop's time at 950 readings/s, py-spy)
        expired = list(itertools.takewhile(lambda entry: entry[0] < horizon, self._ages))
        added = [_quad(key, digest) for key, digest in items]
        deleted = [_quad(key, digest) for _, key, digest in expired]
        return with_quads(request, added, deleted), expired

    def settle(self, items: list[Delivery], expired: list[tuple[float, str, str]]) -> None:
        """The batch was committed: remember its deliveries, forget the expired ones."""
        for entry in expired:
            if self._ages and self._ages[0] == entry:
                self._ages.popleft()
            if self.recorded.get(entry[1]) == (entry[2], entry[0]):
                del self.recorded[entry[1]]
        now = self._clock()
        for key, digest in items:
            self.recorded[key] = digest, now
            self._ages.append((now, key, digest))
