"""The secure gates: HTTPS and WSS with OAuth 2.0 client credentials and JWT (PROTOCOL.md).

They serve the same handlers as the plain gates, each request first authenticated: a secure query
or subscription is evaluated only over the graphs its client may read, a secure update may write
only where its client may, a delayed update runs with its owner's rights when it falls due, and a
client lists and cancels only its own delayed updates. TLS is the ssl module's, set on the
listening sockets by the appliance; nothing here sees a byte of it.

Revocation: the registry file is looked at on every request (one stat), so a revoked client's
next request gets 401; a watcher ends the subscriptions of revoked clients, of clients whose
rights changed, and those made with a token revoked since (/oauth/revoke), within
:data:`WATCH_INTERVAL_S`, with a 401 error frame naming each.

Why the two OAuth endpoints answer each other's requests: sepy (the SEPA project's Python client,
which must work unchanged) swaps the registration and token URLs in its secure *query* path, so it
registers at /oauth/token and asks for tokens at /oauth/register. Each request is told apart by its
own shape (a JSON registration without credentials, Basic credentials without a body) and gets
exactly what it would get at the right address: no check is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from urllib.parse import parse_qs

from aiohttp import hdrs, web

from broker.errors import Forbidden, InvalidRequest
from broker.gates.connections import peer_host
from broker.gates.dispatch import Routes
from broker.gates.errors import UnsupportedMediaType
from broker.gates.http import HttpGate
from broker.gates.slow import read_within
from broker.gates.websocket import WebSocketGate
from broker.security.authority import Authority, Principal

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
QUERY_PATH = "/secure/query"
UPDATE_PATH = "/secure/update"
SCHEDULED_PATH = "/secure/scheduled"
SUBSCRIBE_PATH = "/secure/subscribe"
REGISTER_PATH = "/oauth/register"
TOKEN_PATH = "/oauth/token"
REVOKE_PATH = "/oauth/revoke"
RIGHTS_PATH = "/secure/rights"
METRICS_PATH = "/secure/metrics"
SPUS_PATH = "/secure/spus"
# what a client of the HTTPS port finds where (a page served on that port builds its URLs from it)
SECURE_PATHS = {
    "query": QUERY_PATH,
    "update": UPDATE_PATH,
    "scheduled": SCHEDULED_PATH,
    "subscribe": SUBSCRIBE_PATH,
    "rights": RIGHTS_PATH,
    "metrics": METRICS_PATH,
    "spus": SPUS_PATH,
    "register": REGISTER_PATH,
    "token": TOKEN_PATH,
    "revoke": REVOKE_PATH,
}


class SecureGate:
    """The handlers of the secure ports over the plain gates' HTTP handlers and a WebSocket gate of
    their own (whose every message is authenticated)."""

    def __init__(self, http: HttpGate, websocket: WebSocketGate, authority: Authority) -> None:
        self.http = http
        self.websocket = websocket
        self.authority = authority
        self._watcher: asyncio.Task[None] | None = None

    def principal(self, request: web.BaseRequest) -> Principal:
        return self.authority.authenticate(request.headers.get(hdrs.AUTHORIZATION), peer_of(request))

    async def query(self, request: web.BaseRequest) -> web.Response:
        principal = self.principal(request)
        return await self.http.query(request, principal.access, principal.identity)

    async def update(self, request: web.BaseRequest) -> web.Response:
        principal = self.principal(request)
        if principal.access.write == frozenset():  # refused now, not when a delayed update falls due
            raise Forbidden("this client may not write to any graph")
        return await self.http.update(
            request,
            principal.access,
            owner=principal.identity,
            registration=principal.client_id,
            token=(principal.jti, principal.iat) if principal.jti else None,
        )

    async def scheduled(self, request: web.BaseRequest) -> web.Response:
        principal = self.principal(request)
        return await self.http.scheduled(request, owner=principal.identity, registration=principal.client_id)

    async def cancel(self, request: web.BaseRequest) -> web.Response:
        principal = self.principal(request)
        return await self.http.cancel(request, owner=principal.identity, registration=principal.client_id)

    async def rights(self, request: web.BaseRequest) -> web.Response:
        """The requesting client's identity and current graph rights (``"*"``: every graph).

        Why an endpoint and not claims in the token: rights change while a token lives (`clients
        allow`, `revoke NAME --read G` apply on the next request), so only the registry says what
        a client may do now. A page asks before it shows a control that writes; the write is
        still checked when it is sent.
        """
        principal = self.principal(request)
        access = principal.access
        document = {
            "identity": principal.identity,
            "read": ["*"] if access.read is None else sorted(access.read),
            "write": ["*"] if access.write is None else sorted(access.write),
        }
        return _json(document, 200)

    async def register(self, request: web.BaseRequest) -> web.Response:
        body = await read_within(request, request.read())
        authorization = request.headers.get(hdrs.AUTHORIZATION, "")
        if not body and authorization.lower().startswith("basic "):
            return await self.token(request)  # a token request sent here: see the module docstring
        if request.content_type != "application/json":
            raise UnsupportedMediaType("send the registration as application/json")
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            raise InvalidRequest("the registration is not JSON") from None
        # charged to the address's failure budget here, on the event loop (broker.security.failures);
        # the registry file is locked, read and written (fsync'd): not on the event loop
        with self.authority.attempt(peer_of(request), "registration_refused"):
            reply = await asyncio.get_running_loop().run_in_executor(None, self.authority.register, document)
        return _json(reply, 201)

    async def token(self, request: web.BaseRequest) -> web.Response:
        if hdrs.AUTHORIZATION not in request.headers and request.content_type == "application/json":
            return await self.register(request)  # a registration sent here: see the module docstring
        grant_type = _grant_type(request.content_type, await read_within(request, request.read()))
        reply = self.authority.token(request.headers.get(hdrs.AUTHORIZATION), grant_type, peer_of(request))
        return _json(reply, 201)

    def add_routes(self, routes: Routes, *, websocket: bool = True) -> None:
        """The HTTPS port's routes (with `websocket`, the WSS subscribe path too)."""
        routes.get(QUERY_PATH, self.query)
        routes.post(QUERY_PATH, self.query)
        routes.get(UPDATE_PATH, self.update)
        routes.post(UPDATE_PATH, self.update)
        routes.get(SCHEDULED_PATH, self.scheduled)
        routes.get(RIGHTS_PATH, self.rights)
        routes.delete(SCHEDULED_PATH + "/{id}", self.cancel)
        routes.post(REGISTER_PATH, self.register)
        routes.post(TOKEN_PATH, self.token)
        routes.post(REVOKE_PATH, self.revoke)
        if websocket:
            routes.get(SUBSCRIBE_PATH, self.websocket.handle)

    async def revoke(self, request: web.BaseRequest) -> web.Response:
        """RFC 7009: the token named by a form's ``token`` field, or else the request's own bearer
        token, is refused from now on (a logout). 200 whether or not it was a valid token, as the
        RFC asks: the reply tells nothing about a token.

        The revocation is on disk before the reply (broker.security.revocations): once it is 200, a
        restart refuses the token too. The delayed updates scheduled with the token (or with any
        token a new cut-off covers) are dropped before the reply too: none of them runs
        (broker.delayed)."""
        body = await read_within(request, request.read())
        token = None
        if request.content_type == "application/x-www-form-urlencoded":
            named = parse_qs(body.decode("utf-8", errors="replace")).get("token")
            token = named[0] if named else None
        if token is None:
            scheme, _, rest = request.headers.get(hdrs.AUTHORIZATION, "").strip().partition(" ")
            token = rest.strip() if scheme.lower() == "bearer" else None
        if not token:
            raise InvalidRequest("name the token to revoke: a form's token field, or Authorization: Bearer <JWT>")
        revoked = self.authority.revoke(token, peer_of(request))
        if revoked is not None:
            await asyncio.gather(
                self.http.scheduler.delayed.drop_revoked(revoked.sub, revoked.jti, revoked.cut_off),
                self.authority.store(revoked),
            )
        return _json({}, 200)

    # -- revocation ---------------------------------------------------------------------------

    def start(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="secure-gates-revocation")

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None

    async def _watch(self) -> None:
        """Every WATCH_INTERVAL_S, when the registry's clients changed or a token was revoked: end
        the subscriptions whose client was revoked or whose rights changed, or whose token was
        revoked; when the registry changed, drop the delayed updates of registrations that ended
        (reset, revoked); once at start too (the registry may have changed while the gateway was
        down).

        Why polled, not run by each /oauth/revoke: a client with credentials can revoke as fast as
        it gets tokens, and each scan checks every secure subscription; polled, it costs one scan
        a second whatever the rate. A subscription confirmed after the revocation is refused where
        it is registered (WebSocketGate.subscribe), so none made with the token outlives the scan."""
        seen = -1
        while True:
            try:
                registry = self.authority.registry
                registry.current()
                tokens_revoked = self.authority.tokens_revoked()  # forgotten now: the full check sees them too
                ended = 0
                if registry.generation != seen:
                    seen = registry.generation
                    ended = await self.websocket.end_invalid(self.authority.validity())
                    await self.http.scheduler.delayed.drop_unregistered()
                elif tokens_revoked is not None:
                    ended = await self.websocket.end_invalid(tokens_revoked)
                if ended:
                    log.info("subscriptions of revoked clients or tokens ended", extra={"count": ended})
            except Exception:  # the watch must outlive any one failure (a vanished directory...)
                seen = -1  # the full check next time: it covers the tokens revoked since, forgotten now
                log.exception("revocation watch failed; trying again")
            await asyncio.sleep(WATCH_INTERVAL_S)


def peer_of(request: web.BaseRequest) -> str | None:
    """The network address whose failure budget a request is charged to (None: this board). A
    request whose connection is gone has no transport: charged to one shared key, its reply goes nowhere."""
    transport = request.transport
    return peer_host(transport) if transport is not None else "(connection lost)"


def _grant_type(content_type: str, body: bytes) -> str | None:
    """The ``grant_type`` a token request's body names (a form, or a JSON object), else None."""
    if content_type == "application/x-www-form-urlencoded":
        values = parse_qs(body.decode("utf-8", errors="replace")).get("grant_type")
        return values[0] if values else None
    if content_type == "application/json" and body.strip():
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            return None
        named = document.get("grant_type") if isinstance(document, dict) else None
        return named if isinstance(named, str) or named is None else repr(named)
    return None


def _json(document: object, status: int) -> web.Response:
    return web.Response(text=json.dumps(document), status=status, content_type="application/json")
