"""The generic extractors (number, boolean, json, regex, fields) and what every extractor shares.

Each extractor reads the whole payload first and builds every reading before returning any, so a
bad payload raises PayloadError and yields nothing (never a partial set of readings). Work that
does not depend on the message (regex compilation, JSON path parsing, template checks) is done
in :mod:`gateway.observations.compiler`, once per mapping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import regex

from gateway.observations.errors import PayloadError
from gateway.observations.kinds import Kind, kind_named
from gateway.observations.learned_units import LearnedUnits
from gateway.observations.mapping import Mapping
from gateway.observations.payloads import (
    BooleanWords,
    PathStep,
    decode,
    follow,
    not_ahead,
    number_of,
    parse_json,
    parse_number,
    shown,
    timestamp_us,
)
from gateway.observations.reading import Reading
from gateway.observations.sources import SourceFilter
from gateway.observations.targets import Resolved, Targets

TIME_KEYS = ("time", "Time", "timestamp", "ts", "last_seen")
# A mapping's pattern comes from whoever may write the mappings graph: a catastrophic one (`(a+)+$`
# style) backtracks exponentially in the payload's length, and one MQTT message froze the gateway
# for 48 s with Python's re. The `regex` module stops a match at a time limit (and avoids many such
# blow-ups outright); past it the payload is refused like any other that does not match.
REGEX_TIME_LIMIT_S = 0.05
# ... and a mapping's pattern takes at most this much of each second, all payloads together: 5,400
# payloads of 80 ms each (the limit overshoots) in 5 s froze the gateway, the event loop matching
# them one after another (every sensor's readings waited a minute and more). Past it, the payloads
# of that mapping are refused (counted) until the next second.
REGEX_BUDGET_S = 0.1
# ... and every mapping's pattern together takes at most this much of each second. Why: the budgets
# of several mappings added up. 20 mappings of a catastrophic pattern, written by a client with write
# rights and each POSTed to by coap-client back to back, held a client asking back to back 1.18 s
# (median; 1.63 s max, 13 answers in 8 s) against 0.007 s with one such mapping (2026-12-07, load 8).
# While an abuse spends it, the payloads of every regex mapping are refused (counted) until the next
# second: a client able to write mappings can stop them anyway, and the others' readings go on.
REGEX_TOTAL_BUDGET_S = 0.2


@dataclass(slots=True)
class RegexBudget:
    """The time patterns took in the current second: one mapping's (see REGEX_BUDGET_S), or every
    mapping's (:data:`ALL_PATTERNS`, REGEX_TOTAL_BUDGET_S)."""

    limit_s: float = REGEX_BUDGET_S
    spender: str = "the pattern {pattern!r} took its"
    second: int = -1
    spent: float = 0.0

    def check(self, pattern: str) -> None:
        """Raise PayloadError while this second's budget is spent."""
        second = int(time.monotonic())
        if second != self.second:
            self.second, self.spent = second, 0.0
        elif self.spent >= self.limit_s:
            spender = self.spender.format(pattern=pattern)
            raise PayloadError(f"{spender} {self.limit_s * 1000:g} ms of this second: payload not matched")


# the process's patterns share one event loop, so one budget for them all
ALL_PATTERNS = RegexBudget(REGEX_TOTAL_BUDGET_S, "the mappings' patterns (this one {pattern!r}) took their")


@dataclass(slots=True)
class Message:
    """One message being mapped: what every extractor needs to build readings."""

    topic: str
    captures: dict[str, str]
    payload: bytes
    arrival_us: int
    resolved: Resolved
    units: LearnedUnits  # the Mapper's learned units per value topic (Homie `$unit`), shared
    mapping: str = ""  # the id of the mapping reading it

    def reading(
        self,
        value: float | bool | str,
        unit: str | None,
        time_us: int | None,
        index: int,
        *,
        sensor: str | None = None,
        property: str | None = None,
        feature: str | None = None,
    ) -> Reading:
        resolved = self.resolved
        if time_us is not None:
            time_us = not_ahead(time_us, self.arrival_us)  # every extractor's times: SenML, JSON, yours
        return Reading(
            sensor or resolved.sensor,
            property or resolved.property,
            feature or resolved.feature,
            value,
            None if isinstance(value, bool | str) else unit,
            self.topic,
            time_us,
            f"{self.topic}|{self.arrival_us}|{index}",
            self.mapping,
        )


