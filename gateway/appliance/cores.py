"""The gateway's Python threads on one core of a multi-core board; its worker processes on every core.

Why: the gateway's threads take turns holding the GIL (the event loop, the update thread, the
workers' feeders), so the process uses about one core whatever it is given, and each turn handed
to a thread on another core costs a cross-core wake-up and cold caches. Kept on one core, a hand-off
is a switch on the same core. Measured with `sepa-gateway bench coap` on the 2-core test machine
(2026-11-27, alternated): 2,842-3,730 readings/s against 2,718-3,504 (5 pairs, median 1.06x), the
gateway's CPU in the latency phase 8.3-8.9 s against 8.9-9.2, NL p50 1.4-2.9 ms against 2.5-4.6,
p99 13-38 ms against 20-48; an earlier scratch build pinning every task of the process: 2,997-3,829
against 2,644-3,122 (12 and 8 runs). `bench wire --no-oxigraph --updates 20000`: 1.04-1.08x (3
pairs), 0 wrong, 0 missing.

Not on RocksDB (`[store] resident = false`): there the update thread's RocksDB writes run without
the GIL, beside the event loop on the other core; pinned, `bench mqtt --on-disk` (2 pairs) kept
its readings/s (1,710-2,017 against 1,705-1,773) but its NL p50 rose to 133-141 ms from 102-106
and its p99 to 378-527 from 294-449. In memory, `bench mqtt` (2 pairs): 4,261-4,517 readings/s
against 3,531-3,642, NL p99 21-22 ms against 33.

Not in parallel mode either: there the engine pipelines an update's scheduling with the previous
one's processing on threads of its own (broker/core/pipeline.py), and on one core the two never
overlapped (tests/broker/gates/test_parallel_mode.py counts the pipelined updates: 0 pinned).

What is pinned: the threads Python started (threading.enumerate), once the gateway serves; threads
started later inherit it. Not the store's compactor (broker.compaction): its work is pyoxigraph
dumping and loading the store without the GIL (~1 s of CPU for 280,000 quads), so pinned beside
the GIL-bound threads it took their core for that time instead of using the idle one, with the
readings queueing meanwhile. Measured with `sepa-gateway bench dashboard` (1,000 readings/s with
retention at its steady state: ~110,000 live quads, ~16,000 removed a second, so a compaction is
due every ~7 s; 5 pairs alternated, 2026-11-27): NL p99 with the page open 141, 111, 176, 137,
167 ms against 236, 242, 179, 199, 150 pinned (medians 141 and 199), without it 133, 100, 122,
85, 113 against 87, 136, 130, 137, 120; the gateway's CPU the same. `bench mqtt` and `bench coap`
end before their first compaction. Native threads (RocksDB's background work) are not pinned, and
a process inherits the affinity of the thread that starts it, so the worker processes set theirs
back (broker.workers.cpus). Only `sepa-gateway run` pins (an embedding process keeps its cores), only
in memory and in sequential mode; `[engine] one_core = false` turns it off; on a board with one
core there is nothing to do.
"""

from __future__ import annotations

import contextlib
import os
import threading

from broker.api import COMPACTOR_THREAD


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
        if thread.native_id is not None and thread.name != COMPACTOR_THREAD:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(thread.native_id, {core})
    return core
