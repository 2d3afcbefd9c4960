"""``sepa-gateway clients add | list | allow | revoke | reset``: the operator's side of OAuth.

Why a file and not an admin endpoint: the registry (``clients.json`` in the security directory,
owner-only) is the state; the CLI changes it under the same lock the gateway uses, and a running
gateway sees the change on the next secure request (one stat per request), and ends the
subscriptions of a revoked client within a second. Nothing new listens on a port for it.

Which directory: ``--security-dir``, else the configuration's ``security.dir``, else
``<data dir>/security``. The configuration and data directory default to the installed
appliance's (``/etc/sepa-gateway/sepa-gateway.toml`` and ``/var/lib/sepa-gateway/data``) when
they exist, so on an installed gateway ``sudo sepa-gateway clients add dashboard --read '*'`` is
all it takes. Identities and rights given in the TOML (``[[security.clients]]``) are listed too;
the CLI adds to them and can revoke them, but removes only rights it gave.

``reset`` registers the identity anew here, in the same locked edit, and prints the new
credentials; ``reset --open`` only forgets the registration. Why not the other way round: a reset
rotates a secret that may be stolen, and whoever stole it knows the name; polling /oauth/register
for it, it registered first after every plain reset (/tmp/auth/t_race_register.py), so the
rotation handed the thief a fresh secret. ``add --register`` is one locked edit for the same reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from broker.api import Client, ClientRegistry, RegistryError
from gateway.appliance.config import ConfigError, load_config

INSTALLED_CONFIG = Path("/etc/sepa-gateway/sepa-gateway.toml")
INSTALLED_DATA_DIR = Path("/var/lib/sepa-gateway/data")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "clients",
        description="Manage the OAuth clients of the secure gates. Graphs: '*' (every graph), 'default' "
        "(the default graph) or an IRI. A running gateway applies a change on the next request.",
    )
    parser.add_argument("--config", metavar="FILE", help=f"the gateway's TOML (default: {INSTALLED_CONFIG} if present)")
    parser.add_argument(
        "--data-dir", metavar="DIR", help=f"its data directory (default: {INSTALLED_DATA_DIR} if present)"
    )
    parser.add_argument("--security-dir", metavar="DIR", help="the security directory itself")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, text in (
        ("add", "allow an identity to register, with these rights"),
        ("allow", "give an existing client more rights"),
        ("revoke", "revoke a client (no graph given: its tokens, registration and subscriptions end) or rights"),
    ):
        sub = actions.add_parser(action, help=text, description=text)
        sub.add_argument("identity")
        sub.add_argument("--read", action="append", default=[], metavar="GRAPH", help="a graph it may read")
        sub.add_argument("--write", action="append", default=[], metavar="GRAPH", help="a graph it may write")
        if action == "add":
            sub.add_argument(
                "--register",
                action="store_true",
                help="register it here and print its credentials (nobody on the network can register it first)",
            )
    reset_text = (
        "rotate a client's secret: forget its registration and register it anew here, printing the new "
        "credentials (old tokens are refused)"
    )
    reset = actions.add_parser("reset", help=reset_text, description=reset_text)
    reset.add_argument("identity")
    how = reset.add_mutually_exclusive_group()
    how.add_argument(
        "--register",
        action="store_true",
        help="register it anew here and print its credentials (the default: nobody on the network can take it)",
    )
    how.add_argument(
        "--open",
        action="store_true",
        help="only forget the registration: the first to send its name to /oauth/register gets it, "
        "whoever that is (whoever stole the old secret knows the name)",
    )
    listing = actions.add_parser("list", help="every client with its rights and registration")
    listing.add_argument("--json", action="store_true", help="as JSON")
    parser.set_defaults(handler=run)


def security_dir(args: argparse.Namespace) -> Path:
    if args.security_dir:
        return Path(args.security_dir)
    config_path = args.config or (str(INSTALLED_CONFIG) if INSTALLED_CONFIG.is_file() else None)
    config = load_config(config_path)
    if config.security.dir:
        return Path(config.security.dir)
    data_dir = (
        args.data_dir or config.store.data_dir or (str(INSTALLED_DATA_DIR) if INSTALLED_DATA_DIR.is_dir() else "")
    )
    if not data_dir:
        raise ConfigError("no security directory: give --data-dir or --security-dir (or set security.dir)")
    return Path(data_dir) / "security"


def _configured(args: argparse.Namespace) -> list[dict[str, object]]:
    if args.security_dir and not args.config:
        return []
    config_path = args.config or (str(INSTALLED_CONFIG) if INSTALLED_CONFIG.is_file() else None)
    return list(load_config(config_path).security.clients)


def run(args: argparse.Namespace) -> int:
    try:
        registry = ClientRegistry(security_dir(args), _configured(args))
        if args.action == "list":
            return _list(registry, args.json)
        now = datetime.now(UTC).isoformat(timespec="seconds")
        if args.action == "reset" and args.open:
            registry.reset(args.identity)
            print(
                f"{args.identity}: registration forgotten; old tokens are refused, and the first to send "
                "its name to /oauth/register gets it, whoever that is"
            )
            return 0
        if args.action == "reset":
            return _credentials(*registry.reset_and_register(args.identity, now), "registered anew")
        if args.action == "add" and args.register:
            return _credentials(*registry.add_and_register(args.identity, now, args.read, args.write), "registered")
        change = {"add": registry.add, "allow": registry.allow, "revoke": registry.revoke}[args.action]
        client = change(args.identity, args.read, args.write)
    except (RegistryError, ConfigError, OSError) as error:
        print(f"sepa-gateway clients: {error}", file=sys.stderr)
        return 1
    state = "REVOKED" if client.revoked else ("registered" if client.client_id else "may register")
    print(f"{client.identity}: {state}; read {_graphs(client.read)}; write {_graphs(client.write)}")
    return 0


def _credentials(client: Client, secret: str, done: str) -> int:
    """Print a registration made here: the credentials on stdout (for a script), the note on stderr."""
    print(json.dumps({"client_id": client.client_id, "client_secret": secret}))
    print(f"{client.identity}: {done}; keep these credentials: they are shown only once", file=sys.stderr)
    return 0


def _graphs(graphs: set[str]) -> str:
    return ", ".join(sorted(graphs)) or "nothing"


def _list(registry: ClientRegistry, as_json: bool) -> int:
    clients = sorted(registry.current().values(), key=lambda client: client.identity)
    if as_json:
        document = {
            client.identity: {
                "read": sorted(client.read),
                "write": sorted(client.write),
                "revoked": client.revoked,
                "client_id": client.client_id,
                "registered": client.registered,
                "in_config": client.from_config,
            }
            for client in clients
        }
        print(json.dumps(document, indent=2))
        return 0
    if not clients:
        print("no clients: add one with `sepa-gateway clients add IDENTITY --read GRAPH --write GRAPH`")
    for client in clients:
        state = (
            "REVOKED"
            if client.revoked
            else (f"registered {client.registered}" if client.client_id else "not registered")
        )
        source = " (TOML)" if client.from_config else ""
        print(f"{client.identity}{source}: {state}; read {_graphs(client.read)}; write {_graphs(client.write)}")
    return 0
