"""The re-evaluated subscriptions benchmark runs end to end against a real gateway."""

from __future__ import annotations

from tools.reeval.runner import ReevalOptions, run


def test_a_small_run_subscribes_updates_and_ends_them_all() -> None:
    report = run(ReevalOptions(subscriptions=20, rows=10, storms=3))
    assert report["subscribe_s"] > 0 and report["matching_update_ms"] > 0
    assert len(report["matching_updates_ms"]) == 3
    # the bystander measured in both phases, each of its updates notified to it
    for phase in ("quiet", "storm"):
        figures = report["bystander"][phase]
        assert figures["rounds"] >= 1 and figures["notification_p99_ms"] >= figures["update_p50_ms"] > 0
    assert report["rss_subscribed_mb"] > 10 and report["rss_ended_mb"] > 10
