"""`sepa-gateway bench coap` end to end, small: every reading stored once through a lossy link, and
the MQTT bench's figures of the same run beside the CoAP ones.

What a reader of its JSON relies on: `stored`, `duplicates` and `lost` come from the store, not from
the clients' counts (a gateway that answered 2.04 without storing, or stored a retransmission
twice, fails here), the loss really happened, and the latency figures are measured on notifications
that arrived. Without the CoAP adapter no request is answered and nothing is stored: the run fails.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tools.coap_bench import runner
from tools.wire.processes import BenchError

LAUNCHER = "import sys; from gateway.appliance.cli import main; sys.exit(main(sys.argv[1:]))"
READINGS = 600


def test_a_small_lossy_run_stores_every_reading_once_and_reports_mqtt_beside_it() -> None:
    argv = [sys.executable, "-c", LAUNCHER, "bench", "coap", "--json", "--quiet", "--readings", str(READINGS)]
    argv += ["--clients", "2", "--in-flight", "16", "--latency-seconds", "1", "--rate", "200", "--loss", "0.1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr + done.stdout
    report = json.loads(done.stdout)
    assert report["readings"] == report["acknowledged"] == READINGS and report["failed"] == 0
    assert report["stored"] == READINGS and report["gateway_readings"] >= READINGS  # counted in the store
    assert report["duplicates"] == 0 and report["lost"] == 0 and report["unexpected"] == 0
    assert report["relay"]["dropped_up"] > 10 and report["relay"]["dropped_down"] > 10  # the loss happened
    assert report["readings_per_s"] > 0 and report["batches"] > 0
    assert report["latency_readings"] == 200 and report["latency_matched"] > 0
    assert 0 < report["nl_p50_ms"] <= report["nl_p99_ms"] <= report["nl_max_ms"]
    assert report["client_cpu_s"] > 0 and report["gateway_cpu_s"] > 0
    mqtt = report["mqtt"]
    assert mqtt["readings"] == READINGS and mqtt["lost"] == 0 and mqtt["publishers"] == 2
    ratio = report["readings_per_s"] / mqtt["readings_per_s"]
    assert report["readings_per_s_vs_mqtt"] == pytest.approx(ratio, rel=0.01, abs=0.0005)  # rounded to 3 places


def test_without_mosquitto_the_comparison_fails_at_once_saying_what_is_missing(monkeypatch) -> None:
    monkeypatch.setattr(runner.shutil, "which", lambda _name: None)
    with pytest.raises(BenchError, match="mosquitto binary.*--no-mqtt"):
        runner.run(runner.CoapBenchOptions(readings=READINGS))
