"""A gateway in parallel mode (``[engine] mode = "parallel"``), over real sockets.

What it protects: the installed service's path in parallel mode: concurrent HTTP updates that the
BOOSTER workers process (counted on /metrics), WebSocket subscriptions that get every notification
in order, each update's reply only once its notifications were sent, and views rebuilt from the
notifications that equal the query endpoint's answer. And on a single core, parallel mode starts
no worker at all (it would only take turns with the engine for the core).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from tests.broker.gates.subscribe_support import RunningGateway, metric_now, receive_json, subscribe
from tests.polling import wait_until

EX = "http://example.org/parallel/"
ROOMS = 3
SENSORS = 40  # per room: a room's update changes 80 quads, well past a job's minimum
PARALLEL = '[engine]\nmode = "parallel"\nworkers = 1\n\n[http]\nhost = "127.0.0.1"\n'
ROOM_QUERY = f"SELECT ?sensor ?value WHERE {{ ?sensor <{EX}in> <{EX}room%d> . ?sensor <{EX}value> ?value }}"


def set_room(room: int, value: int) -> str:
    return (
        f"DELETE {{ ?sensor <{EX}value> ?old }} INSERT {{ ?sensor <{EX}value> {value} }} "
        f"WHERE {{ ?sensor <{EX}in> <{EX}room{room}> . ?sensor <{EX}value> ?old }}"
    )


def dataset() -> str:
    triples = " ".join(
        f"<{EX}s{room}-{index}> <{EX}in> <{EX}room{room}> . <{EX}s{room}-{index}> <{EX}value> 0 ."
        for room in range(ROOMS)
        for index in range(SENSORS)
    )
    return f"INSERT DATA {{ {triples} }}"


def rows(bindings: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(row["sensor"]["value"], row["value"]["value"]) for row in bindings}


async def query_rows(session: aiohttp.ClientSession, gateway: RunningGateway, room: int) -> set[tuple[str, str]]:
    headers = {"Accept": "application/sparql-results+json"}
    async with session.post(gateway.query_url, data={"query": ROOM_QUERY % room}, headers=headers) as response:
        assert response.status == 200
        return rows(json.loads(await response.text())["results"]["bindings"])


def test_concurrent_updates_through_the_workers_notify_every_subscriber_in_order(
    start_gateway: Any,
) -> None:
    gateway = start_gateway(toml=PARALLEL)

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.post(gateway.update_url, data={"update": dataset()}) as response:
                assert response.status == 200
            sockets = [await session.ws_connect(gateway.subscribe_url) for _ in range(ROOMS)]
            views = []
            for room, ws in enumerate(sockets):
                first = await subscribe(ws, {"sparql": ROOM_QUERY % room, "alias": f"room{room}"})
                views.append(rows(first["addedResults"]["results"]["bindings"]))
            updates = [set_room(step % ROOMS, step + 1) for step in range(12)]
            sequences: list[list[int]] = [[] for _ in range(ROOMS)]

            async def reader(room: int) -> None:
                while len(sequences[room]) < 4:
                    notification = (await receive_json(sockets[room], timeout=30))["notification"]
                    sequences[room].append(notification["sequence"])
                    views[room] -= rows(notification["removedResults"]["results"]["bindings"])
                    views[room] |= rows(notification["addedResults"]["results"]["bindings"])

            readers = [asyncio.create_task(reader(room)) for room in range(ROOMS)]
            replies = await asyncio.gather(
                *(session.post(gateway.update_url, data={"update": update}) for update in updates)
            )
            assert all(reply.status == 200 for reply in replies)
            await asyncio.wait_for(asyncio.gather(*readers), 30)
            assert sequences == [[1, 2, 3, 4]] * ROOMS
            for room in range(ROOMS):
                assert views[room] == await query_rows(session, gateway, room)
            assert await metric_now(session, gateway, "sepa_parallel_pipelined_total") >= 1
            assert await metric_now(session, gateway, "sepa_parallel_workers") == 1
            assert await metric_now(session, gateway, 'sepa_engine_info{mode="parallel"}') == 1
            for ws in sockets:
                await ws.close()

    asyncio.run(scenario())


CHILD = """
import os
from broker.core.engine import Engine
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
engine = Engine(mode="parallel", boosters=1)
engine.update(DATASET)
seen = []
engine.subscribe(QUERY, seen.append)
result = engine.update(UPDATE)
print(len(engine.spus.boosters), engine.spus.counters["pipelined"], engine.spus.counters["single_core"], len(seen))
engine.close()
"""


def test_on_one_core_parallel_mode_starts_no_worker(tmp_path: Path) -> None:
    code = (
        CHILD.replace("DATASET", repr(dataset()))
        .replace("QUERY", repr(ROOM_QUERY % 0))
        .replace("UPDATE", repr(set_room(0, 5)))
    )
    root = str(Path(__file__).resolve().parents[3])
    environment = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environment)
    assert done.returncode == 0, done.stderr[-2000:]
    workers, pipelined, single_core, notified = map(int, done.stdout.split())
    assert (workers, pipelined, single_core, notified) == (0, 0, 1, 2)


def _boosters(pid: int) -> list[int]:
    """The BOOSTER worker processes among `pid`'s children."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"broker.workers.booster" in command:
            found.append(int(entry.name))
    return found


def test_health_is_not_ready_while_a_booster_worker_is_dead_and_ready_once_it_is_replaced(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """An attack pass killed a worker: /health said ready while updates were held."""
    gateway = start_gateway(toml=PARALLEL)

    def engine_health() -> tuple[int, dict[str, Any]]:
        reply = gateway.request("GET", "/health")
        return reply.status, reply.json()["components"]["engine"]

    assert gateway.update(dataset()).status == 200
    status, engine = engine_health()
    assert status == 200 and engine["detail"].startswith("parallel mode: 0 of 0 BOOSTER workers alive"), engine

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as ws:
            await subscribe(ws, {"sparql": ROOM_QUERY % 0, "alias": "room0"})  # the workers start
            status, engine = engine_health()
            assert status == 200 and "1 of 1 BOOSTER workers alive" in engine["detail"], engine
            [booster] = _boosters(gateway.process.pid)
            os.kill(booster, signal.SIGKILL)
            wait_until(lambda: engine_health()[0] == 503)
            status, engine = engine_health()
            assert engine["status"] == "failing" and "0 of 1 BOOSTER workers alive" in engine["detail"], engine
            # an update that concerns no worker: the dead one is found and replaced all the same
            assert gateway.update(set_room(1, 9)).status == 200
            status, engine = engine_health()
            assert status == 200 and "1 of 1 BOOSTER workers alive" in engine["detail"], engine
            assert "1 died and 1 recoveries" in engine["detail"]
            assert _boosters(gateway.process.pid) not in ([], [booster])

    asyncio.run(scenario())
