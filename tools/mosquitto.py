"""A real mosquitto for the tests: our own process on a free port, never a system service."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from gateway.appliance import mqtt_acl
from gateway.appliance.commands.sensors import logins
from tools.launcher import free_port

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MISSING = (
    "mosquitto is not installed: the MQTT tests need a real broker, mosquitto_pub and mosquitto_passwd "
    "(apt-get install mosquitto mosquitto-clients; tests/run.sh installs them)"
)


def missing_tools() -> str | None:
    """Why the broker cannot run here, or None."""
    if not os.access(MOSQUITTO, os.X_OK) or not all(map(shutil.which, ("mosquitto_pub", "mosquitto_passwd"))):
        return MISSING
    return None


INSTALLED_CONF = Path(__file__).resolve().parents[1] / "systemd" / "mosquitto-conf.sh"


def installed_config(
    password_file: Path,
    listener: str,
    local_listener: str,
    tls: tuple[str, Path, Path] | None = None,
    lan_connections: int | None = None,
) -> str:
    """The Mosquitto configuration install.sh writes, rendered by the script it uses; with `tls`
    (listener, certificate, key), its optional TLS listener turned on as the installer does."""
    arguments = [str(password_file), listener, local_listener, *(str(part) for part in tls or ())]
    environment = {**os.environ, **({"LAN_CONNECTIONS": str(lan_connections)} if lan_connections else {})}
    return subprocess.run(
        [str(INSTALLED_CONF), *arguments], capture_output=True, text=True, check=True, env=environment
    ).stdout


class Mosquitto:
    """One broker with a persistence directory, so that sessions survive `restart`.

    The limits the gateway relies on are set as its documentation asks: unlimited queued messages (mosquitto
    drops beyond 1000 per client by default) and an in-flight window for MQTT 3.1.1 clients matching the
    gateway's receive_maximum (mosquitto's default of 20 caps each batch).
    """

    def __init__(
        self,
        directory: Path,
        listener: str = "",
        extra: str = "",
        installed: Path | None = None,
        installed_tls: tuple[Path, Path] | None = None,
        lan_max_connections: int | None = None,
    ) -> None:
        """`installed`: a password file, to run the listener exactly as systemd/install.sh writes it
        (systemd/mosquitto-sepa-gateway.conf, on a free port of 127.0.0.1) instead of an anonymous one."""
        self.directory = directory
        self.port = free_port()
        self.config = directory / "mosquitto.conf"
        self.log = directory / "mosquitto.log"
        self.pid_file = directory / "mosquitto.pid"  # what `sepa-gateway sensors` signals to reload logins
        (directory / "data").mkdir(exist_ok=True)
        head = f"listener {self.port} 127.0.0.1\n{listener or 'allow_anonymous true'}\n"
        self.tls_port = free_port() if installed_tls is not None else None
        self.local_port = free_port() if installed is not None else None  # the gateway's own listener
        if installed is not None:
            tls = (f"{self.tls_port} 127.0.0.1", *installed_tls) if installed_tls is not None else None
            local = f"{self.local_port} 127.0.0.1"
            # lan_max_connections: a test filling the LAN listener without 32,000 sockets
            head = installed_config(installed, f"{self.port} 127.0.0.1", local, tls, lan_max_connections)  # type: ignore[arg-type]
            if not mqtt_acl.acl_file(installed).exists():  # as the installer leaves it: the logins' ACL
                mqtt_acl.write_acl(installed, logins(installed))
        self.config.write_text(
            head + f"user {pwd.getpwuid(os.getuid()).pw_name}\n"
            "persistence true\n"
            f"persistence_location {directory / 'data'}/\n"
            f"log_dest file {self.log}\n"
            f"pid_file {self.pid_file}\n"
            "log_type error\nlog_type warning\nlog_type notice\n"
            "max_queued_messages 0\n"
            "max_inflight_messages 1000\n"
            f"{extra}\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until it listens (5 s); one that does not is killed before the error is
        raised: the caller's fixture never reaches its stop(), so it would outlive pytest."""
        self.process = subprocess.Popen([MOSQUITTO, "-c", str(self.config)], stderr=subprocess.PIPE)
        try:
            self._wait_listening(self.process)
        except BaseException:
            self.process.kill()
            self.process.wait()
            self.process = None
            raise

    def _wait_listening(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if process.poll() is not None:
                assert process.stderr is not None
                raise RuntimeError(f"mosquitto exited: {process.stderr.read().decode()} {self._log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"mosquitto did not listen on {self.port}: {self._log_tail()}")

    def stop(self) -> None:
        """SIGTERM: mosquitto saves its persistence file on the way out."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def _log_tail(self) -> str:
        return self.log.read_text()[-2000:] if self.log.exists() else ""

    def pub(self, topic: str, *messages: str, qos: int = 1, extra: tuple[str, ...] = ()) -> None:
        """Publish lines with mosquitto_pub (one message per line)."""
        subprocess.run(
            ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(self.port), "-q", str(qos), "-t", topic, "-l", *extra],
            input="\n".join(messages).encode() + b"\n",
            check=True,
            timeout=10,
        )


async def until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `predicate` on the event loop until it holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def paho_publish(port: int, topic: str, payloads: list[bytes], protocol: str = "5") -> None:
    """Publish QoS 1 messages with paho (blocking: run it in a thread), each acknowledged by the broker."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"pub-{uuid.uuid4().hex[:8]}",
        protocol=mqtt.MQTTv5 if protocol == "5" else mqtt.MQTTv311,
    )
    client.max_inflight_messages_set(100)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [client.publish(topic, payload, qos=1) for payload in payloads]
        for info in infos:
            info.wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()
