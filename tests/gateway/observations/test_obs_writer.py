"""ObservationWriter over a real in-process engine: large timestamped batches, and updates the engine refuses.

What it protects: one SenML pack may hold ~3,000 timestamped records (50 KB). The update text needed
an OPTIONAL per timestamped reading (15,015 elements, past the engine's 10,000), the engine refused
it (400), and the MQTT intake retried that batch for ever with every other sensor's reading behind
it. The batch is now a syntax tree; and an update the engine refuses as invalid is a PayloadError
(nothing applied) that the adapters isolate, never a store failure to retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

import gateway.observations.writer as writer_module
from broker.api import Engine, Scheduler
from gateway.appliance.config import ObservationsConfig
from gateway.appliance.retention import Retention
from gateway.client import InProcessTransport, SepaClient
from gateway.observations import PayloadError, Reading
from gateway.observations.errors import NodeLimit
from gateway.observations.latest import SENSOR_COUNT_QUERY
from gateway.observations.pruning import evict_update, silent_latest_query
from gateway.observations.vocabulary import GRAPH_LATEST, GRAPH_OBSERVATIONS, GW, SOSA
from gateway.observations.writer import ObservationWriter

T0 = 1_700_000_000_000_000
PROPERTY = GW + "temperature"
TIMES = f"SELECT ?o ?t WHERE {{ GRAPH <{GRAPH_OBSERVATIONS}> {{ ?o <{SOSA}resultTime> ?t }} }}"


def timestamped(count: int) -> list[Reading]:
    return [
        Reading(f"urn:example:s{i % 50}", PROPERTY, "urn:example:f", float(i), None, "senml/x", T0 + i, f"k{i}")
        for i in range(count)
    ]


def with_writer(scenario: Callable[[ObservationWriter, SepaClient], Awaitable[None]]) -> None:
    async def run() -> None:
        scheduler = Scheduler(Engine())
        client = SepaClient(InProcessTransport(scheduler))
        writer = ObservationWriter(client, "gw")
        await writer.load()
        try:
            await scenario(writer, client)
        finally:
            await client.close()
            scheduler.close()

    asyncio.run(run())


async def times(client: SepaClient) -> dict[str, str]:
    result = await client.query(TIMES)
    return {row[0].value: row[1].value for row in result.rows}


def test_a_pack_of_3000_timestamped_readings_is_stored_whole_and_its_redelivery_changes_nothing() -> None:
    async def scenario(writer: ObservationWriter, client: SepaClient) -> None:
        await writer.commit(timestamped(3000))
        first = await times(client)
        assert len(first) == 3000
        await writer.commit(timestamped(3000))  # the same pack again: each keeps its first resultTime
        assert await times(client) == first

    with_writer(scenario)


def test_an_update_the_engine_refuses_as_invalid_is_a_payload_error_with_nothing_applied() -> None:
    async def scenario(writer: ObservationWriter, client: SepaClient) -> None:
        writer.cache.clear()  # a mirror that knows nothing: the update text, with an OPTIONAL per reading
        with pytest.raises(PayloadError, match="refused"):
            await writer.commit(timestamped(3000))
        assert await times(client) == {}
        await writer.commit(timestamped(10))  # the writer goes on
        assert len(await times(client)) == 10

    with_writer(scenario)


LATEST_GRAPH = f"<{GRAPH_LATEST}>"
CLEAR_LATEST = f"DELETE WHERE {{ GRAPH {LATEST_GRAPH} {{ ?s ?p ?o }} }}"


def reading(sensor: str, value: float = 1.0) -> Reading:
    return Reading(
        f"urn:example:{sensor}", PROPERTY, "urn:example:f", value, None, "gateway/x", None, f"{sensor}{value}"
    )


def with_bounded_writer(
    scenario: Callable[[ObservationWriter, SepaClient, list[int]], Awaitable[None]], max_nodes: int = 2
) -> None:
    """A writer of at most `max_nodes` latest nodes over an engine whose clock (`now[0]`, ns) the scenario moves."""

    async def run() -> None:
        engine = Engine()
        now = [1_800_000_000_000_000_000]
        engine.store.clock._source = lambda: now[0]  # type: ignore[method-assign]
        scheduler = Scheduler(engine)
        client = SepaClient(InProcessTransport(scheduler))
        writer = ObservationWriter(client, "gw", max_nodes=max_nodes)
        await writer.load()
        try:
            await scenario(writer, client, now)
        finally:
            await client.close()
            scheduler.close()

    asyncio.run(run())


async def latest_sensors(client: SepaClient) -> list[str]:
    result = await client.query(f"SELECT ?s WHERE {{ GRAPH {LATEST_GRAPH} {{ ?n <{GW}sensor> ?s }} }}")
    return sorted(row[0].value.rsplit(":", 1)[-1] for row in result.rows)


async def assert_mirror_is_the_store(writer: ObservationWriter) -> None:
    """The mirror holds exactly what a fresh load of the store holds."""
    fresh = ObservationWriter(writer.client, "gw")
    await fresh.load()
    assert writer.cache.nodes == fresh.cache.nodes
    assert writer.cache.per_sensor == fresh.cache.per_sensor


def test_retention_frees_the_slots_of_silent_sensors_and_the_mirror_follows_in_the_same_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Retention never deleted a latest node: with sensor churn (devices replaced, renamed) the
    10,000 slots filled and every new sensor was refused for good. A node silent for longer than
    retain_age_s is now deleted through the writer, whose mirror follows with that update's delta:
    the freed slot is taken at once, without reloading the mirror."""

    async def scenario(writer: ObservationWriter, client: SepaClient, now: list[int]) -> None:
        await writer.commit([reading("old1"), reading("old2")])
        now[0] += 3_000 * 10**9
        with pytest.raises(NodeLimit):
            await writer.commit([reading("new")])
        await writer.commit([reading("old2", 2.0)])  # old2 speaks again: it stays
        now[0] += 1_000 * 10**9
        config = ObservationsConfig(retain_age_s=2_000)
        assert await Retention(client, config, writer=writer).prune() > 0
        assert await latest_sensors(client) == ["old2"]
        await assert_mirror_is_the_store(writer)

        async def no_reload() -> None:
            raise AssertionError("the mirror was reloaded")

        monkeypatch.setattr(writer, "_reload", no_reload)
        await writer.commit([reading("new")])
        assert await latest_sensors(client) == ["new", "old2"]
        await assert_mirror_is_the_store(writer)

    with_bounded_writer(scenario)


