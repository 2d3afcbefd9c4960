"""How far a batch may inflate, over real HTTPS sockets: ``inflate_ratio`` times its own size, so the
work of checking it is proportional to the bytes received, while the gateway's own segments stay
well within it (``cloud.settings.DEFAULT_INFLATE_RATIO``)."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Iterator

import pytest

from cloud.settings import DEFAULT_INFLATE_RATIO, LandingSettings
from tests.cloud.cloud_support import GATEWAY_SEGMENTS, LandingServer, ndjson, record, shipper_lines, shipper_segment

RECORDS = [record(n) for n in range(3)]
LEVELS = (1, 9)  # the shipper's gzip level, and the most any client could squeeze


@pytest.fixture
def roomy(landing_settings: LandingSettings) -> Iterator[LandingServer]:
    """The endpoint with room for whole 1 MiB segments (the fixture's 64 KiB limit is for the tests' batches)."""
    with LandingServer(dataclasses.replace(landing_settings, max_batch_bytes=1 << 20)) as server:
        yield server


def _with_extra_field(body: bytes, size: int) -> bytes:
    """`body` (one gzip member, plain 10-byte header) grown to `size` bytes by an FEXTRA header field:
    the same content, as many compressed bytes as a test needs."""
    extra = size - len(body) - 2
    assert 0 <= extra < 1 << 16
    return body[:3] + bytes([body[3] | 0x04]) + body[4:10] + extra.to_bytes(2, "little") + bytes(extra) + body[10:]


def test_a_small_body_inflating_past_its_ratio_is_413(landing: LandingServer) -> None:
    """The attack pass's bomb, scaled down: valid records, all alike, inflating hundreds of times (a 4.5 MB
    body to 1 GiB took ~34 CPU-seconds to check). Under the 1 GiB cap on any batch, it was checked to
    the end and stored; past ``inflate_ratio`` times its size it is refused, checking stopped there."""
    inflated = ndjson([RECORDS[0]] * 20_000)
    bomb = gzip.compress(inflated, mtime=0)
    assert len(bomb) < landing.settings.max_batch_bytes
    assert len(bomb) * landing.settings.inflate_ratio < len(inflated) < landing.settings.max_decompressed_bytes
    reply = landing.client().put("b1", bomb)
    assert reply.status == 413, reply.body
    assert reply.json()["error"] == "payload_too_large"
    limit = len(bomb) * landing.settings.inflate_ratio
    assert f"inflates to more than {limit} bytes" in reply.json()["error_description"]
    assert landing.client().metrics()['sepa_cloud_batches_rejected_total{reason="too_large"}'] == 1
    assert landing.all_files() == []


def test_the_limit_is_the_ratio_times_the_body_exactly(landing: LandingServer) -> None:
    """A body of n bytes may inflate to n x ``inflate_ratio`` bytes, not one more (same compressed size,
    an FEXTRA field making up the difference)."""
    size = 2000
    limit = size * landing.settings.inflate_ratio
    padding = limit - len(ndjson(RECORDS))
    inflated = json.dumps(RECORDS[0]).encode() + b" " * padding + b"\n" + ndjson(RECORDS[1:])
    assert len(inflated) == limit
    at_limit = _with_extra_field(gzip.compress(inflated, mtime=0), size)
    past_it = _with_extra_field(gzip.compress(inflated + b" ", mtime=0), size)
    assert len(at_limit) == len(past_it) == size
    assert landing.client().put("b1", at_limit).status == 201
    reply = landing.client().put("b2", past_it)
    assert reply.status == 413, reply.body
    assert f"inflates to more than {limit} bytes" in reply.json()["error_description"]
    assert landing.all_files() == ["b1.json.gz"]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", [*GATEWAY_SEGMENTS, "numbered-iris"])
def test_shipper_segments_are_stored(roomy: LandingServer, kind: str, level: int) -> None:
    """Whole 1 MiB segments as the shipper makes them, the most compressible ones included."""
    lines = shipper_lines(kind)
    reply = roomy.client().put("plant-room-1-0a1b2c3d-000000000001", shipper_segment(kind, level))
    assert reply.status == 201, reply.body
    assert reply.json()["records"] == lines.count(b"\n")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", GATEWAY_SEGMENTS)
def test_the_default_ratio_is_three_times_what_gateway_segments_inflate(kind: str, level: int) -> None:
    """The margin ``DEFAULT_INFLATE_RATIO``'s docstring states, measured (22.5 at most at level 1, 26.6 at 9)."""
    ratio = len(shipper_lines(kind)) / len(shipper_segment(kind, level))
    assert 3 * ratio <= DEFAULT_INFLATE_RATIO, f"{kind} at level {level} inflates {ratio:.1f} times"
