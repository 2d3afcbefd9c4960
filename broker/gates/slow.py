"""Slow requests: a request's head must arrive within a time limit of its first byte (slowloris).

Why: aiohttp times out idle kept-alive connections (``keepalive_timeout``) but not a request
whose header lines trickle in, a byte every few seconds; a few hundred such connections hold as
many descriptors and handler objects forever. aiohttp has no header timeout, so the request
handler here arms a timer at the first byte of a request and the dispatcher disarms it when the
head is complete (the handler runs); past it the client gets ``408 Request Timeout`` and the
connection is closed. Bodies are read under the same limit by the handlers (:func:`read_within`).

WebSocket messages too: once a connection is upgraded, each incoming data message must arrive
whole within the same limit of its first byte, else the connection is aborted. Why: aiohttp keeps
a message's fragments (or a frame's payload) until it ends, up to its size limit, and any data
(a pong, one more byte) keeps a heartbeat happy; a client that opened a message and never ended it
held 4 MiB per socket for as long as it liked (256 sockets from one address, a gigabyte), with no
token on the secure port, where the upgrade is not authenticated. aiohttp shows nothing of a
message in progress, so :class:`MessageWatch` follows the frame headers of the incoming bytes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from broker.errors import SepaError
from broker.gates.bodies import SMALL_BODY_BYTES, HeldBodies
from broker.gates.budget import PerAddress, TokenBucket
from broker.gates.connections import Admission, ConnectionLimit, peer_host
from broker.gates.errors import json_error

T = TypeVar("T")
_SERVER_OPTIONS = ("request_factory", "handler_cancellation", "loop")  # web.Server's own, not the handler's
_TIMEOUT_REPLY = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class RequestTimeout(SepaError):
    error = "request_timeout"
    status_code = 408


_DATA_OPCODES = frozenset((0x0, 0x1, 0x2))  # continuation, text, binary (RFC 6455 5.2)
# Frames other than the last of a data message (control frames, fragments) a connection may send:
# a burst of FRAME_BURST, then FRAME_RATE a second. Past it the connection is aborted. Why: aiohttp
# answers each ping and takes each pong without handing the event loop back while more are queued,
# so one socket flooding empty pongs (6 bytes a frame, no token needed on the secure port) took
# the gateway to 100 % CPU and another client's updates from 8 ms to 0.9 s at p50; empty pings
# froze the loop for up to 14.6 s. A client pings every few seconds at most; a 1 MiB message sent
# in 4 KiB fragments is 256 frames. The budget is an address's, all its WebSockets on every port
# together (loopback: each socket its own): 60 sockets of one LAN host, each pinging within its own
# budget, took an honest client's notification latency p99 to 5.1 s.
FRAME_BURST = 1000
FRAME_RATE = 1000.0


def frame_budgets() -> PerAddress[TokenBucket]:
    """The frame budgets of the addresses off this board (see FRAME_BURST), one for all gates."""
    return PerAddress(lambda: TokenBucket(FRAME_BURST, FRAME_RATE))


def _header_size(second: int) -> int:
    """A frame header's size from its second byte (payload length code and mask bit)."""
    length = second & 0x7F
    return 2 + (2 if length == 126 else 8 if length == 127 else 0) + (4 if second & 0x80 else 0)


