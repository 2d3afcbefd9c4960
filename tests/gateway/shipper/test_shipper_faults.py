"""The cloud shipper against a landing endpoint that misbehaves: it must lose nothing, keep retrying
and show what happened, whatever the reply.

Real parts: a Gateway (in process, on its HTTP port) with the shipper on, and the real landing
endpoint (cloud.landing) on a free port over plain HTTP (`allow_http`). The misbehaviour is a
middleware put in front of the endpoint's handlers and switched on and off by the test: what a
broken proxy, a captive portal or a hostile host on the way would answer.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from cloud.settings import LandingSettings
from cloud.tokens import BearerCheck
from gateway.appliance.config import Config
from gateway.appliance.shipping import build_shipper
from gateway.observations.vocabulary import GRAPH_LATEST, GRAPH_OBSERVATIONS, GW, QUDT, SOSA, XSD
from gateway.shipper.records import json_line
from gateway.shipper.spool import Spool
from tests.cloud.cloud_support import TOKEN, LandingServer, record
from tests.polling import wait_until
from tools.launcher import InProcessGateway

Reply = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Fault:
    """While `reply` is set, every PUT is answered by it (its body read first) instead of the endpoint."""

    reply: Reply | None = None
    seen: int = 0

    @web.middleware
    async def middleware(self, request: web.Request, handler: Reply) -> web.StreamResponse:
        reply = self.reply
        if reply is None or request.method != "PUT":
            return await handler(request)
        self.seen += 1
        await request.read()
        return await reply(request)


@dataclass
class Cloud:
    server: LandingServer
    fault: Fault

    @property
    def landed(self) -> int:
        """Observations the endpoint stored."""
        assert self.server.landing is not None
        return self.server.landing.metrics.records_stored


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    fault = Fault()
    settings = LandingSettings(landing_dir=tmp_path / "landing", tokens=(TOKEN,), host="127.0.0.1", port=0)
    with LandingServer(settings, [fault.middleware]) as server:
        yield Cloud(server, fault)


def shipping_gateway(
    start: Callable[[Config], InProcessGateway],
    directory: Path,
    cloud: Cloud,
    budget: int = 1 << 20,
    *,
    spool: Path | None = None,
    segment_bytes: int = 1024,
) -> InProcessGateway:
    """A gateway shipping to `cloud`: small segments sealed at once, quick retries."""
    return start(shipping_config(directory, cloud, budget, spool=spool, segment_bytes=segment_bytes))


def shipping_config(
    directory: Path, cloud: Cloud, budget: int = 1 << 20, *, spool: Path | None = None, segment_bytes: int = 1024
) -> Config:
    """The configuration of :func:`shipping_gateway`."""
    token = directory / "token"
    token.write_text(TOKEN + "\n")
    config = Config()
    shipper = config.shipper
    shipper.enabled, shipper.allow_http = True, True
    shipper.url = f"http://127.0.0.1:{cloud.server.port}"
    shipper.token_file, shipper.spool_dir = str(token), str(spool or directory / "spool")
    shipper.segment_max_bytes, shipper.spool_budget_bytes, shipper.segment_max_age_s = segment_bytes, budget, 0.1
    shipper.upload_timeout_s, shipper.backoff_initial_s, shipper.backoff_max_s = 2.0, 0.05, 0.2
    return config


def observe(gateway: InProcessGateway, first: int, count: int) -> None:
    """Observations `first`.. of one sensor, as the observation layer writes them (sequence = number)."""
    triples = []
    for number in range(first, first + count):
        node = f"<urn:sepa-gateway:obs:test{number}>"
        triples.append(
            f"{node} a <{SOSA}Observation> ; <{SOSA}madeBySensor> <urn:example:sensor> ; "
            f"<{SOSA}observedProperty> <{GW}temperature> ; <{SOSA}hasFeatureOfInterest> <urn:example:room> ; "
            f'<{SOSA}resultTime> "2026-11-27T21:00:00.{number:06d}Z"^^<{XSD}dateTime> ; '
            f'<{GW}sequenceNumber> {number} ; <{GW}hasMqttTopic> "home/sensor" ; '
            f"<{SOSA}hasResult> <urn:sepa-gateway:obs:test{number}/result> .\n"
            f'<urn:sepa-gateway:obs:test{number}/result> <{QUDT}numericValue> "{number}.5"^^<{XSD}double> .'
        )
    reply = gateway.update(f"INSERT DATA {{ GRAPH <{GRAPH_OBSERVATIONS}> {{ {' '.join(triples)} }} }}")
    assert reply.status == 200, reply.body


def shipper_metrics(gateway: InProcessGateway) -> dict[str, float]:
    prefix = "sepa_shipper_"
    return {name[len(prefix) :]: value for name, value in gateway.metrics().items() if name.startswith(prefix)}


def test_an_error_reply_that_is_not_utf8_does_not_stop_the_uploads(
    in_process_gateway, tmp_path: Path, cloud: Cloud
) -> None:
    async def garbage(_request: web.Request) -> web.Response:
        return web.Response(status=503, body=b"\xff\xfe\xfa down \xc3", content_type="text/plain")

    cloud.fault.reply = garbage
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud)
    observe(gateway, 1, 30)
    wait_until(lambda: cloud.fault.seen >= 6)  # each upload worker had such a reply, more than once
    cloud.fault.reply = None
    wait_until(lambda: cloud.landed == 30)
    metrics = shipper_metrics(gateway)
    assert metrics["upload_failures_http_503"] >= 6
    wait_until(lambda: shipper_metrics(gateway)["backlog_observations"] == 0)


def portal(_request: web.Request) -> web.Response:
    return web.Response(status=200, text="<html><body>Welcome! Accept the terms to go on.</body></html>")


def other_batch(_request: web.Request) -> web.Response:
    return web.json_response({"batch": "another-batch", "records": 30, "duplicate": False}, status=201)


@pytest.mark.parametrize("answer", [portal, other_batch], ids=["captive-portal-200", "201-for-another-batch"])
def test_a_success_status_without_the_contract_reply_is_not_taken_for_stored(
    in_process_gateway, tmp_path: Path, cloud: Cloud, answer: Callable[[web.Request], web.Response]
) -> None:
    async def reply(request: web.Request) -> web.Response:
        return answer(request)

    cloud.fault.reply = reply
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud)
    observe(gateway, 1, 30)
    wait_until(lambda: cloud.fault.seen >= 3)
    cloud.fault.reply = None
    wait_until(lambda: cloud.landed == 30)
    # the endpoint stores a batch before its reply reaches the shipper, which counts it then
    wait_until(lambda: shipper_metrics(gateway)["uploaded_observations"] == 30)
    assert shipper_metrics(gateway)["upload_failures_bad_reply"] >= 3


def test_a_reply_body_without_end_is_not_read_whole(in_process_gateway, tmp_path: Path, cloud: Cloud) -> None:
    """A 503 whose body is 256 MiB: the shipper reads the start of it only, and retries."""
    offered = 256 << 20
    sent: list[int] = []

    async def flood(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=503, headers={"Content-Length": str(offered)})
        await response.prepare(request)
        chunk, written = b"x" * (1 << 20), 0
        try:
            while written < offered:
                await response.write(chunk)
                written += len(chunk)
        except ConnectionError:
            pass
        finally:
            sent.append(written)
        return response

    cloud.fault.reply = flood
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud)
    observe(gateway, 1, 30)
    wait_until(lambda: len(sent) >= 2, timeout=30)
    cloud.fault.reply = None
    wait_until(lambda: cloud.landed == 30)
    assert max(sent) <= 32 << 20, f"the shipper read {max(sent) >> 20} MiB of a reply"
    assert shipper_metrics(gateway)["upload_failures_http_503"] >= 2


def test_a_redirect_is_not_followed(in_process_gateway, tmp_path: Path, cloud: Cloud) -> None:
    """307 to another host, which answers as the endpoint would: the observations must not go there
    (a redirect cannot make another host the cloud), and nothing is set aside for good."""
    received: list[int] = []

    async def elsewhere(request: web.Request) -> web.Response:
        body = await request.read()
        received.append(len(body))
        records = gzip.decompress(body).count(b"\n")
        reply = {"batch": request.match_info["batch_id"], "records": records, "duplicate": False}
        return web.json_response(reply, status=201)

    settings = LandingSettings(landing_dir=tmp_path / "elsewhere", tokens=("another",), host="127.0.0.1", port=0)
    with LandingServer(settings, [Fault(elsewhere).middleware]) as other:

        async def redirect(request: web.Request) -> web.Response:
            return web.Response(status=307, headers={"Location": f"http://127.0.0.1:{other.port}{request.path}"})

        cloud.fault.reply = redirect
        gateway = shipping_gateway(in_process_gateway, tmp_path, cloud)
        observe(gateway, 1, 30)
        wait_until(lambda: cloud.fault.seen >= 3)
        cloud.fault.reply = None
        wait_until(lambda: cloud.landed == 30)
    assert received == []
    metrics = shipper_metrics(gateway)
    assert metrics["upload_failures_http_307"] >= 3 and metrics["rejected_segments"] == 0


def test_a_gateway_starts_on_a_spool_damaged_by_a_power_cut_and_ships_the_rest(
    in_process_gateway, tmp_path: Path, cloud: Cloud
) -> None:
    """A block of zeros in the middle of the open segment (a write that never reached the disk):
    the gateway starts, the damaged record is counted, the others land."""
    spool = Spool.open(tmp_path / "spool", segment_max_bytes=1 << 20, budget_bytes=1 << 20)
    spool.append([json_line(record(number)) for number in range(5)], {})
    spool.close()
    (opened,) = (tmp_path / "spool").glob("open-*.jsonl")
    lines = opened.read_bytes().splitlines(keepends=True)
    opened.write_bytes(b"".join(lines[:2]) + b"\0" * (len(lines[2]) - 1) + b"\n" + b"".join(lines[3:]))
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud)
    wait_until(lambda: cloud.landed == 4)
    wait_until(lambda: shipper_metrics(gateway)["backlog_observations"] == 0)
    assert shipper_metrics(gateway)["damaged_observations"] == 1


@pytest.mark.parametrize(
    ("name", "damaged"),
    [("cursor.json", b'{"through": 3, "keys": {"urn:exa'), ("spool.json", b"\0" * 20), ("spool.json", b'{"id": 1}')],
)
def test_a_shipper_starts_on_a_damaged_spool_state_file_and_ships_again_rather_than_skip(
    in_process_gateway, tmp_path: Path, cloud: Cloud, name: str, damaged: bytes
) -> None:
    """The shipper ships 20 observations and stops; `name` is damaged (a power cut) and the shipper
    starts again over the same store. It sets the file aside, counts it, and ships the store's 20
    again (under a new spool id: new batch ids, none refused as a conflict) and what comes after."""
    config = shipping_config(tmp_path, cloud)
    gateway = in_process_gateway(config)
    observe(gateway, 1, 20)
    wait_until(lambda: cloud.landed == 20)
    wait_until(lambda: shipper_metrics(gateway)["backlog_observations"] == 0)
    app = gateway.gateway
    assert app.shipper is not None
    gateway.call(app.shipper.stop())
    (tmp_path / "spool" / name).write_bytes(damaged)
    app.shipper = build_shipper(config, app.client, app.gateway_id)
    app.gates.metric_sources["shipper"] = app.shipper.metrics
    gateway.call(app.shipper.start())
    wait_until(lambda: cloud.landed == 40)  # the store's 20 again: shipped twice rather than skipped
    observe(gateway, 21, 5)
    wait_until(lambda: cloud.landed == 45)
    metrics = shipper_metrics(gateway)
    assert metrics["damaged_files"] == 1 and metrics["rejected_segments"] == 0
    assert (tmp_path / "spool" / f"{name}.damaged").read_bytes() == damaged


@pytest.mark.parametrize("status", [404, 405, 421, 502])
def test_a_status_the_endpoint_never_gives_a_batch_does_not_set_it_aside(
    in_process_gateway, tmp_path: Path, cloud: Cloud, status: int
) -> None:
    """Only 400, 409 and 413 say the batch itself can never be stored (README). A 404 or 405 is a
    path or a proxy not routing yet, which the operator fixes: the batch must go once fixed."""

    async def not_routed(_request: web.Request) -> web.Response:
        return web.Response(status=status, text="no route")

    cloud.fault.reply = not_routed
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud)
    observe(gateway, 1, 30)
    wait_until(lambda: cloud.fault.seen >= 3)
    cloud.fault.reply = None
    wait_until(lambda: cloud.landed == 30)
    metrics = shipper_metrics(gateway)
    assert metrics[f"upload_failures_http_{status}"] >= 3 and metrics["rejected_segments"] == 0


def test_segments_refused_for_good_stay_within_the_spool_budget(
    in_process_gateway, tmp_path: Path, cloud: Cloud
) -> None:
    """An endpoint answering 400 to every batch (hostile, or a contract it no longer speaks): the
    segments kept aside for the operator count against the spool's budget like the others."""

    async def refuse(_request: web.Request) -> web.Response:
        return web.json_response({"error": "invalid_request"}, status=400)

    cloud.fault.reply = refuse
    budget = 64 << 10
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud, budget)
    for first in range(1, 12_001, 1000):
        observe(gateway, first, 1000)
    wait_until(lambda: shipper_metrics(gateway)["spooled_observations"] == 12_000, timeout=30)
    wait_until(lambda: shipper_metrics(gateway)["backlog_observations"] == 0, timeout=30)
    kept = sum(path.stat().st_size for path in (tmp_path / "spool" / "rejected").iterdir())
    metrics = shipper_metrics(gateway)
    assert kept <= budget, f"{kept} bytes kept aside, over the budget of {budget}"
    assert metrics["rejected_segments"] > 0 and metrics["rejected_deleted_segments"] > 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 128 KiB tmpfs (the tests run as root): a spool directory whose disk fills up."""
    if os.geteuid() != 0:
        pytest.fail("the full-disk test mounts a tmpfs: it runs as root", pytrace=False)
    directory = tmp_path / "small"
    directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(directory)], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


def fill(disk: Path, gateway: InProcessGateway) -> Path:
    """Fill `disk` (something else, the store or the logs, takes its room); the file to remove.
    Once the shipper has deleted what the cloud confirmed: filled before, the segment's room came
    back after and the next 100 observations were spooled (350 landed for 250, at load 3)."""
    wait_until(lambda: shipper_metrics(gateway)["backlog_observations"] == 0)
    filler = disk / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as file:
        while True:
            file.write(b"\0" * 4096)
            file.flush()
    return filler


def test_a_full_spool_disk_loses_no_observation(
    small_disk: Path, in_process_gateway, tmp_path: Path, cloud: Cloud
) -> None:
    """Something else fills the spool's disk (the store, logs) while observations come in. Once there
    is room again, every observation lands, once: those that could not be spooled are spooled again
    from the store."""
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud, spool=small_disk)
    observe(gateway, 1, 100)
    wait_until(lambda: cloud.landed == 100)
    filler = fill(small_disk, gateway)
    for first in range(101, 401, 100):
        observe(gateway, first, 100)
    wait_until(lambda: shipper_metrics(gateway)["spool_failures"] >= 1)
    filler.unlink()
    wait_until(lambda: cloud.landed >= 400, timeout=30)
    wait_until(lambda: shipper_metrics(gateway)["backlog_observations"] == 0)
    assert cloud.landed == 400  # each once


def test_segments_sealed_on_a_full_disk_are_shipped_once(
    small_disk: Path, in_process_gateway, tmp_path: Path, cloud: Cloud
) -> None:
    """The endpoint is down until the spool's own segments fill its disk, and 200 observations come
    after that: sealing fails midway (the segment written, not the cursor; or not the segment). Once
    uploads free the disk, every observation lands exactly once."""

    async def down(_request: web.Request) -> web.Response:
        return web.Response(status=503)

    cloud.fault.reply = down
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud, spool=small_disk, segment_bytes=16 << 10)
    total = 0
    while not shipper_metrics(gateway)["spool_failures"]:
        assert total < 20_000, "the spool's disk never filled up"
        observe(gateway, total + 1, 100)
        total += 100
    observe(gateway, total + 1, 200)
    total += 200
    cloud.fault.reply = None
    wait_until(lambda: cloud.landed >= total, timeout=60)
    wait_until(lambda: shipper_metrics(gateway)["backlog_observations"] == 0)
    assert cloud.landed == total  # each once
    assert not list(small_disk.glob(".*.tmp"))  # nothing half written left to fill the disk


def test_a_segment_that_cannot_be_read_does_not_end_the_uploads(
    in_process_gateway, tmp_path: Path, cloud: Cloud
) -> None:
    """A sealed segment that reads as an I/O error (a directory where its file was: IsADirectoryError,
    as EIO would): before, it ended every upload worker that tried it, and nothing was shipped
    again until a restart; now it is counted and retried, and ships once readable."""

    async def unavailable(_request: web.Request) -> web.Response:
        return web.Response(status=503, text="down")

    cloud.fault.reply = unavailable
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud)
    observe(gateway, 1, 30)
    wait_until(lambda: cloud.fault.seen >= 2)  # sealed (one segment of 30), and refused
    (damaged,) = (tmp_path / "spool").glob("seg-*.jsonl.gz")
    content = damaged.read_bytes()
    damaged.unlink()
    damaged.mkdir()
    cloud.fault.reply = None
    wait_until(lambda: shipper_metrics(gateway).get("upload_failures_local", 0) >= 3)
    damaged.rmdir()
    damaged.write_bytes(content)
    wait_until(lambda: cloud.landed == 30)
    wait_until(lambda: shipper_metrics(gateway)["backlog_observations"] == 0)


def _stored(gateway: InProcessGateway) -> int:
    rows = gateway.select(
        f"SELECT (COUNT(?o) AS ?n) WHERE {{ GRAPH <{GRAPH_OBSERVATIONS}> {{ ?o a <{SOSA}Observation> }} }}"
    )
    return int(rows[0]["n"])


def _shipper_health(gateway: InProcessGateway) -> str:
    return gateway.request("GET", "/health").json()["components"]["shipper"]["status"]


def test_retention_holds_off_while_the_spool_disk_is_full(
    small_disk: Path, in_process_gateway, tmp_path: Path, cloud: Cloud
) -> None:
    """The store alone holds what could not be spooled; retention pruned it meanwhile, and the
    shipper, once there was room, found nothing to spool again (a 4 MB spool disk full for 40 s with
    retain_count 30 at 10 Hz: 475 of 992 readings never landed, no counter moved). Here every
    observation is past the age retention (8 days old, 1 hour kept), pruned a run every 0.2 s."""
    config = shipping_config(tmp_path, cloud, spool=small_disk)
    config.observations.retain_age_s, config.observations.prune_interval_s = 3600.0, 0.2
    gateway = in_process_gateway(config)
    observe(gateway, 1, 100)
    wait_until(lambda: cloud.landed == 100)
    wait_until(lambda: _stored(gateway) == 0)  # pruned once spooled
    filler = fill(small_disk, gateway)
    for first in range(101, 401, 100):
        observe(gateway, first, 100)
    wait_until(lambda: shipper_metrics(gateway)["spool_failures"] >= 1)

    def runs() -> float:  # pruning runs, made or held off
        metrics = gateway.metrics()
        return metrics["sepa_retention_runs"] + metrics.get("sepa_retention_held_runs", 0)

    before = runs()
    wait_until(lambda: runs() >= before + 3)
    assert _stored(gateway) == 300  # nothing pruned while it is not spooled
    assert _shipper_health(gateway) == "failing"
    filler.unlink()
    wait_until(lambda: cloud.landed >= 400, timeout=30)
    assert cloud.landed == 400
    assert shipper_metrics(gateway)["lost_observations"] == 0
    wait_until(lambda: _stored(gateway) == 0)  # and pruned again once spooled


def _latest(gateway: InProcessGateway, sequence: int) -> None:
    """The sensor's latest node, as the observation layer keeps it: retention counts from it."""
    node = "<urn:sepa-gateway:latest:test>"
    reply = gateway.update(
        f"DELETE WHERE {{ GRAPH <{GRAPH_LATEST}> {{ {node} <{GW}sequenceNumber> ?n }} }} ;"
        f"INSERT DATA {{ GRAPH <{GRAPH_LATEST}> {{ {node} <{GW}sensor> <urn:example:sensor> ; "
        f"<{GW}property> <{GW}temperature> ; <{GW}sequenceNumber> {sequence} }} }}"
    )
    assert reply.status == 200, reply.body


