"""A gateway started as the installed service starts it, on free ports of this machine.

What "as installed" means here: the configuration is systemd/sepa-gateway.toml itself (secure gates
on, plain gates on 127.0.0.1, MQTT with the gateway's own login), with only what points at the
machine changed (the Mosquitto port, the gateway's MQTT password file; ports are chosen by the OS);
a data directory; Mosquitto runs the installer's configuration (logins required) with logins made
by `sepa-gateway sensors add`; OAuth clients are added and registered by `sepa-gateway clients add
--register`, as the operator does (README, "Security"); the gateway runs with the installed unit's
`Environment=` (mimalloc preloaded). Shared by the dashboard's browser tests and its benchmark.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tools.launcher import RunningGateway, gateway_argv, launch_gateway
from tools.mosquitto import Mosquitto, missing_tools

INSTALLED_TOML = Path(__file__).resolve().parents[2] / "systemd" / "sepa-gateway.toml"
INSTALLED_UNIT = INSTALLED_TOML.with_name("sepa-gateway.service")
SENSOR = "sensors"  # the MQTT login the tests and the benchmark publish with


@dataclass
class Credentials:
    client_id: str
    client_secret: str


@dataclass
class InstalledGateway:
    gateway: RunningGateway
    broker: Mosquitto
    config: Path
    data_dir: Path
    sensor_password: str

    @property
    def certificate(self) -> Path:
        return self.data_dir / "security" / "tls-cert.pem"

    def clients(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [*gateway_argv(), "clients", "--config", str(self.config), "--data-dir", str(self.data_dir), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    def register(self, identity: str, *, read: tuple[str, ...] = ("*",), write: tuple[str, ...] = ()) -> Credentials:
        """`sepa-gateway clients add IDENTITY --read ... --write ... --register`: its credentials."""
        rights = [option for graph in read for option in ("--read", graph)]
        rights += [option for graph in write for option in ("--write", graph)]
        done = self.clients("add", identity, *rights, "--register")
        if done.returncode != 0:
            raise RuntimeError(f"clients add {identity}: {done.stderr}")
        document = json.loads(done.stdout)
        return Credentials(document["client_id"], document["client_secret"])


def sensors_command(broker: Mosquitto, password_file: Path, *args: str) -> str:
    """`sepa-gateway sensors ...` on the broker's password file; what it printed."""
    command = [*gateway_argv(), "sensors", "--password-file", str(password_file), "--pid-file", str(broker.pid_file)]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"sensors {' '.join(args)}: {done.stderr}")
    return done.stdout


def new_login(broker: Mosquitto, password_file: Path, name: str) -> str:
    """`sepa-gateway sensors add NAME`; the password it printed."""
    (password,) = re.findall(r"^password: (\S+)$", sensors_command(broker, password_file, "add", name), re.MULTILINE)
    return password


def installed_toml(
    mqtt_port: int, password_file: Path, security_dir: Path, retention: tuple[int, float] | None = None
) -> str:
    """systemd/sepa-gateway.toml with the Mosquitto port (its listener for the gateway), the
    gateway's password file and the security directory of this run (the installed default is
    <data dir>/security; set, so that a gateway without a data directory keeps its certificate
    where the browser is told to trust it); and, for a benchmark, the retention (observations kept
    per sensor, seconds between prunes)."""
    text = INSTALLED_TOML.read_text(encoding="utf-8")
    text = re.sub(r'(?m)^dir = ""', f'dir = "{security_dir}"', text, count=1)
    if retention is not None:
        text = re.sub(r"(?m)^retain_count = [0-9]+", f"retain_count = {retention[0]}", text, count=1)
        text = re.sub(r"(?m)^prune_interval_s = [0-9.]+", f"prune_interval_s = {retention[1]}", text, count=1)
    head, mqtt_section = text.split("\n[mqtt]\n", 1)
    section, rest = mqtt_section.split("\n[", 1)
    section = re.sub(r"(?m)^port = 1884\b", f"port = {mqtt_port}", section)  # the gateway's own listener
    section = re.sub(r'(?m)^password_file = "[^"]*"', f'password_file = "{password_file}"', section)
    return f"{head}\n[mqtt]\n{section}\n[{rest}"


def unit_environment(unit: Path = INSTALLED_UNIT) -> dict[str, str]:
    """The `Environment=` variables of the installed unit (its malloc: LD_PRELOAD)."""
    lines = unit.read_text(encoding="utf-8").splitlines()
    pairs = (line.removeprefix("Environment=").partition("=") for line in lines if line.startswith("Environment="))
    return {name: value for name, _, value in pairs}


@contextlib.contextmanager
def installed_gateway(
    directory: Path, *, coap: bool = True, on_disk: bool = True, retention: tuple[int, float] | None = None
) -> Iterator[InstalledGateway]:
    """Mosquitto and `sepa-gateway run` as installed; both stopped on the way out (the gateway must
    exit 0 on SIGTERM). `on_disk=False`: an in-memory store (what the other benchmarks measure)."""
    problem = missing_tools()
    if problem:
        raise RuntimeError(problem)
    directory.mkdir(parents=True, exist_ok=True)
    passwords = directory / "mosquitto.passwd"
    passwords.touch(mode=0o600)
    broker = Mosquitto(directory, installed=passwords)
    broker.start()
    try:
        gateway_password = directory / "mqtt-password"
        gateway_password.write_text(new_login(broker, passwords, "sepa-gateway") + "\n")
        gateway_password.chmod(0o600)
        sensor_password = new_login(broker, passwords, SENSOR)
        # one login publishing for many devices, as a bridge would: granted their topics
        sensors_command(broker, passwords, "allow", SENSOR, "--topic", "gateway/#", "--topic", "plant/#")
        config = directory / "sepa-gateway.toml"
        data_dir = directory / "data"
        security_dir = data_dir / "security"
        assert broker.local_port is not None
        toml = installed_toml(broker.local_port, gateway_password, security_dir, retention)
        config.write_text(toml, encoding="utf-8")
        gateway = launch_gateway(
            config=config, data_dir=data_dir if on_disk else None, coap=coap, environment=unit_environment()
        )
        try:
            yield InstalledGateway(gateway, broker, config, data_dir, sensor_password)
        finally:
            code = gateway.stop()
            if code != 0:
                raise RuntimeError(f"gateway exited {code} on SIGTERM: {gateway.log()[-2000:]}")
    finally:
        broker.stop()
