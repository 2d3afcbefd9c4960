"""Routing and error replies of a gate, in front of aiohttp's low-level server (``web.Server``).

Why not ``web.Application``: its router, middleware chain and per-request application bookkeeping
cost ~8 us of CPU per request (measured against ``web.Server`` with a dict lookup), a twentieth of
what the gateway spends on a whole update. A gate serves a handful of fixed paths, one of them with
a trailing parameter, so a dict lookup does. What the application did for us is kept, so that the
replies are the same on the wire (PROTOCOL.md "Errors"):

- routes resolve as aiohttp's router resolves them: on the path with ``%2F`` and ``%25`` still
  encoded, GET routes also answering HEAD, 404 for an unknown path, 405 for a known one with
  another method (with an ``Allow`` header);
- ``Expect`` is handled before any route runs, as aiohttp's default expect handler does (``100
  Continue``), and an unknown expectation is a JSON 417 that does not echo it;
- the request body limit (413) applies through the request factory;
- the error middleware's duties: OPTIONS preflight answered 204, every failure turned into the
  protocol's JSON error and counted.

And what a browser must not be able to do to a gateway on its user's network (the origin policy):

- CORS headers go only to origins the operator listed (``[http] cors_origins``), naming that
  origin; any other page gets none, so the browser keeps the replies from it;
- a state-changing request (POST, DELETE) and a WebSocket upgrade that carry an ``Origin`` other
  than the gateway's own (same host and port: a name that is ours, see below; on the secure gates,
  over TLS, ``https://`` and whatever ``Host`` the request names, since TLS checked that name) or a
  listed one, or ``Sec-Fetch-Site: cross-site``,
  are refused with 403 before any handler runs: a cross-origin form post or ``fetch`` executes
  nothing, and a foreign page cannot subscribe. Clients that send no ``Origin`` (curl, SEPA
  clients, the adapters) are not affected. The common case, a request without ``Origin``, costs
  one header lookup;
- on the plain gates, a request whose ``Host`` names a DNS name that is not ours is refused with
  421 ``misdirected_request`` before anything else (``Expect`` included) runs. Why: a page at
  ``attacker.example`` whose name the attacker rebinds to 127.0.0.1 is same-origin with itself,
  so its ``fetch('/query?query=...')`` carries no ``Origin`` and the browser lets it read the
  reply; only the ``Host`` it sends (``attacker.example:8000``) gives it away. Ours: IP literals,
  ``localhost``, this machine's name and ``<name>.local``, and ``[http] allowed_hosts``. A request
  without ``Host`` (HTTP/1.0) is served. The decision is cached per ``Host`` value (bounded), so
  the common case costs one header lookup and one dict lookup. The secure gates do not check:
  TLS does it for them, a browser sends nothing to ``https://attacker.example:8443`` once the
  gateway's certificate does not name ``attacker.example`` (docs/security.md, "Browsers").

A gate is one :class:`Routes` table served by one :class:`Dispatcher`; a secure gate builds its
own table (with its checks in the handlers) and its own dispatcher over the same handlers.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import StreamReader, hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import HttpVersion10, HttpVersion11, RawRequestMessage
from multidict import CIMultiDict

from broker.errors import SepaError
from broker.gates.bodies import BodiesFull, HeldBodies
from broker.gates.budget import PerAddress, TokenBucket
from broker.gates.connections import ConnectionLimit
from broker.gates.errors import CORS_HEADERS, HTTP_ERRORS, UnsupportedMediaType, json_error
from broker.gates.slow import GuardedHandler, GuardedServer
from broker.quiet_log import QuietLog

log = logging.getLogger(__name__)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

# what a `{name}` segment of an aiohttp route matches
_NOT_IN_SEGMENT = frozenset("/{}")

_SERVED_VERSIONS = (HttpVersion11, HttpVersion10)
FAULTY_FRAMING = "sepa_faulty_framing"  # the request's key for why its framing is refused (_faulty_framing)
# Host values whose decision (ours or not) a dispatcher keeps; past it the cache starts again, so a
# client sending ever new names costs memory no more than this, and a decision a few microseconds
HOSTS_CACHED = 256
# A Host header as RFC 9110 7.2 has it: a name or IPv4 address, or a bracketed IPv6 literal, and an
# optional port of digits. Why: a Host that is no such thing was read by its part before the last
# colon, so `localhost:80@evil.example` (a URL's userinfo turned inside out) was ours
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::[0-9]{0,5})?")
MISDIRECTED_LOG_EVERY_S = 60.0  # a refused Host is logged once a minute at most per gate (with the count)


def last_segment(request: web.BaseRequest) -> str:
    """The value of the trailing ``{name}`` segment of the route `request` matched, decoded as
    aiohttp's router decodes it (the path is already decoded but for ``%2F`` and ``%25``)."""
    value = request.rel_url.path_safe.rpartition("/")[2]
    return value.replace("%2F", "/").replace("%25", "%") if "%" in value else value


