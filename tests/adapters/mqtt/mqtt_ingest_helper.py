"""The kill -9 test's gateway: MqttConnection + Ingestor whose commit appends payloads durably to a file.

Each batch is written as "p <payload>" lines then "c <batch number>", flushed and fsynced before commit returns,
so the file holds exactly what was committed before the ingestor acknowledged it. Usage:
    python mqtt_ingest_helper.py PORT CLIENT_ID PROTOCOL OUTFILE
"""

from __future__ import annotations

import asyncio
import os
import sys

from adapters.mqtt.connection import Message, MqttConnection
from adapters.mqtt.ingest import Ingestor
from adapters.mqtt.settings import MqttSettings


async def main(port: int, client_id: str, protocol: str, out: str) -> None:
    settings = MqttSettings(
        host="127.0.0.1",
        port=port,
        client_id=client_id,
        protocol=protocol,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
        batch_max=100,
        batch_wait_ms=5,
        receive_maximum=200,
    )
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, b"start\n")
    batches = 0

    def write(data: bytes) -> None:
        os.write(fd, data)
        os.fsync(fd)

    async def commit(batch: list[Message]) -> None:
        nonlocal batches
        batches += 1
        lines = b"".join(b"p " + message.payload + b"\n" for message in batch)
        await asyncio.to_thread(write, lines + f"c {batches}\n".encode())

    connection = MqttConnection(settings)
    await connection.start(["kill/#"])
    await Ingestor(connection, commit).run()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]))
