"""``sepa-gateway bench reeval``: N re-evaluated (OPTIONAL) subscriptions: time, memory, given back."""

from __future__ import annotations

import argparse
import json
import sys

from tools.commands.bench_wire import bounded


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "reeval",
        help="N OPTIONAL subscriptions on one WebSocket: subscribe time, RSS, a matching update, RSS after they end",
        description="Start a gateway, load R sensors, subscribe N distinct OPTIONAL queries (re-evaluated, R rows "
        "each) on one WebSocket, send updates that match them all while another client measures its own update, "
        "notification and query latencies, end them; report the subscribe time, the updates' reply times, the "
        "bystander's p50/p99 alone and during the storm, and the gateway's RSS at each step.",
    )
    parser.add_argument("--subscriptions", type=bounded(1, 20_000), default=1000)
    parser.add_argument("--rows", type=bounded(1, 100_000), default=200)
    parser.add_argument(
        "--storms", type=bounded(1, 1000), default=20, help="matching updates sent while a bystander client measures"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run_reeval)


def run_reeval(args: argparse.Namespace) -> int:
    from tools.reeval.runner import ReevalOptions, run

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report = run(
        ReevalOptions(subscriptions=args.subscriptions, rows=args.rows, storms=args.storms), None if args.quiet else log
    )
    print(json.dumps(report, indent=2 if args.json else None))
    return 0
