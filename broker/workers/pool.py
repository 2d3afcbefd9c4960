"""Query workers: evaluation that a wall-clock limit can really stop.

pyoxigraph cannot interrupt an evaluation (no timeout, no cancellation in its Python API; upstream
oxigraph issue #1336), and a thread cannot be killed. So the evaluations a client controls run in
worker processes, each holding a replica of the store (:mod:`broker.workers.replica`): a job past
its limit gets its worker killed (SIGKILL: the core is free at once) and replaced, and the client
gets :class:`~broker.errors.TimeLimitExceeded`. A job that crashes pyoxigraph kills a worker, not
the gateway (:class:`~broker.errors.EvaluationCrashed`).

What runs here: SPARQL Protocol queries, the in-process API's queries, the first evaluation of every
subscription (before the update thread evaluates it for real) and the WHERE clauses of updates
that are not a plain BGP (those run on the engine's own evaluator, which counts its steps). A pool
of its own, the re-evaluation worker, takes the re-evaluations of network clients' subscriptions,
queued many at once by :meth:`QueryWorkers.dispatch` (broker.core.spu_manager, SpuManager.submit).

A replica starts from a snapshot of the store taken after its place in the log (see `_place`):
in memory, the store dumped as N-Quads and sent a slice at a time as it is dumped (Worker.seed);
on disk, a RocksDB checkpoint (hard links, milliseconds) in `replicas/` of the data directory. The
pool follows the store (:meth:`~broker.store.RdfStore.follow`) into one log of deltas; the update
path only appends to it. A feeding thread sends the workers what
they lack every FEED_INTERVAL_S, in one message per tick (:func:`batched`, serialized once for all
the workers at the same place), and the rest is sent just before each job, so a job sees exactly
what the store held when it was sent; its time limit counts from the start of the evaluation,
after that catch-up. Why a steady feed, measured with bench mqtt (in memory, 2 cores): sending
every delta to every worker as it happened cost the wire benchmark 60 % of its updates per second;
sending nothing unasked and replacing a worker that lagged past 200,000 quads by a fresh snapshot
(a dump of the whole store by the gateway, ~0.4 s of its CPU a time) took the notification p99
from 21 to 73-201 ms, every spike a re-seed; a tick's worth of deltas costs the gateway
milliseconds, in proportion to what changed rather than to the store.

Why a short tick: a tick's serializing and pickling hold the GIL, and with the gateway near one
core busy (1,000 CoAP readings/s, ~800 KB of N-Quads every 0.2 s) the readings queued behind that
burst took ~80 ms to drain: in `bench coap`, most readings sent within 60 ms of a tick's start
were notified late (past 25 ms), and ticks of 1 s made the p99 100-175 ms. Every 0.05 s the bursts
are a quarter the size: NL p99 18-39 ms against 42-52 ms (4 runs each, alternated, 2026-11-27);
niceness or SCHED_IDLE for the workers changed nothing, so the cost is the gateway's.

On disk there is no feed: a replica on disk writes every delta to its own RocksDB files again
(pyoxigraph: ~11-14 us a quad), and fed, two of them took the cores from the update thread (a
query after 100,000 readings waited past a minute for its worker to catch up). The log is kept up
to LOG_MAX_QUADS (or LOG_MAX_DELTAS), sent just before a job; past it it is dropped, and a worker
that lacks what was dropped is replaced when next picked, from a new checkpoint (hard links,
milliseconds) and a new process.

Costs, measured on the test machine: a worker process is ~40 MB plus its replica (a full copy of
an in-memory store; a checkpoint on disk shares the store's files and costs its own cache only);
a job adds one round trip over a socket pair (~0.15 ms for a small query).
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pyoxigraph import NamedNode, Quad, RdfFormat, serialize

import broker
from broker.errors import (
    EvaluationCrashed,
    InvalidRequest,
    MemoryLimitExceeded,
    SepaError,
    TimeLimitExceeded,
    WorkerLost,
)
from broker.store import PROVISIONAL, RdfStore, dump_nquads, graph_text, nquads_slices

log = logging.getLogger(__name__)

ABORT_WAIT_S = 1.0  # for a worker whose socket closed to be gone, to know whether it aborted
READY_TIMEOUT_S = 300.0  # a replica of a large in-memory store takes a while to load
# a worker given a job says it started within this: it applies the deltas it lacks first (its backlog
# is under 32 MB, or it is replaced). Past it the worker is killed and replaced, the job refused as
# past its time limit. Why not READY_TIMEOUT_S, as first: a worker stopped (SIGSTOP, a frozen
# container) held every request given to it 300 s, against a time limit of 10 s
STARTED_TIMEOUT_S = 60.0
SUCCESSOR_WAIT_S = 60.0  # at most, in await_successor
_PACKAGE_ROOT = str(Path(broker.__file__).resolve().parent.parent)


Delta = tuple[list[Quad], list[Quad], list[NamedNode], list[NamedNode]]
Step = tuple[bytes, bytes, tuple[str, ...], tuple[str, ...]]  # of an ``apply`` message (see batched)
Call = tuple[tuple[Any, ...], dict[str, Any]]  # a job's positional and keyword arguments (dispatch)
FEED_INTERVAL_S = 0.05  # how often the feeding thread sends the workers the deltas they lack
# on disk (no feed): past this many quads or deltas the log is dropped, and a worker that lacks
# them is replaced when next picked, from a new checkpoint (milliseconds)
# a worker whose fed deltas wait unsent past this many bytes stops being fed (see QueryWorkers._feed)
FEED_MAX_BACKLOG_BYTES = 32 << 20
# a stale idle worker is replaced without waiting for a job once the store changed by fewer than
# QUIET_QUADS_PER_S quads a second, and no worker fell behind, for QUIET_S; at most once per
# REFRESH_INTERVAL_S (see QueryWorkers._refresh)
QUIET_S = 1.0
QUIET_QUADS_PER_S = 10_000
REFRESH_INTERVAL_S = 30.0
LOG_MAX_QUADS = 200_000
LOG_MAX_DELTAS = 5_000
SLICE = 20_000  # quads serialized at a time (a seed, a large delta), letting go of the GIL in between
# an ``apply`` message's N-Quads part larger than this is sent raw after the message (see Worker._write)
RAW_BYTES = 1 << 20


def _dump(store: RdfStore, graphs: frozenset[object] | None = None) -> bytes:
    """The in-memory store as N-Quads (of `graphs` only, when given: a BOOSTER worker's replica).

    The whole store through :func:`broker.store.dump_nquads` (a memory file, read back without the
    GIL). Measured on the test machine (1.3 million quads, 122 MB; a thread ticking every 1 ms shows
    how long the others were held): `Store.dump` into an `io.BytesIO` 0.75 s, the worst gap 9.5 ms,
    where the slices before (`quads_for_pattern` and `serialize` 20,000 quads at a time, letting go
    of the GIL in between) took 4.5 s, and `Store.dump` into bytes 0.73 s with a gap of 75 ms (the
    bytes made under the GIL at the end); the BytesIO was given up for the memory file because under
    mimalloc (the installed service's malloc) its growths are copies under the GIL: gaps of 23-281
    ms for 22.5 MB (:func:`broker.store.dump_nquads` has the figures). `from_graph` writes
    triples, so the graphs of a BOOSTER worker are still sliced. Quads changed meanwhile are
    replayed from the worker's place in the log (see QueryWorkers._place)."""
    if graphs is None:
        return dump_nquads(store.ox)
    output = io.BytesIO()
    for graph in graphs:
        quads = store.ox.quads_for_pattern(None, None, None, graph)  # type: ignore[arg-type]
        while chunk := list(itertools.islice(quads, SLICE)):
            serialize(chunk, output=output, format=RdfFormat.N_QUADS)
            time.sleep(0)
    return output.getvalue()


def _nquads(quads: list[Quad]) -> bytes:
    """`quads` as N-Quads; a large delta (a LOAD) a slice at a time, letting other threads in.

    The slices are written into one buffer whose bytes are given back without a copy
    (BytesIO.getvalue), not joined: slices and joined bytes were two copies of the delta's N-Quads
    beside its quads (60,000 quads, 8.4 MB of N-Quads: 16.9 MB allocated, now 8.7 MB; measured
    2026-12-06), on the feeder thread while a large update is still being processed."""
    if len(quads) <= SLICE:
        return serialize(quads, format=RdfFormat.N_QUADS) if quads else b""
    output = io.BytesIO()
    for start in range(0, len(quads), SLICE):
        serialize(quads[start : start + SLICE], output=output, format=RdfFormat.N_QUADS)
        time.sleep(0)
    return output.getvalue()


def _size(message: tuple[Any, ...]) -> int:
    """The N-Quads bytes an ``apply`` message carries."""
    return sum(len(added) + len(removed) for added, removed, _, _ in message[1])


def _raw_parts(steps: list[Step]) -> tuple[list[Step], list[bytes]]:
    """`steps` with each N-Quads part of more than RAW_BYTES replaced by None, and those parts in
    the order a replica reads them back (:func:`broker.workers.replica.serve`): each step's added
    part, then its removed one."""
    kept: list[Step] = []
    raw: list[bytes] = []
    for added, removed, created, dropped in steps:
        parts = []
        for part in (added, removed):
            if len(part) > RAW_BYTES:
                raw.append(part)
                parts.append(None)
            else:
                parts.append(part)
        kept.append((parts[0], parts[1], created, dropped))  # type: ignore[arg-type]
    return kept, raw


def batched(deltas: list[Delta]) -> tuple[Any, ...]:
    """One ``apply`` message to a replica for `deltas`, in order, as N-Quads. A run of deltas that
    only add quads becomes one step (N-Quads concatenate); any other delta is a step of its own.

    Why not a net delta (the last change of each quad wins): computing it is a Python dict
    operation per quad, and catching a worker up on a LOAD of 333,681 triples took seconds of the
    gateway's own CPU; serializing is pyoxigraph's, a few microseconds per delta."""
    steps: list[Step] = []
    adding: list[bytes] = []
    for added, removed, created, dropped in deltas:
        if not (removed or created or dropped):
            adding.append(_nquads(added))
            continue
        if adding:
            steps.append((b"".join(adding), b"", (), ()))
            adding = []
        graphs = (tuple(map(graph_text, created)), tuple(map(graph_text, dropped)))
        steps.append((_nquads(added), _nquads(removed), *graphs))
    if adding:
        steps.append((b"".join(adding), b"", (), ()))
    return ("apply", steps)


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

    def __init__(
        self,
        name: str,
        service_allow: tuple[str, ...],
        checkpoint: Path | None,
        module: str = "broker.workers.replica",
        memory_bytes: int = 0,
    ) -> None:
        """`module`: the process's program, a query worker's replica or a BOOSTER worker
        (:mod:`broker.workers.booster`), which takes the same seed and deltas. `memory_bytes`: what
        one of a query worker's jobs may allocate (:class:`broker.workers.replica.MemoryBound`)."""
        self.name = name
        self.checkpoint = checkpoint
        ours, theirs = socket.socketpair()
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, environment.get("PYTHONPATH")]))
        # a job past its memory limit makes Rust abort: one line, not a backtrace of forty, per job
        environment.pop("RUST_BACKTRACE", None)
        try:
            # -P: `-m` would put the current directory first on the worker's path, and the gateway
            # may run in a directory others write (the installer's, without systemd: a checkout's
            # `broker` was imported instead of the installed one). PYTHONPATH still counts (-I would
            # drop it): checkouts, tests and benchmarks run from it.
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", module, str(theirs.fileno()), str(memory_bytes), *service_allow],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=environment,
            )
        finally:
            theirs.close()
        self.connection = Connection(ours.detach())
        self.outbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self.position = 0  # deltas of the pool's log sent to it (an absolute index into the log)
        self.seeded = False  # its snapshot is queued: deltas may follow
        self.queued_bytes = 0  # of deltas put in its outbox (by the pool, under its lock)
        self.sent_bytes = 0  # of deltas sent to the process (by its feeding thread)
        # dispatched jobs (QueryWorkers.dispatch) whose replies its reading thread awaits, in order;
        # `queued` counts them (under the pool's lock): the worker is streaming while it is not 0
        self.replies: queue.SimpleQueue[tuple[Future[Any], float]] = queue.SimpleQueue()
        self.queued = 0
        self.retiring = False  # it lacks deltas the log no longer has: replaced once its jobs are done
        self._writer = threading.Thread(target=self._write, name=f"{name}-feed", daemon=True)
        self._writer.start()

    def _write(self) -> None:
        """Send the outbox's messages in order, until None or the worker is gone. Each message is
        let go of once sent (:meth:`_send` holds it, not this loop): held until the next one came, the
        two query workers' seeds (42 MB each, 231,100 quads) stayed in the gateway together until the
        first feed after "serving" (its RSS 159 -> 244 MB at a start after a kill, 2026-12-07)."""
        while True:
            try:
                if not self._send(self.outbox.get()):
                    return
            except OSError:  # the worker is gone; whoever waits on it finds out
                return

    def _send(self, message: tuple[Any, ...] | None) -> bool:
        """Send one message of the outbox; False for None (the end)."""
        if message is None:
            return False
        if message[0] == "seed" and message[1] == "memory":
            self._send_seed(message[2], message[3])
            return True
        if message[0] != "apply":
            self.connection.send(message)
            return True
        size = _size(message)
        if size <= RAW_BYTES:
            self.connection.send(message)
        else:
            self._send_raw(message[1])
        self.sent_bytes += size
        return True

    def _send_seed(self, slices: Iterable[bytes], named: tuple[str, ...]) -> None:
        """A seed's N-Quads raw after its message, slice by slice, then an empty one
        (:func:`broker.workers.seeding.seeded`); pickled, 122 MB held the GIL 70 ms. A seed cut short
        (the dump failed) kills the worker: it never serves a replica of part of the store, and
        whoever waits for it to be ready finds it gone."""
        self.connection.send(("seed", "memory", None, named))
        try:
            for chunk in slices:
                if chunk:
                    self.connection.send_bytes(chunk)
        except OSError:
            self.process.kill()
            raise
        self.connection.send_bytes(b"")

    def _send_raw(self, steps: list[Step]) -> None:
        """An ``apply`` message whose large N-Quads parts follow it raw (:func:`_raw_parts`).

        Why: pickled, each part was copied into the message's bytes, once per worker (each feeding
        thread pickles its own) and held while the worker read it at its lower priority: 200,000
        quads, 26.4 MB of N-Quads, 29.7 MB allocated in the gateway for each worker (tracemalloc),
        none sent raw (measured 2026-12-07). The feed after one large update came after its peak
        (VmHWM unchanged), but anything the gateway does meanwhile is on top of those copies."""
        kept, raw = _raw_parts(steps)
        self.connection.send(("apply", kept))
        for part in raw:
            self.connection.send_bytes(part)

    @property
    def backlog(self) -> int:
        """Bytes of deltas queued for the process and not sent yet (it is not reading them)."""
        return self.queued_bytes - self.sent_bytes

    def seed(self, store: RdfStore, graphs: frozenset[object] | None = None, *, later: bool = False) -> None:
        """Queue the snapshot; in memory, of `graphs` only when given (a BOOSTER worker's replica: the
        graphs its shape groups read). Taken now, whole, unless `later`: then dumped as the feeding
        thread sends it, slice by slice (:func:`broker.store.nquads_slices`), never whole in the
        gateway. `later` is for a query worker, whose place in the log is taken before
        (QueryWorkers._place): any snapshot after it is right. A BOOSTER worker's log starts at its
        snapshot (broker.core.pipeline), which must be taken now."""
        if self.checkpoint is not None:
            quads = store.backup(str(self.checkpoint))
            self.outbox.put(("seed", "directory", str(self.checkpoint), (), quads))
        else:
            named = tuple(map(graph_text, store.ox.named_graphs()))
            slices = nquads_slices(store.ox) if later and graphs is None else [_dump(store, graphs)]
            self.outbox.put(("seed", "memory", slices, named))
        self.seeded = True

    def wait_ready(self) -> None:
        """Raises OSError if the process does not say it is ready: also when it is gone (EOFError),
        e.g. a BOOSTER worker killed before it was seeded again (pipeline._index_group)."""
        try:
            if self.connection.poll(READY_TIMEOUT_S) and self.connection.recv() == ("ready",):
                return
        except EOFError:
            pass
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


