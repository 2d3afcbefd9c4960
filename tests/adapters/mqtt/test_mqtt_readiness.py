"""Readiness of the MQTT connection: a reading published to a fresh session before the broker
acknowledged the gateway's SUBSCRIBE never reaches the gateway, so "connected" is not "ready".
The broker here is a few lines over a real socket that can hold its SUBACK back, a fault Mosquitto
cannot be made to show (it answers at once)."""

from __future__ import annotations

import asyncio
import socketserver
import threading
import time
import uuid
from pathlib import Path

from adapters.mqtt.connection import MqttConnection
from adapters.mqtt.settings import MqttSettings
from tools.launcher import launch_gateway

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


def _refusing_broker(refuse_prefix: str) -> tuple[socketserver.ThreadingTCPServer, int]:
    """An MQTT 3.1.1 broker over a real socket that accepts the connection and refuses, in its
    SUBACK, every filter starting with `refuse_prefix` (Mosquitto 2.0 never refuses: it grants a
    filter its ACL denies and delivers nothing on it; EMQX, HiveMQ or a cloud broker answer 0x80)."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            stream = self.request.makefile("rb")
            try:
                while True:
                    first = stream.read(1)
                    if not first:
                        return
                    length, shift = 0, 0
                    while True:
                        byte = stream.read(1)[0]
                        length |= (byte & 0x7F) << shift
                        shift += 7
                        if not byte & 0x80:
                            break
                    body = stream.read(length)
                    kind = first[0] >> 4
                    if kind == 1:  # CONNECT
                        self.request.sendall(CONNACK)
                    elif kind == 8:  # SUBSCRIBE: packet id, then (length, filter, options) each
                        codes, at = bytearray(), 2
                        while at < len(body):
                            size = int.from_bytes(body[at : at + 2], "big")
                            topic_filter = body[at + 2 : at + 2 + size].decode()
                            codes.append(0x80 if topic_filter.startswith(refuse_prefix) else 0x01)
                            at += 2 + size + 1
                        self.request.sendall(bytes([0x90, 2 + len(codes)]) + body[:2] + bytes(codes))
                    elif kind == 12:  # PINGREQ
                        self.request.sendall(b"\xd0\x00")
            except (OSError, IndexError):
                return

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_health_names_the_filters_the_broker_refused(tmp_path: Path) -> None:
    """Readings on a refused filter never come: the gateway is not ready, and /health and the log
    name the filters (before: ready, and the log gave the reason codes alone)."""
    server, port = _refusing_broker("tele/")
    config = tmp_path / "gateway.toml"
    config.write_text(f'[mqtt]\nport = {port}\nprotocol = "3.1.1"\nprofiles = ["generic", "tasmota"]\n')
    gateway = launch_gateway(config=config)
    try:
        deadline = time.monotonic() + 15
        while gateway.metrics().get("sepa_mqtt_connection_refused_filters") != 1.0:
            assert time.monotonic() < deadline, gateway.metrics()
            time.sleep(0.05)
        reply = gateway.request("GET", "/health")
        mqtt = reply.json()["components"]["mqtt"]
        assert reply.status == 503 and mqtt["status"] == "failing", mqtt
        refused = str(mqtt["detail"]).split("refused_filters=")[1].split(",")[0]
        assert refused.startswith("tele/") and "gateway/" not in refused, mqtt
        assert "subscribed=True" in mqtt["detail"]
    finally:
        assert gateway.stop() == 0
        server.shutdown()
