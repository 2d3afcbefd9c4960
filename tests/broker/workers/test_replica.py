"""A query worker's replica compacts on a thread of its own: it applies deltas and answers jobs
meanwhile, every delta reaches the compacted store, and the copy has room beside a job's memory
limit."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from pyoxigraph import Literal, NamedNode, Quad, RdfFormat, Store, serialize

from broker.compaction import CHECK_S
from broker.store import RdfStore
from broker.workers import backlog, replica
from broker.workers.replica import serve
from tests.broker.workers.conftest import EX, nquads

COUNT = f"SELECT (COUNT(*) AS ?n) WHERE {{ ?s <{EX}p> ?o }}"


class Replica:
    """`serve` on a thread, spoken to over a real socket pair as the pool speaks to it."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.connection = Connection(ours.detach())
        self.thread = threading.Thread(target=serve, args=(Connection(theirs.detach()), ()), daemon=True)
        self.thread.start()

    def query(self, sparql: str, timeout: float = 10.0) -> list[str]:
        """The first column of `sparql`'s rows, as the replica answers it within `timeout`."""
        self.connection.send(("job", "materialized", (sparql,), {}, None))
        for expected in ("started", "ok"):
            assert self.connection.poll(timeout), f"the replica answered no job in {timeout} s"
            reply = self.connection.recv()
            assert reply[0] == expected, reply
        return [row[0].value for row in reply[1].rows]

    def close(self) -> None:
        self.connection.close()
        self.thread.join(30)


def test_a_replica_answers_jobs_while_it_compacts_and_keeps_every_delta(held_compaction) -> None:
    copying, release, compacted = held_compaction
    worker = Replica()
    try:
        worker.connection.send(("seed", "memory", nquads(range(1000)), ()))
        assert worker.connection.poll(10) and worker.connection.recv() == ("ready",)
        # every quad replaced twice: 2,000 dead for 1,000 live, where the gateway would compact and
        # a replica does not (REPLICA_DEAD_PER_LIVE: not at the gateway's moment); 500 more added and
        # removed: 2,500 dead, a compaction is due. A job after each delta: a backlog of them would
        # be netted (broker.workers.backlog), and quads added and removed within it are no dead versions
        worker.connection.send(("apply", [(nquads(range(1000, 2000)), nquads(range(1000)), (), ())]))
        assert worker.query(COUNT) == ["1000"]
        worker.connection.send(("apply", [(nquads(range(2000, 3000)), nquads(range(1000, 2000)), (), ())]))
        assert worker.query(COUNT) == ["1000"]
        assert not copying.wait(3 * CHECK_S), "a replica compacted at the gateway's ratio"
        worker.connection.send(("apply", [(nquads(range(5000, 5500)), nquads([]), (), ())]))
        assert worker.query(COUNT) == ["1500"]
        worker.connection.send(("apply", [(nquads([]), nquads(range(5000, 5500)), (), ())]))
        assert worker.query(COUNT) == ["1000"]
        assert copying.wait(10), "no compaction began"
        # while the copy is under way: a delta, then a job that must see it (before: no answer until the copy ended)
        worker.connection.send(("apply", [(nquads([3000]), nquads([2000]), (), ())]))
        assert worker.query(COUNT) == ["1000"]
        assert worker.query(f"SELECT ?o WHERE {{ <{EX}s3000> ?p ?o }}") == ["3000"]
        assert not compacted.is_set()
        release.set()
        assert compacted.wait(10)
        # the compacted store holds the delta applied during the copy, and takes the next ones
        worker.connection.send(("apply", [(nquads([3001]), nquads([2001]), (), ())]))
        numbers = worker.query(f"SELECT ?o WHERE {{ ?s <{EX}p> ?o }} ORDER BY ?o")
        assert numbers == [str(n) for n in [*range(2002, 3000), 3000, 3001]]
    finally:
        worker.close()


def values(*numbers: int) -> bytes:
    """<s0> <p> n for each of `numbers`: one subject's latest value, replaced by each reading."""
    quads = [Quad(NamedNode(f"{EX}s0"), NamedNode(f"{EX}p"), Literal(n)) for n in numbers]
    return serialize(quads, format=RdfFormat.N_QUADS)


