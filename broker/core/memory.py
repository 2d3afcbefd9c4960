"""Giving freed memory back to the system once subscriptions end.

Why: a re-evaluated subscription holds its whole result as Python objects; when it ends, Python
frees them, but glibc keeps the freed pages in its arenas. `malloc_trim(0)` hands free pages back;
it walks the arenas, so it runs once, TRIM_DELAY_S after the last subscription of a burst ended,
on a timer thread. Measured on the test machine: 1,000 OPTIONAL subscriptions of 5,000 rows each
took RSS from 88 MB to 2.65 GB; after all ended it stayed at 2.55 GB without the trim, 2.43 GB
with it. The rest is Python's own small-object arenas, fragmented: issue 16 item 7 (memory in
proportion to a result, given back) is not solved by this.

The same after a large update (:func:`trim_after`): it allocates far more than the store keeps (the
parsed quads as Python objects, their N-Quads for the journal and the workers, pyoxigraph's parser
and store buffers), and glibc kept it: a gateway run as installed (`run --data-dir`, resident store)
given one 23.7 MB INSERT DATA of 250,000 quads stayed at RSS 388-468 MB once it was done, where its
store holds ~190 MB of them; trimmed a second after, 324 MB (measured 2026-12-06,
`/tmp/atk-mem/m2_big.py`): memory the other processes of a 1 GB board get back. Only after updates
of TRIM_QUADS quads or more: a reading's update does not pay for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

TRIM_DELAY_S = 1.0
TRIM_QUADS = 50_000  # quads an update adds and removes before the heap is trimmed after it

_libc_name = ctypes.util.find_library("c")
_malloc_trim = getattr(ctypes.CDLL(_libc_name), "malloc_trim", None) if _libc_name else None  # glibc only


def trim() -> None:
    """Hand glibc's free pages back to the system now (no-op elsewhere)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


class Trimmer:
    """Calls malloc_trim once, TRIM_DELAY_S after the last :meth:`freed` of a burst."""

    def __init__(self) -> None:
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self.trims = 0

    def freed(self) -> None:
        if _malloc_trim is None:
            return
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(TRIM_DELAY_S, self._trim)
            self._timer.daemon = True
            self._timer.start()

    def _trim(self) -> None:
        with self._lock:
            self._timer = None
        assert _malloc_trim is not None
        _malloc_trim(0)
        self.trims += 1


_after_updates = Trimmer()


def trim_after(quads: int) -> None:
    """After an update that added and removed `quads` quads: trim the heap if it was a large one."""
    if quads >= TRIM_QUADS:
        _after_updates.freed()
