"""A bytes buffer that refuses to grow past a limit: pyoxigraph serializes a result into it a few
KB at a time, so a result larger than the limit stops being evaluated and written there, instead
of being made whole in memory first (see broker.gates.negotiation.serialize, QueryProcessor.tsv)."""

from __future__ import annotations

import io


class TooLarge(Exception):
    """Raised by :meth:`BoundedBuffer.write` past the limit."""


class BoundedBuffer(io.BytesIO):
    """`refused`: what the write that passed the limit was given (what was serialized last)."""

    def __init__(self, limit: int | None) -> None:
        super().__init__()
        self.limit = limit
        self.refused = b""

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        if self.limit is not None and self.tell() + len(memoryview(data)) > self.limit:
            self.refused = bytes(data)
            raise TooLarge
        return super().write(data)
