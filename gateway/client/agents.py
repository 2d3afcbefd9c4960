"""Producer, Consumer, Aggregator: the SEPA application pattern (seed 000 §5, "APCI") over a JSAP.

Why these three and nothing else: a SEPA application is a set of agents, each tied to one JSAP
primitive: a producer to an update, a consumer to a subscription, an aggregator to a
(subscription, update) pair whose notifications drive updates. Producers and consumers stay
trivial so that they can be shared between applications; aggregators hold the application logic.
The MQTT/CoAP adapters and the cloud shipper are built from these classes (ARCHITECTURE.md
principle 1), over the in-process transport; external applications use the same classes over the
network transport (:func:`client_for`).

The SPARQL text always comes from the JSAP: ``jsap.update_text(id, bindings)`` /
``jsap.query_text(id, bindings)`` prepend the namespaces and substitute forced bindings safely
(no injection), and ``jsap.graphs_for(id)`` gives the protocol graphs of that entry.

An update entry with a ``delay`` (``jsap.update_delay(id)``) is a delayed update (seed 001 §II-C):
its producer schedules it on the broker, which runs it when due, and gets a
:class:`~gateway.client.transport.Scheduled` back instead of an UpdateSummary. That is how an
aggregator detects that something did *not* happen within an interval (event negation, §II-D):
the delayed update's WHERE clause matches only if the state it saw is still there when it runs,
so the application keeps no timers.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from broker.api import Notification, Term
from gateway.client.client import ClientSubscription, SepaClient, rows_as_bindings
from gateway.client.delays import Delay, delay_param
from gateway.client.errors import SepaClientError
from gateway.client.network import NetworkTransport, ReconnectPolicy
from gateway.client.oauth import OAuthSession
from gateway.client.transport import Scheduled, UpdateSummary

log = logging.getLogger(__name__)

Bindings = dict[str, Term]
BindingsHandler = Callable[[list[Bindings]], Awaitable[None] | None]
NotificationMapper = Callable[[Notification], Mapping[str, Any] | Sequence[Mapping[str, Any]] | None | Awaitable[Any]]


class JsapLike(Protocol):
    """What the agents use of :class:`gateway.jsap.Jsap` (structural: any object with these members)."""

    extended: Any

    def query_text(self, id: str, bindings: Mapping[str, Any] | None = None) -> str: ...

    def update_text(self, id: str, bindings: Mapping[str, Any] | None = None) -> str: ...

    def query_url(self, id: str | None = None) -> str: ...

    def update_url(self, id: str | None = None) -> str: ...

    def subscribe_url(self, id: str | None = None) -> str: ...

    def graphs_for(self, id: str, kind: str | None = None) -> Mapping[str, Any]: ...

    def update_delay(self, id: str) -> str | None: ...


class FromJsap(enum.Enum):
    """The type of :data:`FROM_JSAP`, the default of a producer's `delay`: the JSAP entry's own."""

    DELAY = "the JSAP entry's delay"


FROM_JSAP = FromJsap.DELAY


async def _maybe_await(outcome: Any) -> Any:
    return await outcome if inspect.isawaitable(outcome) else outcome


class Producer:
    """Publishes one JSAP update with per-call forced bindings, at once or delayed.

    `delay` defaults to the entry's JSAP ``delay`` (:data:`FROM_JSAP`); pass None to apply a
    delayed entry at once, or a delay (int milliseconds, timedelta, ISO 8601 duration) to override
    it. A bad delay is refused here (SepaClientError invalid_request), before anything is sent.
    """

    def __init__(
        self,
        client: SepaClient,
        jsap: JsapLike,
        update_id: str,
        *,
        bindings: Mapping[str, Any] | None = None,
        delay: Delay | FromJsap | None = FROM_JSAP,
    ) -> None:
        self.client = client
        self.jsap = jsap
        self.update_id = update_id
        self.defaults = dict(bindings or {})
        graphs = jsap.graphs_for(update_id, "update")
        self._using = graphs.get("using-graph-uri")
        self._using_named = graphs.get("using-named-graph-uri")
        chosen = jsap.update_delay(update_id) if delay is FROM_JSAP else delay
        self.delay: str | None = None if chosen is None else delay_param(chosen)  # the wire's `delay`

    async def produce(self, **bindings: Any) -> UpdateSummary | Scheduled:
        """Substitute `bindings` (over the defaults) into the update and apply or schedule it.

        Raises SepaClientError if the broker refuses it, ValueError (JsapError) if a binding cannot
        be written safely. Without a delay, returns the UpdateSummary after the broker's end of
        processing; with one, the :class:`Scheduled` update once the broker has stored it.
        """
        sparql = self.jsap.update_text(self.update_id, {**self.defaults, **bindings})
        if self.delay is None:
            return await self.client.update(
                sparql, using_graph_uri=self._using, using_named_graph_uri=self._using_named
            )
        return await self.client.update(
            sparql, using_graph_uri=self._using, using_named_graph_uri=self._using_named, delay=self.delay
        )


class Consumer:
    """Subscribes to one JSAP query and dispatches its notifications.

    The rows of the first notification go to `on_first` (to `on_added` when no `on_first` is
    given); later notifications call `on_removed` then `on_added`, each only with a non-empty list
    of bindings ({variable: term}). Callbacks may be plain functions or coroutine functions.
    Subclasses override :meth:`on_notification` for anything else (ASK queries, the view...).
    """

    def __init__(
        self,
        client: SepaClient,
        jsap: JsapLike,
        query_id: str,
        *,
        bindings: Mapping[str, Any] | None = None,
        alias: str | None = None,
        on_added: BindingsHandler | None = None,
        on_removed: BindingsHandler | None = None,
        on_first: BindingsHandler | None = None,
    ) -> None:
        self.client = client
        self.jsap = jsap
        self.query_id = query_id
        self.bindings = dict(bindings or {})
        self.alias = alias if alias is not None else query_id
        self._on_added = on_added
        self._on_removed = on_removed
        self._on_first = on_first
        self.subscription: ClientSubscription | None = None

    async def start(self) -> ClientSubscription:
        """Subscribe; returns once the first result is in the view (its callback runs right after)."""
        if self.subscription is not None:
            return self.subscription
        graphs = self.jsap.graphs_for(self.query_id, "query")
        self.subscription = await self.client.subscribe(
            self.jsap.query_text(self.query_id, self.bindings),
            self.alias,
            default_graph_uri=graphs.get("default-graph-uri"),
            named_graph_uri=graphs.get("named-graph-uri"),
            on_notification=self.on_notification,
        )
        return self.subscription

    async def stop(self) -> None:
        if self.subscription is not None:
            subscription, self.subscription = self.subscription, None
            await self.client.unsubscribe(subscription)

    @property
    def view(self) -> Any:
        """The subscription's current result (a ResultView), None before start()."""
        return None if self.subscription is None else self.subscription.view

    async def on_notification(self, notification: Notification) -> None:
        """Default dispatch to on_first / on_removed / on_added (see the class docstring)."""
        added = rows_as_bindings(notification.variables, notification.added)
        if notification.sequence == 0:
            handler = self._on_first or self._on_added
            if handler is not None and (added or self._on_first is not None):
                await _maybe_await(handler(added))
            return
        removed = rows_as_bindings(notification.variables, notification.removed)
        if removed and self._on_removed is not None:
            await _maybe_await(self._on_removed(removed))
        if added and self._on_added is not None:
            await _maybe_await(self._on_added(added))

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class Aggregator(Consumer):
    """A subscription whose notifications drive an update (seed 000 §5: subscribe + update).

    By default every notification (sequence 0 included: what was already there when the
    aggregator started is usually work to do too) is passed to `mapper`, which returns the forced
    bindings of one update, a list of them (one update each, in order), or None for no update; it
    may be a coroutine function. Subclasses override :meth:`on_notification` instead and call
    :meth:`produce`. Updates run one at a time in notification order; a refused update is logged
    and counted in `failures`, and the aggregator carries on with the next notification. A delayed
    update entry (JSAP ``delay``, or `delay` here) is scheduled rather than applied: :meth:`produce`
    then returns its :class:`Scheduled`.
    """

    def __init__(
        self,
        client: SepaClient,
        jsap: JsapLike,
        query_id: str,
        update_id: str,
        *,
        mapper: NotificationMapper | None = None,
        query_bindings: Mapping[str, Any] | None = None,
        update_bindings: Mapping[str, Any] | None = None,
        alias: str | None = None,
        delay: Delay | FromJsap | None = FROM_JSAP,
    ) -> None:
        super().__init__(client, jsap, query_id, bindings=query_bindings, alias=alias)
        self.producer = Producer(client, jsap, update_id, bindings=update_bindings, delay=delay)
        self.mapper = mapper
        self.produced = 0
        self.failures = 0

    async def produce(self, **bindings: Any) -> UpdateSummary | Scheduled | None:
        """Apply (or schedule, when delayed) the aggregator's update; None (logged) if it was refused."""
        return await self.produce_with(self.producer, bindings)

    async def produce_with(self, producer: Producer, bindings: Mapping[str, Any]) -> UpdateSummary | Scheduled | None:
        """:meth:`produce` with another producer: for aggregators whose notifications drive several
        updates (e.g. one applied at once, one delayed), all counted and logged alike."""
        try:
            summary = await producer.produce(**bindings)
        except (SepaClientError, ValueError) as error:
            self.failures += 1
            log.error("aggregator %s: update %s failed: %s", self.alias, producer.update_id, error)
            return None
        self.produced += 1
        return summary

    async def on_notification(self, notification: Notification) -> None:
        if self.mapper is None:
            return
        outcome = await _maybe_await(self.mapper(notification))
        if outcome is None:
            return
        for bindings in [outcome] if isinstance(outcome, Mapping) else outcome:
            await self.produce(**bindings)


