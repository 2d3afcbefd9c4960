"""The check of a whole uploaded batch against the record contract (:mod:`gateway.shipper.contract`).

One batch is the gzip of UTF-8 JSON lines, one record per line. Unknown keys, duplicate keys,
NaN/Infinity and booleans where a number is due are refused: the producer is our own, so anything
off is a bug to surface, not to guess around.

Why the check streams: a batch may be 64 MiB of gzip. It is inflated a chunk at a time and each line
checked as it completes, so memory stays near the compressed size plus one line (at most
:data:`~gateway.shipper.contract.MAX_LINE_BYTES`), and inflation stops as soon as the decompressed
size passes the limit (a gzip bomb costs us the limit, not its full size).

Why gzip is inflated with :mod:`zlib` member by member and not with :class:`gzip.GzipFile`: the
file is stored as it came and read later by Spark's Hadoop gzip codec, which is stricter.
``GzipFile`` took a valid stream followed by zero padding, a header with a reserved flag bit, and a
header whose FHCRC did not match; Hadoop refused all three ("not a gzip file"), and the stream job
then failed on that file at every restart, holding back every gateway's observations (an attack
pass). zlib refuses the last two itself; anything after a member must be another member.

Why a bare carriage return is refused: JSON takes it as white space, but Spark's line reader splits
lines on it, so the record became two corrupt rows and was dropped.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator
from typing import Any

from gateway.shipper.contract import MAX_LINE_BYTES, json_type, record_problem

BATCH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a batch id may be (full match): safe as a file name, never hidden from Spark (no leading . or _)."""

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
    pending_bytes = 0
    line_number = 0
    for chunk in _inflate(body, max_decompressed_bytes):
        if b"\n" not in chunk:
            # Why not join at each chunk: a line spanning n chunks was then copied n times over,
            # quadratic (a 128 MiB line, 127 KiB of gzip, took 8.8 s; the default limits allow 1 GiB)
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes >= MAX_LINE_BYTES:
                raise _too_long(line_number + 1)
            continue
        lines = b"".join([*pending, chunk]).split(b"\n")
        pending = [lines.pop()]
        pending_bytes = len(pending[0])
        for line in lines:
            line_number += 1
            if len(line) >= MAX_LINE_BYTES:
                raise _too_long(line_number)
            check_line(line_number, line)
            records += 1
        if pending_bytes >= MAX_LINE_BYTES:
            raise _too_long(line_number + 1)
    last = b"".join(pending)
    if last.strip():
        line_number += 1
        check_line(line_number, last)
        records += 1
    if records == 0:
        raise BatchError("the batch holds no records", "empty_batch")
    return records


def _too_long(number: int) -> BatchError:
    return _bad(number, f"longer than {MAX_LINE_BYTES} bytes with its newline")


def _inflate(body: bytes, limit: int) -> Iterator[bytes]:
    """Yield the decompressed body in chunks; refuse past ``limit`` bytes, on any gzip damage, and on
    anything but another gzip member after a member (see the module docstring)."""
    total = 0
    rest = body
    while rest:
        inflater = zlib.decompressobj(wbits=31)  # 16 + 15: a gzip header and trailer, both checked
        data = rest
        while True:
            try:
                chunk = inflater.decompress(data, _CHUNK)
            except zlib.error as error:
                raise BatchError(f"the body is not a valid gzip stream: {error}", "bad_gzip") from error
            data = inflater.unconsumed_tail
            if chunk:
                total += len(chunk)
                if total > limit:
                    raise BatchError(f"the batch inflates to more than {limit} bytes", "too_large", too_large=True)
                yield chunk
            if inflater.eof:
                rest = inflater.unused_data
                break
            if not data and not chunk:
                raise BatchError("the body is not a valid gzip stream: it ends inside a member", "bad_gzip")


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
        raise _bad(number, f"expected a JSON object, got {json_type(record)}")
    problem = record_problem(record)
    if problem:
        raise _bad(number, problem)


def _parse(line: bytes) -> Any:
    if not line.strip():
        raise ValueError("empty line")
    if b"\r" in line:  # JSON white space, but Spark's line reader ends a line there
        raise ValueError("a carriage return outside a string")
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
