"""Mappings declared in the config file: the `[[mqtt.mappings]]` array, checked entry by entry.

The TOML shape is documented in :mod:`gateway.observations.mapping`. Every problem is a
MappingError naming the entry (`mqtt.mappings[2] (id 'boiler')`), raised at start-up rather than
at the first message.
"""

from __future__ import annotations

from collections.abc import Mapping as MappingType
from typing import Any

from gateway.observations.compiler import compile_mapping
from gateway.observations.errors import MappingError
from gateway.observations.mapping import FieldMap, Mapping

_KEYS = {
    "id",
    "topic",
    "extract",
    "sensor",
    "property",
    "feature",
    "unit",
    "path",
    "pattern",
    "true_words",
    "false_words",
    "fields",
    "time_path",
    "order",
}
_FIELD_KEYS = {"key", "property", "unit"}


def mapping_from_config(entry: MappingType[str, Any], position: int) -> Mapping:
    """One `[[mqtt.mappings]]` table as a Mapping, checked; MappingError names the entry."""
    name = f"mqtt.mappings[{position}]"
    if not isinstance(entry, MappingType):
        raise MappingError(f"{name}: expected a table, got {type(entry).__name__}")
    if isinstance(entry.get("id"), str) and entry["id"]:
        name = f"{name} (id {entry['id']!r})"
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise MappingError(f"{name}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}")
    for required in ("id", "topic", "extract"):
        if required not in entry:
            raise MappingError(f"{name}: '{required}' is required")
    values: dict[str, Any] = {}
    for key in ("id", "topic", "extract", "sensor", "property", "feature", "unit", "path", "pattern", "time_path"):
        if key in entry:
            values[key] = _string(entry[key], name, key)
    for key in ("true_words", "false_words"):
        if key in entry:
            words = entry[key]
            if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
                raise MappingError(f"{name}: '{key}' must be a non-empty list of words")
            values[key] = tuple(words)
    if "order" in entry:
        if not isinstance(entry["order"], int) or isinstance(entry["order"], bool):
            raise MappingError(f"{name}: 'order' must be an integer")
        values["order"] = entry["order"]
    if "fields" in entry:
        values["fields"] = tuple(_field(item, f"{name}.fields[{index}]") for index, item in enumerate(entry["fields"]))
    mapping = Mapping(**values)
    try:
        compile_mapping(mapping)
    except MappingError as error:
        raise MappingError(f"{name}: {error}") from None
    return mapping


def mappings_from_config(entries: Any) -> list[Mapping]:
    """The `[[mqtt.mappings]]` array, each entry checked, ids unique."""
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise MappingError("mqtt.mappings must be an array of tables ([[mqtt.mappings]])")
    mappings = [mapping_from_config(entry, index) for index, entry in enumerate(entries)]
    seen: set[str] = set()
    for mapping in mappings:
        if mapping.id in seen:
            raise MappingError(f"mqtt.mappings: id {mapping.id!r} is used twice")
        seen.add(mapping.id)
    return mappings


def _string(value: Any, name: str, key: str) -> str:
    if not isinstance(value, str):
        raise MappingError(f"{name}: '{key}' must be a string, got {type(value).__name__}")
    return value


def _field(item: Any, name: str) -> FieldMap:
    if not isinstance(item, MappingType):
        raise MappingError(f"{name}: expected a table with key, property and unit")
    unknown = sorted(set(item) - _FIELD_KEYS)
    if unknown:
        raise MappingError(f"{name}: unknown key(s) {', '.join(unknown)}")
    if "key" not in item or "property" not in item:
        raise MappingError(f"{name}: 'key' and 'property' are required")
    unit = item.get("unit")
    return FieldMap(
        _string(item["key"], name, "key"),
        _string(item["property"], name, "property"),
        None if unit is None else _string(unit, name, "unit"),
    )
