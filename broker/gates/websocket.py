"""WebSocket gate: the SPARQL 1.1 Subscribe Language over JSON text frames (PROTOCOL.md).

Each connection has its own bounded outgoing queue drained by its own writer task, so a slow or
stalled subscriber never delays the update path or anyone else: the engine thread only appends
to the queue (via the event loop). When a queue overflows, that connection is closed with a
logged reason; a notification is never dropped while the client stays connected. Closing a
socket, or failing to answer pings (aiohttp heartbeat), ends all of its subscriptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from broker.core.notification import Notification
from broker.errors import InvalidRequest, ResultTooLarge, SepaError
from broker.gates.budget import PerAddress
from broker.gates.coalesce import MAX_COALESCE_MS, Coalescing, coalesce_interval
from broker.gates.connections import peer_host
from broker.gates.errors import error_body
from broker.gates.quota import SubscriptionQuota
from broker.gates.slow import GuardedHandler
from broker.handoff import loop_handoff
from broker.quiet_log import QuietLog
from broker.scheduler import Scheduler
from broker.security.authority import Principal
from broker.security.failures import TooManyFailures
from broker.sparql.terms import TooLarge
from broker.sparql.tokens import unescape_iris

log = logging.getLogger(__name__)
# one line a minute at most, with the count since: a client that opens socket after socket and never
# reads them wrote a warning for each (sepa_ws_slow_subscribers_disconnected_total counts them all)
SLOW_SUBSCRIBERS = QuietLog(log, "disconnecting slow subscriber: outgoing queue full", level=logging.WARNING)
# the sockets cut because every socket's queues together reached [websocket] queue_bytes_total (QueuedTotal)
QUEUES_FULL = QuietLog(
    log,
    "disconnecting the subscriber holding the most queued: the gateway's outgoing queues are full",
    level=logging.WARNING,
)
# the secure sockets closed because none of their messages carried a valid token in time (WebSocketGate)
UNAUTHENTICATED = QuietLog(log, "closing a secure socket that made no authenticated request in time")
# messages of one socket handled at once; past it the socket is not read (see Connection.turn).
# 3 and 8 subscribed as fast (`bench reeval`: 11-12.5 s and 10.6-11.4 s); fewer probes of one socket
# in the query pool leave more of it to other clients
MESSAGES_AHEAD = 3
# what a subscribe may name beside its SPARQL: 1 MB aliases held 1.5 GB for one client (1,500
# subscriptions of ASK {}), and 15,000 named graphs per subscribe ~3.5 MB each, and made every
# update re-evaluate them for seconds; both are counted in the subscription quota as well
MAX_ALIAS_CHARS = 1024
MAX_DATASET_GRAPHS = 100


# A JSON escape of a UTF-16 surrogate: json.loads pairs two into one character, and leaves one alone
# as an unpaired surrogate, which no UTF-8 encoder takes (a lone "\ud800" in a subscribe's SPARQL
# or authorization was a 500 internal_error: the first encode raised past the handlers)
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _is_text(message: Any) -> bool:
    """Whether every string of the parsed `message` is encodable text (no unpaired surrogate)."""
    try:
        json.dumps(message, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(slots=True)
class QueuedShare:
    """What the sockets of one address have queued together, their messages being written included
    (see :meth:`Connection.push`)."""

    rows: int = 0
    bytes: int = 0

    def add(self, rows: int, characters: int) -> None:
        self.rows += rows
        self.bytes += characters


def queued_shares() -> PerAddress[QueuedShare]:
    """The queued shares of the addresses off this board, one for the plain and secure gates."""
    return PerAddress(QueuedShare)


class QueuedTotal:
    """The characters every socket has queued, plain and secure, loopback included, their messages
    being written counted until the transport took them; at most `limit` (None: no bound).

    Why: each socket's queue is bounded (`queue_bytes`), and an address's sockets together, but not
    all of them: a socket of this board (loopback: a reverse proxy, a local tool) is a share of its
    own, and 100 loopback sockets that subscribed and never read took the gateway to 2.97 GB of RSS
    before their stalled writes cut them 20 s later (500,000-character notifications, 60 updates:
    /tmp/atk-exhaust/f4.py, 2026-12-06). Past the bound, the socket holding the most is cut (the
    one a message is for, counting that message), until the message fits: whoever queues the most
    pays, a client reading as it should holds next to nothing and is not touched."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.bytes = 0
        self.connections: set[Connection] = set()

    def make_room(self, pusher: Connection, characters: int) -> bool:
        """Cut the sockets holding the most until `characters` more for `pusher` fit; False when
        `pusher` was cut. It is cut when it would then hold the most; a message is taken whatever
        its size when nothing else is held (its characters are bounded where it is written,
        `max_notification_bytes`)."""
        limit = self.limit
        while limit is not None and self.bytes + characters > limit:
            victim = max(self.connections, key=lambda connection: connection.held_bytes, default=pusher)
            if pusher.held_bytes + characters >= victim.held_bytes:
                victim = pusher
            if victim is pusher and self.bytes == 0:
                return True
            victim.overflow(QUEUES_FULL, b"the gateway's outgoing queues are full: read faster")
            if victim is pusher:
                return False
        return True


