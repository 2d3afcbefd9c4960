"""HTTP gate: SPARQL 1.1 Protocol query and update (PROTOCOL.md "HTTP")."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import parse_qsl, unquote_to_bytes

from aiohttp import StreamReader, hdrs, web
from multidict import CIMultiDict, MultiDict, MultiDictProxy
from pyoxigraph import Quad, RdfFormat
from pyoxigraph import serialize as rdf_serialize

from broker.core.access import GraphAccess
from broker.core.clock import rfc3339
from broker.core.due import due_micros
from broker.core.engine import Engine
from broker.core.held import quad_weight
from broker.core.pending import PendingUpdate
from broker.core.results import UpdateResult
from broker.delayed import now_micros
from broker.errors import InvalidRequest
from broker.gates.dispatch import Routes, last_segment
from broker.gates.errors import BadRequest, ServiceTimeout, UnsupportedMediaType
from broker.gates.replies import HeldReplies, HeldReply
from broker.gates.slow import read_within
from broker.scheduler import Scheduler
from broker.sparql.tokens import unescape_iris
from broker.workers.jobs import serialized

FORM = "application/x-www-form-urlencoded"
QUERY_TYPE = "application/sparql-query"
UPDATE_TYPE = "application/sparql-update"
# what web.Response(text=..., content_type="application/json") sends; a CIMultiDict, which the
# Response copies faster than it builds one from a dict
UPDATE_REPLY_HEADERS = CIMultiDict({"Content-Type": "application/json; charset=utf-8"})
REPRESENTATION_HEADERS = {
    "Content-Type": "application/json; charset=utf-8",
    "Preference-Applied": "return=representation",
}
# GET /scheduled: pending updates in one reply at most (and by default). Why a limit: the list was
# one reply, bounded only by max_pending_bytes (64 MiB of SPARQL, more as JSON).
SCHEDULED_MAX_LIMIT = 1000
# quads of an update's reply serialized at a time, by quad_weight (a 256-character unit): ~1 MB of text
REPRESENTATION_SLICE_WEIGHT = 4096
_POSITION = re.compile(r"(-?\d{1,20})\.(\d{1,20})")
_HIGH_ESCAPE = re.compile(r"%[89A-Fa-f]")  # the escape of a byte past ASCII (_check_query_string)


def _single(params: MultiDictProxy[str], name: str) -> str | None:
    values = params.getall(name, [])
    if len(values) > 1:
        raise BadRequest(f"more than one {name!r} parameter")
    return values[0] if values else None


async def _utf8_body(request: web.BaseRequest) -> str:
    """The body as text: SPARQL requests are UTF-8 (strictly), whatever charset the client claims."""
    charset = request.charset
    if charset is not None and charset.lower() not in ("utf-8", "utf8"):
        raise BadRequest(f"the body must be UTF-8, not {charset}")
    return (await _whole_body(request)).decode("utf-8")


async def _whole_body(request: web.BaseRequest) -> bytes | bytearray:
    """The body (413 past the request's limit), taken at once when it has all arrived: a small
    update's body comes in the segment that carried its headers, and ``request.read()``'s loop of
    reads costs more than the rest of the gate's work on it. Read it only once.

    One still arriving is read here, not by ``request.read()``: that one keeps the body's bytes on
    the request until its handler returns (and made them from a buffer of its own, two copies at
    once), so the bytes of a large update stayed beside its text for all of its processing. A
    gateway given one 23.7 MB INSERT DATA (run --data-dir as installed): peak RSS (VmHWM) +346-348
    MB, +325 MB with the body let go of once decoded (measured 2026-12-07)."""
    payload = request.content
    limit = request.client_max_size
    if not payload.is_eof():
        return await read_within(request, _read_all(payload, limit))
    body = payload.read_nowait()
    if limit and len(body) > limit:
        raise web.HTTPRequestEntityTooLarge(limit, len(body))
    return body


async def _read_all(payload: StreamReader, limit: int) -> bytearray:
    """The rest of `payload`, 413 as soon as it passes `limit` (0: none), as ``request.read()`` does."""
    body = bytearray()
    while chunk := await payload.readany():
        body += chunk
        if limit and len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(limit, len(body))
    return body


def _check_query_string(request: web.BaseRequest) -> None:
    """400 when the URL's parameters are not UTF-8 behind their %XX escapes, as a form's are not taken.

    Why: yarl decodes them with replacement, so `GET /query?query=...'%FF'...` ran with the literal
    U+FFFD and answered 200 with the rows of a value the client never sent, where the same
    parameter in a form body is a 400. The separators are ASCII, so the whole string is valid
    exactly when every name and value is."""
    raw = request.raw_path.partition("?")[2]
    if _HIGH_ESCAPE.search(raw) is None:  # escapes of ASCII alone (most queries): 1.8 us, not 14, for 100 characters
        return
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeError:
        raise BadRequest("the URL's parameters are not valid UTF-8 behind their %XX escapes") from None


async def _read(request: web.BaseRequest, field: str, direct_type: str) -> tuple[str, MultiDictProxy[str]]:
    """The SPARQL text (its IRIs' codepoint escapes decoded: broker.sparql.tokens.unescape_iris) and
    the protocol parameters, from GET, form POST or direct POST."""
    _check_query_string(request)
    if request.method in ("GET", "HEAD"):  # a HEAD with a body ran updates, past the cross-origin check
        if field == "update":
            raise web.HTTPMethodNotAllowed(request.method, ["POST"], reason="updates must be sent with POST")
        params = request.query
    elif request.content_type == FORM:
        try:
            form = MultiDict(parse_qsl(await _utf8_body(request), keep_blank_values=True, errors="strict"))
        except UnicodeDecodeError as error:
            raise BadRequest("the form is not valid UTF-8") from error
        if _single(request.query, field) is not None:
            raise BadRequest(f"{field!r} given both in the URL and in the body")
        merged = request.query.copy()
        merged.extend(form)  # type: ignore[arg-type]
        params = MultiDictProxy(merged)
    elif request.content_type == direct_type:
        try:
            text = await _utf8_body(request)
        except UnicodeDecodeError as error:
            raise BadRequest("the body is not valid UTF-8") from error
        if _single(request.query, field) is not None:
            raise BadRequest(f"{field!r} given both in the URL and in the body")
        return unescape_iris(text), request.query
    else:
        raise UnsupportedMediaType(f"send {direct_type} or {FORM}, not {request.content_type or 'no content type'}")
    text = _single(params, field)  # type: ignore[arg-type]
    if text is None:
        raise BadRequest(f"missing {field!r} parameter")
    return unescape_iris(text), params  # type: ignore[return-value]


class HttpGate:
    """Handlers of /query and /update over one scheduler."""

    def __init__(
        self,
        scheduler: Scheduler,
        counters: Counter[str],
        *,
        max_result_bytes: int | None = None,
        reply_bytes_total: int | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.engine: Engine = scheduler.engine
        self.counters = counters
        self.max_result_bytes = max_result_bytes  # a query's body at most (broker.gates.negotiation.serialize)
        self.replies = HeldReplies(reply_bytes_total)  # every query body being written (broker.gates.replies)

    async def query(
        self, request: web.BaseRequest, access: GraphAccess | None = None, client: str | None = None
    ) -> web.Response:
        """A query; with `access` (secure gates), evaluated only over the graphs it may read; in
        its turn among `client`'s queries (secure gates: the identity; see broker.scheduler.FairShare)."""
        sparql, params = await _read(request, "query", QUERY_TYPE)
        if "update" in params:
            raise BadRequest("'update' is not a parameter of the query operation")
        self.counters["http_queries"] += 1
        accept = request.headers.get("Accept")
        default_graphs = params.getall("default-graph-uri", [])
        named_graphs = params.getall("named-graph-uri", [])
        if access is not None:
            default_graphs, named_graphs = access.restrict_dataset(
                default_graphs, named_graphs, sparql, self.engine.base_iri
            )

        base_iri = self.engine.base_iri

        calls_service = self.engine.queries.calls_service(sparql, base_iri)
        workers = self.engine.workers

        def run() -> tuple[bytes, str]:
            options = {
                "accept": accept,
                "default_graph_uri": default_graphs,
                "named_graph_uri": named_graphs,
                "max_bytes": self.max_result_bytes,
            }
            if workers is None:
                return serialized(self.engine.queries, sparql, base_iri=base_iri, **options)
            # a SERVICE call is stopped soon after its client's wait, not later; the grace lets the
            # client's wait end first, so that it hears 504 and not the worker's 503 (they raced)
            limit = min(workers.time_limit_s, self.engine.queries.service_timeout_s + 0.5) if calls_service else None
            return workers.run("serialized", sparql, base_iri=base_iri, time_limit_s=limit, **options)  # type: ignore[no-any-return]

        if not calls_service:
            body, content_type = await self.scheduler.run_query(run, client=client)
            return HeldReply(body, {"Content-Type": content_type}, self.replies, request)
        limit = self.engine.queries.service_timeout_s
        try:
            body, content_type = await asyncio.wait_for(self.scheduler.run_query(run, client=client), limit)
        except TimeoutError:
            # the evaluation cannot be stopped (pyoxigraph has no time limit): its thread finishes
            # when the endpoint answers or fails; the client has its answer now
            self.counters["service_timeouts"] += 1
            raise ServiceTimeout(f"a SERVICE endpoint did not answer within {limit:g} s") from None
        return HeldReply(body, {"Content-Type": content_type}, self.replies, request)

    async def update(
        self,
        request: web.BaseRequest,
        access: GraphAccess | None = None,
        owner: str | None = None,
        registration: str | None = None,
        token: tuple[str, int] | None = None,
    ) -> web.Response:
        """An update now (200 after end of processing), or later with `delay`/`at` (202 with its id).

        With `access` (secure gates) it reads and writes only what the client may; a delayed update
        remembers its `owner` and the `registration` (client_id) that scheduled it, and runs with the
        owner's rights when it falls due, if that registration still stands; and the `token` (jti,
        iat) it came with, whose revocation drops it (broker.delayed, "Revoked tokens")."""
        if (
            request.method == "POST"
            and request.headers.get(hdrs.CONTENT_TYPE) == UPDATE_TYPE
            and not request.query_string
        ):
            # the common case: a direct POST of exactly this media type (so no charset to check, and
            # no parsing of the header) without parameters (so none of the protocol's options apply);
            # any other spelling of the media type takes the general path, to the same effect
            try:
                sparql = unescape_iris((await _whole_body(request)).decode("utf-8"))
            except UnicodeDecodeError as error:
                raise BadRequest("the body is not valid UTF-8") from error
            self.counters["http_updates"] += 1
            # no extra turn of the loop: aiohttp runs each request in a task of its own and goes back
            # to the loop to send the reply and read the next request
            result = await self.scheduler.update(sparql, yield_to_loop=False, client=owner, access=access)
            return update_reply(_shown_to(result, access), request, self.replies)
        sparql, params = await _read(request, "update", UPDATE_TYPE)
        if "query" in params:
            raise BadRequest("'query' is not a parameter of the update operation")
        options = {
            "using_graph_uri": params.getall("using-graph-uri", []),
            "using_named_graph_uri": params.getall("using-named-graph-uri", []),
            "base_iri": self.engine.base_iri,
        }
        if "delay" in params or "at" in params:
            delay = _single(params, "delay")
            due = due_micros(delay, _single(params, "at"), now_micros())
            assert due is not None
            client = f"address {request.remote}"
            entry = await self.scheduler.delayed.schedule(
                sparql,
                due,
                relative=delay is not None,
                owner=owner,
                registration=registration,
                client=client,
                jti=token[0] if token is not None else None,
                iat=token[1] if token is not None else None,
                access=access,
                **options,  # type: ignore[arg-type]
            )
            self.counters["http_delayed_updates"] += 1
            return _json({"scheduled": scheduled_json(entry)}, status=202)
        self.counters["http_updates"] += 1
        result = await self.scheduler.update(
            sparql,
            yield_to_loop=False,
            client=owner,
            access=access,
            **options,  # type: ignore[arg-type]
        )
        return update_reply(_shown_to(result, access), request, self.replies)

    async def scheduled(
        self, request: web.BaseRequest, owner: str | None = None, registration: str | None = None
    ) -> web.Response:
        """GET /scheduled: the pending delayed updates, in due order (with `owner`, only its own, and
        with `registration`, only its current registration's: see DelayedUpdates.page), a
        page at a time: `limit` of them (1..SCHEDULED_MAX_LIMIT, that many by default) after the
        position `after`. When more follow, the reply's `next` is the `after` of the next page; a
        list that fits one page is the reply it always was."""
        raw_limit = request.query.get("limit", str(SCHEDULED_MAX_LIMIT))
        if not (raw_limit.isascii() and raw_limit.isdigit() and len(raw_limit) <= 5) or not (
            1 <= int(raw_limit) <= SCHEDULED_MAX_LIMIT
        ):
            raise InvalidRequest(f"limit must be an integer 1..{SCHEDULED_MAX_LIMIT}")
        limit = int(raw_limit)
        after = _position(request.query.get("after"))
        entries = await self.scheduler.delayed.page(after, limit + 1, owner, registration)
        document: dict[str, object] = {"scheduled": [scheduled_json(entry, full=True) for entry in entries[:limit]]}
        if len(entries) > limit:
            last = entries[limit - 1]
            document["next"] = f"{last.due_us}.{last.seq}"
        return _json(document)

    async def cancel(
        self, request: web.BaseRequest, owner: str | None = None, registration: str | None = None
    ) -> web.Response:
        """DELETE /scheduled/{id}: cancel a pending delayed update (404 when unknown or already run,
        and, with `owner`, when it is another client's or another registration's)."""
        entry = await self.scheduler.delayed.cancel(last_segment(request), owner=owner, registration=registration)
        return _json({"cancelled": scheduled_json(entry)})

    def add_routes(
        self,
        routes: Routes,
        query_path: str = "/query",
        update_path: str = "/update",
        scheduled_path: str = "/scheduled",
    ) -> None:
        routes.get(query_path, self.query)
        routes.post(query_path, self.query)
        routes.get(update_path, self.update)
        routes.post(update_path, self.update)
        routes.get(scheduled_path, self.scheduled)
        routes.delete(scheduled_path + "/{id}", self.cancel)


def _position(after: str | None) -> tuple[int, int] | None:
    """The `after` parameter of GET /scheduled: the `next` of an earlier reply (due time and seq)."""
    if after is None:
        return None
    match = _POSITION.fullmatch(after)
    if match is None:
        raise InvalidRequest("after must be the 'next' of an earlier reply of this list")
    return int(match[1]), int(match[2])


def scheduled_json(entry: PendingUpdate, *, full: bool = False) -> dict[str, object]:
    """A delayed update as the gate shows it: id and due time, and with `full` what it will do."""
    shown: dict[str, object] = {"id": entry.id, "due": rfc3339(entry.due_us)}
    if full:
        shown["update"] = entry.sparql
        shown["created"] = rfc3339(entry.created_us)
        if entry.using_graph_uri:
            shown["using-graph-uri"] = list(entry.using_graph_uri)
        if entry.using_named_graph_uri:
            shown["using-named-graph-uri"] = list(entry.using_named_graph_uri)
    return shown


def _shown_to(result: UpdateResult, access: GraphAccess | None) -> UpdateResult:
    """What the reply may say of `result`: the quads added and removed in graphs the client may read.

    Why: a client may write a graph it may not read (one that sends commands); counted whole, the
    reply said whether the graph held a quad already ("added": 0 to an INSERT DATA that changed
    nothing), and with return=representation a DROP listed all of it. The notifications count is
    0: it counts other clients' subscriptions over any graph, so it told the same."""
    if access is None or access.read is None:
        return result
    added, removed = access.readable_quads(result.added), access.readable_quads(result.removed)
    return replace(result, added=added, removed=removed, notifications=0)


def update_reply(result: UpdateResult, request: web.BaseRequest, replies: HeldReplies) -> web.Response:
    """200 with the counts, as ``json.dumps(result.to_json())`` spells them, formatted directly (the
    reply of every update: json.dumps and text encoding cost more than the formatting).

    With ``Prefer: return=representation`` (RFC 7240) the reply also holds the quads really added
    and removed, as N-Quads text (docs/protocol.md): what an in-process client reads from its
    UpdateResult, for every transport. Only the client's own update is shown, whose WHERE clause
    could read only what the client may read. That body counts in `replies` while it is written,
    and is never refused there: the update is applied (broker.gates.replies)."""
    prefer = request.headers.get("Prefer")
    if prefer is not None and "return=representation" in prefer.replace(" ", "").lower():
        return HeldReply(_representation(result), REPRESENTATION_HEADERS, replies, request, refusable=False)
    body = b'{"added": %d, "removed": %d, "notifications": %d}' % (
        len(result.added),
        len(result.removed),
        result.notifications,
    )
    return web.Response(body=body, headers=UPDATE_REPLY_HEADERS)


def _representation(result: UpdateResult) -> list[bytes]:
    """The reply with the quads, as ``json.dumps`` spells it, in parts that are never joined.

    Why: the whole N-Quads text as bytes, then as str, then the JSON document as str, then as
    bytes were three copies of the quads at once beside the update's own (20 MB of quads: 60 MB
    allocated to make the reply; an update of 24 MB of quads took the gateway's peak RSS +137-149
    MB, +69-123 MB without the header). Now a slice of the quads at a time is serialized and
    escaped, and the reply holds each slice once (22 MB), written and let go of part by part."""
    head = b'{"added": %d, "removed": %d, "notifications": %d, "quads": {"added": "' % (
        len(result.added),
        len(result.removed),
        result.notifications,
    )
    return [head, *_nquads_json(result.added), b'", "removed": "', *_nquads_json(result.removed), b'"}}']


def _nquads_json(quads: frozenset[Quad]) -> Iterator[bytes]:
    """`quads` sorted, as N-Quads escaped as a JSON string's content, a slice of about
    REPRESENTATION_SLICE_WEIGHT at a time (the escapes of a JSON string are character by character,
    so the slices' escapes are the whole text's)."""
    ordered = sorted(quads, key=str)
    start = 0
    while start < len(ordered):
        end, weight = start, 0
        while end < len(ordered) and weight < REPRESENTATION_SLICE_WEIGHT:
            weight += 1 + quad_weight(ordered[end])
            end += 1
        text = rdf_serialize(ordered[start:end], format=RdfFormat.N_QUADS).decode("utf-8")
        yield json.dumps(text)[1:-1].encode("ascii")
        start = end


def _json(document: object, *, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(document), status=status, content_type="application/json")
