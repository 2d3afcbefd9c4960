"""`sepa-gateway bench wire` end to end, on a small knowledge base and a short update stream.

Why end to end: the benchmark's value is that it drives real processes over real sockets, so the
test runs the real command (a gateway process, the subscriber and publisher processes, Oxigraph
when its server is installed) and checks what a reader of its JSON relies on: the headline keys,
positive latencies, every predicted notification received and matched, and no process left over,
also when the run is interrupted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tools.lighting.profiles import s_profile
from tools.wire import oxigraph, report, workload

LAUNCHER = "import sys; from gateway.appliance.cli import main; sys.exit(main(sys.argv[1:]))"
SMALL = ["--lamps-per-road", "5", "--timeout", "120"]


def _bench(*args: str) -> list[str]:
    return [sys.executable, "-c", LAUNCHER, "bench", "wire", *args]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie is gone for our purpose (only its parent can reap it)
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


def _pids(stderr: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"^(?:secure gateway|gateway|oxigraph): pid (\d+)", stderr, re.MULTILINE)]


def test_stream_alternates_values_and_predicts_the_papers_notifications() -> None:
    stream = workload.update_stream(620)
    assert [u.value for u in (stream[0], stream[309], stream[310], stream[619])] == ["100", "100", "50", "50"]
    assert '"50"' in stream[310].sparql and '"100"' not in stream[310].sparql
    expected = workload.expected_notifications(stream, s_profile())
    assert len(expected) == 2 * 23  # Table VIII: 23 notifications per round of U_LAMP on profile S
    assert expected[("S_LAMP(1,1)", 2)] == 310 and expected[("S_ROAD(6)", 1)] == 5


def test_matching_times_right_notifications_and_rejects_wrong_ones() -> None:
    stream = workload.update_stream(320)
    expected = workload.expected_notifications(stream, s_profile())
    sent = [1_000_000 * k for k in range(320)]
    lamp = stream[0].lamp_iri
    records = [
        ["S_LAMP(1,1)", 1, sent[0] + 2_000_000, [[None, "100"]]],
        ["S_LAMP(1,1)", 2, sent[310] + 3_000_000, [[None, "100"]]],  # round 1 sets "50": wrong
        ["S_LAMP(1,1)", 9, sent[0], [[None, "100"]]],  # no such notification
        ["S_LAMP(2,1)", 1, sent[1] + 1_000_000, [[lamp, "100"]]],  # wrong lamp
    ]
    matching = report.match(expected, stream, records, sent)
    assert matching.latencies_ms == [2.0]
    assert (matching.wrong_value, matching.unexpected) == (2, 1)
    assert matching.missing == len(expected) - 3
    assert report.percentile([5.0, 1.0, 3.0], 50) == 3.0 and report.percentile([], 99) is None


def test_wire_benchmark_end_to_end() -> None:
    with_oxigraph = oxigraph.find_binary() is not None
    args = _bench("--json", "--updates", "400", "--concurrency", "4", *SMALL)
    if not with_oxigraph:
        args.append("--no-oxigraph")
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - started < 60
    result = json.loads(done.stdout)
    assert list(result)[:5] == list(report.HEADLINE)
    assert result["ups"] > 0 and result["updates"] == 400 and result["failed_updates"] == 0
    assert result["subscriptions"] == 1004 and result["triples"] == result.get("oxigraph_triples", result["triples"])
    assert result["expected_notifications"] == 23 + 6  # round 0, then roads 1..90 of round 1
    assert result["matched_notifications"] == result["expected_notifications"] == result["notifications"]
    assert 0 < result["nl_min_ms"] <= result["nl_p50_ms"] <= result["nl_p99_ms"] <= result["nl_max_ms"]
    assert "loaded in" in done.stderr
    if with_oxigraph:
        assert result["oxigraph_ups"] > 0
        assert result["ratio"] == pytest.approx(result["ups"] / result["oxigraph_ups"], rel=0.01)
    else:
        assert result["oxigraph_ups"] is None and result["ratio"] is None
    pids = _pids(done.stderr)
    assert pids and all(_gone(pid) for pid in pids)


def test_parallel_mode_gets_every_notification_right() -> None:
    """The wire benchmark's check in parallel mode: the same stream, the same 0 wrong and 0 missing."""
    args = _bench("--json", "--updates", "400", "--concurrency", "8", "--mode", "parallel", "--workers", "1")
    done = subprocess.run([*args, "--no-oxigraph", *SMALL], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["failed_updates"] == 0 and result["updates"] == 400
    assert result["matched_notifications"] == result["expected_notifications"] == result["notifications"] == 23 + 6
    assert result["wrong_notifications"] == result["missing_notifications"] == result["unexpected_notifications"] == 0
    pids = _pids(done.stderr)
    assert pids and all(_gone(pid) for pid in pids)


def test_secure_variant_runs_beside_the_plain_one() -> None:
    """`--secure`: the same stream and subscriptions over HTTPS + WSS with a bearer token (a missing or
    refused token would fail every update: 401), reported beside the plain run."""
    args = _bench("--json", "--updates", "200", "--concurrency", "4", "--secure", "--no-oxigraph", *SMALL)
    done = subprocess.run(args, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["secure_ups"] > 0 and result["secure_failed_updates"] == 0
    assert result["secure_missing_notifications"] == result["secure_wrong_notifications"] == 0
    assert result["secure_notifications"] == result["notifications"]
    assert result["secure_ratio"] == pytest.approx(result["secure_ups"] / result["ups"], rel=0.01)
    assert "/secure/update" in done.stderr and "wss://" in done.stderr
    pids = _pids(done.stderr)
    assert pids and all(_gone(pid) for pid in pids)


def test_interrupted_run_stops_its_processes() -> None:
    bench = subprocess.Popen(
        _bench("--json", "--updates", "100000", "--concurrency", "2", "--no-oxigraph", *SMALL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    out = rest = ""
    try:
        assert bench.stderr is not None
        for line in bench.stderr:
            lines.append(line)
            if "gateway: sending" in line:
                break
        time.sleep(0.5)
        bench.send_signal(signal.SIGINT)
        out, rest = bench.communicate(timeout=30)
    finally:
        if bench.poll() is None:
            bench.kill()
    stderr = "".join(lines) + rest
    assert bench.returncode == 130, stderr[-3000:]
    pids = _pids(stderr)
    assert pids and all(_gone(pid) for pid in pids)
    assert out == ""  # nothing half-done on stdout
