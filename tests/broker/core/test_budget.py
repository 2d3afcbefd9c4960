"""Bounded updates (broker.core.budget): past the budget nothing is changed nor notified."""

from __future__ import annotations

import asyncio
import threading

import pytest
from pyoxigraph import NamedNode

from broker.core.budget import OverBudget
from broker.core.engine import Engine
from broker.scheduler import Scheduler

EX = "http://example.org/"


def _fan_out_engine(values: int) -> tuple[Engine, list[object]]:
    """<b> <q> has `values` objects; one subscription joins ?s <p> ?o with ?o <q> ?x."""
    engine = Engine()
    engine.update("INSERT DATA { " + " ".join(f"<{EX}b> <{EX}q> {value} ." for value in range(values)) + " }")
    seen: list[object] = []
    engine.subscribe(f"SELECT * WHERE {{ ?s <{EX}p> ?o . ?o <{EX}q> ?x }}", seen.append, alias="join", nonblocking=True)
    return engine, seen


def test_small_update_completes_within_its_budget() -> None:
    engine, seen = _fan_out_engine(3)
    result = engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> <{EX}b> }}", budget=64)
    assert (len(result.added), result.notifications) == (1, 1)
    assert len(seen) == 2 and len(seen[1].added) == 3  # type: ignore[attr-defined]


def test_over_budget_after_apply_undoes_the_delta_and_notifies_nothing() -> None:
    """The added quad's join visits 300 quads: the store is restored, no one is told."""
    engine, seen = _fan_out_engine(300)
    before = engine.store.quads()
    updates = engine.stats.updates
    with pytest.raises(OverBudget):
        engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> <{EX}b> }}", budget=64)
    assert engine.store.quads() == before
    assert (len(seen), engine.stats.updates) == (1, updates)
    result = engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> <{EX}b> }}")  # unbounded: as usual
    assert result.notifications == 1 and len(seen[1].added) == 300  # type: ignore[attr-defined]


def test_what_cannot_be_bounded_is_not_attempted() -> None:
    engine = Engine()
    for sparql in (
        f"INSERT {{ <{EX}a> <{EX}p> ?o }} WHERE {{ <{EX}b> <{EX}p> ?o FILTER(?o > 1) }}",  # SPARQL WHERE
        f"INSERT DATA {{ GRAPH <{EX}g> {{ <{EX}a> <{EX}p> 1 }} }}",  # creates a graph
        f"CLEAR GRAPH <{EX}g>",
        f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }} ; INSERT DATA {{ <{EX}a> <{EX}p> 2 }}",
    ):
        with pytest.raises(OverBudget):
            engine.update(sparql, budget=1000)
    assert engine.store.quads() == set()
    assert not engine.store.ox.contains_named_graph(NamedNode(f"{EX}g"))


def test_scheduler_runs_small_updates_inline_unless_a_callback_may_block() -> None:
    """Nonblocking subscribers are notified on the loop thread; a plain callback from the update thread."""
    engine = Engine()
    threads: dict[str, int] = {}

    def record(name: str):  # type: ignore[no-untyped-def]
        return lambda notification: notification.sequence and threads.setdefault(name, threading.get_ident())

    engine.subscribe(f"SELECT * WHERE {{ ?s <{EX}p> ?o }}", record("loop"), nonblocking=True)
    engine.subscribe(f"SELECT * WHERE {{ ?s <{EX}q> ?o }}", record("plain"))

    async def scenario() -> int:
        scheduler = Scheduler(engine)
        try:
            await scheduler.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")
            await scheduler.update(f"INSERT DATA {{ <{EX}a> <{EX}q> 1 }}")
            return threading.get_ident()
        finally:
            scheduler.close()

    loop_thread = asyncio.run(scenario())
    assert threads["loop"] == loop_thread
    assert threads["plain"] != loop_thread
    assert len(engine.store.quads()) == 2
