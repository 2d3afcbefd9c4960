"""The query worker's process: a replica of the store that evaluates jobs, and can be killed.

Run as ``python -m broker.workers.replica FD MEMORY [SERVICE...]``: FD is its end of a socket pair
to the broker, MEMORY the bytes one job may allocate (0: no limit, see :class:`MemoryBound`),
SERVICE the endpoints a query may call. It
receives, in order, one snapshot (``seed``), then the deltas the store applied (``apply``, in
order as N-Quads, :func:`broker.workers.pool.batched`) and jobs (``job``, :mod:`broker.workers.jobs`), each
answered with one reply. A job sees every delta sent before it, so it sees what the store held
when it was sent: the deltas wait in a netted backlog (:class:`broker.workers.backlog.Backlog`)
until a job comes, or MAX_AGE_S or MAX_BYTES pass, and the job's time limit starts once they
are applied.

Nothing here is shared with the broker's process; a job that never ends, or crashes pyoxigraph,
costs this process only (:mod:`broker.workers.pool` kills and replaces it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from broker.compaction import REPLICA_DEAD_PER_LIVE, Compactor
from broker.core.query_processor import QueryProcessor
from broker.errors import MemoryLimitExceeded, SepaError
from broker.sparql.limits import WORKER_STACK_BYTES
from broker.workers.backlog import Backlog
from broker.workers.cpus import use_every_cpu
from broker.workers.jobs import JOBS
from broker.workers.seeding import PR_SET_PDEATHSIG, received, seeded, seeded_quads

NICENESS = 10
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
TRIM_BYTES = 32 << 20  # a job that grew the process by more gives it back (malloc_trim) when done


_STATM = os.open("/proc/self/statm", os.O_RDONLY)  # read again at offset 0: 1.9 us, where open() took 12.8


def data_bytes() -> int:
    """The process's private writable memory (heap, anonymous mappings, stacks): what RLIMIT_DATA bounds."""
    return int(os.pread(_STATM, 256, 0).split()[5]) * PAGE_BYTES


class MemoryBound:
    """What one job may allocate (`extra_bytes` more than the process holds when it starts; 0: no
    limit), with the replica's compaction running beside it.

    Why: an evaluation is bounded in time, but pyoxigraph allocates as fast as it computes: an ORDER
    BY over a product of three VALUES of 1,000 took a worker to 4.6 GB in its 10 s, a CONCAT doubling
    a string to 3.8 GB; on a 1 GB board that is the OOM killer, or the board swapping, from one read
    request. RLIMIT_DATA makes such an allocation fail: Python raises MemoryError (answered as
    :class:`MemoryLimitExceeded`), Rust aborts the process (SIGABRT; the pool replaces it and answers
    the same, :meth:`broker.workers.pool.QueryWorkers.run`). The limit is relative to what the
    process holds when the job starts, so a replica that grew with the store is not counted against
    its jobs; applying deltas runs without it. Measured: ~7 us a job (/proc/self/statm read twice,
    three rlimit calls), against a job's ~150 us round trip.

    RLIMIT_DATA is the process's, and the replica compacts on a thread of its own (see
    :func:`serve`): a compaction's copy of the store (tens of MB) counted against a job running
    beside it would fail that job, or abort the process inside the copy. So a compaction reserves
    what the process holds when it starts (more than the copy needs: the copy holds the live quads
    of a store that holds dead ones too), added to the limit of a job running or starting while it
    lasts. A job's limit is not lowered when the compaction ends (the job may still read the old
    store, which is then not freed): a job overlapping a compaction may take up to the reservation
    more than `extra_bytes`, which is the memory a compaction alone takes anyway."""

    def __init__(self, extra_bytes: int) -> None:
        self.extra_bytes = extra_bytes
        self._lock = threading.Lock()
        self._reserved = 0  # by compactions under way
        self._job_limit: int | None = None  # the running job's own limit (before any reservation)

    def _set(self, soft: int) -> None:
        """The soft limit at `soft`, at most the hard one (hold _lock)."""
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))

    @contextlib.contextmanager
    def job(self) -> Iterator[None]:
        """Within it, the process may allocate `extra_bytes` more than it holds now (and what a
        compaction reserved); one job at a time (the replica's serving thread)."""
        if not self.extra_bytes:
            yield
            return
        before = data_bytes()
        with self._lock:
            self._job_limit = before + self.extra_bytes
            self._set(self._job_limit + self._reserved)
        try:
            yield
        finally:
            with self._lock:
                self._job_limit = None
                _, hard = resource.getrlimit(resource.RLIMIT_DATA)
                resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
            if data_bytes() > before + TRIM_BYTES:
                with contextlib.suppress(OSError, AttributeError):
                    ctypes.CDLL(None).malloc_trim(0)

    @contextlib.contextmanager
    def compaction(self) -> Iterator[None]:
        """Within it, a job's limit leaves room for a copy of the store (see the class docstring)."""
        if not self.extra_bytes:
            yield
            return
        reserve = data_bytes()
        with self._lock:
            self._reserved += reserve
            if self._job_limit is not None:
                self._set(self._job_limit + self._reserved)
        try:
            yield
        finally:
            with self._lock:
                self._reserved -= reserve


