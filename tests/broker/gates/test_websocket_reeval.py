"""Re-evaluated subscriptions over a real socket: one client's expensive re-evaluations do not
hold other clients' updates (the re-evaluation worker, `[engine] reeval_workers`), and the
client still gets every notification, in order, the update's reply after them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from tests.support.bystander import served_meanwhile
from tools.launcher import RunningGateway

EX = "http://example.org/"
SLOW_QUADS = 40  # 40^4 rows counted per re-evaluation: ~0.4 s each on the test machine
SLOW = "{ SELECT (COUNT(*) AS ?n) WHERE { " + " ".join(f"?s{i} <{EX}slow> ?o{i} ." for i in range(4)) + " } }"


def _view(i: int) -> str:
    return f"SELECT ?s ?o ?n WHERE {{ ?s <{EX}p> ?o OPTIONAL {{ ?s <{EX}q> ?x }} {SLOW} FILTER(?s != <{EX}x{i}>) }}"


def test_other_clients_updates_are_not_held_by_one_clients_re_evaluations(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    # Limits far past the re-evaluations' ~1.6 s a matching update: on the shared machine at load
    # 6-13 (2026-12-07) the two matching updates took 22-39 s, and the test failed on limits that
    # are not its point: a re-evaluation past the time limit (a 503 frame: KeyError 'notification'),
    # a reply past the HTTP client's 30 s (TimeoutError), and the 30 s heartbeat, whose pings this
    # client, reading only after the replies, does not answer meanwhile (ClientConnectionResetError).
    gateway = start_gateway(
        toml="[engine]\nreeval_workers = 1\ntime_limit_s = 60\n"
        "[websocket]\nmax_reeval_seconds_per_client = 60\nheartbeat_s = 600\n"
    )
    slow = " ".join(f"<{EX}x{n}> <{EX}slow> {n} ." for n in range(SLOW_QUADS))
    assert gateway.update(f"INSERT DATA {{ {slow} }}").status == 200
    subscriptions = 4  # ~1.6 s of re-evaluation per matching update

    async def main() -> tuple[list[tuple[int, int]], float, list[float]]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{gateway.ws_url}/subscribe") as ws:
            for i in range(subscriptions):
                await ws.send_json({"subscribe": {"sparql": _view(i), "alias": f"v{i}"}})
            for _ in range(subscriptions):
                assert json.loads((await ws.receive(timeout=60)).data)["notification"]["sequence"] == 0
            # started by the first of them (until then the query workers re-evaluate, as with 0)
            await asyncio.to_thread(gateway.wait_for_metric, "sepa_reeval_workers", lambda n: n >= 1, 30)
            bystander = served_meanwhile(lambda n: gateway.update(f"INSERT DATA {{ <{EX}b{n}> <{EX}r> {n} }}"), 0.02)
            with bystander as served:
                started = time.perf_counter()
                try:
                    for value in range(2):
                        insert = f"INSERT DATA {{ <{EX}a{value}> <{EX}p> {value} }}"
                        reply = await asyncio.to_thread(gateway.update, insert, timeout=300)  # after ~1.6 s of them
                        assert reply.status == 200
                finally:
                    matching = time.perf_counter() - started
            latencies = served.waits
            # every notification arrived before the replies: in the socket already, in order
            frames = []
            while True:
                try:
                    message = await ws.receive(timeout=0.5)
                except TimeoutError:
                    break
                note = json.loads(message.data)["notification"]
                frames.append((int(note["alias"][1:]), note["sequence"]))
            return frames, matching, latencies

    frames, matching, latencies = asyncio.run(main())
    assert sorted(frames) == [(i, sequence) for i in range(subscriptions) for sequence in (1, 2)]
    for i in range(subscriptions):
        assert [sequence for alias, sequence in frames if alias == i] == [1, 2]
    assert matching > 1.0  # the re-evaluations were slow indeed...
    # ...and held no one else: most of the bystander's updates as quick as on an idle gateway, none
    # held for anything near the re-evaluations (with reeval_workers = 0 it waits for them: 3
    # updates in all, two of them held 14 and 17 s). A maximum under 0.3 s failed at load 6-11 (0.86 s of
    # 450 updates, 2026-12-07): the bar is on the median and on the maximum against the
    # re-evaluations' time, not on the tail one sample makes.
    assert len(latencies) > 10, latencies
    assert statistics.median(latencies) < 0.05 and max(latencies) < matching / 4, (matching, sorted(latencies)[-5:])


def _youngest_child(pid: int) -> int:
    """The process `pid` started last (the re-evaluation worker, started after the query workers)."""
    tasks = Path(f"/proc/{pid}/task").iterdir()  # each thread's children: workers start from several
    children = [int(child) for task in tasks for child in (task / "children").read_text().split()]
    return max(children, key=lambda child: int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[19]))


def test_a_re_evaluation_worker_killed_from_outside_does_not_end_the_subscription(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """The OOM killer or an operator kills the re-evaluation worker while it re-evaluates: the
    subscription is re-evaluated in a query worker and notified, not ended with evaluation_crashed."""
    gateway = start_gateway(
        toml="[engine]\nreeval_workers = 1\ntime_limit_s = 60\n[websocket]\nmax_reeval_seconds_per_client = 60\n"
    )
    slow = " ".join(f"<{EX}x{n}> <{EX}slow> {n} ." for n in range(20))
    assert gateway.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 . {slow} }}").status == 200

    async def main() -> tuple[dict, int]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{gateway.ws_url}/subscribe") as ws:
            await ws.send_json({"subscribe": {"sparql": _view(0), "alias": "v"}})
            assert json.loads((await ws.receive(timeout=60)).data)["notification"]["sequence"] == 0
            await asyncio.to_thread(gateway.wait_for_metric, "sepa_reeval_workers", lambda n: n >= 1, 30)
            worker = _youngest_child(gateway.process.pid)
            more = " ".join(f"<{EX}y{n}> <{EX}slow> {n} ." for n in range(40))  # 60^4 rows counted: seconds
            update = asyncio.create_task(asyncio.to_thread(gateway.update, f"INSERT DATA {{ {more} }}"))
            await asyncio.sleep(0.5)
            os.kill(worker, signal.SIGKILL)
            frame = json.loads((await asyncio.wait_for(ws.receive(), 60)).data)  # pings restart receive's timeout
            return frame, (await update).status

    frame, status = asyncio.run(main())
    assert status == 200
    assert "error" not in frame, frame
    assert frame["notification"]["sequence"] == 1, frame
    assert gateway.metrics()["sepa_subscriptions_ended_total"] == 0
