"""A publisher process: QoS 1 readings `gateway/bench<i>/temperature` with value k, k = first..first+count-1.

Run as ``python -m tools.mqtt_bench.publisher --port P --first K --count N --sensors S [--rate R]``;
reading k goes to sensor k % S, so (sensor, value) identifies it. Prints one JSON line with the
send time of each reading (``time.monotonic_ns``, one clock for every process of the machine) once
the broker acknowledged them all. `--rate 0` publishes as fast as the broker takes them.
`--username NAME` logs in (a broker that wants logins, as installed), with the password in the
environment variable SEPA_BENCH_MQTT_PASSWORD (not on the command line, where `ps` shows it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion


def topic(sensor: int) -> str:
    return f"gateway/bench{sensor}/temperature"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--sensors", type=int, default=100)
    parser.add_argument("--rate", type=float, default=0.0, help="readings per second (0: as fast as possible)")
    parser.add_argument("--username", help="log in as this (password: $SEPA_BENCH_MQTT_PASSWORD)")
    args = parser.parse_args(argv)
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5
    )
    if args.username:
        client.username_pw_set(args.username, os.environ.get("SEPA_BENCH_MQTT_PASSWORD", ""))
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", args.port)
    client.loop_start()
    sent: list[int] = []
    infos = []
    started = time.monotonic()
    for n in range(args.count):
        k = args.first + n
        if args.rate > 0:
            delay = started + n / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        sent.append(time.monotonic_ns())
        infos.append(client.publish(topic(k % args.sensors), str(k), qos=1))
    for info in infos:
        info.wait_for_publish(60)
    client.disconnect()
    client.loop_stop()
    sys.stdout.write(json.dumps({"first": args.first, "sent_ns": sent}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
