"""The data directory's lock, one process at a time.

:meth:`broker.store.RdfStore.open` takes an exclusive flock on `gateway.lock` in the data directory
and refuses, naming the directory and the holder's pid, when another process holds it.
Without it two gateways on one directory both ran: on a fresh directory the second's journal,
opened from its start, was written over by the first's records, a checkpoint of either marked the
other's synced deltas covered, and acknowledged updates were gone after a restart (found by the
durability attack pass). The lock goes with the process (a kill -9 too); the query workers and the
sync helper are exec'd children, which do not inherit it (Python's descriptors are close-on-exec).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

from broker.errors import StoreFailed

# the file a process holding the data directory keeps locked (flock), its pid written in it
LOCK = "gateway.lock"
# how long an open waits for the lock before refusing: a gateway still stopping (a checkpoint at
# close) lets go of it within seconds, and a refusal at once would spend one of systemd's starts
LOCK_WAIT_S = 5.0


class Claim:
    """This process's hold on a data directory (see the module docstring): one flock per directory
    and process, shared by the stores this process opens there (the tests reopen a directory in
    one process), let go of once the last of them closed or was dropped."""

    _held: dict[Path, tuple[BinaryIO, int]] = {}
    _guard = threading.Lock()

    def __init__(self, directory: Path) -> None:
        self.key = directory.resolve()
        with self._guard:
            file, count = self._held.get(self.key) or (_locked(directory), 0)
            self._held[self.key] = (file, count + 1)
        self.released = False

    def release(self) -> None:
        with self._guard:
            if self.released:
                return
            self.released = True
            file, count = self._held.pop(self.key)
            if count > 1:
                self._held[self.key] = (file, count - 1)
            else:
                file.close()  # the flock goes with the last descriptor of its open file


def _locked(directory: Path) -> BinaryIO:
    """`directory`'s lock file, flocked by this process, its pid written in it; StoreFailed if
    another process holds it past LOCK_WAIT_S."""
    file = (directory / LOCK).open("a+b")  # not "w": the holder's pid stays readable until we hold it
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                file.seek(0)
                holder = file.read(32).decode(errors="replace").strip() or "unknown"
                file.close()
                raise StoreFailed(
                    f"{directory} is in use by another process (pid {holder}, holding {directory / LOCK}): "
                    "stop it first, two gateways on one data directory lose each other's updates"
                ) from None
            time.sleep(0.1)
    file.truncate(0)
    file.write(b"%d\n" % os.getpid())
    file.flush()
    return file
