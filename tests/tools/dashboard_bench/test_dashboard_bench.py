"""The dashboard benchmark runs end to end (small): a gateway as installed, phases without and with
the page in Chromium, frame times and NL from every phase, and the command's JSON."""

from __future__ import annotations

import subprocess

import pytest

from tools.browser import chromium
from tools.dashboard_bench.runner import WARM_UP_PHASES_MAX, DashboardBenchOptions, page_until, run
from tools.launcher import gateway_argv
from tools.wire.processes import BenchError


def test_a_small_run_measures_frames_with_the_page_and_nl_in_both_phases() -> None:
    report = run(DashboardBenchOptions(sensors=10, hz=10, seconds=2, rounds=1))
    (round_,) = report["per_round"]
    assert round_["tiles"] == 10  # the page showed every sensor
    assert round_["frames"] > 30 and report["frame_ms"]["p95"] > 0  # two seconds of frames were recorded
    assert round_["matched_without"] > 100 and round_["matched_with"] > 100  # NL from both phases
    assert report["nl_p99_without_page_ms"] > 0 and report["nl_p99_ratio"] > 0
    assert report["readings_per_s"] == 100
    # the page's load: its weight (cold cache) and first paint, beside its frames
    assert 10_000 < report["page_weight_bytes"] == round_["page_weight_bytes"] < 300 * 1024
    assert round_["first_paint_ms"] > 0
    assert report["first_paint_ms"]["max"] == pytest.approx(round_["first_paint_ms"], abs=0.01)
    # warmed up until the store compacted once; the compactions of each side's phases are counted
    assert 1 <= report["warm_up_phases"] < WARM_UP_PHASES_MAX
    assert report["compactions_without_page"] == round_["compactions_without"] >= 0
    assert report["compactions_with_page"] == round_["compactions_with"] >= 0


def test_the_command_is_registered() -> None:
    done = subprocess.run([*gateway_argv(), "bench", "dashboard", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--sensors" in done.stdout and "--rounds" in done.stdout


def test_a_page_that_does_not_get_there_says_why() -> None:
    """The run's error carries the page's status and panels' errors (it said only which wait failed)."""
    page = '<p id="status">live</p><p class="error"></p><p class="error">The sensors are no longer updated: x</p>'
    with chromium() as driver:
        driver.get("data:text/html," + page)
        with pytest.raises(BenchError, match="status: live; The sensors are no longer updated: x"):
            page_until(driver, "return false", timeout=0.2)
