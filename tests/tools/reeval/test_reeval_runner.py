"""The re-evaluated subscriptions benchmark runs end to end against a real gateway."""

from __future__ import annotations

from tools.reeval.runner import ReevalOptions, run


def test_a_small_run_subscribes_updates_and_ends_them_all() -> None:
    report = run(ReevalOptions(subscriptions=20, rows=10))
    assert report["subscribe_s"] > 0 and report["matching_update_ms"] > 0
    assert report["rss_subscribed_mb"] > 10 and report["rss_ended_mb"] > 10
