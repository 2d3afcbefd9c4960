"""Rows held are weighed by their size (broker.core.held.row_weight): a row counts once more for
each ROW_CHARS characters of its terms, against max_subscription_rows and max_held_rows alike.

What it protects: rows bounded the count, not the bytes. A client that may write and subscribe
copied one long literal into one more row of its subscription at each update: every row held its
own copy (pyoxigraph gives a new one for each read), so 1,000 rows of a 1 MiB literal were 1 GB.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pyoxigraph import Literal, NamedNode

from broker.api import Engine, Notification, RdfStore, SepaError
from broker.core.held import ROW_CHARS, row_weight, text_weight
from broker.workers.pool import QueryWorkers
from tests.polling import wait_until

EX = "http://example.org/"
# each row carries the long literal: 1 + 10 = 11 rows' worth
LONG = "y" * (10 * ROW_CHARS)
JOINED = f"SELECT ?x ?o WHERE {{ ?x <{EX}k> ?y . <{EX}s> <{EX}big> ?o }}"
# the same rows, re-evaluated (OPTIONAL is not incremental)
JOINED_REEVALUATED = f"SELECT ?x ?o ?z WHERE {{ ?x <{EX}k> ?y . <{EX}s> <{EX}big> ?o OPTIONAL {{ ?x <{EX}q> ?z }} }}"


def write_long(engine: Engine) -> None:
    engine.update(f'INSERT DATA {{ <{EX}s> <{EX}big> "{LONG}" }}')


def add_rows(engine: Engine, first: int, count: int) -> None:
    engine.update("INSERT DATA { " + " ".join(f"<{EX}x{i}> <{EX}k> {i} ." for i in range(first, first + count)) + " }")


def watch(engine: Engine, sparql: str, owner: str = "a") -> list[Notification]:
    seen: list[Notification] = []
    engine.subscribe(sparql, seen.append, limited=True, owner=owner)
    return seen


def test_a_rows_weight_is_its_characters_in_steps_of_row_chars() -> None:
    short = (NamedNode(f"{EX}x1"), Literal("21.5"), None)
    assert row_weight(short) == 0
    assert row_weight((Literal("y" * (ROW_CHARS - 1)),)) == 0
    assert row_weight((NamedNode("http://a/"), Literal("y" * (2 * ROW_CHARS)))) == 2
    tsv = b"?x\t?o\n<http://a/>\t1\n" + b"<http://b/>\t" + b"y" * (3 * ROW_CHARS) + b"\n"
    assert text_weight(tsv) == 2 + 3
    assert text_weight(b"?x\n") == 0


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_long_rows_count_by_their_size_and_end_the_subscription_past_its_limit(mode: str) -> None:
    engine = Engine(mode=mode, boosters=1, max_subscription_rows=100)
    try:
        write_long(engine)
        seen = watch(engine, JOINED)
        add_rows(engine, 0, 5)
        assert len(seen[-1].added) == 5 and seen[-1].ended is None
        assert engine.spus.held.total == 5 * 11
        engine.update(f"DELETE DATA {{ <{EX}x0> <{EX}k> 0 . <{EX}x1> <{EX}k> 1 . <{EX}x2> <{EX}k> 2 }}")
        assert len(seen[-1].removed) == 3 and engine.spus.held.total == 2 * 11  # given back
        add_rows(engine, 10, 7)  # 9 rows of 11: 99, within 100
        assert seen[-1].ended is None and engine.spus.held.total == 99
        add_rows(engine, 20, 1)  # 110: ended, told why
        wait_until(lambda: seen[-1].ended is not None)
        assert "max_subscription_rows" in seen[-1].ended.description  # type: ignore[union-attr]
        assert f"{ROW_CHARS} characters" in seen[-1].ended.description  # type: ignore[union-attr]
        wait_until(lambda: engine.spus.subscription_count == 0)
        assert engine.spus.held.total == 0
        assert len(engine.store.ox) == 1 + 2 + 7 + 1  # the updates applied
    finally:
        engine.close()


def test_a_subscribe_whose_long_rows_weigh_past_the_limit_is_refused() -> None:
    engine = Engine(max_subscription_rows=100)
    write_long(engine)
    add_rows(engine, 0, 10)  # 10 rows of 11
    with pytest.raises(SepaError, match="max_subscription_rows"):
        watch(engine, JOINED)
    assert engine.spus.subscription_count == 0 and engine.spus.held.total == 0
    watch(engine, f"SELECT ?x WHERE {{ ?x <{EX}k> ?y }}")  # the same 10 rows, short: taken
    assert engine.spus.held.total == 10


def test_short_rows_count_once_as_before() -> None:
    engine = Engine(max_subscription_rows=100)
    seen = watch(engine, f"SELECT ?x ?y WHERE {{ ?x <{EX}k> ?y }}")
    add_rows(engine, 0, 100)
    assert seen[-1].ended is None and engine.spus.held.total == 100


def test_the_gateways_own_subscriptions_are_not_weighed() -> None:
    engine = Engine(max_subscription_rows=100)
    write_long(engine)
    seen: list[Notification] = []
    engine.subscribe(JOINED, seen.append)
    add_rows(engine, 0, 20)
    assert seen[-1].ended is None and len(seen[-1].added) == 20


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_reevaluated_subscriptions_long_rows_are_weighed_too(pipelined: bool) -> None:
    store = RdfStore.memory()
    workers = QueryWorkers(store, count=1, time_limit_s=30.0)
    reevaluators = QueryWorkers(store, count=1, time_limit_s=30.0) if pipelined else None
    for pool in (workers, reevaluators):
        if pool is not None:
            pool.start()
    engine = Engine(store, workers=workers, reevaluators=reevaluators, max_subscription_rows=100)
    try:
        write_long(engine)
        add_rows(engine, 0, 5)
        probed = engine.probe(JOINED_REEVALUATED)
        seen: list[Notification] = []
        engine.subscribe(JOINED_REEVALUATED, seen.append, limited=True, owner="a", probed=probed)
        assert len(seen[-1].added) == 5 and engine.spus.held.total >= 5 * 11
        add_rows(engine, 10, 5)  # 10 rows of more than 11: past 100 in the worker
        wait_until(lambda: seen[-1].ended is not None)
        assert "max_subscription_rows" in seen[-1].ended.description  # type: ignore[union-attr]
        wait_until(lambda: engine.spus.subscription_count == 0)
        assert engine.spus.held.total == 0
    finally:
        engine.close()
        for pool in (workers, reevaluators):
            if pool is not None:
                pool.close()


PEAK = """
import json, resource, sys
from broker.api import Engine, RdfStore
from broker.workers.pool import QueryWorkers
EX = "http://example.org/"
store = RdfStore.memory()
workers = QueryWorkers(store, count=1, time_limit_s=30.0)  # as the gateway: each hit looked up apart
workers.start()
engine = Engine(store, workers=workers, mode=sys.argv[1], boosters=1, max_subscription_rows=100_000)
engine.update(f'INSERT DATA {{ <{EX}s> <{EX}big> "{"y" * 1_000_000}" }}')
seen = []
engine.subscribe(sys.argv[2], seen.append, limited=True, owner="a")
def peak():
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return own + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
before = peak()
engine.update("INSERT DATA { " + " ".join(f"<{EX}x{i}> <{EX}k> {i} ." for i in range(int(sys.argv[3]))) + " }")
engine.close()
workers.close()
print(json.dumps({"grew_mb": (peak() - before) / 1024, "ended": seen[-1].ended is not None}))
"""


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_one_update_joining_a_long_literal_with_many_quads_stops_copying_it_at_the_limit(mode: str) -> None:
    """Each solution holds its own copy of the literal: 500 of a 500,000-character one took the
    gateway to 462 MB before the fold refused them. Weighed as they are collected (and counted in
    parallel mode's BOOSTER workers), they stop being kept at the limit: ~25 MB of them here, where
    300 copies of 1 MB were 300 MB. Measured in a process of its own (its peak RSS and its
    workers'), against the same run with one quad."""

    def grew(quads: int) -> dict:
        command = [sys.executable, "-c", PEAK, mode, JOINED, str(quads)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    many, one = grew(300), grew(1)
    assert many["ended"] and not one["ended"], (many, one)
    assert many["grew_mb"] - one["grew_mb"] < 100, (many, one)
