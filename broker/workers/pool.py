"""Query workers: evaluation that a wall-clock limit can really stop.

pyoxigraph cannot interrupt an evaluation (no timeout, no cancellation in its Python API; upstream
oxigraph issue #1336), and a thread cannot be killed. So the evaluations a client controls run in
worker processes, each holding a replica of the store (:mod:`broker.workers.replica`): a job past
its limit gets its worker killed (SIGKILL: the core is free at once) and replaced, and the client
gets :class:`~broker.errors.TimeLimitExceeded`. A job that crashes pyoxigraph kills a worker, not
the gateway (:class:`~broker.errors.EvaluationCrashed`).

What runs here: SPARQL Protocol queries, the in-process API's queries, the first evaluation of every
subscription (before the update thread evaluates it for real) and the WHERE clauses of updates
that are not a plain BGP (those run on the engine's own evaluator, which counts its steps).

A replica starts from a snapshot taken atomically with its registration as a follower of the store
(:meth:`broker.store.RdfStore.follow`): in memory, the store dumped as N-Quads; on disk, a RocksDB
checkpoint (hard links, milliseconds) in `replicas/` of the data directory. It then applies every
delta in order, so a job sees exactly what the store held when the job was sent.

Costs, measured on the test machine: a worker process is ~40 MB plus its replica (a full copy of
an in-memory store; a checkpoint on disk shares the store's files and costs its own cache only);
a job adds one round trip over a socket pair (~0.15 ms for a small query); each update's delta is
encoded once for all workers (the journal record of an on-disk store: encoded anyway).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pyoxigraph import RdfFormat

import broker
from broker.errors import EvaluationCrashed, InvalidRequest, SepaError, TimeLimitExceeded
from broker.store import RdfStore

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # a replica of a large in-memory store takes a while to load
_PACKAGE_ROOT = str(Path(broker.__file__).resolve().parent.parent)


def _sepa_errors() -> dict[str, type[SepaError]]:
    """Every SepaError class by name (the gates define some of their own, NotAcceptable...)."""
    found: dict[str, type[SepaError]] = {}
    pending = [SepaError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.__name__, cls)
        pending += cls.__subclasses__()
    return found


def _error(kind: str, name: str, description: str) -> Exception:
    """The exception a worker reported, rebuilt here (by name: exceptions are not pickled across)."""
    if kind == "syntax":
        return SyntaxError(description)
    cls = _sepa_errors().get(name, InvalidRequest)
    error = cls.__new__(cls)
    Exception.__init__(error, description)
    error.description = description
    return error


class Worker:
    """One worker process, its end of the socket pair, and the thread that feeds it in order."""

    def __init__(self, name: str, service_allow: tuple[str, ...], checkpoint: Path | None) -> None:
        self.name = name
        self.checkpoint = checkpoint
        ours, theirs = socket.socketpair()
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, environment.get("PYTHONPATH")]))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "broker.workers.replica", str(theirs.fileno()), *service_allow],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=environment,
            )
        finally:
            theirs.close()
        self.connection = Connection(ours.detach())
        self.outbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self.deliver = self._deliver  # bound once: the store unfollows this very object
        self._writer = threading.Thread(target=self._write, name=f"{name}-feed", daemon=True)
        self._writer.start()

    def _write(self) -> None:
        while (message := self.outbox.get()) is not None:
            try:
                self.connection.send(message)
            except OSError:  # the worker is gone; whoever waits on it finds out
                return

    def follow(self, store: RdfStore) -> None:
        """Send the snapshot, registered as the store's follower in the same instant."""
        store.follow(self._snapshot, self.deliver)

    def _deliver(self, entry: bytes) -> None:
        self.outbox.put(("apply", entry))

    def _snapshot(self, store: RdfStore) -> None:
        if self.checkpoint is not None:
            store.ox.backup(str(self.checkpoint))
            self.outbox.put(("seed", "directory", str(self.checkpoint), ()))
        else:
            graphs = tuple(graph.value for graph in store.ox.named_graphs())
            self.outbox.put(("seed", "memory", store.ox.dump(format=RdfFormat.N_QUADS), graphs))

    def wait_ready(self) -> None:
        if not self.connection.poll(READY_TIMEOUT_S) or self.connection.recv() != ("ready",):
            raise OSError(f"query worker {self.name} did not start")

    def kill(self) -> None:
        """Kill the process, then close the connection once the feeding thread is done with it (its
        descriptor number is reused at once by the next worker's socket)."""
        self.outbox.put(None)
        try:
            self.process.kill()
            self.process.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self._writer.join(5)
        self.connection.close()
        if self.checkpoint is not None:
            shutil.rmtree(self.checkpoint, ignore_errors=True)


