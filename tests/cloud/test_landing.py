"""The landing endpoint over real HTTPS sockets: auth, validation, idempotence, atomicity, metrics."""

from __future__ import annotations

import dataclasses
import gzip
import http.client
import json
import os
import random
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import cloud.contract
import cloud.storage
import cloud.tokens
from cloud.settings import LandingSettings
from gateway.shipper.contract import MAX_LINE_BYTES
from tests.cloud.cloud_support import TOKEN, Client, LandingServer, batch, ndjson, record

RECORDS = [record(n) for n in range(3)]


def test_stored_batch_is_the_bytes_received(landing: LandingServer) -> None:
    body = batch(RECORDS)
    reply = landing.client().put("gw-1.000001", body)
    assert reply.status == 201, reply.body
    assert reply.json() == {"batch": "gw-1.000001", "records": 3, "duplicate": False}
    assert landing.all_files() == ["gw-1.000001.json.gz"]
    assert (landing.settings.landing_dir / "gw-1.000001.json.gz").read_bytes() == body


def test_health_needs_no_token(landing: LandingServer) -> None:
    reply = landing.client(token=None).request("GET", "/v1/health")
    assert (reply.status, reply.json()) == (200, {"status": "ok"})


def test_tls_is_real(landing: LandingServer) -> None:
    """The endpoint speaks TLS with the configured certificate: a client not trusting it is refused,
    and plain HTTP to the port gets no HTTP answer."""
    untrusting = Client(landing.port, None)
    untrusting.context = ssl.create_default_context()
    with pytest.raises(ssl.SSLCertVerificationError):
        untrusting.request("GET", "/v1/health")
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        Client(landing.port, None).request("GET", "/v1/health")


@pytest.mark.parametrize(
    ("authorization", "challenge"),
    [
        (None, "Bearer"),
        ("Bearer wrong-token", 'Bearer error="invalid_token"'),
        (f"Bearer {TOKEN}x", 'Bearer error="invalid_token"'),
        (f"Basic {TOKEN}", "Bearer"),
        (TOKEN, "Bearer"),
    ],
    ids=["missing", "wrong", "prefix-of-token", "basic-scheme", "no-scheme"],
)
def test_missing_or_wrong_token_is_401(landing: LandingServer, authorization: str | None, challenge: str) -> None:
    client = landing.client(token=None)
    headers = {} if authorization is None else {"Authorization": authorization}
    reply = client.put("b1", batch(RECORDS), **headers)
    assert reply.status == 401
    assert reply.headers["www-authenticate"] == challenge
    assert reply.json()["error"] == "unauthorized"
    assert TOKEN not in reply.body.decode()
    assert landing.all_files() == []
    assert landing.client().metrics()['sepa_cloud_batches_rejected_total{reason="unauthorized"}'] == 1


def test_every_accepted_token_works(landing: LandingServer) -> None:
    assert landing.client(token="second-token").put("b1", batch(RECORDS)).status == 201
    assert landing.client(token=TOKEN).put("b2", batch(RECORDS)).status == 201


