"""Parallel mode (seed 001 §III-B, §VI-C): scheduling and processing pipelined, the BOOSTER in
worker processes.

In sequential mode the engine's thread does everything for one update before the next: compute
the delta, match it in the LUTT, find the solutions lost (on the store before) and gained (after),
fold them into the SPUs and notify. The finding, the BOOSTER, is index lookups and joins in Python
that hold the GIL. Here an update with many hits has its BOOSTER run in worker processes
(:mod:`broker.workers.booster`), each with a replica of the store that follows it delta by delta:

1. the engine's thread computes the delta and matches it in the LUTT (as in sequential mode);
2. it applies the delta to the store and hands the hits to the workers, each (group, pattern)'s
   quads split between them, with the deltas they lack; each evaluates the removed hits on its
   replica before the update's delta and the added ones after it. The engine's thread is then free
   for update N+1, whose delta it computes meanwhile;
3. the collector thread takes the workers' answers for update N, in update order, routes them to
   the SPUs, folds them into their counts, notifies, then completes update N: its publisher gets
   the reply now, after end of processing.

So every subscription sees every update's delta, in order, computed on the store as it was for
that update (a replica is exactly one update behind the store when it evaluates the pre phase),
however far the engine's thread has gone on. The SPUs, their counts, the subscriptions and their
callbacks all stay in this process; the workers answer only with the solutions some SPU wants (a
coarse pattern's hits mostly concern nobody: of seed 001 Fig. 7's 200 changed quads an update, the
four S_ROAD subscriptions want 100 of one update in ten).

What runs on the engine's thread as in sequential mode, when nothing is in flight: an update with
fewer than OFFLOAD_MIN_QUADS hit quads (a job costs about as much as ten lookups), one tried under
a budget (the scheduler's inline updates). When updates are in flight, a small update is handed to
the pipeline too (it completes in order), an update under a budget is refused (OverBudget: the
scheduler runs it on its update thread instead), and one that concerns a re-evaluated subscription,
or creates or drops graphs, waits for them and runs here (the whole query on the store as that
update leaves it). Subscribing and unsubscribing wait for the updates in flight: a first result
must not include an update whose solutions are still to be folded.

Costs: each worker holds an in-memory replica of the store (about the store's own size, plus ~40 MB
of Python), and takes every delta (serialized here once, parsed and applied there). A worker that
dies, fails a job or stops answering is replaced, and every incremental SPU is evaluated again on
the store and the difference notified, so no subscription is left wrong; the updates it left
unfinished complete after that (see _collect_loop and _recover).
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyoxigraph import Quad, RdfFormat, serialize

from broker.core.budget import Budget, OverBudget
from broker.core.notification import QuadRows
from broker.core.query_processor import QueryProcessor
from broker.core.spu import GraphFeedSpu, IncrementalSpu, Mu, ShapeGroup
from broker.core.spu_manager import Hits, SpuManager
from broker.core.stats import EngineStats
from broker.core.subscription import Subscription
from broker.core.update_processor import Delta
from broker.errors import SepaError, TimeLimitExceeded
from broker.store import RdfStore
from broker.workers.codec import OVER, TIMED_OUT, Answers, Decoder, Item, encode_all
from broker.workers.pool import Worker, batched

if TYPE_CHECKING:
    from broker.workers.pool import QueryWorkers

log = logging.getLogger(__name__)

# deltas kept for the workers between two jobs; past this many quads they are sent at once
LOG_FLUSH_QUADS = 20_000
LOG_FLUSH_DELTAS = 256
# a worker that answers nothing in this long is taken for dead, killed and replaced. Why not longer: a
# stopped worker (SIGSTOP) held every update and subscribe behind it for the 600 s this was (an
# attack pass). A job is one update's BOOSTER lookups, milliseconds; one past a minute comes from a
# subscription whose lookups explode, and the recovery evaluates it again on the store anyway.
REPLY_TIMEOUT_S = 60.0
# how often the collector, while nothing is in flight, looks whether a send to a worker has been
# stuck past REPLY_TIMEOUT_S (see _stuck_send)
SEND_CHECK_S = 1.0
# updates with fewer incremental hits than this are looked up on the engine's thread when nothing is
# in flight: a job costs the engine ~0.1-0.2 ms (serializing, two thread wake-ups, the reply), about
# as much as the lookups of ten quads
OFFLOAD_MIN_QUADS = 16
Route = tuple[ShapeGroup, int, list[Any]]  # where a job's answers go: group, branch, per hit its SPU or None
PROTOCOL = pickle.HIGHEST_PROTOCOL
LogEntry = tuple[list[Quad], list[Quad], list[Any], list[Any]]  # a delta as the store's follower gets it


def _step(entry: LogEntry) -> tuple[bytes, bytes, tuple[str, ...], tuple[str, ...]]:
    """One delta as an ``apply`` step (:func:`broker.workers.pool.batched`), its quads in the
    follower's order (the workers find hit quads by their index in it)."""
    added, removed, created, dropped = entry
    return (
        serialize(added, format=RdfFormat.N_QUADS) if added else b"",
        serialize(removed, format=RdfFormat.N_QUADS) if removed else b"",
        tuple(graph.value for graph in created),
        tuple(graph.value for graph in dropped),
    )


