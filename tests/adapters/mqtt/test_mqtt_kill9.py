"""kill -9 of a running gateway while readings arrive: every reading is committed once it restarts, and the only
duplicates are readings committed just before the kill whose acknowledgements had not reached the broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tools.mosquitto import Mosquitto, paho_publish

HELPER = Path(__file__).with_name("mqtt_ingest_helper.py")
ROOT = Path(__file__).resolve().parents[3]
N = 3000


def committed_batches(out: Path) -> list[list[list[str]]]:
    """Per run of the helper, its committed batches (payload lists); a batch without its "c" line never committed."""
    runs: list[list[list[str]]] = []
    pending: list[str] = []
    for line in out.read_text().splitlines():
        if line == "start":
            runs.append([])
            pending = []
        elif line.startswith("p "):
            pending.append(line[2:])
        elif line.startswith("c "):
            runs[-1].append(pending)
            pending = []
    return runs


def committed(out: Path) -> list[str]:
    if not out.exists():
        return []
    return [p for run in committed_batches(out) for batch in run for p in batch]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def publish_numbered(port: int, protocol: str) -> None:
    """N QoS 1 messages, ~5,000/s, each acknowledged by the broker before this returns."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"pub-{uuid.uuid4().hex[:8]}",
        protocol=mqtt.MQTTv5 if protocol == "5" else mqtt.MQTTv311,
    )
    client.max_inflight_messages_set(100)
    client.connect("127.0.0.1", port)
    client.loop_start()
    infos = []
    for i in range(N):
        infos.append(client.publish(f"kill/{i % 4}", f"n{i}", qos=1))
        if i % 50 == 49:
            time.sleep(0.01)
    for info in infos:
        info.wait_for_publish(20)
    client.disconnect()
    client.loop_stop()


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_kill9_loses_no_acknowledged_reading(mosquitto: Mosquitto, tmp_path: Path, protocol: str) -> None:
    out = tmp_path / "committed.txt"
    client_id = f"kill9-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(HELPER), str(mosquitto.port), client_id, protocol, str(out)]
    helper = subprocess.Popen(command, env=env)
    try:
        # Subscribed once a warm-up message gets committed.
        deadline = time.monotonic() + 10
        while "warmup" not in committed(out):
            assert time.monotonic() < deadline, "the helper never committed the warm-up message"
            paho_publish(mosquitto.port, "kill/warmup", [b"warmup"])
            time.sleep(0.1)

        publisher = threading.Thread(target=publish_numbered, args=(mosquitto.port, protocol))
        publisher.start()
        wait_for(lambda: len(committed(out)) > N // 3, 10, "a third of the readings committed")
        helper.send_signal(signal.SIGKILL)
        helper.wait()
        killed_at = len(committed(out))
        time.sleep(0.2)  # readings keep arriving at the broker for the stopped session
        helper = subprocess.Popen(command, env=env)
        publisher.join(30)
        expected = {f"n{i}" for i in range(N)}
        wait_for(lambda: expected <= set(committed(out)), 20, "every reading committed after the restart")
    finally:
        helper.kill()
        helper.wait()

    assert killed_at < N, "the kill should land while readings were still arriving"
    counts = Counter(p for p in committed(out) if p != "warmup")
    duplicates = {p for p, n in counts.items() if n > 1}
    assert all(n <= 2 for n in counts.values())
    # Duplicates can only be readings committed in the killed run's last batches (acks not yet at the broker).
    killed_run = committed_batches(out)[0]
    last_batches = {p for batch in killed_run[-3:] for p in batch}
    assert duplicates <= last_batches, sorted(duplicates - last_batches)[:10]
    print(f"kill -9 after {killed_at} committed: {len(duplicates)} duplicates (last batches: {len(last_batches)})")