def test_token_check_compares_every_token_in_constant_time(
    landing: LandingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No early exit and no ``==``: hmac.compare_digest runs once per accepted token, match or not."""
    calls: list[tuple[bytes, bytes]] = []
    real = cloud.tokens.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(cloud.tokens.hmac, "compare_digest", spy)
    assert landing.client(token=TOKEN).put("b1", batch(RECORDS)).status == 201
    assert len(calls) == 2 and {b for _, b in calls} == {TOKEN.encode(), b"second-token"}
    calls.clear()
    assert landing.client(token="nope").put("b2", batch(RECORDS)).status == 401
    assert len(calls) == 2


def _corrupt_gzip() -> bytes:
    body = bytearray(batch(RECORDS * 20))
    body[len(body) // 2] ^= 0xFF
    return bytes(body)


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _with_header_flag(body: bytes, flag: int, extra: bytes = b"") -> bytes:
    """`body` (one gzip member with a plain 10-byte header) with FLG bit `flag` set and `extra`
    after the header (where FEXTRA's or FHCRC's bytes go)."""
    return body[:3] + bytes([body[3] | flag]) + body[4:10] + extra + body[10:]


def _deeply_nested(depth: int) -> bytes:
    """A record `depth` arrays deep, with random JSON white space after each bracket: it inflates ~8
    times, within the inflate ratio, so it reaches the parser (bare brackets inflate 800 times: 413)."""
    spaces = random.Random(7)
    opening = b"".join(b"[" + spaces.choice([b"", b" ", b"\t", b"  ", b" \t", b"\t\t"]) for _ in range(depth))
    return b'{"id": ' + opening + b"]" * depth + b"}\n"


# gzip that Python's GzipFile reads and Spark's Hadoop codec does not ("not a gzip file"): one such
# file landed stopped the stream job at every restart (an attack pass)
SPARK_UNREADABLE: list[tuple[str, bytes]] = [
    ("zero-padding", batch(RECORDS) + bytes(64)),
    ("one-zero-byte", batch(RECORDS) + b"\0"),
    ("reserved-flag", _with_header_flag(batch(RECORDS), 0x20)),
    ("wrong-header-crc", _with_header_flag(batch(RECORDS), 0x02, b"\x00\x00")),
    ("garbage-after-member", batch(RECORDS) + b"\x1f\x8bnot a member"),
]


MALFORMED: list[tuple[str, bytes, str]] = [
    ("not-gzip", ndjson(RECORDS), "not gzip"),
    ("truncated-gzip", batch(RECORDS)[:-12], "not a valid gzip stream"),
    ("corrupt-gzip", _corrupt_gzip(), "not a valid gzip stream"),
    ("not-json", _gz(ndjson(RECORDS[:1]) + b"{not json}\n"), "line 2: not JSON"),
    ("not-utf8", _gz(b'{"id": "\xff"}\n'), "line 1: not UTF-8"),
    ("array", _gz(b"[1, 2]\n"), "line 1: expected a JSON object, got an array"),
    ("blank-line", _gz(ndjson(RECORDS[:1]) + b"\n" + ndjson(RECORDS[1:])), "line 2: not JSON: empty line"),
    ("value-string", batch([record(1, value="21.5")]), "line 1: field 'value': expected a number or null, got a str"),
    ("value-bool", batch([record(1, value=True)]), "field 'value': expected a number or null, got a boolean"),
    ("value-nan", _gz(b'{"value": NaN}\n'), "line 1: not JSON: NaN is not a JSON number"),
    ("value-huge", _gz(ndjson([record(1)]).replace(b'"value": 20.125', b'"value": 1e999')), "out of the range"),
    ("sequence-zero", batch([record(1, sequence=0)]), "field 'sequence': must be between 1 and"),
    ("sequence-float", batch([record(1, sequence=1.5)]), "field 'sequence': expected an integer, got a number"),
    ("sequence-string", batch([record(1, sequence="1")]), "field 'sequence': expected an integer, got a string"),
    ("sequence-huge", batch([record(1, sequence=2**63)]), "field 'sequence': must be between 1 and"),
    ("missing-sensor", batch(RECORDS[:2] + [record(7, sensor=...)]), "line 3: field 'sensor' is required and missing"),
    ("null-id", batch([record(1, id=None)]), "line 1: field 'id' is required"),
    ("both-results", batch([record(1, literal="open")]), "exactly one of 'value' and 'literal' must be non-null"),
    ("no-result", batch([record(1, value=None)]), "exactly one of 'value' and 'literal' must be non-null"),
    ("time-no-micros", batch([record(1, result_time="2026-11-22T18:30:00Z")]), "'result_time': expected RFC 3339"),
    ("time-offset", batch([record(1, result_time="2026-11-22T18:30:00.000000+01:00")]), "expected RFC 3339 UTC"),
    ("time-invalid", batch([record(1, result_time="2026-02-30T18:30:00.000000Z")]), "not a valid time"),
    ("source-time", batch([record(1, source_time="yesterday")]), "field 'source_time': expected RFC 3339"),
    ("id-not-iri", batch([record(1, id="observation-1")]), "field 'id': not an absolute IRI"),
    ("iri-space", batch([record(1, unit="http://qudt.org/vocab/unit/DEG C")]), "field 'unit': not an absolute IRI"),
    ("empty-gateway", batch([record(1, gateway="")]), "field 'gateway': must not be empty"),
    ("unknown-key", batch([record(1, extra=1)]), "line 1: unknown field 'extra'"),
    ("duplicate-key", _gz(b'{"id": "urn:a", "id": "urn:b"}\n'), "line 1: not JSON: duplicate key 'id'"),
    ("empty-batch", _gz(b""), "the batch holds no records"),
    ("deep-nesting", _gz(_deeply_nested(100_000)), "line 1: not JSON: nested too deep"),
    # Spark's line reader ends a line at a carriage return: the record became two corrupt rows, dropped
    ("carriage-return", _gz(ndjson(RECORDS[:1]).replace(b", ", b",\r", 1)), "line 1: not JSON: a carriage return"),
    *((f"gzip-{name}", body, "not a valid gzip stream") for name, body in SPARK_UNREADABLE),
]


@pytest.mark.parametrize(("body", "problem"), [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED])
def test_malformed_batch_is_400_and_writes_nothing(landing: LandingServer, body: bytes, problem: str) -> None:
    reply = landing.client().put("batch-1", body)
    assert reply.status == 400, reply.body
    error = reply.json()
    assert error["error"] == "invalid_request" and error["status_code"] == 400
    assert problem in error["error_description"]
    assert landing.all_files() == []
    rejected = {k: v for k, v in landing.client().metrics().items() if k.startswith("sepa_cloud_batches_rejected")}
    assert sum(rejected.values()) == 1
    assert landing.client().metrics()["sepa_cloud_batches_stored_total"] == 0


@pytest.mark.parametrize("batch_id", ["_hidden", ".hidden", "a" * 129, "a%20b", "%C3%A9t%C3%A9", "a:b"])
def test_bad_batch_id_is_400(landing: LandingServer, batch_id: str) -> None:
    reply = landing.client().put(batch_id, batch(RECORDS))
    assert reply.status == 400
    assert "batch id must match" in reply.json()["error_description"]
    assert landing.all_files() == []


def test_longest_batch_id_is_accepted(landing: LandingServer) -> None:
    batch_id = "A" + "a.b_c-" * 21 + "z"
    assert len(batch_id) == 128
    assert landing.client().put(batch_id, batch(RECORDS)).status == 201


@pytest.mark.parametrize(
    "headers",
    [{"Content_Type": "application/json"}, {"Content_Encoding": ""}, {"Content_Encoding": "br"}],
    ids=["content-type", "no-encoding", "brotli"],
)
def test_wrong_media_type_is_415(landing: LandingServer, headers: dict[str, str]) -> None:
    reply = landing.client().put("b1", batch(RECORDS), **headers)
    assert reply.status == 415
    assert reply.json()["error"] == "unsupported_media_type"
    assert landing.all_files() == []


def test_body_over_the_limit_is_413(landing: LandingServer) -> None:
    too_big = os.urandom(landing.settings.max_batch_bytes + 1)
    reply = landing.client().put("b1", too_big)
    assert (reply.status, reply.json()["error"]) == (413, "payload_too_large")
    assert landing.all_files() == []


def test_chunked_body_over_the_limit_is_413(landing: LandingServer) -> None:
    """No Content-Length to trust: the limit holds while reading."""
    chunks = (os.urandom(16 * 1024) for _ in range(landing.settings.max_batch_bytes // (16 * 1024) + 2))
    reply = landing.client().put("b1", chunks)
    assert reply.status == 413
    assert landing.all_files() == []


def test_gzip_bomb_is_413(landing: LandingServer) -> None:
    """Small compressed, huge inflated: refused once inflation passes the limit."""
    bomb = _gz(ndjson(RECORDS) + b" " * (4 << 20))
    assert len(bomb) < landing.settings.max_batch_bytes
    reply = landing.client().put("b1", bomb)
    assert reply.status == 413
    assert "inflates to more than" in reply.json()["error_description"]
    assert landing.client().metrics()['sepa_cloud_batches_rejected_total{reason="too_large"}'] == 1
    assert landing.all_files() == []


def test_batch_just_under_the_decompressed_cap_is_accepted(landing_settings: LandingSettings) -> None:
    """Exactly at ``max_decompressed_bytes`` (JSON white space padding a record) is fine: the cap on any
    batch is not off by one (the inflate ratio lifted here, so that the cap is the limit that holds)."""
    settings = dataclasses.replace(landing_settings, inflate_ratio=1 << 20, max_decompressed_bytes=1 << 20)
    padding = settings.max_decompressed_bytes - len(ndjson(RECORDS))
    inflated = json.dumps(RECORDS[0]).encode() + b" " * padding + b"\n" + ndjson(RECORDS[1:])
    assert len(inflated) == settings.max_decompressed_bytes
    with LandingServer(settings) as landing:
        assert landing.client().put("b1", _gz(inflated)).status == 201
        assert landing.client().put("b2", _gz(inflated + b" ")).status == 413


def test_multi_member_gzip_counts_every_member(landing: LandingServer) -> None:
    body = batch(RECORDS[:2]) + batch(RECORDS[2:])
    reply = landing.client().put("b1", body)
    assert (reply.status, reply.json()["records"]) == (201, 3)


def test_same_batch_again_is_a_duplicate(landing: LandingServer) -> None:
    client = landing.client()
    assert client.put("b1", batch(RECORDS)).status == 201
    before = (landing.settings.landing_dir / "b1.json.gz").stat()
    reply = client.put("b1", batch(RECORDS))
    assert reply.status == 200
    assert reply.json() == {"batch": "b1", "records": 3, "duplicate": True}
    after = (landing.settings.landing_dir / "b1.json.gz").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert landing.all_files() == ["b1.json.gz"]


def test_same_id_other_bytes_is_409_and_keeps_the_first(landing: LandingServer) -> None:
    client = landing.client()
    first = batch(RECORDS)
    assert client.put("b1", first).status == 201
    reply = client.put("b1", batch(RECORDS[:2]))
    assert reply.status == 409
    assert reply.json()["error"] == "conflict" and reply.json()["status_code"] == 409
    assert (landing.settings.landing_dir / "b1.json.gz").read_bytes() == first
    assert landing.all_files() == ["b1.json.gz"]


@pytest.mark.parametrize("same_bytes", [True, False], ids=["same-bytes", "different-bytes"])
def test_concurrent_puts_of_one_id_store_it_once(landing_settings: LandingSettings, same_bytes: bool) -> None:
    bodies = [batch(RECORDS if same_bytes else [record(n)]) for n in range(8)]
    settings = dataclasses.replace(landing_settings, max_uploads_per_token=8)
    with LandingServer(settings) as landing, ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda body: landing.client().put("b1", body), bodies))
    statuses = sorted(reply.status for reply in replies)
    assert statuses == ([200] * 7 + [201] if same_bytes else [201] + [409] * 7)
    winner = next(body for body, reply in zip(bodies, replies, strict=True) if reply.status == 201)
    assert (landing.settings.landing_dir / "b1.json.gz").read_bytes() == winner
    assert landing.all_files() == ["b1.json.gz"]


def test_batch_is_hidden_until_complete(landing: LandingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the batch is being written only a hidden temp file exists (Spark lists nothing); after,
    the batch is visible and no temp file is left."""
    writing, release = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}
    real_fsync = os.fsync

    def slow_fsync(descriptor: int) -> None:
        if not writing.is_set():
            seen["during"] = landing.all_files()
            writing.set()
            release.wait(30)
        real_fsync(descriptor)

    monkeypatch.setattr(cloud.storage.os, "fsync", slow_fsync)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(landing.client().put, "b1", batch(RECORDS))
        assert writing.wait(30)
        assert landing.visible_files() == []
        release.set()
        reply = pending.result(30)
    assert reply.status == 201
    (temp,) = seen["during"]
    assert temp.startswith(".b1.") and temp.endswith(".tmp")
    assert landing.all_files() == ["b1.json.gz"]


