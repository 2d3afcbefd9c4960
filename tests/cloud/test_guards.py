"""The landing endpoint's guards on real sockets: a slow head, a slow body (with a token or without)
and a connection that sends nothing are cut within their limits while other clients are served;
past the connection cap a new connection is closed at once and counted, the earlier ones go on;
past the uploads in progress per token one more is 429 before its body is read, other tokens go on,
and an upload's slot comes back however it ended."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

import cloud.landing
from cloud.settings import LandingSettings
from tests.cloud.cloud_support import TOKEN, LandingServer, batch, record

LIMIT_S = 0.5
SLACK_S = 1.5  # the timer's own lateness, and this machine's other work


@pytest.fixture
def guarded(landing_settings: LandingSettings) -> Iterator[LandingServer]:
    settings = dataclasses.replace(
        landing_settings, cert=None, key=None, head_timeout_s=LIMIT_S, body_timeout_s=LIMIT_S, max_connections=8
    )
    with LandingServer(settings) as server:
        yield server


def connect(server: LandingServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def trickle(connection: socket.socket, data: bytes, every_s: float, for_s: float) -> float:
    """Send `data` a byte every `every_s` until the endpoint closes the connection (or `for_s`
    passed); returns when it closed, in seconds from the start."""
    started = time.monotonic()
    for byte in data:
        try:
            connection.sendall(bytes([byte]))
        except OSError:  # reset: the endpoint closed it
            break
        if time.monotonic() - started > for_s:
            break
        time.sleep(every_s)
    return time.monotonic() - started


def reply_of(connection: socket.socket) -> bytes:
    """What the endpoint sent until it closed the connection."""
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def head(batch_id: str, length: int, token: str | None) -> bytes:
    lines = [
        f"PUT /v1/batches/{batch_id} HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/x-ndjson",
        "Content-Encoding: gzip",
        f"Content-Length: {length}",
    ]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_head_sent_a_byte_at_a_time_is_cut_and_others_are_served(guarded: LandingServer) -> None:
    with connect(guarded) as slow:
        closed_after = trickle(slow, head("b1", 10, TOKEN), every_s=0.05, for_s=10)
        assert closed_after < LIMIT_S + SLACK_S
        assert reply_of(slow).startswith(b"HTTP/1.1 408 ")
    assert guarded.client().request("GET", "/v1/health").status == 200
    assert guarded.client().metrics()['sepa_cloud_requests_timed_out_total{phase="head"}'] == 1


def test_a_connection_that_sends_nothing_is_cut(guarded: LandingServer) -> None:
    with connect(guarded) as idle:
        started = time.monotonic()
        assert reply_of(idle).startswith(b"HTTP/1.1 408 ")
        assert time.monotonic() - started < LIMIT_S + SLACK_S


def test_a_body_sent_a_byte_at_a_time_with_a_token_is_cut_and_nothing_stored(guarded: LandingServer) -> None:
    body = batch([record(1)])
    with connect(guarded) as slow:
        slow.sendall(head("b1", len(body), TOKEN))
        closed_after = trickle(slow, body, every_s=0.05, for_s=10)
        assert closed_after < LIMIT_S + SLACK_S
        reply = reply_of(slow)
        assert reply.startswith(b"HTTP/1.1 408 ") and b'"request_timeout"' in reply
    assert guarded.client().put("b2", body).status == 201
    assert guarded.visible_files() == ["b2.json.gz"]
    assert guarded.client().metrics()['sepa_cloud_requests_timed_out_total{phase="body"}'] == 1


def test_a_body_sent_a_byte_at_a_time_without_a_token_is_cut(guarded: LandingServer) -> None:
    """Refused at its head (401): what follows must come as fast as a head would (aiohttp would
    otherwise drain it for its lingering_time, 10 s)."""
    with connect(guarded) as slow:
        slow.sendall(head("b1", 10_000, None))
        closed_after = trickle(slow, b"x" * 10_000, every_s=0.05, for_s=30)
        assert closed_after < LIMIT_S + SLACK_S
        assert reply_of(slow).startswith(b"HTTP/1.1 401 ")
    assert guarded.client().request("GET", "/v1/health").status == 200


def test_past_the_cap_a_connection_is_closed_at_once_and_counted_the_others_go_on(
    landing_settings: LandingSettings,
) -> None:
    settings = dataclasses.replace(landing_settings, cert=None, key=None, max_connections=4, head_timeout_s=30)
    with LandingServer(settings) as server, ExitStack() as stack:
        held = [stack.enter_context(connect(server)) for _ in range(4)]
        time.sleep(0.2)  # accepted by the endpoint's loop
        with connect(server) as refused:
            started = time.monotonic()
            assert reply_of(refused) == b""
            assert time.monotonic() - started < SLACK_S
        for connection in held:  # each still served, and kept alive
            for _ in range(2):
                connection.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert connection.recv(65536).startswith(b"HTTP/1.1 200 ")
        held.pop().close()
        time.sleep(0.2)
        assert server.client().metrics()["sepa_cloud_connections_refused_total"] == 1


@pytest.fixture
def one_upload_each(landing_settings: LandingSettings) -> Iterator[LandingServer]:
    """One upload in progress per token, and 30 s for a body: a test's held upload is not cut."""
    settings = dataclasses.replace(landing_settings, cert=None, key=None, max_uploads_per_token=1, body_timeout_s=30)
    with LandingServer(settings) as server:
        yield server


