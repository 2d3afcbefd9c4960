"""The CoAP adapter as a plug-in of the appliance: the `[coap]` section, its checks, the adapter.

Why the adapter is imported in `build` only: checking a section (`sepa-gateway check-config`, which
the installer runs at every install and upgrade) needs none of aiocoap, the client or the broker's
pipeline; the checks use the modules that hold what they check (targets.py, query_checks.py,
CoapActuator.from_config) and none of them imports a network library.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from adapters.coap.actuators import ActuatorError, CoapActuator
from adapters.coap.query_checks import QueryLimits, configured_queries
from adapters.coap.targets import ObserveError, ObserveTarget, observe_from_config
from gateway.appliance.config import ConfigError
from gateway.appliance.oscore_sensors import OSCORE_DIR
from gateway.appliance.plugins import AdapterContext
from gateway.observations import Mapping, MappingError, mappings_from_config

if TYPE_CHECKING:
    from adapters.coap.adapter import CoapAdapter


@dataclass
class CoapConfig:
    enabled: bool = True  # the CoAP adapter: sensor readings in over UDP (RFC 7252)
    # every address, IPv6 and IPv4; with [security] on, peers off this board must authenticate. Not
    # named and [security] off: where the plain gates listen (gateway.appliance.config.coap_host_of)
    host: str = "::"
    port: int = 5683
    max_payload_bytes: int = 65536  # larger payloads (block-wise ones too) get 4.13
    batch_max: int = 500  # readings committed by one update at most
    # requests from the network aiocoap reads in any 247 s (it keeps ~2 KB of each that long, and the
    # request: one of N KB counts 1 + N); past it dropped
    network_requests_max: int = 20_000
    # ...of which each OSCORE sensor has this many of its own first, so that junk cannot keep it out
    network_reserve_per_sensor: int = 1_000
    mappings: list = field(default_factory=list)  # [[coap.mappings]]: resource path -> observation (as MQTT topics)
    # sensors' OSCORE credentials (`sepa-gateway sensors add NAME --coap`); empty: <store.data_dir>/coap-sensors
    oscore_dir: str = ""
    # [[coap.subscriptions]]: name, sparql (SELECT or ASK) -> the observable resource /q/<name> (GET, Observe)
    subscriptions: list = field(default_factory=list)
    max_created_subscriptions: int = 100  # created by POST /q and alive at once; past it 5.03
    max_subscription_bytes: int = 65536  # the SPARQL of one POSTed subscription; past it 4.13
    max_observers: int = 1000  # observations of /q/<name> at once; past it 5.03
    max_observers_per_peer: int = 100  # ...by one network peer (OSCORE sensor, else address); past it 5.03
    observe: list = field(default_factory=list)  # [[coap.observe]]: uri = "coap://…", source = path the mappings match
    observe_margin_s: float = 5.0  # an observation silent for its Max-Age plus this is lost: register again
    observe_backoff_max_s: float = 30.0  # failed registrations are retried after 1 s, doubling up to this
    actuators: list = field(default_factory=list)  # [[coap.actuators]]: subscription -> confirmable PUT to coap://


def check(config: CoapConfig) -> list[Mapping]:
    try:
        ipaddress.ip_address(config.host)
    except ValueError:
        raise ConfigError(f"coap.host: {config.host!r} is not an IP address") from None
    if not 0 <= config.port <= 65535:
        raise ConfigError("coap.port must be between 0 and 65535")
    if not 1 <= config.max_payload_bytes <= 16 << 20:
        raise ConfigError("coap.max_payload_bytes must be between 1 and 16 MiB")
    if not 1 <= config.batch_max <= 10_000:
        raise ConfigError("coap.batch_max must be between 1 and 10000")
    if not 1 <= config.network_requests_max <= 10_000_000:
        raise ConfigError("coap.network_requests_max must be between 1 and 10000000")
    if not 0 <= config.network_reserve_per_sensor <= 100_000:
        raise ConfigError("coap.network_reserve_per_sensor must be between 0 and 100000")
    if not 0 <= config.max_created_subscriptions <= 10_000:
        raise ConfigError("coap.max_created_subscriptions must be between 0 and 10000")
    if not 1 <= config.max_subscription_bytes <= 1 << 20:
        raise ConfigError("coap.max_subscription_bytes must be between 1 and 1 MiB")
    if not 0 <= config.max_observers <= 100_000:
        raise ConfigError("coap.max_observers must be between 0 and 100000")
    if not 0 <= config.max_observers_per_peer <= 100_000:
        raise ConfigError("coap.max_observers_per_peer must be between 0 and 100000")
    try:
        configured_queries(config.subscriptions)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    try:
        return mappings_from_config(config.mappings)
    except MappingError as error:
        raise ConfigError(f"coap.mappings: {error}") from None


def check_client(config: CoapConfig) -> tuple[list[ObserveTarget], list[CoapActuator]]:
    """The gateway as a CoAP client: the resources it observes and its actuators."""
    if not 0 <= config.observe_margin_s <= 3600:
        raise ConfigError("coap.observe_margin_s must be between 0 and 3600")
    if not 1 <= config.observe_backoff_max_s <= 3600:
        raise ConfigError("coap.observe_backoff_max_s must be between 1 and 3600")
    try:
        actuators = [CoapActuator.from_config(entry, position) for position, entry in enumerate(config.actuators)]
        return observe_from_config(config.observe), actuators
    except (ObserveError, ActuatorError) as error:
        raise ConfigError(str(error)) from None


class CoapPlugin:
    """The entry point `coap` of the `sepa_gateway.adapters` group (pyproject.toml)."""

    name = "coap"
    section = CoapConfig

    def check(self, section: CoapConfig) -> None:
        check(section)
        check_client(section)

    def build(self, section: CoapConfig, context: AdapterContext) -> CoapAdapter:
        from adapters.coap.adapter import CoapAdapter  # the runtime: see the module's docstring

        oscore_dir = section.oscore_dir or (str(Path(context.data_dir) / OSCORE_DIR) if context.data_dir else "")
        observe, actuators = check_client(section)
        return CoapAdapter(
            context.client,
            context.observations,
            host=section.host,
            port=section.port,
            mappings=check(section),
            secure=context.secure,
            max_payload_bytes=section.max_payload_bytes,
            batch_max=section.batch_max,
            network_requests_max=section.network_requests_max,
            reserve_per_sensor=section.network_reserve_per_sensor,
            oscore_dir=Path(oscore_dir) if oscore_dir else None,
            peer_client=context.peer_client,
            subscriptions=configured_queries(section.subscriptions),
            query_limits=QueryLimits(
                section.max_created_subscriptions,
                section.max_subscription_bytes,
                section.max_observers,
                section.max_observers_per_peer,
            ),
            observe=observe,
            observe_margin_s=section.observe_margin_s,
            observe_backoff_max_s=section.observe_backoff_max_s,
            actuators=actuators,
        )


PLUGIN = CoapPlugin()
