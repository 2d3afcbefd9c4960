"""Error replies of the gates, CORS, and the counters of bad input (PROTOCOL.md "Errors")."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web

from broker.errors import SepaError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

HTTP_ERRORS = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}

CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type, Accept, Authorization",
    "Access-Control-Max-Age": "86400",
}


def error_body(error: str, description: str, status: int, **extra: object) -> dict[str, object]:
    return {"error": error, "error_description": description, "status_code": status, **extra}


def json_error(error: str, description: str, status: int) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(error_body(error, description, status)),
        content_type="application/json",
        headers=CORS_HEADERS,
    )


class BadRequest(SepaError):
    error = "invalid_request"
    status_code = 400


class UnsupportedMediaType(SepaError):
    error = "unsupported_media_type"
    status_code = 415


def make_error_middleware(counters: Counter[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Every failure becomes the protocol's JSON error; CORS on every reply; preflight answered."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS":
            return web.Response(status=204, headers=CORS_HEADERS)
        try:
            response = await handler(request)
        except SepaError as error:
            counters[f"{error.error}:{error.status_code}"] += 1
            return json_error(error.error, error.description, error.status_code)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            name = HTTP_ERRORS.get(error.status, "http_error")
            counters[f"{name}:{error.status}"] += 1
            return json_error(name, error.reason or name, error.status)
        except ConnectionResetError:  # the client left before its request was complete: not an internal fault
            counters["invalid_request:400"] += 1
            return json_error("invalid_request", "connection lost before the request was complete", 400)
        except Exception:
            counters["internal_error:500"] += 1
            log.exception("internal error", extra={"path": request.path})
            return json_error("internal_error", "internal error (logged)", 500)
        if not isinstance(response, web.WebSocketResponse):
            response.headers.update(CORS_HEADERS)
        return response

    return middleware
