"""Readings in: a POST or PUT of a sensor's reading to a resource becomes observations.

The path is the source the mappings match (`/s/boiler/temperature` is `s/boiler/temperature`), as an
MQTT topic is: one mapping serves both transports. 2.04 Changed is sent only once the observations
are committed (:class:`~adapters.coap.batcher.Batcher`), so a reading acknowledged is in the store and
every subscription has seen it. A confirmable request retransmitted because its ACK was lost is
recognised by aiocoap's message layer (same endpoint and message ID within EXCHANGE_LIFETIME) and
answered with the first response: it never reaches this code twice.

Refusals, each with a one-line diagnostic payload and counted per resource (`bad_input_by_resource`):
4.00 a payload that cannot be read or written, 4.01 a request that is not authenticated
(:mod:`adapters.coap.access`), 4.04 a path no mapping takes, 4.08 a block that does not continue its
transfer (:mod:`adapters.coap.blockwise`), 4.13 a payload over `max_payload_bytes`
(with Size1; also announced or reached part-way through a block-wise transfer, which is then not
assembled further), 4.15 a content format the resource does not read, 5.03 (Max-Age 1) when too many
readings wait for their commit.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import aiocoap
from aiocoap import Code
from aiocoap.resource import Resource

from adapters.coap import formats
from adapters.coap.access import Access, authenticated
from adapters.coap.batcher import Batcher, Overloaded
from adapters.coap.blockwise import assemble_with_refusals
from adapters.coap.deliveries import Delivery, delivery
from adapters.coap.errors import Refused, refusal
from gateway.observations import Mapper, PayloadError, Reading, UnmappedTopic
from gateway.observations.counters import SourceCounters

UNAUTHENTICATED = "(unauthenticated)"  # the resource bad input is counted under when refused 4.01


class ReadingsResource(Resource):
    """Every path no other resource claims: a reading POSTed or PUT there."""

    def __init__(
        self,
        mapper: Callable[[], Mapper],
        batcher: Batcher,
        access: Access,
        *,
        max_payload_bytes: int = 65_536,
        counters: SourceCounters | None = None,
    ) -> None:
        super().__init__()
        self._mapper = mapper
        self.batcher = batcher
        self.access = access
        self.max_payload_bytes = max_payload_bytes
        self.counters = counters or SourceCounters(label="coap: bad input on resource")
        self.readings = 0
        self.requests = 0
        self.refused: Counter[str] = Counter()
        self._unassembled: set[int] = set()  # ids of requests given to render one block at a time
        assemble_with_refusals(
            self, lambda request, refused: self.refuse("/".join(request.opt.uri_path), refused, authenticated(request))
        )

    async def needs_blockwise_assembly(self, request: aiocoap.Message) -> bool:
        """Assemble block-wise payloads only while they stay under the limit (aiocoap's spool has
        none: a sender could grow one without end); a block past it is rendered alone, and refused.
        A peer that would be refused 4.01 gets it at its first block, with nothing held."""
        if not self.access.admits(request):
            return False
        block1 = request.opt.block1
        reached = (block1.start if block1 is not None else 0) + len(request.payload)
        if max(reached, request.opt.size1 or 0) > self.max_payload_bytes:
            self._unassembled.add(id(request))
            return False
        return True

    async def render(self, request: aiocoap.Message) -> aiocoap.Message:
        """Render any method, then forget whether the request was left unassembled.

        Why here and not in render_post: aiocoap refuses the other methods (4.05) without a
        render_post, and an id() kept past its request is soon another request's, which would then
        be refused 4.13 (a GET with a large Size1 did that to later readings, and grew the set)."""
        try:
            return await super().render(request)
        finally:
            self._unassembled.discard(id(request))

    async def render_post(self, request: aiocoap.Message) -> aiocoap.Message:
        path = "/".join(request.opt.uri_path)
        self.requests += 1
        unassembled = id(request) in self._unassembled
        try:
            self.access.check_reading(request, path)
            if unassembled:
                raise Refused(Code.REQUEST_ENTITY_TOO_LARGE, f"payloads are limited to {self.max_payload_bytes} bytes")
            stored = self.offer(
                path, request.opt.content_format, request.payload, request.opt.size1, _delivery(request, path)
            )
            if stored is not None:
                try:
                    await asyncio.shield(stored)  # given up on, it still commits: its sender may retransmit
                except Exception as error:
                    raise stored_refusal(error) from None
        except Refused as refused:
            return self.refuse(path, refused, authenticated(request))
        return aiocoap.Message(code=Code.CHANGED)

    render_put = render_post

    def offer(
        self, path: str, content_format: int | None, payload: bytes, size1: int | None, item: Delivery | None
    ) -> asyncio.Future[None] | None:
        """Queue the readings of an authorised request for their commit: the future is done once
        they are stored (or fails with what :func:`stored_refusal` turns into a response); None when
        there is nothing to store (a retransmission of a committed request, an empty pack).
        Raises Refused for a request refused before any commit. Shared by :meth:`render_post` and
        the fast path (:mod:`adapters.coap.fastpath`), which call it with the request's own fields."""
        if max(len(payload), size1 or 0) > self.max_payload_bytes:
            raise Refused(Code.REQUEST_ENTITY_TOO_LARGE, f"payloads are limited to {self.max_payload_bytes} bytes")
        if item is not None:
            if self.batcher.deliveries.committed(item):
                return None  # committed before a restart, its 2.04 lost: answered again, not stored again
            queued = self.batcher.queued(item)
            if queued is not None:  # a retransmission by the other path while its first copy waits
                return queued
        readings = payload_readings(self._mapper(), path, content_format, payload, time.time_ns() // 1000)
        if not readings:
            return None  # a pack with no value in it: nothing to store, and nothing wrong
        try:
            stored = self.batcher.submit(readings, item)
        except Overloaded as error:
            raise Refused(Code.SERVICE_UNAVAILABLE, str(error)) from None
        count = len(readings)
        stored.add_done_callback(lambda done: self._count(done, count))
        return stored

    def _count(self, done: asyncio.Future[None], count: int) -> None:
        if not done.cancelled() and done.exception() is None:
            self.readings += count

    def refuse(self, path: str, refused: Refused, sensor: str | None = None) -> aiocoap.Message:
        """The response to a refused request, counted per code and per resource; one refused for
        want of a login (4.01) under "(unauthenticated)": its path is anyone's on the LAN (the
        source address of a datagram is spoofed at will), and 1,100 junk paths took every
        per-resource slot a real sensor's bad input needed. One of `sensor` refused for a path it
        may not post to (4.03) under "(forbidden to SENSOR)", for the same reason: the paths are
        the sensor's to make up, and one sensor's 1,100 posts to s/x0..s/x1099 took the 998 slots
        left, the other sensors' bad input then counted only under "(other topics)"."""
        self.refused[refused.code.dotted] += 1
        if refused.code == Code.UNAUTHORIZED:
            where = UNAUTHENTICATED
        elif refused.code == Code.FORBIDDEN and sensor is not None:
            where = f"(forbidden to {sensor})"
        else:
            where = path or "/"
        self.counters.add(where, f"{refused.code.dotted} {refused}")
        options: dict[str, int] = {}
        if refused.code == Code.REQUEST_ENTITY_TOO_LARGE:
            options = {"size1": self.max_payload_bytes}
        elif refused.code == Code.SERVICE_UNAVAILABLE:
            options = {"max_age": 1}
        return refusal(refused.code, str(refused), **options)


def stored_refusal(error: BaseException) -> Refused:
    """What a commit's failure tells the sender: 4.00 for a reading that cannot be written, else
    5.03 (too many waiting, or the store failed: it may retry)."""
    if isinstance(error, Overloaded):
        return Refused(Code.SERVICE_UNAVAILABLE, str(error))
    if isinstance(error, PayloadError):
        return Refused(Code.BAD_REQUEST, str(error))
    # the broker's error name where there is one (store_full: the gateway is short of memory)
    reason = getattr(error, "error", None) or type(error).__name__
    return Refused(Code.SERVICE_UNAVAILABLE, f"the store did not take the reading: {reason}")


def payload_readings(
    mapper: Mapper, path: str, content_format: int | None, payload: bytes, arrival_us: int
) -> list[Reading]:
    """The readings of one payload for the source `path`, in its CoAP content format.

    Shared by the readings POSTed here and the notifications of the resources the gateway observes
    (:mod:`adapters.coap.observer`), so that a payload means the same whichever way it came. Raises
    Refused: 4.15 for a format not read (or SenML where the mapping reads a value), 4.04 when no
    mapping takes `path`, 4.00 for a payload that cannot be read.
    """
    if content_format not in formats.READABLE:
        raise Refused(
            Code.UNSUPPORTED_CONTENT_FORMAT,
            f"content format {int(content_format)} not read here (0, 50, 110 or 112)",
        )
    try:
        found = mapper.match(path)
    except PayloadError as error:  # a mapping takes the path but cannot resolve it: `s/boiler/temprature`
        raise Refused(Code.BAD_REQUEST, str(error)) from None
    if found is None:
        raise Refused(Code.NOT_FOUND, f"no mapping takes /{path}"[:200])
    senml = found[0].mapping.extract == "senml"
    if content_format in formats.SENML and not senml:
        raise Refused(Code.UNSUPPORTED_CONTENT_FORMAT, "this resource reads a value (text/plain or application/json)")
    try:
        if content_format == formats.SENML_CBOR:
            payload = formats.senml_json(payload)
        return mapper.readings(path, payload, arrival_us)
    except UnmappedTopic as error:
        raise Refused(Code.NOT_FOUND, str(error)) from None
    except PayloadError as error:
        raise Refused(Code.BAD_REQUEST, str(error)) from None


def _delivery(request: aiocoap.Message, path: str) -> Delivery | None:
    """What names a confirmable request across a restart (its endpoint and message ID), or None."""
    if request.mtype != aiocoap.CON or request.mid is None:
        return None
    endpoint = getattr(request.remote, "hostinfo", None)
    return delivery(str(endpoint), request.mid, path, request.payload) if endpoint else None
