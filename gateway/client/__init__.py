"""The client API of the SEPA broker: async first, one API over two transports.

Why it lives in the gateway and not in the broker: the broker knows nothing of its clients
(ARCHITECTURE.md principle 1). Adapters, the cloud shipper and external applications all use
these classes: :class:`SepaClient` over an :class:`InProcessTransport` (inside the gateway
process) or a :class:`NetworkTransport` (anywhere, against any broker that follows PROTOCOL.md);
:class:`Producer`, :class:`Consumer` and :class:`Aggregator` add the SEPA application pattern on
top of a JSAP; :class:`SyncSepaClient` serves scripts without asyncio. See README.md here for the
reconnection, sequence-number and error decisions.
"""

from gateway.client.agents import Aggregator, Consumer, Producer, client_for
from gateway.client.client import ClientSubscription, SepaClient
from gateway.client.errors import SepaClientError, SepaConnectionError
from gateway.client.inprocess import InProcessTransport
from gateway.client.network import NetworkTransport, ReconnectPolicy
from gateway.client.sync import SyncSepaClient, SyncSubscription
from gateway.client.transport import NotificationSink, Scheduled, Transport, TransportSubscription, UpdateSummary
from gateway.client.view import ResultView

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
