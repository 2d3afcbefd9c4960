"""NetworkTransport: the SPARQL 1.1 SE Protocol over HTTP and one WebSocket (PROTOCOL.md).

Why it is written against PROTOCOL.md only (no knowledge of this broker's internals): the same
client must work against any SEPA broker, so everything here is what the wire says. Queries and
updates are SPARQL 1.1 Protocol POSTs (``application/sparql-query`` /
``application/sparql-update``, graphs as URL parameters); results are parsed from SPARQL JSON (or
N-Triples for CONSTRUCT/DESCRIBE) into the engine's own :class:`QueryResult` of pyoxigraph terms,
so an application cannot tell this transport from the in-process one.

All of a client's subscriptions share ONE WebSocket. Replies are matched as the protocol allows:
a sequence-0 notification or an error answers the oldest pending subscribe with the same alias,
so every subscribe is sent with an alias (the application's, or a generated unique one when it
gave none; the application still sees its own alias). Later notifications are routed by spuid;
``unsubscribed`` replies by spuid.

Reconnection. When the socket drops while subscriptions are live, the transport reconnects with
exponential backoff and jitter (:class:`ReconnectPolicy`: the delay of attempt k is
``min(max_delay_s, initial_delay_s * multiplier**k)`` scaled by a random factor in
``[1 - jitter, 1]``, optionally a bounded number of attempts), then subscribes every live
subscription again. The new sequence-0 result is delivered to the subscription's sink with
``resync=True``; the client diffs it against its view, so the application sees one synthetic
notification instead of a duplicate or a gap. A notification whose sequence number is not the
next one expected (a broker bug or a lost frame) is treated like a lost connection: the socket is
closed and everything is re-synchronised the same way.

Requests during an outage (decision documented in gateway/client/README.md):
  * queries are idempotent and are retried with the same backoff for up to
    ``ReconnectPolicy.query_retry_s`` seconds, then fail with :class:`SepaConnectionError`;
  * updates are never retried (not idempotent, and a lost reply leaves their fate unknown):
    ``connection_failed`` when nothing was sent, ``connection_lost`` when the reply was lost;
  * subscribe fails at once with ``connection_failed`` while the socket is down (the live
    subscriptions are restored automatically); unsubscribe succeeds at once (the broker ends every
    subscription of a closed socket);
  * requests waiting for a reply on the socket when it drops fail with ``connection_lost``.

Delayed updates (seed 001 §II-C; this broker's extension, not in the SPARQL 1.1 SE Protocol) are
the update POST with a ``delay`` or ``at`` URL parameter, answered 202 with the update's id; the
pending ones are listed by ``GET scheduled_url`` and cancelled by ``DELETE scheduled_url/{id}``.
Scheduling is never retried (like any update); listing is, like a query. A 200 to a delayed
update means a broker that ignored the parameter and ran the update at once: that is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import urllib.parse
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
from pyoxigraph import Quad, RdfFormat, Triple, parse

from broker.api import Notification, QueryResult, Row, Update, UpdateResult, term_from_json
from gateway.client.errors import SepaClientError, SepaConnectionError
from gateway.client.oauth import OAuthSession
from gateway.client.transport import NotificationSink, Scheduled, TransportSubscription, UpdateSummary

log = logging.getLogger(__name__)
T = TypeVar("T")

QUERY_TYPE = "application/sparql-query"
UPDATE_TYPE = "application/sparql-update"
JSON_TYPES = ("application/sparql-results+json", "application/json")
# SELECT/ASK come back as SPARQL JSON; CONSTRUCT/DESCRIBE (not JSON-representable) as N-Triples
QUERY_ACCEPT = "application/sparql-results+json, application/n-triples;q=0.9, text/turtle;q=0.8"


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How the network transport reconnects its WebSocket (and retries queries).

    Exponential backoff with "equal jitter": attempt k (from 0) waits
    ``min(max_delay_s, initial_delay_s * multiplier**k) * (1 - jitter * U)`` with U uniform in
    [0, 1), so delays are bounded by `max_delay_s` and clients that lost the same broker do not
    come back in lock-step. `max_attempts` None means keep trying for ever (an IoT gateway's
    clients should outlive a broker restart); after that many failed attempts every live
    subscription ends with a :class:`SepaConnectionError`.
    """

    enabled: bool = True
    initial_delay_s: float = 0.1
    max_delay_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_attempts: int | None = None
    query_retry_s: float = 5.0

    def __post_init__(self) -> None:
        if self.initial_delay_s < 0 or self.max_delay_s < self.initial_delay_s or self.multiplier < 1:
            raise ValueError("need 0 <= initial_delay_s <= max_delay_s and multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a fraction in [0, 1]")
        if self.max_attempts is not None and self.max_attempts < 0:
            raise ValueError("max_attempts must be >= 0 (or None: for ever)")

    def delay(self, attempt: int, uniform: Callable[[], float] = random.random) -> float:
        """Seconds to wait before reconnection attempt `attempt` (0-based)."""
        ceiling = min(self.max_delay_s, self.initial_delay_s * self.multiplier ** min(attempt, 64))
        return ceiling * (1.0 - self.jitter * uniform())


