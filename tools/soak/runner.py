"""The soak benchmark: MQTT readings, HTTP updates and 100 subscriptions at a steady rate for N
minutes; every minute the gateway's RSS (median and maximum of one reading a second) and its query
workers', open descriptors, notification latency percentiles and update reply percentiles (issue
16: a leak or a creeping cost shows as a slope here).

Mosquitto, the gateway, the subscriber (100 subscriptions on the latest-value view, the MQTT
benchmark's) and one paced publisher per minute run as processes; the HTTP updates come from a
thread of this process.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.mqtt_bench.runner import read_metrics, start_mqtt_setup, wait_until
from tools.wire.processes import Children, python_module, rss_mb

Log = Callable[[str], None]
RETAIN = 100


@dataclass(frozen=True)
class SoakOptions:
    minutes: int = 30
    rate: float = 1000.0  # MQTT readings per second
    updates_per_s: float = 10.0  # HTTP updates per second
    sensors: int = 100
    on_disk: bool = False
    minute_s: float = 60.0  # the sampling period ("a minute"; shorter in the tests)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Updater(threading.Thread):
    """HTTP updates at a steady rate; their reply times, taken and cleared each minute."""

    def __init__(self, update_url: str, per_s: float) -> None:
        super().__init__(name="soak-updater", daemon=True)
        self.update_url, self.period = update_url, 1.0 / per_s
        self.replies_ms: list[float] = []
        self.failed = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stopping.wait(self.period):
            n += 1
            body = (
                f"DELETE {{ <urn:soak> <urn:n> ?n }} INSERT {{ <urn:soak> <urn:n> {n} }} "
                "WHERE { OPTIONAL { <urn:soak> <urn:n> ?n } }"
            )
            request = urllib.request.Request(
                self.update_url, body.encode(), {"Content-Type": "application/sparql-update"}
            )
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    reply.read()
                self.replies_ms.append((time.perf_counter() - started) * 1000)
            except OSError:
                self.failed += 1

    def take(self) -> list[float]:
        taken, self.replies_ms = self.replies_ms, []
        return taken


class RssSampler(threading.Thread):
    """The gateway's RSS and its query workers' (its child processes) every second; taken and
    cleared each minute. Why not one reading a minute: the store's compaction swings the RSS by
    up to the store's size within seconds, and one reading lands anywhere in a swing."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="soak-rss", daemon=True)
        self.pid = pid
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._gateway: list[float] = []
        self._workers: list[float] = []

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            try:
                # a child is listed under the thread that started it (the workers' spawner thread)
                tasks = Path(f"/proc/{self.pid}/task").iterdir()
                children = [child for task in tasks for child in (task / "children").read_text().split()]
                workers = sum(rss_mb(int(child)) for child in children)
                gateway = rss_mb(self.pid)
            except (OSError, ValueError, IndexError):
                continue  # a worker replaced in between
            with self._lock:
                self._gateway.append(gateway)
                self._workers.append(workers)

    def take(self) -> dict[str, float | None]:
        with self._lock:
            gateway, workers, self._gateway, self._workers = self._gateway, self._workers, [], []
        return {
            "rss_mb": statistics.median(gateway) if gateway else rss_mb(self.pid),
            "rss_max_mb": max(gateway, default=None),
            "workers_rss_mb": statistics.median(workers) if workers else None,
        }


def rss_growth(settled: list[float]) -> dict[str, float]:
    """The RSS growth after minute 5 (per-minute medians), two ways: the last minute against the
    first, and the least-squares line through all of them (its end against its start).

    Why both: in memory, compaction swings the RSS by a fifth over a few minutes (a sawtooth: the
    dead versions pile up to as many as the live quads, then a copy replaces the store), so two
    single minutes say where in the sawtooth they fell; the fitted line says whether it climbs."""
    endpoints = round((settled[-1] - settled[0]) / settled[0] * 100, 1)
    if len(settled) < 2:
        return {"rss_growth_after_minute_5_percent": endpoints, "rss_trend_after_minute_5_percent": 0.0}
    slope, intercept = statistics.linear_regression(range(len(settled)), settled)
    end = intercept + slope * (len(settled) - 1)
    return {
        "rss_growth_after_minute_5_percent": endpoints,
        "rss_trend_after_minute_5_percent": round((end - intercept) / intercept * 100, 1),
    }


def run(options: SoakOptions, log: Log | None = None) -> dict[str, Any]:
    say = log or (lambda _message: None)
    with tempfile.TemporaryDirectory(prefix="sepa-bench-soak-") as directory, Children() as children:
        workdir = Path(directory)
        # the edge keeps the last RETAIN observations per sensor, as an installed gateway does: the
        # store stays bounded, so memory that grows is a leak
        setup = start_mqtt_setup(children, workdir, "soak-gateway", RETAIN, 2.0, options.sensors, options.on_disk)
        port, gateway, subscriber = setup.port, setup.gateway, setup.subscriber
        pid, metrics_url = gateway.child.pid, setup.metrics_url
        updater = Updater(f"http://127.0.0.1:{gateway.http_port}/update", options.updates_per_s)
        updater.start()
        sampler = RssSampler(pid)
        sampler.start()
        per_minute = int(options.rate * options.minute_s)
        minutes: list[dict[str, Any]] = []
        for minute in range(options.minutes):
            first = minute * per_minute
            publisher = children.start(
                f"publisher-{minute}",
                python_module(
                    "tools.mqtt_bench.publisher", "--port", str(port), "--first", str(first),
                    "--count", str(per_minute), "--sensors", str(options.sensors), "--rate", str(options.rate),
                ),
                pipes=True,
            )  # fmt: skip
            sent = publisher.receive(120)["sent_ns"]
            children.stop(publisher)
            wait_until(
                lambda: read_metrics(metrics_url).get("sepa_mqtt_readings", 0) >= first + per_minute,  # noqa: B023
                120,
                "the minute's readings",
            )
            subscriber.send({"report": True})
            received = subscriber.receive(60)["received"]
            by_value = {value: ns for _sensor, value, ns in received}
            latencies = [(by_value[first + n] - ns) / 1e6 for n, ns in enumerate(sent) if first + n in by_value]
            replies = updater.take()
            sample = {
                "minute": minute + 1,
                **sampler.take(),
                "open_fds": _fds(pid),
                "readings": per_minute,
                "notified": len(latencies),
                "nl_p50_ms": _percentile(latencies, 0.5),
                "nl_p99_ms": _percentile(latencies, 0.99),
                "update_p50_ms": _percentile(replies, 0.5),
                "update_p99_ms": _percentile(replies, 0.99),
                "updates": len(replies),
            }
            minutes.append(sample)
            say(" ".join(f"{key}={value}" for key, value in sample.items()))
        updater.stopping.set()
        updater.join(10)
        sampler.stopping.set()
        subscriber.send({"stop": True})
        subscriber.receive(60)
    settled = [sample["rss_mb"] for sample in minutes[5:]] or [sample["rss_mb"] for sample in minutes]
    p99s = [sample["nl_p99_ms"] for sample in minutes if sample["nl_p99_ms"] is not None]
    return {
        "minutes": minutes,
        **rss_growth(settled),
        "nl_p99_ms_median": statistics.median(p99s) if p99s else None,
        "nl_p99_ms_max": max(p99s) if p99s else None,
        "failed_updates": updater.failed,
        "rate": options.rate,
        "subscriptions": options.sensors,
        "on_disk": options.on_disk,
    }
