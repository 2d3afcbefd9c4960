"""The ``sepa-gateway`` command line.

Why so thin: each subcommand lives in its own module under :mod:`gateway.commands` and adds its
parser through ``register(subparsers)``, setting ``handler`` (a function of the parsed arguments
returning the exit code). Adding a command (run, query, update, subscribe...) is one new module and
one line in :data:`COMMAND_MODULES`; nothing here needs to know what the commands do.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

COMMAND_MODULES: tuple[str, ...] = (
    "gateway.commands.run",
    "gateway.commands.bench",
    "gateway.commands.client",
    "gateway.commands.clients",
    "gateway.commands.sensors",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="sepa-gateway",
        description="Semantic IoT edge gateway: a SEPA broker on an embedded Oxigraph store.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sepa-gateway`` script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))