class QueryWorkers:
    """A fixed number of workers; :meth:`run` runs one job on an idle one under a time limit.

    Thread-safe: called from the query threads and from the update thread. Counters (jobs,
    timeouts, crashes, busy, replaced) are in :attr:`stats`.
    """

    def __init__(
        self, store: RdfStore, *, count: int = 2, time_limit_s: float = 10.0, service_allow: tuple[str, ...] = ()
    ) -> None:
        if count < 1:
            raise ValueError("at least one query worker")
        self.store = store
        self.count = count
        self.time_limit_s = time_limit_s
        self.service_allow = tuple(service_allow)
        self.stats: Counter[str] = Counter()
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._workers: set[Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._generation = 0
        self._checkpoints = store.path / "replicas" if store.path is not None else None
        # every worker is started from this one thread, alive as long as the pool: a worker dies
        # with the thread that started it (PR_SET_PDEATHSIG), so that it never outlives the gateway
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="sepa-worker-spawn")

    def start(self) -> None:
        """Start every worker and wait until each holds its replica."""
        if self._checkpoints is not None:
            shutil.rmtree(self._checkpoints, ignore_errors=True)  # left by a killed gateway
            self._checkpoints.mkdir(parents=True)
        started = [self._spawner.submit(self._spawn).result() for _ in range(self.count)]
        for worker in started:
            worker.wait_ready()
            self._idle.put(worker)

    def _spawn(self) -> Worker:
        with self._lock:
            if self._closed:
                raise OSError("the query workers are closed")
            self._generation += 1
            name = f"sepa-worker-{self._generation}"
            checkpoint = self._checkpoints / str(self._generation) if self._checkpoints is not None else None
            worker = Worker(name, self.service_allow, checkpoint)
            self._workers.add(worker)
        worker.follow(self.store)
        return worker

    def run(self, job: str, /, *args: Any, time_limit_s: float | None = None, **kwargs: Any) -> Any:
        """Run `job` (:data:`broker.workers.jobs.JOBS`) on an idle worker; its value, or its error.

        Waits at most the time limit for an idle worker, then at most the time limit for the
        answer; past it the worker is killed and :class:`TimeLimitExceeded` raised."""
        limit = self.time_limit_s if time_limit_s is None else time_limit_s
        waited_until = time.monotonic() + limit
        while True:
            try:
                worker = self._idle.get(timeout=max(0.0, waited_until - time.monotonic()))
            except queue.Empty:
                self.stats["busy"] += 1
                raise TimeLimitExceeded(f"no query worker became free within {limit:g} s; retry later") from None
            if worker.process.poll() is None:
                break
            self.stats["died_idle"] += 1  # killed from outside (the OOM killer...): not this job's fault
            self._replace(worker)
        self.stats["jobs"] += 1
        reply: tuple[Any, ...] | None = None
        try:
            worker.outbox.put(("job", job, args, kwargs, self.store.clock.micros()))
            if worker.connection.poll(limit):
                reply = worker.connection.recv()
        except (EOFError, OSError):
            reply = ("crashed",)
        if reply is not None and reply[0] in ("ok", "sepa", "syntax"):
            self._idle.put(worker)
            if reply[0] == "ok":
                return reply[1]
            raise _error(*reply)
        self._replace(worker)
        if reply is None:
            self.stats["timeouts"] += 1
            raise TimeLimitExceeded(f"the evaluation ran past its limit of {limit:g} s and was stopped")
        self.stats["crashes"] += 1
        raise EvaluationCrashed("the evaluation of this request crashed its worker process, which was replaced")

    def _replace(self, worker: Worker) -> None:
        """Kill `worker` now; start its successor in the background."""
        self.store.unfollow(worker.deliver)
        with self._lock:
            self._workers.discard(worker)
        worker.process.kill()
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            self._spawner.submit(self._succeed, worker)

    def _succeed(self, worker: Worker) -> None:
        worker.kill()
        try:
            successor = self._spawn()
            successor.wait_ready()
        except OSError as error:
            if not self._closed:
                log.error("cannot start a query worker", extra={"reason": str(error)})
            return
        self.stats["replaced"] += 1
        self._idle.put(successor)

    def close(self) -> None:
        """Kill every worker (a running job gets an error)."""
        with self._lock:
            self._closed = True
            workers, self._workers = list(self._workers), set()
        for worker in workers:
            self.store.unfollow(worker.deliver)
            worker.kill()
        self._spawner.shutdown(wait=False, cancel_futures=True)
        if self._checkpoints is not None:
            shutil.rmtree(self._checkpoints, ignore_errors=True)
