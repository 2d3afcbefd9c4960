"""The ``sepa-gateway`` command line.

Why so thin: each subcommand lives in its own module and adds its parser through
``register(subparsers)``, setting ``handler`` (a function of the parsed arguments returning the
exit code). The appliance's own commands are listed in :data:`COMMAND_MODULES`; others are plug-ins
found through the ``sepa_gateway.commands`` entry point group (pyproject.toml: the benchmarks of
tools/), so the appliance never imports them. Nothing here needs to know what the commands do.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from importlib.metadata import entry_points

from broker.api import gateway_version

COMMAND_MODULES: tuple[str, ...] = (
    "gateway.appliance.commands.run",
    "gateway.appliance.commands.check_config",
    "gateway.appliance.commands.client",
    "gateway.appliance.commands.clients",
    "gateway.appliance.commands.sensors",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="sepa-gateway",
        description="Semantic IoT edge gateway: a SEPA broker on an embedded Oxigraph store.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {gateway_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    for plugin in sorted(entry_points(group="sepa_gateway.commands"), key=lambda point: point.name):
        plugin.load().register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sepa-gateway`` script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))
