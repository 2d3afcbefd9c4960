"""The token revocations (RFC 7009) on disk: ``revocations.jsonl`` in the security directory.

Why on disk: kept in memory only, a restart of the gateway (a power cut of the board, an upgrade,
a crash) forgot every revocation, and a stolen token its owner had revoked was good again until
its expiry (an hour by default). Now each revocation is on stable storage before its 200, and the
next start refuses the token again (``tests/broker/gates/test_token_revocation.py``).

Why a log of lines appended, not a file rewritten whole: any client with credentials can issue and
revoke tokens in a loop, and what is kept is bounded like memory (REVOKED_PER_CLIENT live ``jti``
a client, then one cut-off): rewritten whole, each revocation wrote up to ~94 KB of that client's
list, plus a new inode and two fsyncs (file and directory). Appended, it writes one line (~95 bytes)
and one fdatasync; the revocations that arrive while a sync runs share the next (group commit:
:meth:`RevocationLog.record`), so a flood costs one sync at a time, never one a request. The file is
rewritten whole (owned_files.write_file: atomic, the directory synced) at start and once the lines
appended since the last rewrite outnumber the live entries then kept (COMPACT_LINES at least), so
it holds at most about twice what memory holds, expired entries pruned.

The lines, each a JSON object: ``{"sub", "jti", "exp"}`` a revoked token of client ``sub``;
``{"sub", "cut_off"}`` every token of ``sub`` issued at or before ``cut_off`` (its list emptied,
as in memory); ``{"all": T}`` every token issued at or before ``T`` (below). Replayed in order.

A damaged file fails closed, and the gateway starts. Refusing to start would be a crash loop on a
plant-room board nobody watches; ignoring the damage would make valid again whatever stolen token
the lost lines named. So anything unreadable (garbage, a line of a foreign shape, bytes not UTF-8,
a last line without its newline: an append a power cut tore, or zeros the file system left there)
keeps the lines that read, and refuses every token issued before this start (``{"all": T}``, T
the time of the start; not the file's time, which a clock that ran ahead could put days later),
with a warning naming the file: every client fetches a new token once, at its next 401, and no
revoked token comes back. The file is then rewritten clean. Why a torn last line too, though its
revocation was never answered: the cost is one token fetch a client, while telling a torn append
from a file zeroed or cut short by the card is guesswork. A file that cannot be opened at all
(permissions, a symlink, a directory) stops the start with an error naming it, as a damaged
signing key does: the gateway could not keep a revocation either.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.errors import SepaError
from broker.security.owned_files import open_directory, read_file, write_file

log = logging.getLogger(__name__)

REVOCATIONS_FILE = "revocations.jsonl"
COMPACT_LINES = 1000  # appended lines before a rewrite is considered (see the module docstring)


class RevocationNotStored(SepaError):
    """The revocation could not be written to disk (disk full, failing): the token is refused until
    the gateway restarts, not after; the client may revoke it again."""

    error = "revocation_not_stored"
    status_code = 503


@dataclass
class Kept:
    """What the revocations refuse: revoked tokens (client_id -> jti -> exp), cut-offs per client
    (client_id -> iat), and `all`: every token issued at or before it (-1: none)."""

    revoked: dict[str, dict[str, int]] = field(default_factory=dict)
    cut_off: dict[str, int] = field(default_factory=dict)
    all: int = -1

    def lines(self, now: float) -> list[dict[str, Any]]:
        """This state as the file's lines, expired tokens left out."""
        lines: list[dict[str, Any]] = [{"all": self.all}] if self.all >= 0 else []
        lines += [{"sub": sub, "cut_off": at} for sub, at in self.cut_off.items()]
        for sub, tokens in self.revoked.items():
            lines += [{"sub": sub, "jti": jti, "exp": exp} for jti, exp in tokens.items() if exp > now]
        return lines

    def copy(self) -> Kept:
        """A copy a writer's thread can read while the event loop changes this one. Why not the
        lines themselves: with 100 clients of 1,000 revoked tokens each, building them took 48.5 ms
        of CPU, copying 5.1 ms (medians, 2-core machine, 2026-12-07, /tmp/atk-rp/cost.py)."""
        return Kept({sub: dict(tokens) for sub, tokens in self.revoked.items()}, dict(self.cut_off), self.all)

    def apply(self, line: Any) -> bool:
        """Replay one line of the file; False if it is not one this module writes."""
        if not isinstance(line, dict):
            return False
        keys = set(line)
        if keys == {"all"} and _integer(line["all"]):
            self.all = max(self.all, line["all"])
        elif keys == {"sub", "cut_off"} and isinstance(line["sub"], str) and _integer(line["cut_off"]):
            self.cut_off[line["sub"]] = max(self.cut_off.get(line["sub"], -1), line["cut_off"])
            self.revoked.pop(line["sub"], None)
        elif keys == {"sub", "jti", "exp"} and isinstance(line["sub"], str) and isinstance(line["jti"], str):
            if not _integer(line["exp"]):
                return False
            self.revoked.setdefault(line["sub"], {})[line["jti"]] = line["exp"]
        else:
            return False
        return True


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _encoded(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line, separators=(",", ":")).encode("utf-8") + b"\n" for line in lines)


