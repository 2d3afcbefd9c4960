"""The rows a network client's subscription may come to hold after it subscribed ([websocket]
max_subscription_rows; broker.core.spu_manager, over real sockets at the end).

What it protects: the probe bounds a subscription's result when it is made, but an update can
multiply it afterwards. A product of a graph with itself, subscribed while the graph was empty,
gained 490,000 rows from one 700-triple update: 11 s of the update thread, the gateway's RSS at
837 MB, a 125 MB notification. Past the limit the subscription is ended with an error notification
instead, the update applies, and the other subscriptions carry on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
import pytest

from broker.api import Engine, Notification, RdfStore, ResultTooLarge
from broker.workers.pool import QueryWorkers
from tests.polling import wait_until
from tools.launcher import RunningGateway

EX = "http://example.org/"
G = f"{EX}g"
PRODUCT = f"SELECT * WHERE {{ GRAPH <{G}> {{ ?s <{EX}p> ?o }} GRAPH <{G}> {{ ?a <{EX}p> ?c }} }}"
# not incremental (OPTIONAL): re-evaluated, in a query worker for a network client
PRODUCT_REEVALUATED = (
    f"SELECT * WHERE {{ GRAPH <{G}> {{ ?s <{EX}p> ?o }} OPTIONAL {{ GRAPH <{G}> {{ ?a <{EX}p> ?c }} }} }}"
)


def insert(engine: Engine, first: int, count: int) -> None:
    data = " ".join(f"<{EX}s{i}> <{EX}p> {i} ." for i in range(first, first + count))
    engine.update(f"INSERT DATA {{ GRAPH <{G}> {{ {data} }} }}")


def watch(engine: Engine, sparql: str, *, limited: bool = True) -> list[Notification]:
    seen: list[Notification] = []
    engine.subscribe(sparql, seen.append, limited=limited)
    return seen


@pytest.mark.parametrize(("triples", "ended"), [(10, False), (11, True)])
def test_an_update_that_would_take_a_subscription_past_the_limit_ends_it_instead(triples: int, ended: bool) -> None:
    """10 triples: a product of 100 rows, exactly the limit; 11: 121 rows, ended, not notified."""
    engine = Engine(max_subscription_rows=100)
    seen = watch(engine, PRODUCT)
    insert(engine, 0, triples)
    assert len(seen) == 2
    last = seen[-1]
    if ended:
        assert last.ended is not None and "more than 100 rows" in last.ended.description
        assert not last.added and engine.spus.subscription_count == 0
        assert engine.stats.subscriptions_ended == 1
    else:
        assert last.ended is None and len(last.added) == 100
        assert engine.spus.subscription_count == 1
    assert len(engine.store.ox) == triples  # the update applied either way


def test_a_subscription_that_grows_past_the_limit_update_by_update_is_ended_at_the_update_that_passes_it() -> None:
    engine = Engine(max_subscription_rows=5)
    seen = watch(engine, f"SELECT ?s WHERE {{ GRAPH <{G}> {{ ?s <{EX}p> ?o }} }}")
    kept = watch(engine, f"SELECT ?s WHERE {{ GRAPH <{G}> {{ ?s <{EX}p> 0 }} }}")
    insert(engine, 0, 3)
    insert(engine, 3, 2)
    insert(engine, 5, 1)
    assert [len(n.added) for n in seen[:-1]] == [0, 3, 2]
    assert seen[-1].ended is not None and not seen[-1].added
    assert engine.spus.subscription_count == 1 and [len(n.added) for n in kept] == [0, 1]


@pytest.mark.parametrize("triples", [300, 60])
def test_a_product_is_not_evaluated_past_the_limit(triples: int) -> None:
    """The update's solutions stop being collected one past the limit: 300 triples are a product of
    90,000 rows, each added triple making 300 solutions; 60 are 3,600, each making 60 (fewer than
    the limit: their sum is what passes it). With a limit of 100, a few hundred solutions are made."""
    engine = Engine(max_subscription_rows=100)
    seen = watch(engine, PRODUCT)
    made = []
    group = next(iter(engine.spus.groups.values()))
    solutions = group.solutions

    def counted(*args: object, **kwargs: object) -> object:
        for mu in solutions(*args, **kwargs):  # type: ignore[arg-type]
            made.append(mu)
            yield mu

    group.solutions = counted  # type: ignore[method-assign]
    insert(engine, 0, triples)
    assert seen[-1].ended is not None
    assert len(made) <= 2 * 121  # 101 for a quad of 300 (one past the limit), 60 + 60 for those of 60


def test_one_quad_with_more_solutions_than_the_limit_ends_every_subscription_they_could_go_to() -> None:
    """Two subscriptions of one shape (a constant differs): a quad added to <g1> matches their
    first pattern for both, and has 155 solutions. They are not evaluated past the limit, so they
    cannot be told apart: both end, though Y's would have had 5 rows (the price of not evaluating a
    product of the store with itself in full)."""
    engine = Engine(max_subscription_rows=100)
    data = [f"<{EX}a{i}> <{EX}q> <{EX}X> ." for i in range(150)] + [f"<{EX}b{i}> <{EX}q> <{EX}Y> ." for i in range(5)]
    engine.update(f"INSERT DATA {{ GRAPH <{EX}g2> {{ {' '.join(data)} }} }}")
    views = {
        name: watch(
            engine, f"SELECT * WHERE {{ GRAPH <{EX}g1> {{ ?s ?p ?o }} GRAPH <{EX}g2> {{ ?a <{EX}q> <{EX}{name}> }} }}"
        )
        for name in "XY"
    }
    assert len(engine.spus.groups) == 1
    engine.update(f"INSERT DATA {{ GRAPH <{EX}g1> {{ <{EX}s> <{EX}p> 1 }} }}")
    assert all(len(seen) == 2 and seen[-1].ended is not None for seen in views.values())


def test_a_pipelined_reevaluation_past_the_limit_ends_its_subscription() -> None:
    """With a re-evaluation worker (the installed gateway's), re-evaluations are queued there and
    applied by the collector thread: the job counts the rows too."""
    store = RdfStore.memory()
    workers = QueryWorkers(store, count=1, time_limit_s=30.0)
    reevaluators = QueryWorkers(store, count=1, time_limit_s=30.0)
    workers.start()
    reevaluators.start()
    engine = Engine(store, workers=workers, reevaluators=reevaluators, max_subscription_rows=50)
    try:
        seen = watch(engine, PRODUCT_REEVALUATED)
        insert(engine, 0, 7)  # 49 rows
        insert(engine, 7, 1)  # 64
        wait_until(lambda: len(seen) == 3)
        assert len(seen[1].added) == 49 and seen[1].ended is None
        assert seen[2].ended is not None and "more than 50 rows" in seen[2].ended.description
        assert engine.spus.subscription_count == 0
    finally:
        engine.close()
        workers.close()
        reevaluators.close()


@pytest.mark.parametrize("coalesce_s", [0.0, 0.25])
def test_a_write_between_the_probe_and_the_subscribe_does_not_take_a_new_subscription_past_the_limit(
    coalesce_s: float,
) -> None:
    """The probe found 0 rows; 64 were written before the subscribe, which evaluated them itself
    (the store had changed since the probe) and held them all, past the limit of 50, with no error:
    the dashboard's tiles (coalesced, 0.25 s) showed 20 sensors with `max_subscription_rows = 50`
    and never said their view had ended (tests/gateway/dashboard/test_dashboard_volume.py). Now
    refused, as a probe past the limit is; not coalesced, the same."""
    store = RdfStore.memory()
    workers = QueryWorkers(store, count=1, time_limit_s=30.0)
    workers.start()
    engine = Engine(store, workers=workers, max_subscription_rows=50)
    engine.on_deferred(lambda due: None)
    try:
        probed = engine.probe(PRODUCT_REEVALUATED)
        assert probed is not None and probed.rows == 0
        insert(engine, 0, 8)  # 64 rows
        seen: list[Notification] = []
        with pytest.raises(ResultTooLarge, match="more than 50 rows"):
            engine.subscribe(PRODUCT_REEVALUATED, seen.append, limited=True, probed=probed, coalesce_s=coalesce_s)
        assert seen == [] and engine.spus.subscription_count == 0 and not engine.spus.reeval
    finally:
        engine.close()
        workers.close()


@pytest.mark.parametrize("triples", [5, 20, 30])
def test_in_parallel_mode_too(triples: int) -> None:
    """5 triples (10 quads matched: fewer than go to the BOOSTER workers) are processed on the
    engine's thread: ended at once. 20 and 30 go to the workers (20: each added triple has 20
    solutions, their sum passes the limit; 30: each has more than the limit, and a worker stops
    there), and the collector folds the solutions outside the state lock: the subscription is not
    notified, its subscriber is told at once (the update's reply comes after), and it is ended by
    the engine's thread when it next takes a request (the next update)."""
    engine = Engine(mode="parallel", boosters=1, max_subscription_rows=20)
    sent: list[tuple[object, ...]] = []
    send = engine.spus._send  # type: ignore[attr-defined]
    engine.spus._send = lambda worker, message: (sent.append(message), send(worker, message))  # type: ignore[attr-defined]
    try:
        seen = watch(engine, PRODUCT)
        insert(engine, 0, triples)
        assert (engine.spus.counters["pipelined"] > 0) == (triples > 5)  # type: ignore[attr-defined]
        # the workers are told the limit: they stop there (tests/broker/workers/test_booster_limit.py)
        limits = {item[4] for message in sent if message[0] == "boost" for item in message[5]}
        assert limits == ({20} if triples > 5 else set())
        assert len(seen) == 2 and seen[-1].ended is not None and not seen[-1].added
        engine.update(f"INSERT DATA {{ <{EX}s> <{EX}p> 0 }}")
        assert len(seen) == 2  # not notified again
        assert engine.spus.subscription_count == 0
    finally:
        engine.close()


def test_in_parallel_mode_a_subscription_told_it_ended_is_not_notified_by_the_updates_in_flight() -> None:
    """The second update, handed to the workers before the first was folded, removes what the first
    added: folded into the ended SPU, it would notify its subscriber after the error."""
    engine = Engine(mode="parallel", boosters=1, max_subscription_rows=20)
    try:
        seen = watch(engine, PRODUCT)
        data = " ".join(f"<{EX}s{i}> <{EX}p> {i} ." for i in range(20))
        first = engine.submit(f"INSERT DATA {{ GRAPH <{G}> {{ {data} }} }}")
        second = engine.submit(f"DELETE DATA {{ GRAPH <{G}> {{ {data} }} }}")
        first.result(30)
        second.result(30)
        assert engine.spus.counters["pipelined"] >= 1  # type: ignore[attr-defined]
        assert len(seen) == 2 and seen[-1].ended is not None
    finally:
        engine.close()


def test_the_subscriptions_of_this_process_are_not_bounded() -> None:
    """The gateway's own code (in-process, trusted) subscribes what it needs; a network client's
    subscription of the same shape shares its SPUs and is not bounded either."""
    engine = Engine(max_subscription_rows=100)
    trusted = watch(engine, PRODUCT, limited=False)
    network = watch(engine, PRODUCT)
    insert(engine, 0, 11)
    assert len(trusted[-1].added) == len(network[-1].added) == 121
    assert engine.spus.subscription_count == 2


def test_over_real_sockets_both_kinds_of_subscription_end_with_an_error_frame_and_the_socket_lives(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    gateway = start_gateway(toml="[websocket]\nmax_subscription_rows = 50\n")

    async def main() -> list[dict]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{gateway.ws_url}/subscribe") as ws:
            for alias, query in {"incremental": PRODUCT, "reevaluated": PRODUCT_REEVALUATED}.items():
                await ws.send_json({"subscribe": {"sparql": query, "alias": alias}})
                assert "notification" in json.loads((await ws.receive(timeout=10)).data)
            data = " ".join(f"<{EX}s{i}> <{EX}p> {i} ." for i in range(8))  # 64 rows each
            assert gateway.update(f"INSERT DATA {{ GRAPH <{G}> {{ {data} }} }}").status == 200
            frames = [json.loads((await ws.receive(timeout=20)).data) for _ in range(2)]
            await ws.send_json({"subscribe": {"sparql": f"SELECT ?s WHERE {{ GRAPH <{G}> {{ ?s ?p 0 }} }}"}})
            frames.append(json.loads((await ws.receive(timeout=10)).data))
            return frames

    *ended, alive = asyncio.run(main())
    assert sorted(frame["alias"] for frame in ended) == ["incremental", "reevaluated"], ended
    assert all("max_subscription_rows" in frame["error_description"] for frame in ended), ended
    assert len(alive["notification"]["addedResults"]["results"]["bindings"]) == 1
