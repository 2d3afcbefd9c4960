"""The ``sepa-gateway`` command line.

Why so thin: each subcommand lives in its own module and adds its parser through
``register(subparsers)``, setting ``handler`` (a function of the parsed arguments returning the
exit code). The appliance's own commands are listed in :data:`COMMANDS`; others are plug-ins
found through the ``sepa_gateway.commands`` entry point group (pyproject.toml: the benchmarks of
tools/), so the appliance never imports them. Nothing here needs to know what the commands do.

Why only the chosen command's module is imported: the command modules import the broker, the
client and the gates, and importing all of them for every command cost 1.4-2.2 CPU-s on
2026-12-07 (``/usr/bin/time -f %U+%S sepa-gateway --version``, x86; a Raspberry Pi 3/4 is 5-8x
slower); now 0.13-0.17 CPU-s for ``--version``, ``--help`` and ``bench --help`` (per command:
docs/architecture.md). The other commands get a placeholder parser carrying the line ``--help``
lists.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from broker.api import gateway_version

# command -> (the module whose register() adds it, the line `sepa-gateway --help` shows for it:
# the modules' own parsers carry a description only, so the line has one home)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("gateway.appliance.commands.run", "run the gateway (HTTP + WebSocket gates)"),
    "check-config": (
        "gateway.appliance.commands.check_config",
        "check a TOML configuration: FILE:LINE: problem and exit 2, or exit 0",
    ),
    "query": ("gateway.appliance.commands.client", "evaluate a SPARQL query and print its result"),
    "update": ("gateway.appliance.commands.client", "apply a SPARQL update and print what it added and removed"),
    "subscribe": (
        "gateway.appliance.commands.client",
        "subscribe to a SELECT or ASK query and print each notification as it arrives",
    ),
    "clients": (
        "gateway.appliance.commands.clients",
        "manage the clients of the secure gates (who may register, which graphs they read and write)",
    ),
    "sensors": ("gateway.appliance.commands.sensors", "manage the MQTT logins of sensors (Mosquitto's password file)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser, complete for `command` only (plug-ins included unless it is the appliance's)."""
    parser = argparse.ArgumentParser(
        prog="sepa-gateway",
        description="Semantic IoT edge gateway: a SEPA broker on an embedded Oxigraph store.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {gateway_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = COMMANDS[command][0] if command in COMMANDS else None
    for name, (module, line) in COMMANDS.items():
        if module != chosen:
            subparsers.add_parser(name, help=line)
        elif name not in subparsers.choices:
            importlib.import_module(module).register(subparsers)
    if chosen is None:
        for plugin in sorted(entry_points(group="sepa_gateway.commands"), key=lambda point: point.name):
            plugin.load().register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sepa-gateway`` script; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # the top level's only options (--help, --version) exit at once: when it is not a command, the
    # first word makes argparse print the complete listing or an error
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    return int(args.handler(args))