def client_for(
    jsap: JsapLike,
    id: str | None = None,
    *,
    reconnect: ReconnectPolicy | None = None,
    identity: str | None = None,
    credentials_file: str | None = None,
    **options: Any,
) -> SepaClient:
    """A network client for the broker a JSAP describes (for entry `id`'s per-entry overrides).

    With `id` the URLs of that query or update entry are used (a query id gives its query and
    subscribe URLs; the update URL comes from the same entry if it is an update, else the JSAP's
    default); without, the JSAP's defaults. With an `identity` and the JSAP's ``oauth.enable``, the
    client registers, keeps its credentials (`credentials_file`) and sends tokens
    (:mod:`gateway.client.oauth`; pass ``ssl=tls(cafile=...)`` for a self-signed gateway).
    `options` go to :class:`NetworkTransport`.
    """
    urls = []
    for method in (jsap.query_url, jsap.update_url, jsap.subscribe_url):
        urls.append(_url(method, id))
    if reconnect is None and getattr(jsap, "reconnect", True) is False:
        reconnect = ReconnectPolicy(enabled=False)
    oauth = getattr(jsap, "oauth", None)
    if identity is not None and oauth is not None and oauth.enable:
        options["oauth"] = OAuthSession(
            oauth.register, oauth.token_request, identity, credentials_file=credentials_file
        )
    return SepaClient(NetworkTransport(*urls, reconnect=reconnect, **options))


def _url(method: Callable[..., str], id: str | None) -> str:
    """The entry's URL when `id` belongs to that kind of entry, else the JSAP default."""
    if id is not None:
        try:
            return method(id)
        except (KeyError, ValueError):
            pass  # e.g. update_url of a query id: the default update URL
    return method(None)
