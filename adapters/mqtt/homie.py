"""Homie (5, and the `$unit` attribute topics of Homie 3/4): one property value per topic.

Values arrive on `homie/5/<device>/<node>/<property>` as plain text; the unit is not in the value
but in retained metadata, so the Mapper keeps a small per-topic state (`Message.units`, value topic
-> unit IRI) fed by two kinds of messages:

* `homie/5/<device>/<node>/<property>/$unit` (one unit symbol, the Homie 3/4 attribute);
* `homie/5/<device>/$description` (Homie 5's JSON description: nodes -> properties -> unit).

The units are kept per device and bounded (:mod:`gateway.observations.learned_units`). Being
retained, both reach the gateway when it subscribes, normally before the values. A value
whose unit is not known yet takes its property's default unit. Property ids naming a known
property (`temperature`) use it; others become `urn:sepa-gateway:property:homie/<id>`. A value
that is neither a number nor a boolean word is kept as text (Homie strings and enums).
"""

from __future__ import annotations

from gateway.observations.errors import PayloadError
from gateway.observations.extractors import Compiled, Extractor, Message, register_extractor
from gateway.observations.kinds import unit_named
from gateway.observations.payloads import decode, number_of, parse_json, shown
from gateway.observations.reading import Reading
from gateway.observations.targets import PROPERTY_PREFIX


def _value(compiled: Compiled, message: Message) -> list[Reading]:
    levels = message.topic.split("/")
    if any(level.startswith("$") for level in levels[2:]):
        return []  # device attributes ($state, $log, $alert...) are not property values
    text = decode(message.payload)
    if not text:
        return []  # an empty retained message clears the value: nothing was measured
    kind = message.resolved.kind
    value: float | bool | str
    if kind is not None and kind.boolean:
        value = compiled.words.parse(text)
    else:
        try:
            value = number_of(text)
        except PayloadError:
            if kind is not None:
                raise
            lowered = text.lower()
            value = lowered == "true" if lowered in ("true", "false") else text
    unit = message.units.get(message.topic) or compiled.targets.unit or (kind.default_unit if kind else None)  # type: ignore[union-attr]
    return [message.reading(value, unit, None, 0)]


def _unit(compiled: Compiled, message: Message) -> list[Reading]:
    symbol = decode(message.payload)
    value_topic = message.topic.rsplit("/", 1)[0]
    if not symbol:
        message.units.forget(value_topic)
        return []
    unit = unit_named(symbol)
    if unit is None:
        raise PayloadError(f"unknown Homie unit {shown(symbol)}")
    message.units.learn(value_topic.rsplit("/", 2)[0], value_topic, unit)
    return []


def _description(compiled: Compiled, message: Message) -> list[Reading]:
    document = parse_json(decode(message.payload))
    if not isinstance(document, dict):
        raise PayloadError("a Homie $description must be a JSON object")
    prefix = message.topic.rsplit("/", 1)[0]
    nodes = document.get("nodes", {})
    if not isinstance(nodes, dict):
        raise PayloadError("a Homie $description's nodes must be an object")
    learned: dict[str, str] = {}
    unknown: list[object] = []
    for node_id, node in nodes.items():
        properties = node.get("properties", {}) if isinstance(node, dict) else {}
        if not isinstance(properties, dict):
            continue
        for property_id, description in properties.items():
            symbol = description.get("unit") if isinstance(description, dict) else None
            unit = unit_named(symbol) if isinstance(symbol, str) else None
            if unit is None and symbol is not None:
                unknown.append(symbol)
            elif unit is not None and "/" not in node_id and "/" not in property_id:
                learned[f"{prefix}/{node_id}/{property_id}"] = unit
    # a description is the whole device: it replaces what the last one taught (not its `$unit` topics')
    owner = message.topic
    message.units.forget_device(owner)
    for topic, unit in learned.items():
        message.units.learn(owner, topic, unit)
    if unknown:  # the others are learned; these properties' readings go without a unit, so say so
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        raise PayloadError(f"unknown Homie unit {shown(str(unknown[0]))}{more} in the $description")
    return []


register_extractor("homie", Extractor(_value, wants_property=True, property_fallback=PROPERTY_PREFIX + "homie/{name}"))
register_extractor("homie-unit", Extractor(_unit, targets=False))
register_extractor("homie-description", Extractor(_description, targets=False))
