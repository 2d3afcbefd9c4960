"""The gates' own routing and error replies (broker.gates.dispatch), over real sockets.

Protects what ``web.Application`` and the error middleware did before the gates moved to aiohttp's
low-level server, so that clients see the same replies: 404 and 405 as the protocol's JSON error
(405 with an ``Allow`` header), preflight answered, no CORS for unlisted origins, paths resolved as
aiohttp's router resolves them (``%2F`` kept encoded, HEAD on every GET route, the cancelled id
decoded), ``Expect: 100-continue`` answered, the configured body limit (413) on both ports, and
internal faults as a logged 500.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web

from broker.gates.dispatch import Dispatcher, Routes, last_segment
from gateway.appliance.config import Config

if TYPE_CHECKING:
    from tools.launcher import InProcessGateway, Reply, RunningGateway

ERROR_KEYS = {"error", "error_description", "status_code"}
CORS_NAMES = ("Access-Control-Allow-Origin", "Access-Control-Allow-Methods", "Access-Control-Allow-Headers")


def assert_json_error(reply: Reply, status: int, error: str, description: str | None = None) -> dict[str, Any]:
    """The protocol's error JSON, as the error middleware sent it (no CORS: no origin was named)."""
    assert reply.status == status, reply.body
    assert reply.media_type == "application/json"
    body = reply.json()
    assert set(body) == ERROR_KEYS and body["status_code"] == status and body["error"] == error, body
    if description is not None:
        assert body["error_description"] == description
    for name in CORS_NAMES:
        assert name not in reply.headers, (name, dict(reply.headers))
    return body


def raw_exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received


def raw_request(method: str, path: str, body: bytes = b"", *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", *headers]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# -- 404 and 405 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/query", "GET,HEAD,POST"),
        ("DELETE", "/update", "GET,HEAD,POST"),
        ("POST", "/metrics", "GET,HEAD"),
        ("DELETE", "/scheduled", "GET,HEAD"),
        ("GET", "/scheduled/some-id", "DELETE"),
        ("PUT", "/subscribe", "GET,HEAD"),
    ],
)
def test_a_known_path_with_another_method_is_405_with_allow(
    gateway: RunningGateway, method: str, path: str, allow: str
) -> None:
    reply = gateway.request(method, path, b"x", {"Content-Type": "text/plain"})
    assert_json_error(reply, 405, "method_not_allowed", "Method Not Allowed")
    assert reply.headers.get("Allow") == allow


def test_a_405_raised_by_a_handler_keeps_its_allow(gateway: RunningGateway) -> None:
    reply = gateway.request("GET", "/update?update=CLEAR%20ALL")
    assert_json_error(reply, 405, "method_not_allowed", "updates must be sent with POST")
    assert reply.headers.get("Allow") == "POST"


@pytest.mark.parametrize("path", ["/nowhere", "/query/", "//query", "/query%2F", "/scheduled/", "/scheduled/a/b"])
def test_unknown_paths_are_404_json(gateway: RunningGateway, path: str) -> None:
    reply = gateway.request("GET", path)
    assert_json_error(reply, 404, "not_found", "Not Found")
    assert "Allow" not in reply.headers


def test_paths_are_matched_decoded_as_aiohttp_matches_them(gateway: RunningGateway) -> None:
    reply = gateway.request("GET", "/qu%65ry?query=ASK%7B%7D")
    assert reply.status == 200 and reply.json()["boolean"] is True


@pytest.mark.parametrize(
    ("path", "unknown"),
    [("/scheduled/a%2Fb", "a/b"), ("/scheduled/a%25b", "a%b"), ("/scheduled/%41bc", "Abc"), ("/scheduled/x?y=1", "x")],
)
def test_the_cancelled_id_is_the_decoded_last_segment(gateway: RunningGateway, path: str, unknown: str) -> None:
    reply = gateway.request("DELETE", path)
    assert_json_error(reply, 404, "not_found", f"no pending delayed update {unknown!r}")


def test_an_id_with_braces_is_no_route(gateway: RunningGateway) -> None:
    assert_json_error(gateway.request("DELETE", "/scheduled/a{b"), 404, "not_found", "Not Found")


