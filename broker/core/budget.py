"""A bound on the work of one update, so that small updates can run on the event loop thread.

Why: handing each update to the update thread and its reply back costs more than a small IoT
update itself (thread wake-ups, GIL hand-overs between the loop and the update thread, and the
cache misses that come with them). The scheduler therefore first tries an update on the loop
thread with a :class:`Budget`; an update that would exceed it stops with :class:`OverBudget`
and leaves the store and the subscriptions as they were, and is then run on the update thread
like any other. So the loop is never blocked for more than a bounded amount of work.

What is counted: every index lookup and every quad it yields (WHERE clause and subscription
processing alike), a long quad once more for each 256 characters of its terms, and every
notification to be sent. What cannot be bounded this way is not
tried at all (SPARQL-evaluated WHERE clauses and subscriptions, LOAD, graph management,
multi-operation requests, re-evaluated subscriptions): those raise :class:`OverBudget` at once.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, NoReturn

from pyoxigraph import Quad, Store

from broker.core.held import quad_weight

# quads read before they are weighed and charged (see BudgetedStore.quads_for_pattern)
CHUNK = 16


class OverBudget(Exception):
    """A bounded attempt gave up; nothing is changed and nothing was notified."""


class Budget:
    """Steps left: :meth:`spend` raises :class:`OverBudget` once they are used up."""

    __slots__ = ("left",)

    def __init__(self, steps: int) -> None:
        self.left = steps

    def spend(self, steps: int = 1) -> None:
        self.left -= steps
        if self.left < 0:
            raise OverBudget


class BudgetedStore:
    """A pyoxigraph store for :func:`broker.core.bgp.evaluate_bgp` that charges each lookup and quad."""

    __slots__ = ("budget", "ox")

    def __init__(self, ox: Store, budget: Budget) -> None:
        self.ox = ox
        self.budget = budget

    def quads_for_pattern(self, subject: Any, predicate: Any, obj: Any, graph: Any) -> list[Quad]:
        """The matching quads, charged CHUNK at a time: a list costs one call where a generator
        costs one per quad. Each quad is weighed (broker.core.held.quad_weight: once more for each
        256 characters of its terms), because each is a copy of its terms: 500 quads that shared one
        900,000-character literal in the store were 450 MB once read. So at most CHUNK quads, or
        one more than the budget has left, are read past what the budget allows."""
        budget = self.budget
        budget.spend()
        found = self.ox.quads_for_pattern(subject, predicate, obj, graph)
        quads: list[Quad] = []
        while True:
            wanted = min(CHUNK, budget.left + 1)
            chunk = list(islice(found, wanted))
            budget.spend(len(chunk) + sum(map(quad_weight, chunk)))
            if len(chunk) < wanted:
                return chunk if not quads else quads + chunk
            quads += chunk


class BudgetedRdfStore:
    """What subscription processing sees of the store under a budget: lookups only, no SPARQL."""

    __slots__ = ("ox",)

    def __init__(self, ox: Store, budget: Budget) -> None:
        self.ox = BudgetedStore(ox, budget)

    def query(self, sparql: str, **options: Any) -> NoReturn:
        raise OverBudget
