"""glibc's malloc arenas for a long-running gateway: at most ARENA_MAX.

Why: glibc gives each thread that allocates at the same time as another an arena of its own, up to
eight per core, and an arena keeps the pages it freed in its own free lists. The gateway's
threads take turns at pyoxigraph's native memory (the update thread writes quads, a compaction
copies the whole store on a thread of its own, queries and the feed of the workers allocate
beside them), so the freed pages of one arena are not reused by the next and RSS creeps up.
Measured with `sepa-gateway bench soak` (in memory, 1,000 readings/s, 100 subscriptions, this
2-core machine, 2026-11-27, one run each, one after the other): with glibc's default, the
gateway's RSS went 293 -> 359 MB from minute 5 to minute 15 (+23 %) and its query workers'
300 -> 433 MB; with MALLOC_ARENA_MAX=2, 313 -> 326 MB from minute 5 to minute 12 (the bench's
growth figure: +2.4 %), the workers' 334-356 MB throughout. The notification p99 was 140-250 ms
in the second run and 98-242 ms in the first: no difference this pair of runs can show.

The limit is set in this process (mallopt, before its threads start) and in the environment, so
the query workers it starts inherit it. An operator's own MALLOC_ARENA_MAX wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ARENA_MAX = 2
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)

_libc_name = ctypes.util.find_library("c")
_mallopt = getattr(ctypes.CDLL(_libc_name), "mallopt", None) if _libc_name else None  # glibc only


def limit_malloc_arenas() -> None:
    """Hold this process and the processes it starts to ARENA_MAX malloc arenas (call before any
    thread starts; a no-op without glibc)."""
    value = os.environ.setdefault("MALLOC_ARENA_MAX", str(ARENA_MAX))
    if _mallopt is not None and value.isdigit() and int(value) > 0:
        _mallopt(_M_ARENA_MAX, int(value))
