"""asyncio facade of the engine: nothing here blocks the event loop.

Updates (and subscribe/unsubscribe, which must not interleave with an update) run one at a time
on a dedicated thread, in arrival order; queries run on a small thread pool, concurrently with
each other and with updates. Notifications produced on the update thread are handed to the loop
thread-safely, so an :class:`AsyncSubscription` is consumed with `async for`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from broker.core.engine import Engine
from broker.core.notification import Notification
from broker.core.results import QueryResult, UpdateResult
from broker.core.subscription import Subscription


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


class AsyncEngine:
    """Runs an :class:`Engine` off the event loop."""

    def __init__(self, engine: Engine, *, query_threads: int = 4) -> None:
        self.engine = engine
        self._updates = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sepa-update")
        self._queries = ThreadPoolExecutor(max_workers=query_threads, thread_name_prefix="sepa-query")

    async def _run(self, executor: ThreadPoolExecutor, call: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, functools.partial(call, *args, **kwargs))

    async def update(self, sparql: str, **options: Any) -> UpdateResult:
        """Apply an update; returns after every subscription has processed it."""
        return await self._run(self._updates, self.engine.update, sparql, **options)

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
        """Subscribe; notifications go to `callback` (called on the loop) and to the async iterator."""
        loop = asyncio.get_running_loop()
        handle = AsyncSubscription()

        def deliver(notification: Notification) -> None:
            handle.queue.put_nowait(notification)
            if callback is not None:
                callback(notification)

        def from_engine_thread(notification: Notification) -> None:
            loop.call_soon_threadsafe(deliver, notification)

        handle.subscription = await self._run(
            self._updates,
            self.engine.subscribe,
            sparql,
            from_engine_thread,
            alias=alias,
            default_graph_uri=default_graph_uri,
            named_graph_uri=named_graph_uri,
            prefixes=prefixes,
        )
        return handle

    async def unsubscribe(self, spuid: str) -> Subscription:
        return await self._run(self._updates, self.engine.unsubscribe, spuid)

    def close(self) -> None:
        """Finish queued updates, then stop the threads."""
        self._updates.shutdown(wait=True)
        self._queries.shutdown(wait=True)
