"""The appliance's lifecycle: build store, engine, scheduler and gates from the config, serve
until SIGTERM/SIGINT, then finish in-flight updates, close sockets cleanly and flush the store."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import ssl
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiohttp import web

from broker.api import (
    Compactor,
    Engine,
    Gates,
    GateSettings,
    Headroom,
    PendingUpdates,
    QueryWorkers,
    QuotaLimits,
    RdfStore,
    Scheduler,
)
from gateway.appliance.collector import release_after_stop, settle_after_start
from gateway.appliance.config import Config
from gateway.appliance.cores import pin_threads
from gateway.appliance.health import ClockFloor, add_checks
from gateway.appliance.listen import ACCEPT_ERRORS, Handshakes, TimedTlsSite, quiet_accept_errors
from gateway.appliance.plugins import Adapter, AdapterContext, adapter_plugins
from gateway.appliance.retention import Retention
from gateway.appliance.security import SecureParts, secure_parts
from gateway.client import InProcessTransport, SepaClient
from gateway.dashboard import Dashboard, DashboardPaths
from gateway.observations import ontology_update
from gateway.observations.writer import ObservationWriter

if TYPE_CHECKING:
    from gateway.shipper.shipper import Shipper

log = logging.getLogger("sepa_gateway")


class StartupError(Exception):
    """The gateway cannot start (port in use, data directory unusable...): one line for the operator.

    `transient` when starting again may succeed with nothing changed: the installed unit restarts
    exit 1 and not exit 2 (RestartPreventExitStatus=2), so a bad configuration is not retried for
    ever, while an address the board does not hold yet (DHCP still at work at boot) or a fork the
    board had no memory for is."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient

    @property
    def exit_status(self) -> int:
        return 1 if self.transient else 2


TRANSIENT_ERRNOS = frozenset({errno.EADDRNOTAVAIL, errno.EAGAIN, errno.ENOMEM})