def test_what_retention_prunes_past_its_hold_is_counted_lost(
    small_disk: Path, in_process_gateway, tmp_path: Path, cloud: Cloud
) -> None:
    """Retention holds off while the spool disk is full only until the busiest sensor has sent
    another `retain_count` readings (the store would grow without bound); what it prunes past
    that point never lands, and is counted once spooling resumes, with a warning: landed and
    lost add up to every observation made."""
    config = shipping_config(tmp_path, cloud, spool=small_disk)
    config.observations.retain_count, config.observations.prune_interval_s = 150, 0.2
    config.observations.retain_age_s = 10 * 365 * 86400.0  # by count only
    gateway = in_process_gateway(config)
    observe(gateway, 1, 100)
    wait_until(lambda: cloud.landed == 100)
    filler = fill(small_disk, gateway)
    for first in range(101, 401, 100):
        observe(gateway, first, 100)
    _latest(gateway, 400)
    wait_until(lambda: shipper_metrics(gateway)["spool_failures"] >= 1)
    wait_until(lambda: gateway.metrics().get("sepa_retention_held_runs", 0) >= 1)  # held from 400 at most
    for first in range(401, 701, 100):
        observe(gateway, first, 100)
    _latest(gateway, 700)
    wait_until(lambda: _stored(gateway) == 150)  # past the hold: the newest 150 are kept
    assert shipper_metrics(gateway)["lost_observations"] == 0  # not known until spooling resumes
    filler.unlink()
    wait_until(lambda: cloud.landed >= 250, timeout=30)
    wait_until(lambda: shipper_metrics(gateway)["lost_observations"] > 0)
    assert cloud.landed == 250  # 1..100, then 551..700
    assert shipper_metrics(gateway)["lost_observations"] == 450  # 101..550


