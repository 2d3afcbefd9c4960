"""The scheduler: admission control and dispatch of requests to the engine, off the event loop.

Every request is admitted into a bounded FIFO (``queue_size`` requests in flight at most; past
that :class:`TooManyRequests`, 429 on the wire). Updates, subscribes and unsubscribes run one at
a time on a dedicated thread, in arrival order (they must not interleave); queries run on a small
thread pool, concurrently with each other and with updates, a secure client's at most its share
at once (:class:`FairShare`). A publisher's reply is sent after
end of processing, because ``Engine.update`` returns only then. Notifications produced on the
update thread are handed to the event loop thread-safely; an :class:`AsyncSubscription` is also
consumed with ``async for``. Delayed updates (:mod:`broker.delayed`) fall due into the same
serial queue, so they take the path of every other update.

A small update that finds nothing queued is first tried on the event loop thread, under a budget
(:mod:`broker.core.budget`): the hand-over to the update thread and back costs more than such an
update. Past the budget it gives up with nothing changed and goes to the update thread. On disk
its reply then waits for the journal's sync, done by a helper process (:meth:`Scheduler._durable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from broker.core.budget import OverBudget
from broker.core.engine import Engine
from broker.core.notification import Notification
from broker.core.pending import PendingUpdates
from broker.core.results import QueryResult, UpdateResult
from broker.core.spu import Probed
from broker.core.subscription import Subscription
from broker.core.update_processor import Request
from broker.delayed import DelayedUpdates
from broker.errors import SepaError
from broker.handoff import loop_handoff, wakes_held
from broker.journal_sync import HelperGone, JournalSyncer
from broker.serial_lanes import LaneFull, SerialLanes
from broker.sparql.limits import WORKER_STACK_BYTES

if TYPE_CHECKING:
    from broker.workers.pool import QueryWorkers

log = logging.getLogger(__name__)

# Updates tried on the loop thread: at most this many characters (bounds parsing) and this many
# store lookups, quads visited and notifications (bounds the rest); a few hundred microseconds.
INLINE_MAX_CHARS = 4096
INLINE_BUDGET = 256
# at most this many calls are acknowledged by one sync of the store (bounds a burst's wait for it)
GROUP_COMMIT_MAX = 256
# and a call's reply waits at most one call more once its group is this old: in a group acknowledged
# only when the queue ran dry, a quick update's reply waited for every slow update queued behind it
# (another client's update done in 0.2 ms was answered after eight updates that ran to the 1 s
# time limit: 7.8 s, though their lanes took turns, broker.serial_lanes)
GROUP_COMMIT_MAX_S = 0.05


class TooManyRequests(SepaError):
    """The scheduler queue is full: try again later."""

    error = "too_many_requests"
    status_code = 429


class AsyncSubscription:
    """A subscription whose notifications arrive on an asyncio queue (sequence 0 first)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Notification] = asyncio.Queue()
        self.subscription: Subscription | None = None

    @property
    def spuid(self) -> str:
        assert self.subscription is not None
        return self.subscription.spuid

    def __aiter__(self) -> AsyncIterator[Notification]:
        return self

    async def __anext__(self) -> Notification:
        return await self.queue.get()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _settle_all(done: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in done:
        _settle(future, result, error)


def _processed(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], outcome: Future[Any]) -> None:
    """Settle `future` on `loop` with the outcome of an engine future (parallel mode's updates)."""
    error = outcome.exception()
    loop_handoff(loop)(_settle, future, None if error is not None else outcome.result(), error)


