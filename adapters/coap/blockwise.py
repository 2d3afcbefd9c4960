"""Block-wise request assembly and response blocks whose refusals are counted as the resource's
other bad input; and a bound on the large responses kept for their Block2 continuations.

Why: aiocoap's Block1Spool answers a block of an unknown transfer with 4.08 Request Entity
Incomplete (RFC 7959 §2.9.2), but a block that does not continue the transfer it is keyed to
raises ValueError out of the resource: a 5.00 Internal Server Error and an error log with its
traceback, per block. Two block-wise POSTs from one endpoint to one resource at once, without a
Request-Tag, do that (aiocoap's own client sends them so): one client posting 3.7 KB SenML packs
50 at a time got 1,972 5.00s in 5 s, and the gateway's log as many tracebacks. Now each is a
4.08, counted with the resource's refusals; the sender starts its transfer again.
aiocoap's Block2Cache answers a block of no kept response (expired, or never asked from that
port) 4.08 and a block past the end of one 4.00, before any resource code sees the request: both
went uncounted (not per resource, not by code), whatever a peer sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiocoap
from aiocoap import Code
from aiocoap.blockwise import Block1Spool, Block2Cache, IncompleteException
from aiocoap.error import BadRequest, RequestEntityIncomplete
from aiocoap.resource import Resource
from aiocoap.util.asyncio.timeoutdict import TimeoutDict

from adapters.coap.errors import Refused

# The complete responses kept for their later blocks, per resource: at most this many bytes of
# payloads (a payload shared by several entries counts once; the newest entry is kept whatever
# its size, or a result larger than this could not be read block-wise at all) and entries.
BLOCK2_KEPT_BYTES = 8 << 20
BLOCK2_KEPT_ENTRIES = 1000

# The resource's refusal of a request: counted per code and per resource, the response returned.
Refuse = Callable[[aiocoap.Message, Refused], aiocoap.Message]


class Block1Assembly(Block1Spool):  # type: ignore[misc]
    """aiocoap's spool, with a block that does not fit answered 4.08, and every 4.08 counted."""

    def __init__(self, refuse: Refuse) -> None:
        super().__init__()
        self.refuse = refuse

    def feed_and_take(self, req: aiocoap.Message) -> aiocoap.Message:
        try:
            return super().feed_and_take(req)
        except ValueError:  # its sender's next block 0 starts the transfer afresh
            self.refuse(req, Refused(Code.REQUEST_ENTITY_INCOMPLETE, "the block does not continue its transfer"))
            raise RequestEntityIncomplete() from None
        except IncompleteException:
            self.refuse(req, Refused(Code.REQUEST_ENTITY_INCOMPLETE, "no transfer for this block"))
            raise


class Block2Blocks(Block2Cache):  # type: ignore[misc]
    """aiocoap's cache, a later block it refuses answered by the resource's refusal (counted)."""

    def __init__(self, refuse: Refuse) -> None:
        super().__init__()
        self.refuse = refuse

    async def extract_or_insert(
        self, req: aiocoap.Message, response_builder: Callable[[], Awaitable[aiocoap.Message]]
    ) -> aiocoap.Message:
        try:
            return await super().extract_or_insert(req, response_builder)
        except (IncompleteException, BadRequest) as error:
            if req.opt.block2 is None or req.opt.block2.block_number == 0:
                raise  # the response builder's, not the cache's: a later block is never built
            if isinstance(error, BadRequest):
                return self.refuse(req, Refused(Code.BAD_REQUEST, "the block is past the end of the response"))
            return self.refuse(req, Refused(Code.REQUEST_ENTITY_INCOMPLETE, "no response kept for this block"))


def assemble_with_refusals(resource: Resource, refuse: Refuse) -> None:
    """Give `resource` the spool and the cache above (aiocoap's Resource keeps them in `_block1`
    and `_block2`)."""
    resource._block1 = Block1Assembly(refuse)
    resource._block2 = Block2Blocks(refuse)


class BoundedResponses(TimeoutDict):  # type: ignore[misc]
    """aiocoap's Block2Cache store (a TimeoutDict: each entry 93 to 186 s) with the oldest entries
    dropped past BLOCK2_KEPT_BYTES or BLOCK2_KEPT_ENTRIES.

    Why: a GET of a large result (`/q/NAME`) keeps the whole response for its later blocks, keyed by
    the peer and the request's options, Uri-Query included. While the result changes (every reading
    changes an observations query's), each GET keeps a new payload: 100 GETs of block 0 from one
    port, a 3.4 MB result changed between them, took the gateway from 145 to 508 MB, for minutes;
    the same from an OSCORE sensor (one stolen key) or a client that stops reading. A peer whose
    entry was dropped gets 4.08 for its next block and starts again (RFC 7959 §2.4)."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.dropped = 0  # entries dropped before their time (sepa_coap_q_block2_dropped)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._items.pop(key, None)  # put back as the newest
        super().__setitem__(key, value)
        while len(self._items) > 1 and (
            len(self._items) > BLOCK2_KEPT_ENTRIES or kept_bytes(self._items) > BLOCK2_KEPT_BYTES
        ):
            del self._items[next(iter(self._items))]
            self.dropped += 1


def kept_bytes(responses: dict[Any, Any]) -> int:
    """The bytes of the distinct payloads of `responses` (entries of one result version share it)."""
    return sum(len(payload) for payload in {id(r.payload): r.payload for r in responses.values()}.values())


def bound_block2(resource: Resource) -> BoundedResponses:
    """Keep `resource`'s Block2 responses within BoundedResponses' bounds (aiocoap's Resource keeps
    its cache in `_block2`, and the cache its entries in `_completes`)."""
    bounded = BoundedResponses(resource._block2._completes.timeout)
    resource._block2._completes = bounded
    return bounded
