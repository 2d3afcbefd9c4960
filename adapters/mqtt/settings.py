"""Settings of the MQTT client, validated once so that a bad `[mqtt]` section fails at start-up with one clear line."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

PROTOCOLS = ("3.1.1", "5")
# the ready-made profiles `mqtt.profiles` may name, and their mappings (adapters/mqtt/profiles.py)
PROFILE_IDS = {
    "homie": ("homie-value", "homie-unit", "homie-description"),
    "zigbee2mqtt": ("zigbee2mqtt-bridge", "zigbee2mqtt"),
    "tasmota": ("tasmota",),
    "senml": ("senml",),
    "generic": ("gateway-generic",),
}


class MqttSettingsError(ValueError):
    """A setting that cannot work; the message names the setting and says what is expected."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """TLS towards the broker; the stdlib `ssl` module does the work through paho's `tls_set`.

    `ca` None means the system trust store. `cert` (with `key` unless the key is inside the cert file) is the
    client certificate for brokers that require one. `insecure` skips the host name check only (the chain is
    still verified): for brokers reached by an IP address their certificate does not name.
    """

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    insecure: bool = False


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """Everything the MQTT connection and the ingestor need; the lead maps the `[mqtt]` TOML section onto it.

    The defaults favour the delivery contract (persistent session, QoS 1, acknowledgement after commit).
    `receive_maximum` is the number of delivered but not yet acknowledged messages the gateway holds: MQTT 5
    sends it to the broker as Receive Maximum; MQTT 3.1.1 cannot negotiate it, so the broker's own limit
    (mosquitto `max_inflight_messages`, 20 by default) should be raised to the same value, or every batch
    is capped by it.
    """

    host: str = "localhost"
    port: int = 1883
    client_id: str = "sepa-gateway"
    protocol: str = "5"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: TlsSettings | None = None
    keepalive: int = 30
    qos: int = 1
    session_expiry_s: int = 7 * 24 * 3600
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    receive_maximum: int = 1000
    batch_max: int = 500
    # readings one update stores at most: a batch is cut at the message that would pass it (a SenML
    # pack of more is an update of its own; see MqttAdapter.commit)
    batch_max_readings: int = 1000
    batch_wait_ms: float = 2.0
    max_payload_bytes: int = 65536
    # readings a device may send a second while another device waits behind it (adapters.mqtt.shares); 0: no bound
    device_readings_per_s: float = 200.0
    # the same for all the topics one of the deployment's own mappings takes together; -1: device_readings_per_s
    mapping_readings_per_s: float = -1.0

    def __post_init__(self) -> None:
        problem = next(self._problems(), None)
        if problem is not None:
            raise MqttSettingsError(f"mqtt: {problem}")

    def _problems(self) -> Iterator[str]:
        if not self.host:
            yield "host must not be empty"
        if not 1 <= self.port <= 65535:
            yield f"port must be 1..65535, not {self.port}"
        if not self.client_id or len(self.client_id) > 128:
            yield "client_id must be 1-128 characters (it names the persistent session that keeps readings)"
        if self.protocol not in PROTOCOLS:
            yield f"protocol must be one of {', '.join(PROTOCOLS)}, not {self.protocol!r}"
        if self.password is not None and self.username is None:
            yield "password given without username (MQTT does not allow it)"
        if self.tls is not None and self.tls.key is not None and self.tls.cert is None:
            yield "tls.key given without tls.cert"
        if not 5 <= self.keepalive <= 65535:
            yield f"keepalive must be 5..65535 seconds, not {self.keepalive}"
        if self.qos not in (0, 1):
            yield f"qos must be 1 (at-least-once, the default) or 0 (readings may be lost), not {self.qos}"
        if not 0 < self.session_expiry_s <= 0xFFFFFFFF:
            yield (
                f"session_expiry_s must be 1..{0xFFFFFFFF}, not {self.session_expiry_s} "
                "(0 would drop the session, and the readings queued in it, at every disconnect)"
            )
        if not 0 < self.reconnect_min_s <= self.reconnect_max_s:
            yield (
                f"reconnect_min_s and reconnect_max_s must satisfy 0 < min <= max, "
                f"not {self.reconnect_min_s} and {self.reconnect_max_s}"
            )
        if self.batch_max < 1:
            yield f"batch_max must be >= 1, not {self.batch_max}"
        if not self.batch_max <= self.receive_maximum <= 65535:
            yield (
                f"receive_maximum must be batch_max ({self.batch_max})..65535, not {self.receive_maximum} "
                "(a batch can only fill up to the messages the broker may have unacknowledged)"
            )
        if not 1 <= self.batch_max_readings <= 100_000:
            yield f"batch_max_readings must be 1..100000, not {self.batch_max_readings}"
        if not 0 <= self.batch_wait_ms <= 10_000:
            yield f"batch_wait_ms must be 0..10000, not {self.batch_wait_ms}"
        if not 1 <= self.max_payload_bytes <= 268_435_455:
            yield f"max_payload_bytes must be 1..268435455 (the MQTT maximum), not {self.max_payload_bytes}"
        if not 0 <= self.device_readings_per_s <= 1_000_000:
            yield f"device_readings_per_s must be 0 (no bound)..1000000, not {self.device_readings_per_s}"
        if not (self.mapping_readings_per_s == -1 or 0 <= self.mapping_readings_per_s <= 1_000_000):
            yield (
                "mapping_readings_per_s must be -1 (as device_readings_per_s), 0 (no bound)..1000000, "
                f"not {self.mapping_readings_per_s}"
            )