def reply_for(processor: QueryProcessor, message: tuple[Any, ...], bound: MemoryBound) -> tuple[Any, ...]:
    """Run one job within `bound`; its reply: ``("ok", value)``, or the error as (kind, class
    name, description)."""
    _, name, args, kwargs, micros = message
    clock = processor.store.clock
    clock.pin(micros)
    try:
        with bound.job():
            value = JOBS[name](processor, *args, **kwargs)
        return ("ok", value)
    except MemoryError:
        return ("sepa", MemoryLimitExceeded.__name__, MemoryLimitExceeded.past(bound.extra_bytes).description)
    except SepaError as error:
        return ("sepa", type(error).__name__, error.description)
    except SyntaxError as error:
        return ("syntax", "SyntaxError", str(error))
    except Exception as error:  # noqa: BLE001 - whatever pyoxigraph raised, the broker gets one line
        return ("sepa", "InvalidRequest", f"query evaluation failed: {str(error)[:300]}")
    finally:
        clock.unpin()


def serve(connection: Connection, service_allow: tuple[str, ...], memory_bytes: int = 0) -> None:
    """Apply deltas and answer jobs, each allocating at most `memory_bytes`, until the broker closes its end.

    Dead versions grow in a replica as in the store, and a thread of its own compacts it, as in the
    gateway (:mod:`broker.compaction`): deltas and jobs go on meanwhile, and the jobs' memory limit
    leaves room for the copy (:class:`MemoryBound`); the deltas that come meanwhile are loaded and
    kept for the copy as N-Quads (:class:`broker.store.live_copy.Recording`). Measured as installed, at 1,000
    readings/s with a SPARQL query every 100 ms for 60 s (4 compactions; 2 runs alternated with the
    build before, where the replica compacted between messages): the slowest query 277 and 397 ms
    against 1,526 and 1,550; p99 130 and 174 ms against 1,029 and 652; queries past 500 ms 0 and 0
    against 7 and 5; the median 10.6 and 13.2 ms against 14.6 and 11.6."""
    processor: QueryProcessor | None = None
    compactor: Compactor | None = None
    bound = MemoryBound(memory_bytes)
    backlog = Backlog()
    try:
        for message in received(connection, backlog.wait_s):
            kind = message[0]
            if kind == "apply":
                assert processor is not None
                for added, removed, created, dropped in message[1]:
                    # a large part follows the message raw (broker.workers.pool.Worker._send_raw)
                    added = connection.recv_bytes() if added is None else added
                    removed = connection.recv_bytes() if removed is None else removed
                    backlog.receive(processor.store, added, removed, created, dropped)
            elif kind == "idle":  # the backlog waited MAX_AGE_S for a job
                assert processor is not None
                backlog.apply(processor.store)
            elif kind == "job":
                assert processor is not None
                backlog.apply(processor.store)
                connection.send(("started",))  # the deltas before it are applied: its time limit starts now
                connection.send(reply_for(processor, message, bound))
            elif kind == "jobs":  # QueryWorkers.dispatch: one message for many, answered one by one
                assert processor is not None
                backlog.apply(processor.store)
                _, name, calls, micros = message
                for args, kwargs in calls:
                    connection.send(("started",))
                    connection.send(reply_for(processor, ("job", name, args, kwargs, micros), bound))
            elif kind == "seed":
                processor = QueryProcessor(seeded(message, connection), service_allow=service_allow)
                # told how many quads it holds: one thread, 20 ms for 334k in memory
                compactor = Compactor(
                    processor.store,
                    live=seeded_quads(message, processor.store),
                    around=bound.compaction,
                    dead_per_live=REPLICA_DEAD_PER_LIVE,
                )
                compactor.start()
                connection.send(("ready",))
    finally:
        if compactor is not None:
            compactor.close()


def main() -> None:
    with contextlib.suppress(OSError, AttributeError):  # die with the broker, even when it is killed
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is for the broker to handle
    use_every_cpu()
    # below the broker: a replica catching up on 200,000 quads took both cores of the test machine
    # from ingestion (bench mqtt's p99 15 -> 190 ms); the broker's own threads come first
    os.nice(NICENESS)
    sock = socket.socket(fileno=int(sys.argv[1]))
    connection = Connection(sock.detach())
    memory_bytes = int(sys.argv[2])
    service_allow = tuple(sys.argv[3:])
    # the evaluator recurses as deep as in the broker's engine threads: same stack size
    threading.stack_size(WORKER_STACK_BYTES)
    thread = threading.Thread(target=serve, args=(connection, service_allow, memory_bytes), name="sepa-replica")
    thread.start()
    thread.join()


if __name__ == "__main__":
    main()
