"""Bounded lookups: a network client's incremental subscription cannot hold the update thread.

An incremental SPU's lookups (the BOOSTER of seed 001: the solutions an update's changed quads gain
or lose) run on the update thread, which cannot be interrupted, and what they cost is set by the
data, not by the query. A client that may write and subscribe subscribed to a product of three
patterns with a string FILTER while the store was empty (its probe passed at once), wrote 2,000 +
2,000 triples, then inserted 20 quads: that update took 32.6 s, every other publisher waiting.
Without the FILTER, each added quad's lookup built all of its 4,000,000 solutions before the rows
limit was checked (`/tmp/lk/repro.py 500 5 b`: 250,000 each, 2.2 s for 5 quads).

So the lookups of a bounded group (network clients' SPUs only: broker.core.spu.ShapeGroup.bounded)
are bounded twice, per update:

- here, each hit's lookup may read at most STEPS index entries (each lookup and each quad it
  yields, :class:`~broker.core.budget.Budget`). A branch with FILTERs, which pyoxigraph evaluates
  without a bound, first has its patterns joined here under that budget (a branch of one pattern
  reads nothing: the quad is its solution);
- a hit past it is evaluated in a query worker, under what is left of the update's time limit
  (``[engine] time_limit_s``, counted from the update's first such hit, for all of them together:
  300 hits of 18,000 entries each, each under the budget, held the update thread 24 s before
  that). Past it, or once it is spent,
  the SPUs the hit concerns end, their subscribers told why (a 503 notification, as for a
  re-evaluation past the limit); the update applies and the other SPUs are notified.

What it costs the common case: a budget object per hit, and the lookups' quads read into a list
(broker.core.budget.BudgetedStore). A filtered branch's patterns are joined twice (here, then by
pyoxigraph). Parallel mode's BOOSTER workers are not bounded this way (docs/architecture.md).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pyoxigraph import Quad

from broker.core.budget import Budget, OverBudget
from broker.errors import TimeLimitExceeded
from broker.store import RdfStore

if TYPE_CHECKING:
    from broker.core.spu import Mu, ShapeGroup
    from broker.core.stats import EngineStats
    from broker.workers.pool import QueryWorkers

# index entries one hit's lookup may read on the update thread; a wire benchmark hit reads under 10,
# a coarse S_ROAD hit of the lighting profile ~300
STEPS = 20_000


class BoundedLookups:
    """One update's lookups for bounded groups (a :data:`broker.core.spu.Lookup`)."""

    def __init__(self, workers: QueryWorkers, stats: EngineStats, steps: int = STEPS) -> None:
        self.workers = workers
        self.stats = stats
        self.steps = steps
        self.budget = Budget(steps)  # one per update, refilled for each hit
        # the lookups of one update, here and in the workers together, within the time limit: a
        # budget per hit alone let 300 hits of 18,000 entries each hold the update thread 24 s
        self.deadline: float | None = None  # set by the first hit

    def __call__(
        self,
        group: ShapeGroup,
        store: RdfStore,
        ref: tuple[int, int],
        quad: Quad,
        params: tuple[object, ...] | None,
        limit: int | None,
    ) -> list[Mu] | None:
        if len(group.shape.branches[ref[0]].patterns) == 1:  # the quad is the solution: nothing to read
            return group.hit_solutions(store, ref, quad, params, limit)
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.workers.time_limit_s
        left = self.deadline - now
        if left > 0:
            budget = self.budget
            budget.left = self.steps
            try:
                return group.hit_solutions(store, ref, quad, params, limit, budget)
            except OverBudget:
                pass
            left = self.deadline - time.monotonic()
            self.stats.lookups_offloaded += 1
        try:
            if left > 0:
                return self.workers.run(  # type: ignore[no-any-return]
                    "hit_solutions", group.arguments, ref, quad, params, limit, time_limit_s=left
                )
        except TimeLimitExceeded:
            pass
        self.stats.lookups_timed_out += 1
        raise TimeLimitExceeded(
            f"processing an update for this subscription ran past the time limit of "
            f"{self.workers.time_limit_s:g} s ([engine] time_limit_s)"
        )