Run = Callable[["Compiled", Message], list[Reading]]


@dataclass(frozen=True, slots=True)
class Compiled:
    """A checked mapping, ready to run against matching messages."""

    mapping: Mapping
    filter: SourceFilter
    targets: Targets | None
    words: BooleanWords
    path: tuple[PathStep, ...] | None
    time_path: tuple[PathStep, ...] | None
    pattern: regex.Pattern[str] | None
    fields: tuple[tuple[str, tuple[PathStep, ...], str, Kind | None, str | None], ...]
    run: Run
    regex_budget: RegexBudget = field(default_factory=RegexBudget)


def coerce(value: Any, kind: Kind | None, words: BooleanWords, want: str = "auto") -> float | bool:
    """A raw value as the property needs it: a bool for boolean properties, else a finite float.

    A JSON true/false for a numeric property is refused (it used to be stored as, say, a temperature
    of true), and so is a null: neither is a reading of the property."""
    if value is None:
        raise PayloadError("null is not a value")
    if want == "boolean" or (kind is not None and kind.boolean):
        return words.parse(value)
    if isinstance(value, bool) and (want == "number" or kind is not None):
        raise PayloadError(f"{str(value).lower()} is not a value of a numeric property")
    if want == "number" or kind is not None:
        return number_of(value)
    if isinstance(value, bool):
        return value
    try:
        return number_of(value)
    except PayloadError:
        if isinstance(value, str):
            return words.parse(value)
        raise


def unit_for(explicit: str | None, kind: Kind | None) -> str | None:
    return explicit if explicit is not None else (kind.default_unit if kind is not None else None)


def json_time(compiled: Compiled, document: Any, arrival_us: int) -> int | None:
    """The source timestamp of a JSON payload: at `time_path` (required there) or a usual key,
    where one that cannot be read, or is too far ahead (`not_ahead`), is left out."""
    if compiled.time_path is not None:
        return timestamp_us(follow(document, compiled.time_path, compiled.mapping.time_path or ""))
    if isinstance(document, dict):
        for key in TIME_KEYS:
            if key in document:
                try:
                    return not_ahead(timestamp_us(document[key]), arrival_us)
                except PayloadError:
                    return None  # a field merely named "time" is not trusted enough to reject the message
    return None


# -- the generic extractors -----------------------------------------------------------------------


def _number(compiled: Compiled, message: Message) -> list[Reading]:
    kind = message.resolved.kind
    text = decode(message.payload)
    value = compiled.words.parse(text) if kind is not None and kind.boolean else parse_number(text)
    return [message.reading(value, unit_for(compiled.targets.unit, kind), None, 0)]  # type: ignore[union-attr]


def _boolean(compiled: Compiled, message: Message) -> list[Reading]:
    return [message.reading(compiled.words.parse(decode(message.payload)), None, None, 0)]


def _json(compiled: Compiled, message: Message) -> list[Reading]:
    document = parse_json(decode(message.payload))
    assert compiled.path is not None
    kind = message.resolved.kind
    value = coerce(follow(document, compiled.path, compiled.mapping.path or ""), kind, compiled.words)
    unit = unit_for(compiled.targets.unit, kind)  # type: ignore[union-attr]
    return [message.reading(value, unit, json_time(compiled, document, message.arrival_us), 0)]


