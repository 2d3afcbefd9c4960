"""The one writer of observations: every adapter's readings go through it, with one latest mirror.

Why one: the mirror of the latest view (:class:`~gateway.observations.latest.LatestCache`) is exact
only while nobody else writes the latest graph. Two adapters with a mirror each (MQTT and CoAP) would
each delete the value they wrote last, not the one the other wrote since, when a mapping sends both
transports to one sensor: two latest values. So the appliance makes one writer and hands it to every
adapter (``AdapterContext.observations``); its commits are serialized by a lock, each built from the
mirror as the previous commit left it.

It also bounds the latest view, which retention prunes only by age (a sensor's last value stays
until it has been silent for `retain_age_s`): a reading whose sensor and property have no latest
node yet is refused when the store holds `max_nodes` of them, its sensor `max_nodes_per_sensor`, or
its device `max_nodes_per_device`. Why: one sensor login can name endless properties within its own
topics (a SenML pack's record names, a JSON payload's keys, Homie nodes), each a latest node for
days; at 1,000 readings/s of new names that is ~8,000 quads a second the gateway keeps until its
memory runs out. The per-sensor bound alone did not hold one login: SenML, Tasmota and Homie mint a
sensor per record name or node, so one SenML login filled all 10,000 nodes with 40 names of 256
properties, and every new sensor was refused for good after (on a disk store). A device is what
:func:`~gateway.observations.iris.device_of_reading` says: a deployment's own mapping is one,
bounded by `max_nodes_per_mapping` (a login granted `plant/+/temperature` took all 10,000 nodes).
Readings of known nodes are never refused, so the sensors in place go on whatever a newcomer sends.

Slots come back. Retention deletes the node of a sensor and property silent for longer than
`retain_age_s` through `evict`, so the mirror follows in the same update; and a refusal first
checks, at most once per RESYNC_INTERVAL_S, whether someone else deleted nodes (`_resync`). Before,
the mirror only ever grew: sensor churn filled the 10,000 slots (13,361 refusals in one pass), and
even deleting the whole latest graph by SPARQL left new sensors refused until a restart.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence

from broker.api import Update
from gateway.client import SepaClient, SepaClientError, UpdateSummary
from gateway.observations.errors import NodeLimit, PayloadError
from gateway.observations.iris import MAPPING_DEVICE, device_of_reading, latest_iri
from gateway.observations.latest import LATEST_QUERY, SENSOR_COUNT_QUERY, LatestCache
from gateway.observations.quads import observation_quads, stored_query, stored_terms
from gateway.observations.reading import Reading
from gateway.observations.updates import observation_update
from gateway.observations.vocabulary import HAS_MQTT_TOPIC

Amend = Callable[[Update | str], Update | str]
Refused = Callable[[Reading, NodeLimit], None]
MAX_NODES = 10_000  # latest nodes (sensor and property pairs) in all: ~8 quads each, a few MB
MAX_NODES_PER_SENSOR = 256
MAX_NODES_PER_DEVICE = 1_000  # a tenth of MAX_NODES: it takes ten device logins to fill the view
MAX_NODES_PER_MAPPING = 1_000  # the same for the sensors of one of a deployment's own mappings
# A refusal checks the store's node count at most this often (see `_resync`): under a flood of new
# names, one COUNT over the latest graph's gw:sensor triples a second, not one per refused batch.
RESYNC_INTERVAL_S = 1.0
# After a reload (1.2 s of event loop at 10,000 nodes on the 2-core test machine, loaded), the next
# check waits this many times as long: a latest graph someone else keeps changing, under a flood of
# refused names, costs at most a tenth of the loop in reloads.
RELOAD_SHARE_INVERSE = 10


class ObservationWriter:
    """Builds each batch's update from the latest mirror, sends it, and moves the mirror with its delta."""

    def __init__(
        self,
        client: SepaClient,
        gateway_id: str,
        *,
        max_nodes: int = MAX_NODES,
        max_nodes_per_sensor: int = MAX_NODES_PER_SENSOR,
        max_nodes_per_device: int = MAX_NODES_PER_DEVICE,
        max_nodes_per_mapping: int = MAX_NODES_PER_MAPPING,
    ) -> None:
        self.client = client
        self.gateway_id = gateway_id
        self.cache = LatestCache()
        self.max_nodes = max_nodes
        self.max_nodes_per_sensor = max_nodes_per_sensor
        self.max_nodes_per_device = max_nodes_per_device
        self.max_nodes_per_mapping = max_nodes_per_mapping
        self.refused = 0  # readings refused by the bounds (see the module docstring)
        self._lock = asyncio.Lock()
        self._stale = False  # a commit failed with an unknown outcome: reload the mirror before the next
        self._resync_at = 0.0  # the loop time before which a refusal does not check the store again

    async def load(self) -> None:
        """Load the mirror from the store (once is enough; later loads only repair it)."""
        async with self._lock:
            if not self.cache.complete:
                await self._reload()

    async def commit(
        self,
        readings: Sequence[Reading],
        *,
        source_property: str = HAS_MQTT_TOPIC,
        amend: Amend | None = None,
        refused: Refused | None = None,
    ) -> UpdateSummary | None:
        """Store `readings` as one update; returns once it is applied and every subscription notified.

        `amend` may add to the update (the MQTT adapter records its deliveries in it). Readings past
        the latest view's bounds are handed to `refused` and the others stored (None: nothing is
        left to store, and nothing was sent); without `refused`, NodeLimit is raised for them with
        nothing applied. Raises PayloadError when a reading cannot be written or the broker refused
        the update as invalid (400: nothing is applied, and no retry could change that; a SenML pack
        of 3,000 timestamped readings made an update past the engine's limits, and the MQTT intake
        retried it for ever, every other sensor's reading behind it), or whatever else the broker
        raised (the outcome is then unknown and the mirror is reloaded before the next commit).
        """
        async with self._lock:
            if self._stale:  # built from a cleared mirror, the batch would skip the bounds and need OPTIONALs
                await self._reload()
                self._stale = False
            admitted, over = self._admit(readings)
            if over and await self._resync():
                admitted, over = self._admit(readings)
            readings = admitted
            if over:
                self.refused += len(over)
                if refused is None:
                    raise over[0][1]
                for reading, error in over:
                    refused(reading, error)
                if not readings:
                    return None
            stored = None
            query = stored_query(readings, self.gateway_id)
            if query is not None:  # timestamped: what is stored already keeps its time (gateway.observations.quads)
                result = await self.client.query(query)
                stored = stored_terms(dict(zip(result.variables, row, strict=True)) for row in result.rows)
            request: Update | str = observation_quads(
                readings, self.gateway_id, self.cache, source_property=source_property, stored=stored
            ) or observation_update(readings, self.gateway_id, self.cache, source_property=source_property)
            if amend is not None:
                request = amend(request)
            try:
                summary = await self.client.update(request, quads=True)  # the mirror moves with the quads
            except SepaClientError as error:
                if error.status_code == 400:
                    raise PayloadError(f"the update was refused: {error.error_description}") from None
                self._forget()
                raise
            except BaseException:
                self._forget()
                raise
            assert summary.result is not None  # asked for: every transport returns the quads
            self.cache.apply(summary.result.added, summary.result.removed)
            if not self.cache.complete:
                await self._reload()
            return summary

    async def evict(self, update: str) -> int:
        """Run a deletion of latest nodes (retention's `evict_update`) between two commits and move
        the mirror with its delta, so the slots it frees are free for the next reading; returns the
        quads removed. Outside the lock, a commit built from the mirror before the deletion would
        write back a node's changing triples without its fixed ones."""
        async with self._lock:
            try:
                summary = await self.client.update(update, quads=True)
            except BaseException:
                self._forget()
                raise
            assert summary.result is not None  # asked for: every transport returns the quads
            self.cache.apply(summary.result.added, summary.result.removed)
            return summary.removed

    async def _resync(self) -> bool:
        """Reload the mirror if the store holds another number of latest nodes than it does (someone
        deleted some by SPARQL: the whole latest graph, 90,000 triples, still left every new sensor
        refused until a restart); whether it did. At most once per RESYNC_INTERVAL_S, so a flood of
        refused names costs one COUNT query a second (24 ms at 10,000 nodes, measured), and the accepted
        readings none; after a reload, the next check waits RELOAD_SHARE_INVERSE times the reload."""
        loop = asyncio.get_running_loop()
        if not self.cache.complete or loop.time() < self._resync_at:
            return False
        self._resync_at = loop.time() + RESYNC_INTERVAL_S
        result = await self.client.query(SENSOR_COUNT_QUERY)
        count = result.rows[0][0] if result.rows else None
        if count is not None and int(count.value) == self.cache.per_sensor.total():
            return False
        began = loop.time()
        await self._reload()
        self._resync_at = max(self._resync_at, loop.time() + RELOAD_SHARE_INVERSE * (loop.time() - began))
        return True

    def _forget(self) -> None:
        """The outcome is unknown: the mirror is cleared, and loaded again before the next commit."""
        self.cache.clear()
        self._stale = True

    def _admit(self, readings: Sequence[Reading]) -> tuple[list[Reading], list[tuple[Reading, NodeLimit]]]:
        """The readings within the bounds, and those past them with why. Only a complete mirror
        knows which nodes are new (it is, but for a moment after a failed commit)."""
        cache = self.cache
        if not cache.complete:
            return list(readings), []
        nodes = cache.nodes
        admitted: list[Reading] = []
        over: list[tuple[Reading, NodeLimit]] = []
        new: set[str] = set()
        per_sensor: Counter[str] = Counter()
        per_device: Counter[str] = Counter()
        for reading in readings:
            node = latest_iri(reading.sensor, reading.property)
            if node in nodes or node in new:
                admitted.append(reading)
                continue
            device = device_of_reading(reading)
            if len(nodes) + len(new) >= self.max_nodes:
                error = NodeLimit(
                    f"new sensor/property refused: the gateway holds its maximum of {self.max_nodes} "
                    "(observations.max_sensor_properties)"
                )
            elif cache.per_sensor[reading.sensor] + per_sensor[reading.sensor] >= self.max_nodes_per_sensor:
                error = NodeLimit(
                    f"new property refused: the sensor has its maximum of {self.max_nodes_per_sensor} "
                    "(observations.max_properties_per_sensor)"
                )
            elif cache.per_device[device] + per_device[device] >= self._device_bound(device):
                error = self._device_full(device)
            else:
                cache.assign(reading.sensor, device)
                new.add(node)
                per_sensor[reading.sensor] += 1
                per_device[device] += 1
                admitted.append(reading)
                continue
            over.append((reading, error))
        return admitted, over

    def _device_bound(self, device: str) -> int:
        return self.max_nodes_per_mapping if device.startswith(MAPPING_DEVICE) else self.max_nodes_per_device

    def _device_full(self, device: str) -> NodeLimit:
        if device.startswith(MAPPING_DEVICE):
            return NodeLimit(
                f"new sensor/property refused: the mapping {device.removeprefix(MAPPING_DEVICE)!r} has its maximum "
                f"of {self.max_nodes_per_mapping} (observations.max_properties_per_mapping)"
            )
        return NodeLimit(
            f"new sensor/property refused: the device has its maximum of {self.max_nodes_per_device} "
            "(observations.max_properties_per_device)"
        )

    async def _reload(self) -> None:
        result = await self.client.query(LATEST_QUERY)
        self.cache.load(dict(zip(result.variables, row, strict=True)) for row in result.rows)