class MessageWatch:
    """Where the incoming bytes of a WebSocket stand: whether a data message is in progress, and
    how many frames came that were not the last of a data message (:data:`FRAME_BURST`).

    Only frame headers are read (RFC 6455 5.2): the payload is counted, never copied. Control
    frames (ping, pong, close) may come between the fragments of a message and change nothing.
    A header is read from the incoming bytes in one slice; only one split between two reads is
    gathered byte by byte (reading every header so took half the gateway's CPU under a flood)."""

    def __init__(self) -> None:
        self._header = bytearray()
        self._payload_left = 0  # bytes of the current frame's payload still to come
        self._ends_message = False  # the current frame is the last of a data message
        self.in_message = False
        self.completed = 0  # data messages that ended so far
        self.other_frames = 0  # frames so far that did not end a data message
        self.unmasked = False  # a frame came without a mask: RFC 6455 5.1, the connection must close
        self.data_bytes = 0  # payload bytes of data frames so far
        self.message_sizes: deque[int] = deque()  # payload bytes of each data message that ended, not yet taken
        self._data_frame = False  # the current frame is a data frame
        self._message_bytes = 0  # payload bytes of the data message in progress

    def feed(self, data: bytes) -> None:
        position, size = 0, len(data)
        header = self._header
        while position < size:
            if self._payload_left:
                step = min(self._payload_left, size - position)
                self._payload_left -= step
                if self._data_frame:
                    self.data_bytes += step
                    self._message_bytes += step
                position += step
                if not self._payload_left:
                    self._frame_ended()
                continue
            if not header and size - position >= 2:
                needed = _header_size(data[position + 1])
                if size - position >= needed:
                    self._frame_started(data[position : position + needed])
                    position += needed
                    continue
            header.append(data[position])
            position += 1
            if len(header) >= 2 and len(header) == _header_size(header[1]):
                self._frame_started(bytes(header))
                header.clear()

    def _frame_started(self, header: bytes) -> None:
        self.unmasked |= not header[1] & 0x80
        length = header[1] & 0x7F
        if length == 126:
            length = int.from_bytes(header[2:4], "big")
        elif length == 127:
            length = int.from_bytes(header[2:10], "big")
        data = header[0] & 0x0F in _DATA_OPCODES
        self._data_frame = data
        if data:
            self.in_message = True
        self._ends_message = data and bool(header[0] & 0x80)
        if not self._ends_message:
            self.other_frames += 1
        self._payload_left = length
        if not length:
            self._frame_ended()

    def _frame_ended(self) -> None:
        if self._ends_message:
            self.in_message = False
            self.completed += 1
            self._ends_message = False
            self.message_sizes.append(self._message_bytes)
            self._message_bytes = 0