def test_the_websocket_port_serves_subscribe_only(gateway: RunningGateway) -> None:
    port = gateway.ws_port
    for path in ("/query?query=ASK%7B%7D", "/metrics", "/update"):
        reply = raw_exchange(port, raw_request("GET", path))
        assert reply.startswith(b"HTTP/1.1 404 Not Found\r\n"), reply
        assert b'"error": "not_found"' in reply and b"Access-Control-Allow-Origin" not in reply
    reply = raw_exchange(port, raw_request("POST", "/subscribe"))
    assert reply.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and b"\r\nAllow: GET,HEAD\r\n" in reply, reply
    not_upgraded = raw_exchange(port, raw_request("GET", "/subscribe"))
    assert not_upgraded.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b'"error": "invalid_request"' in not_upgraded


# -- HEAD, OPTIONS, Expect --------------------------------------------------------------------


def test_get_routes_answer_head_without_a_body(gateway: RunningGateway) -> None:
    reply = gateway.request("HEAD", "/metrics")
    assert reply.status == 200 and reply.body == b""
    assert "Access-Control-Allow-Origin" not in reply.headers
    missing = gateway.request("HEAD", "/nowhere")
    assert missing.status == 404 and missing.body == b""


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/scheduled", "GET, HEAD, OPTIONS"),
        ("/scheduled/abc", "DELETE, OPTIONS"),
        ("*", "DELETE, GET, HEAD, OPTIONS, POST"),
    ],
)
def test_preflight_is_204_with_the_paths_methods(gateway: RunningGateway, path: str, allow: str) -> None:
    reply = raw_exchange(gateway.http_port, raw_request("OPTIONS", path))
    head = reply.split(b"\r\n\r\n", 1)[0].decode()
    assert head.startswith("HTTP/1.1 204 No Content\r\n"), head
    assert f"\r\nAllow: {allow}\r\n" in head, head
    assert "Access-Control-Allow-Origin" not in head  # no origin named, none allowed


def test_options_on_a_path_that_is_not_there_is_404(gateway: RunningGateway) -> None:
    before = gateway.metric('sepa_errors_total{error="not_found",status="404"}')
    reply = raw_exchange(gateway.http_port, raw_request("OPTIONS", "/nowhere"))
    assert reply.startswith(b"HTTP/1.1 404 Not Found\r\n"), reply
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["error"] == "not_found"
    assert gateway.metric('sepa_errors_total{error="not_found",status="404"}') == before + 1


def test_expect_100_continue_gets_the_interim_reply_first(gateway: RunningGateway) -> None:
    update = b"INSERT DATA { <http://example.org/expect/s> <http://example.org/expect/p> 1 }"
    reply = raw_exchange(
        gateway.http_port,
        raw_request("POST", "/update", update, "Content-Type: application/sparql-update", "Expect: 100-continue"),
    )
    assert reply.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"), reply
    assert reply.endswith(b'{"added": 1, "removed": 0, "notifications": 0}')


def test_an_unknown_expectation_is_417_and_changes_nothing(gateway: RunningGateway) -> None:
    update = b"INSERT DATA { <http://example.org/expect/s417> <http://example.org/expect/p> 1 }"
    reply = raw_exchange(
        gateway.http_port,
        raw_request("POST", "/update", update, "Content-Type: application/sparql-update", "Expect: bogus"),
    )
    assert reply.startswith(b"HTTP/1.1 417 Expectation Failed\r\n"), reply
    assert b"bogus" not in reply  # aiohttp's plain 417 echoed the header's value
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["error"] == "expectation_failed"
    assert not gateway.ask("ASK { <http://example.org/expect/s417> ?p ?o }")
    assert gateway.metric('sepa_errors_total{error="expectation_failed",status="417"}') == 1


# -- the body limit ---------------------------------------------------------------------------


def _limited(in_process_gateway: Callable[[Config], InProcessGateway], limit: int) -> InProcessGateway:
    config = Config()
    config.http.max_request_bytes = limit
    return in_process_gateway(config)


def test_the_configured_body_limit_applies_below_aiohttps_default(
    in_process_gateway: Callable[[Config], InProcessGateway],
) -> None:
    gateway = _limited(in_process_gateway, 2000)
    small = "INSERT DATA { <http://example.org/limit/s> <http://example.org/limit/p> '" + "a" * 1000 + "' }"
    large = "INSERT DATA { <http://example.org/limit/t> <http://example.org/limit/p> '" + "a" * 3000 + "' }"
    assert gateway.update(small).status == 200
    assert_json_error(gateway.update(large), 413, "request_too_large", "Request Entity Too Large")
    assert not gateway.ask("ASK { <http://example.org/limit/t> ?p ?o }")
    assert gateway.metrics()['sepa_errors_total{error="request_too_large",status="413"}'] == 1


