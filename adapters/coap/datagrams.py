"""The plain CoAP datagrams of a sensor's reading, read and written without aiocoap (sans I/O).

Why: aiocoap's message layer costs about 0.8 ms of CPU a request on a Raspberry Pi class core
(py-spy, `bench coap`: half of the gateway's 1.6 ms a reading), for a datagram that is a header, a
token, a path and a number. :mod:`adapters.coap.fastpath` reads the commonest request, a confirmable
POST or PUT with only Uri-Path and Content-Format options, Uri-Host and Uri-Port aside
(RFC 7252 §3, §5.10), with :func:`parse`
and answers it with :func:`ack`; every other datagram (OSCORE, Block1, Observe, NON, an option not
listed here) is left to aiocoap. :func:`request` writes the same datagram: the benchmark's clients
send what a constrained sensor would, for a fraction of aiocoap's client CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

VERSION = 1
CON, NON, ACK, RST = 0, 1, 2, 3
POST, PUT = 0x02, 0x03
CHANGED = 0x44  # 2.04
URI_HOST, URI_PORT, OSCORE, URI_PATH, CONTENT_FORMAT = 3, 7, 9, 11, 12
PAYLOAD_MARKER = 0xFF
MAX_TOKEN = 8
MAX_OPTIONS = 64  # options in one message, at most (see too_many_options)


@dataclass(slots=True, frozen=True)
class PlainRequest:
    """A confirmable POST or PUT whose only options are Uri-Path and Content-Format (and Uri-Host
    or Uri-Port, which libcoap's coap-client sends for a port other than 5683)."""

    mid: int
    token: bytes
    path: str  # the Uri-Path segments joined with "/", as aiocoap's `"/".join(opt.uri_path)`
    content_format: int | None
    payload: bytes


def parse(data: bytes) -> PlainRequest | None:
    """The request in `data`, or None for anything else (aiocoap's to read, or to refuse)."""
    try:
        return _parse(data)
    except (IndexError, UnicodeDecodeError):
        return None


def _parse(data: bytes) -> PlainRequest | None:
    first = data[0]
    tkl = first & 0x0F
    if first >> 4 != VERSION << 2 | CON or tkl > MAX_TOKEN or data[1] not in (POST, PUT):
        return None
    position = 4 + tkl
    token = data[4:position]
    if len(token) != tkl:
        return None
    number = 0
    segments: list[str] = []
    content_format: int | None = None
    end = len(data)
    while position < end:
        byte = data[position]
        position += 1
        if byte == PAYLOAD_MARKER:
            if position == end:
                return None  # a marker without a payload is a format error (§3): aiocoap refuses it
            break
        delta, position = _extended(byte >> 4, data, position)
        length, position = _extended(byte & 0x0F, data, position)
        if delta < 0 or length < 0:
            return None
        number += delta
        value = data[position : position + length]
        if len(value) != length:
            return None
        position += length
        if number == URI_PATH:
            segments.append(value.decode())
        elif number == CONTENT_FORMAT and content_format is None and length <= 2:
            content_format = int.from_bytes(value, "big")
        elif number not in (URI_HOST, URI_PORT):  # the gateway's own name and port: it serves one origin
            return None
    return PlainRequest(int.from_bytes(data[2:4], "big"), token, "/".join(segments), content_format, data[position:end])


def too_many_options(data: bytes, limit: int = MAX_OPTIONS) -> bool:
    """Whether the message in `data` carries more than `limit` options (read no further than that).

    Why: aiocoap decodes every option into an object, ~6 µs each: a 4 KB datagram of 4,000 empty
    Uri-Path options took 24 ms to decode (0.03 ms with one), and a POST of one 32-38 ms of the
    gateway's CPU, against 1.1-1.6 ms (300 each, in-process adapter, 2026-12-07,
    /tmp/atk-coap/paths.py): the event loop held that long per datagram, and the network budget,
    which counts datagrams, let ~25 times the CPU it was sized for. No request the gateway serves
    needs more than a path, a query and a handful of others."""
    try:
        return _option_count(data, limit) > limit
    except IndexError:
        return False  # cut short: aiocoap's to refuse as it does any malformed message


def _option_count(data: bytes, limit: int) -> int:
    position, count, end = 4 + (data[0] & 0x0F), 0, len(data)
    while position < end and count <= limit:
        byte = data[position]
        if byte == PAYLOAD_MARKER:
            break
        delta, position = _extended(byte >> 4, data, position + 1)
        length, position = _extended(byte & 0x0F, data, position)
        if delta < 0 or length < 0:
            break
        position += length
        count += 1
    return count


def oscore_kid(data: bytes) -> bytes | None:
    """The kid of the OSCORE option of the request in `data` (RFC 8613 §6.1), or None (no option,
    no kid, or not a well-formed request). Not verified: anyone can write any kid; the fast path
    reads it only to decide whose share of the network budget a request takes."""
    try:
        return _oscore_kid(data)
    except IndexError:
        return None


def _oscore_kid(data: bytes) -> bytes | None:
    tkl = data[0] & 0x0F
    if tkl > MAX_TOKEN:
        return None
    position, number, end = 4 + tkl, 0, len(data)
    while position < end:
        byte = data[position]
        if byte == PAYLOAD_MARKER:
            return None
        delta, position = _extended(byte >> 4, data, position + 1)
        length, position = _extended(byte & 0x0F, data, position)
        if delta < 0 or length < 0:
            return None
        number += delta
        if number > OSCORE:
            return None  # options come in order: there is none
        if number == OSCORE:
            return _kid(data[position : position + length])
        position += length
    return None


def _kid(value: bytes) -> bytes | None:
    """The kid in an OSCORE option's value: flags (n: Partial IV length, k: kid, h: kid context),
    the Partial IV, the kid context with its length byte, then the kid to the end."""
    if not value:
        return None
    flags = value[0]
    if not flags & 0x08:
        return None
    position = 1 + (flags & 0x07)
    if flags & 0x10:
        position += 1 + value[position]
    return value[position:] if position <= len(value) else None


def _extended(nibble: int, data: bytes, position: int) -> tuple[int, int]:
    """An option's delta or length from its nibble and the bytes after it (§3.1); -1 if reserved."""
    if nibble == 13:
        return data[position] + 13, position + 1
    if nibble == 14:
        return (data[position] << 8 | data[position + 1]) + 269, position + 2
    return (-1 if nibble == 15 else nibble), position


def ack(mid: int, token: bytes, code: int = CHANGED) -> bytes:
    """The piggybacked response without options or payload: a 2.04 Changed by default."""
    return bytes((VERSION << 6 | ACK << 4 | len(token), code)) + mid.to_bytes(2, "big") + token


def reset_for(data: bytes) -> bytes | None:
    """The Reset rejecting the confirmable message `data` (RFC 7252 §4.2), or None when it is not one."""
    if len(data) < 4 or data[0] >> 4 != VERSION << 2 | CON:
        return None
    return bytes((VERSION << 6 | RST << 4, 0)) + data[2:4]


def request(mid: int, token: bytes, path: str, payload: bytes, content_format: int = 0, code: int = POST) -> bytes:
    """A confirmable POST (or PUT) of `payload` to `path` (segments separated by "/")."""
    header = bytes((VERSION << 6 | CON << 4 | len(token), code)) + mid.to_bytes(2, "big") + token
    options = bytearray()
    number = 0
    for segment in path.split("/"):
        options += _option(URI_PATH - number, segment.encode())
        number = URI_PATH
    options += _option(CONTENT_FORMAT - number, content_format.to_bytes((content_format.bit_length() + 7) // 8, "big"))
    return header + bytes(options) + (bytes((PAYLOAD_MARKER,)) + payload if payload else b"")


def _option(delta: int, value: bytes) -> bytes:
    head, extra = _nibble(delta)
    length, more = _nibble(len(value))
    return bytes((head << 4 | length,)) + extra + more + value


def _nibble(value: int) -> tuple[int, bytes]:
    if value < 13:
        return value, b""
    if value < 269:
        return 13, bytes((value - 13,))
    return 14, (value - 269).to_bytes(2, "big")
