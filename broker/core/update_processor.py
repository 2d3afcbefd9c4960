"""Update processor: turns a SPARQL 1.1 Update request into the exact quads it adds and removes.

`compute` never leaves the store changed: a single-operation request (the common case) is
evaluated against the store as it is; a multi-operation request applies its operations one by
one (each sees the previous ones), keeps an undo log, and restores the store before returning.
On disk those operations are journalled as provisional and the undo as settling them, so a
gateway killed in between comes back without them (:mod:`broker.store`). The query workers,
where network clients' queries run, keep them from every job but the request's own until the undo
(:meth:`broker.workers.pool.QueryWorkers._follow`); a query of this process on the store itself
(`trusted`, or an engine without workers) may still see them while the request runs.
The net delta is then applied by the SPU manager between the two phases of subscription
processing (removed results are computed on the old state, added ones on the new).
"""

from __future__ import annotations

import dataclasses
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pyoxigraph import BlankNode, DefaultGraph, Literal, NamedNode, Quad, RdfFormat, parse

from broker.core.bgp import DEFAULT_GRAPH, Dataset, evaluate_bgp, values_quads
from broker.core.budget import Budget, BudgetedStore, OverBudget
from broker.core.held import WEIGHED, quad_weight
from broker.core.query_processor import graph_list
from broker.core.where import LIMIT_SETTING, Solutions, where_solutions
from broker.errors import Forbidden, InvalidRequest, TimeLimitExceeded, UpdateFailed
from broker.sparql.canonical import canonical
from broker.sparql.limits import DATA_QUAD_LIMIT
from broker.sparql.patterns import QuadPattern, Var
from broker.sparql.plan import plan_update
from broker.sparql.service import check_services
from broker.sparql.syntax import Digest, Modify, Update
from broker.sparql.update_parser import (
    DataOp,
    GraphOp,
    LoadOp,
    ModifyOp,
    fresh_blank_nodes,
    located_error,
    parse_update,
)
from broker.store import PROVISIONAL, SETTLED, ApplyMark, RdfStore

LOAD_LIMIT_BYTES = 64 * 1024 * 1024

Request = str | Update  # SPARQL text, or an in-process producer's syntax tree (broker.sparql.syntax)


@dataclass(frozen=True, slots=True)
class Delta:
    """The net effect of one update request."""

    added: frozenset[Quad]
    removed: frozenset[Quad]
    graphs_created: frozenset[NamedNode] = frozenset()
    graphs_dropped: frozenset[NamedNode] = frozenset()
    # an Update's digest of its quads in digest.graph, all of them added (broker.sparql.syntax)
    digest: Digest | None = None

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.graphs_created or self.graphs_dropped)


@dataclass(frozen=True, slots=True)
class Matched:
    """What a one-pattern WHERE joined with VALUES matched, as the quads alone: the solutions of a
    DELETE whose every pattern is that WHERE pattern, and that inserts nothing with a variable
    (the retention agent's delete, see :func:`broker.core.bgp.values_quads`)."""

    quads: list[Quad]

    def __len__(self) -> int:
        return len(self.quads)  # one solution each


class _NetDelta:
    """Accumulates operation deltas into a net delta (a quad removed then re-added is neither)."""

    def __init__(self) -> None:
        self.added: set[Quad] = set()
        self.removed: set[Quad] = set()

    def add(self, added: Iterable[Quad], removed: Iterable[Quad]) -> None:
        for quad in removed:
            if quad in self.added:
                self.added.discard(quad)
            else:
                self.removed.add(quad)
        for quad in added:
            if quad in self.removed:
                self.removed.discard(quad)
            else:
                self.added.add(quad)


def _check_dataset_readable(
    operations: list, protocol: list[NamedNode], readable: frozenset[NamedNode | DefaultGraph]
) -> None:
    """Refuse a WHERE dataset that names a graph the client may not read (USING, USING NAMED,
    using-graph-uri, using-named-graph-uri), as FROM is refused in a query (403), before anything
    runs. Before, the graph was left out and the update answered 200 having read nothing there,
    which docs/protocol.md did not say. WITH is not refused: it names the graph the templates
    write too, which a client may be allowed to write without reading."""
    named = [*protocol]
    for operation in operations:
        if isinstance(operation, ModifyOp):
            named += [*operation.using, *operation.using_named]
    for graph in named:
        if graph not in readable:
            shown = "the default graph" if isinstance(graph, DefaultGraph) else f"the graph {graph}"
            raise Forbidden(f"this client may not read {shown}")