def _reply(worker: Worker, limit: float) -> tuple[Any, ...] | None:
    """`worker`'s reply to its oldest job: None past `limit` from the job's start, ("crashed",) if
    the worker is gone. The limit counts from the start of the evaluation, not from the catch-up."""
    try:
        started = worker.connection.poll(STARTED_TIMEOUT_S) and worker.connection.recv() == ("started",)
        if started and worker.connection.poll(limit):
            return worker.connection.recv()  # type: ignore[no-any-return]
    except (EOFError, OSError):
        return ("crashed",)
    return None


class QueryWorkers:
    """A fixed number of workers; :meth:`run` runs one job on an idle one under a time limit.

    Thread-safe: called from the query threads and from the update thread. Counters (jobs,
    timeouts, crashes, busy, replaced) are in :attr:`stats`.
    """

    def __init__(
        self,
        store: RdfStore,
        *,
        count: int = 2,
        time_limit_s: float = 10.0,
        memory_bytes: int = 0,
        service_allow: tuple[str, ...] = (),
        name: str = "worker",
        on_demand: bool = False,
    ) -> None:
        """`name`: the pool's, in its processes' and threads' names and, on disk, its checkpoints'
        directory (``replicas`` for the query workers, ``replicas-<name>`` for another pool: two
        pools over one store must not share it, each empties it when it starts).

        `memory_bytes`: what one job may allocate beyond its worker's replica (0: no limit); past it
        the job fails with :class:`MemoryLimitExceeded` (:class:`broker.workers.replica.MemoryBound`).

        `on_demand`: :meth:`start` starts no worker; :meth:`wake` starts them in the background and
        :meth:`rest` stops them. Why: a replica in memory applies every delta of the store and
        compacts itself like the store. For the re-evaluation worker, which most gateways never
        need, that was a third of the CPU its query workers' replicas took together (`bench coap`,
        1,000 readings/s: the gateway's children 55-62 % of a core, 38-43 % without it)."""
        if count < 1:
            raise ValueError("at least one query worker")
        self.store = store
        self.count = count
        self.time_limit_s = time_limit_s
        self.memory_bytes = memory_bytes
        self.service_allow = tuple(service_allow)
        self.stats: Counter[str] = Counter()
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._workers: set[Worker] = set()
        self._streaming: set[Worker] = set()  # workers taking dispatched jobs (see dispatch)
        self._lock = threading.Lock()
        self._closed = False
        self._generation = 0
        self.name = name
        self.on_demand = on_demand
        self._awake = not on_demand  # following the store, its workers started or starting
        self._arrived = 0  # quads of the deltas logged since the feeding thread last looked
        self._busy_at = time.monotonic()  # when the store last changed faster than QUIET_QUADS_PER_S
        self._refreshed_at = -REFRESH_INTERVAL_S  # when stale idle workers were last replaced unasked
        self._feeding = False
        folder = "replicas" if name == "worker" else f"replicas-{name}"
        self._checkpoints = store.path / folder if store.rocksdb else None
        # every worker is started from this one thread, alive as long as the pool: a worker dies
        # with the thread that started it (PR_SET_PDEATHSIG), so that it never outlives the gateway
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix=f"sepa-{name}-spawn")
        # the deltas since the oldest position of a live worker; _log[0] is delta number _log_start
        self._log: list[Delta] = []
        self._log_start = 0
        self._log_quads = 0  # on disk: quads in the log
        self._stopping = threading.Event()
        self._feeder = threading.Thread(target=self._feed, name=f"sepa-{name}-feed", daemon=True)
        self._caused = threading.local()  # successor: the replacement of the worker this thread's last job cost
        # a request of several operations (see _follow): its provisional deltas, not in the log yet;
        # the thread applying them; the worker its own jobs ran on, which holds `_reserved_has` of
        # them; and the workers that joined meanwhile (their snapshot may hold some)
        self._pending: list[Delta] = []
        self._pending_owner: int | None = None
        self._reserved: Worker | None = None
        self._reserved_has = 0
        self._held: list[Worker] = []

    def start(self) -> None:
        """Start every worker and wait until each holds its replica (an on-demand pool: none)."""
        if self._checkpoints is not None:
            shutil.rmtree(self._checkpoints, ignore_errors=True)  # left by a killed gateway
            self._checkpoints.mkdir(parents=True)
        if self.on_demand:
            return
        self.store.follow(self._follow)
        started = [self._spawner.submit(self._spawn).result() for _ in range(self.count)]
        for worker in started:
            worker.wait_ready()
            self._idle.put(worker)
        self._start_feeder()

    def _start_feeder(self) -> None:
        with self._lock:
            if self._feeding or self._checkpoints is not None:
                return
            self._feeding = True
        self._feeder.start()

    @property
    def ready(self) -> bool:
        """Whether a worker holds its replica (an on-demand pool: woken, and one is started).

        Under the lock: a worker moves between idle and streaming under it (dispatch, _read), and
        read between the two it was neither, and the update thread took the waiting path now and
        then (`bench reeval`: the bystander's update p99 76 ms instead of 14-25 ms)."""
        with self._lock:
            return self._awake and (self._idle.qsize() > 0 or bool(self._streaming))

    @property
    def running(self) -> int:
        """Workers that hold their replica now (idle, or taking dispatched jobs)."""
        return self._idle.qsize() + len(self._streaming)

    def wake(self) -> None:
        """An on-demand pool at rest: follow the store again and start its workers in the background
        (each from a fresh snapshot); :attr:`ready` once one holds its replica. Does not wait."""
        with self._lock:
            if self._awake or self._closed:
                return
            self._awake = True
        self.store.follow(self._follow)
        self._start_feeder()
        self.stats["woken"] += 1
        for _ in range(self.count):
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                self._spawner.submit(self._join)

    def rest(self) -> None:
        """An on-demand pool: stop following the store and kill its workers. Jobs still queued on
        them fail with WorkerLost: the caller rests the pool when it has none."""
        with self._lock:
            if not (self.on_demand and self._awake):
                return
            self._awake = False
            workers, self._workers = list(self._workers), set()
            self._log_start += len(self._log)
            self._log, self._log_quads = [], 0
            # no settle reaches it now: a request's provisional deltas are forgotten with the log
            self._pending, self._pending_owner, self._reserved, self._held = [], None, None, []
        self.store.unfollow(self._follow)
        with contextlib.suppress(queue.Empty):
            while True:
                self._idle.get_nowait()
        for worker in workers:
            worker.kill()
        self.stats["rested"] += 1

    def _follow(
        self,
        added: list[Quad],
        removed: list[Quad],
        created: list[NamedNode],
        dropped: list[NamedNode],
        sequence: str = "",
    ) -> None:
        """The store's follower: keep the delta (called under the store's lock, on the update path).

        A request of several operations applies each before computing the next, and undoes them
        all at its end (:mod:`broker.core.update_processor`). Its operations' deltas (PROVISIONAL)
        are kept aside until the undo: a job of another thread must not see them (they were in
        every replica at the next tick: a reader saw `INSERT DATA {...} ; INSERT {...} WHERE {slow}`'s
        first operation for as long as the second ran, and then never again, as it failed), and the
        request's own jobs (its later WHERE clauses) must (see :meth:`run`). The next delta that is
        not provisional, the undo, puts them in the log followed by itself: a worker catching up
        applies them with the undo in one message before its next job, so no job sees them.
        """
        if sequence == PROVISIONAL:
            with self._lock:
                self._pending.append((added, removed, created, dropped))
                self._pending_owner = threading.get_ident()
            return
        if self._pending_owner is not None:
            self._settle()
        self._log_delta((added, removed, created, dropped))

    def _settle(self) -> None:
        """A request's provisional deltas into the log (its undo follows them), and the workers
        that may hold some of them back among the idle ones (under the store's lock)."""
        with self._lock:
            pending, self._pending, self._pending_owner = self._pending, [], None
            released = [self._reserved, *self._held] if self._reserved is not None else self._held
            self._reserved, self._reserved_has, self._held = None, 0, []
            awake = self._awake
        for delta in pending:
            self._log_delta(delta)
        # a worker holding some of them replays them: a delta adds absent quads and removes present
        # ones, so replaying deltas from a worker's place leaves it as the store (see _place)
        for worker in released:
            if awake:
                self._idle.put(worker)
            else:
                with self._lock:
                    self._workers.discard(worker)
                worker.kill()

    def _log_delta(self, delta: Delta) -> None:
        self._log.append(delta)
        added, removed = delta[0], delta[1]
        self._arrived += len(added) + len(removed)
        if self._checkpoints is None:
            return
        self._log_quads += len(added) + len(removed)
        if self._log_quads >= LOG_MAX_QUADS or len(self._log) >= LOG_MAX_DELTAS:
            with self._lock:  # forget it: the workers lack some of it, and are replaced when next picked
                self._log_start += len(self._log)
                self._log = []
                self._log_quads = 0
                self.stats["dropped_logs"] += 1

    def _feed(self) -> None:
        """Every FEED_INTERVAL_S, send every worker the deltas it lacks.

        A worker that does not take them (the cores are busy, and workers run at niceness 10; or
        it was stopped) would have them pile up in this process without bound. Past
        FEED_MAX_BACKLOG_BYTES unsent, a worker is fed no more: it is stale, like a worker on disk
        after the log was dropped. It is replaced when next picked or, idle, once the store is
        quiet (:meth:`_refresh`)."""
        while not self._stopping.wait(FEED_INTERVAL_S):
            arrived, self._arrived = self._arrived, 0
            if arrived > QUIET_QUADS_PER_S * FEED_INTERVAL_S:
                self._busy_at = time.monotonic()
            with self._lock:
                by_position: dict[int, list[Worker]] = {}
                for worker in filter(lambda each: each.seeded and each.position >= self._log_start, self._workers):
                    if worker.backlog > FEED_MAX_BACKLOG_BYTES:
                        worker.position = -1  # stale
                        self.stats["lagging"] += 1
                        self._busy_at = time.monotonic()
                        continue
                    by_position.setdefault(worker.position, []).append(worker)
                for workers in by_position.values():
                    self._catch_up(*workers)
                self._forget()
            now = time.monotonic()
            if now - self._busy_at >= QUIET_S and now - self._refreshed_at >= REFRESH_INTERVAL_S:
                self._refresh()

    def _refresh(self) -> None:
        """Replace the idle workers that are stale now, not when a job picks one. Why: a burst
        (sensors reconnecting with their queued readings) leaves the workers behind, and the first
        query after it waited for a new replica: 4.3-4.4 s after 100,000 readings in the cloud
        pipeline test, seconds in which every other query waited too. Only once the store is quiet
        (QUIET_S under QUIET_QUADS_PER_S, no worker falling behind), and at most once per
        REFRESH_INTERVAL_S: under a steady load a successor can fall behind again while it is
        seeded (quads are counted, not their size), and each seed costs the gateway a dump of the
        store (~0.75 s of CPU at the lowest priority for 1.3 million quads)."""
        with self._lock:
            if not self._awake or all(each.position >= self._log_start for each in self._workers):
                return
            stale: list[Worker] = []
            fresh: list[Worker] = []
            with contextlib.suppress(queue.Empty):
                while True:
                    worker = self._idle.get_nowait()
                    (fresh if worker.position >= self._log_start else stale).append(worker)
            for worker in fresh:
                self._idle.put(worker)
        if stale:
            self._refreshed_at = time.monotonic()
        for worker in stale:
            self.stats["stale"] += 1
            self.stats["refreshed"] += 1
            self._replace(worker)

    def _catch_up(self, *workers: Worker) -> None:
        """Queue for `workers` (all at the same place in the log) the deltas they lack, in one
        message; then forget what every worker has (hold _lock)."""
        first = workers[0].position - self._log_start
        entries = self._log[first:]
        if not entries:
            return
        message = batched(entries)
        size = _size(message)
        for worker in workers:
            worker.outbox.put(message)
            worker.position += len(entries)
            worker.queued_bytes += size
        self._forget()

    def _forget(self) -> None:
        """Drop the deltas every live worker that is not stale has (hold _lock)."""
        positions = [each.position for each in self._workers if each.position >= self._log_start]
        oldest = (min(positions) if positions else self._log_start + len(self._log)) - self._log_start
        if oldest > 0:
            self._log_quads -= sum(len(added) + len(removed) for added, removed, _, _ in self._log[:oldest])
            del self._log[:oldest]
            self._log_start += oldest

    def _spawn(self) -> Worker:
        with self._lock:
            if self._closed:
                raise OSError("the query workers are closed")
            self._generation += 1
            name = f"sepa-{self.name}-{self._generation}"
            checkpoint = self._checkpoints / str(self._generation) if self._checkpoints is not None else None
            worker = Worker(name, self.service_allow, checkpoint, memory_bytes=self.memory_bytes)
        self.store.at_rest(functools.partial(self._place, worker))
        worker.seed(self.store, later=True)
        return worker

    def _place(self, worker: Worker, _store: RdfStore) -> None:
        """`worker`'s place in the log: the end, between two deltas (the store at rest).

        The snapshot is taken after, without holding up the update path (a dump of an in-memory
        store took bench mqtt's p99 from 29 to 90 ms): it may already hold deltas after its place,
        which the worker then applies again. That is harmless: a delta adds absent quads and
        removes present ones, so replaying the deltas from its place, in order, leaves every quad
        as the last delta touching it left it, and the others as the snapshot has them."""
        with self._lock:
            worker.position = self._log_start + len(self._log)
            self._workers.add(worker)

    def run(self, job: str, /, *args: Any, time_limit_s: float | None = None, **kwargs: Any) -> Any:
        """Run `job` (:data:`broker.workers.jobs.JOBS`) on an idle worker; its value, or its error.

        Waits at most the time limit for an idle worker, then at most the time limit for the
        answer; past it the worker is killed and :class:`TimeLimitExceeded` raised."""
        limit = self.time_limit_s if time_limit_s is None else time_limit_s
        waited_until = time.monotonic() + limit
        self._caused.successor = None
        # a job of the request whose operations are provisional: it sees them (see _follow)
        own = self._pending_owner == threading.get_ident()
        while True:
            worker, holds = None, 0  # holds: of the provisional deltas, those the worker has
            if own:
                with self._lock:
                    if self._reserved is not None:
                        worker, holds, self._reserved = self._reserved, self._reserved_has, None
            try:
                if worker is None:
                    worker = self._idle.get(timeout=max(0.0, waited_until - time.monotonic()))
            except queue.Empty:
                self.stats["busy"] += 1
                raise TimeLimitExceeded(f"no query worker became free within {limit:g} s; retry later") from None
            if worker.process.poll() is not None:
                self.stats["died_idle"] += 1  # killed from outside (the OOM killer...): not this job's fault
                self._replace(worker)
                continue
            with self._lock:
                fresh = worker.position >= self._log_start
                if fresh:
                    self._catch_up(worker)
                    if own:
                        holds = self._show_pending(worker, holds)
                    worker.outbox.put(("job", job, args, kwargs, self.store.clock.micros()))
            if fresh:
                break
            self.stats["stale"] += 1  # on disk, it lacks deltas the log dropped: a checkpoint is cheaper
            self._replace(worker)
        self.stats["jobs"] += 1
        reply = _reply(worker, limit)
        if reply is not None and reply[0] in ("ok", "sepa", "syntax"):
            if own:  # it holds provisional deltas: no other thread's job until they are settled
                with self._lock:
                    self._reserved, self._reserved_has = worker, holds
            else:
                self._idle.put(worker)
            if reply[0] == "ok":
                return reply[1]
            raise self._refused(reply)
        error = self._failure(worker, reply, limit)
        self._caused.successor = self._replace(worker)
        raise error

    def _show_pending(self, worker: Worker, holds: int) -> int:
        """Queue for `worker`, which holds the first `holds` provisional deltas, the others,
        outside the log; how many it holds then (hold _lock)."""
        if len(self._pending) > holds:
            message = batched(self._pending[holds:])
            worker.outbox.put(message)
            worker.queued_bytes += _size(message)
        return len(self._pending)

    def await_successor(self, timeout: float = SUCCESSOR_WAIT_S) -> None:
        """Wait until the worker that replaces the one this thread's last :meth:`run` cost (its
        time limit, its memory limit, a crash) holds its replica; at once if it cost none.

        Why: a replica takes a while to load (~1-3 s for 300,000 triples in memory), and meanwhile
        the pool is a worker short. A secure client looping on queries that cost their worker got
        the one left as soon as its error came back, so it held every worker there was: another
        client's queries got 503 "no query worker became free" 13-15 times out of 20-22
        (`broker.scheduler.FairShare` waits here before it gives the client its turn back)."""
        successor, self._caused.successor = getattr(self._caused, "successor", None), None
        if successor is not None:
            wait([successor], timeout)

    def _refused(self, reply: tuple[Any, ...]) -> Exception:
        """The error a worker answered (counted when it is its memory limit)."""
        if reply[1] == MemoryLimitExceeded.__name__:
            self.stats["memory_limits"] += 1
        return _error(*reply)

    def _failure(self, worker: Worker, reply: tuple[Any, ...] | None, limit: float) -> SepaError:
        """The error of a job whose worker ran past `limit` (`reply` None) or died (counted): with a
        memory limit, a worker that aborted ran out of it (Rust aborts when an allocation fails)."""
        if reply is None:
            self.stats["timeouts"] += 1
            return TimeLimitExceeded(f"the evaluation ran past its limit of {limit:g} s and was stopped")
        with contextlib.suppress(subprocess.TimeoutExpired):
            if self.memory_bytes and worker.process.wait(ABORT_WAIT_S) == -signal.SIGABRT:
                self.stats["memory_limits"] += 1
                return MemoryLimitExceeded.past(self.memory_bytes)
        self.stats["crashes"] += 1
        return EvaluationCrashed("the evaluation of this request crashed its worker process, which was replaced")

    def dispatch(self, job: str, calls: Sequence[Call], *, time_limit_s: float | None = None) -> list[Future[Any]]:
        """Queue `job` once per call, spread over the workers, without waiting; a future each.

        Each job sees the store exactly as it is now, however late it runs: the deltas a worker
        lacks are queued before its jobs, and the deltas to come after them, and a worker reads its
        socket in order. So the update thread can queue an update's re-evaluations right after
        applying it and go on with the next update (broker.core.spu_manager, SpuManager.submit).

        A worker given jobs is taken from the idle ones and keeps taking jobs until all it was given
        are answered; a reading thread of its own settles their futures in order, each job under
        its time limit from its start. Past it (or if the worker dies) the worker is killed and
        replaced, that job fails with :class:`TimeLimitExceeded` (:class:`EvaluationCrashed`) and
        the jobs queued behind it with :class:`WorkerLost`. With no worker to give them to (all
        being replaced, or busy with :meth:`run`), every future fails with WorkerLost at once.

        Meant for a pool of its own: it takes every idle worker, and :meth:`run` waits for one."""
        limit = self.time_limit_s if time_limit_s is None else time_limit_s
        futures: list[Future[Any]] = [Future() for _ in calls]
        if not calls:
            return futures
        unfit: list[Worker] = []  # idle workers that died or lack deltas: replaced
        with self._lock:  # a reading thread gives its worker back under the lock too
            taken: list[Worker] = []  # idle workers, fresh and alive
            while True:
                try:
                    worker = self._idle.get_nowait()
                except queue.Empty:
                    break
                if worker.process.poll() is not None:
                    self.stats["died_idle"] += 1
                    unfit.append(worker)
                elif worker.position < self._log_start:
                    self.stats["stale"] += 1
                    unfit.append(worker)
                else:
                    taken.append(worker)
            for worker in self._streaming:
                if worker.position < self._log_start and not worker.retiring:
                    worker.retiring = True  # its queued jobs still see their store; no more jobs
                    self.stats["stale"] += 1
            streaming = [each for each in self._streaming if not each.retiring]
            workers = (sorted(streaming, key=lambda each: each.queued) + taken)[: len(calls)]
            micros = self.store.clock.micros()
            for offset, worker in enumerate(workers):
                self._catch_up(worker)
                # one message for its share (1,000 messages cost the update thread ~20 ms: pickled
                # and sent by the feeding thread, which takes the GIL from it each time)
                share = calls[offset :: len(workers)]
                worker.outbox.put(("jobs", job, share, micros))
                worker.queued += len(share)
                for future in futures[offset :: len(workers)]:
                    worker.replies.put((future, limit))
            for worker in workers:
                if worker not in self._streaming:  # taken now: it streams until its jobs are answered
                    worker.retiring = False
                    self._streaming.add(worker)
                    threading.Thread(target=self._read, args=(worker,), name=f"{worker.name}-read", daemon=True).start()
            for worker in taken:
                if worker not in workers:
                    self._idle.put(worker)
        for worker in unfit:
            self._replace(worker)
        if not workers:
            self.stats["lost"] += len(futures)
            for future in futures:
                future.set_exception(WorkerLost("no re-evaluation worker was available"))
        self.stats["jobs"] += len(calls)
        return futures

    def _read(self, worker: Worker) -> None:
        """A streaming worker's reading thread: settle its dispatched jobs' futures in order; once
        none is left, give the worker back (or replace it, if it lacks deltas) and end."""
        while True:
            future, limit = worker.replies.get()
            reply = _reply(worker, limit)
            if reply is not None and reply[0] in ("ok", "sepa", "syntax"):
                with self._lock:
                    worker.queued -= 1
                    drained = worker.queued == 0
                    if drained:
                        self._streaming.discard(worker)
                        if not worker.retiring:
                            self._idle.put(worker)  # under the lock: dispatch sees it streaming or idle
                if reply[0] == "ok":
                    future.set_result(reply[1])
                else:
                    future.set_exception(self._refused(reply))
                if not drained:
                    continue
                if worker.retiring:
                    self._replace(worker)
                return
            with self._lock:
                self._streaming.discard(worker)  # no more jobs for it: those queued are lost
                behind = worker.queued - 1
                worker.queued = 0
            error = self._failure(worker, reply, limit)
            self._replace(worker)
            future.set_exception(error)
            self.stats["lost"] += behind
            for _ in range(behind):
                lost, _ = worker.replies.get()
                lost.set_exception(WorkerLost("the worker this job was queued on was stopped before it ran"))
            return

    def _replace(self, worker: Worker) -> Future[None] | None:
        """Kill `worker` now; start its successor in the background (done once it is idle)."""
        with self._lock:
            self._workers.discard(worker)
        worker.process.kill()
        try:
            return self._spawner.submit(self._succeed, worker)
        except RuntimeError:  # closed meanwhile
            return None

    def _succeed(self, worker: Worker) -> None:
        worker.kill()
        if self._join():
            self.stats["replaced"] += 1

    def _join(self) -> bool:
        """Start a worker and, once it holds its replica, make it idle; whether it was (an
        on-demand pool put to rest meanwhile kills it instead)."""
        try:
            worker = self._spawn()
            worker.wait_ready()
        except OSError as error:
            if not self._closed:
                log.error("cannot start a query worker", extra={"reason": str(error)})
            return False
        with self._lock:
            if self._awake and self._pending_owner is not None:
                # its snapshot may hold a request's provisional deltas: idle once they are settled
                self._held.append(worker)
                return True
            if self._awake:
                self._idle.put(worker)
                return True
            self._workers.discard(worker)
        worker.kill()
        return False

    def close(self) -> None:
        """Kill every worker (a running job gets an error)."""
        self._stopping.set()
        with self._lock:
            self._closed = True
            workers, self._workers = list(self._workers), set()
        self.store.unfollow(self._follow)
        for worker in workers:
            worker.kill()
        self._spawner.shutdown(wait=False, cancel_futures=True)
        if self._checkpoints is not None:
            shutil.rmtree(self._checkpoints, ignore_errors=True)
