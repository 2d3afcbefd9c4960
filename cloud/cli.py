"""The ``sepa-cloud`` command line: ``landing`` (the HTTPS endpoint), ``stream`` and ``stats`` (Spark jobs).

Why the Spark commands are imported only when chosen: the landing endpoint runs on machines without
Spark or Java, and ``stream``/``stats`` own their argument parsers (``spark-submit cloud/stream.py``
takes the same arguments), so this module only routes to them.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from cloud.settings import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEAD_TIMEOUT_S,
    DEFAULT_INFLATE_RATIO,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_UPLOADS_PER_TOKEN,
    LandingSettings,
)
from cloud.tokens import TOKENS_ENV, TokenError, load_tokens
from gateway.appliance.logs import setup_logging

SPARK_COMMANDS = {"stream": "cloud.stream", "stats": "cloud.stats"}
# Spark is an extra (pyproject.toml: cloud): a gateway board needs neither it nor Java
SPARK_MISSING = (
    "needs pyspark and Java 17+: pip install 'sepa-gateway[cloud]' "
    "(on an installed gateway: SEPA_GATEWAY_CLOUD=1 ./systemd/install.sh)"
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; ``stream`` and ``stats`` pass their arguments through untouched."""
    parser = argparse.ArgumentParser(prog="sepa-cloud", description="Cloud side of sepa-gateway.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    landing = commands.add_parser("landing", help="serve the HTTPS landing endpoint for observation batches")
    landing.add_argument("--landing-dir", required=True, type=Path, metavar="DIR", help="where batches are stored")
    landing.add_argument(
        "--host", help="listen address (default 0.0.0.0 with --cert/--key, else 127.0.0.1: for a proxy on this host)"
    )
    landing.add_argument("--port", type=int, default=8443, help="listen port (default 8443)")
    landing.add_argument("--cert", type=Path, metavar="FILE", help="TLS certificate chain (PEM)")
    landing.add_argument("--key", type=Path, metavar="FILE", help="TLS private key (PEM)")
    landing.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"accepted bearer tokens, one a line, each <gateway-slug>:<token> (and/or ${TOKENS_ENV}, comma separated)",
    )
    landing.add_argument(
        "--max-batch-bytes", type=int, default=DEFAULT_MAX_BATCH_BYTES, metavar="N", help="compressed size limit"
    )
    landing.add_argument(
        "--inflate-ratio",
        type=int,
        default=DEFAULT_INFLATE_RATIO,
        metavar="N",
        help=f"how many times its own size a batch may inflate (default {DEFAULT_INFLATE_RATIO}; then 413)",
    )
    landing.add_argument(
        "--max-uploads-per-token",
        type=int,
        default=DEFAULT_MAX_UPLOADS_PER_TOKEN,
        metavar="N",
        help=f"uploads in progress at once per token (default {DEFAULT_MAX_UPLOADS_PER_TOKEN}; then 429)",
    )
    landing.add_argument(
        "--max-connections",
        type=int,
        default=0,
        metavar="N",
        help="connections open at once; more are closed at once (default 0: half the open-file limit)",
    )
    landing.add_argument(
        "--head-timeout",
        type=float,
        default=DEFAULT_HEAD_TIMEOUT_S,
        metavar="S",
        help=f"seconds a request's head may take (default {DEFAULT_HEAD_TIMEOUT_S:g}; then 408)",
    )
    landing.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT_S,
        metavar="S",
        help=f"seconds a batch's body may take (default {DEFAULT_BODY_TIMEOUT_S:g}; then 408)",
    )
    landing.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    for name, help_text in (("stream", "Spark streaming job: landing -> Parquet table"), ("stats", "daily statistics")):
        commands.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sepa-cloud`` script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = build_parser().parse_known_args(argv)
    if args.command in SPARK_COMMANDS:
        try:
            module = importlib.import_module(SPARK_COMMANDS[args.command])
        except ModuleNotFoundError as error:
            if (error.name or "").partition(".")[0] not in ("pyspark", "py4j"):  # py4j comes with pyspark
                raise
            print(f"sepa-cloud: {args.command} {SPARK_MISSING}", file=sys.stderr)
            return 2
        return int(module.main(rest, prog=f"sepa-cloud {args.command}"))
    if rest:
        print(f"sepa-cloud: unrecognized arguments: {' '.join(rest)}", file=sys.stderr)
        return 2
    return landing(args)


def landing(args: argparse.Namespace) -> int:
    """``sepa-cloud landing``: serve until SIGTERM/SIGINT; 2 if it cannot start."""
    # imported here: the server pulls in aiohttp and, through the shipper's contract, the broker
    # (1.2 s of imports on 2026-12-07, `python -X importtime -m cloud.cli --help`), which --help,
    # `stream` and `stats` do not use
    from cloud.server import StartupError, serve

    try:
        tokens = load_tokens(args.token_file)
    except TokenError as error:
        print(f"sepa-cloud: {error}", file=sys.stderr)
        return 2
    settings = LandingSettings(
        landing_dir=args.landing_dir,
        tokens=tokens,
        # Why loopback without TLS: the bearer tokens and the observations would cross the network in
        # clear; a plain landing is for a TLS-terminating proxy on the same host (and --host says so)
        host=args.host or ("0.0.0.0" if args.cert else "127.0.0.1"),
        port=args.port,
        cert=args.cert,
        key=args.key,
        max_batch_bytes=args.max_batch_bytes,
        inflate_ratio=args.inflate_ratio,
        max_uploads_per_token=args.max_uploads_per_token,
        max_connections=args.max_connections,
        head_timeout_s=args.head_timeout,
        body_timeout_s=args.body_timeout,
    )
    setup_logging(args.log_level)
    try:
        asyncio.run(serve(settings))
    except StartupError as error:
        logging.getLogger("cloud").debug("start-up failed", exc_info=True)
        print(f"sepa-cloud: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