@dataclass
class InFlight:
    """One update handed to the workers, until the collector has folded and notified its solutions."""

    done: Callable[[int, dict[str, float]], None]
    fed: list[tuple[GraphFeedSpu, QuadRows, QuadRows]]
    # per worker given a job for it: (worker, how to route the answers for removed quads, for added ones)
    jobs: list[tuple[Worker, list[Route], list[Route]]]
    timings: dict[str, float] = field(default_factory=dict)


class PipelinedSpuManager(SpuManager):
    """The SPU manager of parallel mode: the same LUTT, SPUs and counts; the BOOSTER of updates with
    many hits in `boosters` worker processes, pipelined.

    The workers start with the first shape group (a subscription the incremental algorithm takes):
    without one there is nothing for them to do. Thread-safe like its base: the engine serializes
    calls; the collector thread only folds and notifies what was handed to it, in order.
    """

    defers = False  # the pipeline orders re-evaluations with the updates in flight: the gate coalesces

    def __init__(
        self,
        store: RdfStore,
        queries: QueryProcessor,
        stats: EngineStats,
        *,
        boosters: int,
        workers: QueryWorkers | None = None,
        max_rows: int | None = None,
        max_held_rows: int | None = None,
        max_held_rows_per_client: int | None = None,
        max_reeval_seconds_per_client: float | None = None,
    ) -> None:
        if boosters < 1:
            raise ValueError("parallel mode needs at least one BOOSTER worker")
        super().__init__(
            store,
            queries,
            stats,
            workers=workers,
            max_rows=max_rows,
            max_held_rows=max_held_rows,
            max_held_rows_per_client=max_held_rows_per_client,
            max_reeval_seconds_per_client=max_reeval_seconds_per_client,
        )
        self.booster_count = boosters
        self.boosters: list[Worker] = []
        self.counters: Counter[str] = Counter()
        self._log: list[LogEntry] = []
        self._log_quads = 0
        self._fifo: deque[InFlight] = deque()
        self._idle = threading.Condition()
        self._collector: threading.Thread | None = None
        self._closed = False
        self._broken = False  # a worker died or failed a job: see _recover
        self._dead: set[Worker] = set()  # the workers found dead (each counted once)
        self._sending: tuple[Worker, float] | None = None  # the engine's send under way, since when
        self._restarting = False  # _recover is stopping and starting the workers
        # updates whose solutions a failed worker lost: folded by no one, completed by _recover once
        # every SPU is evaluated again (see _collect_loop)
        self._unfinished: list[InFlight] = []
        # called by the collector once it holds such updates and nothing else is in flight: the engine
        # then calls recover() under its lock (see Engine.recover)
        self.on_broken: Callable[[], None] | None = None
        # SPUs the collector found past max_rows (their subscribers told, not notified since), and why:
        # ended by the engine's thread, see _recover
        self._past: dict[IncrementalSpu, SepaError] = {}
        # the graphs the replicas hold: those the shape groups read (None: all); see _follow
        self._graphs: frozenset[object] | None = frozenset()
        self._gids = itertools.count(1)
        self._decoder = Decoder()
        # started from one thread alive as long as this manager: a worker dies with the thread that
        # started it (PR_SET_PDEATHSIG), so that it never outlives the engine
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="sepa-booster-spawn")

    # -- workers ------------------------------------------------------------------------------

    def _start(self, running: bool = False) -> None:
        """Start the workers on a snapshot of the store and follow it from there; tell them the SPUs.
        `running`: the workers run and are followed already; they start over on a new snapshot
        (see :meth:`_index_group`).

        Not on a single core (the process's CPU affinity): a worker could only take turns with the
        engine's thread for it, and a job costs more than its lookups save. Measured with
        ``taskset -c 0 sepa-gateway bench parallel --workers 1``: with a worker, Fig. 7 and ROAD took
        1.56x and 1.73x as long as sequential mode; without, parallel mode is sequential mode."""
        if len(os.sched_getaffinity(0)) < 2:
            if not self.counters["single_core"]:
                log.info("parallel mode on one core: the BOOSTER runs on the engine's thread")
            self.counters["single_core"] = 1
            return
        try:
            if not running:
                self.boosters = [self._spawn(index) for index in range(self.booster_count)]
                self.store.follow(self._follow)
            # the snapshot between two deltas; the log then holds exactly the deltas after it
            self.store.at_rest(self._seed)
            for worker in self.boosters:
                worker.wait_ready()
        except OSError as error:  # then sequential mode: the engine's thread does it all
            log.error("parallel mode: cannot start the BOOSTER workers", extra={"reason": str(error)})
            self._stop_workers()
            return
        for group in self.groups.values():
            self._tell_group(group, add=True)
            for spu in group.spus.values():
                self._tell_spu(spu, 1)
        if self._collector is None:
            self._collector = threading.Thread(target=self._collect_loop, name="sepa-collector", daemon=True)
            self._collector.start()
        log.info("parallel mode: BOOSTER workers started", extra={"workers": self.booster_count})

    def _spawn(self, index: int) -> Worker:
        """Started from the spawner's thread, which lives as long as this manager (see __init__)."""
        return self._spawner.submit(Worker, f"sepa-booster-{index + 1}", (), None, "broker.workers.booster").result()

    def _seed(self, store: RdfStore) -> None:
        self._log, self._log_quads = [], 0
        self._graphs = self._graphs_read()
        for worker in self.boosters:
            worker.seed(store, self._graphs)

    def _graphs_read(self) -> frozenset[object] | None:
        found: set[object] = set()
        for group in self.groups.values():
            graphs = group.graphs_read()
            if graphs is None:
                return None
            found |= graphs
        return frozenset(found)

    def _follow(
        self, added: list[Quad], removed: list[Quad], created: list[Any], dropped: list[Any], _sequence: str = ""
    ) -> None:
        """The store's follower (under its lock): keep the delta for the workers, only its quads in
        the graphs some shape group reads. Why: the observations graph is ten of a reading's eleven
        quads and no incremental subscription of bench mqtt reads it; serialized for the replicas and
        applied there, it made parallel mode 0.65-0.70x sequential in readings/s. Without it (a
        throwaway build that dropped that graph by name): 1,510 against 1,510."""
        graphs = self._graphs
        if graphs is not None:
            added = [quad for quad in added if quad.graph_name in graphs]
            removed = [quad for quad in removed if quad.graph_name in graphs]
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
            self._tell(batched(entries))

    def _tell(self, message: tuple[Any, ...]) -> None:
        for worker in self.boosters:
            self._send(worker, message)

    def _send(self, worker: Worker, message: tuple[Any, ...] | bytes) -> None:
        """Send from this thread (once a worker is ready its feeding thread is idle): a hand-over to
        that thread cost the engine a wake-up and a GIL switch per job. Pickled here with plain
        pickle: Connection.send makes a ForkingPickler per message, a fifth of a small job's cost
        on the engine's side. A worker that is gone is found out by the collector, or by the next job."""
        self._sending = (worker, time.monotonic())
        try:
            worker.connection.send_bytes(message if isinstance(message, bytes) else pickle.dumps(message, PROTOCOL))
        except OSError:
            # found dead here rather than by the collector, whose wait for its reply is then skipped:
            # counted all the same (sepa_parallel_died_total stayed 0 when a send found it first)
            self._found_dead(worker)
        finally:
            self._sending = None

    def _dead_while_idle(self) -> None:
        """A worker that died while nothing was in flight (the OOM killer, an operator's kill): the
        workers are recovered now, not at the next request (/health said "not ready" until then,
        and the next update paid the recovery; an attack pass)."""
        if self._broken or self._restarting or self.on_broken is None:
            return
        dead = [worker for worker in self.boosters if worker.process.poll() is not None]
        for worker in dead:
            self._found_dead(worker)
        if dead:
            self.on_broken()

    def _stuck_send(self) -> None:
        """Kill the worker a send has been stuck on past REPLY_TIMEOUT_S: the send then fails and
        finds it dead. Why: a worker that reads nothing (SIGSTOP) fills its socket with the deltas
        the engine feeds it, and the next send blocked the engine's thread for as long as the
        worker was stopped (99.8 s in an attack pass, with a re-evaluated subscription, whose
        updates feed the workers without a job the collector would wait for)."""
        sending = self._sending
        if sending is not None and time.monotonic() - sending[1] > REPLY_TIMEOUT_S:
            sending[0].process.kill()

    def _found_dead(self, worker: Worker) -> None:
        """`worker` died or stopped answering: logged and counted once (both the engine's thread,
        sending, and the collector, waiting for its reply, may find it), and the workers are broken."""
        with self._idle:
            first = worker not in self._dead
            self._dead.add(worker)
        if first:
            log.error("parallel mode: a BOOSTER worker died or stopped answering", extra={"worker": worker.name})
            self.counters["died"] += 1
        self._broken = True

    def _tell_group(self, group: ShapeGroup, *, add: bool) -> None:
        if not group.gid:
            group.gid = next(self._gids)
        self._tell(("group", group.gid, group.arguments) if add else ("ungroup", group.gid))

    def _tell_spu(self, spu: IncrementalSpu, change: int) -> None:
        self._tell(("want", spu.group.gid, tuple(encode_all(branch) for branch in spu.params), change))

    def _stop_workers(self) -> None:
        self.store.unfollow(self._follow)
        for worker in self.boosters:
            worker.kill()
        self.boosters = []
        with self._idle:
            self._dead.clear()

    def wait_idle(self) -> None:
        """Return once every update handed to the workers is processed (notified, completed)."""
        with self._idle:
            while self._fifo:
                self._idle.wait()

    @property
    def in_flight(self) -> int:
        return len(self._fifo)

    def metrics(self) -> dict[str, int]:
        """Workers running (a dead one not counted, though not replaced yet) and started (none before
        the first incremental subscription, or on one core), updates in flight, whether a failure
        waits for recovery (updates held, see _collect_loop), and counters: updates pipelined, jobs
        failed, workers died, recoveries (every SPU evaluated again)."""
        counts = {f"{name}_total": self.counters[name] for name in ("pipelined", "failed", "died", "recovered")}
        boosters = list(self.boosters)
        alive = sum(worker.process.poll() is None for worker in boosters)
        broken = int(self._broken or bool(self._unfinished))
        running = {"workers": alive, "workers_started": len(boosters), "in_flight": len(self._fifo)}
        return {**running, "broken": broken, **counts}

    # -- subscribe / unsubscribe: the workers learn which groups and parameter values exist ---------

    def subscribe(self, sparql: str, callback: Callable, **options: Any) -> Subscription:  # type: ignore[override]
        self.wait_idle()  # the first result must not miss an update whose solutions are not folded yet
        self._recover()
        return super().subscribe(sparql, callback, **options)

    def unsubscribe(self, spuid: str) -> Subscription:
        self.wait_idle()
        return super().unsubscribe(spuid)

    def _index_group(self, group: ShapeGroup, *, add: bool) -> None:
        super()._index_group(group, add=add)
        if self.boosters and add and self._graphs is not None:
            graphs = group.graphs_read()
            if graphs is None or not graphs <= self._graphs:  # the replicas lack a graph it reads
                # seeded again, in the same processes: new ones cost 1.1-1.7 s more of this
                # subscribe (a process start), under the engine's lock (then updates wait)
                self.counters["reseeded"] += 1
                self._start(running=True)  # on a snapshot with every graph a group reads; tells them this group
                return
        if self.boosters:
            self._tell_group(group, add=add)
        elif add and not self._closed:
            self._start()  # tells them this group

    def _index_spu(self, spu: IncrementalSpu, *, add: bool) -> None:
        super()._index_spu(spu, add=add)
        if self.boosters:
            self._tell_spu(spu, 1 if add else -1)

    # -- processing ---------------------------------------------------------------------------

    def submit(
        self,
        delta: Delta,
        apply: Callable[[Delta], None],
        budget: Budget | None,
        done: Callable[[int, dict[str, float]], None],
    ) -> None:
        """Process `delta`; `done` is called here, or by the collector thread, in update order."""
        self._recover()
        if not self.boosters:
            done(*self.process(delta, apply, budget))
            return
        matched = self._match(delta)
        removed_hits, added_hits, reeval = matched
        quads = sum(len(quads) for ref, quads in (*removed_hits.items(), *added_hits.items()) if type(ref) is tuple)
        # a network client's FILTERed join: pyoxigraph evaluates it without a bound, in the workers
        # as here; here, bounded lookups (broker.core.lookups) stop it at the time limit
        guarded = any(type(ref) is tuple and _unbounded_join(*ref) for ref in (*removed_hits, *added_hits))
        here = quads < OFFLOAD_MIN_QUADS or reeval or guarded or delta.graphs_created or delta.graphs_dropped
        if here and not self._fifo:
            if budget is not None:
                done(*self._process_bounded(delta, apply, budget, matched))
            else:
                done(*self._process(delta, apply, self.store, None, matched))
            if self._log_quads >= LOG_FLUSH_QUADS or len(self._log) >= LOG_FLUSH_DELTAS:
                self._flush()
            return
        if budget is not None:
            raise OverBudget  # it would wait for the workers, or be handed to them: not on an event loop
        if reeval or guarded or delta.graphs_created or delta.graphs_dropped:
            self.wait_idle()  # a whole query on the store as this update leaves it, nothing in between
            done(*self._process(delta, apply, self.store, None, matched))
        else:
            self._dispatch(delta, apply, removed_hits, added_hits, done)

    def _split(self, hits: Hits, quads: list[Quad], limit: int | None = None) -> list[list[tuple[Item, Route]]]:
        """`hits` as work items, each (group, branch, pattern)'s quads split evenly between the workers
        (a quad by its index in `quads`, the delta's list as sent): per worker, (item, route) pairs.
        `limit`: the solutions a hit of a bounded group may have (see ShapeGroup.collect)."""
        count = len(self.boosters)
        shares: list[list[tuple[Item, Route]]] = [[] for _ in range(count)]
        position = {quad: index for index, quad in enumerate(quads)}
        for ref, entries in hits.items():
            if type(ref) is not tuple:
                continue  # a re-evaluating SPU: never here (see submit)
            group, branch, pattern = ref
            size = -(-len(entries) // count)
            for index in range(count):
                part = entries[index * size : (index + 1) * size]
                if not part:
                    break
                sent: list[tuple[int, tuple[Any, ...] | None]] = []
                targets: list[IncrementalSpu | None] = []
                for quad, spus in part:
                    spu = next(iter(spus)) if spus is not None and len(spus) == 1 else None
                    params = None if spu is None else encode_all(spu.params[branch])  # type: ignore[attr-defined]
                    sent.append((position[quad], params))
                    targets.append(spu)  # type: ignore[arg-type]
                item_limit = limit if group.bounded else None
                item = (group.gid, branch, pattern, sent, item_limit, group.bounded)
                shares[index].append((item, (group, branch, targets)))
        return shares

    def _dispatch(
        self,
        delta: Delta,
        apply: Callable[[Delta], None],
        removed_hits: Hits,
        added_hits: Hits,
        done: Callable[[int, dict[str, float]], None],
    ) -> None:
        started = time.perf_counter()
        before = self._take_log()
        try:
            apply(delta)
        except BaseException:  # nothing applied (the store's journal failed...): the deltas still go out
            with self.store.lock:
                self._log[:0] = before
            raise
        applied = time.perf_counter()
        own = self._take_log()  # this update's delta as the follower logged it: the workers index into it
        added, removed = (own[0][0], own[0][1]) if own else ([], [])
        removed_shares = self._split(removed_hits, removed)
        added_shares = self._split(added_hits, added, self.max_rows)
        fed = self._feed_hits(delta) if self.feeds else []
        micros = self.store.clock.micros()
        seconds = None if self.workers is None else self.workers.time_limit_s  # see Booster.boost
        entry = InFlight(done, fed, [], {"t_apply_s": applied - started})
        prior = batched(before)[1] if before else []
        step = [_step(own[0])] if own else [(b"", b"", (), ())]
        messages = []
        for worker, removed_share, added_share in zip(self.boosters, removed_shares, added_shares, strict=True):
            if removed_share or added_share:
                lost = [item for item, _ in removed_share]
                gained = [item for item, _ in added_share]
                messages.append((worker, ("boost", micros, prior, lost, step, gained, seconds)))
                routes = [route for _, route in removed_share], [route for _, route in added_share]
                entry.jobs.append((worker, *routes))
            elif prior or own:
                messages.append((worker, ("apply", prior + step)))
        with self._idle:
            self._fifo.append(entry)
            if len(self._fifo) == 1:  # else the collector is busy and will find it: no wake-up to pay
                self._idle.notify_all()
        for worker, message in messages:
            self._send(worker, message)
        self.counters["pipelined"] += 1

    # -- the collector thread -----------------------------------------------------------------

    def _collect_loop(self) -> None:
        while True:
            with self._idle:
                while not self._fifo and not self._closed:
                    self._idle.wait(SEND_CHECK_S)
                    self._stuck_send()
                    self._dead_while_idle()
                if not self._fifo:
                    return
                entry = self._fifo[0]
            notifications = 0
            try:
                notifications = self._fold(entry)
            except Exception:  # an engine bug: logged; the update was applied and must complete
                log.exception("parallel mode: notifying an update failed")
            if self._broken:
                # Why not notify what the other workers found and complete it: its subscribers saw
                # part of the update (20 rows of 40) and its publisher a success, and nothing put
                # them right until another request came (an attack pass). Held until _recover has
                # evaluated every SPU again: then its publisher gets the reply, after the correction.
                self._unfinished.append(entry)
                with self._idle:
                    self._fifo.popleft()
                    last = not self._fifo
                    self._idle.notify_all()
                if last and self.on_broken is not None:
                    self.on_broken()
                continue
            with self._idle:
                self._fifo.popleft()
                self._idle.notify_all()
            self._complete(entry, notifications)

    @staticmethod
    def _complete(entry: InFlight, notifications: int) -> None:
        try:
            entry.done(notifications, entry.timings)
        except Exception:
            log.exception("parallel mode: completing an update failed")

    def _fold(self, entry: InFlight) -> int:
        """Route what the workers found for `entry` to the SPUs, fold and notify, then the graph feeds.
        Nothing, once a worker failed (this update or an earlier one): see _collect_loop."""
        lost: dict[IncrementalSpu, dict[int, set[Mu]]] = {}
        gained: dict[IncrementalSpu, dict[int, set[Mu]]] = {}
        over: set[IncrementalSpu] = set()  # past max_rows: not notified, ended (see _recover)
        timed: set[IncrementalSpu] = set()  # a hit not looked up, past the time limit: ended the same way
        booster_s = 0.0
        for worker, removed_routes, added_routes in entry.jobs:
            if self._broken:
                return self._feeds_only(entry)  # the workers are replaced: their other answers are not waited for
            reply = self._reply(worker)
            if reply is not None:
                _, lost_answers, gained_answers, seconds = reply
                booster_s = max(booster_s, seconds)
                self._route(removed_routes, lost_answers, lost, timed=timed)
                self._route(added_routes, gained_answers, gained, over, timed)
        if self._broken:
            return self._feeds_only(entry)
        failed: dict[IncrementalSpu, SepaError] = {}
        if timed:
            self.stats.lookups_timed_out += len(timed)
            error = TimeLimitExceeded(
                f"processing an update for this subscription ran past the time limit of "
                f"{self.workers.time_limit_s if self.workers is not None else 0:g} s ([engine] time_limit_s)"
            )
            failed = dict.fromkeys(timed - over, error)
        for spu in over | timed:
            lost.pop(spu, None)
            gained.pop(spu, None)
        started = time.perf_counter()
        notifications, hits = self._notify(lost, gained, entry.fed, over, self.max_rows, self._past, failed)
        entry.timings.update(t_booster_s=booster_s, t_notify_s=time.perf_counter() - started, lutt_hits=hits)
        return notifications

    def _feeds_only(self, entry: InFlight) -> int:
        """Notify only the graph feeds of `entry`: their rows are the delta's, found by the engine's
        thread, whatever befell the workers (the cloud shipper is one: it must miss no update)."""
        notifications, _ = self._notify({}, {}, entry.fed)
        return notifications

    def _route(
        self,
        routes: list[Route],
        answers: Answers,
        out: dict[IncrementalSpu, dict[int, set[Mu]]],
        over: set[IncrementalSpu] | None = None,
        timed: set[IncrementalSpu] | None = None,
    ) -> None:
        """`over` (the solutions gained): the SPUs a worker answered OVER for (Booster._bounded; a
        fold past the limit, its share from several workers, ends them all the same: TooManyRows).
        `timed`: those it answered TIMED_OUT for (Booster.boost)."""
        terms = self._decoder.terms
        for (group, branch, targets), per_hit in zip(routes, answers, strict=True):
            for spu, codes in zip(targets, per_hit, strict=True):
                if codes == OVER:
                    assert over is not None
                    over.update((spu,) if spu is not None else group.spus.values())
                elif codes == TIMED_OUT:
                    assert timed is not None
                    timed.update((spu,) if spu is not None else group.spus.values())
                elif codes and not (over and spu in over):  # not even decoded past the limit
                    group.route(branch, spu, [terms(mu) for mu in codes], out, over or ())

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
        worker.kill()  # a stopped one too: its late answers must not be read as a later job's
        self._found_dead(worker)
        return None

    # -- recovery -----------------------------------------------------------------------------

    def _recover(self) -> None:
        """After a worker died or failed a job, the solutions of some updates never reached the SPUs:
        evaluate every incremental SPU again on the store, notify the difference, and start the
        workers afresh. On the engine's thread, with nothing in flight. Also ends the subscriptions
        the collector found past max_rows: it folds outside the state lock, while this thread reads
        the LUTT and the groups, so it leaves them here."""
        if self._past:
            self.wait_idle()
            with self._state:
                past, self._past = self._past, {}
                for spu, error in past.items():
                    self._end(spu, error, told=True)
        if not self._broken:
            # a worker that died while nothing was sent to it is found here, at the next request
            for worker in [each for each in self.boosters if each.process.poll() is not None]:
                self._found_dead(worker)
        if not self._broken:
            return
        self.wait_idle()
        self._broken = False
        self._restarting = True
        self._stop_workers()
        self.counters["recovered"] += 1
        spus = [spu for group in self.groups.values() for spu in group.spus.values()]
        notifications = sum(spu.reload(self.store) for spu in spus)
        for spu in spus:
            if spu in self.held:
                self.held.resized(spu, spu.rows_held())
        log.warning("parallel mode: SPUs evaluated again after a worker failure", extra={"notified": notifications})
        unfinished, self._unfinished = self._unfinished, []
        for index, entry in enumerate(unfinished):  # their publishers' replies, after the correction
            self._complete(entry, notifications if index == len(unfinished) - 1 else 0)
        if self.groups and not self._closed:
            self._start()
        self._restarting = False

    def recover(self) -> None:
        """:meth:`_recover`, for the engine to call under its lock when :attr:`on_broken` asks."""
        self._recover()

    def close(self) -> None:
        with self._idle:
            self._closed = True
            self._idle.notify_all()
        if self._collector is not None:
            self._collector.join(10)
        self._stop_workers()
        self._spawner.shutdown(wait=False)
        super().close()


def _unbounded_join(group: ShapeGroup, branch: int, _pattern: int) -> bool:
    """Whether a hit of `group`'s `branch` is a network client's join that pyoxigraph evaluates (a
    FILTER, more than one pattern): what the BOOSTER workers cannot bound (broker.core.lookups)."""
    return group.bounded and group.branch_queries[branch] is not None and len(group.shape.branches[branch].patterns) > 1
