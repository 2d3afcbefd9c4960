"""Block-wise request assembly that answers 4.08, not 5.00, when a block does not fit its transfer.

Why: aiocoap's Block1Spool answers a block of an unknown transfer with 4.08 Request Entity
Incomplete (RFC 7959 §2.9.2), but a block that does not continue the transfer it is keyed to
raises ValueError out of the resource: a 5.00 Internal Server Error and an error log with its
traceback, per block. Two block-wise POSTs from one endpoint to one resource at once, without a
Request-Tag, do that (aiocoap's own client sends them so): one client posting 3.7 KB SenML packs
50 at a time got 1,972 5.00s in 5 s, and the gateway's log as many tracebacks. Now each is a
4.08, counted with the resource's refusals; the sender starts its transfer again.
"""

from __future__ import annotations

from collections import Counter

import aiocoap
from aiocoap.blockwise import Block1Spool
from aiocoap.error import RequestEntityIncomplete
from aiocoap.resource import Resource


class Block1Assembly(Block1Spool):  # type: ignore[misc]
    """aiocoap's spool, with a block that does not fit answered 4.08 and counted in `refused`."""

    def __init__(self, refused: Counter[str]) -> None:
        super().__init__()
        self.refused = refused

    def feed_and_take(self, req: aiocoap.Message) -> aiocoap.Message:
        try:
            return super().feed_and_take(req)
        except ValueError:  # its sender's next block 0 starts the transfer afresh
            self.refused["4.08"] += 1
            raise RequestEntityIncomplete() from None


def assemble_with_refusals(resource: Resource, refused: Counter[str]) -> None:
    """Give `resource` the spool above (aiocoap's Resource keeps its spool in `_block1`)."""
    resource._block1 = Block1Assembly(refused)
