"""Reading values out of payloads: numbers, boolean words, JSON paths, timestamps.

Every function here either returns a clean Python value or raises PayloadError with a message
saying what was wrong; nothing guesses. Numbers must be finite (NaN and infinities are refused:
the store and every consumer downstream would choke on them) and are returned as floats, which the
observation layer writes as xsd:double.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from gateway.kernel_clock import synchronised_lately
from gateway.observations.errors import MappingError, PayloadError

# ASCII digits only: `\d` (and float()) also take other scripts' digits, so "２１" (fullwidth) or
# "٢١" (Arabic-Indic) read as 21, a value no sensor of ours sends and no reader of the payload sees
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_PATH_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]|\.")
DEFAULT_TRUE_WORDS = ("true", "on", "1", "yes", "open", "detected", "occupied")
DEFAULT_FALSE_WORDS = ("false", "off", "0", "no", "closed", "clear", "unoccupied")
_MAX_UNIX_US = 253402300799_999999  # 9999-12-31T23:59:59.999999Z
MAX_AHEAD_S = 86_400
"""How far after the gateway's clock (at the message's arrival) a source timestamp may be.

Why a bound: a sensor's time was taken anywhere in 1970..9999, so a SenML pack with `t` in the
year 9999 (or 2100) was stored and shipped to the cloud as that reading's own time, for good. A
reading cannot have been taken in the future; a day of margin leaves sensors whose clocks drift, and
those that send local time as UTC (Tasmota's `Time`, up to 14 hours ahead), their readings. Times
in the past are taken back to 1970: a sensor may send its buffer of old readings, and retention and
the cloud's partitions go by the arrival time (resultTime), which an old source time does not move."""
_SHOWN = 60

PathStep = str | int


def shown(text: str | bytes) -> str:
    """A payload for an error message: short, and repr'd so control characters stay visible."""
    return repr(text[:_SHOWN]) + ("..." if len(text) > _SHOWN else "")


def decode(payload: bytes) -> str:
    """The payload as text (UTF-8, surrounding whitespace removed)."""
    try:
        return payload.decode("utf-8").strip()
    except UnicodeDecodeError as error:
        raise PayloadError(f"payload is not UTF-8 text ({error.reason} at byte {error.start})") from None


def parse_number(text: str) -> float:
    """A decimal number written as text (`21.5`, `-3`, `1e3`): no NaN, infinities, `_` or hex."""
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        raise PayloadError(f"not a number: {shown(text)}")
    value = float(text)
    if not math.isfinite(value):
        raise PayloadError(f"number out of range: {shown(text)}")
    return value


def number_of(value: Any) -> float:
    """A JSON value as a finite float: a JSON number, or a string holding one."""
    if isinstance(value, bool):
        raise PayloadError(f"expected a number, got the boolean {json.dumps(value)}")
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            raise PayloadError("number out of range") from None
        if not math.isfinite(number):
            raise PayloadError("number out of range")
        return number
    if isinstance(value, str):
        return parse_number(value)
    raise PayloadError(f"expected a number, got {_json_type(value)}")


class BooleanWords:
    """Which words mean true and false (case-insensitive), e.g. `on`/`off`, `open`/`closed`."""

    __slots__ = ("true", "false")

    def __init__(self, true: Iterable[str] = DEFAULT_TRUE_WORDS, false: Iterable[str] = DEFAULT_FALSE_WORDS) -> None:
        self.true = frozenset(word.strip().lower() for word in true)
        self.false = frozenset(word.strip().lower() for word in false)
        if not self.true or not self.false:
            raise MappingError("boolean words need at least one word for true and one for false")
        if self.true & self.false:
            raise MappingError(f"boolean words {sorted(self.true & self.false)} mean both true and false")

    def parse(self, value: Any) -> bool:
        """A JSON boolean, a word, or a JSON number 1/0."""
        if isinstance(value, bool):
            return value
        if isinstance(value, int | float) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            word = value.strip().lower()
            if word in self.true:
                return True
            if word in self.false:
                return False
            raise PayloadError(
                f"not a boolean word: {shown(value)} (true: {', '.join(sorted(self.true))}; "
                f"false: {', '.join(sorted(self.false))})"
            )
        raise PayloadError(f"expected a boolean, got {_json_type(value)}")


DEFAULT_WORDS = BooleanWords()


def parse_json(text: str) -> Any:
    """JSON text; NaN/Infinity (which Python's json would accept) and absurd nesting are refused."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except PayloadError:
        raise
    except json.JSONDecodeError as error:
        raise PayloadError(f"invalid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    except RecursionError:
        raise PayloadError("invalid JSON: nested too deeply") from None


def _refuse_constant(name: str) -> Any:
    raise PayloadError(f"invalid JSON: {name} is not a JSON number")


def compile_path(path: str) -> tuple[PathStep, ...]:
    """`ENERGY.Power`, `sensors[0].value`, `[2]` as steps (keys and list indexes)."""
    if not path:
        raise MappingError("a JSON path cannot be empty")
    steps: list[PathStep] = []
    position = 0
    expect_key = True
    while position < len(path):
        step = _PATH_STEP.match(path, position)
        if step is None:
            raise MappingError(f"invalid JSON path {path!r} at character {position + 1}")
        key, index = step.group(1), step.group(2)
        if key is not None:
            if not expect_key:
                raise MappingError(f"invalid JSON path {path!r}: a '.' is missing before {key!r}")
            steps.append(key)
            expect_key = False
        elif index is not None:
            steps.append(int(index))
            expect_key = False
        else:
            if expect_key:
                raise MappingError(f"invalid JSON path {path!r}: empty key at character {position + 1}")
            expect_key = True
        position = step.end()
    if expect_key:
        raise MappingError(f"invalid JSON path {path!r}: it ends with '.'")
    return tuple(steps)


def follow(document: Any, steps: tuple[PathStep, ...], path: str) -> Any:
    """The value at `steps` in a parsed JSON document; PayloadError naming the path if absent."""
    value = document
    for step in steps:
        if isinstance(step, int):
            if not isinstance(value, list) or step >= len(value):
                raise PayloadError(f"JSON path {path!r}: no item [{step}] in the payload")
        elif not isinstance(value, dict) or step not in value:
            raise PayloadError(f"JSON path {path!r}: no key {step!r} in the payload")
        value = value[step]
    return value


def unix_us(seconds: float) -> int:
    """Unix seconds (a float) as integer microseconds, within the range xsd:dateTime output covers."""
    if not math.isfinite(seconds):
        raise PayloadError("timestamp out of range")
    micros = round(seconds * 1_000_000)
    if not 0 <= micros <= _MAX_UNIX_US:
        raise PayloadError(f"timestamp {seconds!r} is outside 1970..9999")
    return micros


def not_ahead(micros: int, arrival_us: int) -> int:
    """`micros`, a source timestamp, unless it is more than MAX_AHEAD_S after `arrival_us` while the
    kernel does not say the gateway's clock is unsynchronised: then PayloadError naming both times.
    An unsynchronised clock (a board booted at its last shutdown's time, no NTP in reach) may be the
    one that is wrong: the sensor's time is taken, as /health's clock_sync is failing."""
    ahead_s = (micros - arrival_us) // 1_000_000
    if ahead_s > MAX_AHEAD_S and synchronised_lately() is not False:
        raise PayloadError(
            f"timestamp {_utc(micros)} is {ahead_s} s after the gateway's clock ({_utc(arrival_us)}); "
            f"at most {MAX_AHEAD_S} s ahead is taken"
        )
    return micros


def _utc(micros: int) -> str:
    return datetime.fromtimestamp(micros // 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def timestamp_us(value: Any) -> int:
    """A payload timestamp as Unix microseconds.

    Numbers are Unix seconds, or milliseconds when larger than 10^11 (year 5138 in seconds, 1973 in
    ms). Strings are RFC 3339 / ISO 8601; one without a zone (Tasmota's `Time`) is taken as UTC.
    """
    if isinstance(value, bool):
        raise PayloadError("a timestamp cannot be a boolean")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # a JSON integer of 309 digits or more: a PayloadError like any bad time
            raise PayloadError("timestamp out of range") from None
        return unix_us(seconds / 1000 if abs(seconds) > 1e11 else seconds)
    if isinstance(value, str):
        text = value.strip()
        if _NUMBER.fullmatch(text):
            return timestamp_us(float(text))
        try:
            instant = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            raise PayloadError(f"not an RFC 3339 timestamp: {shown(text)}") from None
        if instant.tzinfo is None:
            instant = instant.replace(tzinfo=UTC)
        delta = instant - datetime(1970, 1, 1, tzinfo=UTC)
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        if not 0 <= micros <= _MAX_UNIX_US:
            raise PayloadError(f"timestamp {shown(text)} is outside 1970..9999")
        return micros
    raise PayloadError(f"expected a timestamp, got {_json_type(value)}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
