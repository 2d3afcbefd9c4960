"""Runs the MQTT benchmark: Mosquitto, a gateway process, publisher processes, a subscriber process.

1. Start Mosquitto (its own config: unlimited queue, in-flight window 1,000) and ``sepa-gateway
   run`` (in-memory store) with its MQTT adapter on that broker.
2. The subscriber holds 100 subscriptions, one per bench sensor, on the latest-value view.
3. Throughput: P publisher processes send N readings (generic profile, ``gateway/bench<i>/temperature``)
   as fast as the broker takes them; readings/s = N / (time from the first publish until the
   gateway counted N readings stored); lost = N minus the observations found in the store.
4. Latency: one publisher sends at a fixed rate (1,000 readings/s); NL = the subscriber's receive
   time minus the publish time of the same (sensor, value), for values that became the latest
   (a reading superseded within its batch never is: it is not a notification).

Retention is on, as on a real gateway, and the latency phase runs at its steady state: by
default the gateway keeps `readings / sensors` observations per sensor, so the throughput phase
ends with the store exactly full, and every reading of the latency phase makes one observation
due for pruning. It prunes every 2 s (`prune_interval_s`), so the 10 s phase meets about five
runs carrying the steady-state deletion rate (one deletion per reading). The gateway's default
of 60 s would put the same work into one run that a 10 s phase meets one time in six: a figure
measured without it says nothing about pruning. The report says how many quads were pruned and
how many observations were stored when the phase started and ended, so a run that did not prune
shows it.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.wire.processes import (
    BenchError,
    Child,
    Children,
    GatewayProcess,
    free_port,
    python_module,
    start_gateway,
)

Log = Callable[[str], None]
MOSQUITTO_CONFIG = """\
listener {port} 127.0.0.1
allow_anonymous true
persistence false
max_queued_messages 0
max_inflight_messages 1000
log_dest none
"""


@dataclass(frozen=True)
class MqttBenchOptions:
    readings: int = 20_000
    publishers: int = 2
    sensors: int = 100
    latency_rate: float = 1000.0
    latency_seconds: float = 10.0
    timeout_s: float = 300.0
    retain_count: int | None = None  # observations kept per sensor; None: readings // sensors
    prune_interval_s: float = 2.0
    on_disk: bool = False  # the gateway with a data directory (a reading is acknowledged once synced)
    mode: str = "sequential"  # the gateway's engine mode: "sequential" or "parallel"
    workers: int = 0  # parallel mode's BOOSTER workers (0: the gateway's default)

    @property
    def retention(self) -> int:
        return self.retain_count if self.retain_count is not None else max(1, self.readings // self.sensors)


def read_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        lines = response.read().decode().splitlines()
    return {name: float(value) for name, _, value in (line.rpartition(" ") for line in lines) if name}


def _count_observations(query_url: str) -> int:
    sparql = (
        "SELECT (COUNT(?o) AS ?n) WHERE { GRAPH <http://w3id.org/sepa-gateway/graph/observations> "
        "{ ?o a <http://www.w3.org/ns/sosa/Observation> } }"
    )
    request = urllib.request.Request(
        query_url, sparql.encode(), {"Content-Type": "application/sparql-query", "Accept": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return int(json.loads(response.read())["results"]["bindings"][0]["n"]["value"])


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.02)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class MqttSetup:
    """Mosquitto, a gateway ingesting from it, and a subscriber holding one subscription per sensor."""

    port: int
    broker: Child
    gateway: GatewayProcess
    subscriber: Child

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.http_port}/metrics"


def start_mqtt_setup(
    children: Children,
    workdir: Path,
    client_id: str,
    retain_count: int,
    prune_interval_s: float,
    sensors: int,
    on_disk: bool,
    mode: str = "sequential",
    workers: int = 0,
) -> MqttSetup:
    """Start Mosquitto, the gateway (generic profile, retention as given) and the subscriber; return
    once the gateway is connected and every subscription has its first notification."""
    port = free_port()
    (workdir / "mosquitto.conf").write_text(MOSQUITTO_CONFIG.format(port=port))
    broker = children.start("mosquitto", ["mosquitto", "-c", str(workdir / "mosquitto.conf")])
    mqtt = f'[mqtt]\nport = {port}\nclient_id = "{client_id}"\nprofiles = ["generic"]'
    mqtt += f"\n\n[observations]\nretain_count = {retain_count}\nprune_interval_s = {prune_interval_s}"
    mqtt += "\n\n[coap]\nenabled = false  # not measured here; it would bind UDP 5683, which another run may hold"
    gateway = start_gateway(
        children,
        workdir,
        allow_load=False,
        max_request_bytes=1 << 20,
        mqtt=mqtt,
        on_disk=on_disk,
        mode=mode,
        workers=workers,
    )
    setup = MqttSetup(port, broker, gateway, children.start(
        "subscriber",
        python_module("tools.mqtt_bench.subscriber", "--url", gateway.subscribe_url, "--sensors", str(sensors)),
        pipes=True,
    ))  # fmt: skip
    wait_until(
        lambda: read_metrics(setup.metrics_url).get("sepa_mqtt_connection_subscribed") == 1.0, 30, "the MQTT connection"
    )
    setup.subscriber.receive(60)
    return setup


def run(options: MqttBenchOptions, log: Log | None = None) -> dict[str, Any]:
    say = log or (lambda _message: None)
    with tempfile.TemporaryDirectory(prefix="sepa-bench-mqtt-") as directory, Children() as children:
        workdir = Path(directory)
        setup = start_mqtt_setup(
            children, workdir, "bench-gateway", options.retention, options.prune_interval_s, options.sensors,
            options.on_disk, options.mode, options.workers,
        )  # fmt: skip
        port, broker, gateway, subscriber = setup.port, setup.broker, setup.gateway, setup.subscriber
        metrics_url = setup.metrics_url
        say(f"mosquitto on {port}, gateway pid {gateway.child.pid}")
        say(f"subscriber: {options.sensors} subscriptions on the latest-value view")

        per = options.readings // options.publishers
        total = per * options.publishers
        started = time.monotonic()
        publishers = [
            children.start(
                f"publisher-{i}",
                python_module(
                    "tools.mqtt_bench.publisher",
                    "--port", str(port), "--first", str(i * per), "--count", str(per),
                    "--sensors", str(options.sensors),
                ),
                pipes=True,
            )
            for i in range(options.publishers)
        ]  # fmt: skip
        first_sent = min(min(p.receive(options.timeout_s)["sent_ns"][:1] or [0]) for p in publishers)
        wait_until(
            lambda: read_metrics(metrics_url).get("sepa_mqtt_readings", 0) >= total, options.timeout_s, "the readings"
        )
        stored_ns = time.monotonic_ns()
        elapsed = (stored_ns - first_sent) / 1e9
        stored = _count_observations(gateway.query_url)
        say(f"throughput: {total:,} readings stored in {elapsed:.2f} s ({time.monotonic() - started:.1f} s wall)")

        count = int(options.latency_rate * options.latency_seconds)
        pruned_before = read_metrics(metrics_url).get("sepa_retention_pruned_quads")
        paced = children.start(
            "publisher-paced",
            python_module(
                "tools.mqtt_bench.publisher",
                "--port", str(port), "--first", str(total), "--count", str(count),
                "--sensors", str(options.sensors), "--rate", str(options.latency_rate),
            ),
            pipes=True,
        )  # fmt: skip
        sent = paced.receive(options.timeout_s)["sent_ns"]
        wait_until(
            lambda: read_metrics(metrics_url).get("sepa_mqtt_readings", 0) >= total + count, options.timeout_s, "paced"
        )
        pruned_after = read_metrics(metrics_url).get("sepa_retention_pruned_quads")
        stored_after = _count_observations(gateway.query_url)
        subscriber.send({"stop": True})
        received = subscriber.receive(60)["received"]
        by_value = {value: ns for _sensor, value, ns in received}
        latencies = [(by_value[total + n] - ns) / 1e6 for n, ns in enumerate(sent) if total + n in by_value]
        metrics = read_metrics(metrics_url)
        children.stop(broker)
        return {
            "readings_per_s": round(total / elapsed, 1),
            "lost": total - stored,
            "nl_p50_ms": round(statistics.median(latencies), 3) if latencies else None,
            "nl_p99_ms": round(percentile(latencies, 0.99), 3) if latencies else None,
            "readings": total,
            "publishers": options.publishers,
            "mode": options.mode,
            "pipelined_updates": metrics.get("sepa_parallel_pipelined_total"),
            "subscriptions": options.sensors,
            "latency_rate": options.latency_rate,
            "latency_readings": count,
            "latency_matched": len(latencies),
            "retain_count": options.retention,
            "prune_interval_s": options.prune_interval_s,
            "observations_at_latency_start": stored,
            "observations_at_latency_end": stored_after,
            "pruned_quads_in_latency_phase": (
                None if pruned_before is None or pruned_after is None else pruned_after - pruned_before
            ),
            "batches": metrics.get("sepa_mqtt_ingest_batches"),
            "largest_batch": metrics.get("sepa_mqtt_ingest_largest_batch"),
            "bad_input": metrics.get("sepa_mqtt_ingest_bad_input"),
        }