def hold_upload(server: LandingServer, batch_id: str, body: bytes, token: str = TOKEN) -> socket.socket:
    """A connection with an upload in progress: its head and the first half of its body sent, read
    by the endpoint (its upload slot taken)."""
    assert server.landing is not None
    connection = connect(server)
    received = server.client().metrics()["sepa_cloud_bytes_received_total"]
    connection.sendall(head(batch_id, len(body), token) + body[: len(body) // 2])
    deadline = time.monotonic() + 10
    while server.client().metrics()["sepa_cloud_bytes_received_total"] < received + len(body) // 2:
        assert time.monotonic() < deadline, "the held upload's first half was not read"
        time.sleep(0.02)
    assert server.landing.uploads.in_progress >= 1
    return connection


def test_past_the_uploads_per_token_one_more_is_429_before_its_body_other_tokens_go_on(
    one_upload_each: LandingServer,
) -> None:
    """A token holder's bodies are held whole (24 concurrent 64 MiB uploads: 1.78 GB). With one upload
    of a token in progress, another with the same token is 429 (Retry-After: 1, the shipper retries)
    and its body is not read; another token's upload is stored; once the first ends the token works."""
    server = one_upload_each
    body = batch([record(n) for n in range(50)])
    with hold_upload(server, "b1", body) as slow:
        received = server.client().metrics()["sepa_cloud_bytes_received_total"]
        reply = server.client(TOKEN).put("b2", body)
        assert reply.status == 429, reply.body
        assert reply.headers["retry-after"] == "1"
        assert reply.json() == {
            "error": "too_many_requests",
            "status_code": 429,
            "error_description": "this token's uploads in progress are at their limit (1); retry in a second",
        }
        assert server.client().metrics()["sepa_cloud_bytes_received_total"] == received
        assert server.client("second-token").put("b3", body).status == 201
        assert server.visible_files() == ["b3.json.gz"]
        slow.sendall(body[len(body) // 2 :])
        assert reply_of_one(slow).startswith(b"HTTP/1.1 201 ")
    assert server.client(TOKEN).put("b2", body).status == 201
    assert server.visible_files() == ["b1.json.gz", "b2.json.gz", "b3.json.gz"]
    assert server.client().metrics()['sepa_cloud_batches_rejected_total{reason="too_many_uploads"}'] == 1


@pytest.mark.parametrize("ending", ["client-disconnects", "body-times-out", "bad-content", "handler-fails"])
def test_an_upload_slot_comes_back_however_the_upload_ends(
    landing_settings: LandingSettings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    """Else one upload that went wrong would keep its token out for good (429 forever)."""
    settings = dataclasses.replace(
        landing_settings,
        cert=None,
        key=None,
        max_uploads_per_token=1,
        body_timeout_s=LIMIT_S if ending == "body-times-out" else 30,
    )
    body = batch([record(n) for n in range(50)]) if ending != "bad-content" else batch([record(1, sequence=0)] * 50)
    with LandingServer(settings) as server:
        assert server.landing is not None
        with hold_upload(server, "b1", body) as slow:
            if ending == "client-disconnects":
                slow.close()
            elif ending == "body-times-out":
                assert reply_of_one(slow).startswith(b"HTTP/1.1 408 ")
            else:
                status = b"400" if ending == "bad-content" else b"500"
                if ending == "handler-fails":
                    monkeypatch.setattr(cloud.landing, "check_batch", _broken_check)
                slow.sendall(body[len(body) // 2 :])
                assert reply_of_one(slow).startswith(b"HTTP/1.1 " + status)
                monkeypatch.undo()
        deadline = time.monotonic() + 10
        while server.landing.uploads.in_progress:
            assert time.monotonic() < deadline, "the upload slot was not given back"
            time.sleep(0.02)
        assert server.client(TOKEN).put("b2", batch([record(1)])).status == 201
        assert server.visible_files() == ["b2.json.gz"]
        reason = {"client-disconnects": "disconnected", "bad-content": "bad_record"}.get(ending)
        if reason:
            assert server.client().metrics()[f'sepa_cloud_batches_rejected_total{{reason="{reason}"}}'] == 1
    ours = [entry for entry in caplog.records if entry.name.startswith("cloud")]
    errors = [entry.getMessage() for entry in ours if entry.levelno >= logging.ERROR]
    assert errors == (["request failed"] if ending == "handler-fails" else [])


def _broken_check(_body: bytes, _limit: int) -> int:
    raise RuntimeError("a bug in the checker")


def reply_of_one(connection: socket.socket) -> bytes:
    """The first bytes of a reply on a connection kept alive."""
    return connection.recv(65536)