def _check_named_writes(operations: list, writable: frozenset[NamedNode | DefaultGraph]) -> None:
    """Refuse a request naming, in its own text, a graph the client may not write: DATA blocks,
    template quads whose graph is not a variable (the default graph being WITH's), graph
    operations and LOAD targets. For a delayed update, checked when it is scheduled: it was
    accepted (202), then failed unseen when due, holding one of its client's pending places until
    then. A template's ``GRAPH ?g`` is known only when it runs, where every write is checked."""
    for operation in operations:
        if isinstance(operation, DataOp):
            graphs: list[object] = [quad.graph_name for quad in operation.quads]
        elif isinstance(operation, ModifyOp):
            patterns = [pattern.graph for pattern in (*operation.delete, *operation.insert)]
            grounds = [quad.graph_name for quad in (*operation.delete_ground, *operation.insert_ground)]
            default = operation.with_graph if operation.with_graph is not None else DEFAULT_GRAPH
            graphs = [default if isinstance(graph, DefaultGraph) else graph for graph in (*patterns, *grounds)]
        elif isinstance(operation, GraphOp):
            if operation.target in ("NAMED", "ALL"):
                raise Forbidden(f"{operation.verb} {operation.target} needs the right to write every graph")
            moved = operation.source if operation.verb == "MOVE" else None
            graphs = [DEFAULT_GRAPH if g == "DEFAULT" else g for g in (operation.target, moved) if g is not None]
        else:
            graphs = [operation.into if operation.into is not None else DEFAULT_GRAPH]
        for graph in graphs:
            if isinstance(graph, NamedNode | DefaultGraph) and graph not in writable:
                shown = "DEFAULT" if isinstance(graph, DefaultGraph) else str(graph)
                raise Forbidden(f"this client may not write to the graph {shown}")


def _instantiate(
    pattern: QuadPattern, solution: dict[str, object], default_graph: object, fresh: dict | None
) -> Quad | None:
    """The template quad for one solution, or None when unbound or not a valid quad."""
    terms = []
    for position in (pattern.subject, pattern.predicate, pattern.object, pattern.graph):
        if isinstance(position, Var):
            position = solution.get(position.name)
            if position is None:
                return None
        elif fresh is not None and isinstance(position, BlankNode):
            position = fresh.setdefault(position, BlankNode())
        terms.append(position)
    subject, predicate, obj, graph = terms
    if isinstance(graph, DefaultGraph):
        graph = default_graph
    if isinstance(subject, Literal) or not isinstance(predicate, NamedNode):
        return None
    if isinstance(graph, DefaultGraph):  # pyoxigraph takes an omitted graph much faster than DefaultGraph()
        return Quad(subject, predicate, obj)  # type: ignore[arg-type]
    if not isinstance(graph, NamedNode | BlankNode):
        return None
    return Quad(subject, predicate, obj, graph)  # type: ignore[arg-type]


def _in_graph(quads: tuple[Quad, ...], with_graph: NamedNode | None) -> tuple[Quad, ...] | list[Quad]:
    """Ground template quads with the default graph read as the WITH graph, when there is one."""
    if with_graph is None:
        return quads
    return [
        Quad(q.subject, q.predicate, q.object, with_graph) if isinstance(q.graph_name, DefaultGraph) else q
        for q in quads
    ]


def _matched_deletes(
    operation: ModifyOp, using: list[NamedNode], named: list[NamedNode]
) -> tuple[int | None, ...] | None:
    """Per DELETE template pattern, the index of an identical WHERE pattern whose matched quad is the
    template's instance, or None; None for all when there is no such pattern.

    Why: `DELETE { P } ... WHERE { P }` is how a producer replaces a value, and rebuilding the quad
    P matched costs more than the rest of its delta (pyoxigraph converts a Literal object ~5 us
    slowly). It is the same quad only when the template's default graph is the WHERE clause's, i.e.
    without USING (in the request or the protocol): then both are the WITH graph or the default graph.
    The identical patterns are found once per operation (ModifyOp.delete_matches).
    """
    if operation.using or operation.using_named or using or named:
        return None
    return operation.delete_matches


# quads a network client's update request may change at most (and solutions its WHERE clauses may
# have): a 60-byte update whose WHERE is a product of the store with itself wrote 250,000 quads
# from a 500-triple store in 9 s, the gateway's RSS 105 -> 541 MB (about 1.7 KB a quad: solutions,
# quads, delta sets, notifications), so on a 1 GB board one request could end the gateway. Code of
# the process (the adapters, retention, tools loading a knowledge base) is not bounded.
MAX_UPDATE_QUADS = 100_000
# index lookups and quads a network client's plain-BGP WHERE may cost on the update thread (about
# 0.3 s: a cartesian product spent 200,000 in 1.3 s); past them it is evaluated again in a query
# worker, under the time limit. One budget for all the operations of a request, as the time limit is
# (see UpdateProcessor.compute)
WHERE_STEPS = 50_000


