"""Tokens bound to a gateway, over real HTTPS sockets: a bound token writes only its gateway's batch
ids (as the shipper names them), so one gateway's token holder can no longer take another gateway's
next ids first (its real segments then got 409 and were lost); unbound tokens still work, warned about."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import cloud.tokens
from cloud.settings import LandingSettings, SettingsError
from cloud.tokens import TOKENS_ENV, TokenError, batch_gateway, load_tokens
from gateway.shipper.spool import Segment, Spool
from tests.cloud.cloud_support import LandingServer, batch, record

RECORDS = [record(n) for n in range(3)]
VICTIM, ATTACKER = "victim-secret-91c4", "attacker-secret-5e20"
SPOOL_ID = "0a1b2c3d"


def batch_id(gateway: str, number: int = 1) -> str:
    return f"{gateway}-{SPOOL_ID}-{number:012d}"


@pytest.fixture
def bound(landing_settings: LandingSettings) -> Iterator[LandingServer]:
    settings = dataclasses.replace(landing_settings, tokens=(f"plant-room-1:{VICTIM}", f"gw-b:{ATTACKER}"))
    with LandingServer(settings) as server:
        yield server


def test_a_bound_token_cannot_write_another_gateways_batches(bound: LandingServer) -> None:
    """The attack: gateway gw-b's token holder PUTs plant-room-1's next batch id first. Refused (403),
    nothing stored, so the victim's own upload of that id is stored (it was a 409, the segment lost)."""
    target = batch_id("plant-room-1", 7)
    reply = bound.client(ATTACKER).put(target, batch([record(99, value=-40.0)]))
    assert reply.status == 403, reply.body
    assert reply.json() == {
        "error": "forbidden",
        "status_code": 403,
        "error_description": "this token may only write its own gateway's batches (<gateway>-<spool id>-<segment>)",
    }
    assert ATTACKER not in reply.body.decode()
    assert bound.all_files() == []
    assert bound.client(VICTIM).metrics()['sepa_cloud_batches_rejected_total{reason="wrong_gateway"}'] == 1
    assert bound.client(VICTIM).put(target, batch(RECORDS)).status == 201
    assert bound.client(ATTACKER).put(batch_id("gw-b", 7), batch(RECORDS)).status == 201
    assert bound.all_files() == [f"{batch_id('gw-b', 7)}.json.gz", f"{target}.json.gz"]


@pytest.mark.parametrize(
    "batch_id_",
    [
        "plant-room-1-2-0a1b2c3d-000000000001",  # gateway plant-room-1-2's
        "plant-room-0a1b2c3d-000000000001",  # gateway plant-room's
        "plant-room-1-000000000001",  # no spool id: gateway plant-room's
        "plant-room-1",
        "plant-room-1--000000000001",
        "plant-room-1-0a1b2c3d-",
        "Plant-room-1-0a1b2c3d-000000000001",
        "plant-room-1.x-0a1b2c3d-000000000001",
    ],
)
def test_a_bound_token_writes_only_ids_shaped_as_its_gateways(bound: LandingServer, batch_id_: str) -> None:
    reply = bound.client(VICTIM).put(batch_id_, batch(RECORDS))
    assert reply.status == 403, reply.body
    assert bound.all_files() == []


@pytest.mark.parametrize(
    "gateway_id",
    ["plant-room-1", "plant room/1", "_edge.7", "gw", "gw-2", "é" * 80],
    ids=["plain", "space-slash", "leading-underscore", "gw", "gw-2", "long-non-ascii"],
)
def test_the_shippers_batch_ids_pass_their_gateways_binding(
    landing_settings: LandingSettings, tmp_path: Path, gateway_id: str
) -> None:
    """Bound to the slug the shipper's own batch ids start with (Spool.batch_id): its uploads are stored,
    and a neighbour whose slug extends it ("gw" and "gw-2") is refused the other's ids either way."""
    spool = Spool.open(tmp_path / "spool", segment_max_bytes=1 << 20, budget_bytes=1 << 24)
    own = spool.batch_id(Segment(1, 3, 0, tmp_path / "seg"), gateway_id)
    slug = batch_gateway(own)
    assert slug is not None and own == f"{slug}-{spool.id}-000000000001"
    neighbour = f"{slug[:62]}-2" if slug != "gw-2" else "gw"
    tokens = (f"{slug}:own-token", f"{neighbour}:neighbour-token")
    with LandingServer(dataclasses.replace(landing_settings, tokens=tokens)) as landing:
        assert landing.client("own-token").put(own, batch(RECORDS)).status == 201
        theirs = spool.batch_id(Segment(2, 3, 0, tmp_path / "seg"), neighbour)
        assert landing.client("own-token").put(theirs, batch(RECORDS)).status == 403
        assert landing.client("neighbour-token").put(own.replace("-000000000001", "-000000000002"), b"").status == 403
        assert landing.client("neighbour-token").put(theirs, batch(RECORDS)).status == 201


