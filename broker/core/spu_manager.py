"""SPU manager: subscriptions, the LUTT, and the processing of each update in two phases.

For one update (seed 001 §III, "end of processing"):

1. LUTT: the changed quads select the shape patterns and re-evaluating SPUs they can touch.
2. Pre phase, on the store before the update: solutions that lose a removed quad.
3. The delta is applied to the store.
4. Post phase: solutions that gain an added quad; re-evaluating SPUs re-run their query (those a
   network client subscribed in the query workers, under the time limit, all at once: see
   :meth:`SpuManager._reevaluate`).
5. Each touched SPU folds its solutions into its counts and notifies its subscribers.

The work of phases 2 and 4 is independent per shape pattern and per SPU, which is what parallel
mode will split across worker processes.

With a re-evaluation worker (`reevaluators`, ``[engine] reeval_workers``), the re-evaluations of a
network client's subscriptions are pipelined off the update thread: see :meth:`SpuManager.submit`.
An on-demand pool is woken by the first such subscription and put to rest REST_AFTER_S after the
last one ends (:meth:`SpuManager._demand`).

A subscription that asks for coalesced notifications (`coalesce_s`, the WebSocket gate's
`coalesce_ms`, at least MIN_DEFER_S) is re-evaluated at most once per interval instead of
processed at every update: see :meth:`SpuManager._defer`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyoxigraph import DefaultGraph, NamedNode, Quad

from broker.core.budget import Budget, BudgetedRdfStore, OverBudget
from broker.core.held import WEIGHED, HeldRows, TooManyRowsHeld, row_weight, text_weight
from broker.core.lookups import BoundedLookups
from broker.core.lutt import ANY, NAMED, Lutt, make_key
from broker.core.memory import Trimmer
from broker.core.notification import Notification, QuadRows
from broker.core.query_processor import QueryProcessor, dataset_arguments, graph_list
from broker.core.reeval_cost import ReevalCosts, TooCostly
from broker.core.spu import (
    GraphFeedSpu,
    IncrementalSpu,
    Lookup,
    Mu,
    Probed,
    ReevalSpu,
    RowTable,
    ShapeGroup,
    SpuBase,
    TooManyRows,
)
from broker.core.spu_table import spu_table
from broker.core.stats import EngineStats
from broker.core.subscription import Subscription
from broker.core.update_processor import Delta
from broker.errors import EvaluationCrashed, InvalidRequest, NotFound, ResultTooLarge, SepaError, WorkerLost
from broker.sparql.patterns import QuadPattern, Var
from broker.sparql.query_patterns import DEFAULT as LOOSE_DEFAULT
from broker.sparql.query_patterns import NAMED as LOOSE_NAMED
from broker.sparql.query_patterns import query_patterns
from broker.sparql.query_shape import NotIncremental, ShapedQuery, shape_query
from broker.store import RdfStore

if TYPE_CHECKING:
    from broker.workers.pool import QueryWorkers

log = logging.getLogger(__name__)

# an on-demand re-evaluation pool idle this long after the last subscription it served ended is put
# to rest (its processes killed): a client that subscribes again soon does not pay a new snapshot
REST_AFTER_S = 60.0
# coalescing intervals from this one up are served by deferred re-evaluation (SpuManager._defer);
# shorter ones incrementally (a re-evaluation per 100 ms of a few hundred rows costs less than a
# fast sensor's updates; per millisecond it would not)
MIN_DEFER_S = 0.1
# a coalescing SPU is re-evaluated at most once per this many times its last re-evaluation took
DEFER_DUTY = 10
_now = time.monotonic  # the clock of deferred re-evaluations (tests move it)

DEFAULT_GRAPH = DefaultGraph()
Hits = dict[Any, list[tuple[Quad, set[object] | None]]]  # LUTT reference -> the quads hitting it, with their SPUs
Matched = tuple[Hits, Hits, set[ReevalSpu]]  # hits of the removed quads, of the added ones, SPUs to re-evaluate
Outcome = tuple[object, ...] | SepaError  # a re-evaluation's ("ok", variables, text, boolean), or its error


@dataclass
class Reevaluations:
    """One update's re-evaluations queued in the re-evaluation worker, until the collector has
    applied them and completed the update."""

    done: Callable[[int, dict[str, float]], None]
    jobs: list[tuple[ReevalSpu, Future[Any]]]
    notifications: int  # sent already, on the update thread (the incremental SPUs, the graph feeds)
    timings: dict[str, float]


class SpuManager:
    """Owns SPUs, shape groups and the LUTT. The engine serializes calls; with a re-evaluation
    worker, its collector thread also applies re-evaluations, under :attr:`_state`."""

    defers = True  # coalescing subscriptions may be re-evaluated once per interval (see _defer)

    def __init__(
        self,
        store: RdfStore,
        queries: QueryProcessor,
        stats: EngineStats,
        *,
        naive: bool = False,
        workers: QueryWorkers | None = None,
        reevaluators: QueryWorkers | None = None,
        max_rows: int | None = None,
        max_held_rows: int | None = None,
        max_held_rows_per_client: int | None = None,
        max_reeval_seconds_per_client: float | None = None,
    ) -> None:
        """`reevaluators` (started, over this store): the re-evaluation worker, where the
        re-evaluations of a network client's subscriptions are pipelined (see :meth:`submit`).
        `max_rows`: the rows a network client's subscription may hold; an update that would take
        it past them ends it, its subscribers told why (see :meth:`_end`). `max_held_rows`,
        `max_held_rows_per_client`: the rows network clients' subscriptions may hold together, and
        each client's (:mod:`broker.core.held`). `max_reeval_seconds_per_client`: what one client's
        re-evaluated subscriptions may cost every update, by their probes (:mod:`broker.core.reeval_cost`)."""
        self.store = store
        self.max_rows = max_rows
        self.held = HeldRows(max_held_rows, max_held_rows_per_client)
        self._charged: dict[str, str] = {}  # spuid -> the client its SPU's rows are charged to
        self.costs = ReevalCosts(max_reeval_seconds_per_client)
        self.workers = workers
        self.reevaluators = reevaluators
        # the SPUs, the LUTT, the subscriptions: held by the update thread while it processes an
        # update, by the collector while it applies one re-evaluation
        self._state = threading.Lock()
        self._queued: deque[Reevaluations] = deque()  # in update order, until applied
        self._settled = threading.Condition()  # guards _queued and _stopping
        self._reeval_collector: threading.Thread | None = None
        self._stopping = False
        self.rest_after_s = REST_AFTER_S
        self._rest_timer: threading.Timer | None = None
        # one thread per worker: the update thread hands out the limited re-evaluations of an update
        self._reevaluators = ThreadPoolExecutor(workers.count, "sepa-reeval") if workers is not None else None
        self.trimmer = Trimmer()
        self.queries = queries
        self.stats = stats
        self.naive = naive
        self.lutt = Lutt()
        self.groups: dict[tuple[object, ...], ShapeGroup] = {}
        self.reeval: dict[tuple[object, ...], ReevalSpu] = {}
        self.rows = RowTable()  # the re-evaluating SPUs' rows, one copy each
        self.feeds: dict[NamedNode, dict[tuple[str, ...], GraphFeedSpu]] = {}
        self.subscriptions: dict[str, tuple[Subscription, SpuBase]] = {}
        # coalescing SPUs an update concerned, with when each is due for its re-evaluation; told to
        # `on_due` (the scheduler arms a timer that calls flush_due on the update thread): without
        # it, coalescing subscriptions are processed at every update like any other
        self._dirty: dict[ReevalSpu, float] = {}
        self._flushing: set[ReevalSpu] = set()  # being re-evaluated by flush_due
        self.on_due: Callable[[float], None] | None = None

    @property
    def subscription_count(self) -> int:
        return len(self.subscriptions)

    @property
    def reevaluations_queued(self) -> int:
        """Updates whose re-evaluations are queued in the re-evaluation worker, not applied yet."""
        return len(self._queued)

    def metrics(self) -> dict[str, int]:
        """Counters of the processing mode, for /metrics (sequential mode has none)."""
        return {}

    def table(self, limit: int) -> dict[str, Any]:
        """The SPUs with the most subscribers, for an operator (:func:`broker.core.spu_table.spu_table`);
        callable from any thread, without the state lock."""
        return spu_table(list(self.subscriptions.values()), limit)

    # -- subscribe / unsubscribe --------------------------------------------------------------

    def subscribe(self, sparql: str, callback: Callable, **options: Any) -> Subscription:
        """Subscribe (:meth:`_subscribe`), under the state lock, without waiting for the
        re-evaluations queued (see :meth:`submit`).

        Why not wait: the update thread would be held until they are applied (seconds, for
        1,000 subscriptions of one client), the very stall pipelining removes, and one update
        followed by one subscribe would be enough to cause it. Nothing needs it: a re-evaluated
        SPU created now evaluates the store as it is, and no queued job concerns it; joining one
        with jobs queued, notification 0 is its result as the collector last applied it, and the
        queued outcomes then notify the new subscriber too, each the difference from the one
        before (a re-evaluation replaces the whole result: nothing can be counted twice, unlike
        the solutions parallel mode folds). A client whose update was acknowledged gets a
        notification 0 that includes it: the reply came after its re-evaluations were applied."""
        with self._state:
            return self._subscribe(sparql, callback, **options)

    def unsubscribe(self, spuid: str) -> Subscription:
        """End a subscription (:meth:`_unsubscribe`), under the state lock. An SPU it frees may
        have re-evaluations queued: the collector skips them (see :meth:`_apply_reevaluations`)."""
        with self._state:
            return self._unsubscribe(spuid)

    def wait_settled(self) -> None:
        """Return once every re-evaluation queued in the re-evaluation worker is applied and its
        update completed (at once without one)."""
        with self._settled:
            while self._queued:
                self._settled.wait()

    def _subscribe(
        self,
        sparql: str,
        callback: Callable,
        *,
        alias: str | None,
        default_graph_uri: tuple[str, ...],
        named_graph_uri: tuple[str, ...],
        prefixes: dict[str, str] | None,
        nonblocking: bool = False,
        limited: bool = False,
        probed: Probed | None = None,
        owner: str | None = None,
        coalesce_s: float = 0.0,
    ) -> Subscription:
        """`limited`: a network client's subscription (its later re-evaluations run under the time
        limit, see :meth:`_reevaluate`). `probed`: the result its probe found, taken if the store
        did not change since (a re-evaluated SPU's first result)."""
        # validates syntax and the dataset, and tells SELECT from ASK and others
        probe = self.queries.run(
            sparql,
            default_graph_uri=default_graph_uri,
            named_graph_uri=named_graph_uri,
            prefixes=prefixes,
            subscription=True,
        )
        kind = type(probe).__name__
        if kind == "QueryTriples":
            raise InvalidRequest("only SELECT and ASK queries can be subscribed (not CONSTRUCT or DESCRIBE)")
        variables = tuple(v.value for v in probe.variables) if kind == "QuerySolutions" else ()
        del probe  # a lazy pyoxigraph result must be dropped on the thread that made it
        admit: Callable[[], None] | None = None
        if limited and probed is not None:
            # a new SPU past the rows held budgets is refused on its probe's count, before it is evaluated
            admit = functools.partial(self.held.admit, owner or "", probed.rows)
        spu: SpuBase | None = None
        deferred = coalesce_s >= MIN_DEFER_S and self.on_due is not None and self.defers and not self.naive
        # an empty default graph (named-graph-uri alone, or NO_GRAPH_IRI given as default-graph-uri by
        # a client) and merged default graphs are re-evaluated: the IRIs are counted as graph_list reads
        # them (NO_GRAPH_IRI counted as a graph read the store's default graph, past a reader's rights)
        default_graphs = graph_list(default_graph_uri, "default-graph-uri")
        if not deferred and not self.naive and (len(default_graphs) == 1 or not (default_graph_uri or named_graph_uri)):
            limit = self.max_rows if limited else None
            spu = self._incremental(sparql, variables, default_graph_uri, named_graph_uri, prefixes, admit, limit)
            if isinstance(spu, IncrementalSpu) and not limited and spu.group.bounded:
                spu.group.bounded = False
                for each in spu.group.spus.values():
                    self.held.forget(each)
        if spu is None:
            spu = self._reevaluating(
                sparql,
                default_graph_uri,
                named_graph_uri,
                prefixes,
                probed,
                admit,
                coalesce_s if deferred else 0.0,
                self.max_rows if limited else None,
            )
            spu.limited = spu.limited or limited
            if limited and not deferred:
                self._demand()
            if spu in self._dirty:  # a new subscriber's notification 0 is the result now
                self._refresh_deferred(spu)
        subscription = Subscription(
            alias, callback, spu.variables, spu.is_ask, nonblocking=nonblocking, sparql=sparql, owner=owner
        )
        spu.subscribers.append(subscription)
        self.subscriptions[subscription.spuid] = (subscription, spu)
        if limited and (isinstance(spu, ReevalSpu) or (isinstance(spu, IncrementalSpu) and spu.group.bounded)):
            client = owner or ""
            try:
                self.held.join(spu, client, spu.rows_held())
            except TooManyRowsHeld:
                self._unsubscribe(subscription.spuid)
                raise
            self._charged[subscription.spuid] = client
            if isinstance(spu, ReevalSpu) and probed is not None:
                try:
                    self.costs.charge(subscription.spuid, client, probed.seconds)
                except TooCostly:
                    self._unsubscribe(subscription.spuid)
                    raise
        self.stats.record_subscriptions(len(self.subscriptions))
        if spu.is_ask:
            subscription.emit((), (), spu.current_boolean(), None)
        else:
            subscription.emit(spu.current_rows(), ())
        return subscription

    def _incremental(
        self,
        sparql: str,
        variables: tuple[str, ...],
        default_graph_uri: tuple[str, ...],
        named_graph_uri: tuple[str, ...],
        prefixes: dict[str, str] | None,
        admit: Callable[[], None] | None = None,
        limit: int | None = None,
    ) -> IncrementalSpu | GraphFeedSpu | None:
        """The SPU of `sparql` if it is incremental (made and loaded if new; `admit` first, which may
        refuse a new one that would be counted in the rows held), else None. `limit` (a network
        client's): a new SPU of a bounded group with more results is refused, its evaluation
        stopped there. Why: its probe counted them, but a write between the probe and this (an
        attack pass: a product of two patterns subscribed while 2,000 + 2,000 triples were written)
        made 4,000,000 rows here, 55.7 s of the update thread and 2.6 GB."""
        try:
            shaped = shape_query(sparql, prefixes)
        except NotIncremental as reason:
            log.debug("re-evaluated subscription: %s", reason)
            return None
        if not (default_graph_uri or named_graph_uri):
            feed = self._feed(shaped, variables)
            if feed is not None:
                return feed
        key = (shaped.shape.key(), variables, default_graph_uri, named_graph_uri)
        group = self.groups.get(key)
        if admit is not None and (group is None or (group.bounded and shaped.params not in group.spus)):
            admit()
        if group is None:
            group = ShapeGroup(
                key,
                shaped.shape,
                variables,
                tuple(graph_list(default_graph_uri, "default-graph-uri")),
                tuple(graph_list(named_graph_uri, "named-graph-uri")) if named_graph_uri else None,
            )
            self.groups[key] = group
            self._index_group(group, add=True)
        spu = group.spus.get(shaped.params)
        if spu is None:
            spu = IncrementalSpu(group, shaped.params)
            try:
                spu.load(self.store, limit if group.bounded else None)
            except TooManyRows:
                if not group.spus:
                    self._index_group(group, add=False)
                    del self.groups[key]
                raise _refused(limit) from None
            group.spus[shaped.params] = spu
            for index, params in enumerate(shaped.params):
                group.routes[index].setdefault(params, set()).add(spu)
            self._index_spu(spu, add=True)
        return spu

    def _feed(self, shaped: ShapedQuery, variables: tuple[str, ...]) -> GraphFeedSpu | None:
        """The graph feed for ``SELECT ?s ?p ?o WHERE { GRAPH <g> { ?s ?p ?o } }``, or None for other shapes."""
        shape = shaped.shape
        if shape.kind != "select" or len(shape.branches) != 1:
            return None
        branch = shape.branches[0]
        if len(branch.patterns) != 1 or branch.filters or len(branch.param_vars) != 1:
            return None
        pattern = branch.patterns[0]
        terms = (pattern.subject, pattern.predicate, pattern.object)
        if not all(isinstance(term, Var) for term in terms) or not isinstance(pattern.graph, Var):
            return None
        names = [term.name for term in terms]  # type: ignore[union-attr]
        graph = shaped.params[0][0]
        if (
            pattern.graph.name != branch.param_vars[0]
            or not isinstance(graph, NamedNode)
            or len(set(names)) != 3
            or sorted(variables) != sorted(names)
        ):
            return None
        by_variables = self.feeds.setdefault(graph, {})
        feed = by_variables.get(variables)
        if feed is None:
            order = tuple(names.index(name) for name in variables)
            feed = by_variables[variables] = GraphFeedSpu(self.store, graph, variables, order)
        return feed

    def _reevaluating(
        self,
        sparql: str,
        default_graph_uri: tuple[str, ...],
        named_graph_uri: tuple[str, ...],
        prefixes: dict[str, str] | None,
        probed: Probed | None = None,
        admit: Callable[[], None] | None = None,
        coalesce_s: float = 0.0,
        limit: int | None = None,
    ) -> ReevalSpu:
        """The re-evaluated SPU of `sparql` (made and loaded if new: `admit` first). `limit` (a
        network client's): a new SPU with more results is refused, its evaluation stopped there, as
        :meth:`_incremental` does and for the same reason: a write between the probe and this."""
        key = (sparql, default_graph_uri, named_graph_uri, tuple(sorted((prefixes or {}).items())), coalesce_s)
        spu = self.reeval.get(key)
        if spu is None:
            if admit is not None:
                admit()
            arguments = dataset_arguments(default_graph_uri, named_graph_uri)
            spu = ReevalSpu(key, sparql, arguments, prefixes, self.rows)
            spu.coalesce_s = coalesce_s
            started = spu.refreshed_at = _now()
            try:
                spu.load(self.store, probed, limit)
            except TooManyRows:  # nothing held yet
                raise _refused(limit) from None
            spu.cost_s = _now() - started
            self.reeval[key] = spu
            if not self.naive:
                spu.lutt_keys = self._reeval_keys(sparql, default_graph_uri, named_graph_uri, prefixes)
                for lutt_key in spu.lutt_keys:
                    self.lutt.add(lutt_key, spu, None)  # type: ignore[arg-type]
        return spu

    def _reevaluate(self, spus: set[ReevalSpu], later: list[tuple[ReevalSpu, Future[Any]]] | None = None) -> int:
        """Re-run `spus` on the store as it is now and notify; the number of notifications.

        Those a network client subscribed run in the query workers (a job each, the workers side
        by side), so that one made expensive after the fact by the data (its first evaluation was
        probed) is stopped at the time limit instead of holding the update thread forever: it then
        ends, its subscribers told with an error notification. The others run here. Cost, on the
        test machine: 1,000 OPTIONAL subscriptions of 200 rows took 1.46 s per matching update
        instead of 0.76 s in process (the rows travel back pickled; one job per worker for many
        subscriptions was no faster and held every result at once: +90 MB; so a few jobs ahead
        only). With 1,000 rows each: 5.3-5.8 s instead of 3.0-3.3 s (the workers build and pickle
        the rows: 2.7 us a row; they now send SPARQL TSV, see broker.workers.jobs.subscription_rows).

        `later` (pipelined, see :meth:`submit`): those are queued in the re-evaluation worker
        instead, each job with its SPU appended to `later`, and not waited for."""
        here = [spu for spu in spus if not (spu.limited and self.workers is not None)]
        there = [spu for spu in spus if spu.limited and self.workers is not None]
        if later is not None and self.reevaluators is not None:
            here = [spu for spu in spus if not spu.limited]
            there = [spu for spu in spus if spu.limited]
            calls = [((spu.sparql, spu.prefixes, spu.arguments), {"max_rows": self.max_rows}) for spu in there]
            later.extend(zip(there, self.reevaluators.dispatch("subscription_rows", calls), strict=True))
            there = []
        notifications = 0
        if there:
            assert self._reevaluators is not None and self.workers is not None
            # a few jobs ahead only: each result is a whole query result, unpickled here
            ahead = 2 * self.workers.count
            jobs = deque(self._reevaluators.submit(self._in_worker, spu) for spu in there[:ahead])
            for index, spu in enumerate(there):
                outcome = jobs.popleft().result()
                if index + ahead < len(there):
                    jobs.append(self._reevaluators.submit(self._in_worker, there[index + ahead]))
                notifications += self._outcome(spu, outcome)
        for spu in here:
            notifications += self._refresh(spu)
        return notifications

    def _refresh(self, spu: ReevalSpu) -> int:
        """Re-run `spu` here and notify (or end it, past the rows it may hold)."""
        try:
            rows, boolean = spu.evaluate(self.store)
        except Exception:
            log.exception("re-evaluation failed", extra={"query": spu.sparql})
            return 0
        if not self._fits(spu, len(rows) + sum(map(row_weight, rows)) if spu in self.held else 0):
            return 0
        return self._notified(spu, spu.replace, rows, boolean)

    def _fits(self, spu: ReevalSpu, rows: int) -> bool:
        """Whether `spu` may hold `rows` (weighed: broker.core.held.row_weight) now; if not, it is ended."""
        if spu not in self.held:
            return True
        room = self.held.headroom(spu)
        if room is not None and rows - spu.rows_held() > room:
            self._end(spu, self.held.over_budget_error())
            return False
        return True

    def _in_worker(self, spu: ReevalSpu) -> Outcome:
        assert self.workers is not None
        try:
            return (
                "ok",
                *self.workers.run("subscription_rows", spu.sparql, spu.prefixes, spu.arguments, max_rows=self.max_rows),
            )
        except SepaError as error:  # a time or memory limit, a crash: it ends the subscription
            return error
        except Exception as error:  # noqa: BLE001 - reported with this subscription
            return ("failed", str(error)[:300])

    def _outcome(self, spu: ReevalSpu, outcome: Outcome) -> int:
        if isinstance(outcome, SepaError):
            self._end(spu, outcome)
            return 0
        if outcome[0] != "ok":
            log.error("re-evaluation failed", extra={"query": spu.sparql, "reason": outcome[1]})
            return 0
        _, _variables, text, boolean = outcome
        if not self._fits(spu, text_weight(text) if isinstance(text, bytes) else len(text)):
            return 0
        # read here rather than on the thread that waited for it: that thread would take the GIL from
        # this one for each result (`bench reeval --rows 1000`, the matching update: 6.0-7.1 -> 3.7-4.7 s)
        if isinstance(text, bytes):
            return self._notified(spu, spu.replace_text, text)
        return self._notified(spu, spu.replace, tuple(text), boolean)

    def _notified(self, spu: ReevalSpu, call: Callable[..., int], *args: object) -> int:
        try:
            return call(*args)
        except Exception:
            log.exception("re-evaluation failed", extra={"query": spu.sparql})
            return 0
        finally:
            if spu in self.held:
                self.held.resized(spu, spu.rows_held())

    def _end(self, spu: SpuBase, error: SepaError, *, told: bool = False) -> None:
        """End every subscription of `spu`, each told why with a last notification (unless
        `told` already: :meth:`_tell_ended`)."""
        if not told:
            self._tell_ended(spu, error)
        for subscription in list(spu.subscribers):
            self._unsubscribe(subscription.spuid)

    def _tell_ended(self, spu: SpuBase, error: SepaError) -> None:
        """Send every subscriber of `spu` its last notification, saying why it ends."""
        log.warning("subscription ended", extra={"reason": error.description, "subscribers": len(spu.subscribers)})
        for subscription in list(spu.subscribers):
            self.stats.subscriptions_ended += 1
            notification = Notification(
                subscription.spuid, subscription.alias, subscription.next_sequence, subscription.variables, ended=error
            )
            try:
                subscription.callback(notification)
            except Exception:
                log.exception("notification callback failed", extra={"spuid": subscription.spuid})

    def _demand(self) -> None:
        """An on-demand re-evaluation pool (hold _state): woken while a network client's
        subscription is re-evaluated; put to rest `rest_after_s` after the last one ended, once
        nothing is queued in it. Until it is ready, re-evaluations take the query workers, the
        update thread waiting for them (:meth:`submit`)."""
        pool = self.reevaluators
        if pool is None or not pool.on_demand:
            return
        if any(spu.limited and not spu.coalesce_s for spu in self.reeval.values()):
            pool.wake()
        elif self._rest_timer is None and not self._stopping:
            self._rest_timer = threading.Timer(self.rest_after_s, self._rest_if_unwanted)
            self._rest_timer.daemon = True
            self._rest_timer.start()

    def _rest_if_unwanted(self) -> None:
        with self._state:
            self._rest_timer = None
            if any(spu.limited and not spu.coalesce_s for spu in self.reeval.values()):
                return
            if self._queued:
                self._demand()  # its last jobs are still being applied: later
                return
            assert self.reevaluators is not None
            self.reevaluators.rest()

    def close(self) -> None:
        """Stop the threads, once the re-evaluations queued are applied (their updates completed)."""
        self.wait_settled()
        with self._state:
            if self._rest_timer is not None:
                self._rest_timer.cancel()
        with self._settled:
            self._stopping = True
            self._settled.notify_all()
        if self._reeval_collector is not None:
            self._reeval_collector.join(30)
        if self._reevaluators is not None:
            self._reevaluators.shutdown(wait=False, cancel_futures=True)

    def _unsubscribe(self, spuid: str) -> Subscription:
        entry = self.subscriptions.pop(spuid, None)
        if entry is None:
            raise NotFound(f"no subscription {spuid}")
        subscription, spu = entry
        spu.subscribers.remove(subscription)
        client = self._charged.pop(spuid, None)
        if client is not None:
            self.held.leave(spu, client)
        self.costs.release(spuid)
        if spu.subscribers:
            return subscription
        self.trimmer.freed()  # the SPU's result goes: give the memory back (broker.core.memory)
        if isinstance(spu, GraphFeedSpu):
            by_variables = self.feeds[spu.graph]
            del by_variables[spu.variables]
            if not by_variables:
                del self.feeds[spu.graph]
        elif isinstance(spu, ReevalSpu):
            del self.reeval[spu.key]
            self._dirty.pop(spu, None)
            spu.release()
            for lutt_key in spu.lutt_keys:
                self.lutt.remove(lutt_key, spu, None)  # type: ignore[arg-type]
            if spu.limited:
                self._demand()
        elif isinstance(spu, IncrementalSpu):
            group = spu.group
            self._index_spu(spu, add=False)
            del group.spus[spu.params]
            for index, params in enumerate(spu.params):
                routed = group.routes[index].get(params)
                if routed is not None:
                    routed.discard(spu)
                    if not routed:
                        del group.routes[index][params]
            if not group.spus:
                self._index_group(group, add=False)
                del self.groups[group.key]
        return subscription

    # -- LUTT entries -------------------------------------------------------------------------

    def _pattern_keys(self, group: ShapeGroup, pattern: QuadPattern, values: dict[str, object]) -> list:
        def position(term: object) -> object:
            if isinstance(term, Var):
                return values.get(term.name)
            return term

        graph = pattern.graph
        named = group.dataset.named
        if isinstance(graph, DefaultGraph):
            graphs: list[object] = [group.dataset.default]
        elif isinstance(graph, Var) and graph.name in values:
            value = values[graph.name]
            graphs = [value] if named is None or value in named else []
        elif isinstance(graph, Var):
            graphs = [NAMED] if named is None else list(named)
        else:
            graphs = [graph]
        subject, predicate, obj = position(pattern.subject), position(pattern.predicate), position(pattern.object)
        return [make_key(g, subject, predicate, obj) for g in graphs]

    def _index_group(self, group: ShapeGroup, *, add: bool) -> None:
        """Shape-wide entries: patterns without parameters concern every SPU of the shape."""
        for branch_index, branch in enumerate(group.shape.branches):
            params = set(branch.param_vars)
            for pattern_index, pattern in enumerate(branch.patterns):
                if pattern.variables() & params:
                    continue
                for key in self._pattern_keys(group, pattern, {}):
                    ref = (group, branch_index, pattern_index)
                    (self.lutt.add if add else self.lutt.remove)(key, ref, None)

    def _index_spu(self, spu: IncrementalSpu, *, add: bool) -> None:
        group = spu.group
        for branch_index, branch in enumerate(group.shape.branches):
            values = dict(zip(branch.param_vars, spu.params[branch_index], strict=True))
            for pattern_index, pattern in enumerate(branch.patterns):
                if not pattern.variables() & values.keys():
                    continue
                for key in self._pattern_keys(group, pattern, values):
                    ref = (group, branch_index, pattern_index)
                    (self.lutt.add if add else self.lutt.remove)(key, ref, spu)

    def _reeval_keys(
        self,
        sparql: str,
        default_graph_uri: tuple[str, ...],
        named_graph_uri: tuple[str, ...],
        prefixes: dict[str, str] | None,
    ) -> list:
        named = graph_list(named_graph_uri, "named-graph-uri")
        defaults = graph_list(default_graph_uri, "default-graph-uri") or ([] if named else [DEFAULT_GRAPH])
        keys = []
        for loose in query_patterns(sparql, prefixes):
            if loose.graph == LOOSE_DEFAULT:
                graphs: list[object] = list(defaults)
            elif loose.graph == LOOSE_NAMED:
                graphs = list(named) if named else [NAMED]
            elif isinstance(loose.graph, NamedNode):
                graphs = [loose.graph] if not named or loose.graph in named else []
            else:
                graphs = [ANY]
            keys += [make_key(g, loose.subject, loose.predicate, loose.object) for g in graphs]
        return list(dict.fromkeys(keys))

    # -- processing an update -----------------------------------------------------------------

    def _feed_hits(self, delta: Delta) -> list[tuple[GraphFeedSpu, QuadRows, QuadRows]]:
        """Each graph feed whose graph the delta touches, with its (lazy) rows added and removed.

        Deciding that costs one look at the first quad when the delta is mostly the graph's (an
        observation batch), a pass over the delta when it holds none of it.
        """
        hits = []
        for by_variables in self.feeds.values():
            for feed in by_variables.values():
                digest = delta.digest if delta.digest is not None and delta.digest.graph == feed.graph else None
                added, removed = feed.rows_of(delta.added, digest), feed.rows_of(delta.removed)
                if added or removed:
                    hits.append((feed, added, removed))
        return hits

    def submit(
        self,
        delta: Delta,
        apply: Callable[[Delta], None],
        budget: Budget | None,
        done: Callable[[int, dict[str, float]], None],
    ) -> None:
        """Apply `delta` and process it; `done(notifications, timings)` once it is processed (here,
        before this returns; parallel mode, :mod:`broker.core.pipeline`, may call it later).

        With a re-evaluation worker (`reevaluators`), the re-evaluations of a network client's
        subscriptions are pipelined: the update thread notifies the incremental SPUs, queues the
        re-evaluations in that worker and returns; the collector thread waits for them, in update
        order, applies each (its notification, or the end of its subscriptions past the time
        limit) and only then calls `done`, so the publisher's reply still comes after end of
        processing. Each job sees the store as this update left it however late it runs
        (:meth:`~broker.workers.pool.QueryWorkers.dispatch`), so every subscription still gets every
        update's delta, in order (the collector applies them first in, first out). An update that
        re-evaluates nothing completes at once, possibly before an earlier one (the scheduler
        acknowledges each when its future is done).

        Why: 1,000 OPTIONAL subscriptions of 200 rows on one WebSocket held the update thread
        1.5-3 s per matching update (waiting for the query workers), and every other client's
        update, subscribe and MQTT commit with it. A worker of its own so that those 1,000 jobs
        queue there, not ahead of other clients' queries in the query workers. Measured (shared
        2-core machine, ten such updates in a row, another client updating every 20 ms over HTTP):
        that client's p99 18-41 ms, max 35-65 ms, instead of p50 0.9-1.3 s; the update thread
        spends 17-30 ms queueing the 1,000 jobs. The matching update's own reply is shorter too
        (`bench reeval --rows 200`: 468-603 ms instead of 896-1,232 ms)."""
        if (
            self.reevaluators is None
            or self.naive
            or budget is not None
            # an on-demand pool not ready yet (woken or at rest): as without one, unless updates
            # are queued in it (only this thread queues: empty now is empty until it queues)
            or not (self.reevaluators.ready or self._queued)
        ):
            done(*self.process(delta, apply, budget))
            return
        later: list[tuple[ReevalSpu, Future[Any]]] = []
        with self._state:
            notifications, timings = self._process(delta, apply, self.store, later=later)
        if not later:
            done(notifications, timings)
            return
        with self._settled:
            self._queued.append(Reevaluations(done, later, notifications, timings))
            self._settled.notify_all()
            if self._reeval_collector is None:
                self._reeval_collector = threading.Thread(target=self._collect_loop, name="sepa-reeval-collector")
                self._reeval_collector.daemon = True
                self._reeval_collector.start()

    def process(
        self, delta: Delta, apply: Callable[[Delta], None], budget: Budget | None = None
    ) -> tuple[int, dict[str, float]]:
        """Apply `delta` between the two phases and notify; returns (notifications, timings).

        With a `budget`, lookups and notifications are charged to it; on OverBudget the delta is
        undone (if it was applied) before the error propagates, and nothing was notified. Deltas
        that could not be undone exactly (graphs created or dropped, or quads added to a graph that
        does not exist yet) and re-evaluated subscriptions are not attempted under a budget.
        """
        if budget is not None:
            if not self._state.acquire(blocking=False):
                raise OverBudget  # the collector is applying a re-evaluation: not on an event loop
            try:
                return self._process_bounded(delta, apply, budget)
            finally:
                self._state.release()
        with self._state:
            return self._process(delta, apply, self.store)

    def _process_bounded(
        self, delta: Delta, apply: Callable[[Delta], None], budget: Budget, matched: Matched | None = None
    ) -> tuple[int, dict[str, float]]:
        ox = self.store.ox
        if self.naive or delta.graphs_created or delta.graphs_dropped:
            raise OverBudget
        budget.spend(len(delta.added) + len(delta.removed))
        for quad in delta.added:
            graph = quad.graph_name
            if not isinstance(graph, DefaultGraph) and not ox.contains_named_graph(graph):
                raise OverBudget  # undoing the insertion would leave the new graph behind
        return self._process(delta, apply, BudgetedRdfStore(ox, budget), budget, matched)

    def _match(self, delta: Delta) -> Matched:
        """The LUTT's hits for the quads removed and added, and the re-evaluating SPUs among them."""
        removed_hits = self.lutt.match_all(delta.removed)
        added_hits = self.lutt.match_all(delta.added)
        reeval: set[ReevalSpu] = {ref for ref in (*removed_hits, *added_hits) if isinstance(ref, ReevalSpu)}
        if delta.graphs_created or delta.graphs_dropped or (self.reeval and self._creates_graph(delta)):
            reeval.update(self.reeval.values())  # GRAPH ?g {} sees empty graphs come and go
        if self.on_due is not None and reeval:
            deferred = {spu for spu in reeval if spu.coalesce_s}
            if deferred:
                reeval -= deferred
                self._defer(deferred)
        return removed_hits, added_hits, reeval

    def _creates_graph(self, delta: Delta) -> bool:
        """Whether `delta` adds the first quad of a named graph, which creates it (called before it
        is applied).

        Why: whether a graph exists is what `GRAPH ?g { }`, `GRAPH ?g { OPTIONAL {...} }`,
        `FILTER EXISTS { GRAPH <g> { } }` test, and no LUTT key stands for it: with only
        CREATE counted as a creation, `SELECT ?g ?l WHERE { ?g rdfs:label ?l . GRAPH ?g { } }`
        got no notification when a reading's first quad made the graph (found by a differential
        pass), and stayed wrong (pyoxigraph keeps an emptied graph). Dropping the last quad
        removes no graph, so creation is all there is to see."""
        contains = self.store.ox.contains_named_graph
        seen: set[object] = set()
        for quad in delta.added:
            graph = quad.graph_name
            if graph in seen or isinstance(graph, DefaultGraph):
                continue
            if not contains(graph):
                return True
            seen.add(graph)
        return False

    def _defer(self, spus: set[ReevalSpu]) -> None:
        """Coalescing SPUs an update concerns: each due for a re-evaluation one interval after its
        last one (at once after a quiet interval), run by :meth:`flush_due`; the update itself
        does not evaluate them.

        Why: the dashboard's tiles (one subscription over the latest view, coalesced to 250 ms by
        the WebSocket gate) were processed incrementally at every reading, and the gate then
        merged 250 of every 250 notifications: at 1,000 readings/s the page's subscription took the
        update thread 1.0-1.6 s with the GIL per 15 s (py-spy --gil, as installed, with the page open
        against without), the most of what the page cost the gateway. One re-evaluation of its
        ~500 rows per 250 ms costs a fraction of it. A re-evaluation computes the net change since
        the one before, which is what the gate sent (PROTOCOL.md's notification semantics over the
        notifications sent). Not in parallel mode (its pipeline orders re-evaluations itself) nor
        naive mode: there the gate alone coalesces, as before.

        A query whose re-evaluation is long is re-evaluated less often than asked: at most one
        DEFER_DUTY-th of the update thread's time goes to one SPU (a large result subscribed with
        a short interval over a busy graph would otherwise take the thread for itself); its
        notifications then come later than the interval, and still carry the net change."""
        on_due = self.on_due
        assert on_due is not None
        now = _now()
        for spu in spus:
            if spu not in self._dirty:
                interval = max(spu.coalesce_s, DEFER_DUTY * spu.cost_s)
                due = self._dirty[spu] = max(now, spu.refreshed_at + interval)
                on_due(due)

    def flush_due(self) -> float | None:
        """Re-evaluate the coalescing SPUs that are due, and notify; when the next one is due
        (time.monotonic()), None if none is waiting. Call it from one thread at a time, not the
        update thread, and without the engine's lock: updates go on meanwhile.

        Why not on the update thread: a network client's SPU is re-evaluated in a query worker,
        and a worker may be slow to answer (one compacting its replica answered nothing for ~1 s,
        before replicas compacted on a thread of their own): the dashboard's tiles, flushed there,
        held every reading for it (NL p99 1.8 s in one 15 s phase). Here only this thread waits.
        The result is the store as it was when the evaluation began; updates after that made the
        SPU due again. One that the SPU's own generation outran meanwhile (a subscriber joined and
        re-evaluated it) is dropped, so that no subscriber is taken back to an older result."""
        with self._state:
            now = _now()
            due = [spu for spu, at in self._dirty.items() if at <= now and spu not in self._flushing]
            for spu in due:
                del self._dirty[spu]
                spu.refreshed_at = now
            self._flushing.update(due)
            generations = [spu.generation for spu in due]
        try:
            for spu, generation in zip(due, generations, strict=True):
                started = _now()
                outcome = self._evaluated(spu)
                spu.cost_s = _now() - started
                with self._state:
                    if spu.generation == generation and self.reeval.get(spu.key) is spu:
                        spu.generation += 1
                        self._outcome(spu, outcome)
        finally:
            with self._state:
                self._flushing.difference_update(due)
        with self._state:
            return min(self._dirty.values(), default=None)

    def _evaluated(self, spu: ReevalSpu) -> Outcome:
        """A coalescing SPU's query on the store now, as a re-evaluation's outcome: in a query
        worker under the time limit if a network client subscribed it, else here (on a snapshot
        without a running request's operations: RdfStore.settled_read)."""
        if spu.limited and self.workers is not None:
            return self._in_worker(spu)
        try:
            rows, boolean = self.store.settled_read(lambda: spu.evaluate(self.store))
        except Exception as error:  # noqa: BLE001 - reported with this subscription
            return ("failed", str(error)[:300])
        return ("ok", spu.variables, rows, boolean)

    def _refresh_deferred(self, spu: ReevalSpu) -> None:
        """Re-evaluate a coalescing SPU now and notify (hold _state): a subscriber joins it."""
        self._dirty.pop(spu, None)
        spu.generation += 1
        started = spu.refreshed_at = _now()
        self._reevaluate({spu})
        spu.cost_s = _now() - started

    def _process(
        self,
        delta: Delta,
        apply: Callable[[Delta], None],
        store: RdfStore | BudgetedRdfStore,
        budget: Budget | None = None,
        matched: Matched | None = None,
        later: list[tuple[ReevalSpu, Future[Any]]] | None = None,
    ) -> tuple[int, dict[str, float]]:
        """`matched`: the LUTT's hits, when the caller looked them up already (:meth:`_match`).
        `later`: see :meth:`_reevaluate`."""
        started = time.perf_counter()
        if self.naive:
            apply(delta)
            applied = time.perf_counter()
            notifications = sum(spu.refresh(self.store) for spu in self.reeval.values()) if not delta.empty else 0
            done = time.perf_counter()
            subscribers = sum(len(spu.subscribers) for spu in self.reeval.values()) if not delta.empty else 0
            return notifications, {
                "t_apply_s": applied - started,
                "t_lutt_s": 0.0,
                "t_booster_s": done - applied,
                "t_notify_s": 0.0,
                "lutt_hits": subscribers,
            }
        removed_hits, added_hits, reeval = self._match(delta) if matched is None else matched
        if budget is not None:
            if reeval:
                raise OverBudget  # a re-evaluation is a whole query: not bounded
            budget.spend(sum(map(len, removed_hits.values())) + sum(map(len, added_hits.values())))
        matched = time.perf_counter()

        lost: dict[IncrementalSpu, dict[int, set[Mu]]] = {}
        gained: dict[IncrementalSpu, dict[int, set[Mu]]] = {}
        over: set[IncrementalSpu] = set()  # past max_rows: ended, not notified
        # network clients' SPUs whose lookups ran past the time limit: ended, not notified
        failed: dict[IncrementalSpu, SepaError] = {}
        lookup = BoundedLookups(self.workers, self.stats) if budget is None and self.workers is not None else None
        self._collect(store, removed_hits, lost, lookup=lookup, failed=failed)
        pre_done = time.perf_counter()
        apply(delta)
        applied = time.perf_counter()
        try:
            self._collect(store, added_hits, gained, over, lookup=lookup, failed=failed)
            if budget is not None and over:
                raise OverBudget  # ending subscriptions is the update thread's work
            for spu in over | failed.keys():
                lost.pop(spu, None)
                gained.pop(spu, None)
            touched = lost.keys() | gained.keys()
            fed = self._feed_hits(delta) if self.feeds else []
            if budget is not None:
                for feed, _, _ in fed:
                    budget.spend(len(delta.added) + len(delta.removed))  # what its consumers may read
                    if not all(subscriber.nonblocking for subscriber in feed.subscribers):
                        raise OverBudget
                for spu in touched:
                    budget.spend(len(spu.subscribers))
                    if not all(subscriber.nonblocking for subscriber in spu.subscribers):
                        raise OverBudget  # a callback that may wait must not run on an event loop
        except OverBudget:  # only under a budget: undo the delta; nothing was notified yet
            apply(Delta(delta.removed, delta.added))
            raise
        reeval_notifications = self._reevaluate(reeval, later)
        post_done = time.perf_counter()

        notifications, hits = self._notify(lost, gained, fed, over, self.max_rows, failed=failed)
        notifications += reeval_notifications
        finished = time.perf_counter()
        hits += sum(len(spu.subscribers) for spu in reeval)
        return notifications, {
            "t_apply_s": applied - pre_done,
            "t_lutt_s": matched - started,
            "t_booster_s": (pre_done - matched) + (post_done - applied),
            "t_notify_s": finished - post_done,
            "lutt_hits": hits,
        }

    # -- the collector thread: re-evaluations pipelined ----------------------------------------

    def _collect_loop(self) -> None:
        while True:
            with self._settled:
                while not self._queued and not self._stopping:
                    self._settled.wait()
                if not self._queued:
                    return
                entry = self._queued[0]
            notifications = 0
            try:
                notifications = self._apply_reevaluations(entry)
            except Exception:  # an engine bug: logged; the update was applied and must complete
                log.exception("applying re-evaluations failed")
            with self._settled:
                self._queued.popleft()
                self._settled.notify_all()
            try:
                entry.done(entry.notifications + notifications, entry.timings)
            except Exception:
                log.exception("completing an update failed")
            # its jobs hold every result text of the update: not kept while waiting for the next
            # (bench reeval --rows 1000: RSS after every subscription ended 108 MB instead of 90)
            del entry

    def _apply_reevaluations(self, entry: Reevaluations) -> int:
        """Wait for each of `entry`'s jobs in turn and apply its outcome; the notifications sent.

        A job whose worker was lost (killed for the time limit of a job ahead of it, or dead) is run
        again now, in a query worker: its notification then covers this update and those since. So
        is a job whose worker died under it: a worker killed from outside (an operator, the OOM
        killer) ended the subscription with `evaluation_crashed`; a query that really crashes its
        worker crashes the query worker too, and that ends it. A
        fault path only, and still a difference from the previous notification: with several
        re-evaluation workers, a later update's job that another worker ran on the store as that
        update left it may then step the result back, and the next ones forward again."""
        notifications = 0
        waited = applied = 0.0
        for spu, job in entry.jobs:
            started = time.perf_counter()
            outcome = _settle(job)
            if isinstance(outcome, WorkerLost | EvaluationCrashed) and self.workers is not None:
                outcome = self._in_worker(spu)
            got = time.perf_counter()
            with self._state:
                if self.reeval.get(spu.key) is spu:  # not ended by an earlier outcome
                    if isinstance(outcome, WorkerLost):  # no query workers: here
                        notifications += self._refresh(spu)
                    else:
                        notifications += self._outcome(spu, outcome)
            waited += got - started
            applied += time.perf_counter() - got
            time.sleep(0)  # the GIL to the update thread and the event loop between two outcomes
        timings = entry.timings
        timings["t_booster_s"] = timings.get("t_booster_s", 0.0) + waited
        timings["t_notify_s"] = timings.get("t_notify_s", 0.0) + applied
        return notifications

    def _notify(
        self,
        lost: dict[IncrementalSpu, dict[int, set[Mu]]],
        gained: dict[IncrementalSpu, dict[int, set[Mu]]],
        fed: list[tuple[GraphFeedSpu, QuadRows, QuadRows]],
        over: set[IncrementalSpu] | None = None,
        limit: int | None = None,
        past: dict[IncrementalSpu, SepaError] | None = None,
        failed: dict[IncrementalSpu, SepaError] | None = None,
    ) -> tuple[int, int]:
        """Fold the solutions into each touched SPU and notify, then the graph feeds: (notifications,
        LUTT hits). Then the SPUs `over` max_rows, and those of bounded groups the fold took past
        `limit` rows or past the rows they may hold (:mod:`broker.core.held`), are ended, not
        notified; or, given `past` (parallel mode's collector), their subscribers are told at once
        and the SPUs put there, with why, for the engine's thread to end (see
        PipelinedSpuManager._recover); meanwhile they are neither folded nor notified. The SPUs
        `failed` (not in `lost` or `gained`: see broker.core.lookups) are ended too, with their error."""
        notifications = hits = 0
        ended: dict[IncrementalSpu, SepaError] = dict.fromkeys(over, self._too_many_rows()) if over else {}
        if failed:
            ended.update(failed)
        held = self.held
        for spu in lost.keys() | gained.keys():
            if past and spu in past:
                continue  # its subscribers were told it ended
            bound = limit if spu.group.bounded else None
            by_budget = False
            if spu in held and (room := held.headroom(spu)) is not None:
                most = spu.rows_held() + room
                if bound is None or most < bound:
                    bound, by_budget = most, True
            try:
                notifications += spu.apply(lost.get(spu, {}), gained.get(spu, {}), bound)
            except TooManyRows:
                ended[spu] = held.over_budget_error() if by_budget else self._too_many_rows()
            else:
                if spu in held:
                    held.resized(spu, spu.rows_held())
            hits += len(spu.subscribers)
        for feed, added_rows, removed_rows in fed:
            notifications += feed.apply(added_rows, removed_rows)
            hits += len(feed.subscribers)
        if past is not None:
            for spu, error in ended.items():
                if spu not in past:
                    past[spu] = error
                    self._tell_ended(spu, error)
            return notifications, hits
        for spu, error in ended.items():
            self._end(spu, error)
        return notifications, hits

    def _too_many_rows(self) -> ResultTooLarge:
        return ResultTooLarge(
            f"the subscription's result would have more than {self.max_rows} rows ({WEIGHED}; "
            "the limit of one subscription: [websocket] max_subscription_rows)"
        )

    def _collect(
        self,
        store: RdfStore | BudgetedRdfStore,
        hits: dict,
        out: dict[IncrementalSpu, dict[int, set[Mu]]],
        over: set[IncrementalSpu] | None = None,
        *,
        lookup: Lookup | None = None,
        failed: dict[IncrementalSpu, SepaError] | None = None,
    ) -> None:
        """`over`: the solutions gained, bounded by max_rows (see ShapeGroup.collect). `lookup`
        (with `failed`): how a bounded group's hits are looked up (broker.core.lookups)."""
        for ref, quads in hits.items():
            if isinstance(ref, ReevalSpu):
                continue
            group, branch_index, pattern_index = ref
            limit = self.max_rows if over is not None and group.bounded else None
            bounded = lookup if group.bounded else None
            try:
                group.collect(store, (branch_index, pattern_index), quads, out, limit, over, bounded, failed)  # type: ignore[arg-type]
            except OverBudget:
                raise
            except Exception:
                log.exception("incremental evaluation failed", extra={"shape": str(group.shape.branches)})


def _refused(limit: int | None) -> ResultTooLarge:
    """Why a new SPU of a network client's subscription was refused at `limit` rows."""
    return ResultTooLarge(
        f"the subscription's result has more than {limit} rows ({WEIGHED}; "
        "the limit of one subscription: [websocket] max_subscription_rows)"
    )


def _settle(job: Future[Any]) -> Outcome:
    """A dispatched re-evaluation's outcome, as :meth:`SpuManager._in_worker` gives it."""
    try:
        return ("ok", *job.result())
    except SepaError as error:  # a memory limit too: it was logged and the subscription kept, un-notified
        return error
    except Exception as error:  # noqa: BLE001 - reported with this subscription
        return ("failed", str(error)[:300])
