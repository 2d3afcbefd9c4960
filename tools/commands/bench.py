"""``sepa-gateway bench ...``: benchmarks: the in-process lighting benchmark of seed 001, and ``wire``.

Why the imports inside the handler: the benchmark pulls in the engine and the generator, which
other commands (and ``--help``) should not pay for or depend on.
"""

from __future__ import annotations

import argparse
import resource
import sys
from typing import Any

from tools.commands import (
    bench_coap,
    bench_dashboard,
    bench_growth,
    bench_mqtt,
    bench_parallel,
    bench_reeval,
    bench_scheduling,
    bench_shipper,
    bench_soak,
    bench_wire,
)

EXPERIMENTS = ("LAMP", "ROAD")
MODES = ("incremental", "naive")


def _choices(allowed: tuple[str, ...]) -> Any:
    """An argparse type for a comma-separated list drawn from `allowed` (order kept, no repeats)."""

    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        bad = [item for item in items if item not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(allowed)}")
        return list(dict.fromkeys(items))

    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` and its own subcommands to the top-level parser."""
    bench = subparsers.add_parser("bench", help="run a benchmark", description="Run a benchmark.")
    kinds = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    lighting = kinds.add_parser(
        "lighting",
        help="the smart-city lighting benchmark (seed 001, Tables II-VIII)",
        description="LAMP and ROAD experiments: 310 updates against 1,004 subscriptions on a "
        "~334k-triple store, each experiment and engine mode on a fresh engine.",
    )
    lighting.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    lighting.add_argument(
        "--experiments", type=_choices(EXPERIMENTS), default=list(EXPERIMENTS), help="default: LAMP,ROAD"
    )
    lighting.add_argument(
        "--modes", type=_choices(MODES), default=list(MODES), help="engine modes; default: incremental,naive"
    )
    lighting.add_argument(
        "--all-subscribed",
        action="store_true",
        help="subscribe every lamp and every road (9,810 subscriptions) instead of profile S; "
        "use --modes incremental, naive takes very long",
    )
    lighting.add_argument(
        "--strict", action="store_true", help="exit 1 when notifications differ from the expected ones"
    )
    lighting.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    lighting.set_defaults(handler=run_lighting)
    bench_wire.register(kinds)
    bench_scheduling.register(kinds)
    bench_mqtt.register(kinds)
    bench_coap.register(kinds)
    bench_dashboard.register(kinds)
    bench_shipper.register(kinds)
    bench_soak.register(kinds)
    bench_growth.register(kinds)
    bench_reeval.register(kinds)
    bench_parallel.register(kinds)


def peak_rss_mb() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_lighting(args: argparse.Namespace) -> int:
    from tools.lighting import report, runner

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    results = runner.run_benchmark(
        args.experiments, args.modes, all_subscribed=args.all_subscribed, log=None if args.quiet else log
    )
    rss = peak_rss_mb()
    if args.json:
        print(report.dumps(results, rss))
    else:
        print(report.format_table(results, rss, with_paper=not args.all_subscribed))
    runs = [k for by_mode in results.values() for k in by_mode.values()]
    if any("error" in k for k in runs):
        return 1
    return 1 if args.strict and not all(k.get("counts_ok") for k in runs) else 0
