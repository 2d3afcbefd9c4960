"""The shipper's durable spool: segment files on disk, and the cursor that makes restarts resume.

Layout of the spool directory:

* ``spool.json`` — the spool's random id (batch ids embed it, so a spool made afresh never reuses
  the id of a batch the cloud already has);
* ``open-<n>.jsonl`` — the segment being filled: JSON lines, written through to the OS at each
  append (a kill -9 loses nothing; a torn last line is cut at start-up, and lines a power cut left
  unreadable are skipped and counted);
* ``seg-<n>-<records>.jsonl.gz`` — sealed segments (gzip, mtime 0: the same bytes at every upload
  attempt), deleted only once the cloud confirmed them;
* ``cursor.json`` — per (sensor, property), the highest observation sequence number ever spooled,
  and the last segment it covers. Written (fsync, rename) when a segment is sealed.
* ``rejected/`` — segments the cloud refused for good (kept for the operator, never resent; within
  the budget, deleted first).
* ``spool.json.damaged``, ``cursor.json.damaged`` — those files as start-up found them unreadable,
  set aside for the operator (see :meth:`Spool._read_state`); the spool then starts under a new id.

Why a cursor of sequence numbers and not of times: the gateway numbers each sensor's observations
1, 2, 3... in commit order, and the shipper spools them in commit order, so "every observation of
that key above n" is exactly what was not spooled yet, across restarts and clock steps. After
power loss the unsealed tail may be gone, but so is its part of the cursor: those observations are
spooled again from the store. Everything here runs on the shipper's single I/O thread.

Budget: when sealed + open + rejected segments exceed the budget, the oldest rejected segments are
deleted first (never sent anyway; counted), then the oldest sealed segments, their observations
counted as dropped (the newest data is the most useful after a long outage; the edge keeps its own
history anyway). The policy is documented in systemd/sepa-gateway.toml.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import re
import secrets
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from broker.api import sync_directory

log = logging.getLogger(__name__)

_SEALED = re.compile(r"^seg-(\d{12})-(\d+)\.jsonl\.gz$")
_OPEN = re.compile(r"^open-(\d{12})\.jsonl$")
_ID = re.compile(r"[A-Za-z0-9]{1,32}")
DAMAGED_SUFFIX = ".damaged"
DAMAGED_KEPT = 10  # copies of one damaged state file set aside at most (`.damaged`, `.damaged.1`...)
_State = TypeVar("_State")


@dataclass(frozen=True, slots=True)
class Segment:
    """A sealed segment: its number, record count, size on disk and file."""

    number: int
    records: int
    size: int
    path: Path


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a full disk must not stay full of what could not be written
        raise
    sync_directory(path.parent)


def _max_keys(lines: list[bytes], into: dict[str, int]) -> list[bytes]:
    """Fold the records' sequence numbers into `into`; returns the lines that are records.

    Why not trust every line: a power cut can leave more than a torn last line (a block of zeros
    that never reached the disk; after a short write on a full disk, later appends follow a torn
    line). One such line made start-up raise, and with it the gateway's start."""
    whole: list[bytes] = []
    for line in lines:
        try:
            record = json.loads(line)
            key, sequence = f"{record['sensor']} {record['property']}", record["sequence"]
            if not isinstance(sequence, int):
                raise TypeError("sequence")
        except (ValueError, KeyError, TypeError):
            continue
        if sequence > into.get(key, 0):
            into[key] = sequence
        whole.append(line)
    return whole


def _spool_id(saved: object) -> str:
    """The id in spool.json; it goes into batch ids, so it must fit their pattern."""
    if not isinstance(saved, dict) or not isinstance(saved.get("id"), str) or not _ID.fullmatch(saved["id"]):
        raise ValueError("no spool id")
    return saved["id"]


