"""``sepa-gateway bench soak``: steady MQTT readings, HTTP updates and 100 subscriptions for N minutes."""

from __future__ import annotations

import argparse
import json
import sys

from tools.commands.bench_wire import bounded


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "soak",
        help="steady load for N minutes: RSS, open descriptors and latency percentiles per minute",
        description="Mosquitto, a gateway, 100 subscriptions on the latest-value view, MQTT readings at a steady "
        "rate and 10 HTTP updates/s for N minutes; every minute the gateway's RSS, open descriptors, notification "
        "latency and update reply percentiles. Needs the mosquitto binary.",
    )
    parser.add_argument("--minutes", type=bounded(1, 1440), default=30)
    parser.add_argument("--rate", type=float, default=1000.0, help="MQTT readings per second (default 1000)")
    parser.add_argument("--on-disk", action="store_true", help="the gateway with a data directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run_soak)


def run_soak(args: argparse.Namespace) -> int:
    from tools.soak.runner import SoakOptions, run

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report = run(SoakOptions(minutes=args.minutes, rate=args.rate, on_disk=args.on_disk), None if args.quiet else log)
    print(json.dumps(report, indent=2 if args.json else None))
    return 0 if report["failed_updates"] == 0 else 1
