"""The HTTPS landing endpoint the gateway's cloud shipper uploads observation batches to.

Contract (the shipper depends on every detail; the record itself is in :mod:`gateway.shipper.contract`):

``PUT /v1/batches/{batch_id}``
    ``batch_id`` matches ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$``. Headers ``Authorization: Bearer
    <token>``, ``Content-Type: application/x-ndjson``, ``Content-Encoding: gzip``; the body is the gzip
    of the JSON lines and is stored byte for byte as ``<landing_dir>/<batch_id>.json.gz``. A token
    bound to a gateway (``<gateway-slug>:<token>``, :mod:`cloud.tokens`) may only PUT ids shaped
    ``<gateway-slug>-<spool id>-<segment number>``, as that gateway's shipper names them.

    * ``201 {"batch": id, "records": n, "duplicate": false}``: stored (durably) now.
    * ``200 {"batch": id, "records": n, "duplicate": true}``: stored before with identical bytes.
    * ``400 invalid_request``: bad batch id, not gzip, a record breaking the contract (the description
      names the line and the problem), or no records at all.
    * ``401 unauthorized`` (with ``WWW-Authenticate: Bearer``): token missing or not accepted.
    * ``403 forbidden``: the token is bound to another gateway than the batch id's.
    * ``409 conflict``: the id is stored with different bytes.
    * ``413 payload_too_large``: body over ``max_batch_bytes``, or inflating past ``inflate_ratio`` times
      its own size (or past ``max_decompressed_bytes``).
    * ``429 too_many_requests`` (with ``Retry-After: 1``): ``max_uploads_per_token`` uploads with this
      token are in progress already; refused before its body is read.
    * ``408 request_timeout``: the head or the body did not arrive within its time limit
      (:mod:`cloud.guards`); the connection is closed.
    * ``415 unsupported_media_type``: another Content-Type or Content-Encoding.
    * ``500 server_error``: the landing directory could not be written; nothing is left behind.

    A refused upload changes nothing on disk. The order of checks is authentication, batch id,
    gateway, headers, size, uploads in progress, content, storage, so an unauthenticated client
    learns nothing about the rest.
``GET /v1/health``
    ``200 {"status": "ok"}``, no authentication.
``GET /metrics``
    Prometheus text (:mod:`cloud.metrics`), no authentication: counts only, no data.

Every error is ``{"error": code, "status_code": n, "error_description": text}``, 404 and 405 included.

Why at most ``max_uploads_per_token`` uploads at once per token: a body is held whole (up to 64 MiB)
while it is checked and stored, and one token holder's 24 concurrent uploads took the endpoint to
1.78 GB of memory. The shipper retries a 429 like a 5xx.

Why ``auto_decompress`` is off (``handler_args``): aiohttp would otherwise inflate a gzip body itself,
with no size limit, and the endpoint must store the compressed bytes as they came. Connections are
capped and slow requests cut (:mod:`cloud.guards`) when served by :class:`cloud.guards.GuardedSite`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from cloud.contract import BATCH_ID, BatchError, check_batch
from cloud.guards import ConnectionGuard
from cloud.metrics import LandingMetrics
from cloud.settings import LandingSettings
from cloud.storage import LandingDir, Outcome
from cloud.tokens import BearerCheck, Credential

log = logging.getLogger("cloud.landing")

NDJSON = "application/x-ndjson"
_READ_CHUNK = 1 << 16
_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
    500: "server_error",
}


class UploadSlots:
    """Uploads in progress per token, at most ``limit`` each. Only the event loop thread uses it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._busy: dict[Credential, int] = {}

    def take(self, credential: Credential) -> bool:
        """One more upload with ``credential``; False (nothing taken) when it has ``limit`` already."""
        busy = self._busy.get(credential, 0)
        if busy >= self.limit:
            return False
        self._busy[credential] = busy + 1
        return True

    def give_back(self, credential: Credential) -> None:
        """That upload is over, whichever way it ended."""
        busy = self._busy.pop(credential) - 1
        if busy:
            self._busy[credential] = busy

    @property
    def in_progress(self) -> int:
        """Uploads in progress, all tokens together."""
        return sum(self._busy.values())