def test_a_replica_applies_its_deltas_netted_once_a_job_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    """100 deltas each replacing the value the one before added (a sensor's latest view) reach the
    store as one: the first value removed, the last added, the 98 between never stored (before:
    100 applies, 100 quads loaded and 100 removed, each a dead version). The job sees the last."""
    applied: list[tuple[bytes, bytes]] = []
    apply_nquads = RdfStore.apply_nquads

    def counted(store: RdfStore, added: bytes, removed: bytes, *rest: Any) -> None:
        applied.append((added, removed))
        apply_nquads(store, added, removed, *rest)

    monkeypatch.setattr(RdfStore, "apply_nquads", counted)
    monkeypatch.setattr(backlog, "MAX_AGE_S", 600.0)  # only the job applies them
    worker = Replica()
    try:
        worker.connection.send(("seed", "memory", values(0), ()))
        assert worker.connection.poll(10) and worker.connection.recv() == ("ready",)
        for n in range(1, 101):
            worker.connection.send(("apply", [(values(n), values(n - 1), (), ())]))
        assert worker.query(f"SELECT ?o WHERE {{ <{EX}s0> ?p ?o }}") == ["100"]
        assert applied == [(values(100), values(0))]
    finally:
        worker.close()


def test_a_replica_applies_its_deltas_without_a_job_once_they_waited(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet replica does not keep its backlog for the next job (which would wait for it, and the
    replica's memory would hold it meanwhile): past MAX_AGE_S it applies it."""
    applied = threading.Event()
    apply_nquads = RdfStore.apply_nquads

    def counted(store: RdfStore, *args: Any) -> None:
        apply_nquads(store, *args)
        applied.set()

    monkeypatch.setattr(RdfStore, "apply_nquads", counted)
    monkeypatch.setattr(backlog, "MAX_AGE_S", 0.2)
    worker = Replica()
    try:
        worker.connection.send(("seed", "memory", values(0), ()))
        assert worker.connection.poll(10) and worker.connection.recv() == ("ready",)
        worker.connection.send(("apply", [(values(1), values(0), (), ())]))
        assert applied.wait(30), "the backlog waited for a job"
        assert worker.query(f"SELECT ?o WHERE {{ <{EX}s0> ?p ?o }}") == ["1"]
    finally:
        worker.close()


BOUND_SCRIPT = textwrap.dedent(
    """
    import threading
    from broker.workers.replica import MemoryBound, data_bytes
    replica = bytearray(b"x" * (64 << 20))  # the replica's store, held (written: counted as data)
    bound = MemoryBound(8 << 20)
    in_job, copied = threading.Event(), threading.Event()
    outcome = []

    def copy():
        in_job.wait()
        with bound.compaction():
            try:
                outcome.append(len(bytearray(b"x" * (32 << 20))))  # its live part copied, beside the job
            except MemoryError:
                outcome.append("MemoryError")
        copied.set()

    threading.Thread(target=copy).start()
    with bound.job():
        in_job.set()
        copied.wait()
        try:
            bytearray(data_bytes() + (64 << 20))  # past its limit and the reservation both
            job = "allocated"
        except MemoryError:
            job = "MemoryError"
    print(outcome[0], job)
    """
)


def test_a_compaction_beside_a_bounded_job_has_room_for_its_copy() -> None:
    """In a process of its own (RLIMIT_DATA is the process's), holding a 64 MB replica: a job bounded
    to 8 MB is running when the compaction begins; the compaction's 32 MB copy is made; the job, after it, is bounded by
    its own limit plus the reservation (the process's size then) and no more."""
    done = subprocess.run([sys.executable, "-c", BOUND_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    copied, job = done.stdout.split()
    assert copied == str(32 << 20)
    assert job == "MemoryError"


def test_without_a_limit_nothing_is_reserved() -> None:
    bound = replica.MemoryBound(0)
    with bound.compaction(), bound.job():
        assert bound._reserved == 0


def test_a_replica_seeded_with_its_count_takes_it_rather_than_counting_its_quads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A checkpoint's seed may carry how many quads it holds (`RdfStore.backup`): the replica's
    compactor starts from that count, where counting it was a full scan of the store at every start
    on RocksDB (1.2 s of CPU in each worker for 2.4 million quads). A count that differs from the
    replica's own shows which was taken; without one the replica counts, as before."""
    store = Store(str(tmp_path / "replica"))
    store.extend(Quad(NamedNode(f"{EX}s{n}"), NamedNode(f"{EX}p"), Literal(n)) for n in range(3))
    store.flush()
    del store
    told: list[int] = []

    class Recording(replica.Compactor):
        def __init__(self, *args: Any, live: int = 0, **kwargs: Any) -> None:
            told.append(live)
            super().__init__(*args, live=live, **kwargs)

    monkeypatch.setattr(replica, "Compactor", Recording)
    seeds = [("seed", "directory", str(tmp_path / "replica"), (), 7_000_000), ("seed", "memory", nquads(range(4)), ())]
    for message in seeds:
        worker = Replica()
        try:
            worker.connection.send(message)
            assert worker.connection.poll(10) and worker.connection.recv() == ("ready",)
        finally:
            worker.close()
    assert told == [7_000_000, 4]
