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

from broker.compaction import CHECK_S
from broker.workers import replica
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
        # removed: 2,500 dead, a compaction is due
        worker.connection.send(("apply", [(nquads(range(1000, 2000)), nquads(range(1000)), (), ())]))
        worker.connection.send(("apply", [(nquads(range(2000, 3000)), nquads(range(1000, 2000)), (), ())]))
        assert worker.query(COUNT) == ["1000"]
        assert not copying.wait(3 * CHECK_S), "a replica compacted at the gateway's ratio"
        worker.connection.send(("apply", [(nquads(range(5000, 5500)), nquads([]), (), ())]))
        worker.connection.send(("apply", [(nquads([]), nquads(range(5000, 5500)), (), ())]))
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
