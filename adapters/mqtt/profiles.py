"""The ready-made mappings, on by default: Homie 5, Zigbee2MQTT, Tasmota, SenML, and `gateway/...`.

Gateway-minted IRIs follow one scheme (captures percent-encoded):

* sensors  `urn:sepa-gateway:sensor:<ecosystem>/<device>[/<node or sensor name>]`
* features `urn:sepa-gateway:feature:<ecosystem>/<device>` (the thing the device is attached to)
* properties are the gateway's own (gw:temperature, gw:relativeHumidity...; see kinds.py),
  or `urn:sepa-gateway:property:<ecosystem>/<name>` for names no known property matches.

The generic convention: publish a bare number to `gateway/<sensor>/<property>`, where `<property>`
is a known property name (temperature, humidity, pressure, illuminance, co2, voltage, current,
power, energy, dimming, soil_moisture, battery, count, or a boolean: presence, occupancy, contact,
motion, water_leak, state) and the number is in that property's default unit (°C, %RH, hPa, lx,
ppm, V, A, W, kWh, %, count); booleans take true/false, on/off, 1/0, open/closed, yes/no.
Profiles come after the config's mappings (order 1000+), so a config mapping for the same topic wins.
"""

from __future__ import annotations

from adapters.mqtt import homie, tasmota  # noqa: F401  (register the extractors the profiles use)
from gateway.observations.mapping import FieldMap, Mapping
from gateway.observations.vocabulary import URN

SENSOR = URN + "sensor:"
FEATURE = URN + "feature:"
PROFILE_ORDER = 1000

# Zigbee2MQTT exposes (https://www.zigbee2mqtt.io/guide/usage/exposes.html) the gateway maps;
# `voltage` is left out on purpose: battery devices report it in mV and plugs in V.
ZIGBEE2MQTT_FIELDS = (
    FieldMap("temperature", "temperature", "degC"),
    FieldMap("humidity", "relativeHumidity", "%RH"),
    FieldMap("pressure", "pressure", "hPa"),
    FieldMap("illuminance", "illuminance", "lx"),
    FieldMap("co2", "co2Concentration", "ppm"),
    FieldMap("power", "power", "W"),
    FieldMap("current", "current", "A"),
    FieldMap("energy", "energy", "kWh"),
    FieldMap("battery", "batteryLevel", "%"),
    FieldMap("soil_moisture", "soilMoisture", "%"),
    FieldMap("occupancy", "occupancy"),
    FieldMap("presence", "presence"),
    FieldMap("contact", "contact"),
    FieldMap("water_leak", "waterLeak"),
    FieldMap("state", "onOff"),
)


def default_profiles() -> list[Mapping]:
    """The profiles a default config enables, in matching order."""
    profiles = [
        Mapping(
            "homie-value",
            "homie/5/{device}/{node}/{property}",
            "homie",
            sensor=SENSOR + "homie/{device}/{node}",
            feature=FEATURE + "homie/{device}",
            property="{property}",
        ),
        Mapping("homie-unit", "homie/5/{device}/{node}/{property}/$unit", "homie-unit"),
        Mapping("homie-description", "homie/5/{device}/$description", "homie-description"),
        Mapping("zigbee2mqtt-bridge", "zigbee2mqtt/bridge/#", "ignore"),
        Mapping(
            "zigbee2mqtt",
            "zigbee2mqtt/{device}",
            "fields",
            sensor=SENSOR + "zigbee2mqtt/{device}",
            feature=FEATURE + "zigbee2mqtt/{device}",
            fields=ZIGBEE2MQTT_FIELDS,
        ),
        Mapping(
            "tasmota",
            "tele/{device}/SENSOR",
            "tasmota",
            sensor=SENSOR + "tasmota/{device}/{name}",
            feature=FEATURE + "tasmota/{device}",
        ),
        Mapping(
            "senml",
            "senml/{device}",
            "senml",
            sensor=SENSOR + "senml/{device}/{name}",
            feature=FEATURE + "senml/{device}",
        ),
        Mapping(
            "gateway-generic",
            "gateway/{sensor}/{property}",
            "number",
            sensor=SENSOR + "gateway/{sensor}",
            feature=FEATURE + "gateway/{sensor}",
            property="{property}",
        ),
    ]
    return [Mapping(**{**_fields(profile), "order": PROFILE_ORDER + index}) for index, profile in enumerate(profiles)]


def _fields(mapping: Mapping) -> dict[str, object]:
    return {name: getattr(mapping, name) for name in Mapping.__dataclass_fields__}
