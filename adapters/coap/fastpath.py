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
unchanged: OSCORE, block-wise, NON, other options, `/q`, `/.well-known/core`, and every request that
would be refused before its commit (aiocoap then answers it with its diagnostic, and counts it).

Duplicates: a retransmission whose original is still waiting for its commit is dropped (its answer is
on the way); one that comes after is recognised by the delivery record and answered 2.04 without
being stored again (:mod:`adapters.coap.deliveries`, which also covers a restart). A given datagram
always takes the same path, so aiocoap's own deduplication covers the requests it answers.

How it attaches: aiocoap reads its UDP socket in `MessageInterfaceUDP6.datagram_msg_received`;
:meth:`FastPath.attach` wraps that method on the context's interfaces. aiocoap has no public hook
for this; where the interface is not found (another transport, a later aiocoap), nothing is
wrapped and every request goes through aiocoap, slower but the same.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from functools import partial
from typing import Any

import aiocoap
from aiocoap.transports.udp6 import MessageInterfaceUDP6, UDP6EndpointAddress

from adapters.coap import datagrams
from adapters.coap.access import loopback_address
from adapters.coap.deliveries import delivery
from adapters.coap.errors import Refused
from adapters.coap.readings import ReadingsResource, stored_refusal
from adapters.coap.site import GatewaySite

log = logging.getLogger(__name__)

Ancillary = list[tuple[int, int, bytes]]
DRAIN_MAX = 64  # datagrams read after the one aiocoap read, at most, before the loop runs other work
RECEIVE_BYTES, ANCILLARY_BYTES = 4096, 1024  # as aiocoap's reader
MAX_PEERS = 4096  # peers whose address details are kept (a sensor's are reused for each reading)


class FastPath:
    """Answers plain confirmable readings (see the module docstring)."""

    def __init__(self, resource: ReadingsResource, site: GatewaySite, *, secure: bool) -> None:
        self.resource = resource
        self.site = site
        self.secure = secure
        self.answered = 0
        self.retransmissions_dropped = 0
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
        stops this; aiocoap's next wakeup reads the error queue and reports it as before."""
        self._take(interface, slow, data, ancdata, flags, address)
        sock = self._sockets.get(id(interface))
        for _ in range(DRAIN_MAX):
            if sock is None:
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
        request = datagrams.parse(data)
        if request is None or not self.site.reads(request.path):
            return slow(data, ancdata, flags, address)
        trusted, hostinfo = self._peer(interface, address)
        if self.secure and not trusted:
            return slow(data, ancdata, flags, address)  # OSCORE or a 4.01: aiocoap's
        key = (address, request.mid)
        if key in self._pending:
            self.retransmissions_dropped += 1
            return None
        item = delivery(hostinfo, request.mid, request.path, request.payload)
        try:
            stored = self.resource.offer(request.path, request.content_format, request.payload, None, item)
        except Refused:
            return slow(data, ancdata, flags, address)
        self.resource.requests += 1
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
        if error is None:
            data = datagrams.ack(request.mid, request.token)
        else:
            message = self.resource.refuse(request.path, stored_refusal(error))
            message.mtype, message.mid, message.token = aiocoap.ACK, request.mid, request.token
            data = message.encode()
        transport = getattr(interface, "transport", None)
        if transport is None:
            return  # the context shut down while the commit ran: the sensor retransmits
        transport.sendmsg(data, ancdata, 0, address)
        self.answered += 1

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
        return {"fast_path_answered": self.answered, "fast_path_retransmissions_dropped": self.retransmissions_dropped}


def _pktinfo(ancdata: Ancillary) -> Ancillary:
    """The answer leaves from the address the request came to (as aiocoap's responses do)."""
    return [item for item in ancdata if item[0] == socket.IPPROTO_IPV6 and item[1] == socket.IPV6_PKTINFO]
