"""The soak benchmark runs end to end with real Mosquitto, gateway, subscriber and publishers."""

from __future__ import annotations

import pytest

from tools.mosquitto import missing_tools
from tools.soak.runner import SoakOptions, run


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
