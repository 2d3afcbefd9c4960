"""SyncSepaClient: the client API for scripts that are not written with asyncio.

Why a background event loop rather than a second, blocking implementation: the asyncio client is
the one that is tested against both transports, reconnects and keeps the views; a thread running
its own loop gives scripts the same behaviour with blocking calls. Every method submits a
coroutine to that loop and waits for its result. Subscription callbacks run on the loop's thread,
in order: they must not block for long (hand work to a queue or another thread), and they must
not call this facade's blocking methods (that would wait for the thread they run on; use the
``client`` attribute's coroutines or a queue instead).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar, overload

from broker.api import Notification, QueryResult
from gateway.client.client import ClientSubscription, Graphs, SepaClient
from gateway.client.delays import Delay, Instant
from gateway.client.errors import SepaClientError
from gateway.client.transport import Scheduled, Transport, UpdateSummary
from gateway.client.view import ResultView

T = TypeVar("T")


class SyncSubscription:
    """A subscription of the synchronous client; `view` is safe to read between notifications."""

    def __init__(self, owner: SyncSepaClient, subscription: ClientSubscription) -> None:
        self._owner = owner
        self.subscription = subscription

    @property
    def view(self) -> ResultView:
        return self.subscription.view

    @property
    def spuid(self) -> str:
        return self.subscription.spuid

    @property
    def alias(self) -> str | None:
        return self.subscription.alias

    @property
    def sequence(self) -> int:
        return self.subscription.sequence

    def unsubscribe(self) -> None:
        self._owner.unsubscribe(self)


class SyncSepaClient:
    """Blocking facade over :class:`SepaClient`; the transport is built by `transport` or a factory."""

    def __init__(self, transport: Transport | Callable[[], Transport], *, timeout_s: float | None = 60.0) -> None:
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name="sepa-sync-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        self._closed = False

        async def build() -> SepaClient:
            # built on the loop: transports and subscriptions create loop-bound objects lazily
            return SepaClient(transport if isinstance(transport, Transport) else transport())

        self.client: SepaClient = self._call(build())

    @classmethod
    def network(cls, query_url: str, update_url: str, subscribe_url: str, **options: Any) -> SyncSepaClient:
        """A synchronous client over a :class:`~gateway.client.network.NetworkTransport`."""
        from gateway.client.network import NetworkTransport

        return cls(lambda: NetworkTransport(query_url, update_url, subscribe_url, **options))

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a blocking SyncSepaClient method was called from its own loop thread (a callback)")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(self.timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def query(self, sparql: str, *, default_graph_uri: Graphs = None, named_graph_uri: Graphs = None) -> QueryResult:
        return self._call(
            self.client.query(sparql, default_graph_uri=default_graph_uri, named_graph_uri=named_graph_uri)
        )

    @overload
    def update(
        self,
        sparql: str,
        *,
        using_graph_uri: Graphs = None,
        using_named_graph_uri: Graphs = None,
        delay: None = None,
        at: None = None,
        quads: bool = False,
    ) -> UpdateSummary: ...

    @overload
    def update(
        self,
        sparql: str,
        *,
        using_graph_uri: Graphs = None,
        using_named_graph_uri: Graphs = None,
        delay: Delay,
        at: None = None,
    ) -> Scheduled: ...

    @overload
    def update(
        self,
        sparql: str,
        *,
        using_graph_uri: Graphs = None,
        using_named_graph_uri: Graphs = None,
        delay: None = None,
        at: Instant,
    ) -> Scheduled: ...

    def update(
        self,
        sparql: str,
        *,
        using_graph_uri: Graphs = None,
        using_named_graph_uri: Graphs = None,
        delay: Delay | None = None,
        at: Instant | None = None,
        quads: bool = False,
    ) -> UpdateSummary | Scheduled:
        """Apply an update now, or schedule it with `delay` / `at` (see :meth:`SepaClient.update`)."""
        return self._call(
            self.client.update(  # type: ignore[call-overload]
                sparql,
                using_graph_uri=using_graph_uri,
                using_named_graph_uri=using_named_graph_uri,
                delay=delay,
                at=at,
                quads=quads,
            )
        )

    def scheduled(self) -> list[Scheduled]:
        """The broker's pending delayed updates, in due order."""
        return self._call(self.client.scheduled())

    def cancel_scheduled(self, id: str | Scheduled) -> Scheduled:
        """Cancel a pending delayed update (SepaClientError not_found when unknown or already run)."""
        return self._call(self.client.cancel_scheduled(id))

    def subscribe(
        self,
        sparql: str,
        callback: Callable[[Notification], None] | None = None,
        *,
        alias: str | None = None,
        default_graph_uri: Graphs = None,
        named_graph_uri: Graphs = None,
    ) -> SyncSubscription:
        """Subscribe; `callback` gets every notification (sequence 0 first) on the client's thread."""
        subscription = self._call(
            self.client.subscribe(
                sparql,
                alias,
                default_graph_uri=default_graph_uri,
                named_graph_uri=named_graph_uri,
                on_notification=callback,
                iterate=False,
            )
        )
        return SyncSubscription(self, subscription)

    def unsubscribe(self, subscription: SyncSubscription) -> None:
        self._call(self.client.unsubscribe(subscription.subscription))

    def close(self) -> None:
        """Close the client, then stop the loop and join its thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self.client.close())
        except SepaClientError:
            pass
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SyncSepaClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
