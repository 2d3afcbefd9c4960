"""When to compact the store: often enough that dead versions cost little, rarely enough that
compacting costs little.

A compaction (:meth:`broker.store.RdfStore.compact`) costs in proportion to the store, and dead
versions cost each lookup of the keys they belong to in proportion to their number. In memory,
once as many quads were removed since the last compaction as it found alive (at least
MIN_GARBAGE) the live ones are counted, and it is due once twice as many were removed
(DEAD_PER_LIVE) as are alive; else they are counted again once that many were. A store then holds at most twice as
many dead quads as it had live ones when last counted (or compacted), and a compaction copies about
one live quad per two removed. Why not one for one, as first built: copying costs ~9 us a live
quad (dump and load, on the 2-core test machine), four times a removal, and the gateway and each
replica copy at the same moment. With 100 sensors at 1,000 readings/s and retention (~133,000 live
quads) all three copied every ~7 s, ~0.5 of a core in all. At two for one, alternated with the
build before (2 pairs of 2 x 15 s, as installed, in memory): the gateway's and its replicas' CPU
17.4 against 20.0 CPU-s a phase (lower in 4 of 4), each replica's 2.4 against 3.2, NL p99 33-116
ms against 113-199; peak RSS no higher (the gateway 300-325 MB against 333-392, the replicas
184-256 against 222-259: the peak is the compaction's own copy).
A small store is compacted every MIN_GARBAGE removals (milliseconds each): a value replaced
50,000 times in a row keeps its lookup and update within 1.5x of the first (bench growth). No other pacing: a first
version also waited 50 times a compaction's duration before the next, and at 1,000 readings/s
with retention that ran away (a longer wait, more dead quads, a longer compaction: 5 million dead
quads and 1.7 GB after 11 minutes of bench soak).

A removal counts once, and once more for each 256 characters of a long literal it removed
(`broker.store.delta.dead_weight`): a dead version keeps its terms, and counted by quads alone, a client
inserting and deleting a 900,000-character literal 300 times took a 588-quad store's gateway from
82 to 355 MB and each query worker's replica to 448 MB before a compaction came; weighed, 92-99 MB
and 55-60 MB throughout (`/tmp/atk-p/p9_dead_bytes.py`, 181 small compactions). So the dead
characters are bounded as the dead quads are: twice the live quads' count times 256.

Counting all removals lets one key pile up dead versions in a large store: its quads replaced
10,000 times in a store of 300,000, a lookup of it took 161 us instead of 0.7 (pyoxigraph reads past
each, ~16 ns). So in memory the removals are also counted by subject (RdfStore.hottest, 4,096
buckets of a hash), and a compaction is due once one bucket reaches HOT_REMOVALS, spaced by
HOT_SPACING times the last compaction's duration and at least HOT_MIN_S: a compaction costs in
proportion to the store, so a very hot key in a large store is held to what it gets in that time.
What that spacing leaves, measured: `bench growth --filler 100000 --replacements 60000` (one key
replaced ~2,000 times a second, one run alternated with the build before) had one such compaction
in its ~30 s, and its worst lookup window was 2.50x the first against 2.59x (update 3.8x against
2.8x, noise of one run). The rule is for keys replaced at a sensor's pace, where 1,000 removals
take minutes and the count of all removals in a large store hours. Its cost on the update path:
`bench wire` 3,650 / 3,564 / 3,611 updates/s against 3,624 / 3,366 / 3,240 (3 pairs, 0 wrong or
missing), `bench lighting` LAMP 6,848 / 6,533 against 7,012 / 7,044 and ROAD 674 / 638 against
665 / 649 (2 pairs).

On disk RocksDB does not say how much is alive, and Store.optimize rewrites the whole database:
due after MIN_GARBAGE_DISK removals, and at most a DUTY share of the time (after an optimize that
took d seconds, the next waits d / DUTY, at most MAX_WAIT_S). RocksDB compacts in the background
meanwhile as well.

The gateway runs a :class:`Compactor` thread on its store, and so does every replica:
the thread also takes a resident store's checkpoints (:meth:`broker.store.RdfStore.checkpoint`:
a snapshot written without the store's lock, which a compaction must not swap from under it). a query
worker's (:func:`broker.workers.replica.serve`: called between messages, a compaction kept it from
answering any job for its duration, ~1 s at 1,000 readings/s; its copy runs at the lowest priority,
and took 23 s beside two busy processes on the 2-core test machine) and a BOOSTER worker's
(:func:`broker.workers.booster.serve`, whose jobs held every update's reply meanwhile). A replica is
told at seeding how many quads it holds:
counting them at the first check stopped a BOOSTER worker 130 ms with the lighting knowledge base
(334k quads), a fifth of its time in parallel mode's ROAD experiment.
A query worker's replica compacts at REPLICA_DEAD_PER_LIVE (2.5), not at the gateway's 2. Why: it
follows the gateway's deltas, so at the same ratio all three (the gateway, two replicas) compacted at
the same moment, and at its end the gateway's free under the GIL and the replicas' copies and frees
filled both cores: readings waited 0.2-0.4 s (NL p50 70-170 ms), the publisher itself stalled ~100
ms. Staggered, 5 pairs alternated with the build before (one 40 s phase of 1,000 readings/s as
installed, on disk; throwaway scripts, 2026-12-05): NL p99 68.6, 81.8, 42.4, 74.6, 115.9 ms
against 109.4, 83.8, 61.8, 81.8, 110.1 (lower in 4 of 5; median 74.6 against 83.8), p999 119-179
against 135-182: a gain within the machine's noise, not a cure. A replica holds up to 2.5 dead
quads a live one (its lookups read past them) and copies a fifth less often.

What a compaction holds the GIL for, measured on 2026-12-06 (`/tmp/atk-nl/cstall.py`, `dropways.py`,
`itertrick.py`, `dumpab*.py`: a store of 100 sensors' readings, 130,000 live and 260,000 dead
quads, as `bench dashboard` keeps; a thread sleeping 1 ms reports its longest gap; the 2-core test
machine at load average 6-8 from other work): the copy and the replay, 1.2-1.3 s, held the others
19-30 ms at most, most of it the dump's bytes, made under the GIL by the copy's thread at niceness
19, which a busy machine preempts while it holds it (24-383 ms, median 43, in 16 dumps alone; now
through a memory file, 5-91 ms, median 13: :func:`broker.store.dump_nquads`). Then the old store
is freed when :meth:`RdfStore.compact` returns, in one piece: 129-285 ms with mimalloc (the
installed service's malloc), 425 ms with glibc's: that is the stall at a compaction's end. The
trim after it (:func:`broker.core.memory.trim`, through ctypes) lets go of the GIL: 0 ms under
mimalloc, 83 ms in glibc's arenas. The free cannot leave the GIL with pyoxigraph 0.5.13: pyo3
drops a Store in its `tp_dealloc`, under the GIL, on whichever thread lets go of it last (freed
on a thread of its own: a 252 ms gap, against 237 on the caller's); `Store.clear` lets go of the
GIL (a 6.5 ms gap over its 134 ms) but frees nothing: the memory storage is MVCC and only marks
each quad removed (upstream's `TODO: garbage collection`), and the free after it took as long
(286 ms); the last reference handed to a query's results (a SELECT over VALUES, taken before the
store is let go of) moves the free into their dealloc, under the GIL too (105-220 ms). What would
move it: a pyoxigraph call that drops its storage inside `py.detach`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager

from broker.background import at_low_priority
from broker.core.memory import trim
from broker.store import RdfStore

log = logging.getLogger(__name__)

THREAD_NAME = "sepa-compactor"  # gateway.appliance.cores leaves it on every core (its work holds no GIL)
MIN_GARBAGE = 1_000
DEAD_PER_LIVE = 2  # in memory: due once this many quads were removed per live one (see the module docstring)
REPLICA_DEAD_PER_LIVE = 2.5  # a query worker's replica: not at the gateway's moment (see Compactor)
MIN_GARBAGE_DISK = 5_000
DUTY = 0.02  # on disk: share of the time spent compacting at most
MAX_WAIT_S = 60.0
CHECK_S = 0.5  # how often the thread looks at the count
# in memory, also due once this many quads of one subject (RdfStore.hottest) were removed, at most
# once per HOT_SPACING times the last compaction's duration and never sooner than HOT_MIN_S after it
HOT_REMOVALS = 1_000
HOT_SPACING = 50
HOT_MIN_S = 10.0


class Compactor:
    """Compacts `store` when due (see the module docstring); :attr:`stats` for /metrics."""

    def __init__(
        self,
        store: RdfStore,
        *,
        min_garbage: int | None = None,
        duty: float = DUTY,
        live: int = 0,
        around: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        dead_per_live: float = DEAD_PER_LIVE,
    ) -> None:
        """`live`: how many quads `store` is known to hold now (a replica just seeded), so that the
        first check does not count them (see :meth:`maybe_compact`). `around`: a context each
        compaction runs in (a replica's: room for the copy beside a job's memory limit,
        :class:`broker.workers.replica.MemoryBound`)."""
        self.store = store
        self.around = around
        self.dead_per_live = dead_per_live
        if min_garbage is None:
            min_garbage = MIN_GARBAGE_DISK if store.rocksdb else MIN_GARBAGE
        self.min_garbage = min_garbage
        self.threshold = max(min_garbage, live)
        self.duty = duty
        self.stats: Counter[str] = Counter()
        self._not_before = 0.0
        self._hot_after = time.monotonic() + HOT_MIN_S
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def due(self) -> bool:
        return self.store.garbage >= self.threshold and time.monotonic() >= self._not_before

    def hot(self) -> bool:
        """Due for a key replaced again and again (in memory): however many quads the store holds,
        a subject's dead versions stay about HOT_REMOVALS, or what it gets in HOT_SPACING times a
        compaction. Why: the count of all removals (:meth:`due`) waits for twice the store's live
        quads, and every lookup of a hot key reads past its dead versions meanwhile: an actuator's
        state or a sensor's latest value in a 300,000-quad building model could pile up hundreds of
        thousands of them (RdfStore.hottest has what each costs)."""
        return (
            not self.store.rocksdb
            and self.store.garbage >= self.min_garbage
            and time.monotonic() >= self._hot_after
            and self.store.hottest() >= HOT_REMOVALS
        )

    def maybe_compact(self) -> bool:
        """Compact if due; whether it did."""
        hot = False
        if not self.due():
            if not self.hot():
                return False
            hot = True
        elif not self.store.rocksdb:
            live = at_low_priority(self.store.live_quads)  # ~390 ns a quad (130 ms for 334k), without the GIL
            if self.store.garbage < live * self.dead_per_live:
                self.threshold = int(live * self.dead_per_live)  # counted again then (a steady store: due)
                if not self.hot():
                    return False
                hot = True
        started = time.monotonic()
        garbage = self.store.garbage
        with self.around():
            live = self.store.compact()
        if live is not None:
            self.threshold = max(self.min_garbage, live)
        trim()  # the old store's memory, back to the system
        took = time.monotonic() - started
        if self.store.rocksdb:
            self._not_before = time.monotonic() + min(MAX_WAIT_S, took / self.duty)
        self._hot_after = time.monotonic() + max(HOT_MIN_S, HOT_SPACING * took)
        self.stats["compactions"] += 1
        self.stats["hot_compactions"] += hot
        self.stats["compacted_quads"] += garbage
        self.stats["compaction_ms"] += round(took * 1000)
        log.debug("store compacted", extra={"dead_quads": garbage, "ms": round(took * 1000, 1)})
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(CHECK_S):
            try:
                self.maybe_compact()
            except Exception:  # noqa: BLE001 - a failed compaction leaves the old store in place
                self.stats["failures"] += 1
                log.exception("store compaction failed")
                self._not_before = time.monotonic() + 60
            self.maybe_checkpoint()

    def maybe_checkpoint(self) -> bool:
        """Take a resident store's checkpoint if due; whether it did. A failure (a full disk) is
        logged and counted, and tried again at the next check: the journals keep every delta."""
        if not self.store.checkpoint_due:
            return False
        try:
            started = time.monotonic()
            if not self.store.checkpoint():
                return False
        except OSError as error:
            self.stats["checkpoint_failures"] += 1
            log.error("no snapshot of the store written", extra={"error": str(error)})
            return False
        self.stats["checkpoints"] += 1
        self.stats["checkpoint_ms"] += round((time.monotonic() - started) * 1000)
        return True

    def close(self) -> None:
        """Stop the thread (a compaction under way finishes first)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