class Routes:
    """Method and path -> handler for one gate.

    A path is either exact, or ends with one ``/{name}`` segment (read by the handler with
    :func:`last_segment`). A path registered both ways resolves as aiohttp's router does: the exact
    route first, then the parameterized one; a method allowed by neither is a 405 listing both's.
    """

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Handler]] = {}
        self._parameterized: list[tuple[str, dict[str, Handler]]] = []  # ("/prefix/", methods)

    def get(self, path: str, handler: Handler) -> None:
        """GET, and HEAD as aiohttp adds it to every GET route."""
        self.add("GET", path, handler)
        self.add("HEAD", path, handler)

    def post(self, path: str, handler: Handler) -> None:
        self.add("POST", path, handler)

    def delete(self, path: str, handler: Handler) -> None:
        self.add("DELETE", path, handler)

    def add(self, method: str, path: str, handler: Handler) -> None:
        if not path.startswith("/"):
            raise ValueError(f"a route path starts with '/', not {path!r}")
        prefix, _, last = path.rpartition("/")
        if last.startswith("{") and last.endswith("}"):
            key = prefix + "/"
            methods = next((table for start, table in self._parameterized if start == key), None)
            if methods is None:
                methods = {}
                self._parameterized.append((key, methods))
        else:
            methods = self._exact.setdefault(path, {})
        if method in methods:
            raise ValueError(f"{method} {path} is routed twice")
        methods[method] = handler

    def resolve(self, method: str, path: str) -> Handler:
        """The handler for `method` on `path` (the request's ``rel_url.path_safe``); raises aiohttp's
        404 or 405 (whose ``Allow`` lists the path's methods) when there is none."""
        handler, allowed = self._lookup(method, path)
        if handler is not None:
            return handler
        if allowed:
            raise web.HTTPMethodNotAllowed(method, allowed)
        raise web.HTTPNotFound()

    def methods(self, path: str) -> set[str]:
        """The methods routed on `path`; empty when no route matches it."""
        return self._lookup("", path)[1]

    def _lookup(self, method: str, path: str) -> tuple[Handler | None, set[str]]:
        allowed: set[str] = set()
        methods = self._exact.get(path)
        if methods is not None:
            handler = methods.get(method)
            if handler is not None:
                return handler, allowed
            allowed.update(methods)
        for prefix, methods in self._parameterized:
            if path.startswith(prefix) and _is_segment(path[len(prefix) :]):
                handler = methods.get(method)
                if handler is not None:
                    return handler, allowed
                allowed.update(methods)
        return None, allowed


def _is_segment(text: str) -> bool:
    return bool(text) and _NOT_IN_SEGMENT.isdisjoint(text)


