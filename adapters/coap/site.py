"""The gateway's CoAP resources: `/.well-known/core`, the subscriptions under `/q`, readings on every other path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiocoap
from aiocoap.resource import Site, WKCResource
from aiocoap.util.linkformat import LinkFormat

from adapters.coap.access import Access
from adapters.coap.errors import Refused
from adapters.coap.queries import QueriesResource
from adapters.coap.readings import ReadingsResource


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
