"""The soak benchmark runs end to end with real Mosquitto, gateway, subscriber and publishers."""

from __future__ import annotations

import pytest

from tools.mosquitto import missing_tools
from tools.soak.runner import SoakOptions, rss_growth, run


def test_a_short_soak_reports_every_period() -> None:
    problem = missing_tools()
    if problem:
        pytest.fail(problem, pytrace=False)
    report = run(SoakOptions(minutes=2, rate=200.0, updates_per_s=5.0, minute_s=4.0))
    assert [sample["minute"] for sample in report["minutes"]] == [1, 2]
    for sample in report["minutes"]:
        assert sample["readings"] == 800 and sample["notified"] > 0 and sample["nl_p99_ms"] is not None
        assert sample["rss_mb"] > 10 and sample["open_fds"] > 3 and sample["updates"] > 0
    assert report["failed_updates"] == 0


def test_the_trend_sees_a_climb_and_not_a_sawtooth() -> None:
    sawtooth = [250.0 + 10 * (minute % 5) for minute in range(25)]  # flat, but ends high
    assert rss_growth(sawtooth)["rss_growth_after_minute_5_percent"] == 16.0
    assert abs(rss_growth(sawtooth)["rss_trend_after_minute_5_percent"]) < 5
    climbing = [250.0 + 2 * minute for minute in range(25)]
    assert (
        rss_growth(climbing)["rss_trend_after_minute_5_percent"]
        == rss_growth(climbing)["rss_growth_after_minute_5_percent"]
    )