class Connection:
    """One client socket: its subscriptions and its outgoing queue."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        limit: int,
        peer: str,
        transport: asyncio.BaseTransport | None = None,
        row_limit: int | None = None,
        byte_limit: int | None = None,
        share: QueuedShare | None = None,
        total: QueuedTotal | None = None,
    ) -> None:
        """`limit`, `row_limit`, `byte_limit`: the messages, the rows of the notifications, and the
        characters of their text, queued for this client before it is disconnected (see
        :meth:`push`); `share`: its address's, for the rows and characters of all its sockets;
        `total`: every socket's characters together."""
        self.ws = ws
        self.limit = limit
        self.row_limit = row_limit
        self.byte_limit = byte_limit
        self.share = share
        self.total = total
        self.queued_rows = 0
        self.queued_bytes = 0
        self.writing: tuple[int, int] = (0, 0)  # the rows and characters of the message being written
        self.peer = peer
        self.transport = transport
        # the address its failed authentications are counted under (None: this board; peer_host)
        self.host = peer_host(transport) if transport is not None else peer
        # the text of each message queued, and the rows it carries
        self.pending: deque[tuple[str, int]] = deque()
        # subscriptions ended (a notification too large, revoked rights, ended by the engine): what
        # the engine still sends for them is dropped
        self.ended: set[str] = set()
        self.ready = asyncio.Event()
        self.subscriptions: dict[str, str | None] = {}  # spuid -> alias
        self.owners: dict[str, Principal] = {}  # spuid -> the secure client that subscribed
        self.held: dict[str, tuple[str, int]] = {}  # spuid -> (client, bytes) taken from the quota
        self.coalescing: dict[str, Coalescing] = {}  # spuid -> when its notifications go (coalesce_ms)
        self.closing = False
        self.dropping: asyncio.Future[None] | None = None
        # secure gates: whether a message of it carried a valid token, and when it is closed if none does
        self.authenticated = False
        self.deadline: asyncio.TimerHandle | None = None
        self.protocol: object = None  # its aiohttp protocol (GuardedHandler.spare once authenticated)
        self.slots = asyncio.Semaphore(MESSAGES_AHEAD)
        self.tasks: set[asyncio.Task[None]] = set()
        self._last_turn: asyncio.Future[None] | None = None

    def turn(self) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """A message's place in the order of this socket's subscribes: (the previous message's
        turn, this one's), each done once its message queued its subscribe or gave up.

        Why: the messages of a socket are handled side by side (up to MESSAGES_AHEAD), so that
        the probe of a subscribe (in a query worker) overlaps the engine's work on the one before;
        handled one at a time, 1,000 subscribes on one socket took a round trip through the probe,
        the update thread and the loop each (14 s for 1,000 re-evaluated subscriptions of 1,000
        rows; `bench reeval --rows 1000`). Their subscribes still reach the engine, and their
        first notifications the client, in the order they were sent."""
        previous = self._last_turn
        mine = self._last_turn = asyncio.get_running_loop().create_future()
        return previous, mine

    @property
    def held_bytes(self) -> int:
        """The characters this socket holds: its queue and the message being written."""
        return self.queued_bytes + self.writing[1]

    def push(self, item: Notification | dict[str, Any], text: str | None = None) -> None:
        """Queue a message (`text`, its JSON text when already written); on overflow, disconnect
        this client (never drop silently).

        Overflow is `limit` messages, `row_limit` rows of notifications or `byte_limit` characters
        queued (a message alone in the queue is taken whatever its size: a subscription's rows,
        and a notification's characters, are bounded where they are made). Why rows too: a client
        that reads slowly, or not at all but for the pings, while an update a second adds and
        removes 99,000 rows, queued 33 MB a second and stayed far below 10,000 messages
        (`/tmp/slowatk.py` pattern: a raw socket that never reads). Why characters: rows of 900 KB
        literals queued ~1 MB an update well within the rows. The text is written here rather
        than by the writer so that it is known, on the same loop thread.

        The rows and characters are bounded for the sockets of an address together too (their
        :class:`QueuedShare`; loopback: each socket alone), counting the message being written
        until the transport took it: a host may open 256 sockets, and each one that never read held
        its whole queue, and a message stuck in its writer, for the 20 s before its stalled write
        cut it. The socket whose message would take its address past a bound is disconnected.
        Every socket's characters together are bounded as well (:class:`QueuedTotal`): past that
        bound the sockets holding the most are disconnected, whichever they are."""
        if self.closing:
            return
        if text is None:
            text = item.to_json_text() if isinstance(item, Notification) else json.dumps(item)
        rows = _rows(item)
        share = self.share
        if (
            self.pending
            and (
                len(self.pending) >= self.limit
                or (self.row_limit is not None and self.queued_rows + rows > self.row_limit)
                or (self.byte_limit is not None and self.queued_bytes + len(text) > self.byte_limit)
            )
        ) or (
            share is not None
            and share.bytes
            and (
                (self.row_limit is not None and share.rows + rows > self.row_limit)
                or (self.byte_limit is not None and share.bytes + len(text) > self.byte_limit)
            )
        ):
            self.overflow(SLOW_SUBSCRIBERS, b"outgoing queue overflow: read faster")
            return
        if self.total is not None and not self.total.make_room(self, len(text)):
            return
        self.pending.append((text, rows))
        self.queued_rows += rows
        self.queued_bytes += len(text)
        self._count(rows, len(text))
        self.ready.set()

    def overflow(self, reason: QuietLog, close_message: bytes) -> None:
        """Disconnect this client for what it queued: logged (`reason`, which counts it), its queue
        dropped, closed with 1008 and `close_message`."""
        reason(
            **{
                "peer": self.peer,
                "queued": len(self.pending),
                "queued_rows": self.queued_rows,
                "queued_bytes": self.held_bytes,
                "subscriptions": len(self.subscriptions),
            }
        )
        self.cut(close_message)

    def cut(self, close_message: bytes) -> None:
        """Close with 1008 and `close_message`, its queue dropped (aborted if the client does not
        take the close frame)."""
        self.closing = True
        self.release()
        self.dropping = asyncio.ensure_future(self.drop(close_message))  # keep a reference: tasks are weakly held

    def _count(self, rows: int, characters: int) -> None:
        """Add to (or, negative, take from) what this socket's address and all sockets hold."""
        if self.share is not None:
            self.share.add(rows, characters)
        if self.total is not None:
            self.total.bytes += characters

    def release(self) -> None:
        """Drop what is queued and the message being written (its transport is aborted, or gone),
        and give them back to the address's share and the total."""
        self._count(-self.queued_rows - self.writing[0], -self.queued_bytes - self.writing[1])
        self.pending.clear()
        self.queued_rows = self.queued_bytes = 0
        self.writing = (0, 0)

    async def drop(self, message: bytes) -> None:
        """Close with 1008; a client that stopped reading never takes the close frame, so then abort."""
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            await asyncio.wait_for(self.ws.close(code=1008, message=message), 1.0)
        if self.transport is not None:
            self.transport.abort()  # a plain close() would wait for the unread data to drain, forever

    async def writer(self) -> None:
        with contextlib.suppress(ConnectionError):
            while not self.closing:
                await self.ready.wait()
                self.ready.clear()
                while self.pending and not self.closing:
                    text, rows = self.pending.popleft()
                    self.queued_rows -= rows
                    self.queued_bytes -= len(text)
                    self.writing = (rows, len(text))
                    try:
                        await self.ws.send_str(text)
                    finally:  # the transport has it (or the socket is gone; release() gave it back then)
                        self._count(-self.writing[0], -self.writing[1])
                        self.writing = (0, 0)


