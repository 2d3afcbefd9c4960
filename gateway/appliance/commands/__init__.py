"""Subcommands of ``sepa-gateway``: one module per command, each exposing ``register(subparsers)``."""
