"""InProcessTransport: the client API straight onto the engine, through the scheduler.

Why through the :class:`~broker.scheduler.Scheduler` and not the engine directly: the scheduler is
the one path every update takes (ARCHITECTURE.md principle 2), it keeps blocking engine calls off
the event loop, and it applies the same admission control (429) to adapters as to HTTP clients.
No sockets, no JSON: results and notifications are the engine's own objects, handed over by
reference.

``inline=True`` runs the engine calls on the event loop's own thread instead (the engine is
thread-safe; a call made while the scheduler's thread holds the engine waits for it). Under the
GIL a second thread buys responsiveness, not parallelism, and each hop to it and back costs about
as much as a small update (~60 us on this 2-core VM: +90 % on the lighting LAMP profile). Inline
calls block the loop for the duration of each engine call, so use it only for producers of small,
frequent updates in a process that has nothing latency-critical on its loop (tools/client_overhead
measures both); the gateway's own gates always go through the scheduler's thread.

Notifications are produced on the engine's update thread (or the loop's own, for inline
updates); they reach the sink through the scheduler's :func:`~broker.scheduler.loop_handoff`, the
same hand-off the WebSocket gate uses, which preserves their order and drops a notification that
races with the loop's shutdown rather than raising it into the engine thread.

Delayed updates go to the scheduler's :class:`~broker.delayed.DelayedUpdates` (``scheduler.delayed``),
the table and timer the HTTP gate uses too, so an adapter's delayed update and a remote client's
are listed, cancelled and fired alike. The timer runs on the event loop of the first delayed
update; a transport that built its own scheduler stops it on close.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from broker.api import (
    Engine,
    NotFound,
    Notification,
    PendingUpdate,
    QueryResult,
    Scheduler,
    SepaError,
    Subscription,
    Update,
    due_micros,
    loop_handoff,
    now_micros,
)
from gateway.client.errors import SepaClientError
from gateway.client.transport import NotificationSink, Scheduled, TransportSubscription, UpdateSummary


def scheduled_of(entry: PendingUpdate, *, full: bool = False) -> Scheduled:
    """A pending update as the HTTP gate shows it: id and due, and with `full` its SPARQL and creation."""
    if not full:
        return Scheduled(entry.id, Scheduled.instant(entry.due_us))
    return Scheduled(entry.id, Scheduled.instant(entry.due_us), entry.sparql, Scheduled.instant(entry.created_us))


class InProcessTransport:
    """A :class:`~gateway.client.transport.Transport` over a Scheduler (or an Engine it wraps in one)."""

    def __init__(
        self, broker: Scheduler | Engine, *, queue_size: int = 1000, inline: bool = False, trusted: bool = True
    ) -> None:
        """`trusted`: requests are this process's code, evaluated without time limits. A transport
        acting for peers on the network (the CoAP adapter's `/q`) is not: its queries run in the
        time-limited query workers and its subscriptions are probed there first, like a network
        client's (broker/scheduler.py, `Scheduler.engine_subscribe`)."""
        self.inline = inline
        self.trusted = trusted
        if isinstance(broker, Engine):
            self.scheduler = Scheduler(broker, queue_size=queue_size)
            self._owns_scheduler = True
        else:
            self.scheduler = broker
            self._owns_scheduler = False
        self._subscriptions: dict[str, TransportSubscription] = {}
        self._orphans: set[asyncio.Future[Subscription]] = set()
        self._closed = False

    @property
    def engine(self) -> Engine:
        return self.scheduler.engine

    def _check_open(self) -> None:
        if self._closed:
            raise SepaClientError("invalid_request", "the client is closed", 400)

    async def query(
        self, sparql: str, *, default_graph_uri: Sequence[str] = (), named_graph_uri: Sequence[str] = ()
    ) -> QueryResult:
        self._check_open()
        try:
            result: QueryResult = await self.scheduler.query(
                sparql,
                default_graph_uri=tuple(default_graph_uri),
                named_graph_uri=tuple(named_graph_uri),
                trusted=self.trusted,  # code of this process: evaluated here, not in a time-limited worker
            )
        except SepaError as error:
            raise SepaClientError.from_engine(error) from error
        return result

    async def update(
        self,
        sparql: str | Update,
        *,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
        quads: bool = False,
    ) -> UpdateSummary:
        self._check_open()
        options = {
            "using_graph_uri": tuple(using_graph_uri),
            "using_named_graph_uri": tuple(using_named_graph_uri),
            "trusted": self.trusted,  # code of this process, not a network client: no time limit (broker.workers)
        }
        try:
            if self.inline:
                result = self.engine.update(sparql, **options)  # type: ignore[arg-type]
            else:
                result = await self.scheduler.update(sparql, **options)
        except SepaError as error:
            raise SepaClientError.from_engine(error) from error
        return UpdateSummary.of(result, quads=quads)

    async def schedule(
        self,
        sparql: str,
        *,
        delay: str | None = None,
        at: str | None = None,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
    ) -> Scheduled:
        self._check_open()
        try:
            due = due_micros(delay, at, now_micros())
            if due is None:
                raise SepaClientError("invalid_request", "a delayed update needs a delay or an at", 400)
            entry = await self.scheduler.delayed.schedule(
                sparql,
                due,
                relative=delay is not None,
                using_graph_uri=tuple(using_graph_uri),
                using_named_graph_uri=tuple(using_named_graph_uri),
            )
        except SepaError as error:
            raise SepaClientError.from_engine(error) from error
        return scheduled_of(entry)

    async def scheduled(self) -> list[Scheduled]:
        self._check_open()
        try:
            entries = await self.scheduler.delayed.list()
        except SepaError as error:
            raise SepaClientError.from_engine(error) from error
        return [scheduled_of(entry, full=True) for entry in entries]

    async def cancel_scheduled(self, id: str) -> Scheduled:
        self._check_open()
        try:
            entry = await self.scheduler.delayed.cancel(id)
        except SepaError as error:
            raise SepaClientError.from_engine(error) from error
        return scheduled_of(entry)

    async def subscribe(
        self,
        sparql: str,
        sink: NotificationSink,
        *,
        alias: str | None = None,
        default_graph_uri: Sequence[str] = (),
        named_graph_uri: Sequence[str] = (),
    ) -> TransportSubscription:
        self._check_open()
        to_loop = loop_handoff(asyncio.get_running_loop())
        handle = TransportSubscription(sparql, sink, alias, tuple(default_graph_uri), tuple(named_graph_uri))

        def deliver(notification: Notification) -> None:
            if handle.active:
                sink.notify(notification, resync=False)

        def from_engine_thread(notification: Notification) -> None:
            to_loop(deliver, notification)

        call = asyncio.ensure_future(
            self.scheduler.engine_subscribe(
                sparql,
                from_engine_thread,
                alias=alias,
                default_graph_uri=handle.default_graph_uri,
                named_graph_uri=handle.named_graph_uri,
                trusted=self.trusted,
            )
        )
        try:
            subscription = await asyncio.shield(call)
        except SepaError as error:
            raise SepaClientError.from_engine(error, alias=alias) from error
        except asyncio.CancelledError:
            # the engine thread may still complete the subscription: end it then, or it would leak
            handle.active = False
            call.add_done_callback(self._end_orphan)
            raise
        handle.spuid = subscription.spuid
        self._subscriptions[handle.spuid] = handle
        # sequence 0 was queued on the loop before the executor's result, so it has
        # already been delivered; yield once anyway so this holds for any future scheduler too
        await asyncio.sleep(0)
        return handle

    def _end_orphan(self, call: asyncio.Future[Subscription]) -> None:
        if not call.cancelled() and call.exception() is None:
            task = asyncio.ensure_future(self.scheduler.unsubscribe(call.result().spuid))
            self._orphans.add(task)
            task.add_done_callback(self._orphans.discard)

    async def unsubscribe(self, subscription: TransportSubscription) -> None:
        subscription.active = False
        if self._subscriptions.pop(subscription.spuid, None) is None:
            return
        try:
            await self.scheduler.unsubscribe(subscription.spuid)
        except NotFound:
            pass  # already ended on the engine side: the caller's wish is fulfilled
        except SepaError as error:
            raise SepaClientError.from_engine(error) from error

    async def close(self) -> None:
        """Unsubscribe everything (the engine would otherwise keep calling into this loop)."""
        if self._closed:
            return
        self._closed = True
        for handle in list(self._subscriptions.values()):
            handle.active = False
            with contextlib.suppress(SepaError):
                await self.scheduler.unsubscribe(handle.spuid)
        self._subscriptions.clear()
        if self._owns_scheduler:
            await self.scheduler.delayed.stop()  # pending updates stay in its table, not run
            await asyncio.to_thread(self.scheduler.close)