def test_a_gateway_starts_when_its_spool_cannot_be_opened_and_ships_once_it_can(
    in_process_gateway, tmp_path: Path, cloud: Cloud
) -> None:
    """A spool directory that cannot be made (here under a file; a full disk does the same) failed
    the start with a traceback, and under systemd the whole gateway restarted every 2 s into it."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud, spool=blocker / "spool")
    assert gateway.ask("ASK { }")  # the gateway answers
    assert shipper_metrics(gateway)["start_failures"] >= 1
    assert _shipper_health(gateway) == "failing"
    observe(gateway, 1, 50)
    blocker.unlink()
    blocker.mkdir()
    wait_until(lambda: cloud.landed == 50, timeout=30)  # tried again 5 s later: the store had them


def _shipper_component(gateway: InProcessGateway) -> dict[str, object]:
    return gateway.request("GET", "/health").json()["components"]["shipper"]


def test_health_fails_while_the_cloud_refuses_the_token_and_recovers_once_it_takes_it(
    in_process_gateway, tmp_path: Path, cloud: Cloud
) -> None:
    """The gateway's token revoked mid-stream (the endpoint's real check, its accepted tokens changed):
    every upload is a 401 until the operator acts, however small the backlog, so /health must say so."""
    landing = cloud.server.landing
    assert landing is not None
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud)
    observe(gateway, 1, 30)
    wait_until(lambda: cloud.landed == 30)
    assert _shipper_component(gateway)["status"] == "ok"
    accepted = landing._bearer
    landing._bearer = BearerCheck(("another-gateways-token",))  # revoked
    observe(gateway, 31, 30)
    wait_until(lambda: shipper_metrics(gateway).get("upload_failures_http_401", 0) >= 3)
    component = _shipper_component(gateway)
    assert component["status"] == "failing", component
    assert "401" in str(component["detail"]), component
    landing._bearer = accepted  # the operator gave the token back
    wait_until(lambda: cloud.landed == 60)
    assert _shipper_component(gateway)["status"] == "ok"


def test_health_fails_while_the_cloud_refuses_every_batch(in_process_gateway, tmp_path: Path, cloud: Cloud) -> None:
    """Batches refused for good are set aside, so the backlog stays empty: the backlog alone said "ok"
    while every observation went to spool/rejected/ and, past the budget, was deleted."""

    async def refuse(_request: web.Request) -> web.Response:
        return web.json_response({"error": "invalid_request"}, status=400)

    cloud.fault.reply = refuse
    gateway = shipping_gateway(in_process_gateway, tmp_path, cloud)
    observe(gateway, 1, 15)
    observe(gateway, 16, 15)
    wait_until(lambda: shipper_metrics(gateway).get("rejected_segments", 0) >= 2)
    component = _shipper_component(gateway)
    assert component["status"] == "failing", component
    assert "400" in str(component["detail"]), component
    cloud.fault.reply = None
    observe(gateway, 31, 30)
    wait_until(lambda: cloud.landed > 0 and shipper_metrics(gateway)["backlog_observations"] == 0)
    assert _shipper_component(gateway)["status"] == "ok"
