"""``/health``, ``/health/live`` and the indicators on ``/metrics`` (uptime, version, processing
times, subscriptions now and at most), over real sockets.

Protects: readiness is 200 only while every required component is ready and 503 otherwise, with
every component's status, required flag and detail in the body; a failing optional component
leaves it 200; a check that raises is a failing component, not a 500; liveness stays 200 while
readiness is 503; the store is not ready while the request queue is full (new requests get 429)
and then is again; the version is the package's, on /health, on /metrics and nowhere different;
like /metrics, /health is not served on the secure (network) port.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from broker.gates.health import ComponentHealth
from gateway.appliance.config import Config
from tools.launcher import InProcessGateway

EX = "http://example.org/health/"
VERSION = version("sepa-gateway")


def health(gateway: InProcessGateway) -> tuple[int, dict[str, Any]]:
    reply = gateway.request("GET", "/health")
    assert reply.media_type == "application/json"
    return reply.status, reply.json()


def test_ready_with_its_components_and_alive(in_process_gateway: Callable[..., InProcessGateway]) -> None:
    gateway = in_process_gateway()
    status, body = health(gateway)
    assert status == 200, body
    assert body["status"] == "ready" and body["version"] == VERSION and body["uptime_s"] >= 0
    assert set(body["components"]) == {"store", "engine", "clock", "clock_sync"}  # MQTT and CoAP are off here
    assert body["components"]["store"] == {"status": "ok", "required": True, "detail": "in memory"}
    assert body["components"]["clock"]["status"] == "ok"
    assert body["components"]["engine"] == {"status": "ok", "required": True, "detail": "sequential mode"}
    live = gateway.request("GET", "/health/live")
    assert (live.status, live.json()) == (200, {"status": "alive"})
    assert gateway.request("HEAD", "/health").status == 200


def test_a_failing_required_component_is_503_an_optional_one_is_not(
    in_process_gateway: Callable[..., InProcessGateway],
) -> None:
    gateway = in_process_gateway()
    checks = gateway.gateway.gates.health.checks
    now: dict[str, ComponentHealth] = {"probe": ComponentHealth(False, "the probe is down")}
    checks["probe"] = lambda: now["probe"]
    status, body = health(gateway)
    assert status == 503 and body["status"] == "not ready"
    assert body["components"]["probe"] == {"status": "failing", "required": True, "detail": "the probe is down"}
    assert body["components"]["store"]["status"] == "ok"
    assert gateway.request("GET", "/health/live").status == 200  # alive all the same
    now["probe"] = ComponentHealth(False, "behind", required=False)
    status, body = health(gateway)
    assert status == 200 and body["components"]["probe"]["status"] == "failing"

    def broken() -> ComponentHealth:
        raise OSError("no such device")

    checks["probe"] = broken
    status, body = health(gateway)
    assert status == 503
    assert body["components"]["probe"]["status"] == "failing"
    assert "OSError: no such device" in body["components"]["probe"]["detail"]


def test_store_is_not_ready_while_the_request_queue_is_full(
    in_process_gateway: Callable[..., InProcessGateway],
) -> None:
    config = Config()
    config.scheduler.queue_size = 1
    gateway = in_process_gateway(config)
    release = threading.Event()
    held = threading.Event()

    def callback(notification: Any) -> None:
        if notification.sequence > 0:  # the update's notification: hold the update thread
            held.set()
            release.wait(30)

    gateway.gateway.engine.subscribe(f"SELECT ?o WHERE {{ <{EX}s> <{EX}p> ?o }}", callback)
    replies: list[int] = []
    # longer than what the scheduler runs inline on the loop: this one goes to the update thread
    held_update = "# " + "x" * 5000 + f"\nINSERT DATA {{ <{EX}s> <{EX}p> 1 }}"
    sender = threading.Thread(target=lambda: replies.append(gateway.update(held_update).status))
    sender.start()
    try:
        assert held.wait(10)
        status, body = health(gateway)
        assert status == 503
        assert body["components"]["store"]["status"] == "failing"
        assert "request queue is full" in body["components"]["store"]["detail"]
        assert gateway.update(f"INSERT DATA {{ <{EX}s> <{EX}p> 2 }}").status == 429  # what it warned of
    finally:
        release.set()
        sender.join(10)
    assert replies == [200]
    assert health(gateway)[0] == 200


def test_store_on_disk_reports_its_free_space(
    in_process_gateway: Callable[..., InProcessGateway], tmp_path: Path
) -> None:
    config = Config()
    config.store.data_dir = str(tmp_path / "data")
    gateway = in_process_gateway(config)
    status, body = health(gateway)
    detail = body["components"]["store"]["detail"]
    assert status == 200 and detail.startswith(f"on disk at {tmp_path / 'data'}, ") and detail.endswith(" MiB free")


def test_metrics_show_version_uptime_and_the_reference_brokers_indicators(
    in_process_gateway: Callable[..., InProcessGateway],
) -> None:
    gateway = in_process_gateway()
    first = gateway.metrics()
    assert first[f'sepa_build_info{{version="{VERSION}"}}'] == 1
    time.sleep(0.3)
    engine = gateway.gateway.engine
    spuids = [engine.subscribe(f"SELECT ?o WHERE {{ <{EX}s{n}> <{EX}p> ?o }}", lambda _: None).spuid for n in range(3)]
    for n in range(5):
        assert gateway.update(f"INSERT DATA {{ <{EX}s{n}> <{EX}p> {n} }}").status == 200
    for spuid in spuids:
        engine.unsubscribe(spuid)
    after = gateway.metrics()
    assert after["sepa_uptime_seconds"] >= first["sepa_uptime_seconds"] + 0.3
    low, mean, high = (after[f"sepa_update_processing_seconds_{name}"] for name in ("min", "avg", "max"))
    assert 0 < low <= mean <= high, (low, mean, high)
    assert first["sepa_update_processing_seconds_max"] <= high  # start-up's own updates (the ontologies) count
    assert after["sepa_subscriptions"] == first["sepa_subscriptions"]
    assert after["sepa_subscriptions_max"] >= first["sepa_subscriptions"] + 3


def test_the_spu_table_on_the_plain_port_counts_what_the_subscriptions_were_sent(
    in_process_gateway: Callable[..., InProcessGateway],
) -> None:
    gateway = in_process_gateway()
    engine = gateway.gateway.engine
    query = f"SELECT ?o WHERE {{ <{EX}t> <{EX}p> ?o }}"
    for _ in range(3):
        engine.subscribe(query, lambda _: None)
    for n in range(4):
        assert gateway.update(f"INSERT DATA {{ <{EX}t> <{EX}p> {n} }}").status == 200
    reply = gateway.request("GET", "/spus?limit=1000")
    assert reply.status == 200 and reply.headers["Cache-Control"] == "no-store"
    rows = [row for row in reply.json()["shown"] if row["query"] == query]
    expected = {"kind": "incremental", "query": query, "subscriptions": 3, "notifications": 3 * 5, "solutions": 4}
    assert rows == [{**expected, "owners": ["in process"], "ask": False}]
    for limit in ("-1", "0", "1001", "x", "%C2%B2", "9" * 5000):  # "²" is a digit to str.isdigit, not to int()
        assert gateway.request("GET", f"/spus?limit={limit}").status == 400, limit


def test_not_on_the_secure_gates(in_process_gateway: Callable[..., InProcessGateway]) -> None:
    """Like /metrics, /health is the plain port's (127.0.0.1 on the installed appliance): the secure
    port, the one on the network, answers neither without a token."""
    config = Config()
    config.security.enabled = True
    gateway = in_process_gateway(config)
    port = int(gateway.https_url.rpartition(":")[2])
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only the routes are under test here
    for path in ("/health", "/health/live", "/metrics"):
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        try:
            connection.request("GET", path)
            assert connection.getresponse().status == 404, path
        finally:
            connection.close()
    assert gateway.request("GET", "/health").status == 200  # the plain port still answers
