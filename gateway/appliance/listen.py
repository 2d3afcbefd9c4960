"""The gates' listening sockets: aiohttp's TCP site, with a time limit on TLS handshakes.

Why: asyncio gives a TLS handshake 60 s, and a connection still in its handshake is invisible to the
gates' connection limit (broker/gates/connections.py counts a connection once its protocol sees
it, after the handshake). A host opening connections and sending nothing then held one descriptor
each for a minute: 70 new connections a second held 4,096. Here the handshake gets the gates'
`request_timeout_s` (20 s by default), the time a request's head has anyway.

aiohttp's TCPSite has no such option; :meth:`TimedTlsSite.start` is its `start` (aiohttp 3.9-3.14)
with `ssl_handshake_timeout` added. tests/gateway/appliance/test_listen.py fails if that stops
holding.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from broker.api import QuietLog

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
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


class TimedTlsSite(web.TCPSite):
    """A TCP site whose TLS handshakes must end within `handshake_timeout_s`."""

    def __init__(self, *args: Any, handshake_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handshake_timeout_s = handshake_timeout_s

    async def start(self) -> None:
        if self._ssl_context is None:
            return await super().start()
        self._runner._reg_site(self)  # what BaseSite.start does
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            ssl_handshake_timeout=self.handshake_timeout_s,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port
        return None