# -- parsing the wire ------------------------------------------------------------------------------


def _row(variables: Sequence[str], binding: dict[str, Any]) -> Row:
    return tuple(term_from_json(binding[name]) if name in binding else None for name in variables)


def parse_results_json(document: Any) -> QueryResult:
    """A SPARQL 1.1 Query Results JSON document as a QueryResult of pyoxigraph terms."""
    if "boolean" in document:
        return QueryResult("ask", boolean=bool(document["boolean"]))
    variables = tuple(document.get("head", {}).get("vars", []))
    bindings = document.get("results", {}).get("bindings", [])
    return QueryResult("select", variables, tuple(_row(variables, binding) for binding in bindings))


def parse_query_reply(content_type: str, body: bytes) -> QueryResult:
    """A query reply body (SPARQL JSON, or an RDF graph for CONSTRUCT/DESCRIBE) as a QueryResult."""
    if content_type in JSON_TYPES or not content_type:
        return parse_results_json(json.loads(body))
    rdf_format = RdfFormat.from_media_type(content_type)
    if rdf_format is None:
        raise SepaClientError("invalid_response", f"the broker answered a query with {content_type}", 502)
    quads = parse(body, format=rdf_format)
    return QueryResult("graph", triples=tuple(Triple(q.subject, q.predicate, q.object) for q in quads))


def parse_notification(body: dict[str, Any], alias: str | None) -> Notification:
    """The `notification` member of a WebSocket message as the engine's Notification.

    `alias` replaces the wire alias (which may be one the transport generated). ASK notifications
    carry ``{"head": {}, "boolean": b}``; removedResults holds the previous value after sequence 0
    (in sequence 0, false: the empty result's; there is no previous value, None, as in process).
    """
    added = body.get("addedResults") or {}
    removed = body.get("removedResults") or {}
    spuid, sequence = str(body.get("spuid")), int(body.get("sequence", 0))
    if "boolean" in added:
        previous = removed.get("boolean")
        return Notification(
            spuid,
            alias,
            sequence,
            (),
            boolean=bool(added["boolean"]),
            previous=None if previous is None or not sequence else bool(previous),
        )
    variables = tuple(added.get("head", {}).get("vars") or removed.get("head", {}).get("vars") or ())
    added_rows = tuple(_row(variables, b) for b in added.get("results", {}).get("bindings", []))
    removed_rows = tuple(_row(variables, b) for b in removed.get("results", {}).get("bindings", []))
    return Notification(spuid, alias, sequence, variables, added_rows, removed_rows)


def _member(body: bytes, name: str, kind: type = dict) -> Any:
    """The member `name` of a JSON reply, of type `kind` (invalid_response otherwise)."""
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    value = document.get(name) if isinstance(document, dict) else None
    if not isinstance(value, kind):
        raise SepaClientError("invalid_response", f"expected {name!r} in the JSON reply, got {body[:200]!r}", 502)
    return value


def _instant(text: Any) -> datetime:
    instant = datetime.fromisoformat(text) if isinstance(text, str) else None
    if instant is None or instant.tzinfo is None:
        raise ValueError(f"not an RFC 3339 instant: {text!r}")
    return instant.astimezone(UTC)


