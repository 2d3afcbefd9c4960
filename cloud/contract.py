"""The observation record the gateway's cloud shipper uploads, and the check of a whole batch against it.

One batch is the gzip of UTF-8 JSON lines, one observation per line::

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
Unknown keys, duplicate keys, NaN/Infinity and booleans where a number is due are refused: the producer
is our own, so anything off is a bug to surface, not to guess around.

Why times are held to exactly ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` and not every RFC 3339 form: the Spark
job parses them with one fixed pattern (:data:`cloud.stream.TIME_FORMAT`); a time the endpoint accepts
but Spark could not parse would become a silently dropped observation. IRIs are checked only for
being absolute (a scheme) and free of spaces and the characters IRIs may not hold, which catches the
plausible producer bugs (an empty string, a prefixed name, a literal put in the wrong field).

Why the check streams: a batch may be 64 MiB of gzip. It is inflated a chunk at a time and each line
checked as it completes, so memory stays near the compressed size, and inflation stops as soon as
the decompressed size passes the limit (a gzip bomb costs us the limit, not its full size).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import zlib
from collections.abc import Callable, Iterator
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

BATCH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a batch id may be (full match): safe as a file name, never hidden from Spark (no leading . or _)."""

MAX_SEQUENCE = 2**63 - 1  # Spark's LongType
_TIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})\.([0-9]{6})Z")
_IRI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20<>\"{}|\\^`\x7f]+")
_CHUNK = 1 << 20


class BatchError(ValueError):
    """Why a batch is refused. ``too_large`` is a 413; anything else a 400. ``reason`` labels the metric."""

    def __init__(self, message: str, reason: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.too_large = too_large


def check_batch(body: bytes, max_decompressed_bytes: int) -> int:
    """Check a gzip batch against the record contract and return its number of records.

    Raises :class:`BatchError` naming the first problem (and its line number for a bad record).
    """
    if not body.startswith(b"\x1f\x8b"):
        raise BatchError("the body is not gzip (Content-Encoding: gzip is required)", "bad_gzip")
    records = 0
    pending: list[bytes] = []  # the line being read, in pieces
    line_number = 0
    for chunk in _inflate(body, max_decompressed_bytes):
        if b"\n" not in chunk:
            # Why not join at each chunk: a line spanning n chunks was then copied n times over,
            # quadratic (a 128 MiB line, 127 KiB of gzip, took 8.8 s; the default limits allow 1 GiB)
            pending.append(chunk)
            continue
        lines = b"".join([*pending, chunk]).split(b"\n")
        pending = [lines.pop()]
        for line in lines:
            line_number += 1
            check_line(line_number, line)
            records += 1
    last = b"".join(pending)
    if last.strip():
        line_number += 1
        check_line(line_number, last)
        records += 1
    if records == 0:
        raise BatchError("the batch holds no records", "empty_batch")
    return records


def _inflate(body: bytes, limit: int) -> Iterator[bytes]:
    """Yield the decompressed body in chunks; refuse past ``limit`` bytes or on any gzip damage."""
    total = 0
    reader = gzip.GzipFile(fileobj=io.BytesIO(body), mode="rb")
    while True:
        try:
            chunk = reader.read(_CHUNK)
        except (OSError, EOFError, zlib.error) as error:
            raise BatchError(f"the body is not a valid gzip stream: {error}", "bad_gzip") from error
        if not chunk:
            return
        total += len(chunk)
        if total > limit:
            raise BatchError(f"the batch inflates to more than {limit} bytes", "too_large", too_large=True)
        yield chunk


def check_line(number: int, line: bytes) -> None:
    """Check one JSON line; raise :class:`BatchError` with ``line N: ...`` if it breaks the contract."""
    try:
        record = _parse(line)
    except UnicodeDecodeError as error:
        raise _bad(number, f"not UTF-8 ({error.reason} at byte {error.start})") from error
    except ValueError as error:
        raise _bad(number, f"not JSON: {error}") from error
    except RecursionError as error:  # the json module recurses per bracket: 100,000 of them were a 500 and a traceback
        raise _bad(number, "not JSON: nested too deep") from error
    if not isinstance(record, dict):
        raise _bad(number, f"expected a JSON object, got {_json_type(record)}")
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise _bad(number, f"unknown field {unknown[0]!r}")
    for name, (kind, nullable) in FIELDS.items():
        value = record.get(name)
        if value is None:
            if not nullable:
                raise _bad(number, f"field {name!r} is required" + ("" if name in record else " and missing"))
            continue
        problem = _CHECKS[kind](value)
        if problem:
            raise _bad(number, f"field {name!r}: {problem}")
    if (record.get("value") is None) == (record.get("literal") is None):
        raise _bad(number, "exactly one of 'value' and 'literal' must be non-null")


def _parse(line: bytes) -> Any:
    if not line.strip():
        raise ValueError("empty line")
    return json.loads(line.decode("utf-8"), object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            raise ValueError(f"duplicate key {key!r}")
        record[key] = value
    return record


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _bad(number: int, problem: str) -> BatchError:
    return BatchError(f"line {number}: {problem}", "bad_record")


def _json_type(value: Any) -> str:
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
        return f"expected an IRI string, got {_json_type(value)}"
    return None if _IRI.fullmatch(value) else f"not an absolute IRI: {value[:80]!r}"


def _check_name(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"expected a string, got {_json_type(value)}"
    return None if value else "must not be empty"


def _check_string(value: Any) -> str | None:
    return None if isinstance(value, str) else f"expected a string or null, got {_json_type(value)}"


def _check_number(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"expected a number or null, got {_json_type(value)}"
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        finite = False
    return None if finite else "out of the range of a double"


def _check_sequence(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"expected an integer, got {_json_type(value)}"
    return None if 1 <= value <= MAX_SEQUENCE else f"must be between 1 and {MAX_SEQUENCE}, got {value}"


def _check_time(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"expected an RFC 3339 time string, got {_json_type(value)}"
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