class GuardedHandler(web.RequestHandler):
    """aiohttp's request handler, with a timer on the arrival of each request's head, and one on
    the way out: a connection whose outgoing buffer stays full (the transport paused writing) for
    the same limit is aborted, counted (``sepa_write_stalls_total``). Why: aiohttp has no send
    timeout, and a reply or a WebSocket's messages wait on the drain for as long as the client
    does not read. 20 HTTPS connections of one read-only token that asked for a 33 MB result and
    never read it held the gateway at 2.2 GB of RSS (/tmp/atk-net/a_bigresp.py); 20 WebSockets that
    never read a 99,000-row subscription 1.1 GB, kept alive by an unsolicited pong every 10 s. Only
    a buffer that did not shrink at all in that time counts: a large reply is one write, above the
    high-water mark until nearly all of it is read, and a slow reader of it is still reading."""

    head_timeout_s = 20.0
    on_timeout: Callable[[], None] = staticmethod(lambda: None)  # type: ignore[assignment]
    on_stall: Callable[[], None] = staticmethod(lambda: None)  # type: ignore[assignment]
    on_flood: Callable[[], None] = staticmethod(lambda: None)  # type: ignore[assignment]
    on_unparsable: Callable[[], None] = staticmethod(lambda: None)  # type: ignore[assignment]
    on_incoming_full: Callable[[], None] = staticmethod(lambda: None)  # type: ignore[assignment]

    def __init__(
        self,
        *args: Any,
        limit: ConnectionLimit | None = None,
        frame_budgets: PerAddress[TokenBucket] | None = None,
        bodies: HeldBodies | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._guard: asyncio.TimerHandle | None = None
        self._handling = False
        self._limit = limit
        self._admitted: Admission | None = None  # counted by the limit until the connection is lost
        self._ws_messages: MessageWatch | None = None  # once upgraded to a WebSocket
        self._message_guard: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None  # armed while the transport has paused writing
        self._stalled_at = 0  # the outgoing buffer's size when the stall timer was armed
        self._frame_budgets = frame_budgets
        self._frames = TokenBucket(FRAME_BURST, FRAME_RATE)  # this socket's, or its address's once upgraded
        self._frames_host: str | None = None  # the address whose budget _frames is
        self._frames_seen = 0
        self._bodies = bodies  # request bodies and incoming WebSocket messages of every gate, held together
        self._ws_counted = 0  # the MessageWatch's data_bytes already held against _bodies
        self._ws_held = 0  # incoming message bytes of this socket held against _bodies

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._limit is None:
            return
        self._admitted = self._limit.admit(transport)
        if self._admitted is None:
            transport.abort()  # at once: its descriptor is what the limit keeps

    def spare(self) -> None:
        """Its client authenticated: a full connection limit makes room elsewhere first (Shares._evict)."""
        if self._admitted is not None:
            self._admitted.spared = True

    def data_received(self, data: bytes) -> None:
        if self._ws_messages is not None:
            if not self._watch(data):
                return  # aborted: aiohttp never parses the flood
        elif self._guard is None and not self._handling:  # the first byte of a request
            self._guard = asyncio.get_running_loop().call_later(self.head_timeout_s, self._too_slow)
        super().data_received(data)

    def set_parser(self, parser: Any, data_received_cb: Callable[[], None] | None = None) -> None:
        """aiohttp sets the WebSocket reader here once a connection is upgraded, and hands it what
        arrived since the handshake: from then on the messages are watched, those bytes first."""
        self._ws_messages = MessageWatch()
        host = self._admitted.host if self._admitted is not None else self.transport and peer_host(self.transport)
        if self._frame_budgets is not None and host and self._frames_host is None:
            self._frames = self._frame_budgets.join(host)
            self._frames_host = host
        if self._message_tail and not self._watch(self._message_tail):
            self._message_tail = b""  # aborted: nothing of it parsed
        super().set_parser(parser, data_received_cb)

    def _watch(self, data: bytes) -> bool:
        """Follow `data`; False if it took the connection past its frame budget or held a frame
        without a mask (then aborted: aiohttp took an unmasked frame as any other)."""
        assert self._ws_messages is not None
        completed = self._ws_messages.completed
        self._ws_messages.feed(data)
        if self._ws_messages.unmasked and self.transport is not None:
            self.on_unparsable()
            self.transport.abort()
            return False
        if self._ws_messages.other_frames != self._frames_seen and not self._within_frame_budget():
            return False
        if self._ws_messages.data_bytes != self._ws_counted and not self._within_held_bytes():
            return False
        if not self._ws_messages.in_message:
            if self._message_guard is not None:
                self._message_guard.cancel()
                self._message_guard = None
        elif self._message_guard is None or self._ws_messages.completed != completed:  # a new message began
            if self._message_guard is not None:
                self._message_guard.cancel()
            self._message_guard = asyncio.get_running_loop().call_later(self.head_timeout_s, self._message_too_slow)
        return True

    def _within_frame_budget(self) -> bool:
        assert self._ws_messages is not None
        new_frames = self._ws_messages.other_frames - self._frames_seen
        self._frames_seen = self._ws_messages.other_frames
        if self._frames.take(new_frames, asyncio.get_running_loop().time()) or self.transport is None:
            return True
        self.on_flood()
        self.transport.abort()
        return False

    def _within_held_bytes(self) -> bool:
        """Hold the new incoming message bytes against `[http] request_bytes_total`; False (the
        connection aborted, counted) when the total is past it and this socket holds more than a
        small message (:data:`SMALL_BODY_BYTES`).

        Why: aiohttp assembles a message up to 4 x `[websocket] max_message_bytes` before the gate
        sees it, and the gate stops taking a socket's messages while its slots are busy: 100
        loopback sockets that held their 3 slots with slow subscribes and then sent a 3.9 MB
        message each took the gateway from 85 to 568 MB, held while the probes ran (a read token on
        the secure port: 256 sockets per address, ~1.2 GB; /tmp/atk-exhaust/wsbig.py). The bytes
        are given back as the gate is done with each message (:meth:`give_back_message`)."""
        assert self._ws_messages is not None
        grown = self._ws_messages.data_bytes - self._ws_counted
        self._ws_counted = self._ws_messages.data_bytes
        if self._bodies is None:
            return True
        self._ws_held += grown
        self._bodies.bytes += grown
        limit = self._bodies.limit
        if limit is None or self._bodies.bytes <= limit or self._ws_held <= SMALL_BODY_BYTES or self.transport is None:
            return True
        self.on_incoming_full()
        self.transport.abort()
        return False

    def take_message(self) -> int:
        """The payload bytes of the oldest incoming data message, which the gate now handles; give
        them back with :meth:`give_back_message` once it is done with it."""
        sizes = self._ws_messages.message_sizes if self._ws_messages is not None else None
        return sizes.popleft() if sizes else 0

    def give_back_message(self, size: int) -> None:
        size = min(size, self._ws_held)  # all of it was given back when the connection was lost
        self._ws_held -= size
        if self._bodies is not None:
            self._bodies.bytes -= size

    def _message_too_slow(self) -> None:
        self._message_guard = None
        if self.transport is None:
            return
        if self._reading_paused:  # the gateway stopped reading this socket (its backlog): not the client's delay
            self._message_guard = asyncio.get_running_loop().call_later(self.head_timeout_s, self._message_too_slow)
            return
        self.on_timeout()
        self.transport.abort()  # mid-message: no close frame could be read by the client's reader anyway

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A request aiohttp's parser refused (it answered 400) is counted, not logged: aiohttp logged
        an ERROR with a traceback whose message quotes the start of the offending line, so a header
        past 8 KB put the start of its value (a Basic header's client secret) in the log, and any
        client could add a traceback per request."""
        if isinstance(kw.get("exc_info"), HttpProcessingError):
            self.on_unparsable()
            return
        super().log_exception(*args, **kw)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's reply to a request its parser refused quoted the offending line back (a Basic
        header's credentials, to whatever proxy logs reply bodies) in text/plain: the gates' JSON
        error shape instead, naming only the status."""
        response = super().handle_error(request, status, exc, message)
        if not isinstance(exc, HttpProcessingError) or status >= 500:
            return response
        description = "the request could not be parsed as HTTP/1.1 (a line too long, a bad header or chunk...)"
        refusal = json_error("invalid_request", description, status)
        refusal.force_close()
        return refusal

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

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._arm_stall()

    def _arm_stall(self) -> None:
        self._stalled_at = self._buffered()
        self._stall = asyncio.get_running_loop().call_later(self.head_timeout_s, self._write_stalled)

    def _buffered(self) -> int:
        transport = self.transport
        return transport.get_write_buffer_size() if isinstance(transport, asyncio.WriteTransport) else 0

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _write_stalled(self) -> None:
        self._stall = None
        if self.transport is None:
            return
        if self._buffered() < self._stalled_at:  # the client read some: still reading
            self._arm_stall()
            return
        self.on_stall()
        self.transport.abort()  # a close would wait for the unread data to drain, forever

    def connection_lost(self, exc: BaseException | None) -> None:
        for guard in (self._guard, self._message_guard, self._stall):
            if guard is not None:
                guard.cancel()
        self._guard = self._message_guard = self._stall = None
        if self._admitted is not None and self._limit is not None:
            self._limit.release(self._admitted)
            self._admitted = None
        if self._frames_host is not None and self._frame_budgets is not None:
            self._frame_budgets.leave(self._frames_host)
            self._frames_host = None
        self.give_back_message(self._ws_held)
        super().connection_lost(exc)


class GuardedServer(web.Server):
    """``web.Server`` whose connections get a :class:`GuardedHandler`."""

    def __init__(
        self,
        *args: Any,
        head_timeout_s: float,
        on_timeout: Callable[[], None],
        on_flood: Callable[[], None] = lambda: None,
        on_unparsable: Callable[[], None] = lambda: None,
        on_stall: Callable[[], None] = lambda: None,
        on_incoming_full: Callable[[], None] = lambda: None,
        limit: ConnectionLimit | None = None,
        frame_budgets: PerAddress[TokenBucket] | None = None,
        bodies: HeldBodies | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.frame_budgets = frame_budgets
        self.bodies = bodies
        self.on_incoming_full = on_incoming_full
        self.head_timeout_s = head_timeout_s
        self.on_timeout = on_timeout
        self.on_stall = on_stall
        self.on_flood = on_flood
        self.on_unparsable = on_unparsable
        self.limit = limit
        self.handler_options = {key: value for key, value in kwargs.items() if key not in _SERVER_OPTIONS}

    def __call__(self) -> GuardedHandler:
        handler = GuardedHandler(
            self,
            loop=asyncio.get_running_loop(),
            limit=self.limit,
            frame_budgets=self.frame_budgets,
            bodies=self.bodies,
            **self.handler_options,
        )
        handler.on_incoming_full = self.on_incoming_full
        handler.head_timeout_s = self.head_timeout_s
        handler.on_timeout = self.on_timeout
        handler.on_stall = self.on_stall
        handler.on_flood = self.on_flood
        handler.on_unparsable = self.on_unparsable
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