class Landing:
    """The endpoint's state and handlers: settings, token check, landing directory, counters."""

    def __init__(self, settings: LandingSettings) -> None:
        self.settings = settings
        self.metrics = LandingMetrics()
        self.directory = LandingDir(settings.landing_dir)
        self._bearer = BearerCheck(settings.tokens)
        self.uploads = UploadSlots(settings.max_uploads_per_token)
        self.guard = ConnectionGuard(
            self.metrics.guards, max_connections=settings.max_connections, head_timeout_s=settings.head_timeout_s
        )

    async def startup(self, _app: web.Application) -> None:
        """Create the landing directory and sweep stale temp files, off the event loop."""
        removed = await asyncio.to_thread(self.directory.prepare)
        if removed:
            log.info("removed stale temp files", extra={"count": removed, "dir": str(self.directory.path)})
        if self._bearer.unbound:
            log.warning(
                "tokens not bound to a gateway: a holder of one can write any gateway's batches; "
                "bind each to its gateway as <gateway-slug>:<token> (the slug its shipper's batch ids start with)",
                extra={"count": self._bearer.unbound},
            )

    async def put_batch(self, request: web.Request) -> web.Response:
        """``PUT /v1/batches/{batch_id}``: check, then store once (see the module docstring)."""
        credential = self._bearer.match(request.headers.get("Authorization"))
        if credential is None:
            presented = request.headers.get("Authorization", "").lstrip().lower().startswith("bearer ")
            challenge = 'Bearer error="invalid_token"' if presented else "Bearer"
            headers = {"WWW-Authenticate": challenge}
            return self._reject(401, "unauthorized", "a valid bearer token is required", headers)
        batch_id = request.match_info["batch_id"]
        refused = self._check_head(request, credential, batch_id)
        if refused is not None:
            return refused
        if not self.uploads.take(credential):
            limit = self.uploads.limit
            description = f"this token's uploads in progress are at their limit ({limit}); retry in a second"
            return self._reject(429, "too_many_uploads", description, {"Retry-After": "1"}, batch=batch_id)
        try:
            return await self._receive(request, batch_id)
        finally:
            self.uploads.give_back(credential)

    def _check_head(self, request: web.Request, credential: Credential, batch_id: str) -> web.Response | None:
        """The refusal the head alone earns (batch id, gateway, media type, declared size), or None."""
        if not BATCH_ID.fullmatch(batch_id):
            return self._reject(400, "bad_batch_id", f"batch id must match {BATCH_ID.pattern} (got {batch_id[:140]!r})")
        if not credential.may_write(batch_id):
            description = "this token may only write its own gateway's batches (<gateway>-<spool id>-<segment>)"
            return self._reject(403, "wrong_gateway", description, batch=batch_id)
        if request.content_type.lower() != NDJSON:
            return self._reject(415, "unsupported_media_type", f"Content-Type must be {NDJSON}")
        if request.headers.get("Content-Encoding", "").strip().lower() != "gzip":
            return self._reject(415, "unsupported_media_type", "Content-Encoding must be gzip")
        limit = self.settings.max_batch_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._reject(413, "too_large", f"the batch is over {limit} bytes")
        return None

    async def _receive(self, request: web.Request, batch_id: str) -> web.Response:
        """Read the body, check it and store it: the part of an upload that holds its bytes."""
        limit = self.settings.max_batch_bytes
        try:
            body = await asyncio.wait_for(self._read_body(request, limit), self.settings.body_timeout_s)
        except TimeoutError:
            self.metrics.guards["timeout_body"] += 1
            log.debug("batch body too slow", extra={"batch": batch_id})
            response = error_response(408, f"the body did not arrive within {self.settings.body_timeout_s:g} s")
            response.force_close()  # the rest of the body is not worth waiting for
            return response
        except ConnectionResetError:  # the client went away (the shipper gives up after 30 s): no traceback
            return self._reject(400, "disconnected", "the connection was lost inside the body", batch=batch_id)
        if body is None:
            return self._reject(413, "too_large", f"the batch is over {limit} bytes")
        try:
            records = await asyncio.to_thread(check_batch, body, self.settings.inflate_limit(len(body)))
        except BatchError as error:
            return self._reject(413 if error.too_large else 400, error.reason, str(error), batch=batch_id)
        return await self._store(batch_id, body, records)

    async def _store(self, batch_id: str, body: bytes, records: int) -> web.Response:
        """Store a checked batch once; 201, 200 for the same bytes again, 409 for others."""
        try:
            outcome = await self.directory.store(batch_id, body)
        except OSError as error:
            log.error("cannot store a batch", extra={"batch": batch_id, "error": str(error)})
            return self._reject(500, "storage_error", "the batch could not be stored; retry later")
        if outcome is Outcome.CONFLICT:
            return self._reject(409, "conflict", f"batch {batch_id} is already stored with different content")
        duplicate = outcome is Outcome.DUPLICATE
        if duplicate:
            self.metrics.batches_duplicate += 1
        else:
            self.metrics.batches_stored += 1
            self.metrics.records_stored += records
            self.metrics.bytes_stored += len(body)
        log.debug("batch", extra={"batch": batch_id, "records": records, "duplicate": duplicate})
        status = 200 if duplicate else 201
        return web.json_response({"batch": batch_id, "records": records, "duplicate": duplicate}, status=status)

    async def _read_body(self, request: web.Request, limit: int) -> bytes | None:
        """The body, or None as soon as it passes ``limit`` bytes (chunked uploads have no length)."""
        body = bytearray()
        async for chunk in request.content.iter_chunked(_READ_CHUNK):
            body += chunk
            self.metrics.bytes_received += len(chunk)
            if len(body) > limit:
                return None
        return bytes(body)

    def _reject(
        self, status: int, reason: str, description: str, headers: Mapping[str, str] | None = None, batch: str = ""
    ) -> web.Response:
        self.metrics.rejected[reason] += 1
        log.debug("batch refused", extra={"reason": reason, "status": status, "batch": batch})
        return error_response(status, description, headers)

    async def metrics_text(self, _request: web.Request) -> web.Response:
        """``GET /metrics``."""
        return web.Response(text=self.metrics.render(), content_type="text/plain", charset="utf-8")


