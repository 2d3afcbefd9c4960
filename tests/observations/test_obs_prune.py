"""Retention: prune_update against a real store.

What it protects: count retention keeps exactly the newest N observations per (sensor, property)
and their results, age retention removes what is older than the engine clock allows, the work per
run is capped by `limit`, and the latest view is never touched.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import LATEST, OBS, Store

from broker.core.engine import Engine
from gateway.observations import Reading, prune_update

Read = Callable[..., list[Reading]]


def observations(store: Store) -> dict[str, list[float]]:
    rows = store.values(
        f"""SELECT ?sensor ?seq ?v WHERE {{ GRAPH {OBS} {{ ?o sosa:madeBySensor ?sensor ; gw:sequenceNumber ?seq ;
        sosa:hasResult/qudt:numericValue ?v }} }} ORDER BY ?sensor ?seq"""
    )
    out: dict[str, list[float]] = {}
    for row in rows:
        out.setdefault(row["sensor"].rsplit("/", 1)[-1], []).append(float(row["v"]))
    return out


def test_count_retention(store: Store, read: Read) -> None:
    for value in range(7):
        store.write(read("gateway/a/temperature", str(value)) + read("gateway/b/temperature", str(value * 10)))
    store.write(read("gateway/c/temperature", "1"))
    latest_before = store.count(LATEST)
    result = store.engine.update(prune_update(3, 86_400))
    assert observations(store) == {"a": [4.0, 5.0, 6.0], "b": [40.0, 50.0, 60.0], "c": [1.0]}
    assert store.count(OBS) == (3 + 3 + 1) * 11  # no orphaned result node, nothing else left behind
    assert store.count(LATEST) == latest_before
    assert len(result.removed) == 8 * 11
    assert store.engine.update(prune_update(3, 86_400)).removed == frozenset()  # idempotent


def test_limit_bounds_each_run(store: Store, read: Read) -> None:
    for value in range(10):
        store.write(read("gateway/a/temperature", str(value)))
    store.engine.update(prune_update(1, 86_400, limit=4))
    assert len(observations(store)["a"]) == 6
    store.engine.update(prune_update(1, 86_400, limit=4))
    store.engine.update(prune_update(1, 86_400, limit=4))
    assert observations(store) == {"a": [9.0]}


def test_age_retention(read: Read) -> None:
    now = [1_800_000_000_000_000_000]  # the engine clock, in ns
    store = Store()
    store.engine = Engine()
    store.engine.store.clock._source = lambda: now[0]  # type: ignore[method-assign]
    store.latest.load([])
    store.write(read("gateway/a/temperature", "1"))
    now[0] += 3_000 * 10**9
    store.write(read("gateway/a/temperature", "2") + read("gateway/b/temperature", "3"))
    now[0] += 1_000 * 10**9
    store.engine.update(prune_update(100, 2_000))
    assert observations(store) == {"a": [2.0], "b": [3.0]}
    now[0] += 2_500 * 10**9
    store.engine.update(prune_update(100, 2_000))
    assert observations(store) == {}
    assert store.count(LATEST) == 2 * 9  # the latest view keeps the last values


@pytest.mark.parametrize(
    ("count", "age", "limit"), [(0, 1, 1), (1, 0, 1), (1, float("nan"), 1), (1, 1, 0), (True, 1, 1)]
)
def test_bad_retention(count: int, age: float, limit: int) -> None:
    with pytest.raises(ValueError):
        prune_update(count, age, limit=limit)
