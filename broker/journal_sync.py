"""The journal's fdatasync for the event loop, done by a small helper process.

An inline update (:meth:`broker.scheduler.Scheduler.update`) is answered only once its journal
record is on stable storage. The sync used to run on a thread of the gateway, and that thread
needs the GIL three times a sync (to take the request, to come back from fdatasync, to wake the
loop): each time the loop thread, which runs the whole update path, was made to hand the GIL over
and wait to get it back (627 voluntary context switches a second of the loop thread against 88
without syncs), and the loop's own work slowed down. Measured with
`bench wire --on-disk --no-oxigraph --updates 20000` on the 2-core development machine, each run
beside a build without any journal (alternated, same sitting): 0.69-0.78 of its updates/s with
the thread, 0.86-0.94 with this helper. A build with the journal written but no fdatasync at all
made 0.86-0.89, so the sync itself now costs next to nothing; the helper's fdatasync runs on the
other core under a GIL of its own.

The protocol is eight bytes each way (a pipe never splits a write of up to PIPE_BUF bytes, so
every read returns whole marks). The loop writes to the helper's stdin the number of
journal records written so far (a mark), with the index of the journal they are in in its top
byte (a resident store has two, :mod:`broker.store`: the records of the other were synced when it
was left); the helper reads every mark waiting in the pipe, calls fdatasync once on each journal
they name (group commit: the syncs asked for while one ran are one), and writes back the
last mark it read, which is then on stable storage: every record it counts had been written to
the kernel before its mark was sent. An fdatasync makes the file's data durable whichever
descriptor of it wrote them, so the helper opens the journals itself, read-only. Why not sync
both journals each time: on ext4 an fdatasync of a file with nothing to write still flushes the
device's cache.

Why a string of code and not a module: it starts with ``python -I -S`` (nothing imported, no
site packages) in 10-20 ms and holds ~9 MB. It ignores SIGINT and SIGTERM (a Ctrl-C or a service stop
signals the whole process group, and the gateway may still need a sync while it stops) and ends
when its stdin closes: when the gateway closes it, or dies, even by kill -9. If the helper ends
(killed, or an fdatasync failed), the waiting updates get :class:`HelperGone` and the scheduler
syncs on its thread from then on, so a broken helper costs speed, never an acknowledgement.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

MARK_BYTES = 8
INDEX_SHIFT = 56  # a mark's top byte: the journal its records are in
COUNT_MASK = (1 << INDEX_SHIFT) - 1
_HELPER = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
journals = [os.open(path, os.O_RDONLY) for path in sys.argv[1:]]
while True:
    marks = os.read(0, 4096)
    if not marks:
        break
    for index in sorted({marks[at + 7] for at in range(0, len(marks), 8)}):
        os.fdatasync(journals[index])
    os.write(1, marks[-8:])
"""


class HelperGone(Exception):
    """The helper process ended before it confirmed the sync that was waited for."""


class JournalSyncer:
    """One helper process syncing a store's journals for one event loop (use it on that loop only)."""

    def __init__(self, journals: list[Path], loop: asyncio.AbstractEventLoop) -> None:
        """Start the helper. Popen on the loop: a vfork and exec, 0.4-5 ms (measured beside 300 MB of RSS), once."""
        self._loop = loop
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _HELPER, *map(str, journals)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._requests = self._process.stdin.fileno()
        self._replies = self._process.stdout.fileno()
        os.set_blocking(self._replies, False)
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._asked = -1  # the mark of the sync under way, -1 when none is
        self.synced = 0  # the last mark the helper confirmed
        self.alive = True
        self.pid = self._process.pid
        loop.add_reader(self._replies, self._on_reply)
        self._reading = True

    async def durable(self, mark: int, index: int = 0) -> None:
        """Return once every journal record counted by `mark` is on stable storage, those not
        synced yet being in journal `index` (raises :class:`HelperGone` if the helper ended first)."""
        if mark <= self.synced:
            return
        if not self.alive:
            raise HelperGone("the journal's sync helper has ended")
        future = self._loop.create_future()
        self._waiters.append((mark, index, future))
        if self._asked < 0:
            self._ask(mark, index)
        await future

    def _ask(self, mark: int, index: int) -> None:
        try:
            os.write(self._requests, (mark | index << INDEX_SHIFT).to_bytes(MARK_BYTES, "little"))
        except OSError:
            self._ended()
            return
        self._asked = mark

    def _on_reply(self) -> None:
        try:
            data = os.read(self._replies, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._ended()
            return
        self.synced = max(self.synced, int.from_bytes(data[-MARK_BYTES:], "little") & COUNT_MASK)
        self._asked = -1
        waiting = []
        for mark, index, future in self._waiters:
            if mark > self.synced:
                waiting.append((mark, index, future))
            elif not future.done():
                future.set_result(None)
        self._waiters = waiting
        if waiting:
            self._ask(*max((mark, index) for mark, index, _ in waiting))

    def _ended(self) -> None:
        """The helper is gone: whoever waits learns it, and nothing is asked of it again."""
        self._stop_reading()
        if not self.alive:
            return
        self.alive = False
        code = self._process.poll()
        log.warning("the journal's sync helper ended; syncing on a thread from now on", extra={"exit_code": code})
        waiters, self._waiters = self._waiters, []
        for _, _, future in waiters:
            if not future.done():
                future.set_exception(HelperGone("the journal's sync helper has ended"))

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._replies)

    def _release(self) -> None:
        self._stop_reading()
        assert self._process.stdout is not None
        self._process.stdout.close()

    def close(self) -> None:
        """Stop the helper (it ends when its stdin closes) and reap it. From any thread (the
        scheduler is closed on a worker thread): the loop lets go of the reply pipe itself."""
        self.alive = False
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait()
        try:
            self._loop.call_soon_threadsafe(self._release)
        except RuntimeError:  # the loop is closed, and its selector with it
            self._reading = False
            self._release()