def _transient(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS


class Gateway:
    def __init__(self, config: Config) -> None:
        """Build every part from `config`; what was opened is closed again if a later part fails.

        Why: a configuration refused here (a [shipper] on an in-memory store, an adapter that cannot
        be built) left the query workers it had started running, and the store open: in a process
        that goes on (tests, an embedding application) they outlived the refusal (2026-12-07: two
        `broker.workers.replica` processes per refusal, found by tests/support/leftovers.py)."""
        with contextlib.ExitStack() as opened:
            self.config = config
            clock = ClockFloor(config.store.data_dir)  # before the store writes anything (its docstring says why)
            self.store = (
                RdfStore.open(config.store.data_dir, resident=config.store.resident)
                if config.store.data_dir
                else RdfStore.memory()
            )
            opened.callback(self.store.close)
            # the floor under which the store may not grow; the store is given it once started
            headroom = self.headroom = Headroom((config.store.memory_floor_mb << 20) or None)
            self.workers = _started_pool(self.store, config, config.engine.query_workers, "worker")
            opened.callback(self.workers.close)
            # a pool of its own: 1,000 re-evaluations queued for one update must not wait ahead of other
            # clients' queries in the query workers (broker.core.spu_manager, SpuManager.submit); started
            # by the first network subscription that is re-evaluated, stopped a minute after the last
            self.reevaluators: QueryWorkers | None = None
            if config.engine.reeval_workers and config.engine.mode in ("sequential", "incremental"):
                self.reevaluators = _started_pool(
                    self.store, config, config.engine.reeval_workers, "reeval", on_demand=True
                )
                opened.callback(self.reevaluators.close)
            self.compactor = Compactor(self.store)
            self.compactor.start()
            opened.callback(self.compactor.close)
            self.gateway_id = config.observations.gateway_id or socket.gethostname()
            self.engine = Engine(
                self.store,
                workers=self.workers,
                base_iri=config.engine.base_iri or f"urn:sepa-gateway:{quote(self.gateway_id, safe='')}/",
                mode=config.engine.mode,
                boosters=config.engine.workers or max(1, len(os.sched_getaffinity(0)) - 1),
                allow_load=config.engine.allow_load,
                service_allow=config.engine.service_allow,
                service_timeout_s=config.engine.service_timeout_s,
                reevaluators=self.reevaluators,
                max_update_quads=config.engine.max_update_quads,
                max_subscription_rows=config.websocket.max_subscription_rows,
                max_held_rows=config.websocket.max_held_rows,
                max_held_rows_per_client=config.websocket.max_held_rows_per_client,
                max_reeval_seconds_per_client=config.websocket.max_reeval_seconds_per_client or None,
            )
            opened.callback(self.engine.close)  # its BOOSTER workers (parallel mode)
            self.pending = PendingUpdates(config.store.data_dir or None)
            opened.callback(self.pending.close)
            self.scheduler = Scheduler(
                self.engine,
                queue_size=config.scheduler.queue_size,
                query_threads=config.scheduler.query_threads,
                pending=self.pending,
                max_pending=config.scheduler.max_pending,
                max_pending_bytes=config.scheduler.max_pending_bytes,
                max_pending_per_client=config.scheduler.max_pending_per_client,
                max_pending_bytes_per_client=config.scheduler.max_pending_bytes_per_client,
            )
            self.secure: SecureParts | None = None
            if config.security.enabled:
                try:
                    self.secure = secure_parts(config, self.gateway_id)
                except (OSError, ValueError, ssl.SSLError) as error:
                    raise StartupError(f"cannot set up the secure gates: {error}") from error
                if self.secure.temporary is not None:
                    opened.callback(self.secure.temporary.cleanup)
            self.gates = Gates(
                self.scheduler,
                GateSettings(
                    query_path=config.http.query_path,
                    update_path=config.http.update_path,
                    scheduled_path=config.http.scheduled_path,
                    subscribe_path=config.websocket.path,
                    max_request_bytes=config.http.max_request_bytes,
                    request_bytes_total=config.http.request_bytes_total,
                    max_result_bytes=config.http.max_result_bytes,
                    reply_bytes_total=config.http.reply_bytes_total,
                    heartbeat_s=config.websocket.heartbeat_s,
                    queue_limit=config.websocket.queue_limit,
                    queue_rows=config.websocket.queue_rows,
                    queue_bytes=config.websocket.queue_bytes,
                    queue_bytes_total=config.websocket.queue_bytes_total,
                    max_notification_bytes=config.websocket.max_notification_bytes,
                    max_message_bytes=config.websocket.max_message_bytes,
                    subscription_limits=QuotaLimits(
                        per_client=config.websocket.max_subscriptions_per_client,
                        per_client_bytes=config.websocket.max_subscription_bytes_per_client,
                        total=config.websocket.max_subscriptions,
                        total_bytes=config.websocket.max_subscription_bytes,
                    ),
                    cors_origins=tuple(config.http.cors_origins),
                    allowed_hosts=tuple(config.http.allowed_hosts),
                    idle_timeout_s=config.http.idle_timeout_s,
                    request_timeout_s=config.http.request_timeout_s,
                    max_connections=config.http.max_connections,
                    max_connections_per_address=config.http.max_connections_per_address,
                    auth_timeout_s=config.security.auth_timeout_s,
                ),
                authority=self.secure.authority if self.secure is not None else None,
            )
            paths = DashboardPaths(  # where the plain gates serve what the page uses
                query=config.http.query_path,
                update=config.http.update_path,
                scheduled=config.http.scheduled_path,
                subscribe=config.websocket.path,
            )
            if config.http.dashboard:  # `/` on the HTTP port, and on the HTTPS port when secure
                Dashboard(paths).add_to(self.gates)
            self.gates.metric_sources["store"] = lambda: {
                "garbage_quads": self.store.garbage,
                **self.compactor.stats,
                **headroom.metrics(),
            }
            self.runners: list[web.BaseRunner] = []
            self.ports: dict[str, int] = {}  # what each gate listens on (port 0 in the config: the OS chose)
            self.stopped = asyncio.Event()
            self.exit_status = 0  # 1 once the store failed: the service manager starts the gateway again
            # the gateway's own agents (ARCHITECTURE.md principle 1): clients of the in-process transport
            self.client = SepaClient(InProcessTransport(self.scheduler))
            self.shipper: Shipper | None = None
            if config.shipper.enabled:
                from gateway.appliance.shipping import build_shipper

                self.shipper = build_shipper(config, self.client, self.gateway_id)
                self.gates.metric_sources["shipper"] = self.shipper.metrics
            shipper = self.shipper
            # the adapter plug-ins (gateway.appliance.plugins), in name order, each under its own name
            writer = ObservationWriter(
                self.client,
                self.gateway_id,
                max_nodes=config.observations.max_sensor_properties,
                max_nodes_per_sensor=config.observations.max_properties_per_sensor,
                max_nodes_per_device=config.observations.max_properties_per_device,
                max_nodes_per_mapping=config.observations.max_properties_per_mapping,
            )
            self.retention = Retention(
                self.client,
                config.observations,
                hold=None if shipper is None else lambda: shipper.holding,
                writer=writer,
            )
            self.peer_client = SepaClient(InProcessTransport(self.scheduler, trusted=False))
            context = AdapterContext(
                self.client, self.gateway_id, config.store.data_dir, writer, config.security.enabled, self.peer_client
            )
            self.adapters: dict[str, Adapter] = {}
            for name, plugin in adapter_plugins().items():
                section = config.adapter(name)
                if section.enabled:
                    self.adapters[name] = adapter = plugin.build(section, context)
                    self.gates.metric_sources[name] = adapter.metrics
            self.gates.metric_sources["retention"] = self.retention.metrics
            self.handshakes = Handshakes()
            handshakes = self.handshakes
            self.gates.metric_sources["listen"] = lambda: {"accept_errors": ACCEPT_ERRORS.total, **handshakes.metrics()}
            add_checks(self.gates, self.adapters, self.shipper, config.shipper.spool_budget_bytes, clock)
            opened.pop_all()  # built: Gateway.stop closes it all from now on

    async def start(self) -> list[str]:
        """Run the delayed updates that fell due while stopped, listen on the HTTP and WebSocket ports;
        returns the URLs served. Whatever fails on the way, what was started is stopped (workers,
        listeners, store) before the error goes on: see :meth:`__init__` for why."""
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> list[str]:
        quiet_accept_errors(asyncio.get_running_loop())
        await self.scheduler.delayed.start()
        await self.client.update(ontology_update())
        host = self.config.http.host
        plan: list[tuple[web.Server, str, int, ssl.SSLContext | None]] = [
            (self.gates.http_server(), host, self.config.http.port, None),
            (self.gates.websocket_server(), host, self.config.websocket.port, None),
        ]
        security = self.config.security
        if self.secure is not None:
            context = self.secure.ssl_context
            plan.append((self.gates.https_server(), security.host, security.https_port, context))
            plan.append((self.gates.wss_server(), security.host, security.wss_port, context))
        if not _loopback(host):  # with [security] too: the secure gates do not guard the plain ones
            log.warning(
                "INSECURE: the plain gates listen on a network address without authentication; anyone on "
                "the network can read and change the store. Bind http.host to 127.0.0.1"
                + ("" if self.secure is not None else " or enable [security]"),
                extra={"host": host},
            )
        bound: list[int] = []
        for server, address, port, context in plan:
            runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=HANDLERS_WAIT_S)
            await runner.setup()
            self.runners.append(runner)
            try:
                limit_s = self.config.http.request_timeout_s  # the TLS handshake's too
                listening = TimedTlsSite(
                    runner,
                    address,
                    port,
                    reuse_address=True,
                    ssl_context=context,
                    handshake_timeout_s=limit_s,
                    handshakes=self.handshakes,
                )
                await listening.start()
            except OSError as error:
                raise StartupError(
                    f"cannot listen on {address}:{port}: {error.strerror or error}", transient=_transient(error)
                ) from error
            bound.append(runner.addresses[0][1] if runner.addresses else port)  # port 0: the one the OS chose
        http_port, ws_port = bound[:2]
        self.ports = {"http": http_port, "websocket": ws_port}
        if self.shipper is not None:  # before the adapters: it counts what is in the store first
            await self.shipper.start()
        for name, adapter in self.adapters.items():
            try:
                await adapter.start()
            except Exception as error:  # noqa: BLE001 - a port taken, TLS files it cannot load...: one line, exit 2
                # Why every exception: the MQTT adapter's MqttError (a TLS file it could not load)
                # escaped as a 45-line traceback, and systemd restarted the gateway in a loop
                said = str(error)
                line = said if said.startswith(f"{name}:") else f"{name}: {said}"
                raise StartupError(line, transient=_transient(error)) from error
        self.retention.start()
        # from now on (broker.headroom): the start-up's own writes (the ontology, the adapters'
        # mappings) are not refused, so a board short of memory at boot still starts and serves
        self.store.headroom = self.headroom
        settle_after_start()  # what start-up built lives as long as the gateway: see gateway.appliance.collector
        shown = "localhost" if host in ("0.0.0.0", "::") else host
        http = f"http://{shown}:{http_port}"
        secure_urls: list[str] = []
        if self.secure is not None:
            self.ports.update(https=bound[2], wss=bound[3])
            self.gates.secure.start()  # type: ignore[union-attr]
            log.info(
                "secure gates",
                extra={
                    "tls_fingerprint_sha256": self.secure.tls.fingerprint,
                    "certificate": str(self.secure.tls.cert),
                    "generated": self.secure.tls.generated,
                    "security_dir": str(self.secure.directory) if self.secure.temporary is None else "temporary",
                },
            )
            secure_shown = "localhost" if security.host in ("0.0.0.0", "::") else security.host
            secure_urls = [
                f"https://{secure_shown}:{bound[2]}/secure/query",
                f"https://{secure_shown}:{bound[2]}/secure/update",
                f"wss://{secure_shown}:{bound[3]}/secure/subscribe",
                f"https://{secure_shown}:{bound[2]}/oauth/register",
                f"https://{secure_shown}:{bound[2]}/oauth/token",
            ]
        return [
            f"{http}{self.config.http.query_path}",
            f"{http}{self.config.http.update_path}",
            f"ws://{shown}:{ws_port}{self.config.websocket.path}",
            f"ws://{shown}:{http_port}{self.config.websocket.path}",
            f"{http}/metrics",
            f"{http}{self.config.http.scheduled_path}",
            *secure_urls,
            *(url for adapter in self.adapters.values() for url in getattr(adapter, "urls", list)()),
        ]

    async def stop(self) -> None:
        release_after_stop()
        if self.gates.secure is not None:
            await self.gates.secure.stop()
        await self.retention.stop()
        for adapter in reversed(self.adapters.values()):
            await adapter.stop()
        if self.shipper is not None:
            await self.shipper.stop()
        await self.peer_client.close()
        await self.client.close()
        await self.scheduler.delayed.stop()
        await self.gates.close_connections()
        await self._finish_updates()
        await asyncio.gather(*(runner.cleanup() for runner in self.runners))  # each waits HANDLERS_WAIT_S at most
        self.runners.clear()
        await asyncio.get_running_loop().run_in_executor(None, self.scheduler.close)
        await asyncio.get_running_loop().run_in_executor(None, self.compactor.close)
        self.pending.close()
        # RocksDB flushed, resident written as a snapshot; either way the journal left is empty
        await asyncio.get_running_loop().run_in_executor(None, self.store.close)
        if self.secure is not None and self.secure.temporary is not None:
            self.secure.temporary.cleanup()

    async def _finish_updates(self) -> None:
        """Accept no more connections, then wait until the updates in flight are done, so that
        their clients get their replies; the queries in flight are not waited for (HANDLERS_WAIT_S).

        No limit of its own: the stop's forced exit (STOP_DEADLINE_S) is the only one. Why: an
        update still running when a shorter wait ended was applied and journalled all the same
        (Scheduler.close waits for the update thread), only its reply was dropped: with 6 s, a
        200 x 200 insert of 7 s in flight at SIGTERM applied with the connection closed unanswered."""
        for runner in self.runners:
            for site in list(runner.sites):
                await site.stop()
        while self.scheduler.serial_in_flight:
            await asyncio.sleep(0.02)

    def health(self) -> dict[str, dict[str, Any]]:
        """Each running adapter's own account of its health (gateway.appliance.plugins.Adapter); the
        whole gateway's, components and readiness, is ``/health`` (gateway.appliance.health)."""
        return {name: adapter.health() for name, adapter in self.adapters.items()}

    async def serve(self) -> None:
        """Run until SIGTERM, SIGINT or SIGHUP (STOP_SIGNALS), then shut down cleanly."""
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self.stopped.set)
        self.store.on_failure = lambda reason: loop.call_soon_threadsafe(self._store_failed, reason)
        urls = await self.start()
        store = self.config.store.data_dir or "memory"
        # the process is ours (not an embedding one): its threads on one core, in memory and in
        # sequential mode (see gateway.appliance.cores for why not otherwise)
        one_core = self.config.engine.one_core and self.engine.mode != "parallel"
        core = pin_threads() if one_core and not self.store.rocksdb else None
        log.info(
            "sepa-gateway serving",
            extra={"urls": " ".join(urls), "store": store, "mode": self.engine.mode, "core": core},
        )
        await self.stopped.wait()
        log.info("sepa-gateway stopping: finishing in-flight updates")
        deadline = threading.Timer(STOP_DEADLINE_S, _force_exit)
        deadline.daemon = True
        deadline.start()
        await self.stop()
        deadline.cancel()
        log.info("sepa-gateway stopped")

    def _store_failed(self, reason: str) -> None:
        """The store on disk cannot write (broker.store.RdfStore.apply): stop, exit status 1. Only a
        new process reopens it (systemd's Restart=on-failure starts one 2 s later); until then every
        update gets 503 `store_failed`, and MQTT readings stay unacknowledged at the broker."""
        if self.exit_status == 0:
            log.critical("the store cannot write: stopping, to be started again", extra={"reason": reason})
            self.exit_status = 1
            self.stopped.set()