def _regex(compiled: Compiled, message: Message) -> list[Reading]:
    assert compiled.pattern is not None
    text = decode(message.payload)
    budget = compiled.regex_budget
    budget.check(compiled.pattern.pattern)
    ALL_PATTERNS.check(compiled.pattern.pattern)
    started = time.perf_counter()
    try:
        found = compiled.pattern.search(text, timeout=REGEX_TIME_LIMIT_S)
    except TimeoutError:
        raise PayloadError(
            f"the pattern {compiled.pattern.pattern!r} took over {REGEX_TIME_LIMIT_S * 1000:g} ms on this payload"
        ) from None
    finally:
        spent = time.perf_counter() - started
        budget.spent += spent
        ALL_PATTERNS.spent += spent
    if found is None or found.group("value") is None:
        raise PayloadError(f"payload {shown(text)} does not match the pattern {compiled.pattern.pattern!r}")
    kind = message.resolved.kind
    value = coerce(found.group("value"), kind, compiled.words)
    return [message.reading(value, unit_for(compiled.targets.unit, kind), None, 0)]  # type: ignore[union-attr]


def _fields(compiled: Compiled, message: Message) -> list[Reading]:
    """Several readings from one JSON object: declared fields, or every key naming a known property."""
    document = parse_json(decode(message.payload))
    if not isinstance(document, dict):
        raise PayloadError("expected a JSON object")
    time_us = json_time(compiled, document, message.arrival_us)
    readings: list[Reading] = []
    nulls: list[str] = []  # partial updates may null a key beside real values; alone, it is bad input
    if compiled.fields:
        for path_text, path, prop, kind, unit in compiled.fields:
            try:
                raw = follow(document, path, path_text)
            except PayloadError:
                continue  # devices send partial updates: an absent key is not an error
            if raw is None:
                nulls.append(path_text)
                continue
            value = _field_value(raw, kind, compiled.words, path_text)
            readings.append(message.reading(value, unit_for(unit, kind), time_us, len(readings), property=prop))
        return _or_refused(readings, nulls)
    for key, raw in document.items():
        kind = kind_named(key)
        if kind is None or isinstance(raw, dict | list):
            continue
        if raw is None:
            nulls.append(key)
            continue
        value = _field_value(raw, kind, compiled.words, key)
        readings.append(message.reading(value, kind.default_unit, time_us, len(readings), property=kind.iri))
    return _or_refused(readings, nulls)


def _or_refused(readings: list[Reading], nulls: list[str]) -> list[Reading]:
    """The readings of a message, or PayloadError when all it held for its properties was null."""
    if not readings and nulls:
        raise PayloadError(f"key {nulls[0]!r}: null is not a value")
    return readings


def _field_value(raw: Any, kind: Kind | None, words: BooleanWords, key: str) -> float | bool:
    try:
        return coerce(raw, kind, words)
    except PayloadError as error:
        raise PayloadError(f"key {key!r}: {error}") from None


def _ignore(compiled: Compiled, message: Message) -> list[Reading]:
    return []


@dataclass(frozen=True, slots=True)
class Extractor:
    """What a mapping's `extract` names: how to read a message, and which mapping fields apply.

    `captures`: placeholders its readings fill from the payload (a SenML record name), usable in
    templates beside the filter's captures; `targets`: whether sensor/feature/unit templates apply;
    `wants_property`: whether the mapping's `property` applies (else the payload names it);
    `property_fallback`: the property template when the mapping gives none.
    """

    run: Run
    captures: tuple[str, ...] = ()
    targets: bool = True
    wants_property: bool = False
    property_fallback: str | None = None


_EXTRACTORS: dict[str, Extractor] = {}


def register_extractor(name: str, extractor: Extractor) -> None:
    """Make `extract = name` valid in mappings. Protocol-neutral extractors register here, below;
    an adapter registers its ecosystems' own (adapters/mqtt: Homie, Tasmota) when imported."""
    known = _EXTRACTORS.get(name)
    if known is not None and known != extractor:
        raise ValueError(f"extractor {name!r} is registered twice")
    _EXTRACTORS[name] = extractor


def extractor_named(name: str) -> Extractor | None:
    return _EXTRACTORS.get(name)


def extractor_names() -> tuple[str, ...]:
    return tuple(_EXTRACTORS)


for _name, _run in (("number", _number), ("boolean", _boolean), ("json", _json), ("regex", _regex)):
    register_extractor(_name, Extractor(_run, wants_property=True))
register_extractor("fields", Extractor(_fields))
register_extractor("ignore", Extractor(_ignore, targets=False))
