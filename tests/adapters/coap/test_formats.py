"""SenML CBOR read as SenML JSON (adapters/coap/formats.py): honest packs whatever bytes they hold,
references and other tags refused from the item heads before anything is decoded."""

from __future__ import annotations

import json
import struct

import cbor2
import pytest

from adapters.coap.formats import refuse_tags, senml_json
from gateway.observations import PayloadError

HONEST = [
    [{-2: "Küche/", 0: "temperature", 1: "Cel", 2: 21.5}],  # 0xC3 0xBC: a tag head's byte in text
    [{0: "ܐܒ", 2: -1.7976931348623157e308}, {0: "x", 2: 2**70}],  # bignum (tag 2), 0xDC in text
    [{0: "power", 2: struct.unpack(">d", bytes.fromhex("c0dcdddedf000000"))[0], 1: "W"}],
    {0: "single", 2: 1, 4: True},
]


@pytest.mark.parametrize("pack", HONEST, ids=range(len(HONEST)))
def test_an_honest_pack_is_read_whatever_bytes_it_holds(pack: object) -> None:
    records = pack if isinstance(pack, list) else [pack]
    assert len(json.loads(senml_json(cbor2.dumps(pack)))) == len(records)


def test_an_indefinite_pack_is_read() -> None:
    """Indefinite arrays, maps and text chunks, with a byte a tag head could start with (0xC3) so that
    the heads are walked."""
    second = b"\xbf\x00\x7f\x61b\x62\xc3\xbc\xff\x02\x02\xff"  # {0: "bü", 2: 2}, all indefinite
    payload = b"\x9f" + cbor2.dumps({0: "a", 2: 1}) + second + b"\xff"
    assert json.loads(senml_json(payload)) == [{"n": "a", "v": 1}, {"n": "bü", "v": 2}]


def shared(text: str, references: int) -> bytes:
    """One record marked shareable (tag 28), then references to it (tag 29)."""
    return b"\x9f\xd8\x1c" + cbor2.dumps({0: text, 2: 1}) + b"\xd8\x1d\x00" * references + b"\xff"


def string_references(text: str, references: int) -> bytes:
    """A string-reference namespace (tag 256) whose first string is referred to (tag 25) again and again."""
    body = b"\x9f" + cbor2.dumps({0: text, 2: 1}) + (b"\xa2\x00\xd8\x19\x00\x02\x01") * references + b"\xff"
    return b"\xd9\x01\x00" + body


@pytest.mark.parametrize("payload", [shared("x" * 2000, 1000), string_references("y" * 2000, 500)], ids=["28", "256"])
def test_references_are_refused_before_they_are_resolved(payload: bytes) -> None:
    """A 64 KB pack of one 32 KB string and ~11,000 references to it decoded to ~360 MB of JSON
    (1.56 s, +683 MB RSS) before the size limit refused it."""
    resolved = cbor2.loads(payload)  # what cbor2 alone makes of it: many records sharing one text
    assert len(resolved) > 400 and len(payload) < 8000
    with pytest.raises(PayloadError, match="CBOR tag (28|256) is not taken"):
        senml_json(payload)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (cbor2.dumps([{0: "t", 2: cbor2.CBORTag(1, 1_700_000_000)}]), "tag 1"),
        (b"\x9f\x62\xc3\xbc", "ends inside"),
        (b"\x9f\x62\xc3\xbc\x1c", "reserved"),
        (b"\xc2", "ends inside"),
    ],
)
def test_other_tags_and_broken_heads_are_refused(payload: bytes, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        refuse_tags(payload)
