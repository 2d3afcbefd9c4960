"""The MQTT adapter as a plug-in of the appliance: the `[mqtt]` section, its checks, and the adapter
built from it (settings, mappings, profiles, actuators). gateway.appliance.plugins says why plug-ins.

The adapter itself (adapter.py) knows nothing of the TOML file; this module is the only one that
does. `check` runs when the config is validated, so a bad section is one line at start-up (exit 2).
It needs neither paho nor the client: the adapter is imported by `build_adapter` only, so that
`sepa-gateway check-config` (the installer runs it at every install and upgrade) does not load them.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from adapters.mqtt.actuators import Actuator, ActuatorError
from adapters.mqtt.settings import PROFILE_IDS, MqttSettings, MqttSettingsError, TlsSettings
from broker.api import write_file
from gateway.appliance.config import ConfigError, is_file
from gateway.appliance.plugins import AdapterContext
from gateway.observations import Mapping, MappingError, mappings_from_config

if TYPE_CHECKING:
    from adapters.mqtt.adapter import MqttAdapter
    from gateway.client import SepaClient
    from gateway.observations.writer import ObservationWriter


@dataclass
class MqttConfig:
    enabled: bool = True  # the MQTT adapter: sensor readings in, actuator commands out
    host: str = "localhost"
    port: int = 1883
    client_id: str = ""  # names the persistent session; empty: sepa-gateway-<gateway id>-<random, kept in the data dir>
    protocol: str = "5"  # "5" or "3.1.1"
    username: str = ""
    password: str = ""  # never logged
    password_file: str = ""  # or the password in this file (the installer writes the gateway's own login here)
    tls: bool = False  # TLS towards the broker (port 8883 usually)
    tls_ca: str = ""  # CA file; empty: the system trust store
    tls_cert: str = ""  # client certificate, for brokers that require one
    tls_key: str = ""
    keepalive: int = 30
    receive_maximum: int = 1000  # readings held unacknowledged (MQTT 5 Receive Maximum)
    batch_max: int = 500  # messages committed by one update at most
    batch_max_readings: int = 1000  # readings committed by one update at most (a larger SenML pack alone)
    batch_wait_ms: float = 2.0  # how long the first reading of a batch waits for company
    max_payload_bytes: int = 65536  # larger payloads are counted and dropped
    device_readings_per_s: float = 200.0  # a device's share while others wait (adapters.mqtt.shares); 0: none
    mapping_readings_per_s: float = -1.0  # all the topics of one of your mappings together; -1: as a device's
    profiles: list = field(default_factory=lambda: ["homie", "zigbee2mqtt", "tasmota", "senml", "generic"])
    mappings: list = field(default_factory=list)  # [[mqtt.mappings]]: topic -> observation (see the TOML file)
    actuators: list = field(default_factory=list)  # [[mqtt.actuators]]: subscription -> MQTT publish


CLIENT_ID_FILE = "mqtt-client-id"  # in the data directory: the random part of the derived client id
SUFFIX_BYTES = 16  # of that random part: 128 bits no login can guess (see client_id)


def client_id(config: MqttConfig, gateway_id: str, data_dir: str) -> str:
    """The configured client id, else one unique to this gateway and stable across its restarts.

    Why: the client id names the persistent session that keeps readings sent while the gateway
    restarts, and two clients with one id take the session from each other in an endless loop (two
    gateways on one broker: 442 reconnects in 6 minutes, each taking the other's readings). So it is
    the gateway id and a random suffix kept in the data directory (the session belongs with the
    store the readings go to). Not a hash of the directory's path: two Raspberry Pis installed alike
    have the same path, and often the same host name (the default gateway id). An in-memory store
    loses everything at a restart anyway: a fresh suffix then.

    The suffix is 128 random bits. Why: Mosquitto lets any login take a client id that is connected
    (2.0.11, measured: a sensor login connecting with the gateway's id closed the gateway's connection,
    and with a clean start it would drop the session and the readings queued in it); its ACL cannot
    reserve an id. With 32 bits, a LAN host with one sensor password, trying 1,745 ids a second on one
    connection at a time (measured on the 2-core test machine), finds it in 14 days on average, fewer
    with more connections; with 128 bits, never. A suffix of 8 digits kept by an older version is used
    as it is: a new one would leave the readings queued in its session behind.
    """
    if config.client_id:
        return config.client_id
    name = re.sub(r"[^A-Za-z0-9_-]", "-", gateway_id)[:64] or "gateway"
    return f"sepa-gateway-{name}-{_store_suffix(data_dir) if data_dir else secrets.token_hex(SUFFIX_BYTES)}"


def _store_suffix(data_dir: str) -> str:
    """32 hex digits made once for this data directory and kept in it (written atomically and durably);
    8 kept by an older version are used as they are.

    Durably: written, renamed, never synced (strace of a first start), a power cut in the next
    seconds left no file or an empty one (a new file's data waits for writeback), and the next
    start made a new suffix without a word: a new session, and the readings Mosquitto had queued
    in the old one, acknowledged to their sensors, were never delivered."""
    path = Path(data_dir) / CLIENT_ID_FILE
    try:
        kept = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        kept = ""
    except OSError as error:
        raise ConfigError(f"mqtt: cannot read the client id kept in {path}: {error.strerror}") from None
    if re.fullmatch(r"[0-9a-f]{8}|[0-9a-f]{32}", kept):
        return kept
    suffix = secrets.token_hex(SUFFIX_BYTES)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, (suffix + "\n").encode())
    except OSError as error:
        raise ConfigError(f"mqtt: cannot keep the client id in {path}: {error.strerror}") from None
    return suffix


def settings(config: MqttConfig, derived_client_id: str = "sepa-gateway") -> MqttSettings:
    tls = None
    if config.tls:
        tls = TlsSettings(ca=config.tls_ca or None, cert=config.tls_cert or None, key=config.tls_key or None)
    return MqttSettings(
        host=config.host,
        port=config.port,
        client_id=config.client_id or derived_client_id,
        protocol=config.protocol,
        username=config.username or None,
        password=config.password or None,
        tls=tls,
        keepalive=config.keepalive,
        receive_maximum=config.receive_maximum,
        batch_max=config.batch_max,
        batch_max_readings=config.batch_max_readings,
        batch_wait_ms=config.batch_wait_ms,
        max_payload_bytes=config.max_payload_bytes,
        device_readings_per_s=config.device_readings_per_s,
        mapping_readings_per_s=config.mapping_readings_per_s,
    )


def check(config: MqttConfig) -> tuple[MqttSettings, list[Mapping], list[Actuator]]:
    """Everything the adapter needs from the section, or ConfigError naming what is wrong."""
    try:
        mqtt_settings = settings(config)
        mappings = mappings_from_config(config.mappings)
        actuators = [Actuator.from_config(entry, position) for position, entry in enumerate(config.actuators)]
    except (MqttSettingsError, MappingError, ActuatorError) as error:
        raise ConfigError(str(error)) from None
    if config.tls and config.enabled:  # the files of a section turned off may come later
        _check_tls_files(config)
    if not all(isinstance(name, str) for name in config.profiles):  # [[]] was a TypeError traceback
        raise ConfigError(f"mqtt.profiles must be a list of profile names (known: {', '.join(PROFILE_IDS)})")
    unknown = [name for name in config.profiles if name not in PROFILE_IDS]
    if unknown:
        raise ConfigError(f"mqtt.profiles: unknown {', '.join(map(repr, unknown))} (known: {', '.join(PROFILE_IDS)})")
    return mqtt_settings, mappings, actuators


def _check_tls_files(config: MqttConfig) -> None:
    """Why: a missing tls_ca passed check-config, and `run` then served its gates and died at the
    MQTT start with a 45-line traceback, restarted by systemd in a loop."""
    for name in ("tls_ca", "tls_cert", "tls_key"):
        path = getattr(config, name)
        if path and not is_file(path):
            raise ConfigError(f"mqtt.{name}: no such file {path}")


def password(config: MqttConfig) -> str:
    """The broker password: `password`, else the first line of `password_file` (read at start-up only,
    so that validating a configuration never needs the secret)."""
    if not config.password_file:
        return config.password
    try:
        return Path(config.password_file).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ConfigError(f"mqtt.password_file: cannot read {config.password_file}: {error.strerror}") from None


def build_adapter(
    config: MqttConfig,
    client: SepaClient,
    gateway_id: str,
    data_dir: str = "",
    writer: ObservationWriter | None = None,
) -> MqttAdapter:
    from adapters.mqtt.adapter import MqttAdapter  # the runtime: see the module's docstring

    _, mappings, actuators = check(config)
    mqtt_settings = replace(
        settings(config, client_id(config, gateway_id, data_dir)), password=password(config) or None
    )
    return MqttAdapter(
        client,
        mqtt_settings,
        mappings=mappings,
        profile_names=config.profiles,
        actuators=actuators,
        gateway=gateway_id,
        writer=writer,
    )


class MqttPlugin:
    """The entry point `mqtt` of the `sepa_gateway.adapters` group (pyproject.toml)."""

    name = "mqtt"
    section = MqttConfig

    def check(self, section: MqttConfig) -> None:
        check(section)

    def build(self, section: MqttConfig, context: AdapterContext) -> MqttAdapter:
        return build_adapter(section, context.client, context.gateway_id, context.data_dir, context.observations)


PLUGIN = MqttPlugin()
