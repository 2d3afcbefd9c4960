"""What a subscription resource (`/q/{name}`) sends: SPARQL results and notifications, JSON or CBOR.

The shapes are the WebSocket gate's, made by the same public code (`Notification.results` and
`Notification.to_json`, docs/protocol.md), so one parser serves both transports:

- a GET answers the current result as a SPARQL 1.1 JSON results document;
- an observation sends notifications: ``{"sequence": n, "addedResults": ..., "removedResults": ...}``,
  the WebSocket notification without its `spuid` and `alias` (the resource names the subscription)
  and with two flags, present only when true: ``"complete"`` (this message starts the complete
  result at sequence n: drop the rows held, then apply it) and ``"more"`` (further messages of the
  same sequence follow: act once a message without it arrives).

Content formats (RFC 7252 §12.3): application/sparql-results+json has no CoAP number, so results go
as application/json (50), or application/cbor (60) when the request's Accept asks for it: the same
document, CBOR-encoded (RFC 8949), smaller and simpler to walk for a constrained device.

Why notifications are cut into parts: a notification is one datagram, and libcoap's receivers drop
one larger than its 1,152-byte buffer ("pdu too big", measured with coap-client 4.3.1), while
Block2 is not defined for notifications the way a GET uses it. Each part carries whole rows
(removed rows before added rows, the order a receiver applies them in) and stays within
`limit` bytes, except a single row larger than that, which goes alone.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import cbor2

from broker.api import Notification, Row, rows_to_bindings

JSON = 50
CBOR = 60
FORMATS = frozenset({JSON, CBOR})
MESSAGE_BYTES = 1024  # a notification's payload at most: the default block size, within libcoap's buffer


def wanted_format(accept: int | None) -> int | None:
    """The content format for a request's Accept option (JSON when absent), None when not served."""
    if accept is None:
        return JSON
    return int(accept) if int(accept) in FORMATS else None


def encode(document: Any, content_format: int) -> bytes:
    if content_format == CBOR:
        return cbor2.dumps(document)
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def results_payload(notification: Notification, content_format: int) -> bytes:
    """The SPARQL results document of a complete result (its added rows, or its boolean)."""
    return encode(notification.results(notification.added, notification.boolean), content_format)


def envelope(notification: Notification, *, complete: bool = False, more: bool = False) -> dict[str, Any]:
    """One notification as an observer receives it (see the module docstring)."""
    body = notification.to_json()["notification"]
    del body["spuid"], body["alias"]
    if complete:
        body["complete"] = True
    if more:
        body["more"] = True
    return body


def notification_parts(
    notification: Notification, content_format: int, *, complete: bool = False, limit: int = MESSAGE_BYTES
) -> list[bytes]:
    """The payloads of one notification, in order, each within `limit` bytes when its rows allow."""
    whole = encode(envelope(notification, complete=complete), content_format)
    if len(whole) <= limit or notification.boolean is not None:
        return [whole]
    changes = [(False, row) for row in notification.removed] + [(True, row) for row in notification.added]
    empty = dataclasses.replace(notification, added=(), removed=())
    overhead = len(encode(envelope(empty, complete=complete, more=True), content_format))
    sizes = [len(encode(rows_to_bindings(notification.variables, [row])[0], content_format)) + 1 for _, row in changes]
    groups: list[list[tuple[bool, Row]]] = [[]]
    used = overhead
    for change, size in zip(changes, sizes, strict=True):
        if groups[-1] and used + size > limit:
            groups.append([])
            used = overhead
        groups[-1].append(change)
        used += size
    payloads: list[bytes] = []
    for index, group in enumerate(groups):
        payloads += _fitted(
            notification, group, content_format, complete and index == 0, index == len(groups) - 1, limit
        )
    return payloads


def _fitted(
    notification: Notification,
    changes: list[tuple[bool, Row]],
    content_format: int,
    complete: bool,
    last: bool,
    limit: int,
) -> list[bytes]:
    """One part, or halves of it when the size estimate was short (a CBOR length grew a byte...)."""
    part = dataclasses.replace(
        notification,
        added=tuple(row for added, row in changes if added),
        removed=tuple(row for added, row in changes if not added),
    )
    payload = encode(envelope(part, complete=complete, more=not last), content_format)
    if len(payload) <= limit or len(changes) == 1:
        return [payload]
    half = len(changes) // 2
    return _fitted(notification, changes[:half], content_format, complete, False, limit) + _fitted(
        notification, changes[half:], content_format, False, last, limit
    )
