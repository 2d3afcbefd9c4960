"""``sepa-gateway bench parallel``: the engine's parallel mode against its sequential mode (issue 19).

Why a module of its own: like ``bench wire`` it has its own options; the imports of
:mod:`tools.parallel` stay inside the handler so ``--help`` and the other commands do not pay for
the engine and the knowledge base generator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tools.commands.bench_wire import bounded


def register(kinds: argparse._SubParsersAction) -> None:
    """Add ``parallel`` to the ``bench`` sub-parsers."""
    parser = kinds.add_parser(
        "parallel",
        help="sequential vs parallel engine: seed 001 Fig. 7, ROAD and LAMP in process, and bench wire",
        description="Run each phase with the engine in sequential mode, then in parallel mode (BOOSTER workers), "
        "on fresh engines: fig7 (S_ROAD(1,100,200,300), U_ROAD(300..309) pipelined, R rounds), the ROAD and LAMP "
        "experiments of profile S (updates pipelined, repeated), and bench wire against Oxigraph. Report times, "
        "speedups, CPU per core, memory, whether both modes notified alike, and the issue's bars. A bar not met "
        "is reported, not an error. Progress goes to stderr.",
    )
    parser.add_argument("--json", action="store_true", help="print the whole report as one JSON object")
    parser.add_argument(
        "--workers",
        type=bounded(1, 64),
        default=max(1, len(os.sched_getaffinity(0)) - 1),
        help="BOOSTER workers of the parallel engine (default: cores - 1, at least 1)",
    )
    parser.add_argument(
        "--rounds", type=bounded(1, 10_000), default=20, help="fig7: rounds of the ten updates (default 20)"
    )
    parser.add_argument(
        "--repeats", type=bounded(1, 100), default=3, help="ROAD and LAMP: runs of each mode, alternating (default 3)"
    )
    parser.add_argument(
        "--updates",
        type=bounded(1, 310),
        default=None,
        help="ROAD and LAMP: only the first N of their 310 updates (default: all)",
    )
    parser.add_argument(
        "--wire-updates", type=bounded(1, 200_000), default=3000, help="bench wire's updates (default 3000)"
    )
    parser.add_argument("--skip-wire", action="store_true", help="leave bench wire out")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when notifications differ between modes or from the expected"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run_parallel)


def run_parallel(args: argparse.Namespace) -> int:
    from tools.parallel import runner

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    options = runner.ParallelOptions(
        workers=args.workers,
        rounds=args.rounds,
        repeats=args.repeats,
        updates=args.updates,
        wire_updates=args.wire_updates,
        skip_wire=args.skip_wire,
    )
    report = runner.run(options, None if args.quiet else log)
    print(json.dumps(report, indent=2) if args.json else runner.format_summary(report))
    return runner.exit_code(report, strict=args.strict)
