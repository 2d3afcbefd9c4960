"""The MQTT side of "secure by default": the installed broker's LAN listener wants a login, sensor
logins come from `sepa-gateway sensors add`, every gateway has its own client id, and a session
taken over by another client is backed off from, not fought over."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from gateway.appliance import mqtt_acl
from tools.launcher import RunningGateway, launch_gateway
from tools.mosquitto import Mosquitto, missing_tools

CLI = [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]
LATEST = "PREFIX gw: <http://w3id.org/sepa-gateway/ns#> SELECT ?v WHERE { GRAPH ?g { ?l gw:value ?v } }"


def sensors(password_file: Path, *args: str, broker: Mosquitto | None = None) -> subprocess.CompletedProcess[str]:
    """`sepa-gateway sensors` on `password_file`; with `broker`, telling that Mosquitto to reload it."""
    reload = ["--pid-file", str(broker.pid_file)] if broker is not None else ["--no-reload"]
    command = [*CLI, "sensors", "--password-file", str(password_file), *reload, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def login(password_file: Path, name: str, broker: Mosquitto | None = None) -> str:
    done = sensors(password_file, "add", name, broker=broker)
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
    """The broker runs the installer's configuration and is already running when the logins are made:
    the command's reload is what lets them in."""
    passwords = installed_broker.passwords
    added = sensors(passwords, "--host", "127.0.0.1", "add", "boiler", broker=installed_broker)
    assert added.returncode == 0, added.stderr
    assert f"(pid {installed_broker.process.pid}) told to reload its password and ACL files" in added.stderr
    (sensor,) = re.findall(r"^password: (\S+)$", added.stdout, re.MULTILINE)
    # attack pass: it printed `mosquitto_pub ... -P 'PASSWORD'`, which, run as printed, showed the
    # password in `ps` and left it in the shell's history. Now it is shown once, and the printed
    # lines are run as an operator would (in a shell, HOME the test's): the password typed into cat
    assert added.stdout.count(sensor) == 1
    save, typed, printed = (line.strip() for line in added.stdout.splitlines() if line.startswith("  "))
    assert typed.startswith("-P PASSWORD ") and "-P" not in printed
    operator = {**os.environ, "HOME": str(tmp_path)}
    typed_in = f"-P {sensor}\n-p {installed_broker.port}\n"  # the test broker's port is not 1883
    subprocess.run(["sh", "-c", save], input=typed_in, text=True, env=operator, check=True, timeout=10)
    gateway_password = tmp_path / "mqtt-password"
    gateway_password.write_text(login(passwords, "sepa-gateway", broker=installed_broker) + "\n")
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[mqtt]\nport = {installed_broker.port}\nusername = "sepa-gateway"\npassword_file = "{gateway_password}"\n'
    )
    gateway = launch_gateway(config=config, data_dir=tmp_path / "data")
    try:
        wait_for(lambda: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        assert publish(installed_broker) != 0  # anonymous
        assert publish(installed_broker, "-u", "boiler", "-P", "wrong") != 0
        assert publish(installed_broker, "-u", "boiler", "-P", sensor) == 0
        wait_for(lambda: [float(row["v"]) for row in gateway.select(LATEST)] == [63.5])
        ran = subprocess.run(["sh", "-c", printed], capture_output=True, text=True, env=operator, timeout=10)
        assert ran.returncode == 0, ran.stderr
        wait_for(lambda: [float(row["v"]) for row in gateway.select(LATEST)] == [21.5])
        assert sensor not in "\n".join(gateway.stderr_lines)
    finally:
        assert gateway.stop() == 0
    assert "boiler" in sensors(passwords, "list").stdout
    assert sensors(passwords, "add", "boiler").returncode == 1  # exists: --reset to change it
    reset = sensors(passwords, "add", "boiler", "--reset", broker=installed_broker)
    assert reset.returncode == 0
    (new_password,) = re.findall(r"^password: (\S+)$", reset.stdout, re.MULTILINE)
    wait_for(lambda: publish(installed_broker, "-u", "boiler", "-P", new_password) == 0)
    assert publish(installed_broker, "-u", "boiler", "-P", sensor) != 0  # the old password no longer works
    assert sensors(passwords, "remove", "boiler", broker=installed_broker).returncode == 0
    assert "boiler" not in sensors(passwords, "list").stdout
    wait_for(lambda: publish(installed_broker, "-u", "boiler", "-P", new_password) != 0)


def test_the_optional_tls_listener_takes_the_same_logins(tmp_path: Path) -> None:
    """The installer's TLS listener (turned on with a certificate and key) over real TLS."""
    problem = missing_tools()
    if problem:
        pytest.fail(problem, pytrace=False)
    from broker.api import tls_files

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


def two_gateways(started: contextlib.ExitStack, tmp_path: Path, toml: str) -> list[RunningGateway]:
    """Gateways "one" and "two" of the config text `toml` (its `{name}`: theirs), each on a data
    directory of its own and stopped by `started` on the way out, whatever fails (the second's
    failed start too)."""
    gateways = []
    for name in ("one", "two"):
        config = tmp_path / f"{name}.toml"
        config.write_text(toml.replace("{name}", name))
        gateways.append(started.enter_context(launch_gateway(config=config, data_dir=tmp_path / name)))
    return gateways


def test_two_gateways_on_one_broker_both_ingest_without_a_reconnect_loop(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """No client id configured: each derives its own (the bug: both used `sepa-gateway`)."""
    with contextlib.ExitStack() as started:
        toml = f"[mqtt]\nport = {mosquitto.port}\n[observations]\n" + 'gateway_id = "{name}"\n'
        gateways = two_gateways(started, tmp_path, toml)
        for gateway in gateways:
            wait_for(lambda gateway=gateway: gateway.metrics().get("sepa_mqtt_connection_subscribed") == 1.0)
        for value in range(11):  # more than 10 s: the old loop took the session every second or so
            mosquitto.pub("gateway/boiler/temperature", str(60 + value))
            time.sleep(1)
        for gateway in gateways:
            wait_for(lambda gateway=gateway: [float(row["v"]) for row in gateway.select(LATEST)] == [70.0])
            metrics = gateway.metrics()
            assert metrics["sepa_mqtt_connection_reconnects"] == 0, metrics
            assert metrics["sepa_mqtt_connection_session_takeovers"] == 0


def test_a_taken_over_session_is_logged_and_backed_off(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """Two gateways configured with one client id: they no longer knock each other off in a loop."""
    with contextlib.ExitStack() as started:
        gateways = two_gateways(started, tmp_path, f'[mqtt]\nport = {mosquitto.port}\nclient_id = "same-id"\n')
        time.sleep(12)
        metrics = [gateway.metrics() for gateway in gateways]
        connects = [m["sepa_mqtt_connection_connects"] for m in metrics]
        assert sum(m["sepa_mqtt_connection_session_takeovers"] for m in metrics) >= 1, metrics
        assert sum(connects) <= 12, connects  # measured: 8 backed off, 33 without the backoff
        log = "\n".join(line for gateway in gateways for line in gateway.stderr_lines)
        assert "mqtt session taken over" in log and "client_id=same-id" in log


class Intruder:
    """A client that takes a client id and, whenever the broker ends its connection, takes it again at
    once: the worst neighbour a gateway can have (a tight reconnect loop of its own)."""

    def __init__(self, port: int, client_id: str, protocol: str) -> None:
        self.port, self.client_id = port, client_id
        self.protocol = mqtt.MQTTv5 if protocol == "5" else mqtt.MQTTv311
        self.connects = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.is_set():
            client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=self.protocol)
            try:
                client.connect("127.0.0.1", self.port, keepalive=60)
            except OSError:
                time.sleep(0.05)
                continue
            self.connects += 1
            while not self.stopped.is_set() and client.loop(0.05) == mqtt.MQTT_ERR_SUCCESS:
                pass
            client.disconnect()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_client_taking_the_gateways_session_is_counted_logged_once_and_backed_off(
    mosquitto: Mosquitto, tmp_path: Path, protocol: str
) -> None:
    """The gateway's own (derived) client id taken by another client that reconnects at once: Mosquitto
    2.0 closes the replaced connection without a reason code on either protocol, so the takeover is
    recognised by connections ending right after they were made."""
    config = tmp_path / "gateway.toml"
    config.write_text(f'[mqtt]\nport = {mosquitto.port}\nprotocol = "{protocol}"\n')
    gateway = launch_gateway(config=config, data_dir=tmp_path / "data")
    intruder = None
    try:
        connected = re.compile(r'msg="mqtt connected".* client_id=(\S+)')
        wait_for(lambda: any(connected.search(line) for line in gateway.stderr_lines))
        (client_id,) = next(filter(None, map(connected.search, gateway.stderr_lines))).groups()
        intruder = Intruder(mosquitto.port, client_id, protocol)
        intruder.thread.start()
        time.sleep(15)
        metrics = gateway.metrics()
        assert metrics["sepa_mqtt_connection_session_takeovers"] >= 1, metrics
        # without the backoff: a reconnect every 0.5-1 s, about 20 in 15 s
        assert metrics["sepa_mqtt_connection_connects"] <= 6, metrics
        warnings = [line for line in gateway.stderr_lines if "mqtt session taken over" in line]
        assert len(warnings) == 1 and f"client_id={client_id}" in warnings[0], warnings
        assert intruder.connects >= 2  # the gateway did come back for its session, it did not give up
    finally:
        if intruder is not None:
            intruder.stopped.set()
            intruder.thread.join(5)
        assert gateway.stop() == 0


class Listener:
    """A logged-in paho client subscribed to `#` at QoS 1, keeping the topics it is sent, in order."""

    def __init__(self, port: int, username: str, password: str) -> None:
        self.topics: list[str] = []
        self.subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.username_pw_set(username, password)
        self.client.on_connect = lambda client, *_: client.subscribe("#", qos=1)
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_message = lambda _client, _data, message: self.topics.append(message.topic)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.subscribed.wait(10)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def publish_as(broker: Mosquitto, username: str, password: str, topic: str) -> None:
    command = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1", "-V", "mqttv311"]
    done = subprocess.run([*command, "-u", username, "-P", password, "-t", topic, "-m", "1"], capture_output=True)
    assert done.returncode == 0, done.stderr  # a denied publish is acknowledged all the same (MQTT 3.1.1)


def test_a_sensor_login_publishes_and_reads_only_its_own_devices_topics(installed_broker) -> None:
    """The installer's ACL: one sensor's password cannot forge another's readings, command an actuator
    or read the plant's traffic; `sensors allow` grants the topics of a mapping of your own and takes
    them back. Without the acl_file line every forged topic below reaches the gateway's login."""
    passwords = installed_broker.passwords
    gateway_password = login(passwords, "sepa-gateway", broker=installed_broker)
    boiler = login(passwords, "boiler", broker=installed_broker)
    login(passwords, "pump", broker=installed_broker)
    gateway = Listener(installed_broker.port, "sepa-gateway", gateway_password)
    try:
        wait_for(
            lambda: (
                publish_as(installed_broker, "boiler", boiler, "gateway/boiler/probe"),
                "gateway/boiler/probe" in gateway.topics,
            )[1]
        )
        gateway.topics.clear()
        forged = ["gateway/pump/temperature", "cmnd/lamp/POWER", "homie/5/pump/x/y/set", "plant/boiler/t", "$SYS/x"]
        for topic in [*forged, "homie/5/boiler/heating/temperature", "gateway/boiler/temperature"]:
            publish_as(installed_broker, "boiler", boiler, topic)
        wait_for(lambda: "gateway/boiler/temperature" in gateway.topics)
        # a probe sent by an earlier round of the wait above may arrive after the clear (a CI run)
        arrived = [topic for topic in gateway.topics if topic != "gateway/boiler/probe"]
        assert arrived == ["homie/5/boiler/heating/temperature", "gateway/boiler/temperature"]

        spy = Listener(installed_broker.port, "boiler", boiler)
        try:
            for topic in ("gateway/pump/temperature", "cmnd/lamp/POWER", "cmnd/boiler/POWER"):
                publish_as(installed_broker, "sepa-gateway", gateway_password, topic)
            wait_for(lambda: "cmnd/boiler/POWER" in spy.topics)
            assert spy.topics == ["cmnd/boiler/POWER"]
        finally:
            spy.close()

        assert (
            sensors(passwords, "allow", "boiler", "--topic", "plant/boiler/#", broker=installed_broker).returncode == 0
        )
        wait_for(
            lambda: (
                publish_as(installed_broker, "boiler", boiler, "plant/boiler/t"),
                "plant/boiler/t" in gateway.topics,
            )[1]
        )
        assert sensors(passwords, "acl", broker=installed_broker).returncode == 0  # the installer's rewrite keeps it
        assert "topic write plant/boiler/#" in mqtt_acl.acl_file(passwords).read_text()
        assert sensors(passwords, "allow", "boiler", broker=installed_broker).returncode == 0  # none: taken back
        gateway.topics.clear()
        publish_as(installed_broker, "boiler", boiler, "plant/boiler/t")
        publish_as(installed_broker, "boiler", boiler, "gateway/boiler/temperature")
        wait_for(lambda: "gateway/boiler/temperature" in gateway.topics)
        assert gateway.topics == ["gateway/boiler/temperature"]
    finally:
        gateway.close()


def test_a_grant_cannot_write_a_line_of_its_own_into_the_acl(installed_broker) -> None:
    """Patterns are checked before they reach Mosquitto's file: a newline would have added
    `topic readwrite #` for the login; `%` would be a substitution; a removed login's grants go."""
    passwords = installed_broker.passwords
    login(passwords, "boiler")
    before = mqtt_acl.acl_file(passwords).read_text()
    for pattern in ("x\nuser boiler\ntopic readwrite #", "a b", "a/%c/#", "a/b#", "#/a", "$SYS/#", ""):
        done = sensors(passwords, "allow", "boiler", "--topic", pattern)
        assert done.returncode == 1 and "topic pattern" in done.stderr, (pattern, done.stderr)
    assert mqtt_acl.acl_file(passwords).read_text() == before
    assert sensors(passwords, "allow", "nobody", "--topic", "a/#").returncode == 1
    assert sensors(passwords, "allow", "sepa-gateway", "--topic", "a/#").returncode == 1
    assert sensors(passwords, "allow", "boiler", "--topic", "plant/+/t", "--commands", "plant/set").returncode == 0
    assert "user boiler\ntopic read plant/set\ntopic write plant/+/t" in mqtt_acl.acl_file(passwords).read_text()
    assert sensors(passwords, "remove", "boiler").returncode == 0
    assert "boiler" not in mqtt_acl.acl_file(passwords).read_text()


def test_a_login_cannot_send_the_broker_a_huge_packet(installed_broker) -> None:
    """max_packet_size in the installer's configuration: Mosquitto's default takes 256 MB packets,
    which it would hold in memory and queue for the gateway's session."""
    boiler = login(installed_broker.passwords, "boiler", broker=installed_broker)
    command = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(installed_broker.port), "-q", "1", "-u", "boiler"]
    command += ["-P", boiler, "-t", "gateway/boiler/temperature", "-s"]
    big = subprocess.run(command, input=b"1" * (1 << 20), capture_output=True, timeout=30)
    assert big.returncode != 0
    assert subprocess.run(command, input=b"21.5", capture_output=True, timeout=30).returncode == 0


def test_idle_connections_from_the_lan_cannot_keep_the_gateway_out(tmp_path: Path) -> None:
    """Mosquitto keeps a connection that never sends CONNECT open for good: with Debian's 1024 open
    files, 1,100 of them from one host locked every sensor and the gateway out (measured). The
    installer's configuration caps each LAN listener (32,256; 40 here, so that a test can fill it)
    and gives the gateway a listener of its own on this board, which stays open."""
    problem = missing_tools()
    if problem:
        pytest.fail(problem, pytrace=False)
    passwords = tmp_path / "passwd"
    passwords.touch(mode=0o600)
    gateway_password = login(passwords, "sepa-gateway")
    boiler = login(passwords, "boiler")
    broker = Mosquitto(tmp_path, installed=passwords, lan_max_connections=40)
    broker.start()
    idle = []
    try:

        def publish_on(port: int, user: str, password: str) -> int:
            command = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-q", "1", "-u", user, "-P", password]
            return subprocess.run(
                [*command, "-t", f"gateway/{user}/t", "-m", "1"], capture_output=True, timeout=20
            ).returncode

        assert publish_on(broker.port, "boiler", boiler) == 0
        idle = [socket.create_connection(("127.0.0.1", broker.port), timeout=5) for _ in range(60)]
        time.sleep(0.5)
        assert publish_on(broker.port, "boiler", boiler) != 0  # the LAN listener is full
        assert publish_on(broker.local_port, "sepa-gateway", gateway_password) == 0  # the gateway's is not
    finally:
        for connection in idle:
            connection.close()
        broker.stop()
