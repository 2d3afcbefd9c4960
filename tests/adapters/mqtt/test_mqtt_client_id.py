"""The gateway's MQTT client id (adapters/mqtt/plugin.py): unique per gateway, stable across its restarts,
because it names the persistent session that keeps the readings sent while the gateway restarts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.mqtt.plugin import CLIENT_ID_FILE, MqttConfig, client_id
from tools.launcher import launch_gateway
from tools.mosquitto import Mosquitto

LATEST = "PREFIX gw: <http://w3id.org/sepa-gateway/ns#> SELECT ?v WHERE { GRAPH ?g { ?l gw:value ?v } }"


def test_the_derived_id_is_kept_in_the_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = client_id(MqttConfig(), "pi.local", str(data))
    assert first.startswith("sepa-gateway-pi-local-") and len(first) == len("sepa-gateway-pi-local-") + 32
    assert client_id(MqttConfig(), "pi.local", str(data)) == first  # a restart
    assert (data / CLIENT_ID_FILE).read_text().strip() == first.rsplit("-", 1)[1]


def test_the_derived_id_is_too_random_for_a_sensor_login_to_guess(tmp_path: Path) -> None:
    """Mosquitto lets any login take a connected client id: a sensor login that guesses the gateway's
    closes its connection (and may drop its session). Its random part was 32 bits, found by one LAN
    host trying 1,745 ids a second in 14 days on average; now 128 bits. A suffix an older version
    kept is used as it is: its session holds the readings queued while the gateway was upgraded."""
    suffix = client_id(MqttConfig(), "pi", str(tmp_path / "new")).rsplit("-", 1)[1]
    assert len(suffix) * 4 >= 128 and int(suffix, 16) >= 0
    assert len(client_id(MqttConfig(), "pi", "").rsplit("-", 1)[1]) * 4 >= 128  # an in-memory store's
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / CLIENT_ID_FILE).write_text("0badcafe\n")
    assert client_id(MqttConfig(), "pi", str(tmp_path / "old")) == "sepa-gateway-pi-0badcafe"


def test_two_gateways_installed_alike_get_different_ids(tmp_path: Path) -> None:
    """Same host name (Raspberry Pi OS names every Pi `raspberrypi`), same data directory path: the
    path alone cannot tell them apart, the suffix made for each store does."""
    data = tmp_path / "var-lib-sepa-gateway-data"
    one = client_id(MqttConfig(), "raspberrypi", str(data))
    shutil.rmtree(data)  # the other Pi: the same path, its own store
    assert client_id(MqttConfig(), "raspberrypi", str(data)) != one


def test_a_configured_id_wins(tmp_path: Path) -> None:
    assert client_id(MqttConfig(client_id="boiler-room"), "pi", str(tmp_path)) == "boiler-room"
    assert not (tmp_path / CLIENT_ID_FILE).exists()


def test_readings_sent_while_the_gateway_restarts_are_kept_by_its_derived_session(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(f"[mqtt]\nport = {mosquitto.port}\n")
    data = tmp_path / "data"
    gateway = launch_gateway(config=config, data_dir=data)
    try:
        _wait(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
    finally:
        assert gateway.stop() == 0
    mosquitto.pub("gateway/boiler/temperature", "71.5")  # nobody connected: the session holds it
    gateway = launch_gateway(config=config, data_dir=data)
    try:
        _wait(lambda: [float(row["v"]) for row in gateway.select(LATEST)] == [71.5])
        assert gateway.metrics()["sepa_mqtt_connection_session_takeovers"] == 0
    finally:
        assert gateway.stop() == 0


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_the_kept_suffix_is_on_disk_before_the_session_is_made(tmp_path: Path) -> None:
    """The suffix of a new data directory, made in a process of its own and traced: its file synced,
    renamed into place, then the data directory synced, before the id is used. Without the fix it
    was written and renamed, never synced: a power cut within the next seconds left no file or an
    empty one, and the next start made a new id, leaving the readings queued in the old session
    (acknowledged to their sensors by Mosquitto) undelivered for good."""
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed (tests/run.sh installs it)", pytrace=False)
    data, trace = tmp_path / "data", tmp_path / "trace"
    made = "import sys; from adapters.mqtt.plugin import MqttConfig as C, client_id; client_id(C(), 'pi', sys.argv[1])"
    argv = ["strace", "-f", "-y", "-o", str(trace), "-e", "trace=rename,renameat,renameat2,fsync,fdatasync"]
    done = subprocess.run([*argv, sys.executable, "-c", made, str(data)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    lines = trace.read_text().splitlines()
    renamed = [index for index, line in enumerate(lines) if line.endswith(f'{CLIENT_ID_FILE}") = 0')]
    assert renamed, f"{CLIENT_ID_FILE} was not renamed into place: {lines}"
    file_synced = [line for line in lines[: renamed[0]] if re.search(r"f(data)?sync\(\d+<[^>]*" + CLIENT_ID_FILE, line)]
    directory = re.compile(r"fsync\(\d+<" + re.escape(str(data)) + r">\) = 0")
    directory_synced = [line for line in lines[renamed[0] :] if directory.search(line)]
    assert file_synced and directory_synced, lines