async def health(_request: web.Request) -> web.Response:
    """``GET /v1/health``: the process serves requests."""
    return web.json_response({"status": "ok"})


def error_response(status: int, description: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """The one error shape of the endpoint."""
    body = {"error": _CODES.get(status, "invalid_request"), "status_code": status, "error_description": description}
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Give aiohttp's own errors (404, 405, ...) and unexpected failures the endpoint's error shape."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        headers = {"Allow": error.headers["Allow"]} if "Allow" in error.headers else None
        return error_response(error.status, error.reason, headers)
    except Exception:
        log.exception("request failed", extra={"method": request.method, "path": request.path})
        return error_response(500, "internal error")


LANDING = web.AppKey("landing", Landing)


def landing_app(settings: LandingSettings) -> web.Application:
    """The endpoint as an aiohttp application, to serve with any runner (the CLI, or a test on a free port).

    Raises :class:`cloud.settings.SettingsError` for settings that cannot work."""
    settings.validate()
    landing = Landing(settings)
    handler_args = {"auto_decompress": False, "keepalive_timeout": settings.idle_timeout_s}
    app = web.Application(middlewares=[landing.guard.middleware, json_errors], handler_args=handler_args)
    app[LANDING] = landing
    app.on_startup.append(landing.startup)
    app.router.add_put("/v1/batches/{batch_id}", landing.put_batch)
    app.router.add_get("/v1/health", health)
    app.router.add_get("/metrics", landing.metrics_text)
    return app
