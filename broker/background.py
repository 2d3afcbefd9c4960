"""Run a native call that lets go of the GIL (pyoxigraph dumping, loading, counting, RocksDB
compacting) on a thread of its own at the lowest CPU priority, and wait for it.

Why: compacting the store is CPU-bound native work on a thread that is not the gateway's (see
broker.compaction), and it came due in the gateway and in each query worker's replica at once (they
replay the same deltas): at 1,000 readings/s with retention, three copies of ~110,000 quads took a
core each for ~0.7 s on a 2-core board, the MQTT publisher and Mosquitto were starved with them,
and the notification latency's p99 was 115-173 ms with them against 30-62 ms with compaction
switched off. At niceness 19 that work takes the CPU nobody else wants: 65 and 108 ms against 160
and 173 ms (2 pairs alternated, 2026-12-04: 100 sensors, 1,000 MQTT readings/s for 15 s after a
10 s warm-up, 100 observations kept per sensor, pruned every 2 s: `bench dashboard`'s gateway
without the browser). A copy then takes 1.1-1.8 s instead of 0.4-0.9 s, which costs nothing but
the memory of the dead versions meanwhile. What is left of a compaction's stall holds the GIL and
cannot move here: replaying the deltas that came during the copy (~1 ms each; under the store's
lock only the last few, broker.store.rdf_store REPLAY_LOCKED_MAX) and freeing the old store (~105 ms
for ~240,000 quads, live and dead: pyoxigraph frees it under the GIL).

Only native calls belong here, and only what they do without the GIL: a thread at low priority that
holds the GIL when it is preempted holds up every other thread of the process. `Store.dump` into
bytes did (it makes the bytes under the GIL): 24-383 ms on a loaded machine, where a dump into a
memory file does not (:func:`broker.store.dump_nquads`)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
LOWEST = 19


def at_low_priority(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)`` on a new thread at niceness LOWEST (where the platform has
    per-thread priorities: Linux); its result, or its exception raised here."""
    outcome: list[Any] = []

    def run() -> None:
        with contextlib.suppress(AttributeError, OSError):  # no setpriority, or not allowed: as is
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST)
        try:
            outcome.append((True, call(*args, **kwargs)))
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            outcome.append((False, error))

    thread = threading.Thread(target=run, name="sepa-low-priority", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