class Dispatcher:
    """The request handler of one gate's ``web.Server``: routing, body limit, error replies, CORS."""

    def __init__(
        self,
        routes: Routes,
        counters: Counter[str],
        *,
        max_request_bytes: int,
        cors_origins: Sequence[str] = (),
        idle_timeout_s: float = 60.0,
        request_timeout_s: float = 20.0,
        limit: ConnectionLimit | None = None,
        frame_budgets: PerAddress[TokenBucket] | None = None,
        bodies: HeldBodies | None = None,
        allowed_hosts: Sequence[str] = (),
        refuse_foreign_hosts: bool = True,
        no_store: bool = False,
    ) -> None:
        self.routes = routes
        self.limit = limit  # connections held open, shared by every gate (broker.gates.connections)
        self.frame_budgets = frame_budgets  # WebSocket control frames per address, every gate's (broker.gates.slow)
        self.counters = counters
        self.max_request_bytes = max_request_bytes
        # request bodies in flight, shared by every gate (broker.gates.bodies)
        self.bodies = bodies if bodies is not None else HeldBodies(None, max_request_bytes)
        # a kept-alive connection with no request for this long is closed (aiohttp's default, an hour,
        # let idle clients hold descriptors indefinitely); a WebSocket is held by its heartbeat instead
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s  # a request's head and body arrive within this (broker.gates.slow)
        self.cors_origins = frozenset(origin.rstrip("/") for origin in cors_origins)
        # names that are ours besides IP literals, localhost and this machine's ([http] allowed_hosts);
        # they count for the Host check and for the same-origin check of the origin policy
        self.allowed_hosts = frozenset(_bare_name(name) for name in allowed_hosts)
        self.refuse_foreign_hosts = refuse_foreign_hosts  # False on the secure gates (TLS checks the name)
        # True on the secure gates: a reply without Cache-Control of its own gets `no-store`. Why: a
        # token (RFC 6749 5.1 asks for no-store), results and rights behind a token were cacheable by
        # a browser's disk cache or a proxy; the dashboard's pages keep their own `no-cache`
        self.no_store = no_store
        self._hosts: dict[str, bool] = {}  # Host header value -> ours (at most HOSTS_CACHED)
        # what a client off this board can cause with every request: once a minute at most (broker.quiet_log)
        self._misdirected_log = QuietLog(
            log,
            "request for a host name that is not ours refused (see [http] allowed_hosts)",
            every_s=MISDIRECTED_LOG_EVERY_S,
        )
        self._cross_origin_log = QuietLog(log, "cross-origin request refused")

    def server(self) -> web.Server:
        """A low-level aiohttp server for this gate (call with the event loop running)."""
        loop = asyncio.get_running_loop()
        limit = self.max_request_bytes

        def make_request(
            message: RawRequestMessage,
            payload: StreamReader,
            protocol: web.RequestHandler,
            writer: AbstractStreamWriter,
            task: asyncio.Task[None],
        ) -> web.BaseRequest:
            refusal = _faulty_framing(message)
            if refusal is not None:  # answered, then closed; as HTTP/1.1 when it named neither version served
                version = message.version if message.version in _SERVED_VERSIONS else HttpVersion11
                message = message._replace(version=version, should_close=True)
            request = web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=limit)
            if refusal is not None:
                request[FAULTY_FRAMING] = refusal
            return request

        return GuardedServer(
            self,
            request_factory=make_request,
            access_log=None,
            auto_decompress=False,  # a coded body is refused (_dispatch), never inflated
            keepalive_timeout=self.idle_timeout_s,
            head_timeout_s=self.request_timeout_s,
            on_timeout=self._timed_out,
            on_flood=self._flooded,
            on_unparsable=self._unparsable,
            on_stall=self._stalled,
            on_incoming_full=self._incoming_full,
            limit=self.limit,
            frame_budgets=self.frame_budgets,
            bodies=self.bodies,
        )

    def _options_on(self, path: str) -> set[str]:
        """The methods OPTIONS names for `path` (``*``: the server as a whole). A path no route
        matches has none: it answered 204, naming a resource that is not there."""
        return {"GET", "HEAD", "POST", "DELETE"} if path == "*" else self.routes.methods(path)

    def _coded(self, coding: str) -> web.Response:
        """A body with a content coding (RFC 9110 8.4): 415, as RFC 7694 asks. Why not inflate it:
        no SEPA client compresses a request, aiohttp took a gzip body cut short as the text it
        inflated to (an update half-sent was applied), and a body that was not gzip at all was a
        500 with a traceback in the log."""
        error = UnsupportedMediaType(f"Content-Encoding {coding[:40]!r} is not taken: send the body as it is")
        self.counters[f"{error.error}:{error.status_code}"] += 1
        reply = json_error(error.error, error.description, error.status_code)
        reply.headers["Accept-Encoding"] = "identity"
        reply.force_close()  # the coded body is not read: the connection cannot carry another request
        return reply

    def _timed_out(self) -> None:
        self.counters["request_timeout:408"] += 1

    def _flooded(self) -> None:
        self.counters["ws_frame_floods"] += 1

    def _incoming_full(self) -> None:
        self.counters["ws_incoming_cut"] += 1

    def _stalled(self) -> None:
        self.counters["write_stalls"] += 1

    def _unparsable(self) -> None:
        self.counters["invalid_request:400"] += 1

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        protocol = request.protocol
        try:
            body = self.bodies.take(request)
        except BodiesFull as error:
            response = self._refused(error)
            response.force_close()  # its body is not read: the connection cannot carry another request
        else:
            try:
                if isinstance(protocol, GuardedHandler):
                    protocol.handling(True)
                    try:
                        response = await self._dispatch(request)
                    finally:
                        protocol.handling(False)
                else:
                    response = await self._dispatch(request)
            finally:
                self.bodies.give_back(body)
        if not response.prepared:  # a WebSocket's headers are gone already
            self._protect(response.headers)
        return response

    def _protect(self, headers: CIMultiDict[str]) -> None:
        """Headers every reply carries, a handler's own kept. Why: the API replies had none of the
        dashboard's: a legacy browser sniffed a reply whose text a client chose (a literal in a
        result, an error quoting a request) as HTML without `nosniff`, and framed the dashboard
        (IE 11 ignores CSP frame-ancestors) without `X-Frame-Options`. `Pragma: no-cache` beside
        `no-store`: RFC 6749 5.1 asks for both on a token reply (HTTP/1.0 caches know only Pragma)."""
        headers.setdefault(hdrs.X_CONTENT_TYPE_OPTIONS, "nosniff")
        headers.setdefault(hdrs.X_FRAME_OPTIONS, "DENY")
        if self.no_store and headers.setdefault(hdrs.CACHE_CONTROL, "no-store") == "no-store":
            headers.setdefault(hdrs.PRAGMA, "no-cache")

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        faulty = request.get(FAULTY_FRAMING)
        if faulty is not None:
            error, description, status = faulty
            self.counters[f"{error}:{status}"] += 1
            refusal = json_error(error, description, status)
            refusal.force_close()  # its body is not read: the connection cannot carry another request
            return refusal
        if self.refuse_foreign_hosts:
            host = request.headers.get(hdrs.HOST)
            if host and not self._hosts.get(host, False) and not self.ours(host):
                return self._misdirected(request, host)
        coding = request.headers.get(hdrs.CONTENT_ENCODING)
        if coding is not None and coding.strip().lower() not in ("", "identity"):
            return self._coded(coding)
        if request.headers.get(hdrs.EXPECT) and not await _expect(request):
            self.counters["expectation_failed:417"] += 1
            refusal = json_error("expectation_failed", "only the expectation 100-continue is understood", 417)
            refusal.force_close()  # the body was not invited: the connection cannot carry another request
            return refusal
        origin = request.headers.get(hdrs.ORIGIN)
        allowed = origin is not None and origin in self.cors_origins
        if request.method == "OPTIONS":
            methods = self._options_on(request.rel_url.path_safe)
            if methods:  # else a 404 below, as any other method on a path no route matches
                headers = {"Allow": ", ".join(sorted(methods | {"OPTIONS"})), **(_cors(origin) if allowed else {})}
                return web.Response(status=204, headers=headers)
        if (origin is not None or request.headers.get("Sec-Fetch-Site") == "cross-site") and not allowed:
            refusal = self._cross_origin(request, origin)
            if refusal is not None:
                return refusal
        try:
            response = await self.routes.resolve(request.method, request.rel_url.path_safe)(request)
        except SepaError as error:
            return self._refused(error)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            name = HTTP_ERRORS.get(error.status, "http_error")
            self.counters[f"{name}:{error.status}"] += 1
            reply = json_error(name, error.reason or name, error.status)
            allow = error.headers.get(hdrs.ALLOW)
            if allow is not None:
                reply.headers[hdrs.ALLOW] = allow
            return reply
        except ConnectionError:  # the client left before its request was complete (or a pong written): not our fault
            self.counters["invalid_request:400"] += 1
            return json_error("invalid_request", "connection lost before the request was complete", 400)
        except Exception:
            self.counters["internal_error:500"] += 1
            log.exception("internal error", extra={"path": request.path})
            return json_error("internal_error", "internal error (logged)", 500)
        if allowed and not isinstance(response, web.WebSocketResponse):
            response.headers.update(_cors(origin))  # type: ignore[arg-type]
        return response

    def _refused(self, error: SepaError) -> web.Response:
        """The error reply of `error`, counted."""
        self.counters[f"{error.error}:{error.status_code}"] += 1
        reply = json_error(error.error, error.description, error.status_code)
        headers = getattr(error, "headers", None)  # Retry-After of a refused authentication, a full budget
        if headers:
            reply.headers.update(headers)
        return reply

    def _cross_origin(self, request: web.BaseRequest, origin: str | None) -> web.Response | None:
        """403 for a state-changing request or a WebSocket upgrade from another site; None if fine."""
        upgrade = request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"
        if request.method not in ("POST", "DELETE", "PUT", "PATCH") and not upgrade:
            return None  # reads: CORS already keeps the reply from a foreign page
        if (
            origin is not None
            and _same_origin(origin, request.host)
            and (self.ours(request.host) or self._tls_origin(request, origin))
            and request.headers.get("Sec-Fetch-Site") != "cross-site"
        ):
            return None
        self.counters["forbidden:403"] += 1
        self._cross_origin_log(origin=(origin or "")[:200], path=request.path[:200])
        return json_error("forbidden", "cross-origin requests are refused (see [http] cors_origins)", 403)

    def _tls_origin(self, request: web.BaseRequest, origin: str) -> bool:
        """Whether a request on a secure gate, over TLS, comes from ``https://<its own Host>``: then
        it is same-origin whatever the name. Why: a browser sends that Origin over TLS to us only
        after our certificate named that host (a DNS-rebinding page fails at the handshake), so a
        name of the operator's certificate needs no listing in ``allowed_hosts`` here either."""
        return not self.refuse_foreign_hosts and request.secure and origin[:8].lower() == "https://"

    def ours(self, host: str) -> bool:
        """Whether `host` (a Host header: name or IP literal, and port) names this gateway: an IP
        address, localhost, this machine's name or ``<name>.local``, or a name of ``allowed_hosts``.
        Why not any name: a DNS-rebinding page is served under a name of the attacker's."""
        known = self._hosts.get(host)
        if known is None:
            name = _bare_name(_host_name(host))
            known = _HOST.fullmatch(host) is not None and (name in self.allowed_hosts or _our_name(name))
            if len(self._hosts) >= HOSTS_CACHED:
                self._hosts.clear()
            self._hosts[host] = known
        return known

    def _misdirected(self, request: web.BaseRequest, host: str) -> web.Response:
        """421 for a request sent under a DNS name that is not ours (a DNS-rebinding page's, or a
        name the operator did not list); logged once a minute at most, with the count since."""
        self.counters["misdirected_request:421"] += 1
        self._misdirected_log(host=host[:200], path=request.path[:200])
        return json_error(
            "misdirected_request",
            "this gateway does not serve the host name the request names; "
            "an operator can list it in [http] allowed_hosts",
            421,
        )


