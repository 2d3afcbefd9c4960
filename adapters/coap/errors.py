"""A CoAP request refused: its response code and a diagnostic payload for people."""

from __future__ import annotations

import aiocoap
from aiocoap import Code

from adapters.coap import formats


class Refused(Exception):
    """A request refused with `code`; the message is the diagnostic payload."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


def refusal(code: Code, message: str, **options: object) -> aiocoap.Message:
    """A response with a diagnostic payload (RFC 7252 §5.5.2: UTF-8 text, at most 200 bytes here)."""
    return aiocoap.Message(code=code, payload=message.encode()[:200], content_format=formats.TEXT_PLAIN, **options)
