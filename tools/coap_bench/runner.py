"""Runs the CoAP benchmark: a gateway process, CoAP client processes, the MQTT bench's subscriber.

1. Start ``sepa-gateway run`` (in-memory store, MQTT off, CoAP on 127.0.0.1) and the MQTT bench's
   subscriber process (:mod:`tools.mqtt_bench.subscriber`) holding 100 subscriptions, one per bench
   sensor (``urn:sepa-gateway:sensor:coap/bench<i>``), on the latest-value view.
2. Throughput: C client processes (:mod:`tools.coap_bench.client`) POST N readings to
   ``/s/bench<i>/temperature`` as confirmable requests, W in flight each; readings/s = N / (time from
   the first send until the last answer). A 2.04 Changed is sent only once the reading is
   committed, so the last answer is when the last reading was stored. With `loss`, this phase goes
   through :class:`tools.coap.relay.LossyRelay` (that share of the datagrams dropped each way), and
   the clients use a lossy link's timing.
3. The store is asked for every observation of the bench sensors: stored = how many, lost = readings
   of no observation, duplicates = observations made (the sensors' sequence numbers) minus distinct
   readings stored. Nothing is pruned before this count: retention keeps ceil(N / sensors)
   observations a sensor, what the phase makes when nothing is duplicated.
4. Latency: one client process sends at a fixed rate (1,000 readings/s), straight to the gateway,
   with a window of at least 64 requests;
   NL = the subscriber's receive time minus the send time of the same (sensor, value), for values
   that became the latest (as in the MQTT bench: a reading superseded within its batch is no
   notification). Retention is at its steady state, as in the MQTT bench (its runner says why).
5. Unless told not to, the MQTT bench (:func:`tools.mqtt_bench.runner.run`) with the same readings,
   publishers = clients, rate and phase length, after the CoAP gateway stopped: its figures go under
   "mqtt", with the ratio of the two throughputs.

CPU seconds: the clients' own (``time.process_time`` over their sending), and the gateway's
(``/proc/<pid>/stat``) over each phase.

Measured on the 2-core test machine, nothing else running, 2026-11-27, four runs of the defaults
(20,000 readings, 2 clients x 128 in flight, 1,000/s for 10 s): 2,449-3,373 CoAP readings/s (two
runs past 3,000), NL p50 2.1-6.8 ms, p99 20-41 ms, against 3,525-3,917 MQTT readings/s (p99 38-46
ms) in the same runs; 0 duplicates, 0 lost. The p99 was 33-61 ms before the query workers were fed
every 0.05 s instead of 0.2 s (broker/workers/pool.py says why) and 42-52 ms before retention
paced its deletes. With the gateway's threads on one core (gateway/appliance/cores.py), three
runs the same day: 3,311-3,589 readings/s, NL p50 1.4-1.9 ms, p99 13-50 ms, 0 duplicates, 0 lost
(MQTT 3,937-4,348/s). 2026-11-26: 3,342 CoAP readings/s, NL p50 2.0 ms, p99 40 ms,
against 4,040 MQTT readings/s (p99 40 ms) in the same run; 0 duplicates, 0 lost; with --loss 0.1,
20,000 of 20,000 stored once (395/s: the clients' retransmission timers). The gateway spends
~0.25 ms of CPU a reading in throughput, ~0.9 ms in the latency phase (batches of ~3 at 1,000/s:
the per-update cost dominates). Earlier days of the same machine gave 1,325-1,600/s with code
that gives 3,450-3,570/s today: it is shared, so compare builds alternated in one session.

The 10 s latency phase rarely holds an in-memory compaction of the store (at 1,000/s one is due
every ~20 s with the phase's 280,000 live quads). `--latency-seconds 60` or 90 does. Its NL p99
was 110-273 ms (max 390-960 ms) while the compaction copied the store as Python objects (the GIL
held 1.5-4 s in ~6 ms bites); since the copy goes through pyoxigraph's dump and load, which let
go of the GIL (broker.store.copy_live), it is 111-187 ms (2026-11-27, four runs alternated with
two of the older copy: 188 and 273 ms). What is left is freeing the old store: 150-340 ms with
the GIL held at once (pyoxigraph frees under it, ~0.35 us a quad version), one stall per
compaction, timed by a thread ticking every millisecond in the gateway. A copy paced to half the
time, with its deltas held as N-Quads bytes, made `bench soak` worse (RSS 242 -> 547 MB in 5
minutes against 231 -> 297): not adopted.

Where the time went before the fast path, with aiocoap on both sides and 2 x 32 in flight:
477-531/s, the gateway 1.4-1.5 ms a reading, aiocoap's receive path ~32 % of the loop.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.coap.relay import LossyRelay
from tools.mqtt_bench.runner import percentile, read_metrics
from tools.wire.processes import BenchError, Child, Children, GatewayProcess, python_module, start_gateway

Log = Callable[[str], None]
HOST = "127.0.0.1"
SENSOR_IRI = "urn:sepa-gateway:sensor:coap/bench"  # what the CoAP profile makes of /s/bench<i>/temperature
MOSQUITTO_MISSING = (
    "the MQTT comparison needs the mosquitto binary (Debian: apt-get install mosquitto); or pass --no-mqtt"
)
GATEWAY_SECTIONS = """\
[mqtt]
enabled = false  # this run measures CoAP; the MQTT comparison starts its own gateway