def _cors(origin: str) -> dict[str, str]:
    return {"Access-Control-Allow-Origin": origin, **CORS_HEADERS}


def _same_origin(origin: str, host: str) -> bool:
    """Whether `origin` (scheme://host[:port]) names the host and port the request was sent to.
    That the host is ours is the dispatcher's question (``Dispatcher.ours``): a page of a
    DNS-rebinding attacker is same-origin with its own name, pointed at our address."""
    scheme, separator, authority = origin.partition("://")
    if not separator:
        return False
    default = {"http": "80", "ws": "80", "https": "443", "wss": "443"}.get(scheme.lower())
    return _with_port(authority.lower(), default) == _with_port(host.lower(), default)


def _host_name(host: str) -> str:
    """The name or address of a Host header, without its port nor an IPv6 literal's brackets."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name.strip("[]")


def _bare_name(name: str) -> str:
    """A host name as compared: lower case, without the trailing dot of a fully qualified one."""
    return name.lower().removesuffix(".")


def _our_name(name: str) -> bool:
    """Whether `name` (bare: :func:`_host_name`, :func:`_bare_name`) is an IP address, localhost,
    this machine's name or ``<its name>.local`` (mDNS)."""
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    own = socket.gethostname().lower()
    return name in ("localhost", own, f"{own}.local")


