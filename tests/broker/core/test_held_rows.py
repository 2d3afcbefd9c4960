"""The rows network clients' subscriptions hold together and each client's share ([websocket]
max_held_rows, max_held_rows_per_client; broker.core.held, over real sockets at the end).

What it protects: one client may hold 2,000 subscriptions of up to 100,000 rows each. Distinct
subscriptions of 100,000 rows cost ~28 MB each (an incremental SPU, 0.28 KB a row), so 35 of them
filled a 1 GB board. Past the budget a subscribe gets a 429 and holds nothing, an update that would
grow a subscription past it ends that subscription, and the others carry on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
import pytest

from broker.api import Engine, Notification, RdfStore, SepaError
from broker.core.held import HeldRows, TooManyRowsHeld
from broker.core.spu import IncrementalSpu, ReevalSpu
from broker.workers.pool import QueryWorkers
from tests.polling import wait_until
from tools.launcher import RunningGateway

EX = "http://example.org/"


def rows_query(tag: int) -> str:
    """Incremental, one row a triple of <p>; each `tag` its own SPU (its own FILTER constant)."""
    return f'SELECT ?s ?o WHERE {{ ?s <{EX}p> ?o FILTER(?o != "x{tag}") }}'


def reevaluated_query(tag: int) -> str:
    """Not incremental (OPTIONAL): re-evaluated; one row a triple of <p>."""
    return f"SELECT ?s ?o ?z WHERE {{ ?s <{EX}p> ?o OPTIONAL {{ ?s <{EX}q{tag}> ?z }} }}"


def insert(engine: Engine, first: int, count: int) -> None:
    engine.update("INSERT DATA { " + " ".join(f"<{EX}s{i}> <{EX}p> {i} ." for i in range(first, first + count)) + " }")


def watch(engine: Engine, sparql: str, owner: str | None = "a", *, limited: bool = True) -> list[Notification]:
    seen: list[Notification] = []
    engine.subscribe(sparql, seen.append, limited=limited, owner=owner)
    return seen


def test_an_spu_counts_once_and_each_client_is_charged_once_for_it() -> None:
    held = HeldRows(total=100, per_client=60)
    spu, other = object(), object()
    held.join(spu, "a", 50)
    held.join(spu, "a", 50)  # the same client again: not charged twice
    held.join(spu, "b", 50)  # another client: charged, the total unchanged
    assert (held.total, held.client_rows("a"), held.client_rows("b")) == (50, 50, 50)
    with pytest.raises(TooManyRowsHeld):
        held.join(other, "a", 20)  # a's share would be 70
    with pytest.raises(TooManyRowsHeld):
        held.join(other, "c", 51)  # the total would be 101
    assert held.headroom(spu) == 10  # a and b may each hold 10 more
    held.resized(spu, 55)
    assert (held.total, held.client_rows("a"), held.client_rows("b")) == (55, 55, 55)
    held.leave(spu, "a")
    assert held.client_rows("a") == 55  # a still holds one subscription to it
    held.leave(spu, "a")
    held.leave(spu, "b")
    assert (held.total, held.client_rows("a"), held.client_rows("b"), spu in held) == (0, 0, 0, False)


def test_a_subscribe_past_the_gateways_budget_gets_429_and_holds_nothing() -> None:
    engine = Engine(max_held_rows=250)
    insert(engine, 0, 100)
    watch(engine, rows_query(0), "a")
    watch(engine, rows_query(1), "b")
    with pytest.raises(SepaError) as refused:
        watch(engine, rows_query(2), "c")
    assert refused.value.status_code == 429 and "max_held_rows" in refused.value.description
    assert engine.spus.subscription_count == 2
    assert sum(len(group.spus) for group in engine.spus.groups.values()) == 2  # the refused one's SPU is gone
    watch(engine, rows_query(1), "c")  # an SPU already held costs the gateway nothing more
    assert engine.spus.held.total == 200


def test_one_client_past_its_share_is_refused_and_another_is_not() -> None:
    engine = Engine(max_held_rows_per_client=150)
    insert(engine, 0, 100)
    watch(engine, rows_query(0), "a")
    with pytest.raises(SepaError) as refused:
        watch(engine, rows_query(1), "a")
    assert refused.value.status_code == 429 and "max_held_rows_per_client" in refused.value.description
    watch(engine, rows_query(1), "b")
    assert engine.spus.subscription_count == 2


@pytest.mark.parametrize("make", [rows_query, reevaluated_query])
def test_a_subscribe_past_the_budget_is_refused_on_its_probes_count_before_it_is_evaluated(
    make: Callable[[int], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluating a new SPU holds the update thread (0.7 s for 99,000 rows) and was done before the
    budget refused it: a client past its share could keep every update waiting, a 429 at a time."""
    store = RdfStore.memory()
    workers = QueryWorkers(store, count=1, time_limit_s=30.0)
    workers.start()
    try:
        engine = Engine(store, workers=workers, max_held_rows_per_client=150)
        insert(engine, 0, 100)
        loads: list[object] = []
        for kind in (IncrementalSpu, ReevalSpu):
            real = kind.load
            monkeypatch.setattr(kind, "load", lambda spu, *args, real=real: (loads.append(spu), real(spu, *args))[1])

        def subscribe(tag: int, owner: str) -> None:
            sparql = make(tag)
            engine.subscribe(sparql, [].append, limited=True, owner=owner, probed=engine.probe(sparql))

        subscribe(0, "a")
        assert len(loads) == 1
        with pytest.raises(TooManyRowsHeld, match="max_held_rows_per_client"):
            subscribe(1, "a")
        assert len(loads) == 1  # refused on the count: not evaluated
        subscribe(0, "a")  # the SPU a holds already: taken, a is not charged again
        subscribe(1, "b")  # another client has its own share
        assert len(loads) == 2 and engine.spus.subscription_count == 3
        assert sum(len(group.spus) for group in engine.spus.groups.values()) == len(engine.spus.groups)
    finally:
        workers.close()