def test_a_reading_since_the_find_keeps_its_latest_node() -> None:
    """The eviction is conditional: a sensor heard from between retention's find and its delete
    keeps its node, whole, and the mirror stays the store."""

    async def scenario(writer: ObservationWriter, client: SepaClient, now: list[int]) -> None:
        await writer.commit([reading("a"), reading("b")])
        now[0] += 3_000 * 10**9
        found = [row[0] for row in (await client.query(silent_latest_query(2_000, limit=10))).rows]
        assert len(found) == 2
        await writer.commit([reading("a", 2.0)])
        update = evict_update(found, 2_000)
        assert update is not None
        assert await writer.evict(update) > 0
        assert await latest_sensors(client) == ["a"]
        await assert_mirror_is_the_store(writer)
        await writer.commit([reading("c")])  # b's slot is free

    with_bounded_writer(scenario)


def test_latest_nodes_deleted_by_sparql_free_their_slots() -> None:
    """The operator's fix, deleting the latest graph by SPARQL (90,000 triples), left every new
    sensor refused until a restart: the writer admitted by its mirror, which never saw the
    deletion. A refusal now checks the store's node count (at most once per RESYNC_INTERVAL_S)
    and reloads the mirror when it differs; the sensors in place write their nodes whole again."""

    async def scenario(writer: ObservationWriter, client: SepaClient, now: list[int]) -> None:
        await writer.commit([reading("a"), reading("b")])
        await client.update(CLEAR_LATEST)
        await writer.commit([reading("c")])
        await writer.commit([reading("a", 2.0)])
        assert await latest_sensors(client) == ["a", "c"]
        await assert_mirror_is_the_store(writer)

    with_bounded_writer(scenario)


