"""The observation record the shipper uploads, as the cloud landing checks it: one contract, two users.

One record is one UTF-8 JSON line (at most :data:`MAX_LINE_BYTES`, newline included)::

    id           string   required  observation IRI (the deduplication key)
    sensor       string   required  sensor IRI
    property     string   required  observable property IRI
    feature      string   required  feature of interest IRI
    value        number|null        qudt:numericValue (double) for numeric results
    literal      string|null        lexical form of a non-numeric result (e.g. "true", "open")
    unit         string|null        QUDT unit IRI
    result_time  string   required  RFC 3339 UTC with microseconds, e.g. "2026-11-22T18:30:00.123456Z"
    source_time  string|null        the sensor's own timestamp, same format
    sequence     integer  required  per (sensor, property) sequence number, 1 .. 2**63-1
    gateway      string   required  gateway id
    source       string   required  MQTT topic or CoAP resource the reading came from

Exactly one of ``value`` / ``literal`` is non-null; a nullable key may be left out (it means null).

Why it lives on the gateway's side and the landing (:mod:`cloud.contract`) imports it: the shipper
checks each record it reads from the observations graph before spooling it. The graph is written by
clients too; a record the landing would refuse (a blank-node observation, a sequence of 0 or past
2**63-1, a time whose UTC falls outside years 1-9999) used to be spooled beside good ones, and the
landing's 400 then set the whole segment aside: 20 good observations with one bad one (an attack
pass). Now the bad one alone is counted as incomplete (``sepa_shipper_incomplete_observations``).

Why times are held to exactly ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` and not every RFC 3339 form: the Spark
job parses them with one fixed pattern (:data:`cloud.stream.TIME_FORMAT`); a time the endpoint accepts
but Spark could not parse would become a silently dropped observation. IRIs are checked only for
being absolute (a scheme) and free of spaces and the characters IRIs may not hold, which catches the
plausible producer bugs (an empty string, a prefixed name, a literal put in the wrong field).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

FIELDS: dict[str, tuple[str, bool]] = {
    "id": ("iri", False),
    "sensor": ("iri", False),
    "property": ("iri", False),
    "feature": ("iri", False),
    "value": ("number", True),
    "literal": ("string", True),
    "unit": ("iri", True),
    "result_time": ("time", False),
    "source_time": ("time", True),
    "sequence": ("sequence", False),
    "gateway": ("name", False),
    "source": ("name", False),
}
"""Field name -> (kind, nullable). The Spark job's schema (:data:`cloud.stream.RECORD_SCHEMA`) mirrors it."""

MAX_SEQUENCE = 2**63 - 1  # Spark's LongType
MAX_LINE_BYTES = 1 << 20
"""One record's line, newline included. Why a bound: the landing holds a line whole to parse it, and
a 1 MB upload inflating to one 1 GiB line took it to 3.1 GB of memory (an attack pass). A record is
a few hundred bytes; one whose four IRIs each come from a 64 KB MQTT topic still fits."""

_TIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})\.([0-9]{6})Z")
_IRI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20<>\"{}|\\^`\x7f]+")


def record_problem(record: dict[str, Any]) -> str | None:
    """What makes `record` (a parsed line) break the contract, or None: the first problem found."""
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        return f"unknown field {unknown[0]!r}"
    for name, (kind, nullable) in FIELDS.items():
        value = record.get(name)
        if value is None:
            if not nullable:
                return f"field {name!r} is required" + ("" if name in record else " and missing")
            continue
        problem = _CHECKS[kind](value)
        if problem:
            return f"field {name!r}: {problem}"
    if (record.get("value") is None) == (record.get("literal") is None):
        return "exactly one of 'value' and 'literal' must be non-null"
    return None


def json_type(value: Any) -> str:
    """A JSON value's type, as an error message names it."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else "null"


def _check_iri(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"expected an IRI string, got {json_type(value)}"
    return None if _IRI.fullmatch(value) else f"not an absolute IRI: {value[:80]!r}"


def _check_name(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"expected a string, got {json_type(value)}"
    return None if value else "must not be empty"


def _check_string(value: Any) -> str | None:
    return None if isinstance(value, str) else f"expected a string or null, got {json_type(value)}"


def _check_number(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"expected a number or null, got {json_type(value)}"
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        finite = False
    return None if finite else "out of the range of a double"


def _check_sequence(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"expected an integer, got {json_type(value)}"
    return None if 1 <= value <= MAX_SEQUENCE else f"must be between 1 and {MAX_SEQUENCE}, got {value}"


def _check_time(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"expected an RFC 3339 time string, got {json_type(value)}"
    match = _TIME.fullmatch(value)
    if match is None:
        return f"expected RFC 3339 UTC with microseconds (2026-11-22T18:30:00.123456Z), got {value[:40]!r}"
    try:
        datetime(*(int(part) for part in match.groups()))
    except ValueError as error:
        return f"not a valid time: {value!r} ({error})"
    return None


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "iri": _check_iri,
    "name": _check_name,
    "string": _check_string,
    "number": _check_number,
    "sequence": _check_sequence,
    "time": _check_time,
}
