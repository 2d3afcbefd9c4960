"""A subscriber process: one subscription per bench sensor on the latest-value view, over one WebSocket.

Run as ``python -m tools.mqtt_bench.subscriber --url ws://.../subscribe --sensors S [--sensor-iri PREFIX]``
(sensor i is ``<PREFIX><i>``: the MQTT bench's by default, the CoAP bench passes its own); prints
``{"ready": true}`` once every sequence-0 reply arrived, then records each added value with
``time.monotonic_ns()``; on a line on stdin it prints ``{"received": [[sensor, value, ns], ...]}``
(what came since the last one): after a line holding "report" it goes on, after any other it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import aiohttp

LATEST = "http://w3id.org/sepa-gateway/graph/latest"
GW = "http://w3id.org/sepa-gateway/ns#"
MQTT_SENSORS = "urn:sepa-gateway:sensor:gateway/bench"  # what `gateway/bench<i>/temperature` maps to


def query(sensor: int, prefix: str = MQTT_SENSORS) -> str:
    return (
        f"SELECT ?v WHERE {{ GRAPH <{LATEST}> {{ ?l <{GW}sensor> <{prefix}{sensor}> ; "
        f"<{GW}property> <{GW}temperature> ; <{GW}value> ?v }} }}"
    )


async def run(url: str, sensors: int, prefix: str = MQTT_SENSORS) -> None:
    received: list[list[int]] = []
    zero: set[str] = {f"s{i}" for i in range(sensors)}
    ready = asyncio.Event()
    async with aiohttp.ClientSession() as session, session.ws_connect(url, max_msg_size=0) as ws:
        for i in range(sensors):
            await ws.send_str(json.dumps({"subscribe": {"sparql": query(i, prefix), "alias": f"s{i}"}}))

        async def read() -> None:
            async for message in ws:
                now = time.monotonic_ns()
                body = json.loads(message.data).get("notification")
                if body is None:
                    continue
                if body["sequence"] == 0:
                    zero.discard(body["alias"])
                    if not zero:
                        ready.set()
                    continue
                sensor = int(body["alias"][1:])
                for binding in body["addedResults"]["results"]["bindings"]:
                    received.append([sensor, int(float(binding["v"]["value"])), now])

        reader = asyncio.create_task(read())
        await ready.wait()
        sys.stdout.write(json.dumps({"ready": True}) + "\n")
        sys.stdout.flush()
        while True:  # a line with "report" prints what came since, and goes on; any other ends
            line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            if "report" not in line:
                break
            sys.stdout.write(json.dumps({"received": received}) + "\n")
            sys.stdout.flush()
            received = []
        await asyncio.sleep(0.5)  # the last notifications in flight
        reader.cancel()
    sys.stdout.write(json.dumps({"received": received}) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--sensors", type=int, default=100)
    parser.add_argument("--sensor-iri", default=MQTT_SENSORS, help="sensor i is <PREFIX><i>")
    args = parser.parse_args(argv)
    asyncio.run(run(args.url, args.sensors, args.sensor_iri))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
