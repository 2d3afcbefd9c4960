"""``sepa-gateway bench mqtt``: readings through Mosquitto into observations (issue 6's benchmark)."""

from __future__ import annotations

import argparse
import json
import sys

from tools.commands.bench_wire import bounded


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "mqtt",
        help="readings from several publishers through Mosquitto into observations, 100 subscribers",
        description="Start Mosquitto and a gateway, hold 100 subscriptions on the latest-value view, publish N "
        "readings from P publisher processes as fast as possible (readings/s, lost), then 1,000 readings/s for "
        "10 s (notification latency from publish to the subscriber). Needs the mosquitto binary.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--readings", type=bounded(100, 1_000_000), default=20_000)
    parser.add_argument("--publishers", type=bounded(1, 16), default=2)
    parser.add_argument("--latency-seconds", type=bounded(1, 600), default=10)
    parser.add_argument(
        "--retain-count", type=bounded(1, 1_000_000), help="observations kept per sensor (default: readings/100)"
    )
    parser.add_argument("--prune-interval", type=float, default=2.0, help="seconds between prune runs (default 2)")
    parser.add_argument("--on-disk", action="store_true", help="the gateway with a data directory (durable readings)")
    parser.add_argument(
        "--mode", choices=("sequential", "parallel"), default="sequential", help="the gateway's engine mode"
    )
    parser.add_argument(
        "--workers", type=bounded(0, 64), default=0, help="parallel mode's BOOSTER workers (default: cores - 1)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run_mqtt)


def run_mqtt(args: argparse.Namespace) -> int:
    from tools.mqtt_bench.runner import MqttBenchOptions, run

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    options = MqttBenchOptions(
        readings=args.readings,
        publishers=args.publishers,
        latency_seconds=args.latency_seconds,
        retain_count=args.retain_count,
        prune_interval_s=args.prune_interval,
        on_disk=args.on_disk,
        mode=args.mode,
        workers=args.workers,
    )
    report = run(options, None if args.quiet else log)
    print(json.dumps(report, indent=2 if args.json else None))
    return 0 if report["lost"] == 0 else 1
