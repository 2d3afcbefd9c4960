"""Compiling a Mapping: every check that does not need a message, done once.

Filter syntax, templates, units, JSON paths and regular expressions are checked here, so a bad
mapping is a MappingError when it is loaded (from the config or from the mappings graph), never a
failure on the first message.
"""

from __future__ import annotations

import re

from gateway.observations import homie, senml, tasmota
from gateway.observations.errors import MappingError, PayloadError
from gateway.observations.extractors import Compiled, Run, generic_runners
from gateway.observations.kinds import Kind
from gateway.observations.mapping import EXTRACTORS, FieldMap, Mapping
from gateway.observations.payloads import BooleanWords, PathStep, compile_path
from gateway.observations.targets import PROPERTY_PREFIX, PropertyRef, Targets, unit_iri
from gateway.observations.topics import TopicFilter

_RUNNERS: dict[str, Run] = {**generic_runners(), **senml.RUNNERS, **tasmota.RUNNERS, **homie.RUNNERS}
# Placeholders an extractor fills from the payload (a SenML record name, a Tasmota sensor name).
_EXTRA_CAPTURES = {"senml": ("name",), "tasmota": ("name",)}
_WITH_TARGETS = {"number", "boolean", "json", "regex", "fields", "senml", "tasmota", "homie"}
_WITH_PROPERTY = {"number", "boolean", "json", "regex", "homie"}


def compile_mapping(mapping: Mapping) -> Compiled:
    """Check a mapping and build its extractor; MappingError says what is wrong."""
    if not mapping.id:
        raise MappingError("a mapping needs a non-empty id")
    if mapping.extract not in EXTRACTORS:
        raise MappingError(f"unknown extract {mapping.extract!r}; expected one of {', '.join(EXTRACTORS)}")
    topic_filter = TopicFilter(mapping.topic)
    words = BooleanWords(mapping.true_words, mapping.false_words)
    available = (*topic_filter.captures, *_EXTRA_CAPTURES.get(mapping.extract, ()))
    targets: Targets | None = None
    if mapping.extract in _WITH_TARGETS:
        wants_property = mapping.extract in _WITH_PROPERTY
        fallback = PROPERTY_PREFIX + "homie/{name}" if mapping.extract == "homie" else None
        targets = Targets(
            mapping.sensor,
            mapping.feature,
            mapping.property if wants_property else None,
            mapping.unit,
            available,
            topic_filter.captures,
            fallback,
        )
    path = compile_path(mapping.path) if mapping.path else None
    if mapping.extract == "json" and path is None:
        raise MappingError("extract 'json' needs a 'path'")
    pattern = _pattern(mapping) if mapping.extract == "regex" else None
    if mapping.fields and mapping.extract != "fields":
        raise MappingError("'fields' apply only to extract 'fields'")
    return Compiled(
        mapping,
        topic_filter,
        targets,
        words,
        path,
        compile_path(mapping.time_path) if mapping.time_path else None,
        pattern,
        tuple(_field(item, available) for item in mapping.fields),
        _RUNNERS[mapping.extract],
    )


def _pattern(mapping: Mapping) -> re.Pattern[str]:
    if not mapping.pattern:
        raise MappingError("extract 'regex' needs a 'pattern'")
    try:
        pattern = re.compile(mapping.pattern)
    except re.error as error:
        raise MappingError(f"pattern {mapping.pattern!r}: {error}") from None
    if "value" not in pattern.groupindex:
        raise MappingError(f"pattern {mapping.pattern!r} needs a named group (?P<value>...)")
    return pattern


def _field(
    item: FieldMap, available: tuple[str, ...]
) -> tuple[str, tuple[PathStep, ...], str, Kind | None, str | None]:
    ref = PropertyRef(item.property, (), f"field {item.key!r}: property")
    try:
        prop, kind = ref.resolve({})
    except (KeyError, PayloadError):
        raise MappingError(f"field {item.key!r}: a field's property cannot use topic captures") from None
    return item.key, compile_path(item.key), prop, kind, unit_iri(item.unit, f"field {item.key!r}: unit")
