"""Slow requests: a request's head must arrive within a time limit of its first byte (slowloris).

Why: aiohttp times out idle kept-alive connections (``keepalive_timeout``) but not a request
whose header lines trickle in, a byte every few seconds; a few hundred such connections hold as
many descriptors and handler objects forever. aiohttp has no header timeout, so the request
handler here arms a timer at the first byte of a request and the dispatcher disarms it when the
head is complete (the handler runs); past it the client gets ``408 Request Timeout`` and the
connection is closed. Bodies are read under the same limit by the handlers (:func:`read_within`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from broker.errors import SepaError
from broker.gates.connections import ConnectionLimit

T = TypeVar("T")
_SERVER_OPTIONS = ("request_factory", "handler_cancellation", "loop")  # web.Server's own, not the handler's
_TIMEOUT_REPLY = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class RequestTimeout(SepaError):
    error = "request_timeout"
    status_code = 408


class GuardedHandler(web.RequestHandler):
    """aiohttp's request handler, with a timer on the arrival of each request's head."""

    head_timeout_s = 20.0
    on_timeout: Callable[[], None] = staticmethod(lambda: None)  # type: ignore[assignment]

    def __init__(self, *args: Any, limit: ConnectionLimit | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard: asyncio.TimerHandle | None = None
        self._handling = False
        self._limit = limit
        self._admitted: Any = None  # the transport counted by the limit, until its connection is lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._limit is None:
            return
        if self._limit.admit(transport):
            self._admitted = transport
        else:
            transport.abort()  # at once: its descriptor is what the limit keeps

    def data_received(self, data: bytes) -> None:
        if self._guard is None and not self._handling:  # the first byte of a request
            self._guard = asyncio.get_running_loop().call_later(self.head_timeout_s, self._too_slow)
        super().data_received(data)

    def handling(self, busy: bool) -> None:
        """Called by the dispatcher: a head arrived whole (True), or its reply is done (False)."""
        self._handling = busy
        if self._guard is not None:
            self._guard.cancel()
            self._guard = None

    def _too_slow(self) -> None:
        self._guard = None
        if self._handling or self.transport is None:
            return
        self.on_timeout()
        self.transport.write(_TIMEOUT_REPLY)
        self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._guard is not None:
            self._guard.cancel()
            self._guard = None
        if self._admitted is not None and self._limit is not None:
            self._limit.release(self._admitted)
            self._admitted = None
        super().connection_lost(exc)


class GuardedServer(web.Server):
    """``web.Server`` whose connections get a :class:`GuardedHandler`."""

    def __init__(
        self,
        *args: Any,
        head_timeout_s: float,
        on_timeout: Callable[[], None],
        limit: ConnectionLimit | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self.on_timeout = on_timeout
        self.limit = limit
        self.handler_options = {key: value for key, value in kwargs.items() if key not in _SERVER_OPTIONS}

    def __call__(self) -> GuardedHandler:
        handler = GuardedHandler(self, loop=asyncio.get_running_loop(), limit=self.limit, **self.handler_options)
        handler.head_timeout_s = self.head_timeout_s
        handler.on_timeout = self.on_timeout
        return handler


async def read_within(request: web.BaseRequest, reading: Awaitable[T]) -> T:
    """A read of `request`'s body, which must end within the head's time limit (else 408)."""
    limit_s = getattr(request.protocol, "head_timeout_s", None)
    if limit_s is None:
        return await reading
    try:
        return await asyncio.wait_for(reading, limit_s)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {limit_s:g} s") from None
