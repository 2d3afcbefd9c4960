"""Subscriptions as observable CoAP resources: `/q` and `/q/{name}` (issue 17, item 3).

A named subscription, from `[[coap.subscriptions]]` or created by POSTing SPARQL to `/q`, is the
resource `/q/{name}`, so a constrained actuator follows a SPARQL subscription with a CoAP GET and
the Observe option (RFC 7641): `coap-client -s 30 coap://gateway/q/lamps`.

- ``POST /q`` (text/plain SPARQL, content format 0 or none; `?name=NAME` to choose the name,
  1-64 of ``[A-Za-z0-9._-]``, else one is made up): 2.01 Created with Location-Path ``q/NAME``.
  POSTing the same name with the same SPARQL again answers 2.01 as well (a device may re-create
  its subscription at every boot); the same name with other SPARQL is 4.09 Conflict.
  The broker's refusal of the SPARQL (syntax, not SELECT/ASK, SERVICE) is 4.00 with its text.
- ``GET /q/NAME``: the current result (:mod:`adapters.coap.results`: SPARQL JSON as
  application/json 50, or CBOR 60 by Accept), block-wise (Block2) when large. Its ETag is the
  result's sequence number (8 bytes, big-endian), the same number the notifications carry; a GET
  carrying the current one as an ETag option gets 2.03 Valid without payload (RFC 7252 §5.10.6.2).
- ``GET /q/NAME`` with Observe: first the complete result at the current sequence, then every
  notification of the subscription, in order (added and removed rows). Nothing is skipped: RFC 7641
  lets a server send only the latest state, but a delta missed would leave the observer's rows
  wrong, so every notification is sent confirmable (lost ones are retransmitted) and each observer
  has its own queue. An observer that falls behind (aiocoap still holds `WINDOW` messages for it:
  it acknowledges slower than the subscription changes) keeps notifications here, up to
  `MAX_PENDING`; past that they are dropped and, once it catches up, it gets the complete result
  again (``"complete": true``, the sequence numbers go on), so what it holds is always exact.
- ``DELETE /q/NAME`` ends a subscription created over CoAP (2.02; its observers get 4.04); a
  configured one is the config file's (4.05).
- ``GET /q``: the subscriptions, as links (application/link-format).

Created subscriptions last until deleted or until the gateway stops (they are not stored). Their
number and the size of each one's SPARQL are bounded (`QueryLimits`): 5.03 (Max-Age 30) past the
number, 4.13 (with Size1) past the size. Every request is authorized as readings are
(:class:`adapters.coap.access.Access`: the plain gates' rule); with security on, creating and
deleting (SPARQL of the sender's choosing) is for this board only (4.03 from the network): an
authenticated sensor follows what the deployment exposes. Refusals are counted by code.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import aiocoap
from aiocoap import Code
from aiocoap.numbers.contentformat import ContentFormat
from aiocoap.pipe import Pipe
from aiocoap.resource import Resource
from aiocoap.util.linkformat import Link, LinkFormat

from adapters.coap import formats, results
from adapters.coap.access import Access, network_peer
from adapters.coap.blockwise import assemble_with_refusals, bound_block2
from adapters.coap.errors import Refused, refusal
from adapters.coap.query_checks import NAME, QueryLimits
from adapters.coap.readings import UNAUTHENTICATED
from broker.api import Notification
from gateway.client import ClientSubscription, SepaClient, SepaClientError
from gateway.observations.counters import SourceCounters

WINDOW = 16  # messages aiocoap may hold for one observer before its notifications wait here
WINDOW_BYTES = 16_384  # ...and bytes: what one observer may have handed aiocoap and not had acknowledged
PEER_WINDOW_BYTES = 65_536  # the same for all the observers of one network peer (an OSCORE sensor, an address)
MAX_PENDING = 256  # notifications one observer may have waiting here before it gets the complete result instead
POLL_S = 0.05  # how often a waiting observer looks whether aiocoap caught up
# ...doubled at each look that found it still behind, up to POLL_MAX_S: ~1,000 observers whose peers
# never acknowledge each woke 20 times a second (queued_messages, asyncio.sleep: ~100,000 looks, the
# event loop's largest cost in a profile of that attack); a peer that catches up waits at most this
POLL_MAX_S = 0.8
PARTS_CACHED = 8  # notifications whose parts a query keeps (per content format and sequence), shared by its observers
HISTORY = 64  # notifications a query keeps after its shared complete result (see NamedQuery.start), < MAX_PENDING
# A GET's complete result is encoded again, for a newer sequence, only once this many times the time
# its last encoding took has passed: encoding GETs take at most a tenth of the event loop per query
# and format (see NamedQuery.document)
ENCODE_SPACING = 9
# An observer that nothing was sent to for CHECK_S gets the complete result again, confirmable (RFC
# 7641 §4.5 asks for one at least every 24 h): aiocoap ends the observation when its peer is gone.
# Every notification is confirmable, so only the observers of a quiet subscription need it; an
# observation abandoned without a deregistration (a rebooted actuator observing again from a new
# port) held its slot until the subscription next changed: 1,000 abandoned observations of a quiet
# /q/NAME (a churn pass) filled every slot, and every later observer got 5.03 for good.
CHECK_S = 86_400.0
# When the slots are full, the observers idle for PROBE_IDLE_S are checked at once (at most once per
# PROBE_EVERY_S, the Max-Age of the 5.03 the refused client gets, and each at most once per
# PROBE_SPACING_S, so that a client refused again and again cannot have live observers sent their
# complete result at its pace).
PROBE_IDLE_S = 60.0
PROBE_EVERY_S = 30.0
PROBE_SPACING_S = 600.0
# a refused subscribe (SEPA status) as the CoAP code of a refused creation; any other: 5.03
_CREATE_CODES = {400: Code.BAD_REQUEST, 413: Code.REQUEST_ENTITY_TOO_LARGE}


def queued_messages(context: aiocoap.Context | None, remote: Any) -> int:
    """How many messages aiocoap holds back for `remote`, waiting for the one in flight to be acknowledged.

    aiocoap keeps one confirmable message in flight per peer (NSTART = 1) and queues the rest
    without bound, with no public way to see them; this reads the queue of its message manager
    (aiocoap 0.4), and finds nothing (0: never behind) if a later aiocoap keeps it elsewhere.
    """
    if context is None:
        return 0
    # An OSCORE request's remote wraps the UDP address the protected messages go to, which is
    # what aiocoap queues them under: unwrapped, else an OSCORE observer would never be held back.
    remote = getattr(remote, "underlying_address", None) or remote
    held = 0
    for interface in context.request_interfaces:
        backlogs = getattr(getattr(interface, "token_interface", None), "_backlogs", None)
        if isinstance(backlogs, dict):
            held += len(backlogs.get(remote, ()))
    return held


def observe_limit(request: aiocoap.Message) -> int:
    """The largest payload an observer's messages carry: the block size its registration asked for
    (Block2, RFC 7959 §2.4: a client states the largest it can take), at most MESSAGE_BYTES.

    Why: the size asked for was ignored; an observer registering with Block2 of 256 bytes (a
    constrained device's buffer) got payloads of 984, 970 and 689 bytes for a 40-row result, and one
    of an OSCORE sensor asking 16 bytes 992-byte ones: a device that cannot take them does not
    acknowledge them, and the observation ends after aiocoap's retransmissions. Now each message is
    cut within the size asked for, as far as the rows allow (a part holds at least one row)."""
    block2 = request.opt.block2
    return results.MESSAGE_BYTES if block2 is None else min(results.MESSAGE_BYTES, block2.size)


def pipe_ended(pipe: Any) -> bool:
    """Whether aiocoap's pipe has ended (its peer's interest is gone). Pipe has no public flag: it
    marks an ended pipe by setting its callbacks to False (aiocoap 0.4)."""
    return getattr(pipe, "_event_callbacks", None) is False


class NamedQuery:
    """One named subscription and the observers following it."""

    def __init__(self, name: str, sparql: str, *, configured: bool) -> None:
        self.name = name
        self.sparql = sparql
        self.configured = configured
        self.subscription: ClientSubscription | None = None
        self.observers: set[Observer] = set()
        self._payloads: dict[int, tuple[int, bytes, float]] = {}  # content format -> (sequence, result, next at)
        # (format, part size, sequence, complete) -> payloads
        self._parts: dict[tuple[int, int, int, bool], list[bytes]] = {}
        # (format, part size) -> (sequence, complete parts, next at)
        self._starts: dict[tuple[int, int], tuple[int, list[bytes], float]] = {}
        self._history: deque[Notification] = deque(maxlen=HISTORY)  # delivered after the oldest of _starts
        self.cuts = 0  # complete results cut into parts for observers

    def notified(self, notification: Notification) -> None:
        if self._starts:
            oldest = min(sequence for sequence, _, _ in self._starts.values())
            while self._history and self._history[0].sequence <= oldest:
                self._history.popleft()
            self._history.append(notification)
        for observer in list(self.observers):
            observer.offer(notification)

    def start(
        self, content_format: int, limit: int = results.MESSAGE_BYTES
    ) -> tuple[int, list[bytes], list[Notification]]:
        """Where an observer starts: (sequence, the parts of the complete result at it, the
        notifications delivered after it, in order). The complete result is cut once per sequence,
        and at most every ENCODE_SPACING times its cut's time, as a GET's document is; in between,
        observers start from the last one cut and get the changes since then from the history.

        Why: each observer that started after a change cut the whole result again, with the event
        loop held (866 KB: ~66 ms, 1.5 MB: ~215 ms): 300 observers registering 4 ms apart while a
        1.5 MB result changed every 20 ms were 61 cuts, 32 s of loop stalls over 10 ms; now 1.2 s.
        Nothing is skipped: the complete result and the notifications after it are the state at
        the last notification delivered."""
        cached = self._starts.get((content_format, limit))
        now = time.monotonic()
        if cached is None or (cached[0] != self.sequence and (now >= cached[2] or not self._covers(cached[0]))):
            current = self.complete()
            parts = results.notification_parts(current, content_format, complete=True, limit=limit)
            self.cuts += 1
            cached = (current.sequence, parts, now + (time.monotonic() - now) * (1 + ENCODE_SPACING))
            self._starts[content_format, limit] = cached
        sequence, parts = cached[0], cached[1]
        return sequence, parts, [notification for notification in self._history if notification.sequence > sequence]

    def _covers(self, sequence: int) -> bool:
        """Whether the history holds every notification delivered after `sequence`. Sequences are
        consecutive; the history is empty until a complete result is cut (none were delivered then)."""
        return not self._history or self._history[0].sequence <= sequence + 1

    def document(self, content_format: int) -> tuple[int, bytes]:
        """(sequence, result document in `content_format`) for a GET: the complete result, encoded
        once per sequence, and at most every ENCODE_SPACING times its encoding's time.

        Why once per sequence: aiocoap keeps a block-wise response whole, for each peer, until its
        last block may have been asked (93-186 s); encoded per GET, every peer's copy was its own
        (300 GETs of a 257 KB result kept 77 MB). One bytes object per sequence is shared by all.
        Why spaced: a result that changes (every reading changes an observations query's) was
        encoded again at the next GET, with the event loop held: one client GETting a 3.4 MB
        result while an HTTP client updated every 0.2 s took those updates from p50 7 ms (max 114)
        to p50 377 ms (max 1.2 s). In between, a GET gets the last result encoded, whole and
        consistent, with that result's sequence as its ETag."""
        cached = self._payloads.get(content_format)
        now = time.monotonic()
        if cached is None or (cached[0] != self.sequence and now >= cached[2]):
            current = self.complete()
            encoded = results.results_payload(current, content_format)
            cost = time.monotonic() - now
            cached = (current.sequence, encoded, now + cost * (1 + ENCODE_SPACING))
            self._payloads[content_format] = cached
        return cached[0], cached[1]

    @property
    def sequence(self) -> int:
        """The sequence of the current result."""
        assert self.subscription is not None
        return max(self.subscription.sequence, 0)

    def parts(
        self, notification: Notification, content_format: int, *, complete: bool, limit: int = results.MESSAGE_BYTES
    ) -> list[bytes]:
        """The payloads of `notification` for an observer, cut once per sequence and format.

        Why: every observer cut the complete result anew when it started (and each delta when it
        came), and held its own list of parts until it had sent them all: 100 observers of a 730 KB
        result were 100 copies and 100 cuts of it (66 ms each, with the event loop held). One list
        is shared by the observers of a sequence; the last PARTS_CACHED are kept."""
        key = (content_format, limit, notification.sequence, complete)
        found = self._parts.get(key)
        if found is None:
            found = results.notification_parts(notification, content_format, complete=complete, limit=limit)
            if len(self._parts) >= PARTS_CACHED:
                del self._parts[next(iter(self._parts))]
            self._parts[key] = found
        return found

    def complete(self) -> Notification:
        """The current result as one notification at the subscription's current sequence."""
        assert self.subscription is not None and self.subscription.view is not None
        view = self.subscription.view
        return Notification(
            "",
            self.name,
            self.sequence,
            view.variables,
            tuple(view.rows.elements()),
            boolean=view.boolean,
        )


def fell_behind_counters() -> SourceCounters:
    """Observers that fell behind, counted per resource and logged as bad input is: at most a line a
    minute each, with the count. Why: one warning line per observer each time, and 40 observers of
    this board that acknowledged nothing wrote 40 lines in a second at the 257th change (1,000
    observers: 1,000 lines, again whenever they fell behind again)."""
    return SourceCounters(label="coap: observers fell behind on")


class Observer:
    """One observation of a named query: its own queue, sent in order into the request's pipe."""

    def __init__(
        self,
        query: NamedQuery,
        pipe: Pipe,
        content_format: int,
        held: Callable[[], int],
        peer_room: Callable[[Observer, int], bool] | None = None,
        behind: SourceCounters | None = None,
        limit: int = results.MESSAGE_BYTES,
    ) -> None:
        self.query = query
        self.limit = limit  # the payload size of its messages (observe_limit), where the rows allow
        self.behind = behind or fell_behind_counters()  # the resource's, shared by its observers
        self.pipe = pipe
        self.content_format = content_format
        self.held = held  # messages aiocoap still holds for this peer
        self.peer_room = peer_room or (lambda _observer, _size: True)  # the peer's share (PEER_WINDOW_BYTES)
        self.outbox: deque[Notification] = deque()
        self.covered = -1  # the last sequence sent (or covered by a complete result)
        self.resync = True  # the next message is the complete result (the first one is)
        self.resyncs = 0  # times it fell behind
        self.messages = 0
        self.sizes: deque[int] = deque(maxlen=WINDOW + 1)  # payload sizes of the last messages sent
        self.final: aiocoap.Message | None = None
        self.wake = asyncio.Event()
        self.last_sent = time.monotonic()  # the first message goes at once
        self.probed_at = float("-inf")
        self.pause = POLL_S  # the wait before the next look whether aiocoap caught up (POLL_MAX_S)

    def probe(self, now: float) -> bool:
        """Send the complete result again, confirmable, unless this observer was probed within
        PROBE_SPACING_S: a peer that is gone does not acknowledge it, and aiocoap ends the
        observation (see CHECK_S). Whether it was probed."""
        if now - self.probed_at < PROBE_SPACING_S:
            return False
        self.probed_at = now
        self.outbox.clear()
        self.resync = True
        self.wake.set()
        return True

    def offer(self, notification: Notification) -> None:
        if notification.sequence <= self.covered or self.resync:
            return  # in the complete result already, or about to be
        if len(self.outbox) >= MAX_PENDING:
            self.outbox.clear()
            self.resync = True
            self.resyncs += 1
            self.behind.add(f"/q/{self.query.name}", "an observer fell behind; it gets the complete result")
        else:
            self.outbox.append(notification)
        self.wake.set()

    def end(self, response: aiocoap.Message) -> None:
        """Send `response` (an error: it ends the observation, RFC 7641 §3.2) and stop."""
        self.final = response
        self.wake.set()

    def unacknowledged(self) -> int:
        """Bytes of this observer's messages aiocoap holds queued for its peer's address (`held`,
        shared with other observations from that address: an overestimate then), taken from the sizes
        of the last messages sent. The one in flight (one per address: aiocoap's NSTART is 1) is not
        counted: aiocoap shows no public sign of its acknowledgement, and counted while waiting, the
        last part of each of 100 observations of one peer held the peer's share full for good."""
        count = min(self.held(), len(self.sizes))
        return sum(self.sizes[index] for index in range(len(self.sizes) - count, len(self.sizes)))

    def window(self) -> int:
        """The messages aiocoap may hold queued for this observer: one more than it has seen
        acknowledged (those handed over, less those held and the one in flight), up to WINDOW.

        Why: every observer had WINDOW messages queued in aiocoap at once, acknowledged or not, and
        aiocoap's work per message queued grows with the peers it has messages in flight to (it
        looks through all of them: 1.5 M comparisons, 5.8 s of a profile): ~800 raw observers that
        never acknowledged were ~14,600 messages, HTTP updates p50 25 ms, p90 796 ms. A peer that
        acknowledges opens its window one message per acknowledgement; one that never does is
        handed three (the first, the one in flight, one queued)."""
        return min(WINDOW, max(1, self.messages - self.held() - 1))

    def room(self, size: int) -> bool:
        """Whether a message of `size` bytes may be handed to aiocoap now: within WINDOW messages and
        WINDOW_BYTES for this observer, and the peer's PEER_WINDOW_BYTES. The first message never waits."""
        if not self.messages:
            return True
        if self.held() >= self.window() or self.unacknowledged() + size > WINDOW_BYTES:
            return False
        return self.peer_room(self, size)

    def interested(self) -> bool:
        """False once aiocoap's pipe has ended: the client cancelled, aiocoap gave up retransmitting, or
        (OSCORE) the wrapper stopped reading. aiocoap then cancels this task at its next await; a
        response added before that was logged as a warning, or (OSCORE) failed with a TypeError inside
        aiocoap's pipe."""
        return not pipe_ended(self.pipe)

    def _add(self, message: aiocoap.Message, *, is_last: bool) -> None:
        """Hand `message` to aiocoap's pipe.

        Why the TypeError: when sending fails at once (the peer's port is closed and the socket
        holds its ICMP error), aiocoap ends the pipe inside add_response and then reads its ended
        callback list (aiocoap 0.4.17 `Pipe._add_event`): a TypeError out of the observation's
        task, then a second one from aiocoap's own log call ("Task exception was never
        retrieved", two tracebacks in the log per observer whose peer went away). The
        observation has ended: nothing more to do. Check it again on an aiocoap upgrade."""
        try:
            self.pipe.add_response(message, is_last=is_last)
        except TypeError:
            if self.interested():
                raise

    async def _behind(self) -> None:
        """Wait before looking again whether aiocoap caught up: longer at each look that found it
        behind (POLL_S doubled, up to POLL_MAX_S), POLL_S again once a message went."""
        await asyncio.sleep(self.pause)
        self.pause = min(self.pause * 2, POLL_MAX_S)

    async def run(self) -> None:
        """Send the complete result, then every notification, until the observation ends.

        The observation ends when the client cancels it, stops acknowledging (aiocoap gives up after
        its retransmissions and cancels this task), or the subscription is deleted.

        Why each part is its own step, waiting for room and yielding to the event loop: the parts of
        one notification were handed to aiocoap in one synchronous loop, the window looked at only
        between notifications. A 730 KB result is ~800 parts; 100 OSCORE observers that never
        acknowledged (one sensor's share) each had it encrypted and queued at once: the gateway
        answered nothing for ~125 s (/metrics timed out at 30 s, twice), RSS 150 -> 368 MB, kept.
        Now /metrics answers within 0.2 s throughout, RSS 157 -> 159 MB.
        """
        while True:
            if self.final is not None:
                if self.interested():
                    self._add(self.final, is_last=True)
                return
            if not self.interested():
                return
            if not self.outbox and not self.resync:
                try:
                    async with asyncio.timeout(CHECK_S):
                        await self.wake.wait()
                except TimeoutError:
                    self.probe(time.monotonic())
                self.wake.clear()
                continue
            if self.messages and self.held() >= self.window():
                await self._behind()
                continue
            if self.resync:
                self.resync = False
                self.covered, payloads, after = self.query.start(self.content_format, self.limit)
                self.outbox = deque(after)  # delivered after the complete result: newer than any offered later
            else:
                notification = self.outbox.popleft()
                self.covered = notification.sequence
                payloads = self.query.parts(notification, self.content_format, complete=False, limit=self.limit)
            for payload in payloads:
                while not self.room(len(payload)):
                    if self.final is not None or not self.interested():
                        break
                    await self._behind()
                if self.final is not None or not self.interested():
                    break  # the final response, or nothing, ends it at the top of the loop
                self._add(
                    aiocoap.Message(
                        code=Code.CONTENT,
                        payload=payload,
                        content_format=self.content_format,
                        observe=self.messages & 0xFFFFFF,
                        transport_tuning=aiocoap.Reliable(),
                    ),
                    is_last=False,
                )
                self.messages += 1
                self.pause = POLL_S
                self.sizes.append(len(payload))
                self.last_sent = time.monotonic()
                await asyncio.sleep(0)  # aiocoap (and OSCORE's wrapper) take it before the next is weighed


class PeerShare:
    """What one network peer's observers may have handed aiocoap and not had acknowledged, together
    (PEER_WINDOW_BYTES). Why: each observer's own window is per address, and one OSCORE sensor may
    observe from `max_observers_per_peer` (100) ports at once, each with its window of ~17 KB held.

    The sum over the peer's observers is taken at most every POLL_S / 2 (100 observers waiting would
    otherwise each sum all 100, 20 times a second), and what is let through between two sums is
    added to it."""

    def __init__(self) -> None:
        self.observers: set[Observer] = set()
        self.used = 0
        self.at = float("-inf")

    def room(self, _observer: Observer, size: int) -> bool:
        now = asyncio.get_running_loop().time()
        if now - self.at >= POLL_S / 2:
            self.used = sum(observer.unacknowledged() for observer in self.observers)
            self.at = now
        if self.used + size > PEER_WINDOW_BYTES:
            return False
        self.used += size
        return True


class QueriesResource(Resource):
    """`/q` and every `/q/NAME` (the site hands over requests with `q` stripped from the path)."""

    def __init__(
        self,
        client: SepaClient,
        access: Access,
        *,
        configured: Sequence[tuple[str, str]] = (),
        limits: QueryLimits | None = None,
        context: Callable[[], aiocoap.Context | None] = lambda: None,
        peer_client: SepaClient | None = None,
        counters: SourceCounters | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        # bad input per resource: the readings' counters, so that /metrics has one table of every resource
        self.counters = counters or SourceCounters(label="coap: bad input on resource")
        self.peer_client = peer_client or client  # limited like a network client: for POSTed queries
        self.access = access
        self.configured = list(configured)
        self.limits = limits or QueryLimits()
        self.context = context
        self.queries: dict[str, NamedQuery] = {}
        self.creating: set[str] = set()  # names whose subscribe is under way
        self.observers: set[Observer] = set()
        self.observing: Counter[str] = Counter()  # observations per network peer (network_peer)
        self.shares: dict[str, PeerShare] = {}  # per network peer with observations
        self.requests = 0
        self.created = 0
        self.deleted = 0
        self.messages = 0  # notification messages handed to aiocoap, observers that ended included
        self.resyncs = 0
        self.behind = fell_behind_counters()
        self.probed = 0  # observers sent the complete result to check that they are still there
        self._probed_at = float("-inf")
        self.refused: Counter[str] = Counter()
        assemble_with_refusals(self, lambda request, refused: self._refusal(refused, request.opt.uri_path))
        self.block2 = bound_block2(self)

    async def start(self) -> None:
        """Subscribe the configured queries (a refusal stops the start: the config is wrong)."""
        for name, sparql in self.configured:
            query = NamedQuery(name, sparql, configured=True)
            try:
                await self._subscribe(query)
            except SepaClientError as error:
                await self.stop()
                raise ValueError(f"coap.subscriptions ({name}): {error.error_description}") from None
            self.queries[name] = query

    async def stop(self) -> None:
        for query in list(self.queries.values()):
            await self._end(query, "the gateway is stopping", Code.SERVICE_UNAVAILABLE)
        self.queries.clear()

    async def _subscribe(self, query: NamedQuery) -> None:
        """A configured query is the deployment's (trusted); one POSTed by a peer runs with the time
        limits of a WebSocket client's (probed in the query workers first: 503 past the limit)."""
        client = self.client if query.configured else self.peer_client
        query.subscription = await client.subscribe(
            query.sparql, f"coap-q-{query.name}", on_notification=query.notified
        )

    async def _end(self, query: NamedQuery, reason: str, code: Code) -> None:
        for observer in list(query.observers):
            observer.end(refusal(code, reason))
        if query.subscription is not None:
            await query.subscription.unsubscribe()
            query.subscription = None

    # -- the resource ------------------------------------------------------------------------------

    def links(self) -> list[Link]:
        """`/q` and its subscriptions, for /.well-known/core."""
        found = [Link("/q", ct=str(int(ContentFormat.LINKFORMAT)))]
        return found + [Link(f"/q/{name}", obs=None, ct="50 60") for name in sorted(self.queries)]

    async def needs_blockwise_assembly(self, request: aiocoap.Message) -> bool:
        """Assemble a block-wise POST only while it stays under the SPARQL limit (aiocoap's spool has
        none), and only from a peer that is not refused 4.01 (it gets that at its first block)."""
        return self.access.admits(request) and not self._too_large(request)

    def _too_large(self, request: aiocoap.Message) -> bool:
        block1 = request.opt.block1
        reached = (block1.start if block1 is not None else 0) + len(request.payload)
        return max(reached, request.opt.size1 or 0) > self.limits.max_sparql_bytes

    async def render_to_pipe(self, pipe: Pipe) -> None:
        request = pipe.request
        block2 = request.opt.block2
        if (
            request.code != Code.GET
            or request.opt.observe != 0
            or len(request.opt.uri_path) != 1
            or (block2 is not None and block2.block_number > 0)
        ):
            await super().render_to_pipe(pipe)
            return
        self.requests += 1
        try:
            query, content_format = self._readable(request)
            if len(self.observers) >= self.limits.max_observers:
                self._probe_idle(self.observers)
                raise Refused(Code.SERVICE_UNAVAILABLE, f"{len(self.observers)} observations already")
            peer = network_peer(request)
            if peer is not None and self.observing[peer] >= self.limits.max_observers_per_peer:
                self._probe_idle(self.shares[peer].observers)
                raise Refused(Code.SERVICE_UNAVAILABLE, f"{self.observing[peer]} observations by this peer already")
        except Refused as refused:
            pipe.add_response(self._refusal(refused, request.opt.uri_path), is_last=True)
            return
        share = self.shares.setdefault(peer, PeerShare()) if peer is not None else None
        # Once, not at every look: aiocoap parses the address again each time (ipaddress), and the
        # looks of ~800 waiting observers (every POLL_S each) took 6.4 s of a 48 s profile (#2 cost).
        address = request.remote.as_response_address()
        observer = Observer(
            query,
            pipe,
            content_format,
            lambda: queued_messages(self.context(), address),
            share.room if share is not None else None,
            self.behind,
            observe_limit(request),
        )
        query.observers.add(observer)
        self.observers.add(observer)
        if peer is not None and share is not None:
            self.observing[peer] += 1
            share.observers.add(observer)
        try:
            await observer.run()
        finally:
            query.observers.discard(observer)
            self.observers.discard(observer)
            if peer is not None and share is not None:
                share.observers.discard(observer)
                self.observing[peer] -= 1
                if not self.observing[peer]:
                    del self.observing[peer]
                    del self.shares[peer]
            self.messages += observer.messages
            self.resyncs += observer.resyncs

    def _probe_idle(self, observers: Iterable[Observer]) -> None:
        """The slots are full: check the `observers` idle for PROBE_IDLE_S (see CHECK_S), so that
        the refused client, coming back after the 5.03's Max-Age, finds the abandoned ones gone."""
        now = time.monotonic()
        if now - self._probed_at < PROBE_EVERY_S:
            return
        self._probed_at = now
        idle = [observer for observer in observers if now - observer.last_sent >= PROBE_IDLE_S]
        self.probed += sum(observer.probe(now) for observer in idle)

    async def render(self, request: aiocoap.Message) -> aiocoap.Message:
        self.requests += 1
        try:
            return await super().render(request)
        except Refused as refused:
            return self._refusal(refused, request.opt.uri_path)

    def _refusal(self, refused: Refused, path: tuple[str, ...]) -> aiocoap.Message:
        """The response to a refused request, counted per code and per resource (`path` is below
        /q). Why per resource: bad input is counted per CoAP resource (sepa_coap_bad_input_by_resource);
        a SPARQL POST refused 4.00 or a GET of no subscription was counted only by code. Under "q"
        unless it names a subscription that exists, under "(unauthenticated)" when refused 4.01, as
        the readings do: names are anyone's to make up, and must not take the slots of real ones."""
        self.refused[refused.code.dotted] += 1
        if refused.code == Code.UNAUTHORIZED:
            resource = UNAUTHENTICATED
        else:
            resource = f"q/{path[0]}" if path and path[0] in self.queries else "q"
        self.counters.add(resource, f"{refused.code.dotted} {refused}")
        options: dict[str, Any] = {}
        if refused.code == Code.REQUEST_ENTITY_TOO_LARGE:
            options["size1"] = self.limits.max_sparql_bytes
        elif refused.code == Code.SERVICE_UNAVAILABLE:
            options["max_age"] = 30
        return refusal(refused.code, str(refused), **options)

    def _readable(self, request: aiocoap.Message) -> tuple[NamedQuery, int]:
        """The query a GET names and the format to answer in, or Refused."""
        (name,) = request.opt.uri_path
        self.access.check(request, f"q/{name}")
        query = self.queries.get(name)
        if query is None or query.subscription is None:
            raise Refused(Code.NOT_FOUND, f"no subscription /q/{name}"[:200])
        content_format = results.wanted_format(request.opt.accept)
        if content_format is None:
            raise Refused(Code.NOT_ACCEPTABLE, "results are application/json (50) or application/cbor (60)")
        return query, content_format

    async def render_get(self, request: aiocoap.Message) -> aiocoap.Message:
        if not request.opt.uri_path:
            self.access.check(request, "q")
            links = LinkFormat([Link(f"/q/{name}", obs=None) for name in sorted(self.queries)])
            return aiocoap.Message(payload=str(links).encode(), content_format=ContentFormat.LINKFORMAT)
        if len(request.opt.uri_path) != 1:
            raise Refused(Code.NOT_FOUND, "subscriptions are /q/NAME")
        query, content_format = self._readable(request)
        sequence, payload = query.document(content_format)
        etag = sequence.to_bytes(8, "big")
        if etag in request.opt.etags:  # the client holds this result: 2.03 Valid, no payload (RFC 7252 §5.10.6.2)
            return aiocoap.Message(code=Code.VALID, etag=etag)
        return aiocoap.Message(payload=payload, content_format=content_format, etag=etag)

    async def render_post(self, request: aiocoap.Message) -> aiocoap.Message:
        if request.opt.uri_path:
            raise Refused(Code.METHOD_NOT_ALLOWED, "POST SPARQL to /q to create a subscription")
        self.access.check(request, "q")
        self.access.check_local(request, "q")
        if self._too_large(request) or (request.opt.block1 is not None and request.opt.block1.more):
            raise Refused(Code.REQUEST_ENTITY_TOO_LARGE, f"SPARQL is limited to {self.limits.max_sparql_bytes} bytes")
        if request.opt.content_format not in (None, formats.TEXT_PLAIN):
            raise Refused(Code.UNSUPPORTED_CONTENT_FORMAT, "POST the SPARQL query as text/plain (0)")
        try:
            sparql = request.payload.decode()
        except UnicodeDecodeError:
            raise Refused(Code.BAD_REQUEST, "the SPARQL is not UTF-8") from None
        name = self._name(request)
        existing = self.queries.get(name)
        if existing is not None or name in self.creating:
            if existing is not None and existing.sparql == sparql:
                return aiocoap.Message(code=Code.CREATED, location_path=("q", name))
            raise Refused(Code.CONFLICT, f"/q/{name} exists with another query")
        created = sum(not query.configured for query in self.queries.values()) + len(self.creating)
        if created >= self.limits.max_created:
            raise Refused(Code.SERVICE_UNAVAILABLE, f"{created} subscriptions were created over CoAP already")
        query = NamedQuery(name, sparql, configured=False)
        self.creating.add(name)
        try:
            await self._subscribe(query)
        except SepaClientError as error:
            code = _CREATE_CODES.get(error.status_code, Code.SERVICE_UNAVAILABLE)
            raise Refused(code, error.error_description or error.error) from None
        finally:
            self.creating.discard(name)
        self.queries[name] = query
        self.created += 1
        return aiocoap.Message(code=Code.CREATED, location_path=("q", name))

    def _name(self, request: aiocoap.Message) -> str:
        for option in request.opt.uri_query:
            key, _, value = option.partition("=")
            if key == "name":
                if not NAME.fullmatch(value):
                    raise Refused(Code.BAD_REQUEST, "name: 1-64 of A-Z a-z 0-9 . _ -")
                return value
        while True:
            name = secrets.token_hex(4)
            if name not in self.queries and name not in self.creating:
                return name

    async def render_delete(self, request: aiocoap.Message) -> aiocoap.Message:
        if len(request.opt.uri_path) != 1:
            raise Refused(Code.METHOD_NOT_ALLOWED, "DELETE /q/NAME")
        (name,) = request.opt.uri_path
        self.access.check(request, f"q/{name}")
        self.access.check_local(request, f"q/{name}")
        query = self.queries.get(name)
        if query is None:
            raise Refused(Code.NOT_FOUND, f"no subscription /q/{name}"[:200])
        if query.configured:
            raise Refused(Code.METHOD_NOT_ALLOWED, f"/q/{name} is configured ([[coap.subscriptions]])"[:200])
        del self.queries[name]
        with contextlib.suppress(SepaClientError):
            await self._end(query, f"/q/{name} was deleted", Code.NOT_FOUND)
        self.deleted += 1
        return aiocoap.Message(code=Code.DELETED)

    def metrics(self) -> dict[str, int]:
        return {
            "q_requests": self.requests,
            "q_subscriptions": len(self.queries),
            "q_created": self.created,
            "q_deleted": self.deleted,
            "q_observers": len(self.observers),
            "q_messages": self.messages + sum(observer.messages for observer in self.observers),
            "q_resyncs": self.resyncs + sum(observer.resyncs for observer in self.observers),
            "q_observers_probed": self.probed,
            "q_block2_dropped": self.block2.dropped,
            **{f"q_refused_{code.replace('.', '_')}": count for code, count in sorted(self.refused.items())},
        }
