"""``sepa-gateway bench growth``: a value replaced N times; lookup and update cost stay flat."""

from __future__ import annotations

import argparse
import json
import sys

from tools.commands.bench_wire import bounded


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "growth",
        help="one value replaced N times over HTTP: lookup and update cost per window, in memory and on disk",
        description="Start a gateway (in memory, then with a data directory), replace one value N times, one "
        "HTTP update at a time, and report per window of replacements the median update reply, the median "
        "lookup of the value and the gateway's RSS; the worst window against the first.",
    )
    parser.add_argument("--replacements", type=bounded(100, 1_000_000), default=50_000)
    parser.add_argument("--window", type=bounded(10, 100_000), default=2_500)
    parser.add_argument(
        "--filler", type=bounded(0, 2_000_000), default=1_000, help="unrelated triples loaded first (a large store)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run_growth)


def run_growth(args: argparse.Namespace) -> int:
    from tools.growth.runner import GrowthOptions, run

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    options = GrowthOptions(replacements=args.replacements, window=args.window, filler=args.filler)
    report = run(options, None if args.quiet else log)
    print(json.dumps(report, indent=2 if args.json else None))
    return 0
