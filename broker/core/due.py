"""When a delayed update is due: the `delay` and `at` parameters of an update request.

`delay` is milliseconds (a non-negative integer) or an ISO 8601 duration (`PT30S`, `PT1.5S`,
`P1DT2H`, `P2W`); years and months are refused because they have no fixed length. `at` is an
RFC 3339 instant with its offset (`2026-11-22T18:30:00Z`, `...+01:00`; `t` and `z` too, as RFC 3339
§5.6 allows); an instant in the past is due at once. Times are Unix microseconds, the engine clock's unit.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from broker.errors import InvalidRequest

MAX_DELAY_US = 10 * 366 * 86_400 * 1_000_000  # ten years: anything longer is a mistake, not a plan
MAX_DELAY_DIGITS = 15  # milliseconds: ten years have 12 digits
_DURATION = re.compile(
    r"P(?!$)(?:(?P<weeks>\d+(?:[.,]\d+)?)W)?(?:(?P<days>\d+(?:[.,]\d+)?)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+(?:[.,]\d+)?)H)?(?:(?P<minutes>\d+(?:[.,]\d+)?)M)?(?:(?P<seconds>\d+(?:[.,]\d+)?)S)?)?",
    re.IGNORECASE | re.ASCII,  # "PT３０S" is no duration: \d and float() take every script's digits
)
# RFC 3339 §5.6 date-time, ASCII digits: fromisoformat alone also takes ISO 8601's other forms
# (`20300101T000000Z`, week dates `2030-W01-1T00:00:00Z`, `T00Z`), which no RFC 3339 client sends
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNIT_US = {"weeks": 604_800_000_000, "days": 86_400_000_000, "hours": 3_600_000_000, "minutes": 60_000_000}


def parse_delay(text: str) -> int:
    """A `delay` parameter in microseconds."""
    text = text.strip()
    if text.isascii() and text.isdigit():  # str.isdigit alone takes "²", which int() refuses
        if len(text) > MAX_DELAY_DIGITS:  # and int() refuses more than 4,300 digits
            raise InvalidRequest("delay is longer than ten years")
        delay_us = int(text) * 1000
    else:
        match = _DURATION.fullmatch(text)
        if match is None:
            raise InvalidRequest(
                f"delay must be milliseconds or an ISO 8601 duration such as PT30S or P1DT2H, not {text[:40]!r}"
                " (years and months are not fixed lengths: use days)"
            )
        delay_us = 0
        for unit, value in match.groupdict().items():
            if value is not None:
                amount = float(value.replace(",", "."))
                if amount > MAX_DELAY_US:  # 400 nines are a float's infinity, which round() refuses
                    raise InvalidRequest("delay is longer than ten years")
                delay_us += round(amount * (1_000_000 if unit == "seconds" else _UNIT_US[unit]))
    if delay_us > MAX_DELAY_US:
        raise InvalidRequest("delay is longer than ten years")
    return delay_us


def parse_at(text: str) -> int:
    """An `at` parameter (RFC 3339 with offset) in Unix microseconds.

    Checked against RFC 3339's grammar first, then read by fromisoformat, which takes more. A
    lowercase `z` is read as `Z`: RFC 3339 §5.6 allows both `T` and `Z` in lower case, and
    fromisoformat takes a lowercase `t` but not a lowercase `z`."""
    text = text.strip()
    instant = None
    if _RFC3339.fullmatch(text):
        try:
            instant = datetime.fromisoformat(text[:-1] + "Z" if text[-1] == "z" else text)
            # Why: an instant before year 1 in UTC (0001-01-01T00:00:00+23:59) has no RFC 3339 form;
            # it was stored and then the 202 reply failed: a 500, and the update ran all the same
            instant.astimezone(UTC)
        except (ValueError, OverflowError):  # a month 13, a leap second (:60), year 0 in UTC
            instant = None
    if instant is None:
        raise InvalidRequest(
            f"at must be an RFC 3339 instant with its offset, such as 2026-11-22T18:30:00Z, not {text[:40]!r}"
        )
    return (instant - _EPOCH) // timedelta(microseconds=1)


def due_micros(delay: str | None, at: str | None, now_us: int) -> int | None:
    """The due time of an update request, or None when it is not delayed."""
    if delay is not None and at is not None:
        raise InvalidRequest("give either delay or at, not both")
    if delay is not None:
        return now_us + parse_delay(delay)
    if at is not None:
        due = parse_at(at)
        if due - now_us > MAX_DELAY_US:
            raise InvalidRequest("at is more than ten years away")
        return due
    return None
