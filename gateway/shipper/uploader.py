"""One sealed segment -> one HTTPS PUT to the cloud landing endpoint (cloud/), with the bearer token.

The contract (cloud/ implements the other side): ``PUT <url>/v1/batches/<batch id>`` with
``Authorization: Bearer <token>``, ``Content-Type: application/x-ndjson``, ``Content-Encoding:
gzip`` and the segment's bytes. 201 = stored, 200 = the cloud already had it (a retry after a lost
reply): both confirm, with the endpoint's reply ``{"batch": id, "records": n, "duplicate": ...}``
naming this batch (any other reply is retried as ``bad_reply``). Which failures are worth retrying
decides what the shipper does next: 400, 409 and 413 (a malformed, conflicting or oversized batch)
never succeed and set the segment aside; everything else is retried: network errors, timeouts,
408, 429, 5xx, 3xx (redirects are not followed), 401/403 and 404/405 (a token, a URL or a proxy the
operator will fix).
"""

from __future__ import annotations

import json
import ssl

import aiohttp

# The statuses by which the endpoint says a batch can never be stored (malformed, conflicting, too
# large). Why these only, every other status retried: a 404 or 405 (a path or a proxy not routing
# yet) set every segment aside for good, never resent, until the operator fixed the URL.
FINAL = frozenset({400, 409, 413})
REPLY_LIMIT = 64 << 10  # bytes of a reply read: the endpoint's replies are a few hundred bytes


class UploadError(Exception):
    """An upload that did not confirm; `retry` says whether the same bytes may succeed later."""

    def __init__(self, reason: str, detail: str, *, retry: bool) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.retry = retry


class Uploader:
    def __init__(self, url: str, token: str, *, ca_file: str | None, timeout_s: float) -> None:
        self.base = url.rstrip("/") + "/v1/batches/"
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/x-ndjson",
            "Content-Encoding": "gzip",
        }
        self._ssl = ssl.create_default_context(cafile=ca_file) if url.startswith("https:") else None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def put(self, batch_id: str, body: bytes, records: int) -> bool:
        """Upload one batch of `records` observations; True if the cloud already had it. Raises UploadError."""
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False, limit=4)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        try:
            # Why not follow redirects: the batch would be sent, and taken for stored, wherever the
            # reply points (a 307 to another host got the observations and its 201 deleted them from
            # the spool; aiohttp drops only the token). The endpoint never redirects: a 3xx is a
            # proxy or a URL the operator will fix, so it is retried, never followed nor set aside.
            url = self.base + batch_id
            async with self._session.put(url, data=body, headers=self._headers, allow_redirects=False) as response:
                # Why not response.text(): it decodes strictly, in the charset the reply names, and its
                # UnicodeDecodeError (or LookupError) is no network error: it ended the upload worker,
                # so one 503 with a body not in UTF-8 stopped the shipper until the gateway restarted
                text = (await _start_of(response, REPLY_LIMIT))[:300].decode("utf-8", "replace")
                if response.status in (200, 201):
                    _check_confirmation(text, batch_id, records, duplicate=response.status == 200)
                    return response.status == 200
                raise UploadError(f"http_{response.status}", text, retry=response.status not in FINAL)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise UploadError("network", str(error) or type(error).__name__, retry=True) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _start_of(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most `limit` bytes of the reply's body (the connection is closed if more is left).

    Why: read whole, a reply is held in memory however big it is; a 503 whose body was 256 MiB
    took the gateway's peak RSS up by 527 MiB, at every retry."""
    data = bytearray()
    while len(data) < limit:
        chunk = await response.content.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _check_confirmation(text: str, batch_id: str, records: int, *, duplicate: bool) -> None:
    """Raise a retryable UploadError unless `text` is the landing endpoint's confirmation of this batch.

    Why: the segment is deleted once confirmed, so a 2xx alone must not count. A captive portal or
    a proxy answering 200 to anything took every segment for stored: 30 observations were deleted
    from the spool, counted as uploaded, and never landed."""
    try:
        reply = json.loads(text)
    except ValueError:
        reply = None
    expected = {"batch": batch_id, "records": records, "duplicate": duplicate}
    if not isinstance(reply, dict) or any(reply.get(key) != value for key, value in expected.items()):
        raise UploadError(
            "bad_reply", f"a success status without the confirmation of batch {batch_id}: {text[:100]!r}", retry=True
        )
