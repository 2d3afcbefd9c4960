"""The gateway's CoAP resources: `/.well-known/core`, the subscriptions under `/q`, readings on every other path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiocoap
from aiocoap import Code
from aiocoap.numbers.optionnumbers import OptionNumber
from aiocoap.pipe import Pipe
from aiocoap.resource import Site, WKCResource
from aiocoap.util.linkformat import LinkFormat

from adapters.coap.access import Access
from adapters.coap.errors import Refused
from adapters.coap.queries import QueriesResource
from adapters.coap.readings import ReadingsResource

# The critical options (odd numbers, RFC 7252 §5.4.1) the gateway's resources act on; a request with
# any other is refused, as the RFC requires. Observe, ETag, Content-Format, Size1 are elective.
UNDERSTOOD_CRITICAL = frozenset(
    {
        OptionNumber.URI_HOST,
        OptionNumber.URI_PORT,
        OptionNumber.URI_PATH,
        OptionNumber.URI_QUERY,
        OptionNumber.ACCEPT,
        OptionNumber.BLOCK2,
        OptionNumber.BLOCK1,
    }
)
PROXY_OPTIONS = frozenset({OptionNumber.PROXY_URI, OptionNumber.PROXY_SCHEME})


def not_understood(request: aiocoap.Message) -> Refused | None:
    """The refusal of a request carrying a critical option no resource here acts on, or None.

    Why: aiocoap's server leaves that check to the resources (aiocoap issue 268), and the
    gateway's did not make it: every such request was served as if the option were absent. A
    Q-Block1 transfer (RFC 9177, option 19) of "1234567890.123456789" in 16-byte blocks was stored
    as two readings, 1234567890.12345 and 6789, each answered 2.04; If-Match and If-None-Match were
    ignored, a Proxy-Uri request stored as a reading. A 4.02 is also what tells a Q-Block client to
    fall back to Block1 (RFC 9177 §4.1), and 5.05 what a CoAP server that is no proxy answers a
    proxy request with (RFC 7252 §5.7.2)."""
    numbers = {option.number for option in request.opt.option_list() if option.number.is_critical()}
    if numbers & PROXY_OPTIONS:
        return Refused(Code.PROXYING_NOT_SUPPORTED, "this gateway is not a CoAP proxy")
    unknown = sorted(int(number) for number in numbers - UNDERSTOOD_CRITICAL)
    if unknown:
        return Refused(Code.BAD_OPTION, f"critical option {unknown[0]} is not supported")
    return None


class WellKnownCore(WKCResource):
    """`/.well-known/core` for those the access rule lets in, a 4.01 for the others.

    Why: it lists the subscriptions (`/q/NAME`), which GET /q refuses to a network peer without
    OSCORE when security is on; and its answer (a link per subscription, aiocoap's impl-info) is
    tens of times the request: from a spoofed source, an amplifier (RFC 7252 §11.3)."""

    def __init__(
        self,
        links: Callable[[], LinkFormat],
        access: Access,
        refuse: Callable[[str, Refused], aiocoap.Message],
    ) -> None:
        super().__init__(links)
        self.access = access
        self.refuse = refuse  # the readings' refusal: counted per code and resource

    async def render_get(self, request: aiocoap.Message) -> aiocoap.Message:
        try:
            self.access.check(request, ".well-known/core")
        except Refused as refused:
            return self.refuse(".well-known/core", refused)
        return await super().render_get(request)


class GatewaySite(Site):
    """A Site whose registered resources come first, `/q` and below go to the subscriptions, and
    every other path takes readings.

    Why not a resource per sensor: the paths are whatever the mappings take (`s/{sensor}/{property}`,
    a deployment's own), and they change with the mappings graph without a restart. Why `/q` is
    routed here rather than registered: its names come and go (POST, DELETE), and `/q` itself and
    `/q/NAME` must reach one resource, which aiocoap's Site does not do for a path and its children.
    """

    def __init__(self, readings: ReadingsResource, queries: QueriesResource | None = None) -> None:
        super().__init__()
        self.readings = readings
        self.queries = queries
        self.add_resource(
            [".well-known", "core"],
            WellKnownCore(self.get_resources_as_linkheader, readings.access, readings.refuse),
        )

    async def render_to_pipe(self, pipe: Pipe) -> None:
        """Refuse a request with a critical option no resource here acts on (:func:`not_understood`),
        counted as the readings' refusals are; one the access rule refuses gets its 4.01 first."""
        request = pipe.request
        refused = not_understood(request)
        if refused is not None and self.readings.access.admits(request):
            path = "/".join(request.opt.uri_path)
            pipe.add_response(self.readings.refuse(path, refused), is_last=True)
            return
        await super().render_to_pipe(pipe)

    def _find_child_and_pathstripped_message(self, request: aiocoap.Message) -> tuple[Any, aiocoap.Message]:
        path = request.opt.uri_path
        if self.queries is not None and path[:1] == ("q",):
            return self.queries, request.copy(uri_path=path[1:])
        if path not in self._resources and not self._subsites:
            # A reading. aiocoap's lookup would first build the request's URI (a getsockname() call
            # and string work per request), only to find nothing: 14-17% of the event loop's time
            # under `bench coap` (py-spy). Gateway CPU per reading 1.57 -> 1.31 ms, 487 -> 587
            # readings/s (means of 3 alternated runs of 6,000 readings on a shared 2-core machine).
            return self.readings, request
        try:
            return super()._find_child_and_pathstripped_message(request)
        except KeyError:
            return self.readings, request

    def reads(self, path: str) -> bool:
        """Whether a request to `path` ("s/boiler/temperature") goes to the readings, as
        :meth:`_find_child_and_pathstripped_message` routes it (for :mod:`adapters.coap.fastpath`)."""
        if not path or (self.queries is not None and (path == "q" or path.startswith("q/"))):
            return False
        return not self._subsites and tuple(path.split("/")) not in self._resources

    def get_resources_as_linkheader(self) -> LinkFormat:
        links = super().get_resources_as_linkheader()
        if self.queries is not None:
            links.links = [*links.links, *self.queries.links()]
        return links
