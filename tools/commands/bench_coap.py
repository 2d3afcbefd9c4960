"""``sepa-gateway bench coap``: confirmable CoAP readings into observations, the MQTT figure beside it (issue 17)."""

from __future__ import annotations

import argparse
import json
import sys

from tools.commands.bench_wire import bounded


def loss_share(text: str) -> float:
    """An argparse type: a share of datagrams dropped, in [0, 0.5] (past it, CoAP's retransmissions give up)."""
    try:
        value = float(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from error
    if not 0.0 <= value <= 0.5:
        raise argparse.ArgumentTypeError(f"expected 0..0.5, not {value}")
    return value


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "coap",
        help="confirmable CoAP readings from several client processes into observations, 100 subscribers",
        description="Start a gateway, hold 100 subscriptions on the latest-value view, POST N readings as "
        "confirmable CoAP requests from C client processes, W in flight each (readings/s; stored, duplicates and "
        "lost counted in the store), then 1,000 readings/s for 10 s (notification latency from the POST to the "
        "subscriber); then `bench mqtt` with the same options, for its figures beside these (needs the mosquitto "
        "binary; --no-mqtt skips it). Progress goes to stderr.",
    )
    parser.add_argument("--json", action="store_true", help="print one indented JSON object")
    parser.add_argument("--readings", type=bounded(100, 1_000_000), default=20_000)
    parser.add_argument("--clients", type=bounded(1, 16), default=2, help="client processes (default 2)")
    parser.add_argument(
        "--in-flight", type=bounded(1, 256), default=128, help="requests in flight per client process (default 128)"
    )
    parser.add_argument("--latency-seconds", type=bounded(1, 600), default=10)
    parser.add_argument("--rate", type=bounded(1, 100_000), default=1000, help="readings/s of the latency phase")
    parser.add_argument(
        "--loss", type=loss_share, default=0.0, help="run the throughput phase through a relay dropping this share "
        "of the datagrams each way (e.g. 0.1)",
    )  # fmt: skip
    parser.add_argument("--no-mqtt", action="store_true", help="skip the MQTT comparison")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run_coap)


def run_coap(args: argparse.Namespace) -> int:
    from tools.coap_bench.runner import CoapBenchOptions, run
    from tools.wire.processes import BenchError

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    options = CoapBenchOptions(
        readings=args.readings,
        clients=args.clients,
        in_flight=args.in_flight,
        latency_rate=float(args.rate),
        latency_seconds=args.latency_seconds,
        loss=args.loss,
        mqtt=not args.no_mqtt,
    )
    try:
        report = run(options, None if args.quiet else log)
    except BenchError as error:
        print(f"sepa-gateway bench coap: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2 if args.json else None))
    return 0 if report["duplicates"] == 0 and report["lost"] == 0 else 1
