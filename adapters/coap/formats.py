"""The CoAP content formats a reading may come in, and SenML CBOR read as SenML JSON.

CoAP names a payload's format by number (RFC 7252 §12.3): 0 text/plain, 50 application/json,
110 application/senml+json and 112 application/senml+cbor (RFC 8428 §12.3). A request without a
Content-Format is read as text, which is what `coap-client -e 63.5` sends. SenML CBOR is turned into
the SenML JSON the observation layer reads (gateway/observations/senml.py), so a pack means the same
in both encodings; its integer labels are RFC 8428 §6's.
"""

from __future__ import annotations

import json
import math
from typing import Any

import cbor2

from gateway.observations import PayloadError

TEXT_PLAIN = 0
JSON = 50
SENML_JSON = 110
SENML_CBOR = 112
VALUES = frozenset({None, TEXT_PLAIN, JSON})  # a value (or a document a json mapping reads)
SENML = frozenset({SENML_JSON, SENML_CBOR})
READABLE = VALUES | SENML

_LABELS = {
    -1: "bver",
    -2: "bn",
    -3: "bt",
    -4: "bu",
    -5: "bv",
    -6: "bs",
    0: "n",
    1: "u",
    2: "v",
    3: "vs",
    4: "vb",
    5: "s",
    6: "t",
    7: "ut",
    8: "vd",
}


# the bytes a tag's head begins with (major type 6): a pack holding none of them holds no tag
_TAG_HEADS = bytes(range(0xC0, 0xDC))
_BIGNUMS = frozenset({2, 3})  # a number past 64 bits: the only tags a reading may carry


def refuse_tags(payload: bytes) -> None:
    """PayloadError if the CBOR item `payload` holds a tag other than a bignum's, read from its
    item heads without decoding anything.

    Why: cbor2 resolves shared references (tags 28/29) and string references (256/25) while it
    decodes, so a 64 KB pack of one 32 KB string and ~11,000 three-byte references to it decoded
    to ~360 MB of JSON text: 1.56 s on the event loop and +683 MB of RSS for one request of a
    sensor login, before the size limit could refuse it. SenML (RFC 8428 §6) uses no tags.
    The walk costs 6-8 ms for a 64-80 KB pack of 2,500-3,500 records, a fifth of converting it
    (33 ms); a pack holding no byte a tag head could start with is passed at C speed.
    """
    if len(payload.translate(None, _TAG_HEADS)) == len(payload):
        return
    position, end = 0, len(payload)
    open_items: list[int | None] = [1]  # items left to read in each open container; None: indefinite
    while open_items:
        left = open_items[-1]
        if left == 0:
            open_items.pop()
            continue
        if position >= end:
            raise PayloadError("not CBOR: the pack ends inside an item")
        head = payload[position]
        position += 1
        if left is None and head == 0xFF:  # the break ending an indefinite container
            open_items.pop()
            continue
        if left is not None:
            open_items[-1] = left - 1
        major, info = head >> 5, head & 0x1F
        argument: int | None = info
        if 24 <= info <= 27:
            size = 1 << (info - 24)
            argument = int.from_bytes(payload[position : position + size], "big")
            position += size
        elif info == 31 and major in (2, 3, 4, 5):
            argument = None
        elif info > 23:
            raise PayloadError("not CBOR: a reserved item head")
        if major in (2, 3):
            if argument is None:
                open_items.append(None)  # chunks until a break
            else:
                position += argument
        elif major == 4:
            open_items.append(argument)
        elif major == 5:
            open_items.append(None if argument is None else 2 * argument)
        elif major == 6:
            if argument not in _BIGNUMS:
                raise PayloadError(f"CBOR tag {argument} is not taken in a SenML pack (only bignums 2 and 3)")
            open_items.append(1)


def senml_json(payload: bytes) -> bytes:
    """A SenML CBOR pack as SenML JSON text; PayloadError for anything that is not one.

    cbor2 refuses nesting past 400 levels and lengths past the payload's end by itself (checked
    with 100,000 nested arrays and an array header claiming 2^64 items): a hostile pack is an error,
    never a crash or a large allocation. References are refused before it reads the pack
    (:func:`refuse_tags`).
    """
    refuse_tags(payload)
    try:
        document = cbor2.loads(payload)
    except (cbor2.CBORDecodeError, ValueError, TypeError, RecursionError, OverflowError) as error:
        raise PayloadError(f"not CBOR: {str(error)[:120]}") from None
    records = document if isinstance(document, list) else [document]
    converted: list[dict[str, Any]] = []
    for position, record in enumerate(records):
        if not isinstance(record, dict):
            raise PayloadError(f"SenML record {position} is not a CBOR map")
        fields: dict[str, Any] = {}
        for label, value in record.items():
            name = _LABELS.get(label, label) if isinstance(label, int) else label
            if not isinstance(name, str):
                raise PayloadError(f"SenML record {position}: label {label!r} is neither a number nor text")
            if name == "vd":
                continue  # a data value carries no reading (RFC 8428 §4.2), and bytes have no JSON form
            if isinstance(value, float) and not math.isfinite(value):
                raise PayloadError(f"SenML record {position}: {name} is not a finite number")
            if not isinstance(value, str | int | float | bool) or value is None:
                raise PayloadError(f"SenML record {position}: {name} is not a SenML value")
            fields[name] = value
        converted.append(fields)
    try:
        return json.dumps(converted).encode()
    except ValueError:  # a bignum (tag 2) past Python's 4,300 digits of integer text: not a reading
        raise PayloadError("a number in the pack is too long to be a reading") from None
