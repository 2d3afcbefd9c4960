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


def senml_json(payload: bytes) -> bytes:
    """A SenML CBOR pack as SenML JSON text; PayloadError for anything that is not one.

    cbor2 refuses nesting past 400 levels and lengths past the payload's end by itself (checked
    with 100,000 nested arrays and an array header claiming 2^64 items): a hostile pack is an error,
    never a crash or a large allocation.
    """
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