def test_the_configured_body_limit_applies_above_aiohttps_default(
    in_process_gateway: Callable[[Config], InProcessGateway],
) -> None:
    gateway = _limited(in_process_gateway, 3 << 20)
    text = "INSERT DATA { <http://example.org/limit/big> <http://example.org/limit/p> '" + "a" * (2 << 20) + "' }"
    assert gateway.update(text).status == 200, "a 2 MiB update is within a 3 MiB limit"


# -- internal faults --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status", "error", "description"),
    [
        (RuntimeError("boom"), 500, "internal_error", "internal error (logged)"),
        (ConnectionResetError(), 400, "invalid_request", "connection lost before the request was complete"),
        # a TLS client that hung up while a pong was written: the write fails with these, not a reset
        (BrokenPipeError(), 400, "invalid_request", "connection lost before the request was complete"),
        (ConnectionAbortedError(), 400, "invalid_request", "connection lost before the request was complete"),
    ],
)
def test_handler_faults_become_json_errors_and_are_counted(
    in_process_gateway: Callable[[Config], InProcessGateway],
    caplog: pytest.LogCaptureFixture,
    fault: Exception,
    status: int,
    error: str,
    description: str,
) -> None:
    gateway = in_process_gateway(Config())

    async def failing(*_args: object) -> list[object]:
        raise fault

    gateway.gateway.scheduler.delayed.page = failing  # type: ignore[method-assign]
    assert_json_error(gateway.request("GET", "/scheduled"), status, error, description)
    assert gateway.metrics()[f'sepa_errors_total{{error="{error}",status="{status}"}}'] == 1
    logged = [record for record in caplog.records if record.getMessage() == "internal error"]
    assert len(logged) == (1 if status == 500 else 0)


# -- the routing table and the dispatcher on their own ----------------------------------------


async def _ok(request: web.BaseRequest) -> web.Response:
    return web.Response(text="ok")


async def _other(request: web.BaseRequest) -> web.Response:
    return web.Response(text="other")


def test_a_route_registered_twice_is_refused() -> None:
    routes = Routes()
    routes.get("/a", _ok)
    with pytest.raises(ValueError, match="routed twice"):
        routes.add("HEAD", "/a", _other)
    with pytest.raises(ValueError, match="starts with '/'"):
        routes.post("a", _ok)


def test_an_exact_route_wins_and_405_lists_every_candidate() -> None:
    routes = Routes()
    routes.get("/s/x", _ok)
    routes.delete("/s/{id}", _other)
    assert routes.resolve("GET", "/s/x") is _ok
    assert routes.resolve("DELETE", "/s/x") is _other
    assert routes.resolve("DELETE", "/s/y") is _other
    with pytest.raises(web.HTTPMethodNotAllowed) as refused:
        routes.resolve("POST", "/s/x")
    assert refused.value.headers["Allow"] == "DELETE,GET,HEAD"
    with pytest.raises(web.HTTPNotFound):
        routes.resolve("GET", "/s")


def test_redirects_raised_by_a_handler_pass_through_unchanged() -> None:
    async def moved(request: web.BaseRequest) -> web.Response:
        raise web.HTTPFound("/elsewhere")

    async def exchange() -> bytes:
        routes = Routes()
        routes.get("/old", moved)
        counters: Counter[str] = Counter()
        runner = web.ServerRunner(Dispatcher(routes, counters, max_request_bytes=1000).server())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw_request("GET", "/old"))
            reply = await reader.read()
            writer.close()
            assert not counters
            return reply
        finally:
            await runner.cleanup()

    reply = asyncio.run(exchange())
    assert reply.startswith(b"HTTP/1.1 302 Found\r\n") and b"\r\nLocation: /elsewhere\r\n" in reply


def test_last_segment_decodes_what_the_path_left_encoded() -> None:
    from aiohttp.test_utils import make_mocked_request

    assert last_segment(make_mocked_request("DELETE", "/scheduled/a%2Fb%25c")) == "a/b%c"
    assert last_segment(make_mocked_request("DELETE", "/scheduled/plain")) == "plain"
