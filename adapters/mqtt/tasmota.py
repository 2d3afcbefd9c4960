"""Tasmota telemetry: `tele/<device>/SENSOR` with one JSON object per attached sensor.

`{"Time":"2026-11-22T10:00:00","AM2301":{"Temperature":21.5,"Humidity":40},"TempUnit":"C"}`
gives one reading per known key of each nested object (`ENERGY` included: Power, Voltage,
Current, Total). The sensor template's `{name}` is the nested object's name (AM2301, ENERGY).
Temperatures are in `TempUnit`, pressures in `PressureUnit`. Tasmota's `Time` has no zone: it is
read as UTC (set the device's `Timezone 0`, or it is off by the device's offset).
"""

from __future__ import annotations

from gateway.observations.errors import PayloadError
from gateway.observations.extractors import Compiled, Extractor, Message, coerce, json_time, register_extractor
from gateway.observations.kinds import kind_named, unit_named
from gateway.observations.payloads import decode, parse_json
from gateway.observations.reading import Reading
from gateway.observations.vocabulary import GW

_BY_UNIT_KEY = {GW + "temperature": "TempUnit", GW + "dewPoint": "TempUnit", GW + "pressure": "PressureUnit"}
# Keys that look like property names but are not measurements of that property.
_SKIPPED = {"id"}


def _tasmota(compiled: Compiled, message: Message) -> list[Reading]:
    document = parse_json(decode(message.payload))
    if not isinstance(document, dict):
        raise PayloadError("expected a JSON object")
    targets = compiled.targets
    assert targets is not None
    time_us = json_time(compiled, document, message.arrival_us)
    readings: list[Reading] = []
    for name, values in document.items():
        if not isinstance(values, dict):
            continue
        captures = {**message.captures, "name": name}
        sensor = targets.sensor.fill(captures)
        feature = targets.feature.fill(captures)
        for key, raw in values.items():
            kind = kind_named(key)
            if kind is None or key.lower() in _SKIPPED or raw is None or isinstance(raw, dict | list):
                continue
            unit = kind.default_unit
            unit_key = _BY_UNIT_KEY.get(kind.iri)
            if unit_key is not None and unit_key in document:
                symbol = document[unit_key]
                unit = unit_named(symbol) if isinstance(symbol, str) else None
                if unit is None:
                    raise PayloadError(f"{unit_key} {symbol!r} is not a known unit")
            try:
                value = coerce(raw, kind, compiled.words)
            except PayloadError as error:
                raise PayloadError(f"{name}.{key}: {error}") from None
            readings.append(
                message.reading(value, unit, time_us, len(readings), sensor=sensor, feature=feature, property=kind.iri)
            )
    return readings


register_extractor("tasmota", Extractor(_tasmota, captures=("name",)))