def _faulty_framing(message: RawRequestMessage) -> tuple[str, str, int] | None:
    """Why a request's framing is refused, as (error, description, status) (RFC 9112 2.3, 6.1), or None.

    Why: aiohttp's parser framed `Transfer-Encoding: gzip, chunked` (or `foo, chunked`) as chunked
    alone and handed the coded bytes over as the body (`identity, chunked` applied the update),
    took `Transfer-Encoding: chunked` on HTTP/1.0, which the RFC calls faulty framing, and served
    `HTTP/2.0` and `HTTP/0.9` request lines, answering `HTTP/2.0 200 OK` in HTTP/1.1's text. A
    proxy in front may frame such a request otherwise; now it is refused before its body is read."""
    version = message.version
    if version not in _SERVED_VERSIONS:
        return "http_version_not_supported", "only HTTP/1.1 and HTTP/1.0 are served", 505
    coding = message.headers.get(hdrs.TRANSFER_ENCODING)
    if coding is None:
        return None
    if version == HttpVersion10:
        return "invalid_request", "Transfer-Encoding is not HTTP/1.0: send Content-Length", 400
    if coding.strip().lower() != "chunked":
        return "not_implemented", "the only transfer coding taken is chunked: send the body as it is", 501
    return None


def _with_port(authority: str, default: str | None) -> str:
    if authority.endswith("]") or ":" not in authority.rsplit("]", 1)[-1]:
        return f"{authority}:{default}"
    return authority


async def _expect(request: web.BaseRequest) -> bool:
    """What aiohttp's default expect handler does: ``100 Continue`` for ``Expect: 100-continue`` on
    HTTP/1.1, nothing on HTTP/1.0; False for any other expectation (417). Why not aiohttp's 417: its
    text/plain body echoed the header's value back, whatever a client put there."""
    if request.version != HttpVersion11:
        return True
    if request.headers.get(hdrs.EXPECT, "").lower() != "100-continue":
        return False
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the interim reply is not part of the response's size
    await request.writer.drain()
    return True
