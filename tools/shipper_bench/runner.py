"""Issue 7's shipper figures: what it adds to the MQTT benchmark's CPU per reading, and how fast it
drains a backlog.

1. Overhead: Mosquitto, a gateway, 2 publisher processes sending N readings (the MQTT benchmark's
   throughput phase). The gateway's CPU time (utime + stime of its process) from the first publish
   until every reading is stored — and, with the shipper, until every observation is confirmed by the
   landing endpoint (a `sepa-cloud landing` process, plain HTTP on 127.0.0.1) — divided by N. Runs
   alternate without and with the shipper (this machine is shared and noisy); the report gives each
   run and the median ratio.
2. Drain: the landing endpoint is down while B observations go into the store (observation updates
   over HTTP, 5,000 per request); the shipper spools them. Then the endpoint starts: drain rate =
   B / (time from the endpoint answering until the gateway's backlog is 0).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.observations.latest import LatestCache
from gateway.observations.reading import Reading
from gateway.observations.updates import observation_update
from tools.mqtt_bench.runner import MOSQUITTO_CONFIG, read_metrics, wait_until
from tools.wire.processes import Children, free_port, python_module, start_gateway, wait_http

Log = Callable[[str], None]
TOKEN = "bench-token-not-a-secret"
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ShipperBenchOptions:
    readings: int = 20_000
    publishers: int = 2
    rounds: int = 2
    backlog: int = 100_000
    timeout_s: float = 600.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def shipper_toml(landing_port: int, spool: Path) -> str:
    """The shipper's section. Segments seal by age after 1 s (10 s by default): the run ends when the
    last reading is confirmed, and a tail waiting 10 s for its segment would charge the shipper the
    CPU this harness spends polling /metrics meanwhile (~0.8 ms a poll, 50 polls a second: up to
    ~16 us per reading of 20,000), not work the shipper does."""
    return (
        f'[shipper]\nenabled = true\nurl = "http://127.0.0.1:{landing_port}"\nallow_http = true\n'
        f'spool_dir = "{spool}"\nbackoff_initial_s = 0.05\nbackoff_max_s = 0.2\nsegment_max_age_s = 1.0\n'
    )


def start_landing(children: Children, workdir: Path, port: int) -> Any:
    os.environ["SEPA_CLOUD_TOKENS"] = TOKEN
    landing = children.start(
        "landing",
        python_module("cloud.cli", "landing", "--landing-dir", str(workdir / "landing"), "--host", "127.0.0.1",
                      "--port", str(port)),
        log_path=workdir / "landing.log",
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/v1/health", landing, 30)
    return landing


def _overhead_run(options: ShipperBenchOptions, shipper: bool, say: Log) -> float:
    with tempfile.TemporaryDirectory(prefix="sepa-bench-shipper-") as directory, Children() as children:
        workdir = Path(directory)
        port = free_port()
        (workdir / "mosquitto.conf").write_text(MOSQUITTO_CONFIG.format(port=port))
        children.start("mosquitto", ["mosquitto", "-c", str(workdir / "mosquitto.conf")])
        toml = f'[mqtt]\nport = {port}\nclient_id = "bench-gateway"\nprofiles = ["generic"]\n'
        if shipper:
            landing_port = free_port()
            start_landing(children, workdir, landing_port)
            (workdir / "token").write_text(TOKEN)
            toml += shipper_toml(landing_port, workdir / "spool") + f'token_file = "{workdir / "token"}"\n'
        gateway = start_gateway(children, workdir, allow_load=False, max_request_bytes=1 << 20, mqtt=toml)
        url = f"http://127.0.0.1:{gateway.http_port}/metrics"
        wait_until(lambda: read_metrics(url).get("sepa_mqtt_connection_subscribed") == 1.0, 30, "the MQTT connection")
        per = options.readings // options.publishers
        total = per * options.publishers
        before = cpu_seconds(gateway.child.pid)
        publishers = [
            children.start(
                f"publisher-{i}",
                python_module("tools.mqtt_bench.publisher", "--port", str(port), "--first", str(i * per),
                              "--count", str(per), "--sensors", "100"),
                pipes=True,
            )
            for i in range(options.publishers)
        ]  # fmt: skip
        for publisher in publishers:
            publisher.receive(options.timeout_s)

        def done() -> bool:
            metrics = read_metrics(url)
            stored = metrics.get("sepa_mqtt_readings", 0) >= total
            return stored and (not shipper or metrics.get("sepa_shipper_uploaded_observations", 0) >= total)

        wait_until(done, options.timeout_s, "the readings (and their upload)")
        used = cpu_seconds(gateway.child.pid) - before
        say(f"{'with' if shipper else 'without'} shipper: {used / total * 1e6:.1f} µs CPU per reading")
        return used / total


def _drain(options: ShipperBenchOptions, say: Log) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sepa-bench-drain-") as directory, Children() as children:
        workdir = Path(directory)
        landing_port = free_port()
        (workdir / "token").write_text(TOKEN)
        toml = "[mqtt]\nenabled = false\n" + shipper_toml(landing_port, workdir / "spool")
        toml += f'token_file = "{workdir / "token"}"\n'
        gateway = start_gateway(children, workdir, allow_load=False, max_request_bytes=64 << 20, mqtt=toml)
        metrics_url = f"http://127.0.0.1:{gateway.http_port}/metrics"
        update_url = f"http://127.0.0.1:{gateway.http_port}/update"
        cache = LatestCache()
        for first in range(0, options.backlog, 5000):
            readings = [
                Reading(f"urn:bench:sensor:{k % 100}", "http://w3id.org/sepa-gateway/ns#temperature",
                        f"urn:bench:room:{k % 100}", float(k), "http://qudt.org/vocab/unit/DEG_C",
                        f"gateway/bench{k % 100}/temperature", None, str(k))
                for k in range(first, min(first + 5000, options.backlog))
            ]  # fmt: skip
            request = urllib.request.Request(
                update_url, observation_update(readings, "bench", cache).encode(),
                {"Content-Type": "application/sparql-update"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=300) as response:
                response.read()
        wait_until(
            lambda: read_metrics(metrics_url).get("sepa_shipper_backlog_observations", 0) >= options.backlog,
            options.timeout_s,
            "the backlog to be spooled",
        )
        say(f"backlog: {options.backlog:,} observations spooled while the landing endpoint is down")
        start_landing(children, workdir, landing_port)
        started = time.monotonic()
        wait_until(
            lambda: read_metrics(metrics_url).get("sepa_shipper_backlog_observations", 1) == 0,
            options.timeout_s,
            "the backlog to drain",
        )
        elapsed = time.monotonic() - started
        metrics = read_metrics(metrics_url)
        say(f"drained in {elapsed:.2f} s")
        return {
            "drain_observations_per_s": round(options.backlog / elapsed, 1),
            "drain_seconds": round(elapsed, 3),
            "backlog": options.backlog,
            "uploaded_segments": metrics.get("sepa_shipper_uploaded_segments"),
        }


def run(options: ShipperBenchOptions, log: Log | None = None) -> dict[str, Any]:
    say = log or (lambda _message: None)
    without: list[float] = []
    with_shipper: list[float] = []
    for _ in range(options.rounds):
        without.append(_overhead_run(options, False, say))
        with_shipper.append(_overhead_run(options, True, say))
    ratios = [w / b for w, b in zip(with_shipper, without, strict=True)]
    report: dict[str, Any] = {
        "cpu_us_per_reading_without": [round(value * 1e6, 1) for value in without],
        "cpu_us_per_reading_with": [round(value * 1e6, 1) for value in with_shipper],
        "overhead_ratio": round(statistics.median(ratios), 4),
        "overhead_percent": round((statistics.median(ratios) - 1) * 100, 2),
        "readings": options.readings,
    }
    report.update(_drain(options, say))
    return report
