"""Request bodies being read and handled: every connection's together are bounded.

Why: a body is bounded (`[http] max_request_bytes`, 1 MiB), but not the bodies of many requests
waiting together for the query pool or the update thread: 1,000 loopback connections that each
POSTed a 1 MB query (a comment and a slow query) took the gateway from 85 MB to 1.59 GB of RSS
(850 requests in flight, none refused: each held its body, its text and its SPARQL), and 2.06 GB
once the scheduler ran them (/tmp/atk-exhaust/bodies.py 1000 1000). A read token on the HTTPS port
has 256 connections from one address, 4,096 in all. Now the bodies a request declares (its
Content-Length, or `max_request_bytes` for a chunked one) are held against
`[http] request_bytes_total` from its head until its handler returns: past it the request is
refused before its body is read, 429 `too_many_requests` with Retry-After, the connection closed.
A request alone is taken whatever its size (it is bounded by `max_request_bytes`), and so is a
body of at most SMALL_BODY_BYTES: most SPARQL requests are far smaller, and a client filling the
bound with large bodies must not keep every other client's updates out (the connections bound
those: 4,096 of 16 KiB are 64 MiB).
"""

from __future__ import annotations

from aiohttp import web

from broker.errors import SepaError

SMALL_BODY_BYTES = 16 << 10


class BodiesFull(SepaError):
    """The bodies of the requests in flight reached `[http] request_bytes_total`."""

    error = "too_many_requests"
    status_code = 429
    headers = {"Retry-After": "1"}


class HeldBodies:
    """The bytes of the bodies of every request in flight, on every gate: at most `limit` (None: no bound)."""

    def __init__(self, limit: int | None, max_request_bytes: int) -> None:
        self.limit = limit
        self.max_request_bytes = max_request_bytes
        self.bytes = 0

    def take(self, request: web.BaseRequest) -> int:
        """Hold what `request`'s body may be; returns it for :meth:`give_back`, or BodiesFull."""
        declared = request.content_length
        if declared is None:
            declared = self.max_request_bytes if request.body_exists else 0
        size = min(declared, self.max_request_bytes)  # a larger body is refused (413) as it is read
        if self.limit is not None and size > SMALL_BODY_BYTES and self.bytes and self.bytes + size > self.limit:
            raise BodiesFull(
                f"the gateway holds {self.bytes} bytes of request bodies ([http] request_bytes_total "
                f"{self.limit}); try again in a moment"
            )
        self.bytes += size
        return size

    def give_back(self, size: int) -> None:
        self.bytes -= size
