"""Readiness of the MQTT connection: a reading published to a fresh session before the broker
acknowledged the gateway's SUBSCRIBE never reaches the gateway, so "connected" is not "ready".
The broker here is a few lines over a real socket that can hold its SUBACK back, a fault Mosquitto
cannot be made to show (it answers at once)."""

from __future__ import annotations

import asyncio
import uuid

from adapters.mqtt.connection import MqttConnection
from adapters.mqtt.settings import MqttSettings

CONNACK = b"\x20\x02\x00\x00"  # MQTT 3.1.1: no session present, accepted


async def read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One MQTT control packet: its type and flags byte, and its body."""
    first = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    while True:
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return first, await reader.readexactly(length)


async def wait_until(predicate, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def test_the_connection_is_ready_only_once_the_broker_acknowledged_its_filters() -> None:
    """Before: `connected` (and /health's MQTT ok) was set at CONNACK, so a test or an operator
    who published at that moment could lose the reading (CI lost one this way)."""

    async def scenario() -> None:
        subscribe_ids: asyncio.Queue[bytes] = asyncio.Queue()
        writers: list[asyncio.StreamWriter] = []

        async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            try:
                while True:
                    kind, body = await read_packet(reader)
                    if kind >> 4 == 1:  # CONNECT
                        writer.write(CONNACK)
                    elif kind >> 4 == 8:  # SUBSCRIBE: its packet id, answered when the test says so
                        await subscribe_ids.put(body[:2])
            except (asyncio.IncompleteReadError, ConnectionError):
                pass

        server = await asyncio.start_server(broker, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        settings = MqttSettings(host="127.0.0.1", port=port, client_id=f"gw-{uuid.uuid4().hex[:8]}", protocol="3.1.1")
        connection = MqttConnection(settings)
        await connection.start(["t/#"])
        try:
            async with asyncio.timeout(5):
                await connection.wait_connected()
                packet_id = await subscribe_ids.get()
            await asyncio.sleep(0.2)
            assert connection.metrics()["connected"] is True
            assert connection.metrics()["subscribed"] is False
            writers[0].write(b"\x90\x03" + packet_id + b"\x01")  # SUBACK, QoS 1 granted
            await wait_until(lambda: connection.metrics()["subscribed"])
        finally:
            await connection.stop()
            server.close()
        assert connection.metrics()["subscribed"] is False

    asyncio.run(scenario())
