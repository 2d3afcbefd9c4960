"""The gates' listening sockets: aiohttp's TCP site, with a time limit on TLS handshakes.

Why: asyncio gives a TLS handshake 60 s, and a connection still in its handshake is invisible to the
gates' connection limit (broker/gates/connections.py counts a connection once its protocol sees
it, after the handshake). A host opening connections and sending nothing then held one descriptor
each for a minute: 70 new connections a second held 4,096. Here the handshake gets the gates'
`request_timeout_s` (20 s by default), the time a request's head has anyway.

aiohttp's TCPSite has no such option; :meth:`TimedTlsSite.start` is its `start` (aiohttp 3.9-3.14)
listening on plain TCP: each accepted connection is first counted by :class:`Handshakes` (closed at
once past its bounds), then upgraded with `loop.start_tls` under the time limit, and handed to the
gates' protocol. tests/gateway/appliance/test_listen.py fails if that stops holding.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from asyncio import sslproto
from collections.abc import Callable
from typing import Any

from aiohttp import web

from broker.api import Admission, QuietLog, Shares, peer_host

log = logging.getLogger(__name__)

# asyncio's words for an accept that failed for want of descriptors or memory (EMFILE, ENFILE,
# ENOBUFS, ENOMEM): it stops accepting for a second and tells the loop's exception handler
_ACCEPT_FAILED = "socket.accept() out of system resource"
ACCEPT_ERRORS = QuietLog(log, "accepting connections failed: out of descriptors or memory", level=logging.WARNING)


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Accepts that failed for want of descriptors: one WARNING line a minute, counted, instead of
    an ERROR with a traceback each. Why: a LAN host holding thousands of TLS handshakes open took
    the gateway to its 8,192 descriptors, and asyncio logged 3,079 tracebacks (1.4 MB) in 12 s,
    which would cycle the rotated log files in minutes (/tmp/atk-net/a_conn.py)."""
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == _ACCEPT_FAILED:
            error = context.get("exception")
            ACCEPT_ERRORS(error=str(error) if error is not None else "")
        elif _retry_of_a_closed_listener(context):
            # asyncio's accept, tried again a second after it failed, on a listening socket closed
            # meanwhile (the gateway stopping): a ValueError traceback per socket, nothing to accept
            log.debug("accept retried on a closed listening socket")
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


def _retry_of_a_closed_listener(context: dict[str, Any]) -> bool:
    """Whether the loop's error is asyncio's `_start_serving` timer (set after an accept failed for
    want of descriptors) firing on a socket closed since: "Invalid file descriptor: -1" (CPython 3.11)."""
    callback = getattr(context.get("handle"), "_callback", None)
    return isinstance(context.get("exception"), ValueError) and getattr(callback, "__name__", "") == "_start_serving"


# TLS handshakes under way at once from one network address, and from all. Why: each held
# asyncio's 256 KiB buffer (32 KiB since _LeanTls) from the moment its connection is accepted, and
# the gates' connection limit sees a connection only once its handshake is done: one LAN host
# opening ~340 connections a second to the HTTPS port and sending nothing held 7,640 of them, RSS
# 291 -> 2,553 MB (1.7 GB after), and took every descriptor (/tmp/atk-net/a_conn.py). An honest
# handshake takes milliseconds; this board's own (loopback) count only toward the total.
HANDSHAKES_PER_ADDRESS = 32
HANDSHAKES = 256


class Handshakes(Shares):
    """The TLS handshakes under way, by peer address (:class:`broker.api.Shares`); past the bounds a
    connection is closed at once. Why a newcomer takes the oldest place of the address holding the
    most once all :data:`HANDSHAKES` are under way: refusing it let 8 LAN addresses of 32 silent
    connections each (256 sockets, sending nothing, opened again every `request_timeout_s`) keep
    every other client, this board's too, out of both secure ports (/tmp/atk-tls/halfopen.py: each
    token request reset at its accept). An honest handshake, done in milliseconds, is never the
    oldest of an address holding many."""

    def __init__(self, per_address: int = HANDSHAKES_PER_ADDRESS, total: int = HANDSHAKES) -> None:
        super().__init__(total, per_address)
        self.refused = QuietLog(log, "TLS handshakes refused: too many under way", level=logging.WARNING)
        self.tasks: set[asyncio.Task[None]] = set()

    def admit(self, host: str | None, transport: asyncio.BaseTransport) -> Admission | None:
        """The handshake of `transport` counted until `release`, or None when it may not start."""
        handshake = self.take(host, transport)
        if handshake is None:
            self.refused(peer=host, under_way=self.open)
        return handshake

    def metrics(self) -> dict[str, int]:
        return {"handshakes": self.open, "handshakes_refused": self.refused.total, "handshakes_evicted": self.evicted}


