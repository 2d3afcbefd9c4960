"""The growth benchmark runs end to end against real gateways, in memory and on disk."""

from __future__ import annotations

from tools.growth.runner import GrowthOptions, run


def test_a_short_growth_run_reports_every_window_of_both_stores() -> None:
    report = run(GrowthOptions(replacements=300, window=100, lookups=5))
    for store in ("memory", "disk"):
        windows = report[store]["windows"]
        assert [window["replacements"] for window in windows] == [100, 200, 300]
        assert all(window["lookup_ms"] > 0 and window["update_ms"] > 0 for window in windows)
        assert report[store]["lookup_worst_ratio"] >= 1.0
