"""The gates on the network: the low-level aiohttp servers of the HTTP port and the WebSocket port."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import hdrs, web

from broker.delayed import DelayedUpdates
from broker.errors import Forbidden, InvalidRequest
from broker.gates.bodies import HeldBodies
from broker.gates.connections import ConnectionLimit
from broker.gates.dispatch import Dispatcher, Handler, Routes
from broker.gates.health import Health
from broker.gates.http import HttpGate
from broker.gates.quota import QuotaLimits, SubscriptionQuota
from broker.gates.replies import REPLIES_CUT
from broker.gates.secure import METRICS_PATH, SPUS_PATH, SUBSCRIBE_PATH, SecureGate
from broker.gates.slow import frame_budgets
from broker.gates.websocket import QUEUES_FULL, SLOW_SUBSCRIBERS, Connection, QueuedTotal, WebSocketGate, queued_shares
from broker.scheduler import Scheduler
from broker.security.authority import Authority
from broker.version import gateway_version

SPUS_PLAIN_PATH = "/spus"
SPUS_DEFAULT_LIMIT = 100
SPUS_MAX_LIMIT = 1000


@dataclass
class GateSettings:
    query_path: str = "/query"
    update_path: str = "/update"
    scheduled_path: str = "/scheduled"
    subscribe_path: str = "/subscribe"
    max_request_bytes: int = 1 << 20
    request_bytes_total: int | None = 32 << 20  # ...of every request in flight together (broker.gates.bodies)
    max_result_bytes: int = 32 << 20  # a query's response body at most (broker.gates.negotiation.serialize)
    reply_bytes_total: int | None = 64 << 20  # ...and left to write of every one together (broker.gates.replies)
    heartbeat_s: float = 30.0
    queue_limit: int = 10_000
    queue_rows: int | None = 200_000  # rows of the notifications queued for one client (Connection.push)
    queue_bytes: int | None = 64 << 20  # ...and characters of the messages queued
    queue_bytes_total: int | None = 64 << 20  # ...and of every socket's together (QueuedTotal)
    max_notification_bytes: int | None = 32 << 20  # characters of one notification's JSON text, at most
    max_message_bytes: int = 1 << 20
    cors_origins: tuple[str, ...] = ()
    # DNS names of this gateway besides localhost and the machine's name: a plain gate refuses (421) a
    # request whose Host names any other (DNS rebinding; broker.gates.dispatch)
    allowed_hosts: tuple[str, ...] = ()
    idle_timeout_s: float = 60.0
    request_timeout_s: float = 20.0
    max_connections: int = 0  # open on every gate together; 0: half the open-file limit (broker.gates.connections)
    max_connections_per_address: int = 256  # from one address off this board
    # a secure socket none of whose messages carried a valid token within this is closed (WebSocketGate)
    auth_timeout_s: float = 30.0
    subscription_limits: QuotaLimits = field(default_factory=QuotaLimits)


class Gates:
    """The plain gates over one scheduler and, with an `authority`, the secure gates (HTTPS + WSS,
    OAuth 2.0, JWT) over the same handlers."""

    def __init__(
        self, scheduler: Scheduler, settings: GateSettings | None = None, authority: Authority | None = None
    ) -> None:
        self.settings = settings or GateSettings()
        self.scheduler = scheduler
        self.counters: Counter[str] = Counter()
        self.connections = ConnectionLimit(
            self.counters,
            total=self.settings.max_connections,
            per_address=self.settings.max_connections_per_address,
        )
        self.frame_budgets = frame_budgets()  # WebSocket control frames per address (broker.gates.slow)
        # request bodies in flight on every gate (broker.gates.bodies)
        self.bodies = HeldBodies(self.settings.request_bytes_total, self.settings.max_request_bytes)
        # name -> numbers of the gateway's other parts (adapters...), shown as sepa_<name>_<key>
        self.metric_sources: dict[str, Callable[[], dict[str, object]]] = {}
        # /health: the store's check; the gateway's other parts add theirs (broker.gates.health)
        self.health = Health(scheduler)
        self.http = HttpGate(
            scheduler,
            self.counters,
            max_result_bytes=self.settings.max_result_bytes,
            reply_bytes_total=self.settings.reply_bytes_total,
        )
        self.quota = SubscriptionQuota(self.settings.subscription_limits)  # plain and secure together
        self.queued_shares = queued_shares()  # what an address's sockets queue, plain and secure together
        self.queued_total = QueuedTotal(self.settings.queue_bytes_total)  # ...and every socket, loopback too
        self.websocket = WebSocketGate(
            scheduler,
            self.counters,
            queue_limit=self.settings.queue_limit,
            queue_rows=self.settings.queue_rows,
            queue_bytes=self.settings.queue_bytes,
            max_notification_bytes=self.settings.max_notification_bytes,
            heartbeat_s=self.settings.heartbeat_s,
            max_message_bytes=self.settings.max_message_bytes,
            quota=self.quota,
            shares=self.queued_shares,
            total=self.queued_total,
        )
        # path -> GET handler of a page the appliance serves on the HTTP and HTTPS ports (add_page)
        self.pages: dict[str, Handler] = {}
        self.secure: SecureGate | None = None
        if authority is not None:
            secure_websocket = WebSocketGate(
                scheduler,
                self.counters,
                queue_limit=self.settings.queue_limit,
                queue_rows=self.settings.queue_rows,
                queue_bytes=self.settings.queue_bytes,
                max_notification_bytes=self.settings.max_notification_bytes,
                heartbeat_s=self.settings.heartbeat_s,
                max_message_bytes=self.settings.max_message_bytes,
                authenticate=authority.authenticate,
                still_valid=authority.still_valid,
                quota=self.quota,
                shares=self.queued_shares,
                total=self.queued_total,
                auth_timeout_s=self.settings.auth_timeout_s,
            )
            self.secure = SecureGate(self.http, secure_websocket, authority)
            self.metric_sources["security"] = lambda: {
                "registrations_refused_total": authority.registrations_refused.total,
                "auth_budget_addresses": len(authority.budget),  # addresses owing failures (at most 4,096)
                "auth_throttled_addresses": authority.budget.throttled(),  # ...and those refused now
            }
            scheduler.delayed.access_of = authority.access_of
            scheduler.delayed.standing = authority.standing
            scheduler.delayed.revoked = authority.tokens.revoked

    def add_page(self, path: str, handler: Handler) -> None:
        """Serve `handler` for GET (and HEAD) `path` on the HTTP port and, when secure, the HTTPS port.

        Why a hook: the gates own their ports and route tables, and what a page shows (the
        appliance's dashboard) is no business of the broker. A page is public static content: it
        is not authenticated here, so it must not hold data; the requests its script makes carry
        their own token to the secure routes. The handler can tell the ports apart by
        ``request.secure``. Call before the servers are built (``http_server``, ``https_server``).
        """
        if path in self.pages:
            raise ValueError(f"page {path} is added twice")
        self.pages[path] = handler

    def _add_pages(self, routes: Routes) -> None:
        for path, handler in self.pages.items():
            routes.get(path, handler)

    def _server(self, routes: Routes, *, secure: bool = False) -> web.Server:
        """The server of one gate; a plain one refuses requests for host names not ours, a secure
        one leaves that to TLS (a browser sends nothing once the certificate does not name the host
        it asked for), so names of the operator's certificate need no listing."""
        return Dispatcher(
            routes,
            self.counters,
            max_request_bytes=self.settings.max_request_bytes,
            cors_origins=self.settings.cors_origins,
            idle_timeout_s=self.settings.idle_timeout_s,
            request_timeout_s=self.settings.request_timeout_s,
            limit=self.connections,
            frame_budgets=self.frame_budgets,
            bodies=self.bodies,
            allowed_hosts=self.settings.allowed_hosts,
            refuse_foreign_hosts=not secure,
            no_store=secure,
        ).server()

    def http_server(self) -> web.Server:
        """Query, update, scheduled updates, subscribe (so a browser needs one origin), metrics and
        health; call with the event loop running."""
        routes = Routes()
        self.http.add_routes(routes, self.settings.query_path, self.settings.update_path, self.settings.scheduled_path)
        routes.get(self.settings.subscribe_path, self.websocket.handle)
        routes.get("/health", self.health.ready)
        routes.get("/health/live", self.health.live)
        routes.get("/metrics", self.metrics)
        routes.get(SPUS_PLAIN_PATH, self.spus)
        self._add_pages(routes)
        return self._server(routes)

    def https_server(self) -> web.Server:
        """The secure HTTP port: secure query, update, scheduled updates, OAuth, and secure subscribe."""
        assert self.secure is not None
        routes = Routes()
        self.secure.add_routes(routes)
        routes.get(METRICS_PATH, self.secure_metrics)
        routes.get(SPUS_PATH, self.secure_spus)
        self._add_pages(routes)
        return self._server(routes, secure=True)

    def wss_server(self) -> web.Server:
        """The secure WebSocket port: secure subscribe only."""
        assert self.secure is not None
        routes = Routes()
        routes.get(SUBSCRIBE_PATH, self.secure.websocket.handle)
        return self._server(routes, secure=True)

    @property
    def websocket_connections(self) -> list[Connection]:
        connections = list(self.websocket.connections)
        if self.secure is not None:
            connections += self.secure.websocket.connections
        return connections

    def websocket_server(self) -> web.Server:
        """Subscribe only; call with the event loop running."""
        routes = Routes()
        routes.get(self.settings.subscribe_path, self.websocket.handle)
        return self._server(routes)

    async def secure_metrics(self, request: web.BaseRequest) -> web.Response:
        """/metrics on the HTTPS port, for a token whose client may read every graph.

        Why that right: the samples name topics and resources of every sensor (bad input per
        topic) and count every client's subscriptions, so they are the operator's, and a client
        granted every graph is the operator's view of the store already.
        """
        assert self.secure is not None
        if self.secure.principal(request).access.read is not None:
            raise Forbidden("only a client that may read every graph may read the metrics")
        return await self.metrics(request)

    async def secure_spus(self, request: web.BaseRequest) -> web.Response:
        """/spus on the HTTPS port, for the clients that may read the metrics: the table names every
        client's subscription queries."""
        assert self.secure is not None
        if self.secure.principal(request).access.read is not None:
            raise Forbidden("only a client that may read every graph may read the SPU table")
        return await self.spus(request)

    async def spus(self, request: web.BaseRequest) -> web.Response:
        """The SPU table (broker.core.spu_table) as JSON: `?limit=N` rows at most (1..1000, 100 by
        default), the SPUs with the most subscriptions first."""
        raw = request.query.get("limit", str(SPUS_DEFAULT_LIMIT))
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 4) or not 1 <= int(raw) <= SPUS_MAX_LIMIT:
            raise InvalidRequest(f"limit must be an integer 1..{SPUS_MAX_LIMIT}")
        table = self.scheduler.engine.spus.table(int(raw))
        return web.json_response(table, headers={hdrs.CACHE_CONTROL: "no-store"})

    async def metrics(self, request: web.BaseRequest) -> web.Response:
        """Prometheus text format: uptime and version, engine stages and the reference broker's
        indicators, gate counters, scheduler admission, and every metric source."""
        engine = self.scheduler.engine
        stats = engine.stats
        lines = [
            f'sepa_build_info{{version="{label_value(gateway_version())}"}} 1',
            f"sepa_uptime_seconds {self.health.uptime_s:.3f}",
            f"sepa_updates_total {engine.stats.updates}",
            f"sepa_update_processing_seconds_min {stats.processing_min_s}",
            f"sepa_update_processing_seconds_avg {stats.processing_avg_s}",
            f"sepa_update_processing_seconds_max {stats.processing_max_s}",
            f"sepa_notifications_total {engine.stats.notifications}",
            f"sepa_lutt_hits_total {engine.stats.lutt_hits}",
            f"sepa_subscriptions_ended_total {engine.stats.subscriptions_ended}",
            f"sepa_lookups_offloaded_total {stats.lookups_offloaded}",
            f"sepa_lookups_timed_out_total {stats.lookups_timed_out}",
            f"sepa_subscriptions {engine.subscription_count}",
            f"sepa_subscriptions_max {stats.subscriptions_max}",
            f"sepa_ws_connections {len(self.websocket_connections)}",
            f"sepa_ws_slow_subscribers_disconnected_total {SLOW_SUBSCRIBERS.total}",
            f"sepa_ws_queued_bytes {self.queued_total.bytes}",
            f"sepa_ws_queues_full_disconnected_total {QUEUES_FULL.total}",
            f"sepa_http_reply_bytes {self.http.replies.bytes}",
            f"sepa_http_request_bytes {self.bodies.bytes}",
            f"sepa_http_replies_cut_total {REPLIES_CUT.total}",
            f"sepa_connections_open {self.connections.open}",
            f"sepa_scheduler_in_flight {self.scheduler.in_flight}",
            f"sepa_scheduler_rejected_total {self.scheduler.rejected}",
            f"sepa_query_client_share {self.scheduler.shares.share}",
            f"sepa_query_client_share_waits_total {self.scheduler.shares.waits}",
        ]
        lines += delayed_metrics(self.scheduler.delayed)
        quota = self.quota
        lines += [f"sepa_ws_subscription_clients {len(quota.count)}", f"sepa_ws_subscription_bytes {quota.total_bytes}"]
        lines.append(f'sepa_engine_info{{mode="{engine.mode}"}} 1')
        lines += [f"sepa_parallel_{name} {value}" for name, value in engine.spus.metrics().items()]
        if engine.workers is not None:
            lines.append(f"sepa_query_workers {engine.workers.count}")
            lines += [f"sepa_query_worker_{name}_total {value}" for name, value in sorted(engine.workers.stats.items())]
        if engine.reevaluators is not None:
            reevaluators = engine.reevaluators
            lines.append(f"sepa_reeval_workers {reevaluators.running}")  # on demand: 0 at rest
            lines.append(f"sepa_reeval_updates_queued {engine.spus.reevaluations_queued}")
            lines += [f"sepa_reeval_worker_{name}_total {value}" for name, value in sorted(reevaluators.stats.items())]
        for source, numbers in self.metric_sources.items():
            for key, value in numbers().items():
                if isinstance(value, bool | int | float):
                    lines.append(f"sepa_{source}_{key} {float(value) if isinstance(value, bool) else value}")
                elif isinstance(value, dict):  # counts per source (topic, resource): one labelled series each
                    lines += [
                        f'sepa_{source}_{key}{{source="{label_value(label)}"}} {count}'
                        for label, count in sorted(value.items())
                        if isinstance(count, int | float)
                    ]
        lines += [
            f'sepa_stage_seconds_total{{stage="{name[:-2]}"}} {value}' for name, value in engine.stats.timers.items()
        ]
        if self.secure is not None:  # why authentications failed (broker.security.authority FAILURE_REASONS)
            lines += [
                f'sepa_security_auth_failures_total{{reason="{reason}"}} {count}'
                for reason, count in sorted(self.secure.authority.failures.items())
            ]
        for key, value in sorted(self.counters.items()):
            name, _, status = key.partition(":")
            if status:
                lines.append(f'sepa_errors_total{{error="{name}",status="{status}"}} {value}')
            else:
                lines.append(f"sepa_{name}_total {value}")
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def close_connections(self) -> None:
        """Close every WebSocket with 1001 (going away); their subscriptions end."""
        for connection in self.websocket_connections:
            connection.closing = True
            await connection.ws.close(code=1001, message=b"gateway shutting down")