class RevocationLog:
    """The revocation file of one gateway: read once at start, appended to on the event loop's
    behalf by one writer at a time (:meth:`record`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.appends = 0  # batches appended (each one fdatasync): the cost of a flood, for the tests
        self._appended = 0  # lines appended since the last rewrite
        self._live = 0  # entries written by the last rewrite
        self._exists = False
        self._snapshot = Kept()  # the state a rewrite writes: the token authority's own (record)
        self._pending: list[dict[str, Any]] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._writer: asyncio.Task[None] | None = None

    # -- at start -------------------------------------------------------------------------------

    def load(self, now: float | None = None) -> Kept:
        """The revocations on disk, expired ones pruned, and the file rewritten clean; a damaged
        file fails closed (see the module docstring). Blocking: at start, before any request."""
        at = time.time() if now is None else now
        kept = Kept()
        try:
            data = read_file(self.path)
        except FileNotFoundError:
            return kept
        except OSError as error:
            raise ValueError(f"{self.path} cannot be read ({error}): fix or remove it") from None
        *body, tail = data.split(b"\n")
        damaged = bool(tail)  # a last line without its newline: see the module docstring
        for raw in body:
            try:
                line = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):
                line = None
            damaged += not kept.apply(line)
        if damaged:
            kept.all = max(kept.all, int(at))
            log.warning(
                "revocation file damaged: every token issued before now is refused (clients fetch new ones)",
                extra={"path": str(self.path), "unreadable_lines": damaged},
            )
        for sub in list(kept.revoked):
            kept.revoked[sub] = {jti: exp for jti, exp in kept.revoked[sub].items() if exp > at}
            if not kept.revoked[sub]:
                del kept.revoked[sub]
        self._rewrite(kept, at)
        return kept

    # -- on the event loop ----------------------------------------------------------------------

    async def record(self, line: dict[str, Any], snapshot: Kept) -> None:
        """Return once `line` is on stable storage; RevocationNotStored if it could not be written.
        `snapshot`: the state now, which a rewrite writes instead when one is due (it holds `line`).

        Group commit: the lines recorded while a write runs go to disk together in the next one."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append(line)
        self._waiters.append(future)
        self._snapshot = snapshot
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._drain(), name="revocations-writer")
        await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                lines, waiters, self._pending, self._waiters = self._pending, self._waiters, [], []
                rewrite = not self._exists or self._appended + len(lines) > max(COMPACT_LINES, self._live)
                try:
                    if rewrite:
                        await loop.run_in_executor(None, self._rewrite, self._snapshot.copy(), None)
                    else:
                        await loop.run_in_executor(None, self._append, lines)
                except OSError as error:
                    log.error("revocation not stored", extra={"path": str(self.path), "error": str(error)})
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(RevocationNotStored("the revocation could not be stored; try again"))
                    continue
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            self._writer = None

    # -- on the writer's thread (or at start) ---------------------------------------------------

    def _rewrite(self, kept: Kept, now: float | None) -> None:
        """Replace the file with what `kept` refuses at `now` (atomic, synced with its directory);
        nothing when there is no file and nothing to keep."""
        lines = kept.lines(time.time() if now is None else now)
        if not lines and not self._exists and not self.path.exists():
            return
        write_file(self.path, _encoded(lines), 0o600)
        self._exists, self._live, self._appended = True, len(lines), 0

    def _append(self, lines: list[dict[str, Any]]) -> None:
        """Append `lines` with one write and one fdatasync, not through a symlink or a hard link."""
        with open_directory(self.path.parent) as directory:
            descriptor = os.open(
                self.path.name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory
            )
            try:
                status = os.fstat(descriptor)
                if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
                    raise OSError(f"{self.path} is not a plain file")
                view = memoryview(_encoded(lines))
                while view:
                    view = view[os.write(descriptor, view) :]
                os.fdatasync(descriptor)
            finally:
                os.close(descriptor)
        self._appended += len(lines)
        self.appends += 1
