"""``sepa-gateway bench dashboard``: an open dashboard under 100 sensors at 10 Hz (issue 18)."""

from __future__ import annotations

import argparse
import json
import sys

from tools.commands.bench_wire import bounded


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "dashboard",
        help="the dashboard in Chromium under 100 sensors at 10 Hz: frame times, and the gateway's MQTT NL beside",
        description="Start a gateway as installed (HTTPS/WSS + OAuth, Mosquitto with logins), publish S sensors at "
        "H Hz, and alternate phases without and with the dashboard open in headless Chromium: the page's frame "
        "times (requestAnimationFrame deltas) and the MQTT notification latency of 100 latest-view subscribers "
        "in each. Needs mosquitto, chromium and chromium-driver.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object, indented")
    parser.add_argument("--sensors", type=bounded(1, 1000), default=100)
    parser.add_argument("--hz", type=float, default=10.0, help="readings per second per sensor (default 10)")
    parser.add_argument("--seconds", type=bounded(2, 600), default=10, help="length of each phase (default 10)")
    parser.add_argument("--rounds", type=bounded(1, 20), default=4, help="without/with pairs (default 4)")
    parser.add_argument("--on-disk", action="store_true", help="the gateway with a data directory, as installed")
    parser.add_argument(
        "--browser-nice",
        type=bounded(0, 19),
        default=10,
        help="niceness of Chromium (default 10: it yields the shared cores, as a phone's browser is not on them)",
    )
    parser.add_argument(
        "--browser-idle",
        action="store_true",
        help="run Chromium under SCHED_IDLE (only on CPU time nothing else wants) instead of niced",
    )
    parser.add_argument("--browser-cpus", default="", help="run Chromium on these CPUs only (taskset -c list, e.g. 1)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run_dashboard)


def run_dashboard(args: argparse.Namespace) -> int:
    from tools.dashboard_bench.runner import DashboardBenchOptions, run

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    options = DashboardBenchOptions(
        sensors=args.sensors,
        hz=args.hz,
        seconds=args.seconds,
        rounds=args.rounds,
        on_disk=args.on_disk,
        browser_nice=args.browser_nice,
        browser_idle=args.browser_idle,
        browser_cpus=args.browser_cpus,
    )
    report = run(options, None if args.quiet else log)
    print(json.dumps(report, indent=2 if args.json else None))
    return 0 if report["frame_bar_met"] and report["nl_bar_met"] else 1
