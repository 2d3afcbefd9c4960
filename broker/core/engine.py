"""The in-process API of the SEPA engine: update, query, subscribe, unsubscribe.

Gates, adapters, tools and tests all use this one object (ARCHITECTURE.md principle 2: one path
for every update). It is synchronous and thread-safe: updates are serialized by a lock and each is
acknowledged (the call returns) only after every subscription has processed it ("end of
processing"); queries run concurrently with each other and with updates. The asyncio facade in
:mod:`broker.core.async_engine` runs these calls off the event loop.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from broker.core.access import GraphAccess
from broker.core.budget import Budget, OverBudget
from broker.core.memory import trim_after
from broker.core.notification import Notification
from broker.core.pipeline import REPLY_TIMEOUT_S, PipelinedSpuManager
from broker.core.query_processor import QueryProcessor
from broker.core.results import QueryResult, UpdateResult
from broker.core.spu import Probed
from broker.core.spu_manager import SpuManager
from broker.core.stats import EngineStats
from broker.core.subscription import Subscription
from broker.core.update_processor import Request, UpdateProcessor
from broker.sparql.base import with_base
from broker.sparql.limits import check_structure
from broker.sparql.query_patterns import query_patterns
from broker.store import ApplyMark, RdfStore

if TYPE_CHECKING:
    from broker.workers.pool import QueryWorkers

NotificationCallback = Callable[[Notification], None]
# a probe's result kept for the subscribe when its SPARQL TSV takes at most this (a larger one is
# evaluated again by the subscribe: a few MB cross the socket pair for nothing if it is incremental)
PROBE_KEEP_BYTES = 1 << 20


class Engine:
    """One SEPA engine over one store.

    mode: "incremental" (LUTT + incremental/re-evaluating SPUs, the product; also called
    "sequential"), "parallel" (the same, with the BOOSTER in `boosters` worker processes and
    updates pipelined: :mod:`broker.core.pipeline`) or "naive" (every subscription re-evaluated and
    diffed after every update: the reference broker's algorithm, kept as the benchmark baseline and
    as a test oracle).
    """

    MODES = ("incremental", "sequential", "parallel", "naive")

    def __init__(
        self,
        store: RdfStore | None = None,
        *,
        mode: str = "incremental",
        allow_load: bool = False,
        service_allow: Sequence[str] = (),
        service_timeout_s: float = 10.0,
        workers: QueryWorkers | None = None,
        base_iri: str | None = None,
        boosters: int = 1,
        reevaluators: QueryWorkers | None = None,
        max_update_quads: int | None = None,
        max_subscription_rows: int | None = None,
        max_held_rows: int | None = None,
        max_held_rows_per_client: int | None = None,
        max_reeval_seconds_per_client: float | None = None,
    ) -> None:
        """`service_allow`: the only endpoints SERVICE may call, from queries only, whose clients wait
        at most `service_timeout_s` for them (:mod:`broker.sparql.service`).

        `workers` (started, over this store): queries, subscription probes and WHERE clauses run
        there, under their time limit (:mod:`broker.workers.pool`); without, they run in the
        calling thread with no limit (tests, tools, the library).

        `base_iri`: what relative IRIs of every request resolve against, unless the call gives its
        own (:mod:`broker.sparql.base`).

        `boosters`: parallel mode's BOOSTER worker processes (:mod:`broker.core.pipeline`); they start
        with the first subscription the incremental algorithm takes. Call :meth:`close` when done.

        `reevaluators` (started, over this store; a pool of its own, one process will do): in
        sequential mode, the re-evaluations of a network client's subscriptions are pipelined
        there, off the update thread (:meth:`SpuManager.submit
        <broker.core.spu_manager.SpuManager.submit>`); :meth:`close` closes it. Without, they run
        in `workers` while the update waits for them.

        `max_update_quads`: the quads a request that is not trusted may change, and the solutions
        its WHERE clauses may have (None: any number; the gateway gives
        :data:`broker.core.update_processor.MAX_UPDATE_QUADS` unless configured otherwise).

        `max_subscription_rows`: the results a probed subscription may have (:meth:`probe`; None:
        any number). `max_held_rows`, `max_held_rows_per_client`: the rows network clients'
        subscriptions may hold together, and each client's (:mod:`broker.core.held`; None: any)."""
        if mode not in self.MODES:
            raise ValueError(f"unknown engine mode {mode!r}")
        self.store = store if store is not None else RdfStore.memory()
        self.mode = "incremental" if mode == "sequential" else mode
        self.stats = EngineStats()
        self.queries = QueryProcessor(self.store, service_allow=service_allow, service_timeout_s=service_timeout_s)
        self.updates = UpdateProcessor(self.store, allow_load=allow_load, service_allow=service_allow)
        self.updates.max_quads = max_update_quads
        self.max_subscription_rows = max_subscription_rows
        if mode == "parallel":
            self._pipelined = PipelinedSpuManager(
                self.store,
                self.queries,
                self.stats,
                boosters=boosters,
                workers=workers,
                max_rows=max_subscription_rows,
                max_held_rows=max_held_rows,
                max_held_rows_per_client=max_held_rows_per_client,
                max_reeval_seconds_per_client=max_reeval_seconds_per_client,
            )
            self._pipelined.on_broken = self._recover_soon
            self.spus: SpuManager = self._pipelined
        else:
            self.spus = SpuManager(
                self.store,
                self.queries,
                self.stats,
                naive=(mode == "naive"),
                workers=workers,
                reevaluators=reevaluators if mode != "naive" else None,
                max_rows=max_subscription_rows,
                max_held_rows=max_held_rows,
                max_held_rows_per_client=max_held_rows_per_client,
                max_reeval_seconds_per_client=max_reeval_seconds_per_client,
            )
        self.reevaluators = reevaluators
        self._update_lock = threading.Lock()
        self._recovering: threading.Thread | None = None  # see _recover_soon
        self.workers = workers
        self.base_iri = base_iri
        if workers is not None:
            self.updates.where_evaluator = functools.partial(workers.run, "where_solutions")
            self.updates.time_limit_s = workers.time_limit_s

    # -- publishing ---------------------------------------------------------------------------

    def update(
        self,
        sparql: Request,
        *,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
        base_iri: str | None = None,
        prefixes: dict[str, str] | None = None,
        mark: ApplyMark | None = None,
        budget: int | None = None,
        access: GraphAccess | None = None,
        trusted: bool = False,
    ) -> UpdateResult:
        """Apply one SPARQL 1.1 Update request atomically and notify the subscriptions it affects.

        :meth:`submit`, waiting for end of processing; its arguments.
        """
        return self.submit(
            sparql,
            using_graph_uri=using_graph_uri,
            using_named_graph_uri=using_named_graph_uri,
            base_iri=base_iri,
            prefixes=prefixes,
            mark=mark,
            budget=budget,
            access=access,
            trusted=trusted,
        ).result()

    def submit(
        self,
        sparql: Request,
        *,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
        base_iri: str | None = None,
        prefixes: dict[str, str] | None = None,
        mark: ApplyMark | None = None,
        budget: int | None = None,
        access: GraphAccess | None = None,
        trusted: bool = False,
    ) -> Future[UpdateResult]:
        """Apply one SPARQL 1.1 Update request atomically; its result once every subscription processed it.

        In sequential mode the future is done when this returns, unless the update re-evaluates a
        network client's subscriptions with a re-evaluation worker (`reevaluators`): then it is
        done once they are, and an update submitted later may complete first. In parallel mode it
        may not be: the update is in the store, its subscriptions are processed in the BOOSTER
        workers, and the next update may be submitted meanwhile (:mod:`broker.core.pipeline`);
        updates still complete in the order they were submitted.

        `sparql` is the request's text, or an in-process producer's :class:`~broker.sparql.syntax.Update`
        (:mod:`broker.sparql.syntax`), which is applied alike without being parsed.

        Returns after end of processing with the quads really added and removed. Raises
        SparqlSyntaxError / InvalidRequest / UpdateFailed and changes nothing on failure. A `mark`
        is journalled with the delta and told once it is in the store (delayed updates use it).

        `budget` bounds the work (see :mod:`broker.core.budget`): past it, or when another engine
        call holds the lock, OverBudget is raised with nothing changed or notified.

        `access` limits what the request may read and write (:mod:`broker.core.access`): a write
        outside its writable graphs raises Forbidden with nothing changed or notified.

        `trusted`: the request comes from code of this process (the in-process transport: the
        adapters, the retention agent), whose WHERE clauses run here, not in a time-limited worker;
        an Update syntax tree is always trusted.
        """
        steps = None if budget is None else Budget(budget)
        if base_iri is None:
            base_iri = self.base_iri
        if not self._update_lock.acquire(blocking=steps is None):
            raise OverBudget
        clock = self.store.clock
        clock.pin()  # one instant for the update and all the subscription processing it causes
        self.updates.trusted = trusted or not isinstance(sparql, str)  # read by its WHERE evaluation, under the lock
        try:
            started = time.perf_counter()
            delta = self.updates.compute(
                sparql,
                using_graph_uri=using_graph_uri,
                using_named_graph_uri=using_named_graph_uri,
                base_iri=base_iri,
                prefixes=prefixes,
                budget=steps,
                readable=None if access is None else access.readable_terms(),
                writable=None if access is None else access.writable_terms(),
            )
            if access is not None:
                access.check_writes(delta)
            self.store.check_growth(len(delta.added) - len(delta.removed))
            computed = time.perf_counter()
            apply = self.updates.apply if mark is None else functools.partial(self.updates.apply, mark=mark)
            future: Future[UpdateResult] = Future()

            def processed(notifications: int, timings: dict[str, float]) -> None:
                timings["t_update_s"] = timings.get("t_apply_s", 0.0) + (computed - started)
                self.stats.record_update(timings, notifications, time.perf_counter() - started)
                future.set_result(UpdateResult(delta.added, delta.removed, notifications, timings))
                trim_after(len(delta.added) + len(delta.removed))

            self.spus.submit(delta, apply, steps, processed)
            return future
        finally:
            clock.unpin()
            self._update_lock.release()

    def check_update(
        self,
        sparql: str,
        *,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
        base_iri: str | None = None,
        access: GraphAccess | None = None,
    ) -> None:
        """Raise what :meth:`update` would for a malformed request, or (with `access`) for a WHERE
        dataset naming a graph the client may not read or a graph named that it may not write,
        without running it."""
        self.updates.check(
            sparql,
            using_graph_uri=using_graph_uri,
            using_named_graph_uri=using_named_graph_uri,
            base_iri=self.base_iri if base_iri is None else base_iri,
            readable=None if access is None else access.readable_terms(),
            writable=None if access is None else access.writable_terms(),
            quad_limit=self.updates.max_quads,  # a delayed update runs as a network client's
        )

    # -- querying -----------------------------------------------------------------------------

    def query(
        self,
        sparql: str,
        *,
        default_graph_uri: Sequence[str] = (),
        named_graph_uri: Sequence[str] = (),
        base_iri: str | None = None,
        prefixes: dict[str, str] | None = None,
        trusted: bool = False,
    ) -> QueryResult:
        """Evaluate a SPARQL 1.1 query (SELECT, ASK, CONSTRUCT, DESCRIBE) and materialize it.

        In a query worker, under its time limit, unless `trusted` (code of this process)."""
        if base_iri is None:
            base_iri = self.base_iri
        if self.workers is not None and not trusted:
            return self.workers.run(  # type: ignore[no-any-return]
                "materialized",
                sparql,
                default_graph_uri=default_graph_uri,
                named_graph_uri=named_graph_uri,
                base_iri=base_iri,
                prefixes=prefixes,
            )
        raw = self.store.settled_read(  # no operation of a request still running (RdfStore.settled_read)
            lambda: self.queries.run(
                sparql,
                default_graph_uri=default_graph_uri,
                named_graph_uri=named_graph_uri,
                base_iri=base_iri,
                prefixes=prefixes,
            )
        )
        return self.queries.materialize(raw)

    # -- subscribing --------------------------------------------------------------------------

    def probe(
        self,
        sparql: str,
        *,
        default_graph_uri: Sequence[str] = (),
        named_graph_uri: Sequence[str] = (),
        prefixes: dict[str, str] | None = None,
    ) -> Probed | None:
        """Evaluate a subscription's query once under the time limit, before :meth:`subscribe`.

        Why: subscribe evaluates on the update thread, which nothing can interrupt; a query that
        would never end is refused here (TimeLimitExceeded) instead, and one with more than
        `max_subscription_rows` results (InvalidRequest). Without workers, nothing.

        Returns what the probe found: its count of results, which :meth:`subscribe` checks against
        the rows held budgets before it evaluates anything, and the result (up to PROBE_KEEP_BYTES of
        TSV) if the store did not change while it ran, which it takes when the store still has not.

        It also reads (and caches) what a re-evaluated subscription of `sparql` may be woken by,
        with rdflib's slow parser, here rather than in :meth:`subscribe`: on the update thread a
        subscription of 40,000 VALUES held every update for 30 s. The structure limits come first:
        a chain of 10,000 `+` kept rdflib busy 15-32 s before the worker refused it (8 ms on /query)."""
        check_structure(sparql)
        query_patterns(with_base(sparql, self.base_iri), prefixes)
        if self.workers is None:
            return None
        changes = self.store.changes
        rows, text, seconds = self.workers.run(
            "probe",
            with_base(sparql, self.base_iri),
            default_graph_uri=tuple(default_graph_uri),
            named_graph_uri=tuple(named_graph_uri),
            prefixes=prefixes,
            keep_bytes=PROBE_KEEP_BYTES,
            max_rows=self.max_subscription_rows,
        )
        return Probed(changes if self.store.changes == changes else -1, text, rows, seconds)

    def subscribe(
        self,
        sparql: str,
        callback: NotificationCallback,
        *,
        alias: str | None = None,
        default_graph_uri: Sequence[str] = (),
        named_graph_uri: Sequence[str] = (),
        prefixes: dict[str, str] | None = None,
        nonblocking: bool = False,
        limited: bool = False,
        probed: Probed | None = None,
        owner: str | None = None,
        coalesce_s: float = 0.0,
    ) -> Subscription:
        """Subscribe to a SELECT or ASK query.

        The first notification (sequence 0, the full current result as added rows) is passed to
        `callback` before this returns; later ones are passed from the thread that runs the
        update, in sequence order. Identical subscriptions share one SPU.

        `nonblocking`: the callback only hands the notification over (it never waits), so updates
        that notify it may run on an event loop thread (see :mod:`broker.core.budget`).

        `limited` (a network client's): if it is re-evaluated, each re-evaluation runs in a query
        worker under the time limit; past it the subscription ends, and `callback` gets a last
        notification whose `ended` says why.

        `owner`: who subscribed (a network client's identity or address), for the SPU table.

        `coalesce_s`: the subscriber wants at most one notification per that many seconds, each the
        net change since the one before (the WebSocket gate's `coalesce_ms`). With a flusher
        (:meth:`on_deferred`) and from MIN_DEFER_S up, the query is then re-evaluated at most that
        often instead of processed at every update (:meth:`SpuManager._defer`).
        """
        with self._update_lock:
            return self.spus.subscribe(
                with_base(sparql, self.base_iri),
                callback,
                alias=alias,
                default_graph_uri=tuple(default_graph_uri),
                named_graph_uri=tuple(named_graph_uri),
                prefixes=prefixes,
                nonblocking=nonblocking,
                limited=limited,
                probed=probed,
                owner=owner,
                coalesce_s=coalesce_s,
            )

    def on_deferred(self, flusher: Callable[[float], None]) -> None:
        """Have `flusher(due)` called (from any thread) when a coalescing subscription's
        re-evaluation falls due at `due` (time.monotonic()); it must then get :meth:`flush_deferred`
        called, at that time or a little after. Subscriptions made before this are processed at
        every update."""
        self.spus.on_due = flusher

    def flush_deferred(self) -> float | None:
        """Run the coalescing subscriptions' re-evaluations that are due and notify them; when the
        next one falls due (time.monotonic()), None if none waits. From one thread at a time, not
        the one that runs updates (:meth:`SpuManager.flush_due` says why): updates go on meanwhile."""
        return self.spus.flush_due()

    def _recover_soon(self) -> None:
        """Parallel mode's collector holds updates a failed worker left unfinished: recover now, not
        at the next request (an idle gateway kept its subscriptions wrong). On a thread of its own:
        the engine's thread may be waiting for the collector, holding the lock this takes."""
        self._recovering = threading.Thread(target=self._recover, name="sepa-recover", daemon=True)
        self._recovering.start()

    def _recover(self) -> None:
        with self._update_lock:
            self._pipelined.recover()

    def unsubscribe(self, spuid: str) -> Subscription:
        """End a subscription; its SPU (and LUTT entries) are freed when no one else shares it.

        Raises NotFound for an unknown spuid.
        """
        with self._update_lock:
            return self.spus.unsubscribe(spuid)

    def close(self) -> None:
        """Stop the engine's threads and worker processes (after the updates in flight), the
        re-evaluation worker too."""
        if self._recovering is not None:
            self._recovering.join(REPLY_TIMEOUT_S)  # else it would start workers as they are stopped
        self.spus.close()
        if self.reevaluators is not None:
            self.reevaluators.close()

    @property
    def subscription_count(self) -> int:
        return self.spus.subscription_count
