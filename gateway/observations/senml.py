"""SenML JSON (RFC 8428): a pack of records, each a named value with base name, time and unit.

Each record becomes one reading. Its sensor is the mapping's sensor template with `{name}` the
record's full name (base name + name); its property is the record's own name when that names a
known property (`temperature`), else the property its unit implies (`Cel` -> gw:temperature), else
`urn:sepa-gateway:property:senml/<name>`. Times below 2**28 are relative to "now" (RFC 8428
§4.5.3) and, the gateway's clock being the engine's, are not kept as source times.
"""

from __future__ import annotations

from typing import Any

from gateway.observations.errors import PayloadError
from gateway.observations.extractors import Compiled, Extractor, Message, coerce, register_extractor
from gateway.observations.kinds import kind_for_unit, kind_named, unit_named
from gateway.observations.payloads import decode, number_of, parse_json, unix_us
from gateway.observations.reading import Reading
from gateway.observations.sources import DOT_SEGMENTS as _DOT_SEGMENTS
from gateway.observations.sources import MAX_NAME_BYTES, encode
from gateway.observations.targets import PROPERTY_PREFIX

_RELATIVE_LIMIT = 2**28
# A record's full name becomes a sensor IRI (and maybe a property IRI) kept in the store, the latest
# graph and the writer's caches: unbounded, one sensor publishing 60 KB names (on the one topic its
# login allows) grew the gateway by ~0.7 MB a reading, for good. Topics are bounded alike
# (adapters/mqtt/ingest.py MAX_TOPIC_BYTES). The same checks guard every template's captures
# (sources.name_problem); here they name the record.


def _senml(compiled: Compiled, message: Message) -> list[Reading]:
    document = parse_json(decode(message.payload))
    records = document if isinstance(document, list) else [document]
    base_name, base_time, base_unit, base_value = "", 0.0, None, 0.0
    readings: list[Reading] = []
    targets = compiled.targets
    assert targets is not None
    for position, record in enumerate(records):
        if not isinstance(record, dict):
            raise PayloadError(f"SenML record {position} is not a JSON object")
        if "bn" in record:
            base_name = _text(record["bn"], "bn", position)
        if "bt" in record:
            base_time = number_of(record["bt"])
        if "bu" in record:
            base_unit = _text(record["bu"], "bu", position)
        if "bv" in record:
            base_value = number_of(record["bv"])
        raw = _value(record, base_value, position)
        if raw is None:
            continue
        local = _text(record.get("n", ""), "n", position)
        name = base_name + local
        if not name:
            raise PayloadError(f"SenML record {position} has no name (n or bn)")
        if len(name) > MAX_NAME_BYTES // 4 and len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise PayloadError(f"SenML record {position}: its name is longer than {MAX_NAME_BYTES} bytes")
        if "." in name and _DOT_SEGMENTS.intersection(name.split("/")):
            # kept verbatim in the sensor's IRI: `senml/alice/../bob/temperature` would be bob's
            # sensor to anything downstream that normalises paths (RFC 3986 §5.2.4)
            raise PayloadError(f"SenML record {position}: a name may not have a '.' or '..' segment")
        code = record.get("u", base_unit) if not isinstance(raw, bool | str) else None  # units qualify numbers
        unit = None
        if code is not None:
            unit = unit_named(_text(code, "u", position))
            if unit is None:
                raise PayloadError(f"SenML record {position}: unknown unit {code!r}")
        kind = kind_named(local) if local else None
        if kind is None and unit is not None:
            kind = kind_for_unit(unit)
        if kind is None and local:
            kind = kind_named(name)
        prop = kind.iri if kind is not None else PROPERTY_PREFIX + "senml/" + encode(name)
        time = base_time + (number_of(record["t"]) if "t" in record else 0.0)
        time_us = unix_us(time) if abs(time) >= _RELATIVE_LIMIT else None
        values = {**message.captures, "name": name}
        value = coerce(raw, kind, compiled.words)
        if unit is None and kind is not None and not isinstance(value, bool | str):
            unit = kind.default_unit
        readings.append(
            message.reading(
                value,
                unit,
                time_us,
                len(readings),
                sensor=targets.sensor.fill(values),
                feature=targets.feature.fill(values),
                property=prop,
            )
        )
    return readings


def _text(value: Any, field: str, position: int) -> str:
    if not isinstance(value, str):
        raise PayloadError(f"SenML record {position}: {field} must be a string")
    return value


def _value(record: dict[str, Any], base_value: float, position: int) -> Any:
    if "v" in record:
        return number_of(record["v"]) + base_value
    if "vb" in record:
        if not isinstance(record["vb"], bool):
            raise PayloadError(f"SenML record {position}: vb must be true or false")
        return record["vb"]
    if "vs" in record:
        return _text(record["vs"], "vs", position)
    return None  # base-only records, sums and data values carry no reading


register_extractor("senml", Extractor(_senml, captures=("name",)))
