"""The client API of the SEPA broker: async first, one API over two transports.

Why it lives in the gateway and not in the broker: the broker knows nothing of its clients
(ARCHITECTURE.md principle 1). Adapters, the cloud shipper and external applications all use
these classes: :class:`SepaClient` over an :class:`InProcessTransport` (inside the gateway
process) or a :class:`NetworkTransport` (anywhere, against any broker that follows PROTOCOL.md);
:class:`Producer`, :class:`Consumer` and :class:`Aggregator` add the SEPA application pattern on
top of a JSAP; :class:`SyncSepaClient` serves scripts without asyncio. See README.md here for the
reconnection, sequence-number and error decisions.

Why :class:`InProcessTransport` is imported on first use (PEP 562, as broker/api.py does): it
imports the broker's core pipeline (the engine, the SPUs, the workers), which only the appliance's
`run` and the tools need. `sepa-gateway query --help` took 1.78 CPU-s with it, 0.97 without
(`sepa-gateway query`, `update` and `subscribe` alike; 2026-12-07, x86, `/usr/bin/time -f %U+%S`,
median of 5 runs alternated with the previous code; a Raspberry Pi is 5-8x slower).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gateway.client.agents import Aggregator, Consumer, Producer, client_for
from gateway.client.client import ClientSubscription, SepaClient
from gateway.client.errors import SepaClientError, SepaConnectionError
from gateway.client.network import NetworkTransport, ReconnectPolicy
from gateway.client.sync import SyncSepaClient, SyncSubscription
from gateway.client.transport import NotificationSink, Scheduled, Transport, TransportSubscription, UpdateSummary
from gateway.client.view import ResultView

if TYPE_CHECKING:
    from gateway.client.inprocess import InProcessTransport

_LAZY = {"InProcessTransport": "gateway.client.inprocess"}


def __getattr__(name: str) -> Any:
    """Import the module defining `name` on first use (PEP 562), then keep the name here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Aggregator",
    "ClientSubscription",
    "Consumer",
    "InProcessTransport",
    "NetworkTransport",
    "NotificationSink",
    "Producer",
    "ReconnectPolicy",
    "ResultView",
    "Scheduled",
    "SepaClient",
    "SepaClientError",
    "SepaConnectionError",
    "SyncSepaClient",
    "SyncSubscription",
    "Transport",
    "TransportSubscription",
    "UpdateSummary",
    "client_for",
]
