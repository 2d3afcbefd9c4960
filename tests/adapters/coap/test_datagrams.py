"""The fast path's CoAP codec against aiocoap's, over random messages (hypothesis).

What would fail without it: a datagram the fast path misreads (a path, a token, a content format,
a payload) would be stored under the wrong resource or answered to the wrong request; one it takes
that aiocoap would treat differently (an option it does not know, a NON) would skip aiocoap's rules.
"""

from __future__ import annotations

import aiocoap
from aiocoap import Code
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.coap import datagrams

segments = st.lists(st.text(min_size=0, max_size=300), min_size=1, max_size=6)
tokens = st.binary(min_size=0, max_size=8)


def _message(mid: int, token: bytes, code: Code, path: list[str], payload: bytes) -> aiocoap.Message:
    """A message as it comes off the wire (a library sets these itself when it sends)."""
    message = aiocoap.Message(code=code, uri_path=path, payload=payload)
    message.mtype, message.mid, message.token = aiocoap.CON, mid, token
    return message


formats = st.one_of(st.none(), st.sampled_from([0, 50, 60, 110, 112, 11542]))


@settings(max_examples=300, deadline=None)
@given(
    mid=st.integers(0, 0xFFFF),
    token=tokens,
    path=segments,
    payload=st.binary(max_size=600),
    content_format=formats,
    code=st.sampled_from([Code.POST, Code.PUT]),
    host=st.booleans(),
)
def test_a_plain_confirmable_post_reads_as_aiocoap_reads_it(mid, token, path, payload, content_format, code, host):
    message = _message(mid, token, code, path, payload)
    if content_format is not None:
        message.opt.content_format = content_format
    if host:
        message.opt.uri_host, message.opt.uri_port = "gateway.local", 56830
    read = datagrams.parse(message.encode())
    decoded = aiocoap.Message.decode(message.encode())
    assert read is not None
    assert (read.mid, read.token, read.payload) == (decoded.mid, decoded.token, decoded.payload)
    assert read.path == "/".join(decoded.opt.uri_path)
    assert read.content_format == (None if decoded.opt.content_format is None else int(decoded.opt.content_format))


@settings(max_examples=200, deadline=None)
@given(
    mid=st.integers(0, 0xFFFF),
    token=tokens,
    path=segments,
    payload=st.binary(max_size=100),
    kind=st.sampled_from(["non", "get", "observe", "block1", "oscore", "accept", "size1"]),
)
def test_anything_else_is_left_to_aiocoap(mid, token, path, payload, kind):
    message = _message(mid, token, Code.POST, path, payload)
    if kind == "non":
        message.mtype = aiocoap.NON
    elif kind == "get":
        message.code = Code.GET
    elif kind == "observe":
        message.opt.observe = 0
    elif kind == "block1":
        message.opt.block1 = aiocoap.optiontypes.BlockOption.BlockwiseTuple(0, True, 2)
    elif kind == "oscore":
        message.opt.oscore = b"\x09\x00"
    elif kind == "accept":
        message.opt.accept = 50
    else:
        message.opt.size1 = 5000
    assert datagrams.parse(message.encode()) is None


@given(st.binary(max_size=64))
def test_garbage_is_never_an_exception(data):
    datagrams.parse(data)  # None or a request; aiocoap answers what is not one


@given(mid=st.integers(0, 0xFFFF), token=tokens, path=segments, payload=st.binary(min_size=1, max_size=100))
def test_the_request_and_the_ack_written_here_are_what_aiocoap_reads(mid, token, path, payload):
    sent = aiocoap.Message.decode(datagrams.request(mid, token, "/".join(path).replace("\x00", ""), payload, 112))
    assert (sent.mtype, sent.code, sent.mid, sent.token, sent.payload) == (aiocoap.CON, Code.POST, mid, token, payload)
    assert int(sent.opt.content_format) == 112
    ack = aiocoap.Message.decode(datagrams.ack(mid, token))
    assert (ack.mtype, ack.code, ack.mid, ack.token, ack.payload) == (aiocoap.ACK, Code.CHANGED, mid, token, b"")


@settings(max_examples=300, deadline=None)
@given(
    mid=st.integers(0, 0xFFFF),
    token=tokens,
    path=segments,
    kid=st.one_of(st.none(), st.binary(max_size=12)),
    piv=st.binary(max_size=5),
    kid_context=st.one_of(st.none(), st.binary(max_size=20)),
    observe=st.booleans(),
)
def test_the_oscore_kid_reads_as_aiocoap_writes_it(mid, token, path, kid, piv, kid_context, observe):
    from aiocoap.oscore import COSE_KID, COSE_KID_CONTEXT, COSE_PIV, CanProtect

    unprotected = {COSE_PIV: piv}
    if kid is not None:
        unprotected[COSE_KID] = kid
    if kid_context is not None:
        unprotected[COSE_KID_CONTEXT] = kid_context
    option, _ = CanProtect._compress({}, unprotected, b"")
    message = _message(mid, token, Code.POST, path, b"ciphertext")
    message.opt.oscore = option
    if observe:
        message.opt.observe = 0  # an option before OSCORE's number
    assert datagrams.oscore_kid(message.encode()) == kid


@given(data=st.binary(max_size=80))
def test_any_datagram_gives_a_kid_or_none_and_no_error(data):
    assert datagrams.oscore_kid(data) is None or isinstance(datagrams.oscore_kid(data), bytes)
