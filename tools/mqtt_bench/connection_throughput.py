"""Throughput of mosquitto -> MqttConnection -> Ingestor with a no-op commit (no store, no mapping).

    python -m tools.mqtt_bench.connection_throughput [--publishers 3] [--messages 20000] [--protocol 5] [--backlog]

Publishers are separate processes (paho, QoS 1). Live mode measures while they publish; --backlog publishes
everything to the stopped gateway's session first and measures the drain, which takes the publishers' CPU out.
Prints one JSON line; msgs_per_s counts from the first message received to the last one acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import tempfile
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from adapters.mqtt.connection import Message, MqttConnection
from adapters.mqtt.ingest import Ingestor
from adapters.mqtt.settings import MqttSettings
from tools.mosquitto import Mosquitto


def publisher(port: int, index: int, count: int) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{index}-{uuid.uuid4().hex[:6]}")
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", port)
    client.loop_start()
    infos = [client.publish(f"bench/{index}/{i % 10}", f"{i} 21.5", qos=1) for i in range(count)]
    for info in infos:
        info.wait_for_publish(120)
    client.disconnect()
    client.loop_stop()
    unacknowledged = sum(not info.is_published() for info in infos)
    if unacknowledged:
        raise SystemExit(f"publisher {index}: {unacknowledged} messages not acknowledged by the broker")


def run_publishers(port: int, publishers: int, messages: int) -> list[multiprocessing.Process]:
    processes = [multiprocessing.Process(target=publisher, args=(port, i, messages)) for i in range(publishers)]
    for process in processes:
        process.start()
    return processes


async def bench(args: argparse.Namespace, broker: Mosquitto) -> dict:
    total = args.publishers * args.messages
    settings = MqttSettings(host="127.0.0.1", port=broker.port, client_id="bench-gw", protocol=args.protocol)
    first: list[float] = []
    committed = 0

    async def commit(batch: list[Message]) -> None:
        nonlocal committed
        if not first:
            first.append(time.perf_counter())
        committed += len(batch)

    if args.backlog:  # create the session, leave, and let the backlog build up at the broker
        connection = MqttConnection(settings)
        await connection.start(["bench/#"])
        await connection.wait_connected()
        await asyncio.sleep(0.2)
        await connection.stop()
        for process in run_publishers(broker.port, args.publishers, args.messages):
            await asyncio.to_thread(process.join)

    connection = MqttConnection(settings)
    ingestor = Ingestor(connection, commit)
    await connection.start(["bench/#"])
    task = asyncio.create_task(ingestor.run())
    await connection.wait_connected()
    processes = [] if args.backlog else run_publishers(broker.port, args.publishers, args.messages)
    progress = (0, time.monotonic())
    while connection.stats.acked < total:
        await asyncio.sleep(0.001)
        if connection.stats.acked != progress[0]:
            progress = (connection.stats.acked, time.monotonic())
        elif time.monotonic() - progress[1] > 10:
            raise SystemExit(f"stalled: {connection.metrics()} {ingestor.metrics()}")
    elapsed = time.perf_counter() - first[0]
    for process in processes:
        await asyncio.to_thread(process.join)
    await ingestor.stop()
    await connection.stop()
    await task
    return {
        "mode": "backlog" if args.backlog else "live",
        "protocol": args.protocol,
        "publishers": args.publishers,
        "messages": total,
        "committed": committed,
        "msgs_per_s": round(total / elapsed),
        "batches": ingestor.stats.batches,
        "mean_batch": round(committed / ingestor.stats.batches, 1),
        "largest_batch": ingestor.stats.largest_batch,
        "window_waits": connection.stats.window_waits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishers", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20000, help="per publisher")
    parser.add_argument("--protocol", choices=["3.1.1", "5"], default="5")
    parser.add_argument("--backlog", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        broker = Mosquitto(Path(directory))
        broker.start()
        try:
            print(json.dumps(asyncio.run(bench(args, broker))))
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
