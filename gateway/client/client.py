"""SepaClient and ClientSubscription: the asyncio client API over any transport.

Why the sequence numbers and the result view live here and not in the transports: what the
application sees must not depend on how requests travel. Each :class:`ClientSubscription` keeps
its own counter and its :class:`~gateway.client.view.ResultView`, and turns what the transport
delivers into the notifications the application sees:

* The application's sequence numbers count the notifications delivered to it: 0 for the first
  (the complete result), then +1 per notification, for the whole life of the subscription, across
  reconnections. Without reconnection they equal the broker's numbers (and the in-process
  transport's engine objects are passed through untouched); after a re-subscription the broker
  starts again at 0 while the application's numbers simply continue.
* The ``spuid`` the application sees is the first one the broker assigned, stable for the life of
  the subscription; the broker's current one is in ``notification.extra["server_spuid"]`` when it
  differs (and ``extra["server_sequence"]`` the broker's number).
* After a re-subscription the broker's new sequence 0 (the complete result) is diffed against the
  view and delivered as ONE notification of the rows added and removed meanwhile, marked
  ``extra["resync"] = True``, and only if something changed: the application never sees a row
  twice and never misses a change.

Delivery: the view is updated as soon as a notification arrives; then the notification goes to
``on_notification`` (called in order on the event loop; a coroutine function is awaited before the
next notification is handed over) or, without a callback, to the subscription's queue read by
``async for notification in subscription``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, overload

from broker.api import Notification, QueryResult, Update
from gateway.client.delays import Delay, Instant, due_params
from gateway.client.errors import SepaClientError
from gateway.client.transport import Scheduled, Transport, TransportSubscription, UpdateSummary
from gateway.client.view import ResultView

log = logging.getLogger(__name__)

NotificationHandler = Callable[[Notification], Awaitable[None] | None]
Graphs = str | Sequence[str] | None


def graph_list(graphs: Graphs) -> tuple[str, ...]:
    """Graph IRIs as a tuple: accepts one IRI, a sequence of IRIs or None (JSAP files use both forms)."""
    if graphs is None:
        return ()
    if isinstance(graphs, str):
        return (graphs,)
    return tuple(graphs)


class _End:
    """Queue marker: the subscription ended (error None: unsubscribed)."""

    def __init__(self, error: SepaClientError | None) -> None:
        self.error = error


class ClientSubscription:
    """One subscription as the application sees it: a view, a sequence counter, a notification stream."""

    def __init__(
        self,
        client: SepaClient,
        sparql: str,
        alias: str | None,
        on_notification: NotificationHandler | None,
        iterate: bool,
        keep_view: bool = True,
    ) -> None:
        self.client = client
        self.sparql = sparql
        self.alias = alias
        # None when the application keeps its own state (a mirror of a large graph would double memory)
        self.view: ResultView | None = ResultView() if keep_view else None
        self.spuid = ""
        self.sequence = -1  # the last sequence number delivered to the application
        self.resyncs = 0  # re-subscriptions after reconnects (with or without a visible diff)
        self.error: SepaClientError | None = None
        self.closed = False
        self.handle: TransportSubscription | None = None
        self._callback = on_notification
        self._queue: asyncio.Queue[Notification | _End] | None = asyncio.Queue() if iterate else None
        self._calls: asyncio.Queue[Notification | _End] | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        if on_notification is not None:
            self._calls = asyncio.Queue()
            self._dispatcher = asyncio.create_task(self._dispatch(), name=f"sepa-subscription-{alias or ''}")

    # -- NotificationSink (called by the transport, on the event loop) -----------------------------

    def notify(self, notification: Notification, *, resync: bool) -> None:
        if self.closed:
            return
        if resync:
            self.resyncs += 1
            if self.view is None:  # no view to diff against: the complete result, marked as such
                extra = {"resync": True, "server_spuid": notification.spuid, "server_sequence": notification.sequence}
                notification = dataclasses.replace(notification, removed=(), extra={**notification.extra, **extra})
            else:
                synthetic = self._resync(notification)
                if synthetic is None:
                    return
                notification = synthetic
        elif not self.spuid:
            self.spuid = notification.spuid
        notification = self._for_application(notification)
        if self.view is not None:
            self.view.apply(notification)
        self._hand_over(notification)

    def lost(self, error: SepaClientError) -> None:
        if self.closed:
            return
        self.closed, self.error = True, error
        self.client._subscriptions.pop(self, None)
        log.error("subscription %s ended: %s", self.alias or self.spuid, error)
        self._hand_over(_End(error))

    # -- what the application sees ------------------------------------------------------------------

    def _resync(self, full: Notification) -> Notification | None:
        """The one notification that takes the view to the complete result `full` (None: no change)."""
        assert self.view is not None
        extra = {"resync": True, "server_spuid": full.spuid, "server_sequence": full.sequence}
        if full.boolean is not None:
            if full.boolean == self.view.boolean:
                return None
            return Notification(
                self.spuid,
                self.alias,
                self.sequence + 1,
                (),
                boolean=full.boolean,
                previous=self.view.boolean,
                extra=extra,
            )
        added, removed = self.view.diff(full)
        if not added and not removed:
            return None
        variables = self.view.variables or full.variables
        return Notification(self.spuid, self.alias, self.sequence + 1, variables, added, removed, extra=extra)

    def _for_application(self, notification: Notification) -> Notification:
        self.sequence += 1
        if (
            notification.sequence == self.sequence
            and notification.spuid == self.spuid
            and notification.alias == self.alias
        ):
            return notification  # the common case: the transport's object, untouched
        extra = {**notification.extra, "server_spuid": notification.spuid, "server_sequence": notification.sequence}
        return dataclasses.replace(
            notification, spuid=self.spuid, alias=self.alias, sequence=self.sequence, extra=extra
        )

    def _hand_over(self, item: Notification | _End) -> None:
        if self._queue is not None:
            self._queue.put_nowait(item)
        if self._calls is not None:
            self._calls.put_nowait(item)

    async def _dispatch(self) -> None:
        assert self._calls is not None and self._callback is not None
        while True:
            item = await self._calls.get()
            if isinstance(item, _End):
                return
            try:
                outcome = self._callback(item)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:
                log.exception("on_notification failed for %s (sequence %d)", self.alias or self.spuid, item.sequence)

    # -- the application's side -----------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Notification]:
        return self

    async def __anext__(self) -> Notification:
        if self._queue is None:
            raise TypeError("this subscription delivers to on_notification; subscribe with iterate=True to iterate")
        item = await self._queue.get()
        if isinstance(item, _End):
            self._queue.put_nowait(item)  # every later call ends too
            if item.error is not None:
                raise item.error
            raise StopAsyncIteration
        return item

    async def next(self, timeout: float | None = None) -> Notification:
        """The next notification (TimeoutError after `timeout` seconds; StopAsyncIteration when ended)."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    async def unsubscribe(self) -> None:
        await self.client.unsubscribe(self)

    def _finish(self) -> None:
        if not self.closed:
            self.closed = True
            self._hand_over(_End(None))

    async def _drain(self) -> None:
        """Let the callback see everything delivered before the end (used by unsubscribe/close)."""
        dispatcher = self._dispatcher
        if dispatcher is not None and not dispatcher.done() and asyncio.current_task() is not dispatcher:
            # (skipped inside the callback itself: a callback that unsubscribes must not wait for itself)
            await asyncio.shield(dispatcher)

    def __repr__(self) -> str:
        return f"ClientSubscription({self.alias!r}, {self.spuid!r}, sequence={self.sequence}, {self.view!r})"


