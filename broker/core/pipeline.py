"""Parallel mode (seed 001 §III-B, §VI-C): scheduling and processing pipelined, the BOOSTER in
worker processes.

In sequential mode the engine's thread does everything for one update before the next: compute
the delta, match it in the LUTT, find the solutions lost (on the store before) and gained (after),
fold them into the SPUs and notify. Here the BOOSTER work, finding the solutions, which is index
lookups in Python and so holds the GIL, runs in BOOSTER workers (:mod:`broker.workers.booster`):
processes, each with a replica of the store that follows it delta by delta. For an update:

1. the engine's thread computes the delta and matches it in the LUTT (as in sequential mode);
2. it applies the delta to the store and hands the hits to the workers, split between them, with
   the deltas they lack (each evaluates the removed hits on its replica before the delta and the
   added ones after it); then it is free for update N+1, whose delta is computed meanwhile;
3. the collector thread takes the workers' solutions of update N in update order, routes them to
   the SPUs, folds and notifies, then completes update N: its publisher gets the reply now, after
   end of processing.

So every subscription sees every update's delta, in order, and computed on the store as it was
for that update (the replica is exactly one update behind the store when it evaluates the pre
phase), however far the engine's thread has gone on.

What stays on the engine's thread, as in sequential mode, after the updates in flight are processed
(so that order is kept): an update whose hits are few (below PIPELINE_MIN_QUADS the hand-over costs
more than the lookups), one that concerns a re-evaluated subscription (the whole query runs on the
store at that update), one that creates or drops graphs, and one tried under a budget (the
scheduler's inline updates). Subscribing and unsubscribing wait for the updates in flight too: the
first result of a subscription must not include an update whose solutions are still to be folded.

Costs: each worker holds an in-memory replica of the store (about the store's own size; 40 MB of
Python besides), and takes every delta (~2-5 us a quad to serialize here once, to parse and apply
there). A worker that dies (killed, out of memory) is replaced; the SPUs are then evaluated again
on the store and the difference notified, so no subscription is left wrong.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyoxigraph import Quad

from broker.core.budget import Budget, OverBudget
from broker.core.notification import QuadRows
from broker.core.query_processor import QueryProcessor
from broker.core.spu import GraphFeedSpu, IncrementalSpu, ReevalSpu, ShapeGroup
from broker.core.spu_manager import Hits, SpuManager
from broker.core.stats import EngineStats
from broker.core.subscription import Subscription
from broker.core.update_processor import Delta
from broker.errors import EvaluationCrashed
from broker.store import RdfStore
from broker.workers.codec import Decoder, encode_all
from broker.workers.pool import Worker, batched

if TYPE_CHECKING:
    from broker.workers.pool import QueryWorkers

log = logging.getLogger(__name__)

# deltas kept for the workers between two jobs; past this many quads they are sent at once
LOG_FLUSH_QUADS = 20_000
LOG_FLUSH_DELTAS = 256
REPLY_TIMEOUT_S = 600.0  # a worker that answers nothing in this long is taken for dead
LogEntry = tuple[list[Quad], list[Quad], list[Any], list[Any]]  # a delta as the store's follower gets it


@dataclass
class InFlight:
    """One update handed to the workers, until the collector has notified what they found."""

    done: Callable[[int, dict[str, float]], None]
    fed: list[tuple[GraphFeedSpu, QuadRows, QuadRows]]
    workers: list[Worker]  # those given a job for it, in the order they answer
    timings: dict[str, float] = field(default_factory=dict)
    hold: bool = False  # completed by the engine's thread (it re-evaluates SPUs after), not the collector
    notifications: int = 0


class PipelinedSpuManager(SpuManager):
    """The SPU manager of parallel mode: the same LUTT, the incremental SPUs' BOOSTER and counts in
    `boosters` workers (each shape group lives in one of them).

    The engine's side keeps everything else: the LUTT, the subscriptions and their callbacks, the
    re-evaluated SPUs and the graph feeds. Its incremental SPUs are evaluated here only for a new
    subscriber's first result. The workers start with the first shape group (a subscription the
    incremental algorithm takes): without one there is nothing for them to do.
    """

    def __init__(
        self,
        store: RdfStore,
        queries: QueryProcessor,
        stats: EngineStats,
        *,
        boosters: int,
        workers: QueryWorkers | None = None,
    ) -> None:
        if boosters < 1:
            raise ValueError("parallel mode needs at least one BOOSTER worker")
        super().__init__(store, queries, stats, workers=workers)
        self.booster_count = boosters
        self.boosters: list[Worker] = []
        self.counters: Counter[str] = Counter()
        self._log: list[LogEntry] = []
        self._log_quads = 0
        self._fifo: deque[InFlight] = deque()
        self._idle = threading.Condition()
        self._collector: threading.Thread | None = None
        self._closed = False
        self._broken = False  # a worker died or failed: see _recover
        self._numbers = itertools.count(1)
        self._sids: dict[IncrementalSpu, int] = {}
        self._by_sid: dict[int, IncrementalSpu] = {}
        self._decoder = Decoder()
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="sepa-booster-spawn")

    # -- workers ------------------------------------------------------------------------------

    def _start(self) -> None:
        """Start the workers on a snapshot of the store and follow it from there; give them the SPUs."""
        # started from one thread alive as long as this manager: a worker dies with the thread that
        # started it (PR_SET_PDEATHSIG), so that it never outlives the engine
        self.boosters = [
            self._spawner.submit(Worker, f"sepa-booster-{index + 1}", (), None, "broker.workers.booster").result()
            for index in range(self.booster_count)
        ]
        self.store.follow(self._follow)
        # the snapshot between two deltas; the log then holds exactly the deltas after it
        self.store.at_rest(self._seed)
        for worker in self.boosters:
            worker.wait_ready()
        for group in self.groups.values():
            self._send_group(group)
            for spu in group.spus.values():
                self._send_spu(spu)
        if self._collector is None:
            self._collector = threading.Thread(target=self._collect_loop, name="sepa-collector", daemon=True)
            self._collector.start()
        log.info("parallel mode: BOOSTER workers started", extra={"workers": self.booster_count})

    def _seed(self, store: RdfStore) -> None:
        self._log, self._log_quads = [], 0
        for worker in self.boosters:
            worker.seed(store)

    def _follow(self, added: list[Quad], removed: list[Quad], created: list[Any], dropped: list[Any]) -> None:
        """The store's follower (under its lock): keep the delta for the workers."""
        self._log.append((added, removed, created, dropped))
        self._log_quads += len(added) + len(removed)

    def _take_log(self) -> list[LogEntry]:
        """The deltas the workers lack (the log is emptied)."""
        with self.store.lock:
            entries, self._log, self._log_quads = self._log, [], 0
        return entries

    def _flush(self) -> None:
        entries = self._take_log()
        if entries:
            message = batched(entries)
            for worker in self.boosters:
                worker.outbox.put(message)

    def _worker_of(self, group: ShapeGroup) -> Worker:
        return self.boosters[group.gid % len(self.boosters)]

    def _send_group(self, group: ShapeGroup) -> None:
        if not group.gid:
            group.gid = next(self._numbers)
        self._worker_of(group).outbox.put(("group", group.gid, group.arguments))

    def _send_spu(self, spu: IncrementalSpu) -> None:
        sid = self._sids.get(spu)
        if sid is None:
            sid = self._sids[spu] = next(self._numbers)
            self._by_sid[sid] = spu
        params = tuple(encode_all(branch) for branch in spu.params)
        self._worker_of(spu.group).outbox.put(("spu", sid, spu.group.gid, params))

    def _stop_workers(self) -> None:
        self.store.unfollow(self._follow)
        for worker in self.boosters:
            worker.kill()
        self.boosters = []

    def wait_idle(self) -> None:
        """Return once every update handed to the workers is processed (notified, completed)."""
        with self._idle:
            while self._fifo:
                self._idle.wait()

    @property
    def in_flight(self) -> int:
        return len(self._fifo)

    # -- subscribe / unsubscribe --------------------------------------------------------------

    def subscribe(self, sparql: str, callback: Callable, **options: Any) -> Subscription:  # type: ignore[override]
        self.wait_idle()
        self._recover()
        return super().subscribe(sparql, callback, **options)

    def _incremental(self, *args: Any) -> IncrementalSpu | GraphFeedSpu | None:  # type: ignore[override]
        """As in sequential mode; a new SPU also goes to its worker, and an SPU that has one already
        is evaluated again here for the new subscriber's first result (its counts are the worker's)."""
        groups, spus = len(self.groups), len(self._sids)
        spu = super()._incremental(*args)
        if not isinstance(spu, IncrementalSpu):
            return spu
        if spu in self._sids:
            spu.counts, spu.total = Counter(), 0
            spu.load(self.store)
            return spu
        if self._closed:
            return spu
        if not self.boosters:
            try:
                self._start()  # gives the workers this SPU too
            except OSError as error:
                log.error("parallel mode: cannot start the BOOSTER workers", extra={"reason": str(error)})
                self._stop_workers()
            return spu
        self._flush()  # the workers evaluate it on the store as it is now, like this first result
        if len(self.groups) > groups:
            self._send_group(spu.group)
        if len(self._sids) == spus:
            self._send_spu(spu)
        return spu

    def unsubscribe(self, spuid: str) -> Subscription:
        self.wait_idle()
        entry = self.subscriptions.get(spuid)
        subscription = super().unsubscribe(spuid)
        spu = entry[1] if entry is not None else None
        if isinstance(spu, IncrementalSpu) and not spu.subscribers and spu in self._sids:
            sid = self._sids.pop(spu)
            del self._by_sid[sid]
            if self.boosters:
                worker = self._worker_of(spu.group)
                worker.outbox.put(("unspu", sid))
                if spu.group.key not in self.groups:
                    worker.outbox.put(("ungroup", spu.group.gid))
        return subscription

    # -- processing ---------------------------------------------------------------------------

    def submit(
        self,
        delta: Delta,
        apply: Callable[[Delta], None],
        budget: Budget | None,
        done: Callable[[int, dict[str, float]], None],
    ) -> None:
        """Process `delta`: the incremental SPUs in the workers, `done` called by the collector thread
        in update order; here what concerns no incremental SPU, when nothing is in flight."""
        self._recover()
        if not self.boosters:
            done(*self.process(delta, apply, budget))
            return
        matched = self._match(delta)
        removed_hits, added_hits, reeval = matched
        incremental = any(not isinstance(ref, ReevalSpu) for ref in (*removed_hits, *added_hits))
        if not incremental and not reeval and not self._fifo:
            if budget is not None:
                done(*self._process_bounded(delta, apply, budget, matched))
            else:
                done(*self._process(delta, apply, self.store, None, matched))
            if self._log_quads >= LOG_FLUSH_QUADS or len(self._log) >= LOG_FLUSH_DELTAS:
                self._flush()
            return
        if budget is not None:
            raise OverBudget  # it would wait for the workers: not on an event loop
        entry = self._dispatch(delta, apply, removed_hits, added_hits, done, hold=bool(reeval))
        if reeval:  # on the store as this update left it: nothing else runs before they are done
            self.wait_idle()
            started = time.perf_counter()
            entry.notifications += self._reevaluate(reeval)
            entry.timings["t_booster_s"] = entry.timings.get("t_booster_s", 0.0) + time.perf_counter() - started
            entry.timings["lutt_hits"] = entry.timings.get("lutt_hits", 0) + sum(len(spu.subscribers) for spu in reeval)
            done(entry.notifications, entry.timings)

    def _items(self, hits: Hits, quads: list[Quad]) -> dict[Worker, list[Any]]:
        """The incremental hits as work items, per worker (the one holding the group)."""
        index = {quad: position for position, quad in enumerate(quads)}
        shares: dict[Worker, list[Any]] = {}
        for ref, entries in hits.items():
            if isinstance(ref, ReevalSpu):
                continue
            group, branch, pattern = ref
            sids = self._sids
            sent = [
                (index[quad], sids[next(iter(spus))] if spus is not None and len(spus) == 1 else None)  # type: ignore[call-overload]
                for quad, spus in entries
            ]
            shares.setdefault(self._worker_of(group), []).append((group.gid, branch, pattern, sent))
        return shares

    def _dispatch(
        self,
        delta: Delta,
        apply: Callable[[Delta], None],
        removed_hits: Hits,
        added_hits: Hits,
        done: Callable[[int, dict[str, float]], None],
        *,
        hold: bool,
    ) -> InFlight:
        started = time.perf_counter()
        before = self._take_log()
        apply(delta)
        applied = time.perf_counter()
        own = self._take_log()  # this update's delta, as the follower logged it (workers index into it)
        added, removed = (own[0][0], own[0][1]) if own else ([], [])
        removed_items = self._items(removed_hits, removed)
        added_items = self._items(added_hits, added)
        fed = self._feed_hits(delta) if self.feeds else []
        micros = self.store.clock.micros()
        busy = [worker for worker in self.boosters if worker in removed_items or worker in added_items]
        entry = InFlight(done, fed, busy, hold=hold)
        prior = batched(before)[1] if before else []
        step = batched(own)[1] if own else [(b"", b"", (), ())]
        messages = []
        for worker in self.boosters:
            if worker in busy:
                job = ("boost", micros, prior, removed_items.get(worker, []), step, added_items.get(worker, []))
                messages.append((worker, job))
            else:
                messages.append((worker, ("apply", prior + step)))
        entry.timings = {"t_apply_s": applied - started}
        with self._idle:
            self._fifo.append(entry)
            self._idle.notify_all()
        for worker, message in messages:
            worker.outbox.put(message)
        self.counters["pipelined"] += 1
        return entry

    # -- the collector thread -----------------------------------------------------------------

    def _collect_loop(self) -> None:
        while True:
            with self._idle:
                while not self._fifo and not self._closed:
                    self._idle.wait()
                if not self._fifo:
                    return
                entry = self._fifo[0]
            started = time.perf_counter()
            try:
                self._fold(entry)
            except Exception:  # an engine bug: logged; the update was applied and must complete
                log.exception("parallel mode: notifying an update failed")
            entry.timings["t_notify_s"] = time.perf_counter() - started
            with self._idle:
                self._fifo.popleft()
                self._idle.notify_all()
            if not entry.hold:
                try:
                    entry.done(entry.notifications, entry.timings)
                except Exception:
                    log.exception("parallel mode: completing an update failed")

    def _fold(self, entry: InFlight) -> None:
        """Notify what the workers found for `entry`, then its graph feeds."""
        booster_s = 0.0
        terms = self._decoder.terms
        notifications = hits = 0
        for worker in entry.workers:
            reply = self._reply(worker)
            if reply is None:
                continue
            _, notices, seconds = reply
            booster_s = max(booster_s, seconds)
            for sid, added, removed, boolean, previous in notices:
                spu = self._by_sid.get(sid)
                if spu is None:
                    continue
                rows_added = tuple(terms(row) for row in added)
                rows_removed = tuple(terms(row) for row in removed)
                notifications += spu.notify(rows_added, rows_removed, boolean, previous)
                hits += len(spu.subscribers)
        for feed, added_rows, removed_rows in entry.fed:
            notifications += feed.apply(added_rows, removed_rows)
            hits += len(feed.subscribers)
        entry.notifications += notifications
        entry.timings["t_booster_s"] = booster_s
        entry.timings["lutt_hits"] = hits

    def _reply(self, worker: Worker) -> tuple[Any, ...] | None:
        """`worker`'s answer to its oldest job; None if it failed or died (logged; see :meth:`_recover`)."""
        try:
            if worker.connection.poll(REPLY_TIMEOUT_S):
                reply: tuple[Any, ...] = worker.connection.recv()
                if reply[0] == "boosted":
                    return reply
                log.error("parallel mode: BOOSTER job failed", extra={"reason": reply[1]})
                self.counters["failed"] += 1
                self._broken = True
                return None
        except (EOFError, OSError):
            pass
        log.error("parallel mode: a BOOSTER worker died", extra={"worker": worker.name})
        self.counters["died"] += 1
        self._broken = True
        return None

    # -- recovery -----------------------------------------------------------------------------

    def _recover(self) -> None:
        """After a worker died or failed a job, the counts of its SPUs are lost or wrong: end every
        incremental subscription (each told why, as one whose re-evaluation failed), and start the
        workers afresh. On the engine's thread, with nothing in flight."""
        if not self._broken:
            return
        self.wait_idle()
        self._broken = False
        self._stop_workers()
        self.counters["recovered"] += 1
        error = EvaluationCrashed("a BOOSTER worker of parallel mode failed; subscribe again")
        ended = [spu for group in list(self.groups.values()) for spu in list(group.spus.values())]
        log.warning("parallel mode: subscriptions ended after a worker failure", extra={"spus": len(ended)})
        for spu in ended:
            self._end(spu, error)  # type: ignore[arg-type]

    def close(self) -> None:
        with self._idle:
            self._closed = True
            self._idle.notify_all()
        if self._collector is not None:
            self._collector.join(10)
        self._stop_workers()
        self._spawner.shutdown(wait=False)
        super().close()
