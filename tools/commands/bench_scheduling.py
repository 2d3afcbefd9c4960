"""``sepa-gateway bench scheduling``: how late delayed updates fire while the LAMP profile runs.

The imports of :mod:`tools.scheduling` stay inside the handler so ``--help`` and the other
commands do not pay for them.
"""

from __future__ import annotations

import argparse
import json
import sys

from tools.commands.bench_wire import bounded


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from error
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected 0.1..3600 seconds, not {value}")
    return value


def register(kinds: argparse._SubParsersAction) -> None:
    """Add ``scheduling`` to the ``bench`` sub-parsers."""
    parser = kinds.add_parser(
        "scheduling",
        help="lateness of 10,000 delayed updates while the LAMP profile saturates the update path",
        description="Load the lighting knowledge base (on disk by default) with profile S subscribed, schedule N "
        "delayed lamp-OFF updates due over a window, run the U_LAMP stream with C clients during the window and "
        "report how late the delayed updates ran (p50, p99, max) and whether any ran early. Progress on stderr.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--delayed", type=bounded(1, 100_000), default=10_000, help="delayed updates (default 10000)")
    parser.add_argument("--window", type=_seconds, default=20.0, help="seconds over which they fall due (default 20)")
    parser.add_argument("--lead", type=_seconds, default=10.0, help="seconds before the window opens (default 10)")
    parser.add_argument("--concurrency", type=bounded(1, 256), default=4, help="LAMP clients (default 4)")
    parser.add_argument(
        "--lamps-per-road", type=bounded(1, 100), default=None, help="cap the knowledge base (default: full)"
    )
    parser.add_argument("--memory", action="store_true", help="in-memory store and pending table instead of disk")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run_scheduling)


def run_scheduling(args: argparse.Namespace) -> int:
    from tools.scheduling.runner import SchedulingOptions, run

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    options = SchedulingOptions(
        delayed=args.delayed,
        window_s=args.window,
        lead_s=args.lead,
        concurrency=args.concurrency,
        lamps_per_road=args.lamps_per_road,
        on_disk=not args.memory,
    )
    report = run(options, None if args.quiet else log)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        width = max(len(key) for key in report)
        for key, value in report.items():
            print(f"{key:<{width}}  {value}")
    ok = report["early"] == 0 and report["fired"] == report["delayed"]
    return 0 if ok else 1
