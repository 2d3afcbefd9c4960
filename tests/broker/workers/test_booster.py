"""A BOOSTER worker's replica compacts on a thread of its own: it answers jobs meanwhile, and every
delta reaches the compacted store."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

import pytest
from pyoxigraph import Literal, NamedNode, Quad

from broker.workers import booster
from broker.workers.booster import Booster, serve
from tests.broker.workers.conftest import EX, nquads


def boost(connection: Connection, added: bytes, removed: bytes, timeout: float = 10.0) -> tuple[object, ...]:
    """A job with no hits (the pre and post phases find nothing): its reply, within `timeout`."""
    connection.send(("boost", 0, [], [], [(added, removed, (), ())], [], None))
    assert connection.poll(timeout), f"the BOOSTER worker answered no job in {timeout} s"
    return connection.recv()


def test_a_booster_answers_jobs_while_its_replica_compacts_and_keeps_every_delta(
    held_compaction, monkeypatch: pytest.MonkeyPatch
) -> None:
    copying, release, compacted = held_compaction
    made: list[Booster] = []

    class Kept(Booster):
        def __init__(self, *args: object) -> None:
            super().__init__(*args)  # type: ignore[arg-type]
            made.append(self)

    monkeypatch.setattr(booster, "Booster", Kept)
    ours, theirs = socket.socketpair()
    connection = Connection(ours.detach())
    thread = threading.Thread(target=serve, args=(Connection(theirs.detach()),), daemon=True)
    thread.start()
    try:
        connection.send(("seed", "memory", nquads(range(1000)), ()))
        assert connection.poll(10) and connection.recv() == ("ready",)
        # every quad replaced twice: 2,000 dead for 1,000 live, a compaction is due
        connection.send(("apply", [(nquads(range(1000, 2000)), nquads(range(1000)), (), ())]))
        assert boost(connection, nquads(range(2000, 3000)), nquads(range(1000, 2000)))[0] == "boosted"
        assert copying.wait(10), "no compaction began"
        # while the copy is under way: a job is answered (before: not until the copy ended), and its delta kept
        assert boost(connection, nquads([3000]), nquads([2000]))[0] == "boosted"
        assert not compacted.is_set()
        release.set()
        assert compacted.wait(10)
        assert boost(connection, nquads([3001]), nquads([2001]))[0] == "boosted"
        store = made[0].store
        p = NamedNode(f"{EX}p")
        assert sorted(quad.object.value for quad in store.ox.quads_for_pattern(None, p, None)) == sorted(
            str(n) for n in [*range(2002, 3000), 3000, 3001]
        )
        assert Quad(NamedNode(f"{EX}s3000"), p, Literal(3000)) in store.ox
    finally:
        connection.close()
        thread.join(30)
    assert not thread.is_alive()


@pytest.mark.parametrize("module", ["broker.workers.booster", "broker.workers.replica"])
def test_a_worker_process_starts_without_importing_the_engine(module: str) -> None:
    """Every worker process imports its module afresh (`python -m`), at start and at each respawn: a
    parallel subscription's first BOOSTER, a query worker replaced after a time limit. Importing the
    scheduler for one constant brought in the engine, 0.99 s of the booster's import here (0.60 s
    without it; several times that on a Raspberry Pi), and ~280 s of the suite's differential test in
    parallel mode, which starts one BOOSTER per example. Neither parses an update: the update
    parser's imports (fast_blocks' regular expressions, compiled at import) were then about half of
    what was left (user time of the import 0.57-0.65 s with them, 0.23-0.35 s without, load 9)."""
    heavy = "('broker.scheduler', 'broker.core.engine', 'broker.sparql.update_parser', 'broker.sparql.fast_blocks')"
    code = f"import sys, {module}; print(sorted(m for m in {heavy} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout
