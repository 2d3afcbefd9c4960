"""Error replies of the gates and CORS (PROTOCOL.md "Errors"); :mod:`broker.gates.dispatch` sends them."""

from __future__ import annotations

import json

from aiohttp import web

from broker.errors import SepaError

HTTP_ERRORS = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "request_too_large",
    415: "unsupported_media_type",
    421: "misdirected_request",
    429: "too_many_requests",
}

# sent, with Access-Control-Allow-Origin naming the origin, only to origins the operator allowed
CORS_HEADERS = {
    "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type, Accept, Authorization",
    "Access-Control-Max-Age": "86400",
    "Vary": "Origin",
}


def error_body(error: str, description: str, status: int, **extra: object) -> dict[str, object]:
    return {"error": error, "error_description": description, "status_code": status, **extra}


def json_error(error: str, description: str, status: int) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(error_body(error, description, status)),
        content_type="application/json",
    )


class BadRequest(SepaError):
    error = "invalid_request"
    status_code = 400


class ServiceTimeout(SepaError):
    """An allowed SERVICE endpoint did not answer within [engine] service_timeout_s."""

    error = "service_timeout"
    status_code = 504


class UnsupportedMediaType(SepaError):
    error = "unsupported_media_type"
    status_code = 415