# SIGTERM ends the process within STOP_DEADLINE_S whatever is running, then exit status 1 (a
# forced exit: the store's journal makes it safe, an update is there whole or not at all). Why 20 s:
# an update in flight at SIGTERM is finished and answered (Gateway._finish_updates), and one may
# take its WHERE's whole time limit ([engine] time_limit_s, 10 s by default) and then its apply:
# with 9 s, one within its limits was cut and its client left unanswered. Under the unit's
# TimeoutStopSec (30 s, systemd/sepa-gateway.service), so the process ends itself, logged, before
# systemd's SIGKILL. Queries are stopped with their workers; a stop with no long update in flight
# takes 1-3 s.
STOP_DEADLINE_S = 20.0
# the signals that stop the gateway cleanly. SIGHUP too: it killed the process at once (exit 129, no
# flush, replies dropped), and systemd sends it right after SIGTERM to a unit with SendSIGHUP=yes,
# where it cut the clean stop short; there is nothing to reload (a restart applies a configuration)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What a stop waits for the requests in flight once their updates are done (Gateway._finish_updates):
# HANDLERS_WAIT_S (aiohttp's shutdown_timeout, 60 s by default), then their handlers are cancelled:
# a query still evaluating is abandoned (Scheduler.close kills its worker).
# Why: a query in flight at SIGTERM ran to its time limit (10 s by default) inside runner.cleanup,
# before the workers were stopped: 4,000 x 4,000 with a FILTER, SIGTERM 1 s after it was sent, and
# the stop was forced at 9 s (exit 1); 2,000 x 2,000, it took 7.2 s.
HANDLERS_WAIT_S = 1.0


def _started_pool(store: RdfStore, config: Config, count: int, name: str, *, on_demand: bool = False) -> QueryWorkers:
    """`count` worker processes over `store`, started (each holds its replica; `on_demand`: none
    until woken), under the configured time and memory limits and SERVICE allow-list; `name`: see QueryWorkers
    ("worker": the query workers, "reeval": the re-evaluation workers)."""
    pool = QueryWorkers(
        store,
        count=count,
        time_limit_s=config.engine.time_limit_s,
        memory_bytes=config.engine.query_memory_mb << 20,
        service_allow=tuple(config.engine.service_allow),
        name=name,
        on_demand=on_demand,
    )
    try:
        pool.start()
    except OSError as error:
        pool.close()
        raise StartupError(f"cannot start the {name} pool: {error}", transient=_transient(error)) from error
    return pool


def _force_exit() -> None:
    """The clean stop took too long: leave now (exit status 1, so that it shows)."""
    log.error("sepa-gateway stop took longer than %.0f s: exiting now", STOP_DEADLINE_S)
    logging.shutdown()
    os._exit(1)


def _loopback(host: str) -> bool:
    """Whether `host` is a loopback address or name (the plain gates' safe place)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
