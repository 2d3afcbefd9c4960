"""The broker's public API: everything code outside broker/ may use, and nothing else.

Why one entry point: the broker is a library (the SEPA engine, its gates and its scheduler) that
the appliance (gateway/), the adapters, the tools and the examples build on. What is named here is
a promise kept across changes of the engine; every other module of broker/ may change shape
without notice. tests/test_layers.py walks the imports of the project and fails when code outside
broker/ imports anything else from it.

What it offers, in the order a newcomer meets it (docs/architecture.md walks the same path):

- building a broker: :class:`RdfStore` (pyoxigraph, in memory or on disk), :class:`QueryWorkers`
  (replicas in processes of their own, where time limits stop evaluations), :class:`Compactor` (drops
  the dead versions pyoxigraph keeps), :class:`Engine` (updates,
  queries, subscriptions, end of processing), :class:`Scheduler` (the bounded FIFO and the update
  thread in front of it), :class:`PendingUpdates` (delayed updates), :class:`Gates` (HTTP and
  WebSocket, plain and secure);
- talking to it in process: results (:class:`QueryResult`, :class:`UpdateResult`), notifications
  (:class:`Notification`, graph feeds' :class:`QuadRows`), :class:`Subscription`, and
  :func:`loop_handoff`, the one way engine-thread callbacks reach an asyncio loop;
- the public update syntax tree (:class:`Update`, :class:`InsertData`, :class:`DeleteData`,
  :class:`Modify`, :class:`Var`, :class:`QuadPattern`) that producers build instead of text, with its
  declared extra, the :class:`Digest` (broker.sparql.syntax says what it is for);
- the errors every gate maps to a status, and the clock, delay and term helpers of the protocol;
- what ``/health`` reports of a component (:class:`ComponentHealth`, added to ``Gates.health.checks``)
  and the version of the running code (:func:`gateway_version`);
- the security parts the appliance wires (client registry, token authority, TLS files);
- the SPARQL lexical rules (prefixed names, tokens) that JSAP tooling must agree with.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.compaction import THREAD_NAME as COMPACTOR_THREAD
    from broker.compaction import Compactor
    from broker.core.access import DEFAULT_GRAPH_IRI, NO_GRAPH_IRI, GraphAccess
    from broker.core.budget import OverBudget
    from broker.core.clock import FUNCTIONS_NS, EngineClock, micros_to_datetime, rfc3339
    from broker.core.due import due_micros, parse_at, parse_delay
    from broker.core.engine import Engine
    from broker.core.notification import Notification, QuadRows
    from broker.core.pending import PendingUpdate, PendingUpdates
    from broker.core.results import QueryResult, UpdateResult
    from broker.core.subscription import Subscription
    from broker.delayed import clock_offset_us, now_micros
    from broker.errors import (
        EvaluationCrashed,
        Forbidden,
        InvalidRequest,
        NotFound,
        ResultTooLarge,
        SepaError,
        SparqlSyntaxError,
        StoreFailed,
        StoreFull,
        TimeLimitExceeded,
        Unauthorized,
        UpdateFailed,
    )
    from broker.gates.connections import Admission, Shares, peer_host
    from broker.gates.health import ComponentHealth
    from broker.gates.quota import QuotaLimits, TooManySubscriptions
    from broker.gates.secure import SECURE_PATHS
    from broker.gates.server import Gates, GateSettings
    from broker.handoff import loop_handoff
    from broker.headroom import Headroom, meminfo
    from broker.quiet_log import QuietLog
    from broker.scheduler import Scheduler, TooManyRequests
    from broker.security.authority import Authority
    from broker.security.clients import Client, ClientRegistry, RegistryError, configured_client, secret_digest
    from broker.security.keys import TlsFiles, fingerprint, private_directory, tls_files
    from broker.security.owned_files import (
        directory_owner,
        give_root_entries,
        make_directories,
        open_directory,
        write_file,
    )
    from broker.sparql.canonical import XSD, canonical
    from broker.sparql.limits import MAX_GROUP_ELEMENTS, MAX_NESTING, check_structure
    from broker.sparql.patterns import QuadPattern
    from broker.sparql.syntax import DeleteData, Digest, InsertData, Modify, Template, Update, Var
    from broker.sparql.terms import Row, Term, rows_to_bindings, term_from_json, term_to_json
    from broker.sparql.tokens import PN_CHARS, PN_CHARS_U, PN_PREFIX, Token, line_column, matching_brace, tokenize
    from broker.store import RdfStore, sync_directory
    from broker.version import gateway_version
    from broker.workers.pool import QueryWorkers

# Which module defines each public name. Why not plain imports: every `sepa-gateway` command reaches
# the broker through this module, and importing all of it (engine, gates, aiohttp, cryptography)
# cost 1.4-2.2 CPU-s per command on 2026-12-07 (`sepa-gateway --version`, x86; 5-8x that on a
# Raspberry Pi 3/4). A name is imported on first use (PEP 562) and then kept in this module's globals.
_MODULES: dict[str, tuple[str, ...]] = {
    "broker.compaction": ("COMPACTOR_THREAD", "Compactor"),
    "broker.core.access": ("DEFAULT_GRAPH_IRI", "NO_GRAPH_IRI", "GraphAccess"),
    "broker.core.budget": ("OverBudget",),
    "broker.core.clock": ("FUNCTIONS_NS", "EngineClock", "micros_to_datetime", "rfc3339"),
    "broker.core.due": ("due_micros", "parse_at", "parse_delay"),
    "broker.core.engine": ("Engine",),
    "broker.core.notification": ("Notification", "QuadRows"),
    "broker.core.pending": ("PendingUpdate", "PendingUpdates"),
    "broker.core.results": ("QueryResult", "UpdateResult"),
    "broker.core.subscription": ("Subscription",),
    "broker.delayed": ("clock_offset_us", "now_micros"),
    "broker.errors": (
        "EvaluationCrashed",
        "Forbidden",
        "InvalidRequest",
        "NotFound",
        "ResultTooLarge",
        "SepaError",
        "SparqlSyntaxError",
        "StoreFailed",
        "StoreFull",
        "TimeLimitExceeded",
        "Unauthorized",
        "UpdateFailed",
    ),
    "broker.gates.connections": ("Admission", "Shares", "peer_host"),
    "broker.gates.health": ("ComponentHealth",),
    "broker.gates.quota": ("QuotaLimits", "TooManySubscriptions"),
    "broker.gates.secure": ("SECURE_PATHS",),
    "broker.gates.server": ("Gates", "GateSettings"),
    "broker.handoff": ("loop_handoff",),
    "broker.headroom": ("Headroom", "meminfo"),
    "broker.quiet_log": ("QuietLog",),
    "broker.scheduler": ("Scheduler", "TooManyRequests"),
    "broker.security.authority": ("Authority",),
    "broker.security.clients": ("Client", "ClientRegistry", "RegistryError", "configured_client", "secret_digest"),
    "broker.security.keys": ("TlsFiles", "fingerprint", "private_directory", "tls_files"),
    "broker.security.owned_files": (
        "directory_owner",
        "give_root_entries",
        "make_directories",
        "open_directory",
        "write_file",
    ),
    "broker.sparql.canonical": ("XSD", "canonical"),
    "broker.sparql.limits": ("MAX_GROUP_ELEMENTS", "MAX_NESTING", "check_structure"),
    "broker.sparql.patterns": ("QuadPattern",),
    "broker.sparql.syntax": ("DeleteData", "Digest", "InsertData", "Modify", "Template", "Update", "Var"),
    "broker.sparql.terms": ("Row", "Term", "rows_to_bindings", "term_from_json", "term_to_json"),
    "broker.sparql.tokens": (
        "PN_CHARS",
        "PN_CHARS_U",
        "PN_PREFIX",
        "Token",
        "line_column",
        "matching_brace",
        "tokenize",
    ),
    "broker.store": ("RdfStore", "sync_directory"),
    "broker.version": ("gateway_version",),
    "broker.workers.pool": ("QueryWorkers",),
}
_RENAMED = {"COMPACTOR_THREAD": "THREAD_NAME"}
_HOME = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    """Import the module defining `name` on first use (PEP 562), then keep the name here."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "DEFAULT_GRAPH_IRI",
    "FUNCTIONS_NS",
    "MAX_GROUP_ELEMENTS",
    "MAX_NESTING",
    "NO_GRAPH_IRI",
    "PN_CHARS",
    "PN_CHARS_U",
    "PN_PREFIX",
    "XSD",
    "Authority",
    "Client",
    "ClientRegistry",
    "ComponentHealth",
    "DeleteData",
    "Digest",
    "Engine",
    "EngineClock",
    "Forbidden",
    "GateSettings",
    "Gates",
    "GraphAccess",
    "Headroom",
    "InsertData",
    "InvalidRequest",
    "Modify",
    "NotFound",
    "Notification",
    "OverBudget",
    "PendingUpdate",
    "PendingUpdates",
    "QuadPattern",
    "QuadRows",
    "SECURE_PATHS",
    "QueryResult",
    "QuietLog",
    "Admission",
    "Shares",
    "peer_host",
    "RdfStore",
    "RegistryError",
    "Row",
    "Scheduler",
    "SepaError",
    "SparqlSyntaxError",
    "sync_directory",
    "meminfo",
    "StoreFailed",
    "StoreFull",
    "Subscription",
    "Template",
    "Term",
    "TlsFiles",
    "Token",
    "TooManyRequests",
    "TimeLimitExceeded",
    "EvaluationCrashed",
    "ResultTooLarge",
    "QueryWorkers",
    "Compactor",
    "COMPACTOR_THREAD",
    "QuotaLimits",
    "TooManySubscriptions",
    "Unauthorized",
    "Update",
    "UpdateFailed",
    "UpdateResult",
    "Var",
    "canonical",
    "check_structure",
    "configured_client",
    "directory_owner",
    "clock_offset_us",
    "due_micros",
    "fingerprint",
    "gateway_version",
    "give_root_entries",
    "line_column",
    "loop_handoff",
    "make_directories",
    "matching_brace",
    "micros_to_datetime",
    "now_micros",
    "open_directory",
    "parse_at",
    "parse_delay",
    "private_directory",
    "rfc3339",
    "rows_to_bindings",
    "secret_digest",
    "term_from_json",
    "term_to_json",
    "tls_files",
    "tokenize",
    "write_file",
]