def test_a_flood_of_refused_names_checks_the_store_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full view under a flood of new names: one COUNT query per RESYNC_INTERVAL_S, not one per
    refused batch (and none for the readings admitted)."""

    async def scenario(writer: ObservationWriter, client: SepaClient, now: list[int]) -> None:
        await writer.commit([reading("a"), reading("b")])
        queries: list[str] = []
        query = client.query

        async def counted(text: str, *args: object, **kwargs: object) -> object:
            queries.append(text)
            return await query(text, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(client, "query", counted)
        for k in range(20):
            with pytest.raises(NodeLimit):
                await writer.commit([reading(f"new{k}")])
            await writer.commit([reading("a", float(k))])
        assert queries == [SENSOR_COUNT_QUERY]
        monkeypatch.setattr(writer_module, "RESYNC_INTERVAL_S", 0.0)
        writer._resync_at = 0.0
        with pytest.raises(NodeLimit):
            await writer.commit([reading("late")])
        assert queries == [SENSOR_COUNT_QUERY] * 2

    with_bounded_writer(scenario)


def test_a_latest_graph_someone_else_keeps_changing_is_reloaded_a_tenth_of_the_time_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each reload holds the event loop (1.2 s at 10,000 nodes, measured): a latest graph another
    writer changes at every refusal would have cost a reload a second. After a reload, the next
    check waits RELOAD_SHARE_INVERSE times as long as it took."""

    async def scenario(writer: ObservationWriter, client: SepaClient, now: list[int]) -> None:
        await writer.commit([reading("a"), reading("b")])
        monkeypatch.setattr(writer_module, "RESYNC_INTERVAL_S", 0.0)
        reloads: list[float] = []
        reload = writer._reload

        async def slow_reload() -> None:
            reloads.append(asyncio.get_running_loop().time())
            await asyncio.sleep(0.05)
            await reload()

        monkeypatch.setattr(writer, "_reload", slow_reload)
        for k in range(10):
            await client.update(
                f"INSERT DATA {{ GRAPH {LATEST_GRAPH} {{ <urn:example:n{k}> <{GW}sensor> <urn:x:{k}> }} }}"
            )
            with pytest.raises(NodeLimit):
                await writer.commit([reading(f"new{k}")])
        assert len(reloads) == 1

    with_bounded_writer(scenario)


def mapped(first: int, count: int, mapping: str = "plant") -> list[Reading]:
    """Readings of sensors a deployment's own mapping makes, one sensor per reading."""
    return [
        Reading(f"urn:example:r{i}", PROPERTY, "urn:example:f", 20.0, None, f"plant/r{i}", None, f"k{i}", mapping)
        for i in range(first, first + count)
    ]


def test_the_sensors_of_one_mapping_are_bounded_together_and_stay_so_after_a_reload() -> None:
    """Each sensor of a deployment's own template was a device of its own: one mapping's sensors
    were bounded by the total only. Now by `max_nodes_per_mapping`, counted again the same after the
    mirror is reloaded (a failed commit, nodes deleted by SPARQL), and freed with their nodes."""

    async def scenario(writer: ObservationWriter, client: SepaClient) -> None:
        writer.max_nodes_per_mapping = 3
        refused: list[NodeLimit] = []
        await writer.commit(mapped(0, 5), refused=lambda _reading, error: refused.append(error))
        assert len(refused) == 2 and "observations.max_properties_per_mapping" in str(refused[0])
        writer._forget()  # the mirror is loaded again before the next commit
        await writer.commit(mapped(5, 1), refused=lambda _reading, error: refused.append(error))
        assert len(refused) == 3
        await writer.commit(mapped(10, 1, "other"))  # another mapping has a bound of its own
        await writer.commit([Reading("urn:example:s", PROPERTY, "urn:example:f", 1.0, None, "s", None, "k")])
        assert writer.cache.per_sensor.total() == 5
        assert writer.cache.per_device["mapping:plant"] == 3 and writer.cache.per_device["mapping:other"] == 1
        await writer.evict(f"DELETE WHERE {{ GRAPH <{GRAPH_LATEST}> {{ ?n <{GW}sensor> <urn:example:r1> ; ?p ?o }} }}")
        await writer.commit(mapped(6, 1))  # r1's slot is the mapping's again
        assert writer.cache.per_device["mapping:plant"] == 3

    with_writer(scenario)
