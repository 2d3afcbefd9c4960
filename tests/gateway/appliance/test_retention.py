"""Retention across a step of the wall clock (gateway/appliance/retention.py), in a real gateway.

Protects: a Raspberry Pi boots at fake-hwclock's last save and NTP then steps its clock forward;
the observations and latest nodes stored before the step carry the old clock's times and must not
be taken for old by the next run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import stop_and_check
from tests.support.clock import SteppedClock
from tools.coap import libcoap
from tools.launcher import RunningGateway, launch_gateway

OBSERVATIONS = "http://w3id.org/sepa-gateway/graph/observations"
LATEST = "http://w3id.org/sepa-gateway/graph/latest"
RESULT_TIME = "<http://www.w3.org/ns/sosa/resultTime>"


def _count(gateway: RunningGateway, graph: str) -> int:
    (row,) = gateway.select(f"SELECT (COUNT(*) AS ?n) WHERE {{ GRAPH <{graph}> {{ ?s ?p ?o }} }}")
    return int(row["n"])


def test_readings_stored_before_ntp_steps_the_clock_forward_are_not_pruned_as_old(
    tmp_path: Path, stepped_clock: SteppedClock
) -> None:
    """Stepped +30 days (retain_age_s is 7 days), the next run deleted the 5 observations and the
    5 latest nodes stored in the 5 s before the step (libfaketime, pruning every 2 s)."""
    if libcoap.coap_client() is None:
        pytest.fail(libcoap.MISSING, pytrace=False)
    config = tmp_path / "gateway.toml"
    config.write_text("[mqtt]\nenabled = false\n[observations]\nprune_interval_s = 2.0\n")
    stepped_clock.step("-30d")  # fake-hwclock's time
    gateway = launch_gateway(config=config, coap=True, environment=stepped_clock.environment)
    try:
        for n in range(5):
            done = libcoap.run(["-m", "post", "-e", f"2{n}.5", f"{gateway.coap_url}/s/boiler{n}/temperature"])
            assert libcoap.succeeded(done), done
        stored = _count(gateway, OBSERVATIONS), _count(gateway, LATEST)
        runs = gateway.metric("sepa_retention_runs")
        stepped_clock.step("+0")  # NTP reached
        gateway.wait_for_metric("sepa_retention_runs", lambda value: value >= runs + 3, timeout=20.0)
        assert (_count(gateway, OBSERVATIONS), _count(gateway, LATEST)) == stored
        assert stored[0] > 0 and stored[1] > 0
    finally:
        stop_and_check(gateway)
