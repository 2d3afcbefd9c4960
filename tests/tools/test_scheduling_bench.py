"""`sepa-gateway bench scheduling` end to end, small: every delayed update fires once, none early.

What a reader of its JSON relies on: the lateness percentiles are measured on updates that really
ran through the engine while the LAMP stream loaded the update path (lamp_updates > 0), and the
exit code is 0 only when all fired and none ran before its due time.
"""

from __future__ import annotations

import json
import subprocess
import sys

LAUNCHER = "import sys; from gateway.appliance.cli import main; sys.exit(main(sys.argv[1:]))"


def test_the_scheduling_benchmark_reports_lateness_of_every_delayed_update() -> None:
    argv = [sys.executable, "-c", LAUNCHER, "bench", "scheduling", "--json", "--quiet"]
    argv += ["--delayed", "400", "--window", "1.5", "--lead", "4", "--lamps-per-road", "5", "--concurrency", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["delayed"] == report["fired"] == 400
    assert report["early"] == 0 and report["failed"] == 0 and report["still_pending"] == 0
    assert 0 <= report["lateness_p50_ms"] <= report["lateness_p99_ms"] <= report["lateness_max_ms"]
    assert report["lamp_updates"] > 0 and report["subscriptions"] == 1004 and report["store"] == "disk"
