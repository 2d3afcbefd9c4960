"""Who may send readings and follow subscriptions over CoAP.

The rule is the plain gates' (docs/security.md): a request from this board (a loopback address) is
the local, trusted side; a request from the network must be authenticated when the installed
service runs (`[security] enabled`): protected with the OSCORE context of a sensor
(:mod:`adapters.coap.oscore`; aiocoap then names it in `authenticated_claims`), else it is refused
with 4.01. A development gateway without security takes it, and says INSECURE at start, as the
plain HTTP gates do.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import aiocoap
from aiocoap import Code

from adapters.coap.errors import Refused
from gateway.appliance import oscore_sensors


def loopback(request: aiocoap.Message) -> bool:
    """Whether the request came from this host (IPv4, IPv6, or IPv4 mapped into IPv6)."""
    sockaddr = getattr(request.remote, "sockaddr", None)
    return bool(sockaddr) and loopback_address(sockaddr)


def loopback_address(sockaddr: tuple[object, ...]) -> bool:
    """Whether a peer's socket address is this host's."""
    try:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def network_peer(request: aiocoap.Message) -> str | None:
    """Who a request from the network counts as, for per-peer limits: its OSCORE sensor, else its
    address (any port); None from this board."""
    sensor = authenticated(request)
    if sensor is not None:
        return f"sensor {sensor}"
    sockaddr = getattr(request.remote, "sockaddr", None)
    if not sockaddr:
        return None
    return None if loopback_address(sockaddr) else f"address {sockaddr[0]}"


def authenticated(request: aiocoap.Message) -> str | None:
    """The sensor whose OSCORE context protected the request, or None."""
    claims = getattr(request.remote, "authenticated_claims", ())
    return str(claims[0]).lstrip(":") if claims else None


class Access:
    """`secure`: requests from the network are refused (the installed service) unless authenticated;
    `may_post(sensor, path)`: whether an authenticated sensor may post a reading to `path`."""

    def __init__(self, *, secure: bool, may_post: Callable[[str, str], bool] | None = None) -> None:
        self.secure = secure
        self.may_post = may_post or (lambda sensor, path: oscore_sensors.may_post(sensor, (), path))

    def check_local(self, request: aiocoap.Message, path: str) -> None:
        """Only this board may do this when security is on (running SPARQL of its own choosing).

        Why: a sensor's OSCORE identity carries no graph rights (a secure WebSocket client's does),
        so a network peer may follow only what the deployment exposes (`[[coap.subscriptions]]`),
        never read the store with queries it writes."""
        if self.secure and not loopback(request):
            raise Refused(
                Code.FORBIDDEN,
                f"/{path}: only this board creates subscriptions; expose them in [[coap.subscriptions]]"[:200],
            )

    def check_reading(self, request: aiocoap.Message, path: str) -> None:
        """A reading from the network comes from an authenticated sensor, to its own resources
        (gateway/appliance/oscore_sensors.py says which: a key taken from one device must not
        write every sensor's readings), else 4.01 or 4.03."""
        self.check(request, path)
        sensor = authenticated(request)
        if self.secure and sensor is not None and not self.may_post(sensor, path):
            raise Refused(
                Code.FORBIDDEN,
                f"/{path}: sensor {sensor} posts to s/{sensor}/... (more: `sensors allow NAME --coap --path`)"[:200],
            )

    def check(self, request: aiocoap.Message, path: str) -> None:
        if not self.admits(request):
            raise unauthenticated(path)

    def admits(self, request: aiocoap.Message) -> bool:
        """Whether the request gets past :meth:`check`. Asked before a block-wise body is assembled
        too: aiocoap assembled first, so an unauthenticated peer's 19,500 first blocks (3.9 KB, to
        distinct paths) were each answered 2.31 Continue and held: RSS +145 MB, never a 4.01."""
        return not self.secure or authenticated(request) is not None or loopback(request)


def unauthenticated(path: str) -> Refused:
    """The 4.01 of a request from the network without OSCORE, when security is on."""
    return Refused(Code.UNAUTHORIZED, f"/{path}: requests from the network must be authenticated"[:200])
