"""The gateway's Python threads on one core of a multi-core board; its worker processes on every core.

Why: the gateway's threads take turns holding the GIL (the event loop, the update thread, the
workers' feeders), so the process uses about one core whatever it is given, and each turn handed
to a thread on another core costs a cross-core wake-up and cold caches. Kept on one core, a hand-off
is a switch on the same core. Measured with `sepa-gateway bench coap` on the 2-core test machine
(2026-11-27, alternated, the whole process pinned): 2,997-3,829 readings/s against 2,644-3,122
(12 against 8 runs), the gateway's CPU 5-10 % lower, NL p50 lower; NL p99 17-53 ms against 18-32.
`bench wire --no-oxigraph`: 4,159-4,200 updates/s against 3,904-4,092 (3 pairs).

What is pinned: the threads Python started (threading.enumerate), once the gateway serves; threads
started later inherit it. Native threads (RocksDB's background work) are not, and a process
inherits the affinity of the thread that starts it, so the worker processes set theirs back
(broker.workers.cpus). Only `sepa-gateway run` pins (an embedding process keeps its cores);
`[engine] one_core = false` turns it off; on a board with one core there is nothing to do.
"""

from __future__ import annotations

import contextlib
import os
import threading


def pin_threads() -> int | None:
    """Pin the main thread and every Python thread to the last core this process may use; that
    core, or None when it may use only one (or the platform has no affinity)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    core = allowed[-1]
    for thread in threading.enumerate():
        if thread.native_id is not None:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(thread.native_id, {core})
    return core
