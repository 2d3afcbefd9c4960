"""The `[mqtt]` section turned into the MQTT adapter: settings, mappings, profiles, actuators.

Why here and not in adapters/: the adapter knows nothing of the TOML file; the appliance wires it.
`check` runs when the config is validated, so a bad section is one line at start-up (exit 2).
"""

from __future__ import annotations

from adapters.mqtt.actuators import Actuator, ActuatorError
from adapters.mqtt.adapter import PROFILE_IDS, MqttAdapter
from adapters.mqtt.settings import MqttSettings, MqttSettingsError, TlsSettings
from gateway.client import SepaClient
from gateway.config import ConfigError, MqttConfig
from gateway.observations import Mapping, MappingError, mappings_from_config


def settings(config: MqttConfig) -> MqttSettings:
    tls = None
    if config.tls:
        tls = TlsSettings(ca=config.tls_ca or None, cert=config.tls_cert or None, key=config.tls_key or None)
    return MqttSettings(
        host=config.host,
        port=config.port,
        client_id=config.client_id,
        protocol=config.protocol,
        username=config.username or None,
        password=config.password or None,
        tls=tls,
        keepalive=config.keepalive,
        receive_maximum=config.receive_maximum,
        batch_max=config.batch_max,
        batch_wait_ms=config.batch_wait_ms,
        max_payload_bytes=config.max_payload_bytes,
    )


def check(config: MqttConfig) -> tuple[MqttSettings, list[Mapping], list[Actuator]]:
    """Everything the adapter needs from the section, or ConfigError naming what is wrong."""
    try:
        mqtt_settings = settings(config)
        mappings = mappings_from_config(config.mappings)
        actuators = [Actuator.from_config(entry, position) for position, entry in enumerate(config.actuators)]
    except (MqttSettingsError, MappingError, ActuatorError) as error:
        raise ConfigError(str(error)) from None
    unknown = [name for name in config.profiles if name not in PROFILE_IDS]
    if unknown:
        raise ConfigError(f"mqtt.profiles: unknown {', '.join(map(repr, unknown))} (known: {', '.join(PROFILE_IDS)})")
    return mqtt_settings, mappings, actuators


def build_adapter(config: MqttConfig, client: SepaClient, gateway_id: str) -> MqttAdapter:
    mqtt_settings, mappings, actuators = check(config)
    return MqttAdapter(
        client,
        mqtt_settings,
        mappings=mappings,
        profile_names=config.profiles,
        actuators=actuators,
        gateway=gateway_id,
    )
