"""Hand the C heap's free memory back to the kernel a little after a large update.

Why: an update of many quads allocates, in this process, far more than the store keeps (the
parsed quads as Python objects, their N-Quads for the journal and the workers, pyoxigraph's parser
and store buffers), and glibc keeps most of what is freed in its heap for later: a gateway run as
installed (`run --data-dir`, resident store) given one 23.7 MB INSERT DATA of 250,000 quads stayed
at RSS 388-468 MB once it was done, where its store holds ~190 MB of them (measured 2026-12-06,
`/tmp/atk-mem/m2_big.py`), memory no other process of a 1 GB board got back. `malloc_trim(0)`
returns the free pages (madvise), as much as the heap allows. Asked a second after the update
(the reply and the delta's objects are let go of by then), at most one pending at a time; it runs
on a timer thread, holding the allocator's lock for its length (a few ms for hundreds of MB).
Only after updates of TRIM_QUADS quads or more: a reading's update does not pay for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_QUADS = 50_000  # quads an update adds and removes before the heap is trimmed after it
TRIM_DELAY_S = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (another C library: nothing to do)."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


_TRIM = _malloc_trim()
_pending: threading.Timer | None = None
_lock = threading.Lock()


def trim_after(quads: int) -> None:
    """After an update of `quads` quads added and removed: trim the heap TRIM_DELAY_S later, once."""
    global _pending
    if quads < TRIM_QUADS or _TRIM is None:
        return
    with _lock:
        if _pending is not None:
            return
        _pending = threading.Timer(TRIM_DELAY_S, _trim)
        _pending.daemon = True
        _pending.start()


def _trim() -> None:
    global _pending
    with _lock:
        _pending = None
    assert _TRIM is not None
    _TRIM(0)