def _scheduled(entry: Any) -> Scheduled:
    """A delayed update as the broker shows it (``{"id", "due"}``, plus ``update`` and ``created`` in a list)."""
    try:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ValueError(f"no id in {entry!r}")
        update = entry.get("update")
        created = entry.get("created")
        return Scheduled(
            entry["id"],
            _instant(entry.get("due")),
            update if isinstance(update, str) else None,
            None if created is None else _instant(created),
        )
    except ValueError as error:
        raise SepaClientError("invalid_response", f"unreadable scheduled update: {error}", 502) from error


# -- per-subscription bookkeeping -------------------------------------------------------------------


@dataclass(eq=False)
class _State:
    wire_alias: str
    expected: int = 0  # next sequence number from the broker


@dataclass(eq=False)
class _Pending:
    """A subscribe waiting for its sequence-0 reply (or its error)."""

    handle: TransportSubscription
    future: asyncio.Future[None]
    resync: bool
    abandoned: bool = False  # the caller stopped waiting: end the subscription if it arrives


@dataclass
class NetworkStats:
    """What the transport did, for tests, logs and metrics."""

    connects: int = 0
    reconnects: int = 0
    reconnect_attempts: int = 0
    resubscriptions: int = 0
    sequence_gaps: int = 0
    query_retries: int = 0
    delays: deque[float] = field(default_factory=lambda: deque(maxlen=256))