[coap]
host = "{host}"
port = {port}

[observations]
retain_count = {retain_count}
prune_interval_s = {prune_interval_s}"""
_OBSERVATIONS = f"""PREFIX sosa: <http://www.w3.org/ns/sosa/>
PREFIX qudt: <http://qudt.org/schema/qudt/>
SELECT ?sensor ?value WHERE {{ GRAPH <http://w3id.org/sepa-gateway/graph/observations> {{
  ?o sosa:madeBySensor ?sensor ; sosa:hasResult ?r . ?r qudt:numericValue ?value .
  FILTER(STRSTARTS(STR(?sensor), "{SENSOR_IRI}")) }} }}"""
_SEQUENCES = f"""PREFIX gw: <http://w3id.org/sepa-gateway/ns#>
SELECT ?sensor ?last WHERE {{ GRAPH <http://w3id.org/sepa-gateway/graph/latest> {{
  ?l gw:sensor ?sensor ; gw:sequenceNumber ?last . FILTER(STRSTARTS(STR(?sensor), "{SENSOR_IRI}")) }} }}"""


@dataclass(frozen=True)
class CoapBenchOptions:
    readings: int = 20_000
    clients: int = 2  # client processes of the throughput phase
    in_flight: int = 128  # requests in flight per client process (one sensor endpoint each)
    sensors: int = 100
    latency_rate: float = 1000.0
    latency_seconds: float = 10.0
    loss: float = 0.0  # dropped share of the datagrams each way in the throughput phase (0: no relay)
    mqtt: bool = True  # run the MQTT bench after, for its figures beside these
    timeout_s: float = 300.0
    prune_interval_s: float = 2.0

    @property
    def latency_in_flight(self) -> int:
        """The paced client's window: the throughput phase's in all, at least 64. A sender that had to
        wait for a free context would send late and hide the wait from NL (measured from the send);
        `latency_send_late_p99_ms` in the report shows whether it did."""
        return max(64, self.in_flight * self.clients)

    @property
    def retention(self) -> int:
        """Observations kept per sensor: what the throughput phase makes, so none is pruned before the count."""
        return max(1, math.ceil(self.total / self.sensors))

    @property
    def total(self) -> int:
        return (self.readings // self.clients) * self.clients


def free_udp_port() -> int:
    """A UDP port free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its threads so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def select(query_url: str, sparql: str) -> list[dict[str, str]]:
    """The rows of a SELECT as {variable: lexical value}."""
    request = urllib.request.Request(
        query_url, sparql.encode(), {"Content-Type": "application/sparql-query", "Accept": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        rows = json.loads(response.read())["results"]["bindings"]
    return [{name: term["value"] for name, term in row.items()} for row in rows]


def store_check(query_url: str, expected: set[tuple[int, int]]) -> dict[str, int]:
    """stored, duplicates and lost among the observations of the bench sensors; `expected` holds
    the (sensor, value) of every reading sent."""
    found = [
        (int(row["sensor"][len(SENSOR_IRI) :]), int(float(row["value"]))) for row in select(query_url, _OBSERVATIONS)
    ]
    made = sum(int(row["last"]) for row in select(query_url, _SEQUENCES))
    distinct = set(found)
    return {
        "stored": len(found),
        "duplicates": made - len(distinct),
        "lost": len(expected - distinct),
        "unexpected": len(distinct - expected),
    }


@contextmanager
def lossy_relay(server: tuple[str, int], loss: float) -> Iterator[tuple[LossyRelay, int]]:
    """A LossyRelay before `server` and its port, on its own event loop thread (the harness only waits meanwhile)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="coap-relay", daemon=True)
    thread.start()
    relay = LossyRelay(server, loss)
    try:
        yield relay, asyncio.run_coroutine_threadsafe(relay.start(), loop).result(10)
    finally:
        loop.call_soon_threadsafe(relay.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def run_clients(
    children: Children,
    name: str,
    uri: str,
    parts: list[tuple[int, int]],
    options: CoapBenchOptions,
    *,
    rate: float = 0.0,
    patient: bool = False,
    in_flight: int | None = None,
) -> list[dict[str, Any]]:
    """One client process per (first, count) of `parts`; started together once all are ready; their results."""
    clients: list[Child] = []
    for i, (first, count) in enumerate(parts):
        argv = ["--uri", uri, "--first", str(first), "--count", str(count), "--sensors", str(options.sensors)]
        argv += ["--in-flight", str(in_flight or options.in_flight), "--rate", str(rate)] + (
            ["--patient"] if patient else []
        )
        clients.append(children.start(f"{name}-{i}", python_module("tools.coap_bench.client", *argv), pipes=True))
    for client in clients:
        client.receive(60)  # ready: its contexts are open
    for client in clients:
        client.send({"go": True})
    deadline = time.monotonic() + options.timeout_s
    results = [client.receive(deadline - time.monotonic()) for client in clients]
    for client in clients:
        children.stop(client)
    return results


def _start(children: Children, workdir: Path, options: CoapBenchOptions) -> tuple[GatewayProcess, int]:
    port = free_udp_port()
    sections = GATEWAY_SECTIONS.format(
        host=HOST, port=port, retain_count=options.retention, prune_interval_s=options.prune_interval_s
    )
    gateway = start_gateway(children, workdir, allow_load=False, max_request_bytes=1 << 20, mqtt=sections)
    return gateway, port


def run_coap(options: CoapBenchOptions, log: Log | None = None) -> dict[str, Any]:
    """The CoAP phases on their own gateway (steps 1-4 of the module docstring)."""
    say = log or (lambda _message: None)
    with tempfile.TemporaryDirectory(prefix="sepa-bench-coap-") as directory, Children() as children:
        gateway, port = _start(children, Path(directory), options)
        pid = gateway.child.pid
        metrics_url = f"http://{HOST}:{gateway.http_port}/metrics"
        subscriber = children.start(
            "subscriber",
            python_module(
                "tools.mqtt_bench.subscriber", "--url", gateway.subscribe_url, "--sensors", str(options.sensors),
                "--sensor-iri", SENSOR_IRI,
            ),
            pipes=True,
        )  # fmt: skip
        subscriber.receive(60)
        say(f"gateway pid {pid}, CoAP on {HOST}:{port}; subscriber: {options.sensors} subscriptions on the latest view")

        per = options.readings // options.clients
        total = per * options.clients
        parts = [(i * per, per) for i in range(options.clients)]
        cpu_before = cpu_seconds(pid)
        relay_stats: dict[str, int] | None = None
        if options.loss > 0:
            with lossy_relay((HOST, port), options.loss) as (relay, through):
                results = run_clients(children, "client", f"coap://{HOST}:{through}", parts, options, patient=True)
            relay_stats = {
                "forwarded": relay.stats.forwarded,
                "dropped_up": relay.stats.dropped_up,
                "dropped_down": relay.stats.dropped_down,
            }
        else:
            results = run_clients(children, "client", f"coap://{HOST}:{port}", parts, options)
        elapsed = (max(r["done_ns"] for r in results) - min(r["first_sent_ns"] for r in results)) / 1e9
        gateway_cpu = cpu_seconds(pid) - cpu_before
        acknowledged = sum(r["acknowledged"] for r in results)
        say(f"throughput: {total:,} readings answered in {elapsed:.2f} s ({acknowledged:,} acknowledged)")
        check = store_check(gateway.query_url, {(k % options.sensors, k) for k in range(total)})
        say(f"store: {check['stored']:,} observations, {check['duplicates']} duplicates, {check['lost']} lost")

        count = int(options.latency_rate * options.latency_seconds)
        cpu_before = cpu_seconds(pid)
        window = options.latency_in_flight
        paced = run_clients(
            children, "client-paced", f"coap://{HOST}:{port}", [(total, count)], options, rate=options.latency_rate,
            in_flight=window,
        )[0]  # fmt: skip
        latency_gateway_cpu = cpu_seconds(pid) - cpu_before
        subscriber.send({"stop": True})
        received = subscriber.receive(60)["received"]
        by_value = {value: ns for _sensor, value, ns in received}
        sent = paced["sent_ns"]
        latencies = [(by_value[total + n] - ns) / 1e6 for n, ns in enumerate(sent) if total + n in by_value]
        metrics = read_metrics(metrics_url)
        say(f"latency: {count:,} readings at {options.latency_rate:,.0f}/s, {len(latencies):,} notifications matched")
        return {
            "readings_per_s": round(total / elapsed, 1),
            "readings": total,
            "acknowledged": acknowledged,
            "failed": sum(r["failed"] for r in results),
            **{key: check[key] for key in ("stored", "duplicates", "lost", "unexpected")},
            "nl_p50_ms": round(statistics.median(latencies), 3) if latencies else None,
            "nl_p99_ms": round(percentile(latencies, 0.99), 3) if latencies else None,
            "nl_max_ms": round(max(latencies), 3) if latencies else None,
            "clients": options.clients,
            "in_flight": options.in_flight,
            "subscriptions": options.sensors,
            "loss": options.loss,
            "relay": relay_stats,
            "codes": _merged(r["codes"] for r in results),
            "errors": _merged(r["errors"] for r in results),
            "client_cpu_s": round(sum(r["cpu_s"] for r in results), 2),
            "gateway_cpu_s": round(gateway_cpu, 2),
            "latency_rate": options.latency_rate,
            "latency_readings": count,
            "latency_in_flight": window,
            "latency_sent_per_s": round((count - 1) / ((max(sent) - min(sent)) / 1e9), 1) if count > 1 else None,
            "latency_send_late_p99_ms": paced["late_p99_ms"],
            "latency_failed": paced["failed"],
            "latency_matched": len(latencies),
            "latency_client_cpu_s": paced["cpu_s"],
            "latency_gateway_cpu_s": round(latency_gateway_cpu, 2),
            "retain_count": options.retention,
            "prune_interval_s": options.prune_interval_s,
            "batches": metrics.get("sepa_coap_batches"),
            "largest_batch": metrics.get("sepa_coap_largest_batch"),
            "gateway_readings": metrics.get("sepa_coap_readings"),
        }


def _merged(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for one in counts:
        for key, value in one.items():
            merged[key] = merged.get(key, 0) + value
    return merged


def run(options: CoapBenchOptions, log: Log | None = None) -> dict[str, Any]:
    """The CoAP figures, then (unless `options.mqtt` is off) the MQTT bench's under "mqtt" and the ratio."""
    if options.mqtt and shutil.which("mosquitto") is None:
        raise BenchError(MOSQUITTO_MISSING)
    report = run_coap(options, log)
    report["mqtt"] = None
    report["readings_per_s_vs_mqtt"] = None
    if options.mqtt:
        from tools.mqtt_bench.runner import MqttBenchOptions
        from tools.mqtt_bench.runner import run as run_mqtt

        if log is not None:
            log("mqtt: the same readings, publishers, rate and phase length through Mosquitto")
        mqtt = run_mqtt(
            MqttBenchOptions(
                readings=options.readings,
                publishers=options.clients,
                sensors=options.sensors,
                latency_rate=options.latency_rate,
                latency_seconds=options.latency_seconds,
                timeout_s=options.timeout_s,
                retain_count=options.retention,
                prune_interval_s=options.prune_interval_s,
            ),
            log,
        )
        report["mqtt"] = mqtt
        report["readings_per_s_vs_mqtt"] = round(report["readings_per_s"] / mqtt["readings_per_s"], 3)
    return report