class _LeanTls(sslproto.SSLProtocol):
    """asyncio's TLS protocol reading 32 KiB at a time instead of 256 KiB. Why: it keeps a buffer of
    that size for as long as its connection is open, and the gates hold up to 4,096 connections (256
    an address): 16 LAN addresses each holding 256 idle HTTPS connections after their handshake took
    the gateway from 87 to 1,220 MB of RSS (/tmp/atk-tls/idle_tls.py; ~0.28 MB a connection). A TLS
    record is at most ~16.6 KB, so 32 KiB still takes two at a time."""

    max_size = 32 * 1024


async def _start_tls(
    transport: asyncio.Transport, protocol: asyncio.Protocol, context: ssl.SSLContext, timeout_s: float
) -> asyncio.Transport:
    """`loop.start_tls(server_side=True)` (CPython 3.11-3.13) with :class:`_LeanTls` for its protocol:
    the loop's own takes no protocol class."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    tls = _LeanTls(
        loop, protocol, context, waiter, server_side=True, ssl_handshake_timeout=timeout_s, call_connection_made=False
    )
    transport.pause_reading()
    transport.set_protocol(tls)
    made = loop.call_soon(tls.connection_made, transport)
    resumed = loop.call_soon(transport.resume_reading)
    try:
        await waiter
    except BaseException:
        transport.close()
        made.cancel()
        resumed.cancel()
        raise
    return tls._app_transport


class _AdmittedTls(asyncio.Protocol):
    """An accepted TCP connection of a TLS port: counted by :class:`Handshakes` before its handshake
    starts (`loop.start_tls`), then handed to the gates' protocol."""

    def __init__(
        self, app: Callable[[], asyncio.Protocol], context: ssl.SSLContext, timeout_s: float, handshakes: Handshakes
    ) -> None:
        self.app, self.context, self.timeout_s, self.handshakes = app, context, timeout_s, handshakes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        handshake = self.handshakes.admit(peer_host(transport), transport)
        if handshake is None:
            transport.abort()  # at once: its descriptor and buffer are what the bound keeps
            return
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # before the first read: start_tls takes the bytes from here
        task = asyncio.get_running_loop().create_task(self._handshake(transport, handshake))
        self.handshakes.tasks.add(task)
        task.add_done_callback(self.handshakes.tasks.discard)

    async def _handshake(self, transport: asyncio.Transport, handshake: Admission) -> None:
        protocol = self.app()
        try:
            tls = await _start_tls(transport, protocol, self.context, self.timeout_s)
        except asyncio.CancelledError:
            transport.abort()
            raise
        except Exception:  # noqa: BLE001 - a handshake that failed, timed out or was cut: nothing to tell
            transport.abort()
            return
        finally:
            self.handshakes.release(handshake)
        if tls is None:
            transport.abort()
            return
        protocol.connection_made(tls)


class TimedTlsSite(web.TCPSite):
    """A TCP site whose TLS handshakes must end within `handshake_timeout_s`, at most
    :class:`Handshakes` of them under way."""

    def __init__(self, *args: Any, handshake_timeout_s: float, handshakes: Handshakes, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handshake_timeout_s = handshake_timeout_s
        self.handshakes = handshakes

    async def start(self) -> None:
        if self._ssl_context is None:
            return await super().start()
        self._runner._reg_site(self)  # what BaseSite.start does
        server = self._runner.server
        assert server is not None
        context, timeout_s, handshakes = self._ssl_context, self.handshake_timeout_s, self.handshakes
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _AdmittedTls(server, context, timeout_s, handshakes),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port
        return None