def test_unbound_tokens_still_write_anything_and_are_warned_about_once(
    landing_settings: LandingSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """Existing deployments' tokens keep working; the start-up log says how many can write any
    gateway's batches and how to bind them, without a token."""
    settings = dataclasses.replace(landing_settings, tokens=("old-token-1", "plant-room-1:bound-1", "old-token-2"))
    with caplog.at_level(logging.DEBUG, logger="cloud"), LandingServer(settings) as landing:
        assert landing.client("old-token-1").put(batch_id("plant-room-1"), batch(RECORDS)).status == 201
        assert landing.client("old-token-2").put("anything", batch(RECORDS)).status == 201
        assert landing.client("bound-1").put("anything-else", batch(RECORDS)).status == 403
    warnings = [entry for entry in caplog.records if entry.levelno >= logging.WARNING]
    assert len(warnings) == 1
    (warning,) = warnings
    assert warning.count == 2  # type: ignore[attr-defined]
    assert "any gateway's batches" in warning.getMessage() and "<gateway-slug>:<token>" in warning.getMessage()
    logged = caplog.text + " ".join(str(vars(entry)) for entry in caplog.records)
    for secret in ("old-token-1", "old-token-2", "bound-1"):
        assert secret not in logged


def test_bound_tokens_warn_of_nothing(landing_settings: LandingSettings, caplog: pytest.LogCaptureFixture) -> None:
    settings = dataclasses.replace(landing_settings, tokens=(f"plant-room-1:{VICTIM}",))
    with caplog.at_level(logging.DEBUG, logger="cloud"), LandingServer(settings) as landing:
        assert landing.client(VICTIM).put(batch_id("plant-room-1"), batch(RECORDS)).status == 201
    assert [entry for entry in caplog.records if entry.levelno >= logging.WARNING] == []
    assert any(entry.getMessage() == "batch" for entry in caplog.records)  # the endpoint's log was captured


def test_bound_tokens_are_compared_in_constant_time(bound: LandingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which token matched is found with no early exit: compare_digest runs once per accepted token, on
    the token alone (not its gateway), whether the first, the last or none matches."""
    calls: list[tuple[bytes, bytes]] = []
    real = cloud.tokens.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(cloud.tokens.hmac, "compare_digest", spy)
    for token, status in ((VICTIM, 201), (ATTACKER, 403), ("nope", 401)):
        calls.clear()
        assert bound.client(token).put(batch_id("plant-room-1"), batch(RECORDS)).status in (status, 200)
        assert sorted(b for _, b in calls) == sorted([VICTIM.encode(), ATTACKER.encode()])


def test_token_entries_bound_and_unbound_load(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# plant room\nplant-room-1:a1\n\nunbound-b2\nplant-room-1:a1\n")
    environ = {TOKENS_ENV: "gw.7:c3, g_x-y:d4"}
    assert load_tokens(str(tokens), environ) == ("plant-room-1:a1", "unbound-b2", "gw.7:c3", "g_x-y:d4")


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ("-gw:s3cret-x", "token number 1: the part before ':' is not a gateway"),
        ("ok:fine,gw/1:s3cret-x", "token number 2: the part before ':' is not a gateway"),
        (f"{'g' * 65}:s3cret-x", "token number 1: the part before ':' is not a gateway"),
        (":s3cret-x", "token number 1: the part before ':' is not a gateway"),
        ("gw:", "token number 1: no token after its gateway"),
        ("gw-a:s3cret-x,gw-b:s3cret-x", "token number 2 is token number 1 again, bound otherwise"),
        ("s3cret-x,gw-b:s3cret-x", "token number 2 is token number 1 again, bound otherwise"),
    ],
    ids=["leading-dash", "slash", "too-long", "empty-gateway", "empty-token", "two-gateways", "bound-and-not"],
)
def test_malformed_entries_are_refused_without_their_secret(tmp_path: Path, entries: str, message: str) -> None:
    with pytest.raises(TokenError, match=message) as raised:
        load_tokens(None, {TOKENS_ENV: entries})
    assert "s3cret" not in str(raised.value)
    settings = LandingSettings(landing_dir=tmp_path, tokens=tuple(entries.split(",")))
    with pytest.raises(SettingsError, match=message):
        settings.validate()
