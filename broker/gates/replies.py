"""Query replies being written: their bodies, every connection's together, are bounded.

Why: a query's body is bounded (`[http] max_result_bytes`, 32 MiB), and a connection whose reply
is not read at all is cut 20 s after its write stalled (broker.gates.slow), but nothing bounded the
replies of many connections together. 30 loopback connections that each asked for a 30 MB result
and read it 4 KB at a time took the gateway from 115 MB to 1.93 GB of RSS within 15 s (each body
was held twice: the reply's bytes, and the transport's copy of them, asyncio's write buffer,
filled whole by one write); a read token on the HTTPS port has 256 connections from one address.
An update's reply with its quads (``Prefer: return=representation``) is as large: 20 connections
that each sent an update of ~18 MB of quads and did not read took the gateway from 105 to 844 MB.
Now a body is written a chunk at a time (the transport's buffer stays near aiohttp's 64 KiB, the
body held once; an update's reply with its quads is made and held in parts, see HeldReply), and
what is left to write of every body together is at most `[http] reply_bytes_total`. A reply that
would pass it cuts the connection with the most left to write, whichever it is; when that is the
new reply's own, it is refused before anything of it is sent: 429 `too_many_requests` with
`Retry-After`. Whoever holds the most pays, as for the WebSocket queues (broker.gates.websocket
QueuedTotal).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass

from aiohttp import web

from broker.errors import SepaError
from broker.quiet_log import QuietLog

log = logging.getLogger(__name__)
# what one write hands the transport: aiohttp's writer drains above 64 KiB
CHUNK_BYTES = 1 << 16
# the connections cut, and the replies refused, because every reply's bytes together reached the bound
REPLIES_CUT = QuietLog(
    log, "cutting the reply with the most left to write: the gateway's replies are full", level=logging.WARNING
)


class RepliesFull(SepaError):
    """The bodies being written reached `[http] reply_bytes_total`, and this one would be the largest."""

    error = "too_many_requests"
    status_code = 429
    headers = {"Retry-After": "1"}


@dataclass(eq=False, slots=True)
class Held:
    """One reply's body: what is left to write of it, and its connection's transport."""

    left: int
    transport: asyncio.BaseTransport | None


class HeldReplies:
    """What is left to write of every reply's body, at most `limit` bytes (None: no bound)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.bytes = 0
        self.held: set[Held] = set()

    def admit(self, size: int, transport: asyncio.BaseTransport | None, *, refusable: bool = True) -> Held:
        """Hold a new body of `size` bytes, cutting the connections with the most left to write
        until it fits; RepliesFull when it would have the most itself (taken when nothing else is
        held: a body is bounded where it is made). A reply that is not `refusable` (an update's, the
        update applied) is taken once the others are cut."""
        limit = self.limit
        while limit is not None and self.bytes and self.bytes + size > limit:
            victim = max(self.held, key=lambda held: held.left)
            REPLIES_CUT(left=max(size, victim.left), bytes=self.bytes)
            if size >= victim.left and refusable:
                raise RepliesFull(
                    f"the gateway is writing {self.bytes} bytes of replies ([http] reply_bytes_total "
                    f"{limit}); try again in a moment, or ask for less with LIMIT and OFFSET"
                )
            self.release(victim)
            if victim.transport is not None:
                victim.transport.abort()  # a close would wait for the unread data to drain
        held = Held(size, transport)
        self.held.add(held)
        self.bytes += size
        return held

    def wrote(self, held: Held, size: int) -> None:
        """`size` bytes more of `held` went to the transport."""
        if held in self.held:
            held.left -= size
            self.bytes -= size

    def release(self, held: Held) -> None:
        """`held` is written, cut or dropped: nothing of it is held any more."""
        if held in self.held:
            self.held.discard(held)
            self.bytes -= held.left
            held.left = 0


class HeldReply(web.Response):
    """A reply whose body counts in `replies` until it is written, and is written a chunk at a time
    (see :meth:`HeldReplies.admit`).

    The body may come as parts (an update's reply with its quads, see broker.gates.http): each is
    let go of once written, and they are never joined into one more copy of the whole, except a
    small body, which is one write."""

    def __init__(
        self,
        body: bytes | list[bytes],
        headers: dict[str, str],
        replies: HeldReplies,
        request: web.BaseRequest,
        *,
        refusable: bool = True,
    ) -> None:
        size = len(body) if isinstance(body, bytes) else sum(map(len, body))
        if isinstance(body, list) and size <= CHUNK_BYTES:
            body = b"".join(body)
        if isinstance(body, bytes):
            super().__init__(body=body, headers=headers)
            self._parts: list[bytes] | None = None
        else:
            super().__init__(headers={**headers, "Content-Length": str(size)})
            self._parts = body
        self._replies = replies
        self._held = replies.admit(size, request.transport, refusable=refusable)
        weakref.finalize(self, replies.release, self._held)  # never written (the client left first)

    async def write_eof(self, data: bytes = b"") -> None:
        body = self._body
        parts = self._parts if self._parts is not None else [body] if isinstance(body, bytes) else None
        if self._eof_sent or self._must_be_empty_body or parts is None:
            self._replies.release(self._held)
            await super().write_eof(data)
            return
        try:
            for index, part in enumerate(parts):
                parts[index] = b""  # written parts are let go of (the plain body stays in _body)
                await self._write(part)
            await web.StreamResponse.write_eof(self)
        finally:
            self._replies.release(self._held)

    async def _write(self, part: bytes) -> None:
        view = memoryview(part)
        for start in range(0, len(view), CHUNK_BYTES):
            chunk = view[start : start + CHUNK_BYTES]
            await web.StreamResponse.write(self, chunk)
            self._replies.wrote(self._held, len(chunk))
