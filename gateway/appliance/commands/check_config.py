"""`sepa-gateway check-config FILE`: is this configuration one `sepa-gateway run` accepts?

Why a command of its own: the installer checks /etc/sepa-gateway/sepa-gateway.toml with the code it
has just installed, before it (re)starts the service, so that a bad file is reported at once, as
``FILE:LINE: problem``, instead of a service that fails to start and a log to go and read. It
runs every check `run` makes of the file (types, ranges, the plug-ins' sections, the security
clients, the shipper's token file), and nothing that needs the service running (ports, data dir).
"""

from __future__ import annotations

import argparse
import sys

from gateway.appliance.config import ConfigError, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check-config", description="Check a TOML configuration: FILE:LINE: problem and exit 2, or exit 0."
    )
    parser.add_argument("file", metavar="FILE", help="the TOML file (e.g. /etc/sepa-gateway/sepa-gateway.toml)")
    parser.set_defaults(handler=check)


def check(args: argparse.Namespace) -> int:
    try:
        load_config(args.file)
    except ConfigError as error:
        print(f"sepa-gateway: bad configuration: {error}", file=sys.stderr)  # FILE:LINE: or FILE:
        return 2
    print(f"{args.file}: ok")
    return 0
