"""One secure client cannot take every query worker: its queries and subscription probes past its
share (one less than the workers) wait their turn, and other clients' queries and subscribes are
served meanwhile (broker.scheduler.FairShare), over real TLS sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.appliance.config import Config
from tests.broker.gates.secure_support import SecureClient, receive, secure_config
from tests.broker.gates.test_secure_gates import run_secure
from tools.launcher import InProcessGateway

LIMIT_S = 2.0
HOG = {"identity": "hog", "read": ["*"], "write": []}
OTHER = {"identity": "other", "read": ["*"], "write": ["*"]}
ENDLESS = "SELECT (COUNT(*) AS ?n) WHERE { " + " ".join(f"?s{i} ?p{i} ?o{i} ." for i in range(15)) + " }"
EX = "http://example.org/"
_NUMBERS = " ".join(str(number) for number in range(400))
# an update that runs to a 1 s time limit (a product of three VALUES of 400)
SLOW_UPDATE = (
    f"INSERT {{ <{EX}h> <{EX}p> ?a }} WHERE {{ VALUES ?a {{ {_NUMBERS} }} VALUES ?b {{ {_NUMBERS} }} "
    f"VALUES ?c {{ {_NUMBERS} }} FILTER(?a + ?b + ?c < 0) }}"
)


def writers_with_a_1_s_limit() -> Config:
    """The hog and the other client, both writers, with a 1 s time limit."""
    config = secure_config(HOG | {"write": ["*"]}, OTHER)
    config.engine.time_limit_s = 1.0
    return config


def test_a_client_sending_endless_queries_leaves_a_worker_to_the_others(
    in_process_gateway: Callable[..., InProcessGateway],
) -> None:
    config = secure_config(HOG, OTHER)
    config.engine.time_limit_s = LIMIT_S
    config.engine.query_workers = 2
    gateway = in_process_gateway(config)

    async def test(client: SecureClient) -> None:
        hog, other = await client.login("hog"), await client.login("other")
        assert (await client.update(other, f"INSERT DATA {{ <{EX}a> <{EX}p> 1, 2, 3, 4 }}"))[0] == 200
        endless = [asyncio.create_task(client.query(hog, ENDLESS)) for _ in range(3)]
        await asyncio.sleep(0.3)  # the hog's queries have taken what they can
        answered: list[tuple[int, float]] = []
        ws = await client.socket()
        subscribe = {"sparql": f"SELECT ?o WHERE {{ <{EX}a> <{EX}p> ?o }}", "authorization": f"Bearer {other}"}
        await ws.send_json({"subscribe": subscribe})
        confirmed = await receive(ws, timeout=LIMIT_S + 5)
        while not all(task.done() for task in endless):
            started = time.monotonic()
            status, _ = await client.query(other, f"ASK {{ <{EX}a> ?p ?o }}")
            answered.append((status, time.monotonic() - started))
            await asyncio.sleep(0.05)
        await ws.close()
        hogged = [await task for task in endless]
        # the hog's three ran one after another, each to the time limit
        assert [(status, document["error"]) for status, document in hogged] == [(503, "timeout")] * 3, hogged
        assert "notification" in confirmed, confirmed
        assert len(answered) > 10 and {status for status, _ in answered} == {200}, answered
        # served at once but while a worker the hog's timeout killed is replaced
        assert sorted(waited for _, waited in answered)[len(answered) // 2] < 0.2, answered

    run_secure(gateway, test)
    metrics = gateway.metrics()
    assert metrics["sepa_query_client_share"] == 1 and metrics["sepa_query_client_share_waits_total"] >= 2


def test_a_client_whose_queries_cost_their_worker_waits_for_its_successor(
    in_process_gateway: Callable[..., InProcessGateway],
) -> None:
    """A replacement worker takes a while to load its replica (here 200,000 triples): the hog, whose
    endless queries each cost a worker, gets its turn back only once the successor is up, so it
    never holds the one worker left to the others while the other loads."""
    config = secure_config(HOG, OTHER)
    config.engine.time_limit_s = 1.0
    config.engine.query_workers = 2
    gateway = in_process_gateway(config)

    async def test(client: SecureClient) -> None:
        hog, other = await client.login("hog"), await client.login("other")
        for batch in range(20):
            triples = " ".join(f'<{EX}s{batch}_{i}> <{EX}p{i % 7}> "value {i} of {batch}" .' for i in range(10_000))
            assert (await client.update(other, f"INSERT DATA {{ {triples} }}"))[0] == 200
        stop = asyncio.Event()
        hogged: list[str] = []
        answered: list[int] = []

        async def hogging() -> None:
            while not stop.is_set():
                hogged.append((await client.query(hog, ENDLESS))[1]["error"])

        async def querying() -> None:
            # 8 s of it, and on until 20 answers: at load 8-10 (2026-12-07) 8 s gave 1-7 answers,
            # all 200, against "more than 20". What the hog's turn protects shows as 503s (a query
            # waits at most the time limit for a free worker), not as fewer answers.
            ends = time.monotonic() + 8
            while time.monotonic() < ends or len(answered) <= 20:
                answered.append((await client.query(other, f"ASK {{ <{EX}s1_1> ?p ?o }}"))[0])
                await asyncio.sleep(0.1)
            stop.set()

        tasks = [asyncio.create_task(each()) for each in (hogging, hogging, querying)]
        async with asyncio.timeout(300):
            await asyncio.gather(*tasks)
        assert len(hogged) >= 2 and set(hogged) <= {"timeout", "memory_limit"}, hogged
        assert len(answered) > 20 and set(answered) == {200}, answered

    run_secure(gateway, test)
    assert gateway.metrics()["sepa_query_worker_replaced_total"] >= 2


def test_a_client_sending_slow_updates_takes_turns_with_the_others(
    in_process_gateway: Callable[..., InProcessGateway],
) -> None:
    """Updates run one at a time. Before, in one queue in arrival order, one client's eight updates
    that each ran to the time limit held another client's update behind all of them (24 s at the
    default limit); now the clients' queued updates take turns (broker.serial_lanes), so it waits
    for the running one and one more: ~1.7 s (its reply also waited for the hog's next one, in
    the same group commit, until the group ended before a lane whose last call ran long: 2.7 s)."""
    gateway = in_process_gateway(writers_with_a_1_s_limit())

    async def test(client: SecureClient) -> None:
        hog, other = await client.login("hog"), await client.login("other")
        slow_updates = [asyncio.create_task(client.update(hog, SLOW_UPDATE)) for _ in range(8)]
        hog_replied: list[float] = []
        for task in slow_updates:
            task.add_done_callback(lambda _: hog_replied.append(time.monotonic()))
        await asyncio.sleep(0.3)  # the hog's updates are queued
        started = time.monotonic()
        status, reply = await client.update(other, f"INSERT DATA {{ <{EX}o> <{EX}p> 1 }}")
        replied = time.monotonic()
        hogged = [await task for task in slow_updates]
        assert status == 200, reply
        assert [(status, reply["error"]) for status, reply in hogged] == [(503, "timeout")] * 8, hogged
        assert replied < third_call_half_done(hog_replied), waits(started, replied, hog_replied)

    run_secure(gateway, test)


def third_call_half_done(replied: list[float]) -> float:
    """When the hog's third call, replied at `replied[2]`, was half through: half a call (the
    hog's last seven calls' mean, first reply to last) before its reply.

    Why in the hog's calls, not seconds: the other client's update replies with the hog's second
    call (~1.7 s), or with its third when a group commit holds it (2.7 s), or after all eight in
    arrival order (~7.7 s). At load 10-12 on the shared 2-core machine (2026-12-07) the hog's
    calls took 1.0-2.3 s each against the 1 s limit, and the reply came with its second call at
    1.79-2.41 s in 19 runs, past the fixed 2.4 s bar in 1 with the order right. Counted in the
    hog's own calls, the bar moves with them. Not the median gap between replies: with the
    group commit held, the hog's replies come in pairs, and half the gaps are nil."""
    call = (replied[-1] - replied[0]) / (len(replied) - 1)
    return replied[2] - call / 2