def test_storage_failure_is_500_and_leaves_nothing(landing: LandingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(cloud.storage.os, "link", full_disk)
        reply = landing.client().put("b1", batch(RECORDS))
    assert (reply.status, reply.json()["error"]) == (500, "server_error")
    assert landing.all_files() == []
    assert landing.client().put("b1", batch(RECORDS)).status == 201
    assert landing.client().metrics()['sepa_cloud_batches_rejected_total{reason="storage_error"}'] == 1


def test_stale_temp_files_are_swept_at_start(landing_settings: LandingSettings) -> None:
    directory = landing_settings.landing_dir
    directory.mkdir()
    stale, fresh = directory / ".b1.0001.tmp", directory / ".b2.0002.tmp"
    stale.write_bytes(b"torn")
    fresh.write_bytes(b"in flight")
    old = stale.stat().st_mtime - 2 * cloud.storage.STALE_TEMP_SECONDS
    os.utime(stale, (old, old))
    with LandingServer(landing_settings):
        assert sorted(p.name for p in directory.iterdir()) == [".b2.0002.tmp"]


def test_unknown_path_and_method_have_the_error_shape(landing: LandingServer) -> None:
    client = landing.client()
    missing = client.request("GET", "/v1/nothing")
    assert missing.status == 404
    assert set(missing.json()) == {"error", "status_code", "error_description"}
    assert missing.json()["error"] == "not_found"
    wrong = client.request("POST", "/v1/batches/b1", b"x", {"Authorization": f"Bearer {TOKEN}"})
    assert (wrong.status, wrong.json()["error"]) == (405, "method_not_allowed")
    assert "PUT" in wrong.headers["allow"]


def test_metrics_count_what_happened(landing: LandingServer) -> None:
    client = landing.client()
    first, second = batch(RECORDS), batch(RECORDS[:1])
    client.put("b1", first)
    client.put("b2", second)
    client.put("b1", first)
    client.put("b1", second)
    client.put("b3", _gz(b"{}\n"))
    landing.client(token="bad").put("b4", first)
    metrics = client.metrics()
    assert metrics["sepa_cloud_batches_stored_total"] == 2
    assert metrics["sepa_cloud_records_stored_total"] == 4
    assert metrics["sepa_cloud_bytes_stored_total"] == len(first) + len(second)
    assert metrics["sepa_cloud_batches_duplicate_total"] == 1
    assert metrics['sepa_cloud_batches_rejected_total{reason="conflict"}'] == 1
    assert metrics['sepa_cloud_batches_rejected_total{reason="bad_record"}'] == 1
    assert metrics['sepa_cloud_batches_rejected_total{reason="unauthorized"}'] == 1


def test_a_line_spanning_many_inflated_chunks_is_checked_in_linear_time(
    landing_settings: LandingSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record as long as the inflate limit allows arrives in many inflated chunks. Joining the line
    so far to each new chunk was quadratic: with the default limits a 1 GiB line (1 MiB of gzip) was
    1,024 chunks, and a 128 MiB one took 8.8 s of a thread. Lines are now at most MAX_LINE_BYTES (1 MiB):
    the longest, in 512-byte chunks (2,000 chunks; the inflate ratio lifted: the line inflates ~1,000 times)."""
    monkeypatch.setattr(cloud.contract, "_CHUNK", 512)
    settings = dataclasses.replace(landing_settings, max_batch_bytes=256 << 10, inflate_ratio=1 << 12)
    line = json.dumps(record(1, value=None, literal="x" * (MAX_LINE_BYTES - 1000))).encode() + b"\n"
    assert MAX_LINE_BYTES - 1000 < len(line) <= MAX_LINE_BYTES
    with LandingServer(settings) as landing:
        started = time.perf_counter()
        reply = landing.client().put("b1", _gz(line))
        elapsed = time.perf_counter() - started
    assert reply.status == 201, reply.body
    assert elapsed < 2.0, f"{elapsed:.1f} s to check one line"


@pytest.mark.parametrize(
    "body",
    [
        batch(RECORDS[:1]) + batch(RECORDS[1:]),
        _gz(b"") + batch(RECORDS),
        _with_header_flag(batch(RECORDS), 0x04, b"\x04\x00abcd"),  # FEXTRA, 4 bytes
        _with_header_flag(_gz(b"") + batch(RECORDS), 0x08, b"name.json\0"),  # FNAME
    ],
    ids=["two-members", "empty-first-member", "fextra", "fname"],
)
def test_gzip_forms_sparks_reader_takes_are_accepted(landing: LandingServer, body: bytes) -> None:
    """The strict inflater refuses only what Spark cannot read: these forms the stream job reads."""
    reply = landing.client().put("b1", body)
    assert reply.status == 201, reply.body
    assert reply.json()["records"] == len(RECORDS)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (_gz(ndjson(RECORDS[:1]) + b" " * (MAX_LINE_BYTES + 10) + b"\n" + ndjson(RECORDS)), "line 2: longer than"),
        (_gz(ndjson(RECORDS[:1]) + b"x" * MAX_LINE_BYTES + b"\n"), "line 2: longer than"),
        (_gz(b" " * (3 * MAX_LINE_BYTES)), "line 1: longer than"),
    ],
    ids=["spaces", "just-too-long", "never-ending"],
)
def test_a_line_past_the_bound_is_400(landing_settings: LandingSettings, body: bytes, problem: str) -> None:
    """A line is held whole to be parsed: a 1 MB upload inflating to one 1 GiB line of spaces took the
    landing to 3.1 GB (an attack pass). Lines are refused past MAX_LINE_BYTES, under the inflate limit
    (the inflate ratio lifted here: these bodies inflate ~1,000 times, 413 at the default ratio)."""
    settings = dataclasses.replace(landing_settings, max_batch_bytes=256 << 10, inflate_ratio=1 << 16)
    assert settings.inflate_limit(len(body)) > 3 * MAX_LINE_BYTES
    with LandingServer(settings) as landing:
        reply = landing.client().put("b1", body)
        assert reply.status == 400, reply.body
        assert problem in reply.json()["error_description"]
        assert landing.all_files() == []
