"""The MQTT adapter: readings in as SOSA observations, subscriptions out as MQTT commands.

A producer and a consumer on the client API (ARCHITECTURE.md principle 1), over the in-process
transport: every reading batch is one update through the scheduler, like anyone's (handed over
as the engine's objects when it is ground, see gateway/observations/quads.py, else as SPARQL).

* **Topics Manager** (seed 000 §5.4): mappings live as RDF in the mappings graph. The adapter
  writes the config's mappings there at start-up and subscribes to the graph; any change made with
  SPARQL rebuilds the mapper and the MQTT subscriptions at once. Ready-made profiles come after
  them, in code (they are part of the product, not of the deployment).
* **Ingestion**: the :class:`~adapters.mqtt.ingest.Ingestor` batches messages and calls
  :meth:`commit`, which drops a device's messages past its share while others wait (see
  adapters/mqtt/shares.py), maps them to readings (bad payloads counted per topic and skipped, never
  half a message), writes one observation update, and returns once it is committed: only then are
  the messages acknowledged to the broker. The latest-value cache follows each update's exact delta.
* **Actuation**: each `[[mqtt.actuators]]` subscription publishes its added rows (see actuators.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator, Sequence
from typing import Any

from adapters.mqtt import deliveries
from adapters.mqtt.actuators import Actuator
from adapters.mqtt.connection import Message, MqttConnection
from adapters.mqtt.ingest import Ingestor
from adapters.mqtt.profiles import default_profiles
from adapters.mqtt.settings import PROFILE_IDS, MqttSettings
from adapters.mqtt.shares import LOGIN_DEVICE, DeviceShares, device_key
from gateway.client import ClientSubscription, SepaClient
from gateway.observations import (
    MAPPINGS_QUERY,
    Mapper,
    Mapping,
    MappingError,
    NodeLimit,
    PayloadError,
    Reading,
    UnmappedTopic,
    mappings_from_rdf,
    mappings_update,
)
from gateway.observations.counters import SourceCounters
from gateway.observations.iris import MAPPING_DEVICE
from gateway.observations.writer import ObservationWriter

log = logging.getLogger(__name__)


def profiles(names: Sequence[str]) -> list[Mapping]:
    """The ready-made profiles named in the config (`mqtt.profiles`)."""
    wanted = {mapping_id for name in names for mapping_id in PROFILE_IDS[name]}
    return [mapping for mapping in default_profiles() if mapping.id in wanted]


def wants_retained(topic_filter: str) -> bool:
    """Whether the broker is to send a filter's retained messages when the gateway subscribes (MQTT 5):
    only for attribute topics (a last level starting with `$`: Homie's `$unit` and `$description`,
    whose retained values the mappings learn from) and `#` filters (they may cover some). Why: a
    retained value is never stored (see `MqttAdapter.commit`), yet the gateway subscribes again at
    every start, and Mosquitto sent every retained message its filters match, queued in its session
    ahead of the live readings, up to max_queued_bytes (64 MiB) and the rest dropped: after one
    login had retained 2,000 messages of 60 KB on gateway/<login>/<n>, each restart took 1,119 of
    them (measured) before the first live reading. A retained message published while the gateway
    is subscribed still comes (that is a live message)."""
    last = topic_filter.rsplit("/", 1)[-1]
    return last.startswith("$") or last == "#"


def gateway_id(configured: str) -> str:
    return configured or socket.gethostname()


class MqttAdapter:
    """Wires an MQTT connection, the mapping layer and the store (through `client`) together."""

    def __init__(
        self,
        client: SepaClient,
        settings: MqttSettings,
        *,
        mappings: Sequence[Mapping] = (),
        profile_names: Sequence[str] = tuple(PROFILE_IDS),
        actuators: Sequence[Actuator] = (),
        gateway: str = "",
        writer: ObservationWriter | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.configured = list(mappings)
        self.profiles = profiles(profile_names)
        self.actuators = list(actuators)
        self.gateway_id = gateway_id(gateway)
        self.counters = SourceCounters(device_of=self._device)  # a login's topics are one device
        self.connection = MqttConnection(settings, wants_retained)
        self.ingestor = Ingestor(self.connection, self.commit, settings, self.counters)
        self.mapper = Mapper([*self.configured, *self.profiles], max_payload_bytes=settings.max_payload_bytes)
        self.writer = writer or ObservationWriter(client, self.gateway_id)  # shared with the other adapters
        self.deliveries = deliveries.Deliveries()
        mapping_rate = settings.mapping_readings_per_s
        self.shares = DeviceShares(
            settings.device_readings_per_s,
            device_of=self._device,  # a deployment mapping's topics are one device (adapters.mqtt.shares)
            mapping_readings_per_s=None if mapping_rate < 0 else mapping_rate,
        )
        self._profile_ids = frozenset(mapping.id for mapping in self.profiles)
        self._delivering: int | None = None  # the connection that delivered the last batch (shares' catch-up)
        # Messages of the batch being committed that one of its updates stored: a batch is stored in
        # groups of batch_max_readings (and in halves when the writer refuses one), and a store failure
        # after the first makes the ingestor retry the whole batch; what is stored must not be stored twice.
        self._stored: set[Message] = set()
        self.readings = 0
        self.retained_skipped = 0
        self.empty_skipped = 0  # empty messages no extractor reads (a retained value cleared)
        self.observations_committed = 0
        self.largest_update = 0  # readings of the largest update (see batch_max_readings)
        self.mapping_errors = 0
        self._mappings: ClientSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._filters: list[str] = []
        self._topic_changes: set[asyncio.Task[None]] = set()  # MQTT subscribes and unsubscribes under way
        self._unusable: set[str] = set()  # the unusable mappings' errors logged at the last rebuild

    async def start(self) -> None:
        """Publish the config's mappings, follow the mappings graph, connect and ingest (in the background)."""
        if self.configured:
            await self.client.update(mappings_update(self.configured))
        self._mappings = await self.client.subscribe(
            MAPPINGS_QUERY, "mqtt-mappings", on_notification=self._mappings_changed
        )
        self._rebuild()
        await self.writer.load()
        recorded = await self.client.query(deliveries.QUERY)
        self.deliveries.load(dict(zip(recorded.variables, row, strict=True)) for row in recorded.rows)
        for actuator in self.actuators:
            await actuator.start(self.client, self.connection)
        self._filters = self.mapper.subscriptions()
        await self.connection.start(self._filters)
        self._task = asyncio.get_running_loop().create_task(self.ingestor.run(), name="mqtt-ingest")
        log.info("mqtt adapter started", extra={"broker": f"{self.settings.host}:{self.settings.port}"})

    async def stop(self) -> None:
        """Finish the commit in progress (and its acknowledgements), then disconnect."""
        await self.ingestor.stop()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        for actuator in self.actuators:
            await actuator.stop()
        await self.connection.stop()
        if self._mappings is not None:
            await self._mappings.unsubscribe()

    # -- readings in ---------------------------------------------------------------------------

    async def commit(self, batch: list[Message]) -> None:
        """Map and store one batch; returns once committed (the ingestor then acknowledges it).

        A message that cannot be read is counted and skipped (acknowledged: no retry can fix it);
        if the store refuses the update the error propagates and the batch is retried.

        A retained value the broker sends because the gateway subscribed (the RETAIN flag is set
        only then, MQTT 3.1.1 §3.3.1.3, MQTT 5 §3.3.1.3 without Retain As Published) is not stored:
        it was measured at an unknown earlier time, and stored at each start it gave a sensor
        dead for a week a fresh reading, so its tile never went stale. It still feeds the mappings
        (Homie's retained `$unit` attributes) and is counted (`sepa_mqtt_retained_skipped`).
        Readings published while the gateway was away reach its persistent session without the
        flag, and are stored.
        """
        mapped: list[tuple[Message, list[Reading]]] = []
        now = time.monotonic()
        if batch and batch[-1].connection != self._delivering:
            self._delivering = batch[-1].connection
            after_s = self.connection.first_message_after_s(self._delivering)
            self.shares.connected(now, after_s, resumed=self.connection.session_resumed)
        for message in batch:
            if self._stored and message in self._stored:  # empty but after a failed update: no hash to make
                continue  # stored by an update of this batch before a later one of it failed (the batch is retried)
            if self.deliveries.committed(message):
                continue  # redelivered after a restart, and already in the store (adapters.mqtt.deliveries)
            if not self.shares.admit(message.topic, now):
                self.counters.add(message.topic, self._over_share(message.topic))
                continue
            found: list[Reading] = []
            try:
                found = self.mapper.readings(message.topic, message.payload, message.arrival_us)
            except UnmappedTopic as error:
                self.counters.add(message.topic, str(error))
            except PayloadError as error:
                if message.payload:
                    self.counters.add(message.topic, str(error))
                else:
                    # an empty message is how a retained value is cleared (MQTT 3.1.1 §3.3.1.3): the
                    # broker forwards it to live subscribers, and it was counted and logged as bad input
                    self.empty_skipped += 1
            else:
                if message.retain and found:
                    self.retained_skipped += 1
                    continue
                mapped.append((message, found))
            finally:
                self.shares.charge(message.topic, len(found), len(message.payload))
        for group in _groups(mapped, self.settings.batch_max_readings):
            await self._store(group)
        self._stored.clear()
        self.deliveries.close_batch()
        if not self.connection.queued and not self.connection.window_full:
            self.shares.caught_up()  # the broker could have sent more while this batch was stored, and did not

    def _over_share(self, topic: str) -> str:
        if self._device(topic).startswith(MAPPING_DEVICE):
            rate, setting = self.shares.mapping_rate, "mqtt.mapping_readings_per_s"
        else:
            rate, setting = self.shares.rate, "mqtt.device_readings_per_s"
        return f"its device sent over its share of {rate:g} readings/s while other devices waited ({setting}): dropped"

    async def _store(self, mapped: list[tuple[Message, list[Reading]]]) -> None:
        """Store the readings of `mapped` messages as one update, or, if the writer refuses it, each half.

        The writer refuses a whole batch (PayloadError, nothing applied) for one reading no update can
        carry: a mapping from the graph whose sensor template is `{sensor}:x` mints `1abc:x` for the
        topic `evil/1abc`, and the compiler's sample (`x:x`) cannot tell. Raised to the ingestor, that
        was taken for a store failure: the same batch retried every 5 s for ever, no reading of any
        sensor stored again. Halving finds the bad message in ~2 log2(n) commits (18 for a batch of
        500; the CoAP batcher retries request by request, but its batches are ~55); it is counted on
        its topic and acknowledged with the batch, since no retry can make it writable.
        """
        readings = [reading for _, found in mapped for reading in found]
        if not readings:
            return
        delivered = [message for message, _ in mapped]
        amended: list[tuple[list[Any], list[Any]]] = []

        def record(request: Any) -> Any:
            request, recorded, forgotten = self.deliveries.record(request, delivered, self.connection.number)
            amended.append((recorded, forgotten))
            return request

        refused: list[Reading] = []

        def refuse(reading: Reading, error: NodeLimit) -> None:
            refused.append(reading)
            self.counters.add(reading.source, str(error))  # a reading's source is its message's topic

        try:
            await self.writer.commit(readings, amend=record, refused=refuse)
        except PayloadError as error:
            carrying = [item for item in mapped if item[1]]
            if len(carrying) == 1:
                self.counters.add(carrying[0][0].topic, str(error))
                return
            half = len(carrying) // 2
            await self._store(carrying[:half])
            await self._store(carrying[half:])
            return
        if amended:  # else every reading was refused: nothing was written, nothing to recognise later
            self.deliveries.settle(*amended[0])
        self._stored.update(delivered)
        self.largest_update = max(self.largest_update, len(readings))
        self.readings += len(readings) - len(refused)
        self.observations_committed += len(readings) - len(refused)

    # -- the Topics Manager --------------------------------------------------------------------

    def _device(self, topic: str) -> str:
        """The device a topic's bad input is counted under: its login by the ACL's conventions, else the
        deployment's mapping that takes it. Why: a login granted a templated topic (`plant/+/temperature`)
        made each topic a device of its own (its first two levels), so its junk took all 1,000 counted
        sources and another sensor's refused reading was only part of `(other topics)`, on /metrics and
        in the log. The match is the one `Mapper.readings` makes next (cached per topic)."""
        key = device_key(topic)
        if key.startswith(LOGIN_DEVICE):
            return key
        try:
            found = self.mapper.match(topic)
        except PayloadError:
            return key
        if found is None or found[0].mapping.id in self._profile_ids:
            return key
        return MAPPING_DEVICE + found[0].mapping.id

    def _mappings_changed(self, _notification: Any) -> None:
        if self._mappings is None:
            return  # sequence 0, during start: start() rebuilds once subscribed
        self._rebuild()
        filters = self.mapper.subscriptions()
        before, after = set(self._filters), set(filters)  # lists: quadratic, 5.1 s for 20,000 mappings
        added = [f for f in filters if f not in before]
        removed = [f for f in self._filters if f not in after]
        self._filters = filters
        loop = asyncio.get_running_loop()
        changes = []
        if added:
            changes.append(self.connection.subscribe(added))
        if removed:
            changes.append(self.connection.unsubscribe(removed))
        for change in changes:
            task = loop.create_task(change)  # held: the loop keeps only a weak reference to a task
            self._topic_changes.add(task)
            task.add_done_callback(self._topic_changes.discard)

    def _rebuild(self) -> None:
        rows = self._mappings.view.bindings() if self._mappings is not None else []
        errors: list[MappingError] = []
        stored = mappings_from_rdf(rows, errors)
        # Logged when it appears, not at every rebuild: every change of the mappings graph rebuilds, and
        # 200 unusable mappings left there were 200 warnings per change of any other mapping.
        reported, self._unusable = self._unusable, {str(error) for error in errors}
        for error in errors:
            self.mapping_errors += 1
            if str(error) not in reported:
                log.warning("mqtt: a mapping in the store is unusable", extra={"error": str(error)})
        try:
            self.mapper = self.mapper.rebuild([*stored, *self.profiles])
        except MappingError as error:
            self.mapping_errors += 1
            log.warning("mqtt: mappings not changed", extra={"error": str(error)})

    def health(self) -> dict[str, Any]:
        """Healthy while connected to the MQTT broker (readings wait in the broker's session otherwise),
        ready once it acknowledged the gateway's filters (a reading sent before may never come) and
        refused none of them (readings on a refused one never come: a broker's ACL that does not
        give the gateway's login every topic; the report names them)."""
        numbers = self.connection.metrics()
        connected = bool(numbers.get("connected"))
        subscribed = connected and bool(numbers.get("subscribed"))
        refused = self.connection.refused_filters()
        report: dict[str, Any] = {"ok": subscribed and not refused, "connected": connected, "subscribed": subscribed}
        report["broker"] = f"{self.settings.host}:{self.settings.port}"
        if refused:
            report["refused_filters"] = " ".join(refused[:20]) + (
                f" (and {len(refused) - 20} more)" if len(refused) > 20 else ""
            )
        if (not connected or refused) and numbers.get("last_error"):
            report["last_error"] = numbers["last_error"]
        return report

    def metrics(self) -> dict[str, Any]:
        return {
            "readings": self.readings,
            "largest_update_readings": self.largest_update,
            "retained_skipped": self.retained_skipped,
            "empty_skipped": self.empty_skipped,
            "duplicates_skipped": self.deliveries.duplicates,
            "over_share_dropped": self.shares.dropped,
            "mapping_errors": self.mapping_errors,
            "actuator_published": sum(actuator.published for actuator in self.actuators),
            "actuator_refused": sum(actuator.refused for actuator in self.actuators),
            "actuator_superseded": sum(actuator.superseded for actuator in self.actuators),
            **{f"ingest_{key}": value for key, value in self.ingestor.metrics().items()},
            **{f"connection_{key}": value for key, value in self.connection.metrics().items()},
        }


def _groups(
    mapped: list[tuple[Message, list[Reading]]], max_readings: int
) -> Iterator[list[tuple[Message, list[Reading]]]]:
    """`mapped` in order, in groups of at most `max_readings` readings, cut between messages only
    (a message of more is a group of its own): one update each.

    Why: a batch is up to `batch_max` messages, and a SenML pack of 64 KB is ~3,500 readings, so
    one sensor login's packs made one update of up to 1.75 million readings (~20 million quads in
    memory at once). Ten packs were one update of 35,000 readings holding the update thread 12-15 s,
    every other client's update and notification waiting behind it. A message is never split: its
    delivery is recorded in the update that stores its readings (adapters.mqtt.deliveries).
    """
    group: list[tuple[Message, list[Reading]]] = []
    count = 0
    for item in mapped:
        if group and count + len(item[1]) > max_readings:
            yield group
            group, count = [], 0
        group.append(item)
        count += len(item[1])
    if group:
        yield group
