"""``sepa-gateway bench wire``: the lighting workload over HTTP and WebSockets against a real gateway.

Why a module of its own under ``bench``: the wire benchmark starts processes and has its own
options; :mod:`tools.commands.bench` only hands it the ``bench`` sub-parsers. The imports of
:mod:`tools.wire` stay inside the handler so ``--help`` and the other commands do not pay for them.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType


def bounded(low: int, high: int) -> type[int] | object:
    """An argparse type: an int in [low, high] (the benchmark stays bounded in count)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected an integer, not {text!r}") from error
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {low}..{high}, not {value}")
        return value

    return parse


def register(kinds: argparse._SubParsersAction) -> None:
    """Add ``wire`` to the ``bench`` sub-parsers."""
    wire = kinds.add_parser(
        "wire",
        help="U_LAMP over HTTP against a gateway process holding profile S on WebSockets, vs Oxigraph",
        description="Start a gateway (in-memory, 127.0.0.1), load the ~334k-triple lighting knowledge base, "
        "hold the 1,004 subscriptions of profile S on a few WebSockets in one client process, send the U_LAMP "
        "updates (cycled to N, alternating dimming values) from another with C requests in flight, and report "
        "updates/s and notification latency; then send the same stream to an Oxigraph server. "
        "Progress goes to stderr.",
    )
    wire.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    wire.add_argument(
        "--updates", type=bounded(1, 200_000), default=3000, help="updates to send (default 3000, at most 200,000)"
    )
    wire.add_argument(
        "--concurrency", type=bounded(1, 256), default=8, help="update requests in flight (default 8, at most 256)"
    )
    wire.add_argument("--sockets", type=bounded(1, 64), default=4, help="WebSockets carrying profile S (default 4)")
    wire.add_argument(
        "--lamps-per-road",
        type=bounded(1, 100),
        default=None,
        help="cap the knowledge base at this many lamp-posts per road (default: the full ~334k triples)",
    )
    wire.add_argument(
        "--load",
        choices=("load", "insert"),
        default="load",
        help="how the gateway is loaded: SPARQL LOAD of N-Triples served on 127.0.0.1 (default) "
        "or large INSERT DATA requests",
    )
    wire.add_argument("--no-oxigraph", action="store_true", help="skip the Oxigraph baseline")
    wire.add_argument("--on-disk", action="store_true", help="the gateway with a data directory (durable updates)")
    wire.add_argument(
        "--secure",
        action="store_true",
        help="also run the gateway over its secure gates (HTTPS + WSS, OAuth token) and report it beside the plain run",
    )
    wire.add_argument(
        "--timeout", type=bounded(10, 86_400), default=900, help="give up after this many seconds (default 900)"
    )
    wire.add_argument(
        "--mode", choices=("sequential", "parallel"), default="sequential", help="the gateway's engine mode"
    )
    wire.add_argument(
        "--workers", type=bounded(0, 64), default=0, help="parallel mode's BOOSTER workers (default: cores - 1)"
    )
    wire.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    wire.set_defaults(handler=run_wire)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the benchmark's processes are stopped on the way out."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_wire(args: argparse.Namespace) -> int:
    from tools.wire import report, runner
    from tools.wire.processes import BenchError

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    options = runner.WireOptions(
        updates=args.updates,
        concurrency=args.concurrency,
        sockets=args.sockets,
        lamps_per_road=args.lamps_per_road,
        load_method=args.load,
        oxigraph=not args.no_oxigraph,
        timeout_s=float(args.timeout),
        secure=args.secure,
        on_disk=args.on_disk,
        mode=args.mode,
        workers=args.workers,
    )
    try:
        with _sigterm_as_interrupt():
            result = runner.run(options, None if args.quiet else log)
    except BenchError as error:
        print(f"sepa-gateway bench wire: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("sepa-gateway bench wire: interrupted; its processes were stopped", file=sys.stderr)
        return 130
    print(report.dumps(result) if args.json else report.format_table(result))
    return 0 if report.ok(result) else 1
