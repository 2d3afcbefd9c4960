"""The transport protocol: what a client needs from a broker, whatever carries the requests.

Why a protocol with two implementations (ARCHITECTURE.md principle 1, adapters are clients): the
MQTT/CoAP adapters and the cloud shipper run inside the gateway process and must not pay for
sockets and JSON, while external applications talk to a broker over the network; both must see
exactly the same API and the same result objects, so every feature an adapter needs is one every
user gets. Queries return the engine's :class:`~broker.core.results.QueryResult`, notifications
are the engine's :class:`~broker.core.notification.Notification`, updates an
:class:`UpdateSummary`, delayed updates (seed 001 §II-C) a :class:`Scheduled`.

A transport only moves requests and notifications. Sequence numbers as the application sees
them, the result view and the resynchronisation after a reconnect live in the client
(:mod:`gateway.client.client`), so they are the same code for every transport.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from broker.api import Notification, QueryResult, Update, UpdateResult
from gateway.client.errors import SepaClientError


@dataclass(frozen=True, slots=True)
class UpdateSummary:
    """What an update changed, as the broker acknowledged it (after end of processing).

    `added` / `removed` count the quads really added and removed (docs/protocol.md: the reply counts
    them); `notifications` is how many notifications the update produced (0 when the broker does
    not say). `result` is the broker's :class:`UpdateResult` with the quads themselves when the
    update was sent with ``quads=True``, by every transport alike (the MQTT adapter moves its mirror
    of the latest view with them), else None.
    """

    added: int
    removed: int
    notifications: int = 0
    result: UpdateResult | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, result: UpdateResult, *, quads: bool = False) -> UpdateSummary:
        return cls(len(result.added), len(result.removed), result.notifications, result if quads else None)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A delayed update the broker accepted: it runs at `due` (UTC), through the broker's own timer.

    Why a type of its own rather than an UpdateSummary with zero counts: a scheduled update has not
    run yet, so nothing was added or removed; what the application holds is a handle (`id`) to list
    or cancel it. The members are the ones the broker reports for the request that produced the
    object, identically over both transports: scheduling and cancelling report `id` and `due`;
    listing (:meth:`~gateway.client.SepaClient.scheduled`) also the SPARQL `update` and when it
    was scheduled (`created`).
    """

    id: str
    due: datetime
    update: str | None = None
    created: datetime | None = None

    @staticmethod
    def instant(micros: int) -> datetime:
        """Unix microseconds as a UTC datetime (exact: no float on the way)."""
        return _EPOCH + timedelta(microseconds=micros)


class NotificationSink(Protocol):
    """Where a transport delivers one subscription's notifications (on the event loop)."""

    def notify(self, notification: Notification, *, resync: bool) -> None:
        """A notification in server order. `resync` marks the complete result (sequence 0) sent
        again after a re-subscription: the receiver diffs it against what it holds."""

    def lost(self, error: SepaClientError) -> None:
        """The subscription ended without being asked to (reconnection given up, re-subscribe refused)."""


@dataclass(eq=False)
class TransportSubscription:
    """A transport's handle of one live subscription.

    `spuid` is the broker's current identifier; it changes when the network transport
    re-subscribes after a reconnection, so callers keep this handle, never the string.
    """

    sparql: str
    sink: NotificationSink
    alias: str | None = None
    default_graph_uri: tuple[str, ...] = ()
    named_graph_uri: tuple[str, ...] = ()
    spuid: str = ""
    active: bool = True
    state: Any = None  # the transport's own bookkeeping


@runtime_checkable
class Transport(Protocol):
    """The four operations of the SPARQL 1.1 SE Protocol, delayed updates, and close."""

    async def query(
        self, sparql: str, *, default_graph_uri: Sequence[str] = (), named_graph_uri: Sequence[str] = ()
    ) -> QueryResult:
        """Evaluate a query (SELECT, ASK, CONSTRUCT, DESCRIBE); raises SepaClientError."""
        ...

    async def update(
        self,
        sparql: str | Update,
        *,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
        quads: bool = False,
    ) -> UpdateSummary:
        """Apply an update; returns after the broker's end of processing; raises SepaClientError.
        With `quads`, the summary carries the quads really added and removed (UpdateSummary.result).

        An Update syntax tree is handed to an in-process engine as is; a transport that sends text
        sends its `to_sparql()`.
        """
        ...

    async def schedule(
        self,
        sparql: str,
        *,
        delay: str | None = None,
        at: str | None = None,
        using_graph_uri: Sequence[str] = (),
        using_named_graph_uri: Sequence[str] = (),
    ) -> Scheduled:
        """Have the broker apply an update later; returns once it is checked and stored.

        `delay` (milliseconds or an ISO 8601 duration) or `at` (RFC 3339) are the wire's
        parameters, already validated by the client; raises SepaClientError.
        """
        ...

    async def scheduled(self) -> list[Scheduled]:
        """The broker's pending delayed updates, in due order (with their SPARQL)."""
        ...

    async def cancel_scheduled(self, id: str) -> Scheduled:
        """Cancel a pending delayed update; SepaClientError not_found (404) when it is unknown or ran."""
        ...

    async def subscribe(
        self,
        sparql: str,
        sink: NotificationSink,
        *,
        alias: str | None = None,
        default_graph_uri: Sequence[str] = (),
        named_graph_uri: Sequence[str] = (),
    ) -> TransportSubscription:
        """Subscribe; the sequence-0 notification has been given to `sink` when this returns."""
        ...

    async def unsubscribe(self, subscription: TransportSubscription) -> None:
        """End a subscription; no notification reaches its sink after this returns."""
        ...

    async def close(self) -> None:
        """End every subscription and release sockets and threads."""
        ...