# triple patterns (with those of OPTIONAL blocks) of a network client's plain-BGP WHERE that are
# planned and evaluated on the update thread; a longer one goes to a query worker, under the time
# limit, as a WHERE that is not a plain BGP does. Why: the join planner (broker.core.bgp.plan) is
# quadratic in the patterns and runs before the step budget: 4,000 patterns held the update
# thread, and every other client's updates, 6.97 s with a 3 s limit (/tmp/atk-j/bgp_plan2.py),
# and the evaluation recurses once per pattern. Planning 128 takes 16 ms (64: 3.5 ms, 512: 0.25 s,
# once per shape: plans are cached); real updates have a few to a few dozen (an observation
# with its result and feature of interest: about a dozen)
MAX_PLANNED_PATTERNS = 128


class WhereEvaluator(Protocol):
    """Evaluates a WHERE clause elsewhere (a query worker) within `time_limit_s`."""

    def __call__(
        self,
        query: str,
        default_graphs: list[NamedNode | DefaultGraph] | None,
        named_graphs: list[NamedNode] | None,
        limit: int | None,
        /,
        *,
        time_limit_s: float | None = None,
    ) -> Solutions: ...


def check_size(quads: int, limit: int | None) -> None:
    """UpdateFailed when a delta of `quads` (weighed where they were copied out of the store or
    made from a template: broker.core.held.quad_weight) is larger than `limit` (None: no limit)."""
    if limit is not None and quads > limit:
        raise UpdateFailed(f"the update would change more than {limit} quads ({WEIGHED}; {LIMIT_SETTING})")


# template instances tried (WHERE solutions x template patterns) a network client's operation may
# have at most: max_update_quads, each try counted as a quad made (see UpdateProcessor._modify)
TEMPLATE_CHECK = 4096  # solutions between two looks at the time limit while templates are made


def check_tries(solutions: int, patterns: int, limit: int | None) -> None:
    """UpdateFailed when `patterns` template patterns tried on each of `solutions` WHERE solutions
    are more tries than `limit` (None: no limit)."""
    if limit is not None and solutions * patterns > limit:
        raise UpdateFailed(
            f"the update's templates would be tried more than {limit} times ({solutions} WHERE solutions x "
            f"{patterns} template patterns; {LIMIT_SETTING})"
        )