# what splits a line for some reader (str.splitlines: CR, VT, FF, FS-US, NEL, U+2028/9) and other
# control characters: a label value is for people, and a CoAP path from any LAN host is one
_UNPRINTABLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
LABEL_CHARS = 200


def label_value(value: object) -> str:
    """A Prometheus label value: backslash, double quote and line feed escaped (text format 0.0.4),
    other control characters made "?", and cut to LABEL_CHARS with a digest of the whole, so that
    two values sharing their start stay two series. Why: a CoAP path with carriage returns around
    `sepa_mqtt_readings 999999` printed a sample of its own for any reader splitting lines at CR
    (tools.launcher's did)."""
    text = _UNPRINTABLE.sub("?", str(value))
    if len(text) > LABEL_CHARS:
        digest = hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:12]
        text = f"{text[: LABEL_CHARS - 16]}...{digest}"
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def delayed_metrics(delayed: DelayedUpdates) -> list[str]:
    """The delayed-update timer on /metrics: pending, outcomes, and how late updates ran."""
    stats = delayed.stats
    lines = [
        f"sepa_delayed_pending {delayed.count}",
        f"sepa_delayed_scheduled_total {stats.scheduled}",
        f"sepa_delayed_fired_total {stats.fired}",
        f"sepa_delayed_failed_total {stats.failed}",
        f"sepa_delayed_cancelled_total {stats.cancelled}",
        f"sepa_delayed_recovered_total {stats.recovered}",
        f"sepa_delayed_abandoned_total {stats.abandoned}",
        f"sepa_delayed_revoked_total {stats.revoked}",
        f"sepa_delayed_lateness_max_seconds {stats.max_lateness_us / 1e6}",
    ]
    samples = sorted(stats.lateness_us)
    for quantile in (0.5, 0.99):
        if samples:
            value = samples[min(len(samples) - 1, int(quantile * len(samples)))] / 1e6
            lines.append(f'sepa_delayed_lateness_seconds{{quantile="{quantile}"}} {value}')
    return lines