class NetworkTransport:
    """A :class:`~gateway.client.transport.Transport` speaking PROTOCOL.md to a broker."""

    def __init__(
        self,
        query_url: str,
        update_url: str,
        subscribe_url: str,
        *,
        reconnect: ReconnectPolicy | None = None,
        request_timeout_s: float = 30.0,
        heartbeat_s: float | None = 10.0,
        authorization: str | None = None,
        max_message_bytes: int = 64 << 20,
        scheduled_url: str | None = None,
        oauth: OAuthSession | None = None,
        ssl: Any = None,
    ) -> None:
        """`oauth`: the secure gates' registration and tokens (:mod:`gateway.client.oauth`), asked for
        the ``Authorization`` of every request; `ssl`: aiohttp's TLS option (:func:`gateway.client.oauth.tls`)."""
        self.query_url = query_url
        self.update_url = update_url
        self.subscribe_url = subscribe_url
        # GET lists / DELETE {id} cancels delayed updates; by default the update URL's sibling
        # (http://h:8000/update -> http://h:8000/scheduled), where this broker serves it
        self.scheduled_url = scheduled_url or urllib.parse.urljoin(update_url, "scheduled")
        self.reconnect = reconnect or ReconnectPolicy()
        self.request_timeout_s = request_timeout_s
        self.heartbeat_s = heartbeat_s
        self.authorization = authorization
        self.oauth = oauth
        self.ssl = ssl
        self.max_message_bytes = max_message_bytes
        self.stats = NetworkStats()
        self.state = "idle"  # idle | connected | reconnecting | closed
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._resubscriber: asyncio.Task[None] | None = None
        self._connect_lock: asyncio.Lock | None = None
        self._live: dict[TransportSubscription, None] = {}  # ordered set of established subscriptions
        self._by_spuid: dict[str, TransportSubscription] = {}
        self._pending: dict[str, deque[_Pending]] = {}
        self._unsubscribing: dict[str, asyncio.Future[None]] = {}
        self._background: set[asyncio.Future[Any]] = set()

    # -- HTTP ---------------------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self.state == "closed":
            raise SepaClientError("invalid_request", "the client is closed", 400)
        if self._session is None:
            # no session-wide total timeout: it would also bound the WebSocket handshake's lifetime;
            # each HTTP request gets its own
            connector = aiohttp.TCPConnector(ssl=self.ssl) if self.ssl is not None else None
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), connector=connector
            )
        return self._session

    async def _authorize(self) -> None:
        """Bring `authorization` up to date from the OAuth session (a no-op without one)."""
        if self.oauth is not None:
            self.authorization = await self.oauth.authorization(self._http(), self.ssl)

    def _headers(self, content_type: str | None, accept: str) -> dict[str, str]:
        headers = {"Accept": accept}
        if content_type is not None:
            headers["Content-Type"] = f"{content_type}; charset=utf-8"
        if self.authorization is not None:
            headers["Authorization"] = self.authorization
        return headers

    async def _post(
        self, url: str, text: str, content_type: str, params: list[tuple[str, str]], accept: str
    ) -> tuple[int, str, bytes]:
        return await self._request("POST", url, text.encode("utf-8"), self._headers(content_type, accept), params)

    async def _request(
        self,
        method: str,
        url: str,
        data: bytes | None,
        headers: dict[str, str],
        params: list[tuple[str, str]] | None = None,
    ) -> tuple[int, str, bytes]:
        session = self._http()
        for attempt in (1, 2):
            if self.oauth is not None:
                await self._authorize()
                headers = {**headers, "Authorization": self.authorization or ""}
            status, content_type, body = await self._exchange(session, method, url, data, headers, params)
            if status != 401 or self.oauth is None or attempt == 2:
                return status, content_type, body
            self.oauth.invalidate()  # expired or revoked: one new token, then the broker's answer stands
        raise AssertionError("unreachable")

    async def _exchange(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: str,
        data: bytes | None,
        headers: dict[str, str],
        params: list[tuple[str, str]] | None,
    ) -> tuple[int, str, bytes]:
        try:
            async with session.request(
                method,
                url,
                data=data,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.request_timeout_s),
            ) as response:
                return response.status, response.content_type, await response.read()
        except aiohttp.ClientConnectorError as error:
            raise SepaConnectionError("connection_failed", f"cannot connect to {url}: {error}") from error
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            detail = str(error) or type(error).__name__
            raise SepaConnectionError("connection_lost", f"no reply from {url}: {detail}") from error

    @staticmethod
    def _refusal(status: int, content_type: str, body: bytes) -> SepaClientError:
        text = body.decode("utf-8", errors="replace")
        try:
            document = json.loads(text)
        except ValueError:
            document = None
        return SepaClientError.from_json(document, status_code=status, fallback=text[:500] or f"HTTP {status}")

    async def query(
        self, sparql: str, *, default_graph_uri: Sequence[str] = (), named_graph_uri: Sequence[str] = ()
    ) -> QueryResult:
        params = [("default-graph-uri", iri) for iri in default_graph_uri]
        params += [("named-graph-uri", iri) for iri in named_graph_uri]
        status, content_type, body = await self._retried(
            lambda: self._post(self.query_url, sparql, QUERY_TYPE, params, QUERY_ACCEPT)
        )
        if status != 200:
            raise self._refusal(status, content_type, body)
        try:
            return parse_query_reply(content_type, body)
        except (ValueError, KeyError, TypeError, SyntaxError) as error:
            raise SepaClientError("invalid_response", f"unreadable query result: {error}", 502) from error

    async def _retried(self, request: Callable[[], Awaitable[T]]) -> T:
        """An idempotent request, retried with the reconnection backoff for up to `query_retry_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.reconnect.query_retry_s if self.reconnect.enabled else 0.0)
        attempt = 0
        while True:
            try:
                return await request()
            except SepaConnectionError:
                delay = self.reconnect.delay(attempt)
                if loop.time() + delay > deadline:
                    raise
                self.stats.query_retries += 1
                attempt += 1
                await asyncio.sleep(delay)

    async def update(
        self,
        sparql: str | Update,
        *,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
        quads: bool = False,
    ) -> UpdateSummary:
        """POST the update; with `quads`, ``Prefer: return=representation`` asks for its quads too."""
        if isinstance(sparql, Update):
            sparql = sparql.to_sparql()
        params = [("using-graph-uri", iri) for iri in using_graph_uri]
        params += [("using-named-graph-uri", iri) for iri in using_named_graph_uri]
        headers = self._headers(UPDATE_TYPE, "application/json")
        if quads:
            headers["Prefer"] = "return=representation"
        data = sparql.encode("utf-8")
        status, content_type, body = await self._request("POST", self.update_url, data, headers, params)
        if status != 200:
            raise self._refusal(status, content_type, body)
        try:
            document = json.loads(body) if body.strip() else {}
        except ValueError:
            document = {}
        document = document if isinstance(document, dict) else {}

        def count(name: str) -> int:
            value = document.get(name, 0)
            return value if isinstance(value, int) else 0

        summary = UpdateSummary(count("added"), count("removed"), count("notifications"))
        if not quads:
            return summary
        shown = document.get("quads")
        if not isinstance(shown, dict):
            raise SepaClientError("bad_response", "the broker did not return the update's quads", status)
        try:
            added, removed = (_nquads(shown.get(name)) for name in ("added", "removed"))
        except (SyntaxError, ValueError, TypeError) as error:
            raise SepaClientError("bad_response", f"unreadable quads in the update's reply: {error}", status) from None
        return replace(summary, result=UpdateResult(added, removed, summary.notifications))

    # -- delayed updates (this broker's extension of the update operation) -------------------------

    async def schedule(
        self,
        sparql: str,
        *,
        delay: str | None = None,
        at: str | None = None,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
    ) -> Scheduled:
        """POST the update with `delay` / `at` in the URL; 202 ``{"scheduled": {"id", "due"}}``. Never retried."""
        params = [("using-graph-uri", iri) for iri in using_graph_uri]
        params += [("using-named-graph-uri", iri) for iri in using_named_graph_uri]
        params += [(name, value) for name, value in (("delay", delay), ("at", at)) if value is not None]
        status, content_type, body = await self._post(self.update_url, sparql, UPDATE_TYPE, params, "application/json")
        if status == 200:
            raise SepaClientError(
                "invalid_response",
                f"{self.update_url} applied the update at once: that broker does not support delayed updates",
                502,
            )
        if status != 202:
            raise self._refusal(status, content_type, body)
        return _scheduled(_member(body, "scheduled"))

    async def scheduled(self) -> list[Scheduled]:
        """GET the scheduled URL (idempotent: retried like a query), every page of it: the broker
        sends 1,000 at most per reply, and `next` when more follow (docs/protocol.md)."""
        headers = self._headers(None, "application/json")
        pending: list[Scheduled] = []
        params: list[tuple[str, str]] = []
        while True:
            request = functools.partial(self._request, "GET", self.scheduled_url, None, headers, params)
            status, content_type, body = await self._retried(request)
            if status != 200:
                raise self._refusal(status, content_type, body)
            pending += [_scheduled(entry) for entry in _member(body, "scheduled", list)]
            following = json.loads(body).get("next")
            if not isinstance(following, str):
                return pending
            params = [("after", following)]

    async def cancel_scheduled(self, id: str) -> Scheduled:
        """DELETE the scheduled URL's `/{id}`; the broker answers 404 not_found for an unknown id."""
        headers = self._headers(None, "application/json")
        url = f"{self.scheduled_url.rstrip('/')}/{urllib.parse.quote(id, safe='')}"
        status, content_type, body = await self._request("DELETE", url, None, headers)
        if status != 200:
            raise self._refusal(status, content_type, body)
        return _scheduled(_member(body, "cancelled"))

    # -- the WebSocket --------------------------------------------------------------------------------

    async def _open_socket(self) -> aiohttp.ClientWebSocketResponse:
        session = self._http()
        try:
            ws = await asyncio.wait_for(
                session.ws_connect(self.subscribe_url, heartbeat=self.heartbeat_s, max_msg_size=self.max_message_bytes),
                self.request_timeout_s,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            detail = str(error) or type(error).__name__
            raise SepaConnectionError("connection_failed", f"cannot open {self.subscribe_url}: {detail}") from error
        self.stats.connects += 1
        return ws

    async def _connected(self) -> aiohttp.ClientWebSocketResponse:
        """The open socket, opening it (and starting its reader) on first use."""
        if self.state == "closed":
            raise SepaClientError("invalid_request", "the client is closed", 400)
        if self.state == "reconnecting" or (self.state == "connected" and (self._ws is None or self._ws.closed)):
            # (a socket that closed but whose reader has not noticed yet is the supervisor's to replace)
            raise SepaConnectionError(
                "connection_failed", f"the connection to {self.subscribe_url} is down; reconnecting"
            )
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self.state == "connected" and self._ws is not None and not self._ws.closed:
                return self._ws
            ws = await self._open_socket()
            self._ws, self.state = ws, "connected"
            self._supervisor = asyncio.create_task(self._supervise(ws), name="sepa-client-websocket")
            return ws

    async def _send(self, ws: aiohttp.ClientWebSocketResponse, message: dict[str, Any]) -> None:
        try:
            await ws.send_str(json.dumps(message))
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as error:
            raise SepaConnectionError("connection_lost", f"cannot send on {self.subscribe_url}: {error}") from error

    def _subscribe_message(self, handle: TransportSubscription) -> dict[str, Any]:
        body: dict[str, Any] = {"sparql": handle.sparql, "alias": handle.state.wire_alias}
        if handle.default_graph_uri:
            body["default-graph-uri"] = list(handle.default_graph_uri)
        if handle.named_graph_uri:
            body["named-graph-uri"] = list(handle.named_graph_uri)
        if self.authorization is not None:
            body["authorization"] = self.authorization
        return {"subscribe": body}

    async def _request_subscription(
        self, ws: aiohttp.ClientWebSocketResponse, handle: TransportSubscription, *, resync: bool
    ) -> None:
        """Send one subscribe and wait until its sequence 0 was delivered (or its error)."""
        await self._authorize()  # every subscribe carries a current token (a resubscription too)
        pending = _Pending(handle, asyncio.get_running_loop().create_future(), resync)
        queue = self._pending.setdefault(handle.state.wire_alias, deque())
        queue.append(pending)
        try:
            await self._send(ws, self._subscribe_message(handle))
        except SepaConnectionError:
            with contextlib.suppress(ValueError):
                queue.remove(pending)
            raise
        try:
            await asyncio.wait_for(asyncio.shield(pending.future), self.request_timeout_s)
        except asyncio.CancelledError:
            pending.abandoned = True  # if the reply ever comes, the reader ends that subscription
            raise
        except TimeoutError as error:
            pending.abandoned = True
            raise SepaConnectionError(
                "connection_lost", f"no reply to subscribe within {self.request_timeout_s} s", alias=handle.alias
            ) from error

    async def subscribe(
        self,
        sparql: str,
        sink: NotificationSink,
        *,
        alias: str | None = None,
        default_graph_uri: Sequence[str] = (),
        named_graph_uri: Sequence[str] = (),
    ) -> TransportSubscription:
        ws = await self._connected()
        handle = TransportSubscription(sparql, sink, alias, tuple(default_graph_uri), tuple(named_graph_uri))
        handle.state = _State(alias if alias is not None else f"sepa-client/{uuid.uuid4().hex}")
        try:
            try:
                await self._request_subscription(ws, handle, resync=False)
            except SepaClientError as error:
                if error.status_code != 401 or self.oauth is None:
                    raise
                self.oauth.invalidate()  # the token expired or was refused: once more with a new one
                await self._request_subscription(ws, handle, resync=False)
        except SepaClientError:
            handle.active = False  # errors carry the application's alias, never a generated one
            raise
        return handle

    async def unsubscribe(self, subscription: TransportSubscription) -> None:
        subscription.active = False
        self._live.pop(subscription, None)
        spuid = subscription.spuid
        if self._by_spuid.get(spuid) is not subscription:
            return  # never established, or ended with a previous socket
        del self._by_spuid[spuid]
        ws = self._ws
        if ws is None or ws.closed or self.state != "connected":
            return  # the broker ends every subscription of a closed socket
        future = asyncio.get_running_loop().create_future()
        self._unsubscribing[spuid] = future
        message: dict[str, Any] = {"spuid": spuid}
        await self._authorize()
        if self.authorization is not None:
            message["authorization"] = self.authorization
        try:
            await self._send(ws, {"unsubscribe": message})
            await asyncio.wait_for(asyncio.shield(future), self.request_timeout_s)
        except SepaConnectionError:
            return  # the socket closed: so did the subscription
        except TimeoutError as error:
            raise SepaConnectionError(
                "connection_lost", f"no reply to unsubscribe within {self.request_timeout_s} s"
            ) from error
        except SepaClientError as error:
            if error.error != "not_found":  # already gone is what the caller wanted
                raise
        finally:
            self._unsubscribing.pop(spuid, None)

    # -- reading, routing, reconnecting -------------------------------------------------------------

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Route every message until the socket closes."""
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    self._on_text(ws, message.data)
                elif message.type == aiohttp.WSMsgType.ERROR:
                    log.info("websocket error on %s: %s", self.subscribe_url, ws.exception())
                    break
        except (ConnectionError, aiohttp.ClientError) as error:
            log.info("websocket to %s lost: %s", self.subscribe_url, error)

    def _on_text(self, ws: aiohttp.ClientWebSocketResponse, data: str) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            log.warning("ignoring a non-JSON message from %s", self.subscribe_url)
            return
        if not isinstance(message, dict):
            return
        try:
            if isinstance(message.get("notification"), dict):
                self._on_notification(ws, message["notification"])
            elif isinstance(message.get("unsubscribed"), dict):
                future = self._unsubscribing.get(str(message["unsubscribed"].get("spuid")))
                if future is not None and not future.done():
                    future.set_result(None)
            elif "error" in message:
                self._on_error(message)
        except Exception:  # one bad message must not end every subscription of the socket
            log.exception("cannot handle a message from %s: %.200s", self.subscribe_url, data)

    def _on_notification(self, ws: aiohttp.ClientWebSocketResponse, body: dict[str, Any]) -> None:
        spuid = body.get("spuid")
        sequence = body.get("sequence")
        handle = self._by_spuid.get(spuid) if isinstance(spuid, str) else None
        if handle is not None:
            if sequence != handle.state.expected:
                self.stats.sequence_gaps += 1
                expected = handle.state.expected
                log.warning("subscription %s: sequence %s, expected %s; re-synchronising", spuid, sequence, expected)
                self._by_spuid.clear()  # nothing more from this socket: everything is re-subscribed
                self._spawn(ws.close())
                return
            handle.state.expected += 1
            self._deliver(handle, parse_notification(body, handle.alias), resync=False)
            return
        if sequence != 0:
            return  # a subscription ended locally; its last notifications may still be in flight
        queue = self._pending.get(str(body.get("alias")))
        if not queue:
            log.debug("unexpected sequence 0 for %s", spuid)
            return
        pending = queue.popleft()
        handle = pending.handle
        if pending.abandoned or not handle.active:
            self._spawn(self._send(ws, {"unsubscribe": {"spuid": spuid}}))
            if not pending.future.done():
                pending.future.set_result(None)
            return
        handle.spuid = str(spuid)
        handle.state.expected = 1
        self._by_spuid[handle.spuid] = handle
        self._live[handle] = None
        if pending.resync:
            self.stats.resubscriptions += 1
        self._deliver(handle, parse_notification(body, handle.alias), resync=pending.resync)
        if not pending.future.done():
            pending.future.set_result(None)

    def _deliver(self, handle: TransportSubscription, notification: Notification, *, resync: bool) -> None:
        try:
            handle.sink.notify(notification, resync=resync)
        except Exception:
            log.exception("notification sink failed for %s", handle.spuid)

    def _on_error(self, message: dict[str, Any]) -> None:
        error = SepaClientError.from_json(message)
        alias = message.get("alias")
        queue = self._pending.get(alias) if isinstance(alias, str) else None
        if queue:
            pending = queue.popleft()
            error.alias = pending.handle.alias
            if not pending.future.done():
                pending.future.set_exception(error)
            if pending.resync:  # the broker refuses a subscription it accepted before
                self._end(pending.handle, error)
            return
        if alias is None and self._unsubscribing:
            for future in self._unsubscribing.values():
                if not future.done():
                    future.set_exception(error)
                    return
        log.warning("unmatched error from %s: %s", self.subscribe_url, message)

    def _end(self, handle: TransportSubscription, error: SepaClientError) -> None:
        handle.active = False
        self._live.pop(handle, None)
        try:
            handle.sink.lost(error)
        except Exception:
            log.exception("notification sink failed for %s", handle.spuid)

    def _fail_pending(self, error: SepaConnectionError) -> None:
        for queue in self._pending.values():
            for pending in queue:
                if not pending.future.done():
                    pending.future.set_exception(error)
                    pending.future.exception()  # mark retrieved: nobody may be waiting any more
        self._pending.clear()
        for future in self._unsubscribing.values():
            if not future.done():
                future.set_exception(error)
                future.exception()

    def _spawn(self, awaitable: Any) -> None:
        task = asyncio.ensure_future(awaitable)
        self._background.add(task)

        def done(finished: asyncio.Future[Any]) -> None:
            self._background.discard(finished)
            if not finished.cancelled():
                finished.exception()  # a failed fire-and-forget send is not worth a warning

        task.add_done_callback(done)

    async def _supervise(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Read the socket; when it drops, reconnect and re-subscribe while subscriptions are live."""
        while True:
            await self._read(ws)
            self._ws = None
            self._by_spuid.clear()
            if self._resubscriber is not None:
                self._resubscriber.cancel()
            self._fail_pending(
                SepaConnectionError("connection_lost", f"the connection to {self.subscribe_url} was lost")
            )
            if self.state == "closed":
                return
            if not self._live:
                self.state = "idle"  # nothing to restore: the next subscribe reconnects
                return
            self.state = "reconnecting"
            log.warning("websocket to %s lost; %d subscriptions to restore", self.subscribe_url, len(self._live))
            reopened = await self._reopen() if self.reconnect.enabled else None
            if reopened is None:
                error = SepaConnectionError(
                    "connection_lost", f"the connection to {self.subscribe_url} was lost and could not be restored"
                )
                for handle in list(self._live):
                    self._end(handle, error)
                if self.state != "closed":
                    self.state = "idle"
                return
            ws = reopened
            self._ws, self.state = ws, "connected"
            self.stats.reconnects += 1
            self._resubscriber = asyncio.create_task(self._resubscribe_all(ws), name="sepa-client-resubscribe")

    async def _reopen(self) -> aiohttp.ClientWebSocketResponse | None:
        attempt = 0
        while self.state == "reconnecting":
            if self.reconnect.max_attempts is not None and attempt >= self.reconnect.max_attempts:
                log.error("giving up on %s after %d attempts", self.subscribe_url, attempt)
                return None
            delay = self.reconnect.delay(attempt)
            self.stats.delays.append(delay)
            await asyncio.sleep(delay)
            attempt += 1
            self.stats.reconnect_attempts += 1
            if not self._live:
                return None  # everything was unsubscribed meanwhile
            with contextlib.suppress(SepaConnectionError):
                return await self._open_socket()
        return None

    async def _resubscribe_all(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Subscribe every live subscription again; each new sequence 0 goes out with resync=True."""
        handles = [handle for handle in self._live if handle.active]

        async def one(handle: TransportSubscription) -> None:
            try:
                await self._request_subscription(ws, handle, resync=True)
            except SepaConnectionError:
                # the socket dropped again, or the broker did not answer: either way the supervisor
                # starts over (reconnect, re-subscribe everything) once this socket is closed
                if not ws.closed:
                    self._spawn(ws.close())
            except SepaClientError as error:
                log.error("re-subscribing %s was refused: %s", handle.alias or handle.spuid, error)
                # _on_error already ended it

        await asyncio.gather(*(one(handle) for handle in handles))
        log.info("re-subscribed %d subscriptions on %s", len(handles), self.subscribe_url)

    async def close(self) -> None:
        """Close the socket (the broker ends its subscriptions) and the HTTP session."""
        if self.state == "closed":
            return
        self.state = "closed"
        for handle in self._live:
            handle.active = False
        self._live.clear()
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
        for task in (self._supervisor, self._resubscriber, *self._background):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._fail_pending(SepaConnectionError("connection_lost", "the client was closed"))
        if self._session is not None:
            await self._session.close()


def _nquads(text: object) -> frozenset[Quad]:
    """The quads of an update's reply (N-Quads text; "" for none)."""
    if not isinstance(text, str):
        raise TypeError("the quads are not text")
    return frozenset(parse(text, format=RdfFormat.N_QUADS)) if text else frozenset()