class UpdateProcessor:
    """Computes and applies exact update deltas."""

    def __init__(self, store: RdfStore, *, allow_load: bool = False, service_allow: Sequence[str] = ()) -> None:
        self.store = store
        self.allow_load = allow_load
        self.service_allow = tuple(service_allow)
        # evaluates the WHERE clauses that are not a plain BGP elsewhere (a query worker, where a
        # time limit can stop them: broker.workers); None evaluates them here
        self.where_evaluator: WhereEvaluator | None = None
        self.time_limit_s: float | None = None  # of a request that is not trusted, all operations together
        self.trusted = False  # set by Engine.update for each request
        self.max_quads: int | None = None  # of a request that is not trusted (see MAX_UPDATE_QUADS)
        self._writable: frozenset[NamedNode | DefaultGraph] | None = None  # of the request being computed
        # quads the last DATA block or templates named, whether or not the store held them: what
        # the size limit counts. Counted on the effect, it told a client that may write a graph
        # but not read it whether a quad was there (`CLEAR GRAPH <own 100,000> ; INSERT DATA
        # { GRAPH <write-only> { guess } } ; ...`: 400 over the limit if absent, else not). None:
        # the operation's effect is what it names (a graph operation on graphs the client may read)
        self._instantiated: int | None = None
        self._deadline: float | None = None  # of the request being computed (see _time_left)
        self._where_steps: Budget | None = None  # WHERE_STEPS of the request being computed

    def compute(
        self,
        sparql: Request,
        *,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
        base_iri: str | None = None,
        prefixes: dict[str, str] | None = None,
        budget: Budget | None = None,
        readable: frozenset[NamedNode | DefaultGraph] | None = None,
        writable: frozenset[NamedNode | DefaultGraph] | None = None,
    ) -> Delta:
        """The net delta of `sparql`; the store is unchanged when this returns or raises.

        `writable`: the only graphs the request may write to (None: all). A write to another one
        raises Forbidden as soon as it is seen, whether or not it would change anything and before
        anything tells what the store holds (a quad, or a graph, that is there or not): checked on
        the net delta alone, DELETE DATA of a quad a secret graph did not hold was 200 and of one
        it held 403, and CREATE GRAPH of an existing graph was 400, an oracle for any graph.
        ``GraphAccess.check_writes`` checks the delta as well.

        `readable`: the only graphs the request's WHERE clauses and ADD/COPY/MOVE sources may read
        (None: all); see :mod:`broker.core.access`.

        With a `budget`, only a single INSERT/DELETE DATA or a DELETE/INSERT with a plain BGP is
        computed, its lookups charged to the budget; anything else raises OverBudget.
        """
        # the time limit starts before the request is parsed: parsing is not stopped, but what it
        # took is not given again to the WHERE clauses and templates
        if not self.trusted and self.time_limit_s is not None:
            self._deadline = time.monotonic() + self.time_limit_s
            self._where_steps = Budget(WHERE_STEPS)
        try:
            operations, protocol_using, protocol_named = self.check(
                sparql,
                using_graph_uri=using_graph_uri,
                using_named_graph_uri=using_named_graph_uri,
                base_iri=base_iri,
                prefixes=prefixes,
                quad_limit=self._limit,
            )
            if budget is not None and (len(operations) != 1 or not isinstance(operations[0], DataOp | ModifyOp)):
                raise OverBudget
            self._writable = writable
            return self._compute(operations, sparql, protocol_using, protocol_named, budget, readable)
        finally:
            self._writable = None
            self._deadline = None
            self._where_steps = None

    def _time_left(self) -> float | None:
        """Seconds the request being computed has left (None: no limit); TimeLimitExceeded at 0.

        Why one limit for the whole request: each operation's WHERE had `time_limit_s` of its own,
        and nothing bounded their sum; one request of 20 operations of 0.56 s each held every other
        client's updates for 7.9 s with a 2 s limit (a 1 MiB request holds hundreds)."""
        if self._deadline is None:
            return None
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeLimitExceeded(
                f"the update ran past its limit of {self.time_limit_s:g} s ([engine] time_limit_s), "
                "all its operations together; nothing was changed"
            )
        return left

    def _compute(
        self,
        operations: list,
        sparql: Request,
        protocol_using: list[NamedNode],
        protocol_named: list[NamedNode],
        budget: Budget | None,
        readable: frozenset[NamedNode | DefaultGraph] | None,
    ) -> Delta:
        if readable is not None:
            _check_dataset_readable(operations, [*protocol_using, *protocol_named], readable)
        if len(operations) == 1:
            operation = operations[0]
            if isinstance(sparql, Update) and sparql.digest is not None and isinstance(operation, ModifyOp):
                added, removed, intact = self._modify(
                    operation, sparql, protocol_using, protocol_named, budget, sparql.digest.graph, readable
                )
                check_size(len(added) + len(removed), self._limit)
                return Delta(frozenset(added), frozenset(removed), digest=sparql.digest if intact else None)
            added, removed, created, dropped = self._operation(
                operation, sparql, protocol_using, protocol_named, budget, readable
            )
            check_size(len(added) + len(removed), self._limit)
            return Delta(frozenset(added), frozenset(removed), frozenset(created), frozenset(dropped))
        return self._sequence(operations, sparql, protocol_using, protocol_named, readable)

    def check(
        self,
        sparql: Request,
        *,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
        base_iri: str | None = None,
        prefixes: dict[str, str] | None = None,
        readable: frozenset[NamedNode | DefaultGraph] | None = None,
        writable: frozenset[NamedNode | DefaultGraph] | None = None,
        quad_limit: int | None = None,
    ) -> tuple[list, list[NamedNode], list[NamedNode]]:
        """Parse `sparql` and its protocol graphs without touching the store: raises what `compute` would
        for a malformed request (delayed updates are checked when scheduled, not when due), with
        `readable` for a WHERE dataset naming a graph the client may not read, and with `writable`
        for a graph named in the request that it may not write.

        A DATA block is read no further than `quad_limit` quads (DATA_QUAD_LIMIT): a network
        client's, and a delayed update's when it is scheduled (it runs as a network client's). A
        delayed `INSERT DATA` of a 300,000-item collection was parsed in full on the update
        thread, 2.3 s, before anything looked at its size."""
        if isinstance(sparql, Update):
            if any(isinstance(op, Modify) and "service" in op.where.lower() for op in sparql.operations):
                check_services(sparql.to_sparql(), self.service_allow, base_iri, prefixes, where="updates")
            operations = plan_update(sparql)
        else:
            check_services(sparql, self.service_allow, base_iri, prefixes, where="updates")
            data_limit = DATA_QUAD_LIMIT.set(quad_limit)
            try:
                operations = parse_update(sparql, base_iri, prefixes).operations
            finally:
                DATA_QUAD_LIMIT.reset(data_limit)
        protocol_using = graph_list(using_graph_uri, "using-graph-uri")
        protocol_named = graph_list(using_named_graph_uri, "using-named-graph-uri")
        if protocol_using or protocol_named:
            for operation in operations:
                if isinstance(operation, ModifyOp) and (
                    operation.using or operation.using_named or operation.with_graph
                ):
                    raise InvalidRequest("using-graph-uri/using-named-graph-uri cannot be combined with USING or WITH")
        if not self.allow_load and any(isinstance(operation, LoadOp) for operation in operations):
            raise InvalidRequest("LOAD is disabled on this gateway (set [engine] allow_load = true to enable it)")
        if readable is not None:
            _check_dataset_readable(operations, [*protocol_using, *protocol_named], readable)
        if writable is not None:
            _check_named_writes(operations, writable)
        return operations, protocol_using, protocol_named

    def _sequence(
        self,
        operations: list,
        sparql: Request,
        using: list[NamedNode],
        named: list[NamedNode],
        readable: frozenset[NamedNode | DefaultGraph] | None,
    ) -> Delta:
        ox = self.store.ox
        graphs_before = set(ox.named_graphs())
        net = _NetDelta()
        charged = 0
        try:
            for operation in operations:
                self._time_left()
                self._instantiated = None
                added, removed, created, dropped = self._operation(operation, sparql, using, named, None, readable)
                check_size(len(added) + len(removed), self._limit)
                # each operation is applied before the next is computed, so it is checked here, not
                # only on the net delta: else a refused request had already written for as long as
                # its later operations ran (CLEAR NAMED ; a slow WHERE emptied every graph for
                # readers for the time limit, and for good if the gateway died meanwhile)
                self._target(quad.graph_name for quads in (added, removed) for quad in quads)
                self._target([*created, *dropped])
                # the request's net growth so far with this operation (broker.headroom)
                self.store.check_growth(len(net.added) - len(net.removed) + len(added) - len(removed))
                self.store.apply(added, removed, created, dropped, sequence=PROVISIONAL)
                net.add(added, removed)
                charged += len(added) + len(removed) if self._instantiated is None else self._instantiated
                check_size(charged, self._limit)
        finally:
            graphs_after = set(ox.named_graphs())
            # undone through apply, so that the store's followers undo it too; journalled as settling
            # the operations' records, which a replay after a crash before this line undoes
            self.store.apply(
                net.removed, net.added, graphs_before - graphs_after, graphs_after - graphs_before, sequence=SETTLED
            )
        return Delta(
            frozenset(net.added),
            frozenset(net.removed),
            frozenset(graphs_after - graphs_before),
            frozenset(graphs_before - graphs_after),
        )

    def apply(self, delta: Delta, mark: ApplyMark | None = None) -> None:
        self.store.apply(delta.added, delta.removed, delta.graphs_created, delta.graphs_dropped, mark)

    # -- one operation ------------------------------------------------------------------------

    def _operation(  # type: ignore[no-untyped-def]
        self,
        operation: object,
        sparql: Request,
        using: list[NamedNode],
        named: list[NamedNode],
        budget: Budget | None = None,
        readable: frozenset[NamedNode | DefaultGraph] | None = None,
    ):
        """(added, removed, graphs created, graphs dropped) of one operation on the current store."""
        if isinstance(operation, DataOp):
            return self._data(operation) + (set(), set())
        if isinstance(operation, ModifyOp):
            return self._modify(operation, sparql, using, named, budget, None, readable)[:2] + (set(), set())
        if isinstance(operation, GraphOp):
            if readable is not None and operation.verb in ("ADD", "COPY", "MOVE"):
                source = DEFAULT_GRAPH if operation.source == "DEFAULT" else operation.source
                if source not in readable:
                    raise Forbidden(f"this client may not read the graph {source}")
            target = DEFAULT_GRAPH if operation.target == "DEFAULT" else operation.target
            if readable is not None and target not in readable and isinstance(target, NamedNode | DefaultGraph):
                if operation.verb != "CREATE" and operation.verb != "ADD":
                    # what CLEAR, DROP, COPY and MOVE remove is what the graph holds: counted against
                    # the size limit, its size could be learned by a client that may write the graph
                    # but not read it (`INSERT DATA {own, N quads} ; CLEAR GRAPH <write-only>`, N
                    # stepped until a 400). Refused before anything is read
                    raise Forbidden(f"{operation.verb} empties the graph {target}: it needs the right to read it")
                # as SILENT: "already exists" told a client that may write a graph but not read it
                # whether the graph held anything (CREATE changes nothing: a free probe)
                operation = dataclasses.replace(operation, silent=True)
            return self._graph_op(operation)
        if isinstance(operation, LoadOp):
            return self._load(operation) + (set(), set())
        raise TypeError(operation)

    @property
    def _limit(self) -> int | None:
        """The quads (and WHERE solutions) the request being computed may have at most."""
        return None if self.trusted else self.max_quads

    def _target(self, graphs: Iterable[NamedNode | DefaultGraph]) -> None:
        """Refuse a write to a graph outside `writable` (see :meth:`compute`)."""
        writable = self._writable
        if writable is None:
            return
        for graph in graphs:
            if graph not in writable:
                shown = "DEFAULT" if isinstance(graph, DefaultGraph) else str(graph)
                raise Forbidden(f"this client may not write to the graph {shown}")

    def _data(self, operation: DataOp) -> tuple[set[Quad], set[Quad]]:
        ox = self.store.ox
        self._target(quad.graph_name for quad in operation.quads)
        self._instantiated = len(operation.quads)
        check_size(self._instantiated, self._limit)  # before the store is asked (see _instantiated)
        if operation.insert:
            return {quad for quad in fresh_blank_nodes(operation.quads) if quad not in ox}, set()
        return set(), {quad for quad in operation.quads if quad in ox}

    def _solutions(  # type: ignore[no-untyped-def]
        self,
        operation: ModifyOp,
        sparql: Request,
        using: list[NamedNode],
        named: list[NamedNode],
        budget: Budget | None = None,
        capture: bool = False,
        readable: frozenset[NamedNode | DefaultGraph] | None = None,
        quads_only: bool = False,
    ):
        """The WHERE solutions; with `capture`, BGP solutions also hold their matched quads, and with
        `quads_only` maybe nothing else (see evaluate_bgp), or even the quads alone (:class:`Matched`).

        With `readable`, the WHERE dataset keeps only readable graphs (an unreadable one is empty)."""
        if operation.using or operation.using_named:
            default_graphs, named_graphs = list(operation.using), list(operation.using_named)
        elif using or named:
            default_graphs, named_graphs = using, named
        else:
            default_graphs = [operation.with_graph] if operation.with_graph is not None else None
            named_graphs = None
        if readable is not None:
            default_graphs = [g for g in (default_graphs or [DEFAULT_GRAPH]) if g in readable]
            named_graphs = [g for g in (readable if named_graphs is None else named_graphs) if g in readable]
            named_graphs = [g for g in named_graphs if isinstance(g, NamedNode)]
        planned = operation.where_bgp is not None and (default_graphs is None or len(default_graphs) == 1)
        if planned and not self.trusted and (budget is not None or self.where_evaluator is not None):
            # a network client's long BGP is not planned here (see MAX_PLANNED_PATTERNS)
            planned = len(operation.where_bgp) + sum(map(len, operation.where_optionals)) <= MAX_PLANNED_PATTERNS  # type: ignore[arg-type]
        if planned:
            dataset = Dataset(
                default_graphs[0] if default_graphs else None, None if named_graphs is None else frozenset(named_graphs)
            )
            limited = budget is None and not self.trusted and self.where_evaluator is not None
            ox = (
                self.store.ox
                if budget is None and not limited
                else BudgetedStore(self.store.ox, budget or self._where_steps or Budget(WHERE_STEPS))
            )
            try:
                if operation.where_values is None:
                    solutions = evaluate_bgp(
                        ox,  # type: ignore[arg-type]
                        operation.where_bgp,
                        operation.where_pins,  # type: ignore[arg-type]
                        dataset,
                        operation.where_skeleton,
                        capture=capture,
                        quads_only=quads_only,
                    )
                else:  # the join with VALUES: the BGP from each value in turn
                    name, values = operation.where_values
                    pins = dict(operation.where_pins)
                    if quads_only and len(operation.where_bgp) == 1:  # type: ignore[arg-type]
                        quads = values_quads(ox, operation.where_bgp[0], pins, name, values, dataset)  # type: ignore[arg-type, index]
                        if quads is not None:
                            return Matched(quads)
                    solutions = [
                        solution
                        for value in values
                        if pins.get(name, value) == value
                        for solution in evaluate_bgp(
                            ox,  # type: ignore[arg-type]
                            operation.where_bgp,
                            {**pins, name: value},
                            dataset,
                            operation.where_skeleton,
                            capture=capture,
                            quads_only=quads_only,
                        )
                    ]
                for block in operation.where_optionals:  # left joins, in order
                    solutions = [
                        extended
                        for solution in solutions
                        for extended in (evaluate_bgp(ox, block, solution, dataset) or [solution])  # type: ignore[arg-type]
                    ]
                return solutions
            except OverBudget:
                if not limited:
                    raise
                # a network client's BGP past WHERE_STEPS (a cartesian product never ends): its
                # evaluation goes on in a query worker, under the time limit
        if budget is not None:  # a SPARQL evaluation cannot be bounded
            raise OverBudget
        # a trusted update (the gateway's own code: Update syntax trees, the in-process transport)
        # runs its WHERE here: a round trip to a worker, with the catch-up of every delta since the
        # last one, per observation batch cost bench mqtt a third of its readings per second
        evaluate = None if self.trusted else self.where_evaluator
        try:
            if evaluate is not None:
                left = self._time_left()
                return evaluate(operation.where_query, default_graphs, named_graphs, self._limit, time_limit_s=left)
            return where_solutions(self.store, operation.where_query, default_graphs, named_graphs, self._limit)
        except SyntaxError as error:
            text = sparql if isinstance(sparql, str) else sparql.to_sparql()
            raise located_error(text, str(error), None) from None

    def _modify(
        self,
        operation: ModifyOp,
        sparql: Request,
        using: list[NamedNode],
        named: list[NamedNode],
        budget: Budget | None = None,
        watched: NamedNode | None = None,
        readable: frozenset[NamedNode | DefaultGraph] | None = None,
    ) -> tuple[set[Quad], set[Quad], bool]:
        """(added, removed, whether every quad inserted into the `watched` graph is new)."""
        ox = self.store.ox
        template_graph = operation.with_graph if operation.with_graph is not None else DEFAULT_GRAPH
        to_delete: set[Quad] = set()
        in_store: set[Quad] = set()  # quads the WHERE clause matched: in the store, no need to ask
        to_insert: set[Quad] = set()
        matched = _matched_deletes(operation, using, named)
        # every solution is only read for the quads its DELETE template matched: no terms wanted
        quads_only = (
            matched is not None and None not in matched and not operation.insert and not operation.where_optionals
        )
        solutions = self._solutions(
            operation, sparql, using, named, budget, capture=bool(matched), readable=readable, quads_only=quads_only
        )
        if solutions:  # ground template quads are the same for every solution: added once, in bulk
            to_delete.update(_in_graph(operation.delete_ground, operation.with_graph))
            to_insert.update(_in_graph(operation.insert_ground, operation.with_graph))
        limit = self._limit
        # every template pattern is tried on every solution, and a try that makes nothing (a
        # variable the WHERE never binds) or a quad already made is not counted below: 1,936
        # solutions (within the limit) x 20,000 such patterns held the update thread, and every
        # other client's updates, for 10.5 s with a 3 s time limit (/tmp/atk-j/tmpl_amp2.py). So
        # a network client's tries are bounded as its quads are, before any is made, and the time
        # limit is looked at every TEMPLATE_CHECK solutions
        if limit is not None:
            check_tries(len(solutions), len(operation.delete) + len(operation.insert), limit)
        if isinstance(solutions, Matched):  # each quad is the one every DELETE pattern removes
            in_store.update(solutions.quads)
            if limit is not None:
                check_size(len(to_delete) + len(in_store) + len(to_insert), limit)
            solutions = ()
        # what the quads a template made weigh beyond one each (a network client's request): each
        # is a copy of its terms, and one 150-character INSERT WHERE that copied a 900,000-character
        # literal into 500 quads took the gateway from 193 to 1,058 MB (/tmp/atk2/m4_where.py)
        weight = 0
        for number, solution in enumerate(solutions, 1):
            if not number % TEMPLATE_CHECK:
                self._time_left()
            for index, pattern in enumerate(operation.delete):
                where_index = matched[index] if matched else None
                if where_index is not None and where_index in solution:
                    in_store.add(solution[where_index])  # type: ignore[arg-type]
                    continue
                quad = _instantiate(pattern, solution, template_graph, None)
                if quad is not None:
                    to_delete.add(quad)
                    if limit is not None:
                        weight += quad_weight(quad)
            fresh: dict = {}
            for pattern in operation.insert:
                quad = _instantiate(pattern, solution, template_graph, fresh)
                if quad is not None:
                    to_insert.add(quad)
                    if limit is not None:
                        weight += quad_weight(quad)
            if limit is not None:  # before the templates make more
                check_size(len(to_delete) + len(in_store) + len(to_insert) + weight, limit)
        self._instantiated = len(to_delete) + len(in_store) + len(to_insert)
        self._target(quad.graph_name for quads in (to_delete, to_insert) for quad in quads)
        removed = {quad for quad in to_delete if quad in ox}
        removed |= in_store
        # the quads the store holds already are few, and a set difference hashes none of them again:
        # a set of the new ones hashed each of them a second time (a pyoxigraph Quad keeps no hash:
        # 0.4-0.5 us a quad, pyoxigraph 0.5.13, measured 2026-12-07 beside 0.10-0.15 us for the
        # difference; an observation batch inserts ~20 quads a reading)
        stored = {quad for quad in to_insert if quad in ox}
        added = to_insert - stored if stored else to_insert
        intact = watched is None or all(quad.graph_name != watched for quad in stored)
        return added, removed - to_insert, intact

    # -- graph management ---------------------------------------------------------------------

    def _graph_quads(self, graph: NamedNode | DefaultGraph, taken: int = 0) -> set[Quad]:
        """The quads of `graph`; UpdateFailed, read no further, once they and the `taken` quads
        already read are more than the request may change (so COPY, MOVE and ADD are bounded by
        the quads of both graphs, even where their delta is smaller).

        Why read no further: a graph operation's delta is the whole graph; computed first and
        refused after, `ADD <g> TO DEFAULT` over a 1,000,000-quad graph held the update thread,
        and so every client, for 13.5 s, `COPY` 9.9 s, `DROP` 3.8 s (`/tmp/graphop.py` pattern)."""
        quads = self.store.ox.quads_for_pattern(None, None, None, graph)
        limit = self._limit
        if limit is None:
            return set(quads)
        read = set()
        weight = taken  # each quad read is a copy of its terms: weighed (broker.core.held.quad_weight)
        for quad in quads:
            read.add(quad)
            weight += 1 + quad_weight(quad)
            check_size(weight, limit)
        return read

    def _graphs(self, ref: object) -> list[NamedNode | DefaultGraph]:
        if ref == "DEFAULT":
            return [DEFAULT_GRAPH]
        if ref == "NAMED":
            return list(self.store.ox.named_graphs())
        if ref == "ALL":
            return [DEFAULT_GRAPH, *self.store.ox.named_graphs()]
        return [ref]  # type: ignore[list-item]

    def _graph_op(self, operation: GraphOp):  # type: ignore[no-untyped-def]
        store = self.store
        verb = operation.verb
        named = [
            DEFAULT_GRAPH if graph == "DEFAULT" else graph
            for graph in (operation.target, operation.source if verb == "MOVE" else None)
            if isinstance(graph, NamedNode) or graph == "DEFAULT"
        ]
        self._target(named)
        if self._writable is not None and operation.target in ("NAMED", "ALL"):
            # every graph there is, whatever it holds: refused without looking, so that the answer
            # does not depend on what graphs the client may not read exist or hold
            raise Forbidden(f"{verb} {operation.target} needs the right to write every graph")
        if verb == "CREATE":
            if store.graph_exists(operation.target):  # type: ignore[arg-type]
                if operation.silent:
                    return set(), set(), set(), set()
                raise UpdateFailed(f"the graph {operation.target} already exists")
            return set(), set(), {operation.target}, set()
        if verb in ("CLEAR", "DROP"):
            target = operation.target
            if isinstance(target, NamedNode) and not store.graph_exists(target):
                if operation.silent:
                    return set(), set(), set(), set()
                raise UpdateFailed(f"the graph {target} does not exist")
            removed: set[Quad] = set()
            dropped: set[NamedNode] = set()
            for graph in self._graphs(target):
                removed |= self._graph_quads(graph, len(removed))
                if verb == "DROP" and isinstance(graph, NamedNode | BlankNode):
                    dropped.add(graph)  # type: ignore[arg-type]
            return set(), removed, set(), dropped
        source = DEFAULT_GRAPH if operation.source == "DEFAULT" else operation.source
        target = DEFAULT_GRAPH if operation.target == "DEFAULT" else operation.target
        if source == target:
            return set(), set(), set(), set()
        if verb == "MOVE" and not store.graph_exists(source) and not operation.silent:  # type: ignore[arg-type]
            raise UpdateFailed(f"the graph {source} does not exist")
        source_quads = self._graph_quads(source)  # type: ignore[arg-type]
        moved = {Quad(q.subject, q.predicate, q.object, target) for q in source_quads}  # type: ignore[arg-type]
        removed = set()
        dropped = set()
        if verb in ("COPY", "MOVE"):  # the target is dropped first, as Oxigraph does
            removed = self._graph_quads(target, len(source_quads)) - moved  # type: ignore[arg-type]
            if not moved and isinstance(target, NamedNode) and store.graph_exists(target):
                dropped.add(target)
        added = {quad for quad in moved if quad not in store.ox}
        # ADD is charged what it copies, not what it adds: how many of them the target held already
        # tells a client that may write the target but not read it what the target holds
        if verb == "ADD":
            self._instantiated = len(moved)
        if verb == "MOVE":
            removed |= source_quads
            if isinstance(source, NamedNode) and store.graph_exists(source):
                dropped.add(source)
        return added, removed, set(), dropped

    # -- LOAD ---------------------------------------------------------------------------------

    def _load(self, operation: LoadOp) -> tuple[set[Quad], set[Quad]]:
        """Fetch and parse the document (`check` refused LOAD already unless the operator allowed it)."""
        self._target([operation.into if operation.into is not None else DEFAULT_GRAPH])  # before the fetch
        try:
            with urllib.request.urlopen(operation.source.value, timeout=30) as response:  # noqa: S310 - operator opt-in
                data = response.read(LOAD_LIMIT_BYTES + 1)
                media_type = response.headers.get_content_type() if hasattr(response, "headers") else None
            if len(data) > LOAD_LIMIT_BYTES:
                raise ValueError("document too large")
            rdf_format = (RdfFormat.from_media_type(media_type) if media_type else None) or RdfFormat.from_extension(
                operation.source.value.rsplit(".", 1)[-1]
            )
            if rdf_format is None:
                raise ValueError("unknown RDF format")
            graph = operation.into if operation.into is not None else DEFAULT_GRAPH
            quads = [
                Quad(q.subject, q.predicate, canonical(q.object), graph)
                for q in parse(data, format=rdf_format, base_iri=operation.source.value, without_named_graphs=True)
            ]
        except Exception as error:  # noqa: BLE001 - any fetch/parse failure is the same user error
            if operation.silent:
                return set(), set()
            raise UpdateFailed(f"LOAD {operation.source.value} failed: {error}") from error
        return {quad for quad in fresh_blank_nodes(tuple(quads)) if quad not in self.store.ox}, set()
