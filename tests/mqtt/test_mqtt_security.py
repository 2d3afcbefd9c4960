"""The MQTT side of "secure by default": the installed broker's LAN listener wants a login, sensor
logins come from `sepa-gateway sensors add`, every gateway has its own client id, and a session
taken over by another client is backed off from, not fought over."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mqtt_support import Mosquitto, missing_tools

from tests.gates.conftest import launch_gateway

CLI = [sys.executable, "-c", "import sys; from gateway.cli import main; sys.exit(main())"]
LATEST = "PREFIX gw: <http://w3id.org/sepa-gateway/ns#> SELECT ?v WHERE { GRAPH ?g { ?l gw:value ?v } }"


def sensors(password_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [*CLI, "sensors", "--password-file", str(password_file), "--no-reload", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def login(password_file: Path, name: str) -> str:
    done = sensors(password_file, "add", name)
    assert done.returncode == 0, done.stderr
    (password,) = re.findall(r"^password: (\S+)$", done.stdout, re.MULTILINE)
    return password


@pytest.fixture
def installed_broker(tmp_path: Path):
    """Mosquitto with the install script's configuration and a password file of our own."""
    problem = missing_tools()
    if problem:
        pytest.fail(problem, pytrace=False)
    passwords = tmp_path / "passwd"
    passwords.touch(mode=0o600)
    broker = Mosquitto(tmp_path, installed=passwords)
    broker.passwords = passwords  # type: ignore[attr-defined]
    broker.start()
    yield broker
    broker.stop()


def publish(broker: Mosquitto, *credentials: str) -> int:
    command = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1"]
    command += ["-t", "gateway/boiler/temperature", "-m", "63.5", *credentials]
    return subprocess.run(command, capture_output=True, timeout=10).returncode


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_sensor_with_its_printed_login_publishes_and_one_without_is_refused(installed_broker, tmp_path: Path) -> None:
    passwords = installed_broker.passwords
    sensor = login(passwords, "boiler")
    gateway_password = tmp_path / "mqtt-password"
    gateway_password.write_text(login(passwords, "sepa-gateway") + "\n")
    subprocess.run(["kill", "-HUP", str(installed_broker.process.pid)], check=True)  # what the CLI's reload does
    time.sleep(0.3)
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[mqtt]\nport = {installed_broker.port}\nusername = "sepa-gateway"\npassword_file = "{gateway_password}"\n'
    )
    gateway = launch_gateway(config=config, data_dir=tmp_path / "data")
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_connected") == 1.0)
        assert publish(installed_broker) != 0  # anonymous
        assert publish(installed_broker, "-u", "boiler", "-P", "wrong") != 0
        assert publish(installed_broker, "-u", "boiler", "-P", sensor) == 0
        wait_for(lambda: [float(row["v"]) for row in gateway.select(LATEST)] == [63.5])
        assert sensor not in "\n".join(gateway.stderr_lines)
    finally:
        assert gateway.stop() == 0
    assert "boiler" in sensors(passwords, "list").stdout
    assert sensors(passwords, "add", "boiler").returncode == 1  # exists: --reset to change it
    assert sensors(passwords, "add", "boiler", "--reset").returncode == 0
    assert sensors(passwords, "remove", "boiler").returncode == 0
    assert "boiler" not in sensors(passwords, "list").stdout


def test_the_optional_tls_listener_takes_the_same_logins(tmp_path: Path) -> None:
    """The installer's TLS listener (turned on with a certificate and key) over real TLS."""
    problem = missing_tools()
    if problem:
        pytest.fail(problem, pytrace=False)
    from broker.security.keys import tls_files

    pair = tls_files(tmp_path / "tls")  # a self-signed certificate for this host, 127.0.0.1 included
    passwords = tmp_path / "passwd"
    passwords.touch(mode=0o600)
    sensor = login(passwords, "boiler")
    broker = Mosquitto(tmp_path, installed=passwords, installed_tls=(pair.cert, pair.key))
    broker.start()
    try:
        command = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.tls_port), "--cafile", str(pair.cert)]
        command += ["-q", "1", "-t", "gateway/boiler/temperature", "-m", "63.5"]
        assert subprocess.run([*command, "-u", "boiler", "-P", sensor], capture_output=True, timeout=10).returncode == 0
        assert subprocess.run(command, capture_output=True, timeout=10).returncode != 0  # no login
        assert publish(broker, "-u", "boiler", "-P", sensor) == 0  # the plain listener still works
    finally:
        broker.stop()


def test_two_gateways_on_one_broker_both_ingest_without_a_reconnect_loop(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """No client id configured: each derives its own (the bug: both used `sepa-gateway`)."""
    gateways = []
    for name in ("one", "two"):
        config = tmp_path / f"{name}.toml"
        config.write_text(f'[mqtt]\nport = {mosquitto.port}\n[observations]\ngateway_id = "{name}"\n')
        gateways.append(launch_gateway(config=config, data_dir=tmp_path / name))
    try:
        for gateway in gateways:
            wait_for(lambda gateway=gateway: gateway.metrics().get("sepa_mqtt_connection_connected") == 1.0)
        for value in range(5):
            mosquitto.pub("gateway/boiler/temperature", str(60 + value))
            time.sleep(1)
        for gateway in gateways:
            wait_for(lambda gateway=gateway: [float(row["v"]) for row in gateway.select(LATEST)] == [64.0])
            metrics = gateway.metrics()
            assert metrics["sepa_mqtt_connection_reconnects"] == 0, metrics
            assert metrics["sepa_mqtt_connection_session_takeovers"] == 0
    finally:
        for gateway in gateways:
            assert gateway.stop() == 0


def test_a_taken_over_session_is_logged_and_backed_off(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """Two gateways configured with one client id: they no longer knock each other off in a loop."""
    gateways = []
    for name in ("one", "two"):
        config = tmp_path / f"{name}.toml"
        config.write_text(f'[mqtt]\nport = {mosquitto.port}\nclient_id = "same-id"\n')
        gateways.append(launch_gateway(config=config, data_dir=tmp_path / name))
    try:
        time.sleep(12)
        connects = [gateway.metrics()["sepa_mqtt_connection_connects"] for gateway in gateways]
        short = sum(gateway.metrics()["sepa_mqtt_connection_short_connections"] for gateway in gateways)
        assert short >= 2
        assert sum(connects) <= 12, connects  # measured: 8 backed off, 33 without the backoff
        log = "\n".join(line for gateway in gateways for line in gateway.stderr_lines)
        assert "another client may be using our client id" in log and "same-id" in log
    finally:
        for gateway in gateways:
            assert gateway.stop() == 0
