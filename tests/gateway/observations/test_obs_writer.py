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

from broker.api import Engine, Scheduler
from gateway.client import InProcessTransport, SepaClient
from gateway.observations import PayloadError, Reading
from gateway.observations.vocabulary import GRAPH_OBSERVATIONS, GW, SOSA
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