def waits(started: float, replied: float, hog_replied: list[float]) -> str:
    """The other client's wait and the hog's replies, in seconds from when it sent its update."""
    return f"waited {replied - started:.2f} s; the hog's replies at {[round(t - started, 2) for t in hog_replied]} s"


def test_a_clients_delayed_updates_falling_due_together_take_turns_with_the_others(
    in_process_gateway: Callable[..., InProcessGateway],
) -> None:
    """Delayed updates falling due ran ahead of every client's queued calls, 64 to a call: one
    client's eight slow ones due at the same instant held another client's update 16 s with a
    2 s limit. They go in their owner's lane now, and take turns like its other updates."""
    gateway = in_process_gateway(writers_with_a_1_s_limit())

    async def test(client: SecureClient) -> None:
        hog, other = await client.login("hog"), await client.login("other")
        for _ in range(8):
            status, reply = await client.update(hog, SLOW_UPDATE, delay="PT1S")
            assert status == 202, reply
        await asyncio.sleep(1.5)  # all eight are due, and the first is running
        started = time.monotonic()
        status, reply = await client.update(other, f"INSERT DATA {{ <{EX}o> <{EX}p> 1 }}")
        waited = time.monotonic() - started
        assert status == 200, reply
        # Ahead of every lane: the eight calls, ~7 s (8.76 s at load 11, 2026-12-07). Taking
        # turns: the running call's rest and one more, 1.24-2.21 s in 9 runs at load 9-12 against
        # the 2.4 s bar this had; 4 s stays half the way to the eight calls.
        assert waited < 4.0, waited

    run_secure(gateway, test)
