"""The gateway's CoAP resources: `/.well-known/core`, and readings on every other path."""

from __future__ import annotations

from typing import Any

import aiocoap
from aiocoap.resource import Site, WKCResource

from adapters.coap.readings import ReadingsResource


class GatewaySite(Site):
    """A Site whose registered resources come first and whose every other path takes readings.

    Why not a resource per sensor: the paths are whatever the mappings take (`s/{sensor}/{property}`,
    a deployment's own), and they change with the mappings graph without a restart.
    """

    def __init__(self, readings: ReadingsResource) -> None:
        super().__init__()
        self.readings = readings
        self.add_resource([".well-known", "core"], WKCResource(self.get_resources_as_linkheader))

    def _find_child_and_pathstripped_message(self, request: aiocoap.Message) -> tuple[Any, aiocoap.Message]:
        try:
            return super()._find_child_and_pathstripped_message(request)
        except KeyError:
            return self.readings, request
