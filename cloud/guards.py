"""Guards of the landing endpoint's connections: a cap on how many are open, and time limits on
each request's head and body (slowloris).

Why: aiohttp caps neither. A client that opens connections and sends nothing, or a request's head
a byte at a time, or a body a byte a minute (with a token or without: the token is checked only
once the head is whole), held a descriptor and a handler for as long as it liked (aiohttp keeps an
idle connection for an hour by default), until the process had no descriptor left for the
gateways' uploads. The gateway's gates have the same guards (broker/gates/connections.py, slow.py);
cloud/ does not import the broker's internals, so this is the small equivalent:

* at most ``max_connections`` open at once (0: half the process's open-file limit, as on the
  gateway); one past it is closed as soon as it is accepted, its descriptor back at once, and
  counted (``sepa_cloud_connections_refused_total``), logged once a minute at most;
* a request's head must arrive whole within ``head_timeout_s`` of the connection's opening (the
  first request) or of its first byte (the next ones), else ``408`` and the connection is closed;
* a body must arrive whole within ``body_timeout_s`` of the head (the handler's own read,
  :meth:`cloud.landing.Landing.put_batch`); the bytes of a body nobody reads (after a 401) are
  taken for the next request's head, so they too must come within ``head_timeout_s`` (aiohttp
  would otherwise drain them for its ``lingering_time``, 10 s);
* between requests, aiohttp's own ``keepalive_timeout`` (``idle_timeout_s``) closes an idle
  kept-alive connection.

The connection guards sit in a protocol in front of aiohttp's :class:`web.RequestHandler` (every
call forwarded), installed by :class:`GuardedSite`, so they apply to any application served by it.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger("cloud.guards")

LOG_EVERY_S = 60.0
_TIMEOUT_REPLY = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


def default_max_connections() -> int:
    """Half the process's soft open-file limit (at least 64), the other half left to the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, (soft if soft != resource.RLIM_INFINITY else 65536) // 2)


class ConnectionGuard:
    """Admission of connections and the head time limit; counts what it refused or cut in `counters`
    (``connections_refused``, ``timeout_head``)."""

    def __init__(self, counters: Counter[str], *, max_connections: int, head_timeout_s: float) -> None:
        self.counters = counters
        self.max_connections = max_connections or default_max_connections()
        self.head_timeout_s = head_timeout_s
        self.open = 0
        self._watches: dict[web.RequestHandler, GuardedProtocol] = {}
        self._logged_at = float("-inf")

    def admit(self, protocol: GuardedProtocol) -> bool:
        if self.open >= self.max_connections:
            self.counters["connections_refused"] += 1
            now = time.monotonic()
            if now - self._logged_at >= LOG_EVERY_S:
                self._logged_at = now
                log.warning("connections refused", extra={"open": self.open, "max_connections": self.max_connections})
            return False
        self.open += 1
        self._watches[protocol.inner] = protocol
        return True

    def release(self, protocol: GuardedProtocol) -> None:
        self.open -= 1
        self._watches.pop(protocol.inner, None)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """The head arrived whole: its timer stops while the handler runs, and starts again with the
        first byte of the next request."""
        watch = self._watches.get(request.protocol)
        if watch is None:  # served by another site (no guards)
            return await handler(request)
        watch.handling(True)
        try:
            return await handler(request)
        finally:
            watch.handling(False)


class GuardedProtocol(asyncio.Protocol):
    """aiohttp's request handler for one connection, behind the guard: every call is forwarded,
    unless the connection was refused (then aiohttp never sees it)."""

    def __init__(self, inner: web.RequestHandler, guard: ConnectionGuard) -> None:
        self.inner = inner
        self.guard = guard
        self._transport: asyncio.Transport | None = None
        self._admitted = False
        self._handling = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.guard.admit(self):
            transport.abort()  # at once: its descriptor is what the cap keeps
            return
        self._admitted = True
        self._transport = transport  # type: ignore[assignment]
        self._arm()  # a connection that never sends a byte is cut too
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if self._timer is None and not self._handling:  # the first byte of a request
            self._arm()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self._admitted else None

    def pause_writing(self) -> None:
        if self._admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self.inner.resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._disarm()
        self.guard.release(self)
        self.inner.connection_lost(exc)

    def handling(self, busy: bool) -> None:
        """A head arrived whole and its handler runs (True), or its reply is done (False)."""
        self._handling = busy
        self._disarm()

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self.guard.head_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        if self._handling or self._transport is None or self._transport.is_closing():
            return
        self.guard.counters["timeout_head"] += 1
        self._transport.write(_TIMEOUT_REPLY)
        self._transport.close()


class GuardedSite(web.TCPSite):
    """``web.TCPSite`` whose connections go through `guard` (see the module docstring)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self.guard = guard

    async def start(self) -> None:
        """TCPSite.start with the guard's protocol in front of the runner's handlers."""
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        guard = self.guard
        self._server = await asyncio.get_running_loop().create_server(
            lambda: GuardedProtocol(server(), guard),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port