class SepaClient:
    """The asyncio client of a SEPA broker over one :class:`~gateway.client.transport.Transport`."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._subscriptions: dict[ClientSubscription, None] = {}
        self._closed = False

    @property
    def subscriptions(self) -> list[ClientSubscription]:
        """The live subscriptions, in the order they were made."""
        return list(self._subscriptions)

    async def query(
        self, sparql: str, *, default_graph_uri: Graphs = None, named_graph_uri: Graphs = None
    ) -> QueryResult:
        """Evaluate a query; SELECT rows are tuples of pyoxigraph terms in `variables` order."""
        return await self.transport.query(
            sparql, default_graph_uri=graph_list(default_graph_uri), named_graph_uri=graph_list(named_graph_uri)
        )

    @overload
    async def update(
        self,
        sparql: str | Update,
        *,
        using_graph_uri: Graphs = None,
        using_named_graph_uri: Graphs = None,
        delay: None = None,
        at: None = None,
        quads: bool = False,
    ) -> UpdateSummary: ...

    @overload
    async def update(
        self,
        sparql: str,
        *,
        using_graph_uri: Graphs = None,
        using_named_graph_uri: Graphs = None,
        delay: Delay,
        at: None = None,
    ) -> Scheduled: ...

    @overload
    async def update(
        self,
        sparql: str,
        *,
        using_graph_uri: Graphs = None,
        using_named_graph_uri: Graphs = None,
        delay: None = None,
        at: Instant,
    ) -> Scheduled: ...

    async def update(
        self,
        sparql: str | Update,
        *,
        using_graph_uri: Graphs = None,
        using_named_graph_uri: Graphs = None,
        delay: Delay | None = None,
        at: Instant | None = None,
        quads: bool = False,
    ) -> UpdateSummary | Scheduled:
        """Apply an update now, or have the broker apply it later (seed 001 §II-C, delayed update).

        Without `delay` / `at`: returns once every subscription of the broker has processed the
        update. With `delay` (int milliseconds, a timedelta or an ISO 8601 duration such as
        ``"PT30S"``) or `at` (an aware datetime or an RFC 3339 string): returns a
        :class:`Scheduled` once the broker has checked and stored it; its subscriptions are notified
        when it runs. A bad delay or instant is refused (invalid_request, 400) before anything is
        sent. `sparql` may be a :class:`~broker.api.Update` syntax tree (in-process
        producers of large batches): a delayed one is stored as its text. With `quads`, the
        summary's `result` holds the quads the update really added and removed, whatever the
        transport (over the network the broker sends them on request: docs/protocol.md).
        """
        using, named = graph_list(using_graph_uri), graph_list(using_named_graph_uri)
        if delay is None and at is None:
            return await self.transport.update(sparql, using_graph_uri=using, using_named_graph_uri=named, quads=quads)
        if quads:
            raise SepaClientError("invalid_request", "a delayed update has no quads to return yet", 400)
        delay_text, at_text = due_params(delay, at)
        return await self.transport.schedule(
            sparql if isinstance(sparql, str) else sparql.to_sparql(),
            delay=delay_text,
            at=at_text,
            using_graph_uri=using,
            using_named_graph_uri=named,
        )

    async def scheduled(self) -> list[Scheduled]:
        """The broker's pending delayed updates (every client's), in due order, with their SPARQL."""
        return await self.transport.scheduled()

    async def cancel_scheduled(self, id: str | Scheduled) -> Scheduled:
        """Cancel a pending delayed update (by id or by the Scheduled that `update` returned).

        Raises SepaClientError not_found (404) when the broker has no such pending update: unknown,
        cancelled already, or already run.
        """
        return await self.transport.cancel_scheduled(id.id if isinstance(id, Scheduled) else id)

    async def subscribe(
        self,
        sparql: str,
        alias: str | None = None,
        *,
        default_graph_uri: Graphs = None,
        named_graph_uri: Graphs = None,
        on_notification: NotificationHandler | None = None,
        iterate: bool | None = None,
        keep_view: bool = True,
    ) -> ClientSubscription:
        """Subscribe to a SELECT or ASK query.

        Returns once the first notification (sequence 0, the complete result) is in the view. With
        `on_notification` the notifications go to it; without, to ``async for``. `iterate` forces
        the queue on or off (off when only the view matters, so nothing piles up unread).
        `keep_view=False` keeps no view (``subscription.view`` is None): for applications that keep
        their own state of a large result; after a reconnect they get the complete result again as
        one notification whose ``extra["resync"]`` is True.
        """
        if self._closed:
            raise SepaClientError("invalid_request", "the client is closed", 400)
        iterate = on_notification is None if iterate is None else iterate
        subscription = ClientSubscription(self, sparql, alias, on_notification, iterate, keep_view)
        try:
            subscription.handle = await self.transport.subscribe(
                sparql,
                subscription,
                alias=alias,
                default_graph_uri=graph_list(default_graph_uri),
                named_graph_uri=graph_list(named_graph_uri),
            )
        except BaseException:
            subscription._finish()
            raise
        self._subscriptions[subscription] = None
        return subscription

    async def unsubscribe(self, subscription: ClientSubscription) -> None:
        """End a subscription; its iterator stops after the notifications already delivered."""
        self._subscriptions.pop(subscription, None)
        handle = subscription.handle
        subscription._finish()
        if handle is not None and handle.active:
            await self.transport.unsubscribe(handle)
        await subscription._drain()

    async def close(self) -> None:
        """End every subscription and release the transport (sockets, threads)."""
        if self._closed:
            return
        self._closed = True
        subscriptions = list(self._subscriptions)
        self._subscriptions.clear()
        for subscription in subscriptions:
            subscription._finish()
        await self.transport.close()
        for subscription in subscriptions:
            await subscription._drain()

    async def __aenter__(self) -> SepaClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def rows_as_bindings(variables: Sequence[str], rows: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Rows as {variable: term} dicts (unbound variables left out): the form agents hand to callbacks."""
    return [{name: term for name, term in zip(variables, row, strict=True) if term is not None} for row in rows]
