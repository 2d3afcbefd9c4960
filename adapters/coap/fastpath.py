"""Plain confirmable readings answered beside aiocoap's message layer, on its own socket.

Why: a sensor's reading is a confirmable POST of a number, and aiocoap spends about 0.8 ms of CPU on
each (decoding into a Message, deduplication records, token and exchange bookkeeping, the resource
tree, encoding the response): half of what the gateway spent a reading, and what held `bench coap`
to 559 readings/s. Here the datagram is read by :func:`adapters.coap.datagrams.parse`, its readings
queued with :meth:`ReadingsResource.offer` (the same mapping, limits, batches and delivery records
as a request through aiocoap), and the 2.04 written from the commit's callback: no task, no Message.

What takes this path, and only this: a CON POST or PUT with Uri-Path and Content-Format options
only, to a path the site routes to the readings, from a peer the access rule trusts without
authentication (any peer without `[security]`, this board with it). Everything else goes to aiocoap
unchanged: OSCORE, block-wise, NON, other options, `/q`, `/.well-known/core`. A reading refused
before its commit (no mapping, a payload that cannot be read, a pattern past its time limit, too many
waiting) is answered here with the diagnostic aiocoap's path gives, counted the same: handed to
aiocoap, it was mapped a second time there (a catastrophic pattern ran twice per request).

Requests from the network that aiocoap must read are rationed (:class:`NetworkBudget`): aiocoap keeps
a deduplication record of every confirmable request (with its response, about 2 KB in all) for
EXCHANGE_LIFETIME, 247 s. Unrationed, a flood from the LAN, even of requests it only refuses, grew
the gateway without bound while it lasted (measured: 300,000 CON GETs from 64 ports in 64 s, RSS
86 -> 177 MB and rising; kept 247 s). Past `network_requests_max` in the last 247 s they are dropped
unanswered and counted (`sepa_coap_network_requests_shed_total`); the same flood with the default
20,000: RSS 86 -> 130 MB and flat from the 30th second, 144,810 shed. This board's own requests are
never rationed. With `[security]` on, a plain reading from a network peer is refused 4.01 here, the
answer aiocoap's path gives, at a fraction of its CPU and with no record to keep; these refusals
take from the same budget, since a spoofed source would otherwise make the gateway an amplifier
(the 4.01 with its diagnostic is about twice the size of the request).

The budget is shared, so junk from anyone could spend it and keep the OSCORE sensors out (a
budget of 40, 60 junk GETs: the sensor's POST timed out; at the default 20,000 about 81
datagrams/s keep every sensor out). A request whose OSCORE kid is a known sensor's therefore takes
first from that sensor's own reserve (`reserve_per_sensor` in any 247 s), and from the shared
budget only past it. The kid is read unverified (:func:`adapters.coap.datagrams.oscore_kid`):
a forger who copies a sensor's kid spends that sensor's reserve, no other's, and aiocoap's OSCORE
check still refuses what it sends. Memory: each reserve may add its count of aiocoap records
(~2 KB each), so the sensors' reserves bound the gateway at `network_requests_max` plus
`reserve_per_sensor` for every sensor, 2 MB each with the default 1,000.

Duplicates: a retransmission whose original is still waiting for its commit is dropped (its answer is
on the way); one that comes after is recognised by the delivery record and answered 2.04 without
being stored again (:mod:`adapters.coap.deliveries`, which also covers a restart). Both paths share
the records: a copy that comes by one path while another waits by the other is answered with that
copy's commit (:meth:`Batcher.queued <adapters.coap.batcher.Batcher.queued>`), not stored twice.

How it attaches: aiocoap reads its UDP socket in `MessageInterfaceUDP6.datagram_msg_received`;
:meth:`FastPath.attach` wraps that method on the context's interfaces. aiocoap has no public hook
for this; where the interface is not found (another transport, a later aiocoap), nothing is
wrapped and every request goes through aiocoap, slower but the same.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Collection
from functools import partial
from typing import Any

import aiocoap
from aiocoap.transports.udp6 import MessageInterfaceUDP6, UDP6EndpointAddress

from adapters.coap import datagrams
from adapters.coap.access import loopback_address, unauthenticated
from adapters.coap.deliveries import EXCHANGE_LIFETIME_S, delivery
from adapters.coap.errors import Refused
from adapters.coap.readings import ReadingsResource, stored_refusal
from adapters.coap.site import GatewaySite
from broker.api import QuietLog

log = logging.getLogger(__name__)

Ancillary = list[tuple[int, int, bytes]]
DRAIN_MAX = 64  # datagrams read after the one aiocoap read, at most, before the loop runs other work
DRAIN_S = 0.002  # ...and no more once this long was spent on them (see FastPath.received)
RECEIVE_BYTES, ANCILLARY_BYTES = 4096, 1024  # as aiocoap's reader
RECORD_UNIT_BYTES = 1024  # a datagram counts one more record in the network budget per this many bytes
MAX_PEERS = 4096  # peers whose address details are kept (a sensor's are reused for each reading)
UNPARSABLE = "Ignoring unparsable message from %s"  # aiocoap's udp6 reader's warning (aiocoap 0.4.x)
MAX_NOTICE_FORMATS = 64  # formats of aiocoap's messages rate-limited apart (they are its source's: a few dozen)
OTHER_NOTICES = "(other formats)"


def record_units(data: bytes) -> int:
    """What a datagram handed to aiocoap costs the budget: one record, and one more for each full
    RECORD_UNIT_BYTES it carries. Why: aiocoap's record holds the request itself, so a flood of
    large datagrams grew the gateway three times as far as one of small ones (19,300 GETs of 3.9 KB
    within the default budget: RSS +122 MB, against +44 MB for 20,000 small ones; counted by size,
    30,000 of them from 16 ports: +36 MB, against +95 MB)."""
    return 1 + len(data) // RECORD_UNIT_BYTES


class NetworkBudget:
    """At most `limit` datagrams in any `window_s` (1-second buckets): how many network requests
    aiocoap may be holding deduplication records for at once (a large one counts as several,
    :func:`record_units`)."""

    def __init__(self, limit: int, window_s: float = EXCHANGE_LIFETIME_S, clock: Callable[[], float] = time.monotonic):
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self._buckets: deque[list[int]] = deque()  # [second, datagrams], oldest first
        self._total = 0

    def take(self, units: int = 1) -> bool:
        """Whether one more datagram of `units` may go now (it is then counted)."""
        second = int(self._clock())
        while self._buckets and self._buckets[0][0] <= second - self.window_s:
            self._total -= self._buckets.popleft()[1]
        if self._total + units > self.limit:
            return False
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += units
        else:
            self._buckets.append([second, units])
        self._total += units
        return True


class FastPath:
    """Answers plain confirmable readings (see the module docstring)."""

    def __init__(
        self,
        resource: ReadingsResource,
        site: GatewaySite,
        *,
        secure: bool,
        network_requests_max: int = 20_000,
        reserve_per_sensor: int = 1_000,
        sensor_kids: Callable[[], Collection[bytes]] = frozenset,
    ) -> None:
        self.resource = resource
        self.site = site
        self.secure = secure
        self.network = NetworkBudget(network_requests_max)
        self.reserve_per_sensor = reserve_per_sensor
        self.sensor_kids = sensor_kids  # the OSCORE kids of the sensors known now
        self._reserves: dict[bytes, NetworkBudget] = {}
        self.reserved = 0  # network requests that took from a sensor's reserve
        self.answered = 0
        self.retransmissions_dropped = 0
        self.network_shed = 0
        self.options_dropped = 0  # datagrams of more than datagrams.MAX_OPTIONS options
        self.malformed = 0  # datagrams aiocoap could not decode
        self.truncated = 0  # datagrams longer than RECEIVE_BYTES
        self.aiocoap_notices = 0  # aiocoap's other log records below ERROR (see quiet)
        self._notices: dict[str, QuietLog] = {}  # by format of aiocoap's message
        self._pending: set[tuple[Any, int]] = set()
        self._peers: dict[Any, tuple[bool, str]] = {}
        self._sockets: dict[int, socket.socket] = {}  # by id() of the interface reading it

    def attach(self, context: aiocoap.Context) -> int:
        """Wrap the datagram handler of `context`'s UDP interfaces; how many were wrapped."""
        attached = 0
        for interface in context.request_interfaces:
            messages = getattr(getattr(interface, "token_interface", None), "message_interface", None)
            if isinstance(messages, MessageInterfaceUDP6):
                messages.datagram_msg_received = partial(self.received, messages, messages.datagram_msg_received)
                sock = messages.transport.get_extra_info("socket")
                if sock is not None:
                    self._sockets[id(messages)] = sock
                attached += 1
        if not attached:
            log.warning("coap: fast path not attached (no udp6 interface); every request goes through aiocoap")
        return attached

    def received(
        self,
        interface: MessageInterfaceUDP6,
        slow: Callable[[bytes, Ancillary, int, Any], None],
        data: bytes,
        ancdata: Ancillary,
        flags: int,
        address: Any,
    ) -> None:
        """aiocoap read a datagram: take it, then the datagrams already waiting behind it.

        Why read more here: aiocoap's reader takes one datagram a wakeup of the event loop, with a
        read of the socket's error queue before it (an exception when it is empty): 19 % of the
        loop's time at 950 readings/s, py-spy. A read that fails with anything but "nothing waits"
        stops this; aiocoap's next wakeup reads the error queue and reports it as before.

        Why no more after DRAIN_S: a datagram aiocoap must read (a refusal, a request of /q, junk)
        costs it about 2 ms, and 65 of them a wakeup held the loop for every other wakeup's work:
        an unauthenticated flood from the LAN (GETs of /q, readings, junk, ~9,000 datagrams/s) took
        the HTTP updates' p50 from 5 to 1,434 ms (max 2.1 s). Plain readings, ~0.1 ms each, still
        come 20 or more a wakeup."""
        deadline = time.monotonic() + DRAIN_S
        self._take(interface, slow, data, ancdata, flags, address)
        sock = self._sockets.get(id(interface))
        for _ in range(DRAIN_MAX):
            if sock is None or time.monotonic() >= deadline:
                return
            try:
                data, ancdata, flags, address = sock.recvmsg(RECEIVE_BYTES, ANCILLARY_BYTES)
            except OSError:
                return
            self._take(interface, slow, data, ancdata, flags, address)

    def _take(
        self,
        interface: MessageInterfaceUDP6,
        slow: Callable[[bytes, Ancillary, int, Any], None],
        data: bytes,
        ancdata: Ancillary,
        flags: int,
        address: Any,
    ) -> None:
        if flags & socket.MSG_TRUNC:
            # longer than RECEIVE_BYTES (aiocoap's reader reads no more either): the rest is lost, and
            # "0.000...1e4105" was stored as 0, acknowledged. Dropped and counted, never parsed (RFC 7252
            # §4.2: a malformed message); a sensor sends more as a block-wise transfer.
            self.truncated += 1
            return None
        if datagrams.too_many_options(data):
            # before aiocoap decodes them all, and before any budget: dropped, counted, a CON rejected
            self.options_dropped += 1
            return self._reject(interface, data, ancdata, address)
        local, hostinfo = self._peer(interface, address)
        request = datagrams.parse(data)
        if request is None or not self.site.reads(request.path):
            return self._slow(interface, slow, local, data, ancdata, flags, address)
        if self.secure and not local:
            # not OSCORE (parse takes no other option): what aiocoap's path would answer, without its record
            if not self.network.take():  # a 4.01 is twice the size of the request: no free amplifier
                self.network_shed += 1
                return None
            refusal = self.resource.refuse(request.path, unauthenticated(request.path))
            return self._send(interface, address, _pktinfo(ancdata), request, refusal)
        key = (address, request.mid)
        if key in self._pending:
            self.retransmissions_dropped += 1
            return None
        item = delivery(hostinfo, request.mid, request.path, request.payload)
        self.resource.requests += 1
        try:
            stored = self.resource.offer(request.path, request.content_format, request.payload, None, item)
        except Refused as refused:
            # answered here: handed to aiocoap, the request was mapped again, its pattern run twice
            # (a mapping's catastrophic pattern with a 2 s limit: 8 runs for 4 requests)
            if not (local or self.network.take()):  # no free amplifier, as for the 4.01 above
                self.network_shed += 1
                return None
            refusal = self.resource.refuse(request.path, refused)
            return self._send(interface, address, _pktinfo(ancdata), request, refusal)
        reply = partial(self._reply, interface, address, _pktinfo(ancdata), request, key)
        if stored is None:
            reply(None)
        else:
            self._pending.add(key)
            stored.add_done_callback(reply)
        return None

    def _reply(
        self,
        interface: MessageInterfaceUDP6,
        address: Any,
        ancdata: Ancillary,
        request: datagrams.PlainRequest,
        key: tuple[Any, int],
        stored: asyncio.Future[None] | None,
    ) -> None:
        self._pending.discard(key)
        if stored is not None and stored.cancelled():
            return
        error = stored.exception() if stored is not None else None
        self._send(
            interface,
            address,
            ancdata,
            request,
            None if error is None else self.resource.refuse(request.path, stored_refusal(error)),
        )

    def _send(
        self,
        interface: MessageInterfaceUDP6,
        address: Any,
        ancdata: Ancillary,
        request: datagrams.PlainRequest,
        refusal: aiocoap.Message | None,
    ) -> None:
        """The piggybacked answer to `request`: 2.04, or `refusal`."""
        if refusal is None:
            data = datagrams.ack(request.mid, request.token)
        else:
            refusal.mtype, refusal.mid, refusal.token = aiocoap.ACK, request.mid, request.token
            data = refusal.encode()
        transport = getattr(interface, "transport", None)
        if transport is None:
            return  # the context shut down while the commit ran: the sensor retransmits
        transport.sendmsg(data, ancdata, 0, address)
        self.answered += 1

    def _slow(
        self,
        interface: MessageInterfaceUDP6,
        slow: Callable[[bytes, Ancillary, int, Any], None],
        local: bool,
        *datagram: Any,
    ) -> None:
        """Hand the datagram to aiocoap, within the network budget (see the module docstring)."""
        if local or self._take_budget(datagram[0]):
            try:
                slow(*datagram)
            except UnicodeDecodeError:
                # A text option (Uri-Path, Uri-Query...) that is not UTF-8: aiocoap's decoder raises
                # this out of its socket reader, an ERROR with a traceback per datagram, a log any peer
                # could fill. A message format error, counted; a confirmable one is rejected.
                self.malformed += 1
                data, ancdata, _flags, address = datagram
                self._reject(interface, data, ancdata, address)
        else:
            self.network_shed += 1

    def _reject(self, interface: MessageInterfaceUDP6, data: bytes, ancdata: Ancillary, address: Any) -> None:
        """Reject a confirmable message with a Reset (RFC 7252 §4.2): four bytes, no larger than what
        came, and its sender stops retransmitting at once instead of for ~45 s."""
        reset = datagrams.reset_for(data)
        transport = getattr(interface, "transport", None)
        if reset is not None and transport is not None:
            transport.sendmsg(reset, _pktinfo(ancdata), 0, address)

    def quiet(self, record: logging.LogRecord) -> bool:
        """A filter of the aiocoap context's logger: below ERROR, each of its messages (by its format)
        is let through once a minute at most, with `count` the records of that format since the last
        one; a datagram it cannot decode is counted as malformed, every other such record in
        `aiocoap_notices`. Why: what aiocoap logs below ERROR is one line per datagram of a peer's:
        2,000 junk UDP datagrams (spoofable, no handshake) were 2,000 "Ignoring unparsable message"
        warnings; a CoAP ping, a response or an ACK nothing waits for, a code that does not fit its
        type, a duplicate request, an INFO or WARNING line each."""
        if record.levelno >= logging.ERROR:
            return True
        if record.msg == UNPARSABLE:
            self.malformed += 1
        else:
            self.aiocoap_notices += 1
        template = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        limiter = self._notices.get(template)
        if limiter is None:
            if len(self._notices) >= MAX_NOTICE_FORMATS:
                template = OTHER_NOTICES
            limiter = self._notices.setdefault(template, QuietLog(log, template))
        since = limiter.due()
        if since is None:
            return False
        record.count = since
        return True

    def _take_budget(self, data: bytes) -> bool:
        """Whether a datagram from the network may reach aiocoap: from its sensor's reserve when it
        names a known sensor's kid, else (or past the reserve) from the shared budget."""
        units = record_units(data)
        kid = datagrams.oscore_kid(data) if self.reserve_per_sensor else None
        if kid is not None:
            known = self.sensor_kids()
            if kid in known:
                reserve = self._reserves.get(kid)
                if reserve is None:
                    if len(self._reserves) >= len(known):  # sensors were removed: forget theirs
                        self._reserves = {kid: self._reserves[kid] for kid in known if kid in self._reserves}
                    reserve = self._reserves[kid] = NetworkBudget(self.reserve_per_sensor)
                if reserve.take(units):
                    self.reserved += 1
                    return True
        return self.network.take(units)

    def _peer(self, interface: MessageInterfaceUDP6, address: Any) -> tuple[bool, str]:
        """(on this board, its host and port as aiocoap writes them), kept per address."""
        known = self._peers.get(address)
        if known is None:
            if len(self._peers) >= MAX_PEERS:
                self._peers.clear()
            known = (loopback_address(address), UDP6EndpointAddress(address, interface).hostinfo)
            self._peers[address] = known
        return known

    def metrics(self) -> dict[str, int]:
        return {
            "fast_path_answered": self.answered,
            "fast_path_retransmissions_dropped": self.retransmissions_dropped,
            "network_requests_shed_total": self.network_shed,
            "network_requests_reserved_total": self.reserved,
            "malformed_dropped": self.malformed,
            "aiocoap_notices": self.aiocoap_notices,
            "truncated_dropped": self.truncated,
            "too_many_options_dropped": self.options_dropped,
        }


def _pktinfo(ancdata: Ancillary) -> Ancillary:
    """The answer leaves from the address the request came to (as aiocoap's responses do)."""
    return [item for item in ancdata if item[0] == socket.IPPROTO_IPV6 and item[1] == socket.IPV6_PKTINFO]
