"""The one writer of observations: every adapter's readings go through it, with one latest mirror.

Why one: the mirror of the latest view (:class:`~gateway.observations.latest.LatestCache`) is exact
only while nobody else writes the latest graph. Two adapters with a mirror each (MQTT and CoAP) would
each delete the value they wrote last, not the one the other wrote since, when a mapping sends both
transports to one sensor: two latest values. So the appliance makes one writer and hands it to every
adapter (``AdapterContext.observations``); its commits are serialized by a lock, each built from the
mirror as the previous commit left it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from broker.api import Update
from gateway.client import SepaClient, UpdateSummary
from gateway.observations.latest import LATEST_QUERY, LatestCache
from gateway.observations.quads import observation_quads
from gateway.observations.reading import Reading
from gateway.observations.updates import observation_update
from gateway.observations.vocabulary import HAS_MQTT_TOPIC

Amend = Callable[[Update | str], Update | str]


class ObservationWriter:
    """Builds each batch's update from the latest mirror, sends it, and moves the mirror with its delta."""

    def __init__(self, client: SepaClient, gateway_id: str) -> None:
        self.client = client
        self.gateway_id = gateway_id
        self.cache = LatestCache()
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        """Load the mirror from the store (once is enough; later loads only repair it)."""
        async with self._lock:
            if not self.cache.complete:
                await self._reload()

    async def commit(
        self, readings: Sequence[Reading], *, source_property: str = HAS_MQTT_TOPIC, amend: Amend | None = None
    ) -> UpdateSummary:
        """Store `readings` as one update; returns once it is applied and every subscription notified.

        `amend` may add to the update (the MQTT adapter records its deliveries in it). Raises
        PayloadError when a reading cannot be written (nothing is applied), or whatever the broker
        raised (the outcome is then unknown and the mirror is reloaded before the next commit).
        """
        async with self._lock:
            request: Update | str = observation_quads(
                readings, self.gateway_id, self.cache, source_property=source_property
            ) or observation_update(readings, self.gateway_id, self.cache, source_property=source_property)
            if amend is not None:
                request = amend(request)
            try:
                summary = await self.client.update(request, quads=True)  # the mirror moves with the quads
            except BaseException:
                self.cache.clear()  # the outcome is unknown: the next load makes the mirror exact again
                raise
            assert summary.result is not None  # asked for: every transport returns the quads
            self.cache.apply(summary.result.added, summary.result.removed)
            if not self.cache.complete:
                await self._reload()
            return summary

    async def _reload(self) -> None:
        result = await self.client.query(LATEST_QUERY)
        self.cache.load(dict(zip(result.variables, row, strict=True)) for row in result.rows)
