"""``sepa-gateway bench shipper``: the cloud shipper's CPU overhead and backlog drain rate (issue 7)."""

from __future__ import annotations

import argparse
import json
import sys

from tools.commands.bench_wire import bounded


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "shipper",
        help="the cloud shipper: CPU it adds per MQTT reading, and how fast it drains a backlog",
        description="Run the MQTT benchmark's throughput phase with and without the shipper (alternating; the "
        "gateway's CPU per reading, until every observation is confirmed by a local landing endpoint), then "
        "spool a backlog while the endpoint is down and time its drain. Needs mosquitto.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--readings", type=bounded(1000, 1_000_000), default=20_000)
    parser.add_argument("--rounds", type=bounded(1, 10), default=2)
    parser.add_argument("--backlog", type=bounded(1000, 10_000_000), default=100_000)
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run_shipper)


def run_shipper(args: argparse.Namespace) -> int:
    from tools.shipper_bench.runner import ShipperBenchOptions, run

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    options = ShipperBenchOptions(readings=args.readings, rounds=args.rounds, backlog=args.backlog)
    report = run(options, None if args.quiet else log)
    print(json.dumps(report, indent=2 if args.json else None))
    return 0