def _clean_errors(call: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run `call`; an error leaves this thread without its traceback frames.

    The frames hold pyoxigraph objects that must not be dropped on another thread; engine bugs
    are logged here, with their traceback, before it is cut.
    """
    try:
        return call(*args, **kwargs)
    except BaseException as error:
        raise _cut(error) from None


def _cut(error: BaseException) -> BaseException:
    """`error` without traceback frames in its chain, an engine bug logged first (call in `except`)."""
    if not isinstance(error, SepaError | OverBudget):
        log.exception("engine call failed")
    chained: BaseException | None = error
    seen: set[int] = set()
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        chained.__traceback__ = None
        chained = chained.__cause__ or chained.__context__
    return error


def engine_executor(workers: int, name: str) -> ThreadPoolExecutor:
    """A pool whose threads have WORKER_STACK_BYTES of stack, all started now (the size applies to
    threads created while it is set, and a pool starts its threads lazily)."""
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    barrier = threading.Barrier(workers)
    previous = threading.stack_size(WORKER_STACK_BYTES)
    try:
        started = [executor.submit(barrier.wait, 30) for _ in range(workers)]
        for future in started:
            future.result()
    finally:
        threading.stack_size(previous)
    return executor


class FairShare:
    """At most `share` query-pool jobs of one client at once; its others wait their turn on the loop.

    Why: the query workers are few (two by default) and a job holds one until it ends or reaches
    the time limit. One secure client sending three never-ending queries at once (or queries past
    the memory limit, which make the worker restart) held both workers and three of the four
    query threads, and every other client's queries and subscribes waited for them: 503 "no query
    worker became free" for all of them. A client's share is one less than there are workers, so
    one worker is always left for the others. Its waiting jobs wait here, on the loop, not in a
    query thread. Clients are the secure gates' identities; the plain gates' clients (loopback
    only when security is on) are not told apart, as every local process shares an address."""

    def __init__(self, share: int) -> None:
        self.share = share
        self.waits = 0  # jobs that waited for an earlier job of their client (counted)
        self._clients: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}  # client -> (its turns, jobs in or waiting)

    @contextlib.asynccontextmanager
    async def turn(self, client: str | None) -> AsyncIterator[None]:
        """Within it, `client`'s job holds one of its turns (None: no client to share among)."""
        if client is None:
            yield
            return
        turns, jobs = self._clients.setdefault(client, (asyncio.Semaphore(self.share), [0]))
        jobs[0] += 1
        try:
            if turns.locked():
                self.waits += 1
            async with turns:
                yield
        finally:
            jobs[0] -= 1
            if not jobs[0]:
                del self._clients[client]


def _in_turn(workers: QueryWorkers, call: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`call` for a client of :class:`FairShare`, which keeps its turn until the worker its call cost
    (if any) is replaced: else it takes the worker left to the others while that one loads its
    replica (:meth:`QueryWorkers.await_successor`)."""
    try:
        return call(*args, **kwargs)
    finally:
        workers.await_successor()


class Scheduler:
    """Runs an :class:`Engine` off the event loop, with a bounded number of requests in flight."""

    def __init__(
        self,
        engine: Engine,
        *,
        queue_size: int = 1000,
        query_threads: int = 4,
        pending: PendingUpdates | None = None,
        max_pending: int = 100_000,
        max_pending_bytes: int = 64 << 20,
        max_pending_per_client: int = 10_000,
        max_pending_bytes_per_client: int = 4 << 20,
    ) -> None:
        self.engine = engine
        self.queue_size = queue_size
        self.in_flight = 0
        self.serial_in_flight = 0  # of in_flight: the serial calls (updates...), which a stop finishes
        self.rejected = 0
        self._updates = engine_executor(1, "sepa-update")
        self._queries = engine_executor(query_threads, "sepa-query")
        slots = query_threads if engine.workers is None else min(query_threads, engine.workers.count)
        self.shares = FairShare(max(1, slots - 1))
        # one client's queued serial calls at most: a quarter of the queue (see broker.serial_lanes)
        self._serial: SerialLanes[tuple[Callable[[], Any], asyncio.Future[Any]]] = SerialLanes(max(1, queue_size // 4))
        self._draining = False
        self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sepa-sync")
        self._sync_waiters: list[asyncio.Future[None]] = []
        self._sync_running = False
        self._syncer_process: JournalSyncer | None = None
        self._syncer_failed = False
        # coalescing subscriptions' re-evaluations (Engine.on_deferred): the loop that times them,
        # the one timer armed and when it fires
        self._flush_loop: asyncio.AbstractEventLoop | None = None
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flush_at = 0.0
        self._flushing = False
        self._due_while_flushing: float | None = None  # the earliest due asked for while a flush ran
        self._flusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sepa-flush")
        self.delayed = DelayedUpdates(
            self,
            pending if pending is not None else PendingUpdates(),
            max_pending=max_pending,
            max_pending_bytes=max_pending_bytes,
            max_pending_per_client=max_pending_per_client,
            max_pending_bytes_per_client=max_pending_bytes_per_client,
        )

    def _admit(self) -> None:
        if self.in_flight >= self.queue_size:
            self.rejected += 1
            raise TooManyRequests(f"the request queue is full ({self.queue_size} requests); retry later")

    async def _run(
        self,
        executor: ThreadPoolExecutor,
        call: Callable[..., Any],
        /,
        *args: Any,
        client: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """`call` on `executor`, admitted (:meth:`_admit`) and, for a `client`, in its turn among
        its calls (:class:`FairShare`; waiting, it counts as in flight: 429 bounds the waiting too)."""
        self._admit()
        self.in_flight += 1
        if client is not None and self.engine.workers is not None:
            call = functools.partial(_in_turn, self.engine.workers, call)
        try:
            async with self.shares.turn(client):
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(executor, functools.partial(_clean_errors, call, *args, **kwargs))
        finally:
            self.in_flight -= 1

    async def serialized(self, call: Callable[..., Any], /, *args: Any, lane: str | None = None, **kwargs: Any) -> Any:
        """Run an engine call that must not interleave with updates (updates, subscribe, unsubscribe).

        Calls queue in `lane` (a secure client, or None), in arrival order; the lanes take turns
        (:mod:`broker.serial_lanes`). One job on the update thread drains the queue, so a burst of
        updates costs one hand-over to the thread, not one each (the GIL makes hand-overs dear).
        """
        return await self.queue_serial(call, *args, lane=lane, **kwargs)

    def queue_serial(
        self, call: Callable[..., Any], /, *args: Any, lane: str | None = None, **kwargs: Any
    ) -> asyncio.Future[Any]:
        """Queue a serial call now, on the event loop; the future of its result. The serial calls of
        a lane run in the order they were queued (:meth:`serialized` is this, awaited)."""
        self._admit()
        try:
            return self._enqueue(functools.partial(call, *args, **kwargs), lane)
        except LaneFull:
            self.rejected += 1
            raise TooManyRequests(
                f"this client has {self._serial.lane_limit} requests queued already; retry later"
            ) from None

    def _enqueue(self, call: Callable[[], Any], lane: str | None) -> asyncio.Future[Any]:
        """Queue `call` in `lane` without admission (LaneFull past a client's lane limit)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._serial.append((call, future), lane)
        self.in_flight += 1
        self.serial_in_flight += 1
        future.add_done_callback(self._landed)  # first: before whoever awaits it resumes
        self._kick(loop)
        return future

    def _landed(self, _future: asyncio.Future[Any]) -> None:
        self.in_flight -= 1
        self.serial_in_flight -= 1

    def submit_due(self, call: Callable[[], Any], lane: str | None = None) -> asyncio.Future[Any]:
        """Queue a serial call that is due now in `lane` (its owner's), ahead of that lane's other
        calls; call on the event loop.

        For delayed updates falling due: they were admitted when scheduled, and their place in
        the order of a client's updates is their due time, which is earlier than the arrival of
        most of its requests still queued. They take turns with the other lanes like any call
        (:meth:`SerialLanes.append_due`).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._serial.append_due((call, future), lane)
        self._kick(loop)
        return future

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._draining:
            self._draining = True
            self._updates.submit(self._drain, loop)

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the update thread: run queued serial calls in order until the queue is empty.

        Group commit: the results of the calls run back to back are handed to the loop together,
        after one :meth:`RdfStore.sync` (a no-op in memory), so an update is acknowledged only once
        it is on stable storage and a burst of updates costs one fdatasync, not one each. A group
        ends when the queue runs dry, at GROUP_COMMIT_MAX calls, after the call that ends past
        GROUP_COMMIT_MAX_S from its first (a fast burst reaches the count about then: 256 updates
        of ~0.2 ms), or before the turn of a client whose last call ran longer than that (its next
        one would hold the replies of the calls before it: broker.serial_lanes)."""
        done: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        since = 0.0  # when the first call of `done` ended
        while True:
            try:
                if done and self._serial.next_is_slow():
                    self._acknowledge(loop, done)
                    done = []
                lane, (call, future) = self._serial.pop()
            except IndexError:
                if done:
                    self._acknowledge(loop, done)
                    done = []
                self._draining = False
                if not self._serial:
                    return
                self._draining = True  # something arrived between the two checks
                continue
            started = time.monotonic()
            try:
                with wakes_held(loop):  # the call's notifications wake the loop once, as it ends
                    done.append((future, _clean_errors(call), None))
            except BaseException as error:  # delivered to the awaiting request
                done.append((future, None, error))
            self._serial.ran(lane, time.monotonic() - started > GROUP_COMMIT_MAX_S)
            if len(done) == 1:
                since = time.monotonic()
            if len(done) >= GROUP_COMMIT_MAX or time.monotonic() - since > GROUP_COMMIT_MAX_S:
                self._acknowledge(loop, done)
                done = []

    def _acknowledge(
        self, loop: asyncio.AbstractEventLoop, done: list[tuple[asyncio.Future[Any], Any, BaseException | None]]
    ) -> None:
        """Sync the store, then settle `done` on the loop (one wake-up for all of them).

        An update still being processed (parallel mode: its future is not done) is settled when it
        is, after this sync, so its reply still comes after end of processing and on stable storage."""
        try:
            self.engine.store.sync()
        except OSError as problem:  # the disk failed us: nothing here may be called durable
            log.error("cannot sync the store's journal", extra={"error": str(problem)})
            failure = SepaError(f"the update could not be made durable: {problem}")
            done = [(future, None, failure if error is None else error) for future, _, error in done]
        ready = []
        for future, result, error in done:
            if isinstance(result, Future):
                if not result.done():
                    result.add_done_callback(functools.partial(_processed, loop, future))
                    continue
                result = result.result()
            ready.append((future, result, error))
        loop_handoff(loop)(_settle_all, ready)  # after the notifications handed over before it

    async def _durable(self) -> None:
        """Return once every delta applied so far is on stable storage: the group commit of inline
        updates. The fdatasync runs in a helper process (:mod:`broker.journal_sync`, which says
        why and what it saves) while the loop goes on serving, and applying further inline
        updates, which the next sync covers; the updates applied during one sync share the next.
        Should the helper fail to start or end, the sync runs on a thread of this process, as it
        did before the helper (0.69-0.78 of the updates/s of a build without a journal).

        Why not on the loop: an fdatasync may take tens of milliseconds on an SD card. Why inline
        updates on disk at all: measured with `bench wire --on-disk` on this 2-core machine,
        sending every on-disk update to the update thread for its group commit gave 699-706
        updates/s, inline updates with a threaded sync 750-1,100 (the build before durable
        acknowledgements: 1,270-1,600, alternated in the same session)."""
        loop = asyncio.get_running_loop()
        store = self.engine.store
        mark, index = store.sync_mark
        syncer = self._journal_syncer(loop)
        if syncer is not None:
            try:
                await syncer.durable(mark, index)
            except HelperGone:
                pass
            else:
                store.synced_to(syncer.synced)
                return
        future: asyncio.Future[None] = loop.create_future()
        self._sync_waiters.append(future)
        if not self._sync_running:
            self._start_sync(loop)
        await future

    def _journal_syncer(self, loop: asyncio.AbstractEventLoop) -> JournalSyncer | None:
        """The helper syncing the store's journal, started on first use; None once it has ended
        or could not start."""
        syncer = self._syncer_process
        if syncer is None and not self._syncer_failed:
            journals = self.engine.store.journal_paths
            try:
                if not journals:
                    raise OSError("the store has no journal")
                syncer = self._syncer_process = JournalSyncer(journals, loop)
            except OSError as problem:
                log.warning("cannot start the journal's sync helper", extra={"error": str(problem)})
                self._syncer_failed = True
        if syncer is not None and not syncer.alive:
            self._syncer_failed = True
            return None
        return syncer

    def _start_sync(self, loop: asyncio.AbstractEventLoop) -> None:
        waiters, self._sync_waiters = self._sync_waiters, []
        self._sync_running = True

        def synced(outcome: asyncio.Future[None]) -> None:
            self._sync_running = False
            problem = outcome.exception()
            if problem is not None:
                log.error("cannot sync the store's journal", extra={"error": str(problem)})
                problem = SepaError(f"the update could not be made durable: {problem}")
            for waiter in waiters:
                _settle(waiter, None, problem)
            if self._sync_waiters:
                self._start_sync(loop)

        loop.run_in_executor(self._syncer, self.engine.store.sync).add_done_callback(synced)

    async def run_query(self, call: Callable[..., Any], /, *args: Any, client: str | None = None, **kwargs: Any) -> Any:
        """Run any read-only engine call (query + serialization) on the query pool, in its turn
        among `client`'s (:class:`FairShare`)."""
        return await self._run(self._queries, call, *args, client=client, **kwargs)

    async def update(
        self, sparql: Request, *, yield_to_loop: bool = True, client: str | None = None, **options: Any
    ) -> UpdateResult:
        """Apply an update (text, or an Update syntax tree); returns after every subscription has processed it.

        `client`: the secure client sending it, whose queued updates take turns with the other
        clients' (:mod:`broker.serial_lanes`); None for the plain gates and the gateway's own.

        Tried inline first only when nothing is queued or running on the update thread, so
        updates still take effect in arrival order. Prepared updates are batches: never inline.
        An inline update then yields to the loop once, unless the caller already goes back to the
        loop after each update (`yield_to_loop=False`).
        """
        if isinstance(sparql, str) and len(sparql) <= INLINE_MAX_CHARS and not self._draining and not self._serial:
            try:  # _clean_errors spelled out: this is the path of every small update
                result: UpdateResult = self.engine.update(sparql, budget=INLINE_BUDGET, **options)
            except OverBudget:
                pass
            except BaseException as error:
                raise _cut(error) from None
            else:
                if self.engine.store.unsynced:
                    await self._durable()
                elif yield_to_loop:
                    # a client updating in a loop would otherwise never let the loop run anything
                    # else (the delayed-update timer, the gates) while it keeps finding nothing queued
                    await asyncio.sleep(0)
                return result
        # submit: in parallel mode the update thread goes on with the next update while this one's
        # subscriptions are processed; its reply comes once they are (see _acknowledge)
        return await self.serialized(self.engine.submit, sparql, lane=client, **options)  # type: ignore[no-any-return]

    async def query(self, sparql: str, **options: Any) -> QueryResult:
        return await self._run(self._queries, self.engine.query, sparql, **options)

    async def subscribe(
        self,
        sparql: str,
        callback: Callable[[Notification], None] | None = None,
        *,
        alias: str | None = None,
        default_graph_uri: Sequence[str] = (),
        named_graph_uri: Sequence[str] = (),
        prefixes: dict[str, str] | None = None,
    ) -> AsyncSubscription:
        """Subscribe; notifications go to `callback` (called on the loop), else to the async iterator."""
        to_loop = loop_handoff(asyncio.get_running_loop())
        handle = AsyncSubscription()

        def deliver(notification: Notification) -> None:
            if callback is not None:
                callback(notification)
            else:
                handle.queue.put_nowait(notification)

        def from_engine_thread(notification: Notification) -> None:
            to_loop(deliver, notification)

        handle.subscription = await self.engine_subscribe(
            sparql,
            from_engine_thread,
            alias=alias,
            default_graph_uri=default_graph_uri,
            named_graph_uri=named_graph_uri,
            prefixes=prefixes,
            nonblocking=True,
        )
        return handle

    async def engine_subscribe(
        self, sparql: str, callback: Callable[[Notification], None], *, trusted: bool = False, **options: Any
    ) -> Subscription:
        """:meth:`Engine.subscribe` on the update thread, after :meth:`Engine.probe` on the query pool.

        Why the probe: subscribe evaluates the query on the update thread, where nothing can stop
        it; the probe evaluates it first where the time limit can (the query workers), so a query
        that never ends costs its client an error, not every client the update thread. A `trusted`
        subscriber (code of this process) is not probed, and its re-evaluations are not limited."""
        if not trusted:
            options["probed"] = await self.probe_subscription(sparql, **options)
        return await self.queue_subscribe(sparql, callback, trusted=trusted, **options)  # type: ignore[no-any-return]

    async def probe_subscription(self, sparql: str, *, client: str | None = None, **options: Any) -> Probed | None:
        """The probe of :meth:`engine_subscribe` alone (`options` as there), in its turn among
        `client`'s (:class:`FairShare`); pass what it returns to :meth:`queue_subscribe` as `probed`."""
        probed = ("default_graph_uri", "named_graph_uri", "prefixes")
        return await self.run_query(  # type: ignore[no-any-return]
            self.engine.probe, sparql, client=client, **{k: v for k, v in options.items() if k in probed}
        )

    def queue_subscribe(
        self, sparql: str, callback: Callable[[Notification], None], *, trusted: bool = False, **options: Any
    ) -> asyncio.Future[Any]:
        """The subscribe of :meth:`engine_subscribe` alone, queued now (serial calls keep their order).
        `coalesce_s` in `options`: see :meth:`Engine.subscribe`; this scheduler times the engine's
        deferred re-evaluations from then on."""
        if options.get("coalesce_s"):
            self._time_deferred(asyncio.get_running_loop())
        return self.queue_serial(self.engine.subscribe, sparql, callback, limited=not trusted, **options)

    def _time_deferred(self, loop: asyncio.AbstractEventLoop) -> None:
        """Become the engine's flusher (:meth:`Engine.on_deferred`), timing on `loop`."""
        if self._flush_loop is loop:
            return
        self._flush_loop = loop

        def due_at(due: float) -> None:  # any thread, at most once per interval per subscription
            with contextlib.suppress(RuntimeError):  # the loop is closed: the gateway stops
                loop.call_soon_threadsafe(self._arm_flush, due)

        self.engine.on_deferred(due_at)

    def _arm_flush(self, due: float) -> None:
        """On the loop: the engine's deferred re-evaluations run on a thread of their own at `due`
        (time.monotonic(), which is the loop's clock), unless a timer fires earlier already; while
        they run, at the earliest of `due` and what they tell is due next as they end.

        Why a due that comes while they run is kept: the flush tells what is due next from its
        last look at the engine, and an update that made a subscription due after that look (the
        engine asks once, when the subscription becomes due) came here before the flush's end
        did. Dropped, that subscription stayed due with no timer and was told nothing more (the
        dashboard's tiles froze while readings were stored) until another subscriber joined it."""
        loop = self._flush_loop
        if loop is None:  # closed
            return
        if self._flushing:
            if self._due_while_flushing is None or due < self._due_while_flushing:
                self._due_while_flushing = due
            return
        if self._flush_timer is not None:
            if self._flush_at <= due:
                return
            self._flush_timer.cancel()
        self._flush_at = due
        self._flush_timer = loop.call_at(due, self._flush)

    def _flush(self) -> None:
        self._flush_timer = None
        loop = self._flush_loop
        if loop is None:  # closed
            return
        self._flushing = True
        loop.run_in_executor(self._flusher, self.engine.flush_deferred).add_done_callback(self._flushed)

    def _flushed(self, future: asyncio.Future[Any]) -> None:
        self._flushing = False
        asked, self._due_while_flushing = self._due_while_flushing, None
        if future.cancelled():
            return
        if asked is not None:
            self._arm_flush(asked)
        if future.exception() is not None:  # the SPUs still waiting are tried again in a second
            log.error("deferred re-evaluations failed", extra={"error": repr(future.exception())[:300]})
            self._arm_flush(time.monotonic() + 1.0)
            return
        if future.result() is not None:
            self._arm_flush(future.result())

    async def unsubscribe(self, spuid: str) -> Subscription:
        """End a subscription on the update thread, in the shared lane's order; never refused.

        Why no admission (429): an unsubscribe frees what its subscription holds, and a subscription
        is ended once (twice when two paths race to end it: the second is NotFound), so they are
        bounded by the subscriptions (max_subscriptions). Refused, the subscription of a socket
        that had gone lived on with no client: 3,000 sockets reset with five subscribes in flight
        each filled the queue with their probes, 10,490 calls got 429, among them the unsubscribes
        of their subscriptions, and 119 subscriptions were left behind, re-evaluated at every update
        and counted toward max_subscriptions until a restart (the churn pass;
        `tests/broker/gates/test_websocket_reset.py`)."""
        return await self._enqueue(functools.partial(self.engine.unsubscribe, spuid), None)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Finish queued updates, then stop the threads. Queries change nothing: those still queued
        are dropped and a running one is not waited for (one may wait on a SERVICE endpoint that
        never answers; see :attr:`queries_running`)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self._flush_loop = None
        self._flusher.shutdown(wait=True)
        self._updates.shutdown(wait=True)
        self._syncer.shutdown(wait=True)
        if self._syncer_process is not None:
            self._syncer_process.close()
        self._queries.shutdown(wait=False, cancel_futures=True)
        self.engine.close()
        if self.engine.workers is not None:
            self.engine.workers.close()

    @property
    def queries_running(self) -> int:
        """Query threads still alive after :meth:`close` (blocked in an evaluation that cannot be stopped)."""
        return sum(1 for thread in threading.enumerate() if thread.name.startswith("sepa-query") and thread.is_alive())