def _cursor(saved: object) -> tuple[dict[str, int], int]:
    """The keys and `through` in cursor.json, each a non-negative integer (a bool is not one)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("keys"), dict):
        raise ValueError("no cursor keys")
    through, keys = saved.get("through"), saved["keys"]
    numbers = [through, *keys.values()]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
        raise ValueError("a cursor number is not a non-negative integer")
    return dict(keys), through  # type: ignore[return-value]


class Spool:
    """Open with :meth:`open`; not thread-safe (one I/O thread owns it)."""

    def __init__(self, directory: Path, *, segment_max_bytes: int, budget_bytes: int) -> None:
        self.directory = directory
        self.segment_max_bytes = segment_max_bytes
        self.budget_bytes = budget_bytes
        self.id = ""
        self.cursor: dict[str, int] = {}
        self.through = 0  # the last segment number the cursor file covers
        self.sealed: deque[Segment] = deque()
        self.next_number = 1
        self._open_file: object | None = None
        self._open_number = 0
        self._open_lines: list[bytes] = []
        self._open_bytes = 0
        self._open_keys: dict[str, int] = {}
        self._open_since = 0.0
        self._open_count = 0
        self.dropped_observations = 0
        self.dropped_segments = 0
        # segments refused for good, oldest first, kept within the budget too (see _enforce_budget)
        self.rejected: deque[tuple[Path, int]] = deque()
        self.rejected_bytes = 0
        self.rejected_deleted = 0
        self.damaged_records = 0  # lines of open segments found unreadable at start-up, skipped
        self.damaged_segments = 0  # sealed segments past the cursor found unreadable at start-up, kept as is
        self.damaged_files = 0  # spool.json or cursor.json found unreadable at start-up, set aside
        self.spooled = 0
        # kept as numbers so that metrics read on the event loop never iterate the deque this thread changes
        self._sealed_records = 0
        self._sealed_bytes = 0
        self.sealed_count = 0

    # -- opening and recovery -----------------------------------------------------------------

    @classmethod
    def open(cls, directory: str | Path, *, segment_max_bytes: int, budget_bytes: int) -> Spool:
        """Open (creating) the spool; recover what a crash left: cut a torn line, seal the open segment."""
        spool = cls(Path(directory), segment_max_bytes=segment_max_bytes, budget_bytes=budget_bytes)
        spool._recover()
        return spool

    def _recover(self) -> None:
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "rejected").mkdir(exist_ok=True)
        meta = directory / "spool.json"
        saved_id, _ = self._read_state(meta, _spool_id)
        saved_cursor, cursor_lost = self._read_state(directory / "cursor.json", _cursor)
        if saved_cursor is not None:
            self.cursor, self.through = saved_cursor
        if saved_id is None or cursor_lost:
            # Why a new id when the cursor is lost: its `through` kept segment numbers from being used
            # twice. Numbered afresh under the old id, a new segment would reuse the batch id of one the
            # cloud has (409 for other bytes: set aside for good, its observations lost). A new id also
            # tells the shipper (the store's marker no longer matches) to ship all the store holds again.
            self.id = secrets.token_hex(4)
            _write_atomically(meta, json.dumps({"id": self.id}).encode())
            if saved_id is not None:
                log.warning("shipper: the cursor was lost; new spool id", extra={"old": saved_id, "new": self.id})
        else:
            self.id = saved_id
        for leftover in directory.glob(".*.tmp"):
            leftover.unlink()
        opened: list[tuple[int, Path]] = []
        for path in directory.iterdir():
            if match := _SEALED.match(path.name):
                number, records = int(match[1]), int(match[2])
                self.sealed.append(Segment(number, records, path.stat().st_size, path))
            elif match := _OPEN.match(path.name):
                opened.append((int(match[1]), path))
        self.sealed = deque(sorted(self.sealed, key=lambda segment: segment.number))
        self._count_sealed()
        for path in sorted(path for path in (directory / "rejected").iterdir() if _SEALED.match(path.name)):
            self._keep_rejected(path)
        numbers = [segment.number for segment in self.sealed] + [number for number, _ in opened]
        self.next_number = max([self.through, *numbers], default=0) + 1
        for segment in self.sealed:
            if segment.number > self.through:  # sealed, but the crash came before the cursor was written
                try:
                    _max_keys(gzip.decompress(segment.path.read_bytes()).splitlines(), self.cursor)
                except (OSError, EOFError, zlib.error) as error:  # uploaded as it is: the cloud refuses it (400)
                    self.damaged_segments += 1
                    log.warning(
                        "shipper: a sealed segment is damaged", extra={"segment": segment.number, "error": str(error)}
                    )
        for number, path in sorted(opened):
            data = path.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]  # a line without its newline was torn by the crash
            lines = whole.splitlines(keepends=True)
            self._open_number, self._open_lines = number, _max_keys(lines, self._open_keys)
            self._open_bytes = sum(len(line) for line in self._open_lines)
            if len(self._open_lines) < len(lines):
                self.damaged_records += len(lines) - len(self._open_lines)
                log.warning(
                    "shipper: damaged records skipped in the open segment",
                    extra={"segment": number, "records": len(lines) - len(self._open_lines)},
                )
            self._seal_open(path)
        if any(segment.number > self.through for segment in self.sealed):
            self.through = self.sealed[-1].number
            self._write_cursor()

    def _read_state(self, path: Path, parse: Callable[[object], _State]) -> tuple[_State | None, bool]:
        """The state `path` holds, read by `parse`; (None, False) when there is no such file.

        (None, True) when it is damaged (a power cut, a full disk, a hand edit: cut short, zeros, not
        JSON, wrong types): before, that stopped the gateway's start. The file is set aside as
        ``<name>.damaged`` for the operator, not deleted, and counted (``damaged_files``); a later
        damage of the same file as ``<name>.damaged.1`` and so on (the second overwrote the first,
        the evidence of what went wrong first), the last of DAMAGED_KEPT names taking any more."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None, False
        try:
            return parse(json.loads(data)), False
        except (ValueError, KeyError, TypeError, RecursionError) as error:
            aside = _aside(path)
            os.replace(path, aside)
            sync_directory(path.parent)
            self.damaged_files += 1
            log.warning(
                "shipper: a damaged spool file was set aside",
                extra={"file": path.name, "kept": aside.name, "error": str(error)[:200]},
            )
            return None, True

    # -- appending and sealing ----------------------------------------------------------------

    def append(self, lines: list[bytes], keys: dict[str, int]) -> bool:
        """Append records (JSON lines) and their cursor keys; True when this sealed a segment."""
        if not lines:
            return False
        if self._open_file is None:
            self._open_number = self.next_number
            self.next_number += 1
            self._open_file = open(self._open_path(), "ab", buffering=0)  # noqa: SIM115 - kept open on purpose
            self._open_since = time.monotonic()
        data = b"".join(lines)
        self._open_file.write(data)  # type: ignore[attr-defined]
        self._open_lines.append(data)
        self._open_bytes += len(data)
        for key, sequence in keys.items():
            if sequence > self._open_keys.get(key, 0):
                self._open_keys[key] = sequence
            if sequence > self.cursor.get(key, 0):
                self.cursor[key] = sequence
        self._open_count += len(lines)
        self.spooled += len(lines)
        if self._open_bytes >= self.segment_max_bytes:
            self.seal()
            return True
        return False

    def seal_if_older(self, max_age_s: float) -> bool:
        """Seal the open segment once its first record is `max_age_s` old; True when sealed."""
        if self._open_file is not None and time.monotonic() - self._open_since >= max_age_s:
            self.seal()
            return True
        return False

    def seal(self) -> None:
        """Close the open segment into a sealed, gzip'ed one (no-op without records)."""
        if self._open_file is None:
            return
        self._open_file.close()  # type: ignore[attr-defined]
        self._open_file = None
        try:
            self._seal_open(self._open_path())
        except OSError:
            if self._open_lines:  # not sealed (disk full): the same open segment goes on, sealed once there is room
                self._open_file = open(self._open_path(), "ab", buffering=0)  # noqa: SIM115 - kept open on purpose
            raise

    def _open_path(self) -> Path:
        return self.directory / f"open-{self._open_number:012d}.jsonl"

    def _seal_open(self, path: Path) -> None:
        data = b"".join(self._open_lines)
        records = data.count(b"\n")
        if records:
            body = gzip.compress(data, compresslevel=1, mtime=0)  # level 1: CPU matters more than bytes here
            sealed = self.directory / f"seg-{self._open_number:012d}-{records}.jsonl.gz"
            _write_atomically(sealed, body)
            self.sealed.append(Segment(self._open_number, records, len(body), sealed))
            self._count_sealed()
        for key, sequence in self._open_keys.items():
            if sequence > self.cursor.get(key, 0):
                self.cursor[key] = sequence
        self.through = self._open_number
        # Why forgotten before the cursor is written: when that failed (disk full), the lines stayed
        # and were sealed again into the next segment (100 observations landed twice). A cursor file
        # behind the sealed segments is what a crash leaves too: start-up reads those segments.
        self._open_lines, self._open_bytes, self._open_keys, self._open_count = [], 0, {}, 0
        path.unlink(missing_ok=True)
        try:
            self._write_cursor()
        finally:
            self._enforce_budget()

    def _write_cursor(self) -> None:
        _write_atomically(
            self.directory / "cursor.json", json.dumps({"through": self.through, "keys": self.cursor}).encode()
        )

    def _enforce_budget(self) -> None:
        # Why the rejected segments count too, and go first: they are never sent, and an endpoint
        # refusing every batch (hostile, or speaking another contract) moved the whole stream there,
        # outside the budget: 166 kB kept aside for a 64 kB budget after 12,000 observations, and
        # growing until the disk (the store's too) was full.
        while self.rejected and self.backlog_bytes + self.rejected_bytes > self.budget_bytes:
            path, size = self.rejected.popleft()
            self.rejected_bytes -= size
            path.unlink(missing_ok=True)
            self.rejected_deleted += 1
            log.warning("shipper: spool over its budget, oldest rejected segment deleted", extra={"file": path.name})
        while self.sealed and self.backlog_bytes > self.budget_bytes:
            oldest = self.sealed.popleft()
            self._count_sealed()
            oldest.path.unlink(missing_ok=True)
            self.dropped_segments += 1
            self.dropped_observations += oldest.records
            log.warning(
                "shipper: spool over its budget, oldest segment dropped",
                extra={"segment": oldest.number, "observations": oldest.records, "budget_bytes": self.budget_bytes},
            )

    # -- the cursor -----------------------------------------------------------------------------

    def reset_cursor(self) -> None:
        """Forget what was spooled (the store is not the one the cursor counted: ship all it holds)."""
        self.cursor.clear()
        self._write_cursor()

    # -- handing segments to the uploader -----------------------------------------------------

    def oldest(self, skip: frozenset[int] = frozenset()) -> Segment | None:
        return next((segment for segment in self.sealed if segment.number not in skip), None)

    def read(self, segment: Segment) -> bytes:
        return segment.path.read_bytes()

    def confirmed(self, segment: Segment) -> None:
        """The cloud has the segment: delete it. Deleted before it leaves the backlog, so a backlog of
        0 means its room on the disk is free again (a test filling the disk after it raced the unlink)."""
        segment.path.unlink(missing_ok=True)
        self._forget(segment)

    def reject(self, segment: Segment) -> Path:
        """The cloud refused the segment for good: keep it aside for the operator, never resend it."""
        self._forget(segment)
        target = self.directory / "rejected" / segment.path.name
        with contextlib.suppress(FileNotFoundError):
            os.replace(segment.path, target)
            self._keep_rejected(target)
            self._enforce_budget()
        return target

    def _keep_rejected(self, path: Path) -> None:
        size = path.stat().st_size
        self.rejected.append((path, size))
        self.rejected_bytes += size

    def _forget(self, segment: Segment) -> None:
        with contextlib.suppress(ValueError):
            self.sealed.remove(segment)
        self._count_sealed()

    def _count_sealed(self) -> None:
        self._sealed_records = sum(segment.records for segment in self.sealed)
        self._sealed_bytes = sum(segment.size for segment in self.sealed)
        self.sealed_count = len(self.sealed)

    def batch_id(self, segment: Segment, gateway: str) -> str:
        """The batch id the cloud stores the segment under: stable across attempts and restarts."""
        slug = re.sub(r"[^A-Za-z0-9._-]", "-", gateway)[:64] or "gateway"
        if not slug[0].isalnum():
            slug = "g" + slug[:63]
        return f"{slug}-{self.id}-{segment.number:012d}"

    # -- observability --------------------------------------------------------------------------

    @property
    def open_records(self) -> int:
        return self._open_count

    @property
    def backlog_bytes(self) -> int:
        return self._sealed_bytes + self._open_bytes

    @property
    def backlog_observations(self) -> int:
        return self._sealed_records + self.open_records

    def close(self) -> None:
        """Close the open segment's file (it is sealed at the next start, or by seal())."""
        if self._open_file is not None:
            self._open_file.close()  # type: ignore[attr-defined]
            self._open_file = None


def _aside(path: Path) -> Path:
    """The first free name to set `path` aside under (see Spool._read_state)."""
    first = path.with_name(f"{path.name}{DAMAGED_SUFFIX}")
    names = [first, *(first.with_name(f"{first.name}.{n}") for n in range(1, DAMAGED_KEPT))]
    return next((name for name in names if not name.exists()), names[-1])
