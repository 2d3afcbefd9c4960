"""Subscription processing units (SPUs).

Two kinds, both exact (PROTOCOL.md "Notification semantics"):

* :class:`IncrementalSpu` belongs to a :class:`ShapeGroup` (subscriptions that differ only in
  parameter constants). The group derives the solutions that gained or lost a changed quad
  (removed ones on the store before the update, added ones after) by binding the quad into the
  matching pattern, and routes them to its SPUs by parameter values. Each SPU keeps, per
  projected row, how many solutions produce it, so multisets, DISTINCT and ASK are exact.
* :class:`ReevalSpu` re-runs its query when the LUTT says a changed quad may concern it, and
  diffs the multiset of rows. It serves every other query and the naive (reference) mode.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from pyoxigraph import DefaultGraph, NamedNode, Quad, QueryBoolean, Variable

from broker.core.bgp import Dataset, evaluate_bgp, pattern_skeleton
from broker.core.budget import Budget, BudgetedStore
from broker.core.held import row_weight, text_weight
from broker.core.notification import LazyRows, QuadRows, TsvRows
from broker.core.subscription import Subscription
from broker.errors import SepaError
from broker.sparql.patterns import QuadPattern, Var
from broker.sparql.query_shape import Shape
from broker.sparql.syntax import Digest
from broker.sparql.terms import Row
from broker.store import RdfStore
from broker.workers.codec import rows_from_tsv, tsv_variables

log = logging.getLogger(__name__)

Mu = tuple[object, ...]  # one solution: values in Branch.variables order
# finds one hit's solutions as ShapeGroup.hit_solutions does (group, store, ref, quad, params, limit)
Lookup = Callable[
    ["ShapeGroup", RdfStore, tuple[int, int], Quad, "tuple[object, ...] | None", "int | None"], "list[Mu] | None"
]


class SpuBase:
    """What both kinds share: subscribers and sending a notification to each."""

    is_ask: bool
    variables: tuple[str, ...]

    def __init__(self) -> None:
        self.subscribers: list[Subscription] = []

    def current_rows(self) -> Sequence[Row]:
        raise NotImplementedError

    def current_boolean(self) -> bool | None:
        raise NotImplementedError

    def rows_held(self) -> int:
        """The rows it holds in memory (what broker.core.held counts)."""
        return 0

    def notify(self, added: Sequence[Row], removed: Sequence[Row], boolean: bool | None, previous: bool | None) -> int:
        """Send one notification to every subscriber; returns how many were sent."""
        if boolean is not None:
            if boolean == previous:
                return 0
        elif not added and not removed:
            return 0
        added_rows = added if isinstance(added, tuple | LazyRows) else tuple(added)
        removed_rows = removed if isinstance(removed, tuple | LazyRows) else tuple(removed)
        for subscriber in list(self.subscribers):
            try:
                subscriber.emit(added_rows, removed_rows, boolean, previous)
            except Exception:  # a failing callback must not stop the others
                log.exception("notification callback failed", extra={"spuid": subscriber.spuid})
        return len(self.subscribers)


class TooManyRows(Exception):
    """An SPU would hold more rows than its bound; nothing was notified (SpuManager.max_rows)."""


# -- incremental ------------------------------------------------------------------------------


class IncrementalSpu(SpuBase):
    """One parameter assignment of a shape group: the solution counts of one subscription query."""

    def __init__(self, group: ShapeGroup, params: tuple[tuple[object, ...], ...]) -> None:
        super().__init__()
        self.group = group
        self.params = params
        self.is_ask = group.shape.kind == "ask"
        self.variables = group.variables
        self.counts: Counter[Row] = Counter()
        self.total = 0
        # a bounded group's rows of ROW_CHARS characters or more, and what they count beyond one
        # (broker.core.held.row_weight): rows_held() counts them, so that a row's size is bounded too
        self.heavy: dict[Row, int] = {}
        self.extra = 0

    def _weigh(self, row: Row) -> None:
        weight = row_weight(row)
        if weight:
            self.heavy[row] = weight
            self.extra += weight

    def load(self, store: RdfStore, limit: int | None = None) -> None:
        """Initial evaluation (sequence 0); with `limit`, :class:`TooManyRows` past it, the
        evaluation stopped there (a network client's subscription, see SpuManager._incremental).
        A bounded group's rows are weighed (:meth:`rows_held`), and count against `limit` so."""
        counts = self.counts
        weigh = self.group.bounded
        for index, branch in enumerate(self.group.shape.branches):
            binding = dict(zip(branch.param_vars, self.params[index], strict=True))
            bound = None if limit is None else limit + 1 - self.total
            for mu in self.group.solutions(store, index, binding, limit=bound):
                row = self.group.project(index, mu)
                if weigh and row not in counts:
                    self._weigh(row)
                    if limit is not None and self.extra and len(counts) + 1 + self.extra > limit:
                        raise TooManyRows
                counts[row] += 1
                self.total += 1
            if limit is not None and self.total > limit:
                raise TooManyRows

    def reload(self, store: RdfStore) -> int:
        """Evaluate again from scratch and notify the difference (parallel mode, after a BOOSTER
        worker was lost with solutions of updates in flight)."""
        before = self.counts
        was = self.total > 0
        self.counts, self.total = Counter(), 0
        self.heavy, self.extra = {}, 0
        self.load(store)
        if self.is_ask:
            return self.notify((), (), self.total > 0, was)
        if self.group.shape.distinct:
            old, new = {row for row, count in before.items() if count > 0}, set(self.counts)
            return self.notify(list(new - old), list(old - new), None, None)
        return self.notify(list((self.counts - before).elements()), list((before - self.counts).elements()), None, None)

    def current_rows(self) -> tuple[Row, ...]:
        if self.group.shape.distinct:
            return tuple(row for row, count in self.counts.items() if count > 0)
        return tuple(self.counts.elements())

    def current_boolean(self) -> bool | None:
        return self.total > 0 if self.is_ask else None

    def rows_held(self) -> int:
        """Its rows, weighed (broker.core.held.row_weight) when its group is bounded."""
        return len(self.counts) + self.extra

    def apply(self, removed: dict[int, set[Mu]], added: dict[int, set[Mu]], limit: int | None = None) -> int:
        """Fold the solutions lost and gained into the counts and notify the difference.

        Raises :class:`TooManyRows`, before notifying, when it then holds more than `limit` rows,
        weighed as :meth:`rows_held` (its subscriptions are ended: see SpuManager.max_rows)."""
        group = self.group
        lost: Counter[Row] = Counter()
        gained: Counter[Row] = Counter()
        for index, mus in removed.items():
            for mu in mus:
                lost[group.project(index, mu)] += 1
        for index, mus in added.items():
            for mu in mus:
                gained[group.project(index, mu)] += 1
        counts = self.counts
        if self.is_ask:
            previous = self.total > 0
            self.total += sum(gained.values()) - sum(lost.values())
            return self.notify((), (), self.total > 0, previous)
        if group.bounded:
            for row in gained:
                if row not in counts:
                    self._weigh(row)
        if group.shape.distinct:
            touched = set(lost) | set(gained)
            before = {row: counts[row] > 0 for row in touched}
            counts.update(gained)
            counts.subtract(lost)
            added_rows = [row for row in touched if counts[row] > 0 and not before[row]]
            removed_rows = [row for row in touched if counts[row] <= 0 and before[row]]
        else:
            counts.update(gained)
            counts.subtract(lost)
            common = lost & gained
            added_rows = list((gained - common).elements())
            removed_rows = list((lost - common).elements())
        heavy = self.heavy
        for row in lost:
            if counts[row] <= 0:
                del counts[row]
                if heavy and row in heavy:
                    self.extra -= heavy.pop(row)
        if limit is not None and len(counts) + self.extra > limit:
            raise TooManyRows
        return self.notify(added_rows, removed_rows, None, None)


class ShapeGroup:
    """All SPUs of one query shape over one dataset, and how to evaluate the shape."""

    def __init__(
        self,
        key: tuple[object, ...],
        shape: Shape,
        variables: tuple[str, ...],
        default_graphs: tuple[NamedNode, ...],
        named_graphs: tuple[NamedNode, ...] | None,
    ) -> None:
        self.key = key
        self.arguments = (key, shape, variables, default_graphs, named_graphs)  # to make it again elsewhere
        # no subscription of this process ever joined it: its SPUs' results are bounded (network
        # clients' only; SpuManager.max_rows), which ends subscriptions the gateway's own code holds
        self.bounded = True
        self.gid = 0  # its number in the BOOSTER workers (parallel mode)
        self.shape = shape
        self.variables = variables
        self.spus: dict[tuple[tuple[object, ...], ...], IncrementalSpu] = {}
        self.routes: list[dict[tuple[object, ...], set[IncrementalSpu]]] = [{} for _ in shape.branches]
        self.dataset = Dataset(
            default_graphs[0] if default_graphs else None, frozenset(named_graphs) if named_graphs is not None else None
        )
        self.query_arguments: dict[str, object] = {}
        if default_graphs:
            self.query_arguments["default_graph"] = list(default_graphs)
        if named_graphs is not None:
            self.query_arguments["named_graphs"] = list(named_graphs)
        self.branch_queries = [
            branch.query_text(shape.prologue) if branch.filters else None for branch in shape.branches
        ]
        # (branch, pattern left out) -> the patterns joined and their skeleton, made once
        self._joins: dict[tuple[int, int], tuple[tuple[QuadPattern, ...], tuple[tuple[str | None, ...], ...]]] = {}
        self.projections = [
            tuple(branch.variables.index(name) if name in branch.variables else -1 for name in variables)
            for branch in shape.branches
        ]

    def graphs_read(self) -> frozenset[object] | None:
        """The graphs this shape's patterns can read (the default graph as DefaultGraph()), or None
        when a GRAPH ?g pattern ranges over every named graph."""
        found: set[object] = set()
        for branch in self.shape.branches:
            for pattern in branch.patterns:
                graph = pattern.graph
                if isinstance(graph, DefaultGraph):
                    found.add(self.dataset.default)
                elif isinstance(graph, Var):
                    if self.dataset.named is None:
                        return None
                    found.update(self.dataset.named)
                else:
                    found.add(graph)
        return frozenset(found)

    def project(self, branch: int, mu: Mu) -> Row:
        return tuple(mu[index] if index >= 0 else None for index in self.projections[branch])  # type: ignore[misc]

    def solutions(
        self,
        store: RdfStore,
        branch_index: int,
        binding: dict[str, object],
        skip: int = -1,
        *,
        limit: int | None = None,
        budget: Budget | None = None,
    ) -> Iterator[Mu]:
        """Solutions of one branch extending `binding`, as tuples in Branch.variables order.

        `skip`: index of a pattern already known to match under `binding` (the changed quad
        bound into it), left out of a plain BGP join. `limit`: at most that many (a plain BGP is
        not evaluated past them). `budget`: its index entries read are charged to it
        (:class:`~broker.core.budget.OverBudget` past it); a branch with FILTERs, which pyoxigraph
        evaluates without a bound, first has its patterns joined here under the budget, to learn
        that its evaluation is bounded (broker.core.lookups).
        """
        branch = self.shape.branches[branch_index]
        names = branch.variables
        query = self.branch_queries[branch_index]
        joined = self._joins.get((branch_index, skip))
        if joined is None:
            patterns = branch.patterns if skip < 0 else branch.patterns[:skip] + branch.patterns[skip + 1 :]
            joined = self._joins[branch_index, skip] = (patterns, pattern_skeleton(patterns))
        ox = store.ox if budget is None else BudgetedStore(store.ox, budget)
        if query is None:
            for solution in evaluate_bgp(ox, joined[0], binding, self.dataset, joined[1], limit=limit):  # type: ignore[arg-type]
                yield tuple(map(solution.get, names))
            return
        if budget is not None:
            evaluate_bgp(ox, joined[0], binding, self.dataset, joined[1])  # type: ignore[arg-type]
        substitutions = {Variable(name): value for name, value in binding.items()}
        result = store.query(query, substitutions=substitutions, **self.query_arguments)  # type: ignore[arg-type]
        order = [variable.value for variable in result.variables]
        indexes = [order.index(name) if name in order else -1 for name in names]
        for solution in islice(result, limit):
            yield tuple(solution[index] if index >= 0 else None for index in indexes)

    def match(self, pattern: QuadPattern, quad: Quad) -> dict[str, object] | None:
        """The binding that makes `pattern` equal to `quad`, or None if it cannot."""
        binding: dict[str, object] = {}
        values = (quad.subject, quad.predicate, quad.object, quad.graph_name)
        for index, position in enumerate(pattern.positions()):
            value = values[index]
            if isinstance(position, Var):
                if index == 3 and isinstance(value, DefaultGraph):
                    return None
                if binding.setdefault(position.name, value) != value:
                    return None
            elif isinstance(position, DefaultGraph) and index == 3:
                if value != self.dataset.default:
                    return None
            elif position != value:
                return None
        graph = binding.get(pattern.graph.name) if isinstance(pattern.graph, Var) else None
        if graph is not None and self.dataset.named is not None and graph not in self.dataset.named:
            return None
        return binding

    def hit_solutions(
        self,
        store: RdfStore,
        ref: tuple[int, int],
        quad: Quad,
        params: tuple[object, ...] | None,
        limit: int | None = None,
        budget: Budget | None = None,
    ) -> list[Mu] | None:
        """Solutions of branch ref[0] that use `quad` at pattern ref[1], or None if the quad cannot
        be there; with `params` (one SPU's parameter values for the branch), only that SPU's; with
        `limit`, at most one more than `limit` of them; with `budget`, see :meth:`solutions`.

        The unit of BOOSTER work: independent per quad, so parallel mode runs it in worker
        processes (:mod:`broker.workers.booster`) and routes the solutions here."""
        branch_index, pattern_index = ref
        branch = self.shape.branches[branch_index]
        binding = self.match(branch.patterns[pattern_index], quad)
        if binding is None:
            return None
        if params is not None and any(
            binding.setdefault(name, value) != value for name, value in zip(branch.param_vars, params, strict=True)
        ):
            return None
        bound = None if limit is None else limit + 1
        return list(self.solutions(store, branch_index, binding, pattern_index, limit=bound, budget=budget))

    def route(
        self,
        branch_index: int,
        spu: IncrementalSpu | None,
        mus: Iterable[Mu],
        out: dict[IncrementalSpu, dict[int, set[Mu]]],
        skip: Collection[IncrementalSpu] = (),
    ) -> None:
        """File `mus` (solutions of one branch) under `spu`, or under every SPU whose parameters
        they carry; none under the SPUs in `skip`."""
        if spu is not None:
            if spu not in skip:
                out.setdefault(spu, {}).setdefault(branch_index, set()).update(mus)
            return
        branch = self.shape.branches[branch_index]
        positions = [branch.variables.index(name) for name in branch.param_vars]
        routes = self.routes[branch_index]
        for mu in mus:
            for each in routes.get(tuple(mu[index] for index in positions), ()):
                if not skip or each not in skip:
                    out.setdefault(each, {}).setdefault(branch_index, set()).add(mu)

    def collect(
        self,
        store: RdfStore,
        ref: tuple[int, int],
        hits: list[tuple[Quad, set[object] | None]],
        out: dict[IncrementalSpu, dict[int, set[Mu]]],
        limit: int | None = None,
        over: set[IncrementalSpu] | None = None,
        lookup: Lookup | None = None,
        failed: dict[IncrementalSpu, SepaError] | None = None,
    ) -> None:
        """Solutions of branch ref[0] that use a hit quad at pattern ref[1], routed to their SPUs.

        With `limit` (a bounded group, the quads added by an update), an SPU that gains more than
        `limit` solutions is put in `over`, its solutions dropped, and none is collected for it any
        more; so is every SPU a single quad's solutions could go to when there are more than
        `limit` of them (they are not evaluated past it). Why: a subscription's results are bounded
        when it is made (the probe), but an update can multiply them afterwards: a product of a
        graph with itself, subscribed while the graph was empty, gained 490,000 rows from one
        700-triple update (11 s of the update thread, RSS 837 MB, a 125 MB notification).

        `lookup` (with `failed`): finds each hit's solutions instead of :meth:`hit_solutions`
        (:class:`broker.core.lookups.BoundedLookups`); a hit it gives up on with an error puts the
        SPUs its solutions could go to in `failed`, with the error, and none is collected for them."""
        branch_index = ref[0]
        failed = {} if failed is None else failed
        collected = 0
        for quad, spus in hits:
            spu = next(iter(spus)) if spus is not None and len(spus) == 1 else None
            if spu is not None and (spu in failed or (over is not None and spu in over)):
                continue
            params = None if spu is None else spu.params[branch_index]  # type: ignore[attr-defined]
            bound = limit if over is not None else None
            if lookup is None:
                mus = self.hit_solutions(store, ref, quad, params, bound)
            else:
                try:
                    mus = lookup(self, store, ref, quad, params, bound)
                except SepaError as error:
                    for each in spus if spus is not None else list(self.spus.values()):
                        failed.setdefault(each, error)  # type: ignore[arg-type]
                    continue
            if not mus:
                continue
            if bound is None or over is None:
                self.route(branch_index, spu, mus, out, failed)  # type: ignore[arg-type]
                continue
            if len(mus) > bound:
                over.update(spus if spus is not None else self.spus.values())  # type: ignore[arg-type]
                continue
            self.route(branch_index, spu, mus, out, over | failed.keys() if failed else over)  # type: ignore[arg-type]
            # weighed as the rows they make will be (IncrementalSpu.rows_held): each is a copy of
            # its terms, 500 of one 500,000-character literal were 250 MB before the fold refused them
            collected += len(mus) + sum(map(row_weight, mus))
            if collected > bound:  # each SPU's share is counted only then
                collected = 0
                self.move_over(out, bound, over)
        for each in [*(over or ()), *failed]:
            out.pop(each, None)

    def move_over(self, out: dict[IncrementalSpu, dict[int, set[Mu]]], limit: int, over: set[IncrementalSpu]) -> None:
        """This group's SPUs with more than `limit` solutions in `out`, weighed: moved to `over`."""
        for each in [each for each in out if each.group is self]:
            if sum(len(mus) + sum(map(row_weight, mus)) for mus in out[each].values()) > limit:
                over.add(each)
                del out[each]


# -- re-evaluation ----------------------------------------------------------------------------


class RowTable:
    """One copy of each distinct row for every re-evaluating SPU (of one SPU manager's thread).

    Why: SPUs over the same data hold the same rows, each evaluation making new term objects;
    1,000 OPTIONAL subscriptions of 200 rows took 65 MB, and after they ended 40 MB stayed
    (Python's small-object arenas, fragmented). With one copy a row, an SPU costs a tuple and a
    set of references: +18 MB, 7 MB left after they ended (1,000 rows each: +53 MB, 9 MB left;
    it was +288 MB, 177 MB left). Rows no SPU holds any more are dropped once as many were let go as
    the table holds (a sweep is a pass over the table, so it costs O(1) a row let go)."""

    SWEEP_MIN = 10_000

    def __init__(self) -> None:
        self.rows: dict[Row, Row] = {}
        self._let_go = 0

    def __len__(self) -> int:
        return len(self.rows)

    def shared(self, rows: Iterable[Row]) -> tuple[Row, ...]:
        keep = self.rows.setdefault
        return tuple(keep(row, row) for row in rows)

    def let_go(self, count: int) -> None:
        """`count` row references were dropped by an SPU."""
        self._let_go += count
        if self._let_go >= max(self.SWEEP_MIN, len(self.rows)):
            self.sweep()

    def sweep(self) -> None:
        # held by the table alone: key and value (one object), the loop variable, getrefcount's argument
        references = sys.getrefcount
        self.rows = {row: row for row in self.rows if references(row) > 4}
        self._let_go = 0


@dataclass(frozen=True, slots=True)
class Probed:
    """A subscription's result as its probe found it: its count of results, the result (SPARQL TSV)
    if small, and the store's :attr:`~broker.store.RdfStore.changes` it was found at (-1: the store
    changed while it ran): still the count, still the result."""

    changes: int
    text: bytes | None
    rows: int = 0
    seconds: float = 0.0  # its evaluation in the worker (not the wait for one): a re-evaluation costs as much


class ReevalSpu(SpuBase):
    """Re-runs its query and diffs the multiset of rows (exact for any SELECT or ASK)."""

    def __init__(
        self,
        key: tuple[object, ...],
        sparql: str,
        arguments: dict[str, object],
        prefixes: dict[str, str] | None,
        table: RowTable | None = None,
    ) -> None:
        super().__init__()
        self.table = table if table is not None else RowTable()
        self.key = key
        self.sparql = sparql
        self.arguments = arguments
        self.prefixes = prefixes
        # the rows as a set when they are distinct (set differences run in C), else a Counter
        self.members: set[Row] | Counter[Row] = set()
        self.rows: tuple[Row, ...] = ()
        self.boolean: bool | None = None
        self.is_ask = False
        self.variables: tuple[str, ...] = ()
        self.lutt_keys: list[object] = []
        # a network client subscribed it: re-evaluated in a query worker, under the time limit
        self.limited = False
        # the result as SPARQL TSV when it came so (a probe, a query worker): see replace_text
        self.text: bytes | None = None
        # coalescing (broker.core.spu_manager, SpuManager._defer): at most one re-evaluation per
        # `coalesce_s`, the first after a quiet interval at once; 0: at every update that concerns it
        self.coalesce_s = 0.0
        self.refreshed_at = 0.0  # time.monotonic() of its last evaluation
        self.cost_s = 0.0  # how long that evaluation took
        self.generation = 0  # evaluations taken so far (a deferred one began at an older one: dropped)

    def evaluate(self, store: RdfStore, limit: int | None = None) -> tuple[tuple[Row, ...], bool | None]:
        """The query's result now; with `limit`, :class:`TooManyRows` past it (weighed:
        broker.core.held.row_weight), the evaluation stopped there."""
        variables, rows, boolean = evaluate_rows(store, self.sparql, self.prefixes, self.arguments, limit)
        if limit is not None and len(rows) + sum(map(row_weight, rows)) > limit:
            raise TooManyRows
        self.is_ask = boolean is not None
        self.variables = variables
        return rows, boolean

    def load(self, store: RdfStore, probed: Probed | None = None, limit: int | None = None) -> None:
        """Evaluate the query, or take the probe's result when the store is as the probe saw it
        (1,000 rows: evaluating costs this thread 2 ms; taking the text, nothing per row). `limit`
        (a network client's, :class:`TooManyRows` past it): the probe checked it, but on the store
        as it was then; a write between the probe and this took the dashboard's tiles, probed at 0
        rows, to 80 with `max_subscription_rows = 50`, held and sent without an error
        (tests/broker/core/test_spu_manager_rows.py)."""
        if (
            probed is not None
            and probed.text is not None
            and probed.changes == store.changes
            and _clean(lines := probed.text.split(b"\n"))
        ):
            self.variables = tsv_variables(lines[0])
            self.text, self.boolean = probed.text, None
            return
        rows, self.boolean = self.evaluate(store, limit)
        self.rows = self.table.shared(rows)
        self.members = _members(self.rows)

    def release(self) -> None:
        """The SPU ends: its rows go back to the table."""
        self.table.let_go(len(self.rows))
        self.rows, self.members, self.text = (), set(), None

    def current_rows(self) -> Sequence[Row]:
        if self.text is not None:
            lines = self.text.split(b"\n")
            return TsvRows(lines[0], lines[1:-1])
        return self.rows

    def current_boolean(self) -> bool | None:
        return self.boolean

    def rows_held(self) -> int:
        """Its rows, each weighed (broker.core.held.row_weight): called for a network client's
        SPU only, once per re-evaluation (~0.1 us a row held as text, ~0.6 us as rows)."""
        if self.text is not None:
            return text_weight(self.text)
        return len(self.rows) + sum(map(row_weight, self.rows))

    def refresh(self, store: RdfStore) -> int:
        return self.replace(*self.evaluate(store))

    def _hold_rows(self) -> None:
        """Hold the result as rows rather than as text (to diff it with rows)."""
        if self.text is not None:
            self.rows = self.table.shared(rows_from_tsv(self.text))
            self.members = _members(self.rows)
            self.text = None

    def _hold_text(self, text: bytes) -> None:
        """Hold the result as `text` (clean TSV, see :func:`_clean`) and let go of its rows."""
        self.table.let_go(len(self.rows))
        self.rows, self.members, self.text = (), set(), text

    def replace_text(self, text: bytes) -> int:
        """:meth:`replace` for a SELECT result written as SPARQL TSV (a re-evaluation in a query
        worker): when the previous result came so too, only the lines that differ are read, and
        only by subscribers in process (:class:`~broker.core.notification.TsvRows`).

        Why: a row is one line, the same row the same line (pyoxigraph writes a term one way), so
        the difference of two results is the difference of their lines, found by bytes in C. For
        1,000 rows: splitting and comparing both texts ~0.15 ms; reading all the rows back 0.85 ms,
        sharing them in the RowTable and taking set differences about as much again. The result
        is then held as its text only (the rows are not kept)."""
        previous = self.text
        if previous == text:
            return 0
        new = text.split(b"\n")
        if previous is None or not _clean(new) or not previous.startswith(new[0] + b"\n"):
            # read whole: the previous result is held as rows, or a line cannot stand for its row
            self._hold_rows()
            count = self.replace(rows_from_tsv(text), None)
            if _clean(new):
                self._hold_text(text)
            return count
        before_lines, after_lines = previous.split(b"\n")[1:-1], new[1:-1]
        before, after = set(before_lines), set(after_lines)
        if len(before) == len(before_lines) and len(after) == len(after_lines):
            gone, came = list(before - after), list(after - before)
        else:  # a multiset: a row more than once
            counted_before, counted_after = Counter(before_lines), Counter(after_lines)
            gone = list((counted_before - counted_after).elements())
            came = list((counted_after - counted_before).elements())
        self.text = text
        if not (gone or came):
            return 0  # the same rows in another order
        return self.notify(TsvRows(new[0], came), TsvRows(new[0], gone), None, None)

    def replace(self, rows: tuple[Row, ...], boolean: bool | None) -> int:
        """Take `rows` (or `boolean`) as the new result and notify the difference."""
        self._hold_rows()
        if self.is_ask:
            previous, self.boolean = self.boolean, boolean
            return self.notify((), (), boolean, previous)
        rows = self.table.shared(rows)
        if rows == self.rows:  # the same row objects in the same order: compared by identity, in C
            self.table.let_go(len(rows))
            return 0
        members, before = _members(rows), self.members
        if isinstance(members, set) and isinstance(before, set):
            added, removed = list(members - before), list(before - members)
        else:
            counts = members if isinstance(members, Counter) else Counter(rows)
            counted = before if isinstance(before, Counter) else Counter(self.rows)
            added, removed = list((counts - counted).elements()), list((counted - counts).elements())
        self.table.let_go(len(self.rows))
        self.rows, self.members = rows, members
        return self.notify(added, removed, None, None)


def _clean(lines: list[bytes]) -> bool:
    """Whether a TSV result split into `lines` can be held and diffed as lines: a header (at
    least one variable), every row terminated, and no empty line (a row of one unbound value,
    which the TSV reader skips)."""
    return bool(lines[0]) and lines[-1] == b"" and b"" not in lines[1:-1]


def _members(rows: tuple[Row, ...]) -> set[Row] | Counter[Row]:
    distinct = set(rows)
    return distinct if len(distinct) == len(rows) else Counter(rows)


def evaluate_rows(
    store: RdfStore,
    sparql: str,
    prefixes: dict[str, str] | None,
    arguments: dict[str, object],
    limit: int | None = None,
) -> tuple[tuple[str, ...], tuple[Row, ...], bool | None]:
    """A subscription's query evaluated in full: (variables, rows, None), or ((), (), boolean) for
    ASK. Here for a re-evaluating SPU, and in a query worker for one under the time limit. With
    `limit`, at most `limit` + 1 rows are read: more is past it anyway."""
    result = store.query(sparql, prefixes=prefixes, **arguments)  # type: ignore[arg-type]
    if isinstance(result, QueryBoolean):
        return (), (), bool(result)
    variables = tuple(variable.value for variable in result.variables)
    # a solution iterates its values, None where unbound: 2.3x faster than indexing each (1,000 rows:
    # 0.85 ms instead of 1.9 ms beside 1.2 ms of evaluation)
    return variables, tuple(map(tuple, result if limit is None else islice(result, limit + 1))), None


# -- graph feeds ------------------------------------------------------------------------------


class GraphFeedSpu(SpuBase):
    """``SELECT ?s ?p ?o WHERE { GRAPH <g> { ?s ?p ?o } }`` (any order, DISTINCT or not).

    Its rows are the graph's triples: a graph is a set, so the rows gained and lost by an update
    are exactly the delta's quads in that graph, with no join, no LUTT lookup and no counts to
    keep (the cloud shipper mirrors the observations graph this way). The rows are a lazy
    :class:`~broker.core.notification.QuadRows` over the delta's own quads, so the update thread
    pays nothing per quad. The current result is read from the store when a new subscriber joins,
    so a feed costs no memory however large the graph is.
    """

    def __init__(self, store: RdfStore, graph: NamedNode, variables: tuple[str, ...], order: tuple[int, ...]) -> None:
        super().__init__()
        self.store = store
        self.graph = graph
        self.variables = variables
        self.order = order  # per projected variable: 0 subject, 1 predicate, 2 object
        self.is_ask = False

    def rows_of(self, quads: Collection[Quad], digest: Digest | None = None) -> QuadRows:
        """The rows of the quads of this feed's graph among `quads` (any graphs); a `digest` of
        the quads (Delta.digest) goes with them, stamped with this update's engine-clock instant."""
        if digest is None:
            return QuadRows(quads, self.graph, self.order)
        return QuadRows(quads, self.graph, self.order, digest, self.store.clock.micros())

    def current_rows(self) -> QuadRows:
        return QuadRows(list(self.store.ox.quads_for_pattern(None, None, None, self.graph)), None, self.order)

    def current_boolean(self) -> bool | None:
        return None

    def apply(self, added: QuadRows, removed: QuadRows) -> int:
        return self.notify(added, removed, None, None)
