"""The landing directory: each accepted batch becomes ``<batch_id>.json.gz``, atomically and exactly once.

Why this shape:

* Spark's file stream picks up any visible file the moment it is listed, so a batch is written to a
  hidden temp file (``.<batch_id>.<random>.tmp``: Spark skips names starting with ``.`` or ``_``),
  fsynced, then given its real name in one step, and the directory fsynced, so a crash leaves either
  no batch or the whole batch, never a torn one that Spark would read.
* The real name is made with :func:`os.link`, not :func:`os.rename`: a link fails if the name exists,
  so even two landing processes sharing a directory cannot overwrite each other's batch.
* Uploads are retried by the shipper, so a batch id seen before is answered from what is on disk:
  the same bytes are a duplicate (success), different bytes a conflict, and nothing is changed.
* File work blocks, so it runs in a worker thread; a per-id :class:`asyncio.Lock` keeps two
  concurrent uploads of one id from both getting past the "does it exist" check.
"""

from __future__ import annotations

import asyncio
import enum
import os
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

SUFFIX = ".json.gz"
STALE_TEMP_SECONDS = 3600.0


class Outcome(enum.Enum):
    """What storing a batch did."""

    CREATED = "created"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


class LandingDir:
    """Stores batches under one directory (a local path: the endpoint writes, Spark reads it by URI)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiters: dict[str, int] = {}

    def batch_path(self, batch_id: str) -> Path:
        """Where the batch with this (already validated) id lives."""
        return self.path / f"{batch_id}{SUFFIX}"

    def prepare(self) -> int:
        """Create the directory and remove temp files a crash left over an hour ago; return how many.

        Blocking: call it in a thread. Younger temp files may belong to another process's upload."""
        self.path.mkdir(parents=True, exist_ok=True)
        removed = 0
        cutoff = time.time() - STALE_TEMP_SECONDS
        for entry in self.path.glob(".*.tmp"):
            try:
                if entry.stat().st_mtime < cutoff:
                    entry.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    async def store(self, batch_id: str, body: bytes) -> Outcome:
        """Store ``body`` as the batch ``batch_id`` unless that id is already there."""
        async with self._lock(batch_id):
            return await asyncio.to_thread(self._store_blocking, batch_id, body)

    @asynccontextmanager
    async def _lock(self, batch_id: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(batch_id, asyncio.Lock())
        self._waiters[batch_id] = self._waiters.get(batch_id, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._waiters[batch_id] -= 1
            if not self._waiters[batch_id]:
                del self._waiters[batch_id], self._locks[batch_id]

    def _store_blocking(self, batch_id: str, body: bytes) -> Outcome:
        final = self.batch_path(batch_id)
        existing = _compare(final, body)
        if existing is not None:
            return existing
        temp = self.path / f".{batch_id}.{secrets.token_hex(8)}.tmp"
        descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            with os.fdopen(descriptor, "wb") as stream:
                stream.write(body)
                stream.flush()
                os.fsync(stream.fileno())
            try:
                os.link(temp, final)
            except FileExistsError:
                return _compare(final, body) or Outcome.CONFLICT
        finally:
            temp.unlink(missing_ok=True)
        fsync_directory(self.path)
        return Outcome.CREATED


def _compare(path: Path, body: bytes) -> Outcome | None:
    """DUPLICATE or CONFLICT if ``path`` exists, None if it does not."""
    try:
        if path.stat().st_size != len(body):
            return Outcome.CONFLICT
        return Outcome.DUPLICATE if path.read_bytes() == body else Outcome.CONFLICT
    except FileNotFoundError:
        return None


def fsync_directory(path: Path) -> None:
    """Make the directory's entries (a new name, a removed temp file) durable."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