def test_an_update_that_would_grow_a_subscription_past_the_budget_ends_it_and_the_rest_carry_on() -> None:
    engine = Engine(max_held_rows=250)
    insert(engine, 0, 100)
    first, second = watch(engine, rows_query(0), "a"), watch(engine, rows_query(1), "b")
    insert(engine, 100, 40)  # the first SPU folded takes 40 of the 50 left; the second cannot
    outcomes = sorted((seen[-1].ended is None, len(seen)) for seen in (first, second))
    assert outcomes == [(False, 2), (True, 2)]
    survivor = first if first[-1].ended is None else second
    assert len(survivor[-1].added) == 40
    assert engine.spus.subscription_count == 1 and engine.spus.held.total == 140
    assert len(engine.store.ox) == 140  # the update applied
    # the ended one's 100 rows were given back: 140 + 100 fit in 250
    watch(engine, f"SELECT ?s WHERE {{ ?s <{EX}p> ?o FILTER(?o < 100) }}", "c")
    assert engine.spus.held.total == 240


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_reevaluated_subscription_past_the_budget_is_ended(pipelined: bool) -> None:
    store = RdfStore.memory()
    workers = QueryWorkers(store, count=1, time_limit_s=30.0)
    reevaluators = QueryWorkers(store, count=1, time_limit_s=30.0) if pipelined else None
    workers.start()
    if reevaluators is not None:
        reevaluators.start()
    engine = Engine(store, workers=workers, reevaluators=reevaluators, max_held_rows=150)
    try:
        insert(engine, 0, 50)
        small, large = watch(engine, reevaluated_query(0), "a"), watch(engine, reevaluated_query(1), "b")
        insert(engine, 50, 20)  # 70 + 70 rows
        insert(engine, 70, 20)  # 90 + 90: one of them cannot
        wait_until(lambda: any(seen[-1].ended is not None for seen in (small, large)))
        wait_until(lambda: engine.spus.subscription_count == 1)
        ended = [seen for seen in (small, large) if seen[-1].ended is not None]
        assert len(ended) == 1 and "max_held_rows" in ended[0][-1].ended.description  # type: ignore[union-attr]
        assert engine.spus.held.total <= 150
    finally:
        engine.close()
        workers.close()
        if reevaluators is not None:
            reevaluators.close()


def test_in_parallel_mode_too() -> None:
    engine = Engine(mode="parallel", boosters=1, max_held_rows=250)
    try:
        insert(engine, 0, 100)
        first, second = watch(engine, rows_query(0), "a"), watch(engine, rows_query(1), "b")
        insert(engine, 100, 40)  # enough quads to go to the BOOSTER worker; the first folded takes 40 of 50
        assert engine.spus.counters["pipelined"] > 0  # type: ignore[attr-defined]
        assert sorted(seen[-1].ended is None for seen in (first, second)) == [False, True]  # told at once
        insert(engine, 200, 5)  # the engine's thread ends it now (see _recover): not notified again
        assert sorted(len(seen) for seen in (first, second)) == [2, 3]
        assert engine.spus.subscription_count == 1
    finally:
        engine.close()


def test_the_gateways_own_subscriptions_are_not_counted() -> None:
    engine = Engine(max_held_rows=50, max_held_rows_per_client=50)
    insert(engine, 0, 100)
    trusted = watch(engine, rows_query(0), None, limited=False)
    insert(engine, 100, 10)
    assert len(trusted[-1].added) == 10 and engine.spus.held.total == 0
    network = watch(engine, rows_query(0), "a")  # shares the trusted SPU's group: not bounded either
    insert(engine, 110, 10)
    assert network[-1].ended is None and engine.spus.held.total == 0


def test_a_network_subscription_the_gateways_own_code_joins_later_is_no_longer_counted() -> None:
    engine = Engine(max_held_rows=150)
    insert(engine, 0, 100)
    network = watch(engine, rows_query(0), "a")
    assert engine.spus.held.total == 100
    watch(engine, rows_query(0), None, limited=False)  # its group is no longer bounded
    assert engine.spus.held.total == 0
    insert(engine, 100, 100)
    assert network[-1].ended is None and len(network[-1].added) == 100


def test_over_real_sockets_a_subscribe_past_the_budget_gets_a_429_frame_and_the_socket_lives(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    gateway = start_gateway(toml="[websocket]\nmax_held_rows = 150\n")
    data = " ".join(f"<{EX}s{i}> <{EX}p> {i} ." for i in range(100))
    assert gateway.update(f"INSERT DATA {{ {data} }}").status == 200

    async def main() -> list[dict]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{gateway.ws_url}/subscribe") as ws:
            frames = []
            for alias, query in (("first", rows_query(0)), ("second", rows_query(1)), ("small", rows_query(2))):
                if alias == "small":
                    query = f"SELECT ?o WHERE {{ <{EX}s1> <{EX}p> ?o }}"
                await ws.send_json({"subscribe": {"sparql": query, "alias": alias}})
                frames.append(json.loads((await ws.receive(timeout=10)).data))
            return frames

    first, second, small = asyncio.run(main())
    assert len(first["notification"]["addedResults"]["results"]["bindings"]) == 100
    assert second["status_code"] == 429 and "max_held_rows" in second["error_description"], second
    assert len(small["notification"]["addedResults"]["results"]["bindings"]) == 1