def _rows(item: Notification | dict[str, Any]) -> int:
    """The rows a queued message holds (an error frame: none)."""
    return len(item.added) + len(item.removed) if isinstance(item, Notification) else 0


class WebSocketGate:
    """Handler of /subscribe; one :class:`Connection` per socket."""

    def __init__(
        self,
        scheduler: Scheduler,
        counters: Counter[str],
        *,
        queue_limit: int = 10_000,
        queue_rows: int | None = None,
        queue_bytes: int | None = None,
        max_notification_bytes: int | None = None,
        heartbeat_s: float = 30.0,
        max_message_bytes: int = 1 << 20,
        authenticate: Callable[..., Principal] | None = None,
        still_valid: Callable[[Principal], bool] | None = None,
        quota: SubscriptionQuota | None = None,
        shares: PerAddress[QueuedShare] | None = None,
        total: QueuedTotal | None = None,
        auth_timeout_s: float | None = None,
    ) -> None:
        """`authenticate` (secure gates): the principal of a message's ``authorization`` value sent
        from a network address (None: this board), or Unauthorized, or TooManyFailures when the
        address sent too many failed ones; every subscribe and unsubscribe is then checked. `still_valid`: whether a
        principal is still registered with the same rights, checked again when a subscription is
        registered (see :meth:`subscribe`). `auth_timeout_s` (with `authenticate`): a socket none of
        whose messages carried a valid token within it is closed (:meth:`_unauthenticated`)."""
        self.authenticate = authenticate
        self.auth_timeout_s = auth_timeout_s if authenticate is not None else None
        self.still_valid = still_valid
        self.scheduler = scheduler
        self.counters = counters
        self.queue_limit = queue_limit
        self.queue_rows = queue_rows
        self.queue_bytes = queue_bytes
        self.max_notification_bytes = max_notification_bytes
        self.heartbeat_s = heartbeat_s
        self.max_message_bytes = max_message_bytes
        self.connections: set[Connection] = set()
        self.quota = quota if quota is not None else SubscriptionQuota()
        self.shares = shares if shares is not None else queued_shares()  # by address (Connection.push)
        self.total = total if total is not None else QueuedTotal(None)  # every socket's (QueuedTotal)

    async def handle(self, request: web.BaseRequest) -> web.WebSocketResponse:
        # compress=False: no permessage-deflate. With it, 4 KB of deflate a client sends inflate to
        # the 4 MiB frame limit on the event loop (~10 ms each, no token needed on the secure port):
        # 178 kB/s of them took other clients' updates from 1.4 ms to 344 ms
        ws = web.WebSocketResponse(heartbeat=self.heartbeat_s, max_msg_size=4 * self.max_message_bytes, compress=False)
        try:
            await ws.prepare(request)
        except ValueError:  # aiohttp decodes Sec-WebSocket-Key unguarded: non-ASCII was a 500 and a traceback
            raise InvalidRequest("malformed WebSocket handshake") from None
        host = peer_host(request.transport) if request.transport is not None else None
        protocol = request.protocol
        connection = Connection(
            ws,
            self.queue_limit,
            request.remote or "?",
            request.transport,
            self.queue_rows,
            self.queue_bytes,
            self.shares.join(host) if host else None,
            self.total,
        )
        connection.protocol = protocol
        self.connections.add(connection)
        self.total.connections.add(connection)
        self.counters["ws_connections"] += 1
        if self.auth_timeout_s is not None:
            connection.deadline = asyncio.get_running_loop().call_later(
                self.auth_timeout_s, self._unauthenticated, connection
            )
        writer = asyncio.create_task(connection.writer())
        try:
            async for message in ws:
                # its bytes stay held against [http] request_bytes_total until it is handled (broker.gates.slow)
                size = protocol.take_message() if isinstance(protocol, GuardedHandler) else 0
                if message.type == WSMsgType.TEXT:
                    await connection.slots.acquire()
                    task = asyncio.create_task(self.on_message(connection, message.data, *connection.turn()))
                    connection.tasks.add(task)
                    task.add_done_callback(connection.tasks.discard)
                    if size:
                        task.add_done_callback(lambda _, size=size: protocol.give_back_message(size))
                    continue
                if size:
                    protocol.give_back_message(size)
                if message.type == WSMsgType.BINARY:
                    self.reply_error(
                        connection, "invalid_request", "binary frames are not supported: send JSON text", 400
                    )
                elif message.type == WSMsgType.ERROR:
                    break
        finally:
            connection.closing = True
            if connection.deadline is not None:
                connection.deadline.cancel()
            writer.cancel()
            connection.release()
            if host:
                self.shares.leave(host)
            self.connections.discard(connection)
            self.total.connections.discard(connection)
            if ws.close_code == WSCloseCode.ABNORMAL_CLOSURE and connection.transport is not None:
                connection.transport.abort()  # unanswered pings: free the socket even with unsent data
            await self.end_all(connection)
        return ws

    def _unauthenticated(self, connection: Connection) -> None:
        """Close a secure socket none of whose messages carried a valid token within `auth_timeout_s`
        (1008), counted (`sepa_ws_unauthenticated_closed_total`) and logged once a minute at most.

        Why: an upgrade needs no token, and aiohttp answers the pings, so a socket that never sent a
        message was held for good: 1,000 of them from 50 loopback addresses took the gateway from 92
        to 163 MB of RSS (~72 KB each), all still open 70 s later (/tmp/atk-ws/wshold.py); the
        connection limits let LAN hosts hold 4,096. A subscriber whose token passed once is never
        closed for this, however long it stays idle (its token may expire meanwhile: it is checked
        at each subscribe)."""
        if connection.authenticated or connection.closing:
            return
        self.counters["ws_unauthenticated_closed"] += 1
        UNAUTHENTICATED(peer=connection.peer)
        connection.cut(f"no authenticated request within {self.auth_timeout_s:g} s".encode())

    @staticmethod
    def _authenticated(connection: Connection) -> None:
        """A message of `connection` carried a valid token: it is kept past `auth_timeout_s`, and
        spared by a full connection limit (broker.gates.connections Shares._evict)."""
        if connection.authenticated:
            return
        connection.authenticated = True
        if isinstance(connection.protocol, GuardedHandler):
            connection.protocol.spare()

    async def end_all(self, connection: Connection) -> None:
        """End the subscriptions of a socket that closed; those still being subscribed end as their
        subscribe returns (:meth:`_subscribe`)."""
        for spuid in list(connection.subscriptions):
            self.forget(connection, spuid)
            await self._unsubscribe_quietly(spuid)

    def forget(self, connection: Connection, spuid: str) -> str | None:
        """Drop a subscription from `connection` and give its quota back; returns its alias."""
        connection.owners.pop(spuid, None)
        coalescing = connection.coalescing.pop(spuid, None)
        if coalescing is not None and isinstance(coalescing.timer, asyncio.TimerHandle):
            coalescing.timer.cancel()
        held = connection.held.pop(spuid, None)
        if held is not None:
            self.quota.give_back(*held)
        return connection.subscriptions.pop(spuid, None)

    async def end_invalid(self, still_valid: Callable[[Principal], bool]) -> int:
        """End every subscription whose client or token is revoked or whose rights changed (told with a 401
        error frame naming it, once the engine no longer has it: a client reading the frame and then
        the subscriptions gauge saw it still counted under load); returns how many ended."""
        ended = 0
        for connection in list(self.connections):
            for spuid, principal in list(connection.owners.items()):
                if still_valid(principal):
                    continue
                alias = self.forget(connection, spuid)
                connection.ended.add(spuid)  # what the engine still sends for it is dropped
                await self._unsubscribe_quietly(spuid)
                self._revoked(connection, spuid, alias)
                ended += 1
        return ended

    def _revoked(self, connection: Connection, spuid: str, alias: str | None) -> None:
        """Tell the client its subscription `spuid` ended because its client or the token it was
        made with was revoked, or its rights changed (a 401 error frame naming it); what the engine
        still sends for it is dropped."""
        connection.ended.add(spuid)
        self.counters["ws_revoked_subscriptions"] += 1
        connection.push(
            error_body(
                "invalid_grant",
                "the client or the token this subscription was made with was revoked, or the client's "
                "rights changed: subscription ended",
                401,
                alias=alias,
                spuid=spuid,
            )
        )

    def subscription_ended(self, connection: Connection, notification: Notification) -> None:
        """The engine ended a subscription (its re-evaluation ran past the time limit...): an
        error frame naming it, and its quota back; nothing when the client no longer has it (it
        ended here, or was unsubscribed or revoked meanwhile), so a spuid ends once on the wire."""
        error = notification.ended
        assert error is not None
        if notification.spuid in connection.ended or notification.spuid not in connection.subscriptions:
            return
        self._flush(connection, notification.spuid)  # what it had, before it ends
        connection.ended.add(notification.spuid)
        self.forget(connection, notification.spuid)
        self.counters[f"ws_{error.error}:{error.status_code}"] += 1
        connection.push(
            error_body(
                error.error,
                f"subscription ended: {error.description}",
                error.status_code,
                alias=notification.alias,
                spuid=notification.spuid,
            )
        )

    def reply_error(
        self, connection: Connection, error: str, description: str, status: int, alias: Any = None, **extra: Any
    ) -> None:
        """An error frame, naming the request's `alias` when it is one a subscription could have.

        Why not any alias: the frame quoted it as sent, so each 1 MB message whose alias a refusal
        named (no token on the secure port, an unknown spuid) came back as 1 MB: 100 of them without
        a token were 100 MB written back over TLS (0.88 s of the gateway's CPU; now 5.8 KB and 0.51 s).
        No subscription has an alias past MAX_ALIAS_CHARS."""
        if isinstance(alias, str) and len(alias) > MAX_ALIAS_CHARS:
            alias = None
        self.counters[f"ws_{error}:{status}"] += 1
        connection.push(error_body(error, description, status, alias=alias, **extra))

    async def on_message(
        self,
        connection: Connection,
        data: str,
        previous: asyncio.Future[None] | None = None,
        mine: asyncio.Future[None] | None = None,
    ) -> None:
        """One text message, as a task of its own (see :meth:`Connection.turn`)."""
        try:
            await self.on_text(connection, data, previous, mine)
        except Exception as error:  # nothing but a frame may reach an upgraded socket
            self.counters["ws_internal_errors"] += 1
            log.error("websocket: a message failed", extra={"error": repr(error)[:300]})
            self.reply_error(connection, "internal_error", "the message could not be processed", 500)
        finally:
            if mine is not None and not mine.done():  # it gave up: its turn ends with the previous one's
                if previous is None or previous.done():
                    mine.set_result(None)
                else:
                    previous.add_done_callback(lambda _previous: mine.done() or mine.set_result(None))
            connection.slots.release()

    async def on_text(
        self,
        connection: Connection,
        data: str,
        previous: asyncio.Future[None] | None = None,
        mine: asyncio.Future[None] | None = None,
    ) -> None:
        if len(data.encode("utf-8")) > self.max_message_bytes:
            self.reply_error(
                connection, "request_too_large", f"messages are limited to {self.max_message_bytes} bytes", 413
            )
            return
        try:
            message = json.loads(data)
        except RecursionError:
            self.reply_error(connection, "invalid_request", "the JSON nests too deep", 400)
            return
        except ValueError as error:
            self.reply_error(connection, "invalid_request", f"not JSON: {error}", 400)
            return
        if _ESCAPED_SURROGATE.search(data) and not _is_text(message):
            bodies = [message.get(verb) for verb in ("subscribe", "unsubscribe") if isinstance(message, dict)]
            alias = next((body.get("alias") for body in bodies if isinstance(body, dict)), None)
            alias = alias if isinstance(alias, str) and _is_text(alias) else None
            description = "a string holds an unpaired surrogate (\\uD800-\\uDFFF)"
            self.reply_error(connection, "invalid_request", description, 400, alias)
            return
        if isinstance(message, dict) and "subscribe" in message and "unsubscribe" in message:
            # one of them was run and the other dropped without a frame: the client waited for ever
            self.reply_error(
                connection, "invalid_request", "a message holds a subscribe or an unsubscribe, not both", 400
            )
            return
        for verb in ("subscribe", "unsubscribe"):
            if isinstance(message, dict) and isinstance(message.get(verb), dict):
                body = message[verb]
                principal = None
                if self.authenticate is not None:
                    # inside the request object (the draft), or beside it (clients in the field); a
                    # null inside is no token there (it hid a valid one beside: 401 for a good client)
                    authorization = body.get("authorization")
                    if authorization is None:
                        authorization = message.get("authorization")
                    try:
                        # an unsubscribe may carry an expired token of ours (Authority.authenticate)
                        principal = self.authenticate(authorization, connection.host, expired_ok=verb == "unsubscribe")
                        self._authenticated(connection)
                    except SepaError as error:
                        alias = body.get("alias") if isinstance(body.get("alias"), str) else None
                        # a frame has no headers: a refused attempt's Retry-After is in its body
                        extra = {"retry_after": error.retry_after_s} if isinstance(error, TooManyFailures) else {}
                        self.reply_error(connection, error.error, error.description, error.status_code, alias, **extra)
                        return
                if verb == "subscribe":
                    await self.subscribe(connection, body, principal, previous, mine)
                else:
                    await self.unsubscribe(connection, body, principal)
                return
        else:
            self.reply_error(
                connection, "invalid_request", 'expected {"subscribe": {...}} or {"unsubscribe": {...}}', 400
            )

    async def subscribe(
        self,
        connection: Connection,
        body: dict[str, Any],
        principal: Principal | None = None,
        previous: asyncio.Future[None] | None = None,
        mine: asyncio.Future[None] | None = None,
    ) -> None:
        alias = body.get("alias")
        if alias is not None and not isinstance(alias, str):
            self.reply_error(connection, "invalid_request", "'alias' must be a string or null", 400)
            return
        if alias is not None and len(alias) > MAX_ALIAS_CHARS:
            self.reply_error(connection, "invalid_request", f"'alias' is limited to {MAX_ALIAS_CHARS} characters", 400)
            return
        sparql = body.get("sparql")
        if not isinstance(sparql, str):
            self.reply_error(connection, "invalid_request", "'sparql' (a string) is required", 400, alias)
            return
        interval = coalesce_interval(body.get("coalesce_ms"))
        if interval is None:
            description = f"'coalesce_ms' must be a number of milliseconds from 0 to {MAX_COALESCE_MS}"
            self.reply_error(connection, "invalid_request", description, 400, alias)
            return
        sparql = unescape_iris(sparql)  # as /query and /update take them (broker.sparql.tokens)
        graphs: dict[str, list[str]] = {}
        for member in ("default-graph-uri", "named-graph-uri"):
            value = body.get(member)
            # null is no list given, as for alias and authorization (a JSAP with "graphs": null members)
            value = [] if value is None else [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(iri, str) for iri in value):
                self.reply_error(connection, "invalid_request", f"'{member}' must be an array of IRIs", 400, alias)
                return
            if len(value) > MAX_DATASET_GRAPHS:
                description = f"'{member}' names at most {MAX_DATASET_GRAPHS} graphs"
                self.reply_error(connection, "invalid_request", description, 400, alias)
                return
            graphs[member] = value
        if principal is not None:
            try:
                graphs["default-graph-uri"], graphs["named-graph-uri"] = principal.access.restrict_dataset(  # type: ignore[assignment]
                    graphs["default-graph-uri"], graphs["named-graph-uri"], sparql, self.scheduler.engine.base_iri
                )
            except SepaError as error:
                self.reply_error(connection, error.error, error.description, error.status_code, alias)
                return
        graphs_named = [*graphs["default-graph-uri"], *graphs["named-graph-uri"]]
        client = principal.identity if principal is not None else f"address {connection.peer}"
        # what the subscription keeps of the request: its alias and dataset are held as long as its SPARQL
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in (sparql, alias or "", *graphs_named))
        try:
            self.quota.take(client, size)
        except SepaError as error:
            self.reply_error(connection, error.error, error.description, error.status_code, alias)
            return
        registered: list[str] = []
        refused: list[str] = []

        def register(spuid: str) -> bool:
            """The subscription is this connection's: from its confirmation on, an unsubscribe finds
            it. False, once told with a 401 frame, when the client or its message's token was
            revoked, or its rights changed, since its message was authenticated: the revocation
            watch (SecureGate._watch) ended its subscriptions then, before this one was registered,
            and it got its first results and every later update's (its probe waited 3 s for its
            turn: seen in an attack)."""
            if registered or refused:
                return bool(registered)  # once: after an unsubscribe that forgot it, never again
            if principal is not None and self.still_valid is not None and not self.still_valid(principal):
                refused.append(spuid)
                self._revoked(connection, spuid, alias)
                return False
            registered.append(spuid)
            connection.subscriptions[spuid] = alias
            if interval:
                connection.coalescing[spuid] = Coalescing(interval)
            connection.held[spuid] = (client, size)
            if principal is not None:
                connection.owners[spuid] = principal
            return True

        try:
            shared = principal.identity if principal is not None else None
            await self._subscribe(
                connection,
                sparql,
                alias,
                graphs,
                register,
                previous,
                mine,
                owner=client,
                shared=shared,
                coalesce_s=interval,
            )
        finally:
            if not registered:
                self.quota.give_back(client, size)

    async def _subscribe(
        self,
        connection: Connection,
        sparql: str,
        alias: str | None,
        graphs: dict[str, list[str]],
        register: Callable[[str], bool],
        previous: asyncio.Future[None] | None = None,
        mine: asyncio.Future[None] | None = None,
        owner: str | None = None,
        shared: str | None = None,
        coalesce_s: float = 0.0,
    ) -> None:
        """Subscribe for `connection`, or send an error frame. The probe runs at once; the subscribe
        is queued once `previous` is done (then `mine` is). `owner`: who subscribes (the SPU table
        shows it); `shared`: the client whose turn the probe waits for (broker.scheduler.FairShare);
        `coalesce_s`: its coalescing interval, which the engine may serve by re-evaluating the query
        that often instead of at every update (Engine.subscribe).

        `register(spuid)` runs on the loop just before the confirmation is queued for the socket
        (False: not to be sent, and the subscription ended), not when this coroutine resumes: a
        client that unsubscribes as soon as it reads the confirmation was told "not_found" now and
        then under load, and its subscription lived on until the socket closed (seen in a CI run
        with the machine loaded).

        A client that left before its subscribe is queued is not subscribed; one that left later is
        unsubscribed as this returns, or by :meth:`end_all` when its confirmation came first. A
        subscribe that fails after the engine made its subscription (its group commit's sync
        failed) ends it too (:meth:`_failed`)."""
        to_loop = loop_handoff(asyncio.get_running_loop())
        made: list[str] = []  # the spuid the engine confirmed (set on its thread before the reply)

        def from_engine(notification: Notification) -> None:
            if notification.ended is not None:
                to_loop(self.subscription_ended, connection, notification)
            elif not made:  # the engine's thread, in order: the first one is the confirmation
                made.append(notification.spuid)
                to_loop(self._confirm, connection, notification, register)
            else:
                to_loop(self._deliver, connection, notification)

        options: dict[str, Any] = {
            "alias": alias,
            "default_graph_uri": graphs["default-graph-uri"],
            "named_graph_uri": graphs["named-graph-uri"],
            "nonblocking": True,
            "owner": owner,
            "coalesce_s": coalesce_s,
        }
        try:
            if connection.closing:  # the client left before its turn: nothing to probe for
                return
            options["probed"] = await self.scheduler.probe_subscription(sparql, client=shared, **options)
            if previous is not None:
                await asyncio.shield(previous)
            if connection.closing:  # nor anything to subscribe for
                return
            queued = self.scheduler.queue_subscribe(sparql, from_engine, **options)
            if mine is not None:
                mine.set_result(None)
            subscription = await queued
        except SepaError as error:
            await self._failed(connection, made, error.error, error.description, error.status_code, alias)
            return
        except RecursionError:
            description = "the query nests too deep for this gateway"
            await self._failed(connection, made, "invalid_request", description, 400, alias)
            return
        except Exception as error:  # an error frame for this subscribe alone: the socket lives
            self.counters["ws_subscribe_failures"] += 1
            log.error("websocket: a subscribe failed", extra={"error": repr(error)[:300]})
            description = f"the subscription failed: {str(error)[:200]}"
            await self._failed(connection, made, "internal_error", description, 500, alias)
            return
        self.counters["ws_subscribes"] += 1
        if connection.closing:  # the client left while we subscribed (end_all may have ended it too)
            self.forget(connection, subscription.spuid)
            await self._unsubscribe_quietly(subscription.spuid)
            return
        # without a confirmation from the engine (none is lost: a no-op), or refused
        if not register(subscription.spuid):
            await self._unsubscribe_quietly(subscription.spuid)

    async def _failed(
        self, connection: Connection, made: list[str], error: str, description: str, status: int, alias: str | None
    ) -> None:
        """A subscribe failed: its error frame, and the end of the subscription the engine made
        before it failed, if it did (`made`: its spuid, named in the frame).

        Why: a subscribe is acknowledged after the group commit's sync, like the updates run with
        it, and a failed sync fails them all (Scheduler._acknowledge). The engine had made the
        subscription; for a socket that had closed meanwhile the gate never registered it, and the
        error frame was all that was done: it lived on for no client, counted in
        `sepa_subscriptions` and re-evaluated at every update until a restart
        (tests/broker/gates/test_websocket_reset.py)."""
        if not made:
            self.reply_error(connection, error, description, status, alias)
            return
        self.forget(connection, made[0])
        connection.ended.add(made[0])
        self.reply_error(connection, error, description, status, alias, spuid=made[0])
        await self._unsubscribe_quietly(made[0])

    def _confirm(self, connection: Connection, notification: Notification, register: Callable[[str], bool]) -> None:
        if connection.closing or register(notification.spuid):
            self._deliver(connection, notification)

    def _deliver(self, connection: Connection, notification: Notification) -> None:
        """Send a notification now, or hold it when its subscription coalesces (broker.gates.coalesce)."""
        coalescing = connection.coalescing.get(notification.spuid)
        if coalescing is None:
            self._send(connection, notification)
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if coalescing.offer(notification, now) is not None:
            self._send(connection, notification)
        elif coalescing.timer is None:
            coalescing.timer = loop.call_at(coalescing.due_at(), self._flush, connection, notification.spuid)

    def _flush(self, connection: Connection, spuid: str) -> None:
        """Send what a coalescing subscription holds, as one notification."""
        coalescing = connection.coalescing.get(spuid)
        if coalescing is None:
            return
        if isinstance(coalescing.timer, asyncio.TimerHandle):
            coalescing.timer.cancel()
        merged = coalescing.flush(asyncio.get_running_loop().time())
        if merged is not None:
            self._send(connection, merged)

    def _send(self, connection: Connection, notification: Notification) -> None:
        """Queue a notification, written at most `max_notification_bytes` characters long; past
        them the subscription ends with an error frame naming the setting (the socket and its
        other subscriptions live on).

        Why: rows are bounded where a subscription's results are made, their size is not. A
        500,000-character literal joined with 500 triples was one 250 MB frame: the event loop
        spent 4 s writing it (every client waited), RSS went from 193 MB to 1.29 GB (a 1 GB
        board is out of memory long before). Now writing stops where the limit is passed."""
        if notification.spuid in connection.ended or connection.closing:
            return
        try:
            text = notification.to_json_text(self.max_notification_bytes)
        except TooLarge:
            connection.ended.add(notification.spuid)
            alias = self.forget(connection, notification.spuid)
            self.counters["ws_notifications_too_large"] += 1
            self.reply_error(
                connection,
                ResultTooLarge.error,
                f"subscription ended: its notification passed [websocket] max_notification_bytes "
                f"({self.max_notification_bytes} characters of JSON)",
                ResultTooLarge.status_code,
                alias,
                spuid=notification.spuid,
            )
            task = asyncio.ensure_future(self._unsubscribe_quietly(notification.spuid))
            connection.tasks.add(task)
            task.add_done_callback(connection.tasks.discard)
            return
        connection.push(notification, text)

    async def _unsubscribe_quietly(self, spuid: str) -> None:
        """End `spuid` in the engine, which the gate has forgotten already (:meth:`forget`).

        Never refused (Scheduler.unsubscribe). NotFound is no error: it ended there already, by the
        engine or by the other of two paths that both end a subscription whose socket went away
        while it was confirmed (:meth:`end_all` and :meth:`_subscribe`): that race logged
        "a message failed" at ERROR 387 times in a churn of reset sockets. Nor is a failed sync of
        the calls run with it (Scheduler._acknowledge): an unsubscribe writes nothing, and it ran."""
        with contextlib.suppress(SepaError):
            await self.scheduler.unsubscribe(spuid)

    async def unsubscribe(
        self, connection: Connection, body: dict[str, Any], principal: Principal | None = None
    ) -> None:
        spuid = body.get("spuid")
        # errors carry the request's alias, else the subscription's: clients (sepa-js) match them by it
        alias = body.get("alias")
        if not isinstance(alias, str):
            alias = connection.subscriptions.get(spuid) if isinstance(spuid, str) else None
        if not isinstance(spuid, str):
            self.reply_error(connection, "invalid_request", "'spuid' (a string) is required", 400, alias)
            return
        if spuid not in connection.subscriptions:
            self.reply_error(connection, "not_found", f"no subscription {spuid} on this connection", 404, alias)
            return
        owner = connection.owners.get(spuid)
        if principal is not None and (owner is None or owner.identity != principal.identity):
            self.reply_error(connection, "forbidden", "a client may only end its own subscriptions", 403, alias)
            return
        alias = self.forget(connection, spuid)
        await self._unsubscribe_quietly(spuid)
        connection.push({"unsubscribed": {"spuid": spuid, "alias": alias}})
