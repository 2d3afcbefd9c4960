"""Compiling a Mapping: every check that does not need a message, done once.

Filter syntax, templates, units, JSON paths and regular expressions are checked here, so a bad
mapping is a MappingError when it is loaded (from the config or from the mappings graph), never a
failure on the first message.
"""

from __future__ import annotations

from functools import lru_cache

import regex

from gateway.observations import senml  # noqa: F401  (registers the "senml" extractor)
from gateway.observations.errors import MappingError, PayloadError
from gateway.observations.extractors import Compiled, extractor_named, extractor_names
from gateway.observations.kinds import Kind
from gateway.observations.mapping import FieldMap, Mapping
from gateway.observations.payloads import BooleanWords, PathStep, compile_path
from gateway.observations.sources import SourceFilter
from gateway.observations.targets import PropertyRef, Targets, unit_iri

COMPILED_CACHE_SIZE = 16_384


@lru_cache(maxsize=COMPILED_CACHE_SIZE)
def compile_mapping(mapping: Mapping) -> Compiled:
    """Check a mapping and build its extractor; MappingError says what is wrong.

    Cached (a Mapping is a frozen value, a Compiled is never changed): an adapter compiles every
    mapping of the mappings graph twice at each change of that graph (to check them, then in the
    new Mapper), and with 10,000 mappings written there that was ~0.45 s of the event loop per
    change, with every HTTP request waiting. A mapping that does not compile is not cached; a
    compiled one is ~4.5 KB, so the cache holds ~74 MB at most, reached only by that many distinct
    mappings written over time.
    """
    if not mapping.id:
        raise MappingError("a mapping needs a non-empty id")
    extractor = extractor_named(mapping.extract)
    if extractor is None:
        raise MappingError(f"unknown extract {mapping.extract!r}; expected one of {', '.join(extractor_names())}")
    topic_filter = SourceFilter(mapping.topic)
    words = BooleanWords(mapping.true_words, mapping.false_words)
    available = (*topic_filter.captures, *extractor.captures)
    targets: Targets | None = None
    if extractor.targets:
        targets = Targets(
            mapping.sensor,
            mapping.feature,
            mapping.property if extractor.wants_property else None,
            mapping.unit,
            available,
            topic_filter.captures,
            extractor.property_fallback,
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
        extractor.run,
    )


def _pattern(mapping: Mapping) -> regex.Pattern[str]:
    if not mapping.pattern:
        raise MappingError("extract 'regex' needs a 'pattern'")
    try:
        pattern = regex.compile(mapping.pattern)
    except (regex.error, ValueError) as error:
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
