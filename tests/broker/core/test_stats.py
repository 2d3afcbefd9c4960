"""The reference broker's indicators, kept by the engine: one update's processing time (min, average,
max, end of processing included) and the subscriptions held now and at most.

Protects: the times are those of processed updates only (a failed update is not one), an update
that makes many subscriptions work takes longer than a trivial one and moves the max, not the min;
the peak of subscriptions outlives the unsubscriptions; `reset` (the benchmarks) clears the times.
"""

from __future__ import annotations

import pytest

from broker.core.engine import Engine
from broker.errors import SparqlSyntaxError

EX = "http://example.org/stats/"


def test_processing_time_min_avg_max_of_processed_updates() -> None:
    engine = Engine()
    stats = engine.stats
    assert (stats.updates, stats.processing_min_s, stats.processing_avg_s, stats.processing_max_s) == (0, 0, 0, 0)
    engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")
    first = stats.processing_min_s
    assert first > 0 and stats.processing_max_s == first == stats.processing_avg_s
    with pytest.raises(SparqlSyntaxError):
        engine.update("INSERT DATA {")
    assert stats.updates == 1 and stats.processing_min_s == first  # a failed update is not a processed one
    # a heavy update: re-evaluated subscriptions (OPTIONAL) over many quads, each notified
    for n in range(20):
        engine.subscribe(f"SELECT ?s ?o WHERE {{ ?s <{EX}q{n}> ?x OPTIONAL {{ ?s <{EX}r> ?o }} }}", lambda _: None)
    numbers = " ".join(str(n) for n in range(3000))
    heavy = " ".join(f"?s <{EX}q{n}> ?v ." for n in range(20))
    engine.update(
        f'INSERT {{ {heavy} }} WHERE {{ VALUES ?v {{ {numbers} }} BIND(IRI(CONCAT("{EX}s", STR(?v))) AS ?s) }}'
    )
    assert stats.updates == 2
    assert stats.processing_max_s > 5 * first, (first, stats.processing_max_s)
    assert stats.processing_min_s == first
    assert stats.processing_avg_s == pytest.approx(stats.processing_total_s / 2)
    assert first < stats.processing_avg_s < stats.processing_max_s
    stats.reset()
    assert (stats.processing_min_s, stats.processing_max_s, stats.processing_avg_s) == (0, 0, 0)


def test_subscriptions_peak_outlives_unsubscribing() -> None:
    engine = Engine()
    spuids = [engine.subscribe(f"SELECT ?o WHERE {{ <{EX}s{n}> <{EX}p> ?o }}", lambda _: None).spuid for n in range(5)]
    assert (engine.subscription_count, engine.stats.subscriptions_max) == (5, 5)
    for spuid in spuids[:4]:
        engine.unsubscribe(spuid)
    engine.subscribe(f"SELECT ?o WHERE {{ <{EX}t> <{EX}p> ?o }}", lambda _: None)
    assert (engine.subscription_count, engine.stats.subscriptions_max) == (2, 5)
