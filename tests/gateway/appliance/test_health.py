"""The appliance's components on ``/health`` (gateway/appliance/health.py), in real gateways.

Protects: a wall clock before the data directory's last write (a board without a real-time clock,
booted at an old time) makes the gateway not ready, naming the clock, while it stays alive; the
CoAP adapter is a required component, ready while listening; the cloud shipper is listed but not
required, and fails its check once its backlog passes half of its spool budget (the cloud
unreachable, real CoAP readings spooled) while the gateway stays ready; a wall clock the kernel
says is not synchronised (fake-hwclock's time, NTP not reached yet) is shown, not required.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.appliance.health import ClockFloor, clock_sync_health, newest_write, shipper_health
from gateway.kernel_clock import kernel_synchronised
from tools.coap import libcoap
from tools.launcher import RunningGateway, free_port, launch_gateway


def health(gateway: RunningGateway) -> tuple[int, dict[str, Any]]:
    reply = gateway.request("GET", "/health")
    return reply.status, reply.json()


def test_a_clock_before_the_last_write_is_not_ready(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    written = time.time() + 10 * 365 * 86400  # what a board that kept a later time wrote last
    (data / "last-run").write_bytes(b"")
    os.utime(data / "last-run", (written, written))
    gateway = launch_gateway(data_dir=data)
    try:
        status, body = health(gateway)
        if kernel_synchronised():  # this machine's kernel: NTP set the clock, the write was ahead
            assert status == 200 and "written while the clock was ahead" in body["components"]["clock"]["detail"]
            return
        assert status == 503 and body["status"] == "not ready"
        clock = body["components"]["clock"]
        assert clock["status"] == "failing" and clock["required"] is True
        assert f"the last write into {data}" in clock["detail"] and "is not set" in clock["detail"]
        assert body["components"]["store"]["status"] == "ok"
        assert gateway.request("GET", "/health/live").status == 200
    finally:
        assert gateway.stop() == 0
    gateway = launch_gateway(data_dir=tmp_path / "fresh")  # the same gateway with a sane data directory
    try:
        status, body = health(gateway)
        assert status == 200 and body["components"]["clock"]["status"] == "ok"
    finally:
        assert gateway.stop() == 0


def test_a_clock_the_kernel_says_is_not_synchronised_is_shown_but_not_required(tmp_path: Path) -> None:
    """fake-hwclock restores the time of the last shutdown, after the data directory's last write:
    `clock` was ok while the wall clock was as far behind as the board was off, and /health said
    nothing of the kernel's own account (adjtimex: TIME_ERROR, timedatectl's NTPSynchronized=no).
    The kernel's state cannot be set by a test: the real gateway shows this machine's, and the
    check is given each state."""
    gateway = launch_gateway(data_dir=tmp_path / "data")
    try:
        status, body = health(gateway)
        assert status == 200, body  # never synchronised (no NTP server in reach) must not mean never ready
        sync = body["components"]["clock_sync"]
        assert sync["required"] is False
        assert sync["status"] == ("failing" if kernel_synchronised() is False else "ok"), sync
    finally:
        assert gateway.stop() == 0
    unsynchronised = clock_sync_health(lambda: False)
    assert not unsynchronised.ok and not unsynchronised.required and "not synchronised" in unsynchronised.detail
    assert clock_sync_health(lambda: True).ok and clock_sync_health(lambda: None).ok


def test_a_last_write_ahead_of_a_synchronised_clock_is_ready(tmp_path: Path) -> None:
    """A clock that ran ahead (set by hand, a bad RTC) and was corrected by NTP left files stamped
    in the future: the gateway was not ready (503) until the clock reached them, ten years here.
    The kernel's account cannot be set by a test: the floor is given each."""
    written = time.time() + 10 * 365 * 86400
    (tmp_path / "last-run").touch()
    os.utime(tmp_path / "last-run", (written, written))
    assert not ClockFloor(str(tmp_path), synchronised=lambda: False).check().ok
    assert not ClockFloor(str(tmp_path), synchronised=lambda: None).check().ok
    synchronised = ClockFloor(str(tmp_path), synchronised=lambda: True).check()
    assert synchronised.ok and "written while the clock was ahead" in synchronised.detail


def test_clock_floor_is_the_newer_of_installation_and_last_write(tmp_path: Path) -> None:
    installed = ClockFloor("")
    assert installed.source == "the installation of this code" and installed.floor <= time.time()
    assert installed.check().ok
    (tmp_path / "a" / "b").mkdir(parents=True)
    for path, when in (("a/b/deep", 5e9), ("a/b", 1e9), ("a/file", 4e9), ("a", 1e9)):
        (tmp_path / path).touch()
        os.utime(tmp_path / path, (when, when))
    assert newest_write(tmp_path) == 4e9  # a/file, two levels down (a store's files); a/b/deep is deeper
    assert newest_write(tmp_path, depth=1) == 1e9
    floor = ClockFloor(str(tmp_path), synchronised=lambda: False)  # what the kernel says of it: below
    assert floor.floor == 4e9 and not floor.check().ok


def test_shipper_backlog_past_half_its_budget_is_failing_but_not_required() -> None:
    budget = 8 << 20
    ok = shipper_health({"backlog_bytes": 1 << 20, "backlog_observations": 10}, budget)
    assert ok.ok and not ok.required and "nothing uploaded since start" in ok.detail
    # the wall clock stepped back an hour since that upload: the time since is the monotonic clock's
    numbers = {"backlog_bytes": 5 << 20, "last_success_timestamp": time.time() + 3540, "seconds_since_success": 60.2}
    behind = shipper_health(numbers, budget)
    assert (
        not behind.ok and "5 MiB of the 8 MiB spool budget" in behind.detail and "last upload 60 s ago" in behind.detail
    )


def test_coap_is_required_and_the_shipper_is_not(tmp_path: Path) -> None:
    if libcoap.coap_client() is None:
        pytest.fail(libcoap.MISSING, pytrace=False)
    token = tmp_path / "token"
    token.write_text("health-token\n")
    config = tmp_path / "gateway.toml"
    config.write_text(
        "[shipper]\nenabled = true\n"
        f'url = "https://127.0.0.1:{free_port()}"\ntoken_file = "{token}"\n'  # nobody listens: the backlog grows
        "segment_max_bytes = 1024\nspool_budget_bytes = 8192\n"
    )
    gateway = launch_gateway(config=config, data_dir=tmp_path / "data", mqtt=False, coap=True)
    try:
        status, body = health(gateway)
        assert status == 200, body
        assert set(body["components"]) == {"store", "engine", "clock", "clock_sync", "coap", "shipper"}
        coap = body["components"]["coap"]
        assert coap["status"] == "ok" and coap["required"] is True and "listening=True" in coap["detail"]
        shipper = body["components"]["shipper"]
        assert shipper["status"] == "ok" and shipper["required"] is False
        for n in range(40):
            done = libcoap.run(["-m", "post", "-e", f"{20 + n / 10}", f"{gateway.coap_url}/s/boiler/temperature"])
            assert libcoap.succeeded(done), done
            status, body = health(gateway)
            if body["components"]["shipper"]["status"] == "failing":
                break
        assert status == 200 and body["status"] == "ready"  # the cloud being away does not stop the gateway
        shipper = body["components"]["shipper"]
        assert shipper["status"] == "failing" and "of the 8 KiB spool budget" in shipper["detail"], shipper
    finally:
        assert gateway.stop() == 0
