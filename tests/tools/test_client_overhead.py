"""tools/client_overhead.py runs and its modes agree (a trimmed LAMP profile, for speed).

What it protects: the measurement of the in-process transport's cost stays runnable, and every
mode delivers exactly the notifications the profile predicts, so the timings compare equal work.
The figure itself is produced by ``python -m tools.client_overhead`` (full LAMP profile).
"""

from __future__ import annotations

from tools.client_overhead import measure
from tools.lighting.profiles import Experiment, experiment


def test_modes_deliver_the_same_notifications() -> None:
    lamp = experiment("LAMP")
    small = Experiment("LAMP", lamp.updates[:12], lamp.subscriptions[:60] + lamp.subscriptions[-4:])
    assert small.expected_notifications > 0
    report = measure(1, small, modes=("direct", "client", "client_inline"))
    assert report["notifications"] == {
        "direct": [small.expected_notifications],
        "client": [small.expected_notifications],
        "client_inline": [small.expected_notifications],
    }
    assert set(report["added_cost_percent"]) == {"client", "client_inline"}
