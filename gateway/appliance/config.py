"""The gateway's configuration: one TOML file, every setting with a documented default.

`systemd/sepa-gateway.toml` is the annotated file with every default; a test keeps it equal to
the defaults here. A bad file is a :class:`ConfigError` with a one-line message.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pyoxigraph import NamedNode

from gateway.appliance.config_lines import setting_line, toml_error_line
from gateway.appliance.plugins import adapter_plugins
from gateway.observations.latest import MAX_ENTRIES as MAX_LATEST_NODES

# a DNS name as [http] allowed_hosts takes it: labels of letters, digits, '-' and '_' (container names),
# no scheme, port, path nor wildcard; a trailing dot (fully qualified) is allowed
_HOST_NAME = re.compile(
    r"(?=.{1,253}\.?$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*\.?"
)
# settings whose value a message never shows: `password = 73915526` (unquoted) was echoed in
# "mqtt.password must be a str, not int (73915526)", into the installer's output and its logs
_SECRET_KEY = re.compile(r"password|secret|passphrase|(^|_)token$|credential")
# Why a bound: a configuration is a few KB (the annotated systemd file, every setting, is 18 KB), and
# the file was read whole: `check-config /dev/zero` grew to 21 GB and was OOM-killed
MAX_CONFIG_BYTES = 1 << 20
# Why a bound: the query workers' replies are waited for with a poll whose timeout is a C int of
# milliseconds; time_limit_s = 3e6 (35 days) made every query a 500 ("timeout is too large")
MAX_QUERY_TIME_S = 86400.0
# the shipper's uploader holds at most 4 connections (gateway.shipper.uploader); more workers only
# queue for them, each with a segment in memory: 20,000,000 took the gateway to 5.5 GB
MAX_UPLOADS_IN_FLIGHT = 4


# aiohttp's WebSocket reader keeps the message size limit in a C int
MAX_WEBSOCKET_MESSAGE_BYTES = (1 << 31) - 1

# Why a bound: a token that lives longer is hardly revocable by waiting, and the dashboard renews at
# 80 % of its life with a browser timer, which fires at once past 2^31-1 ms (~24.8 days)
MAX_TOKEN_LIFETIME_S = 30 * 24 * 3600
# the failure budget's bounds ([security] auth_failure_burst, auth_failures_per_s): a burst of up to
# 10,000 failures, given back at one in 100 s to 10,000 a second (as good as no limit)
MAX_AUTH_FAILURE_BURST = 10_000
MIN_AUTH_FAILURES_PER_S = 0.01
MAX_AUTH_FAILURES_PER_S = 10_000.0
# [security] auth_timeout_s: under a second a client on a slow link, or one getting its token after
# opening its socket, is cut before its first subscribe; past an hour an unauthenticated socket is
# hardly bounded
MIN_AUTH_TIMEOUT_S = 1.0
MAX_AUTH_TIMEOUT_S = 3600.0


class ConfigError(Exception):
    """A configuration problem, said in one line; found in a file, ``FILE:LINE: message`` when the
    line holding the setting is known (gateway.appliance.config_lines), else ``FILE: message``."""

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line

    def __str__(self) -> str:
        if self.path is not None and self.line is not None:
            return f"{self.path}:{self.line}: {self.message}"
        if self.path is not None:
            return f"{self.path}: {self.message}"
        return self.message


@dataclass
class EngineConfig:
    # "sequential" (LUTT + incremental SPUs on the engine's thread; also "incremental"), "parallel"
    # (the same, the BOOSTER in `workers` processes, updates pipelined) or "naive" (re-evaluate everything)
    mode: str = "sequential"
    workers: int = 0  # parallel mode's BOOSTER workers; 0: one per core but one (at least one)
    allow_load: bool = False  # allow SPARQL LOAD (fetches URLs from the gateway)
    service_allow: list = field(default_factory=list)  # SERVICE endpoints allowed: exact IRIs, or prefixes ending in *
    service_timeout_s: float = 10.0  # a query's client waits this long for allowed SERVICE calls (then 504)
    # queries, subscription probes and update WHEREs run in this many worker processes, each with a
    # replica of the store (a copy in memory; a checkpoint on disk), stopped past time_limit_s (503)
    query_workers: int = 2
    time_limit_s: float = 10.0
    # memory one evaluation there may take beyond its worker's replica; past it 503 (0: no limit)
    query_memory_mb: int = 256
    # quads one network client's update request may change at most (and solutions its WHERE clauses
    # may have); past it: 400, nothing applied. ~1.7 KB of memory a quad while the update runs
    max_update_quads: int = 100_000
    # sequential mode: network clients' re-evaluated subscriptions (OPTIONAL...) are re-evaluated in
    # this many worker processes of their own, pipelined off the update thread (each a replica of the
    # store too); 0: in the query workers, the update thread waiting for them
    reeval_workers: int = 1
    # relative IRIs of every request resolve against this, whatever gate, scheme, host or port the
    # request came by; "" is urn:sepa-gateway:<observations.gateway_id>/ (stable across restarts)
    base_iri: str = ""
    # `sepa-gateway run` with an in-memory store keeps the gateway's threads on one core (they share
    # the GIL: hand-offs on one core are cheaper) and its worker processes on every core; no effect
    # on RocksDB (its writes run beside the loop), in parallel mode or on a one-core board
    one_core: bool = True


@dataclass
class StoreConfig:
    data_dir: str = ""  # empty: in-memory store (lost on restart); else a directory for the on-disk store
    # with a data_dir: the store in memory, rebuilt at start from a snapshot and journal (broker.store
    # says why); false: RocksDB, for a store larger than memory
    resident: bool = True
    # while the machine has less memory available than this (MiB; under a control group's memory limit,
    # the room left in it), updates that add to the store are refused with 507 (broker.headroom says
    # why); 0: an eighth of the machine's memory (or of that limit), at least 64
    memory_floor_mb: int = 0


SECURE_PLAIN_HOST = "127.0.0.1"
"""Where the plain gates listen by default when [security] is enabled (see :func:`_from_data`)."""


@dataclass
class HttpConfig:
    host: str = "0.0.0.0"  # SECURE_PLAIN_HOST when [security] is enabled and the file names no host
    port: int = 8000
    query_path: str = "/query"
    update_path: str = "/update"
    scheduled_path: str = "/scheduled"  # GET lists pending delayed updates, DELETE <path>/<id> cancels one
    max_request_bytes: int = 1 << 20  # larger request bodies get 413
    # bytes of the bodies of every request in flight together (every port); past it a request is
    # refused 429 before its body is read (a 1 MiB body cost ~1.6 MB of RSS while it waited)
    request_bytes_total: int = 32 << 20
    max_result_bytes: int = 32 << 20  # a query whose result is larger gets 400 (~3x this in memory while it runs)
    # bytes left to write of every query reply together (HTTP and HTTPS); a reply that would pass it
    # cuts the connection with the most left to write, or is refused 429 when that is its own
    reply_bytes_total: int = 64 << 20
    cors_origins: list = field(default_factory=list)  # web origins allowed to call the gateway from a browser
    # DNS names the plain gates answer to besides IP addresses, localhost and this machine's name (and
    # <name>.local); a request whose Host names another gets 421 (DNS rebinding: docs/security.md)
    allowed_hosts: list = field(default_factory=list)
    idle_timeout_s: float = 60.0  # a kept-alive connection without a request for this long is closed
    request_timeout_s: float = 20.0  # a request's head, and its body, must arrive within this (then 408)
    max_connections: int = 0  # open on all the gates together (past it closed at once); 0: half the open-file limit
    max_connections_per_address: int = 256  # from one address off this board
    dashboard: bool = True  # the web dashboard at / on this port and, when secure, the HTTPS port (docs/dashboard.md)


@dataclass
class WebSocketConfig:
    port: int = 9000  # the subscribe path is also served on the HTTP port
    path: str = "/subscribe"
    heartbeat_s: float = 30.0  # ping interval; a client that does not answer is dropped
    queue_limit: int = 10_000  # notifications queued for one slow client before it is disconnected
    queue_rows: int = 200_000  # ...or rows of notifications (one alone is taken whatever its size)
    queue_bytes: int = 64 << 20  # ...or characters of the messages' JSON text
    # characters of every socket's queued messages together (plain and secure, this board's too);
    # past it the sockets holding the most are disconnected (1008). ~2.5 bytes of RSS a character
    # (the text, the transport's copy of what is being written, the allocator): 64 MiB took the
    # gateway to ~320 MB at most, within the ~600 MB a 1 GB board has for it and its query workers
    queue_bytes_total: int = 64 << 20
    # characters of one notification's JSON text; past it the subscription ends with a 400 error frame
    max_notification_bytes: int = 32 << 20
    max_message_bytes: int = 1 << 20  # larger subscribe/unsubscribe messages get a 413 error
    # subscriptions one client (secure identity, or address on the plain gates) and all clients may
    # hold, by count and by bytes of SPARQL text; past them a subscribe gets a 429 error frame
    max_subscriptions_per_client: int = 2_000
    max_subscription_bytes_per_client: int = 4194304
    max_subscriptions: int = 20_000
    max_subscription_bytes: int = 67108864
    # results a network client's subscription may have (it holds them, and its first notification
    # carries them all: ~1.7 KB of memory a row); past it a 400 error frame, when it subscribes or
    # when an update would take it past them (the subscription then ends). Here and below a row
    # counts once more for each 256 characters of its terms (broker.core.held.row_weight)
    max_subscription_rows: int = 100_000
    # rows all network clients' subscriptions may hold together, and one client's (an SPU's rows
    # count once; each client is charged the rows of every SPU it subscribes to): ~0.1-0.3 KB of
    # memory a row held, so the defaults are at most ~150 MB and ~60 MB; past them a 429 error frame,
    # when it subscribes or when an update would take it past them (the subscription then ends)
    max_held_rows: int = 500_000
    max_held_rows_per_client: int = 200_000
    # what one client's re-evaluated subscriptions (those run again in full on every update that may
    # touch them) may cost each update together, in seconds, by their probes; past it a 429
    # error frame at subscribe (every publisher's reply waits for them). 0: no limit
    max_reeval_seconds_per_client: float = 2.0


@dataclass
class SecurityConfig:
    enabled: bool = False  # the secure gates: HTTPS + WSS, OAuth 2.0 client credentials, JWT (the installed file: true)
    host: str = "0.0.0.0"  # where the secure gates listen
    https_port: int = 8443  # /secure/query, /secure/update, /secure/scheduled, /oauth/*, /secure/subscribe
    wss_port: int = 9443  # /secure/subscribe
    dir: str = ""  # keys, certificate and client registry (0700); empty: <store.data_dir>/security, or a temporary one
    tls_cert: str = ""  # PEM certificate chain of the secure gates; empty: a self-signed one generated into dir
    tls_key: str = ""  # its private key (PEM)
    tls_names: list = field(default_factory=list)  # extra DNS names / IP addresses for the generated certificate
    token_lifetime_s: int = 3600  # access tokens expire after this; clients renew them with their credentials
    # failed authentications (wrong secret, refused registration, bad bearer token) one network address may
    # send in a row, given back at auth_failures_per_s; past them its attempts get 429 with Retry-After
    # (broker/security/failures.py; this board's own are not counted)
    auth_failure_burst: int = 20
    auth_failures_per_s: float = 2.0
    # a WebSocket on the secure ports none of whose messages carried a valid token within this is closed
    # (1008): an upgrade needs no token, and a socket answering the pings was held for good (~72 KB each)
    auth_timeout_s: float = 30.0
    issuer: str = ""  # the tokens' "iss"; empty: sepa-gateway:<observations.gateway_id or host name>
    clients: list = field(default_factory=list)  # [[security.clients]]: identity, read, write (see the TOML file)


@dataclass
class SchedulerConfig:
    queue_size: int = 1000  # requests in flight before 429 too_many_requests
    query_threads: int = 4
    max_pending: int = 100_000  # delayed updates waiting for their due time before new ones get 429
    max_pending_bytes: int = 67108864  # and their SPARQL text in total (UTF-8 bytes): in memory without a data_dir
    max_pending_per_client: int = 10_000  # one client's (secure identity, or address on the plain gates)
    max_pending_bytes_per_client: int = 4194304


@dataclass
class ObservationsConfig:
    gateway_id: str = ""  # names this gateway in observation IRIs and in the cloud; empty: the host name
    retain_count: int = 1000  # observations kept per sensor and property (older ones are pruned; the cloud has them)
    retain_age_s: float = 7 * 86400.0  # and none older than this
    prune_interval_s: float = 60.0
    # latest nodes (one per sensor and property, never pruned: a silent sensor keeps its last value);
    # past either bound a reading of a new pair is refused and counted (gateway.observations.writer)
    max_sensor_properties: int = 10_000
    max_properties_per_sensor: int = 256
    max_properties_per_device: int = 1000  # a SenML, Tasmota or Homie device mints a sensor per name or node
    max_properties_per_mapping: int = 1000  # one of your own mappings' sensors: a publisher granted a templated topic


@dataclass
class ShipperConfig:
    enabled: bool = False  # ship every observation to the cloud landing endpoint (cloud/)
    url: str = ""  # the landing endpoint, e.g. https://cloud.example.org:8443 (batches go to /v1/batches/<id>)
    token_file: str = ""  # file holding the bearer token; or env SEPA_GATEWAY_SHIPPER_TOKEN. Never logged
    ca_file: str = ""  # CA bundle that verifies the endpoint; empty: the system trust store
    allow_http: bool = False  # plain http:// only with this (a TLS-terminating proxy on the same host)
    spool_dir: str = ""  # empty: <store.data_dir>/spool (required when the store is in memory)
    segment_max_bytes: int = 1048576  # a segment is sealed (and uploaded) at this size...
    segment_max_age_s: float = 10.0  # ...or this long after its first observation
    spool_budget_bytes: int = 536870912  # over it, the oldest sealed segments are dropped (counted)
    upload_timeout_s: float = 30.0
    backoff_initial_s: float = 1.0  # retries back off exponentially, with jitter...
    backoff_max_s: float = 300.0  # ...up to this
    uploads_in_flight: int = 2  # segments uploaded at once, 1..4 (the uploader's connections)

    def token(self) -> str:
        """The bearer token (token_file first, then the environment); ConfigError when there is none."""
        if self.token_file:
            try:
                token = Path(self.token_file).read_text(encoding="utf-8").strip()
            except (OSError, ValueError) as error:  # ValueError: a NUL in the name, or not UTF-8
                reason = error.strerror if isinstance(error, OSError) else "not a file name, or not UTF-8 text"
                raise ConfigError(f"shipper.token_file: cannot read {self.token_file!r}: {reason}") from None
        else:
            token = os.environ.get("SEPA_GATEWAY_SHIPPER_TOKEN", "").strip()
        if not token or any(character.isspace() for character in token):
            raise ConfigError("shipper: no bearer token (shipper.token_file or SEPA_GATEWAY_SHIPPER_TOKEN)")
        return token


@dataclass
class LoggingConfig:
    level: str = "INFO"  # DEBUG, INFO, WARNING, ERROR; INFO logs only lifecycle events
    # empty: stderr; else this file, rotated (ignored under systemd, whose journal has stderr)
    file: str = ""
    file_max_bytes: int = 10485760  # the file is rotated at this size (FILE.1, FILE.2...)
    file_backups: int = 5  # old files kept


@dataclass
class Config:
    engine: EngineConfig = field(default_factory=EngineConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    websocket: WebSocketConfig = field(default_factory=WebSocketConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    observations: ObservationsConfig = field(default_factory=ObservationsConfig)
    shipper: ShipperConfig = field(default_factory=ShipperConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    # one section per adapter plug-in ([mqtt]...), its dataclass owned by the plug-in (gateway.appliance.plugins)
    adapters: dict[str, Any] = field(default_factory=lambda: {n: p.section() for n, p in adapter_plugins().items()})

    def adapter(self, name: str) -> Any:
        """The settings of the adapter plug-in `name` (KeyError when no such plug-in is installed)."""
        return self.adapters[name]

    def validate(self) -> Config:
        if self.engine.mode not in ("sequential", "incremental", "parallel", "naive"):
            raise ConfigError(
                f"engine.mode must be 'sequential', 'parallel' or 'naive' (or 'incremental'), not {self.engine.mode!r}"
            )
        if not 0 <= self.engine.workers <= 64:
            raise ConfigError("engine.workers must be between 0 (one per core but one) and 64")
        for name, port in (
            ("http.port", self.http.port),
            ("websocket.port", self.websocket.port),
            ("security.https_port", self.security.https_port),
            ("security.wss_port", self.security.wss_port),
        ):
            if not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be between 0 and 65535, not {port}")
        for name, value in (
            ("http.max_request_bytes", self.http.max_request_bytes),
            ("http.request_bytes_total", self.http.request_bytes_total),
            ("http.max_result_bytes", self.http.max_result_bytes),
            ("http.reply_bytes_total", self.http.reply_bytes_total),
            ("websocket.queue_limit", self.websocket.queue_limit),
            ("websocket.queue_rows", self.websocket.queue_rows),
            ("websocket.queue_bytes", self.websocket.queue_bytes),
            ("websocket.queue_bytes_total", self.websocket.queue_bytes_total),
            ("websocket.max_notification_bytes", self.websocket.max_notification_bytes),
            ("websocket.max_message_bytes", self.websocket.max_message_bytes),
            ("websocket.max_subscriptions_per_client", self.websocket.max_subscriptions_per_client),
            ("websocket.max_subscription_bytes_per_client", self.websocket.max_subscription_bytes_per_client),
            ("websocket.max_subscriptions", self.websocket.max_subscriptions),
            ("websocket.max_subscription_rows", self.websocket.max_subscription_rows),
            ("websocket.max_held_rows", self.websocket.max_held_rows),
            ("websocket.max_held_rows_per_client", self.websocket.max_held_rows_per_client),
            ("websocket.max_subscription_bytes", self.websocket.max_subscription_bytes),
            ("scheduler.queue_size", self.scheduler.queue_size),
            ("scheduler.query_threads", self.scheduler.query_threads),
            ("scheduler.max_pending", self.scheduler.max_pending),
            ("scheduler.max_pending_bytes", self.scheduler.max_pending_bytes),
            ("scheduler.max_pending_per_client", self.scheduler.max_pending_per_client),
            ("scheduler.max_pending_bytes_per_client", self.scheduler.max_pending_bytes_per_client),
        ):
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, not {value}")
        # aiohttp's WebSocket reader takes a C int: 2**63 - 1 passed, then every upgrade was a 500
        # with an OverflowError traceback
        if self.websocket.max_message_bytes > MAX_WEBSOCKET_MESSAGE_BYTES:
            raise ConfigError(f"websocket.max_message_bytes must be at most {MAX_WEBSOCKET_MESSAGE_BYTES}")
        for name, host in (("http.host", self.http.host), ("security.host", self.security.host)):
            _check_listening_host(name, host)
        self._check_ports_apart()
        for position, name in enumerate(self.http.allowed_hosts):
            if not isinstance(name, str) or not _HOST_NAME.fullmatch(name.lower()):
                raise ConfigError(
                    f"http.allowed_hosts[{position}] must be a host name without scheme or port "
                    f'(e.g. "gateway.plant.example"), not {name!r}'
                )
        _check_positive(
            ("http.idle_timeout_s", self.http.idle_timeout_s), ("http.request_timeout_s", self.http.request_timeout_s)
        )
        if not 0 <= self.http.max_connections <= 1_000_000:
            raise ConfigError(f"http.max_connections must be 0-1000000, not {self.http.max_connections}")
        if not 1 <= self.http.max_connections_per_address <= 1_000_000:
            raise ConfigError(
                f"http.max_connections_per_address must be 1-1000000, not {self.http.max_connections_per_address}"
            )
        if self.websocket.heartbeat_s < 1:  # 1e-9 passed: every WebSocket closed at once (1006)
            raise ConfigError("websocket.heartbeat_s must be at least 1 second")
        if not 0 <= self.websocket.max_reeval_seconds_per_client <= MAX_QUERY_TIME_S:
            raise ConfigError("websocket.max_reeval_seconds_per_client must be 0 (no limit) or a number of seconds")
        if self.engine.base_iri:
            try:
                NamedNode(self.engine.base_iri)
            except ValueError as error:
                raise ConfigError(f"engine.base_iri is not an absolute IRI: {error}") from None
        for name, limit_s in (
            ("engine.time_limit_s", self.engine.time_limit_s),
            ("engine.service_timeout_s", self.engine.service_timeout_s),
        ):
            if not 0 < limit_s <= MAX_QUERY_TIME_S:
                raise ConfigError(f"{name} must be positive and at most {MAX_QUERY_TIME_S:.0f} (a day), not {limit_s}")
        if not 1 <= self.engine.max_update_quads <= 10_000_000:
            raise ConfigError("engine.max_update_quads must be between 1 and 10000000")
        if not 1 <= self.engine.query_workers <= 64:
            raise ConfigError("engine.query_workers must be between 1 and 64")
        if not 0 <= self.engine.query_memory_mb <= 1 << 20:
            raise ConfigError("engine.query_memory_mb must be between 0 and 1048576")
        if not 0 <= self.engine.reeval_workers <= 64:
            raise ConfigError("engine.reeval_workers must be between 0 and 64")
        for name, path in (
            ("http.query_path", self.http.query_path),
            ("http.update_path", self.http.update_path),
            ("http.scheduled_path", self.http.scheduled_path),
            ("websocket.path", self.websocket.path),
        ):
            if not path.startswith("/"):
                raise ConfigError(f"{name} must start with '/', not {path!r}")
        # Why every section, on or off: a bad value in a section turned off (`[coap] port = 99999`,
        # `[shipper] uploads_in_flight = 99` with `enabled = false`) passed check-config and failed
        # only the day the section was turned on. What a section needs from the machine (its files,
        # the shipper's URL and token) is checked when it is on.
        self._check_security()
        for name, plugin in adapter_plugins().items():
            plugin.check(self.adapters[name])
        if self.observations.retain_count < 1:
            raise ConfigError(f"observations.retain_count must be >= 1, not {self.observations.retain_count}")
        _check_positive(
            ("observations.retain_age_s", self.observations.retain_age_s),
            ("observations.prune_interval_s", self.observations.prune_interval_s),
        )
        if not 1 <= self.observations.max_sensor_properties <= MAX_LATEST_NODES:
            raise ConfigError(f"observations.max_sensor_properties must be 1 to {MAX_LATEST_NODES:,}")
        if not 1 <= self.observations.max_properties_per_sensor <= self.observations.max_sensor_properties:
            raise ConfigError("observations.max_properties_per_sensor must be 1 to max_sensor_properties")
        if self.observations.max_properties_per_device < 1:  # past max_sensor_properties it bounds nothing
            raise ConfigError("observations.max_properties_per_device must be >= 1")
        if self.observations.max_properties_per_mapping < 1:
            raise ConfigError("observations.max_properties_per_mapping must be >= 1")
        self._check_shipper()
        if self.logging.level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(f"logging.level must be DEBUG, INFO, WARNING or ERROR, not {self.logging.level!r}")
        if self.logging.file_max_bytes < 4096:
            raise ConfigError(f"logging.file_max_bytes must be at least 4096, not {self.logging.file_max_bytes}")
        if self.logging.file_backups < 1:
            raise ConfigError(f"logging.file_backups must be at least 1, not {self.logging.file_backups}")
        return self

    def _check_ports_apart(self) -> None:
        """Why: two gates on one port and overlapping addresses passed the check, and the gateway then
        failed at start (`https_port = 8000` beside the default http.port: "address already in use"
        from `run`, after the installer had called the file good). Port 0 is any free one: never shared."""
        listening = [
            ("http.port", self.http.host, self.http.port),
            ("websocket.port", self.http.host, self.websocket.port),
        ]
        if self.security.enabled:
            listening += [
                ("security.https_port", self.security.host, self.security.https_port),
                ("security.wss_port", self.security.host, self.security.wss_port),
            ]
        for position, (name, host, port) in enumerate(listening):
            for other, other_host, other_port in listening[:position]:
                if port and port == other_port and _hosts_overlap(host, other_host):
                    raise ConfigError(f"{name} must differ from {other} ({port}): both gates listen on {host}")

    def _check_security(self) -> None:
        from broker.api import RegistryError, configured_client

        security = self.security
        if bool(security.tls_cert) != bool(security.tls_key):
            raise ConfigError("security.tls_cert and security.tls_key go together")
        for name in ("tls_cert", "tls_key"):
            path = getattr(security, name)
            if security.enabled and path and not is_file(path):
                raise ConfigError(f"security.{name}: no such file {path}")
        if not 10 <= security.token_lifetime_s <= MAX_TOKEN_LIFETIME_S:
            raise ConfigError(
                f"security.token_lifetime_s must be 10 to {MAX_TOKEN_LIFETIME_S:,} (30 days), "
                f"not {security.token_lifetime_s}"
            )
        if not 1 <= security.auth_failure_burst <= MAX_AUTH_FAILURE_BURST:
            raise ConfigError(
                f"security.auth_failure_burst must be 1 to {MAX_AUTH_FAILURE_BURST:,}, "
                f"not {security.auth_failure_burst}"
            )
        if not MIN_AUTH_FAILURES_PER_S <= security.auth_failures_per_s <= MAX_AUTH_FAILURES_PER_S:
            raise ConfigError(
                f"security.auth_failures_per_s must be {MIN_AUTH_FAILURES_PER_S:g} to {MAX_AUTH_FAILURES_PER_S:,g}, "
                f"not {security.auth_failures_per_s}"
            )
        if not MIN_AUTH_TIMEOUT_S <= security.auth_timeout_s <= MAX_AUTH_TIMEOUT_S:
            raise ConfigError(
                f"security.auth_timeout_s must be {MIN_AUTH_TIMEOUT_S:g} to {MAX_AUTH_TIMEOUT_S:,g}, "
                f"not {security.auth_timeout_s}"
            )
        if not all(isinstance(name, str) for name in security.tls_names):
            raise ConfigError("security.tls_names must be a list of strings")
        identities: set[str] = set()
        try:
            for position, entry in enumerate(security.clients):
                identity = configured_client(entry, position)[0]
                # two entries of one identity: the last silently replaced the first's rights
                if identity in identities:
                    raise ConfigError(f"security.clients[{position}]: identity {identity!r} is given twice")
                identities.add(identity)
        except RegistryError as error:
            raise ConfigError(str(error)) from None

    def _check_shipper(self) -> None:
        shipper = self.shipper
        if shipper.enabled or shipper.url:  # a shipper off may leave its URL empty
            if not (shipper.url.startswith("https://") or (shipper.allow_http and shipper.url.startswith("http://"))):
                raise ConfigError("shipper.url must be an https:// URL (http:// only with shipper.allow_http)")
            _check_landing_url(shipper.url)
        if shipper.enabled and shipper.ca_file and not is_file(shipper.ca_file):
            raise ConfigError(f"shipper.ca_file: no such file {shipper.ca_file}")
        if shipper.segment_max_bytes < 1024:
            raise ConfigError(f"shipper.segment_max_bytes must be >= 1024, not {shipper.segment_max_bytes}")
        if shipper.spool_budget_bytes < 4 * shipper.segment_max_bytes:
            raise ConfigError(
                f"shipper.spool_budget_bytes must be >= 4 segments (4 x shipper.segment_max_bytes, "
                f"{4 * shipper.segment_max_bytes}), not {shipper.spool_budget_bytes}"
            )
        _check_positive(
            ("shipper.upload_timeout_s", shipper.upload_timeout_s),
            ("shipper.backoff_initial_s", shipper.backoff_initial_s),
        )
        if shipper.segment_max_age_s < 0.1:  # 1e-300 passed: the sealer looped, 4.7 CPU-s in 5 s idle
            raise ConfigError(f"shipper.segment_max_age_s must be at least 0.1, not {shipper.segment_max_age_s}")
        if shipper.backoff_max_s < shipper.backoff_initial_s:
            raise ConfigError("shipper.backoff_max_s must be >= shipper.backoff_initial_s")
        if not 1 <= shipper.uploads_in_flight <= MAX_UPLOADS_IN_FLIGHT:
            raise ConfigError(
                f"shipper.uploads_in_flight must be 1..{MAX_UPLOADS_IN_FLIGHT}, not {shipper.uploads_in_flight}"
            )
        if shipper.enabled:
            shipper.token()


def _check_positive(*settings: tuple[str, float]) -> None:
    """Each (name, value) is positive; the error names the one that is not, so that its line is the
    one the message points at (config_lines): "a and b must be positive" pointed at a's line
    whichever was wrong."""
    for name, value in settings:
        if value <= 0:
            raise ConfigError(f"{name} must be positive, not {value}")


def is_file(path: str) -> bool:
    """Whether `path` names a regular file (or a link to one). Why not Path.is_file alone: it raises
    for a name longer than NAME_MAX (OSError) and one holding a NUL (ValueError), which check-config
    printed as tracebacks."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def _check_landing_url(url: str) -> None:
    """shipper.url names a host and a valid port, and holds no credentials, white space or control
    characters. Why: `user:pw@` made every upload fail while "shipper started" logged the password;
    no host, `[::1` or port 99999 passed check-config and failed only at the first upload."""
    if any(character.isspace() or not character.isprintable() for character in url):
        raise ConfigError("shipper.url holds white space or a control character")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError as error:
        raise ConfigError(f"shipper.url is not a valid URL: {error}") from None
    if "@" in parts.netloc:
        raise ConfigError("shipper.url must not hold credentials: the bearer token goes in shipper.token_file")
    if not parts.hostname:
        raise ConfigError("shipper.url names no host")
    if parts.port == 0:
        raise ConfigError("shipper.url names port 0")
    if parts.query or parts.fragment:
        raise ConfigError("shipper.url must not hold a query or a fragment (batches go to <url>/v1/batches/<id>)")


def _check_listening_host(name: str, host: str) -> None:
    """A gate's listening address is an IP address or a host name, nothing else. Why: `host = ""`
    passed, and asyncio reads "" as every address: the unauthenticated plain gates answered an update
    from the LAN with 200, [security] on too; "127.0.0.1:8000", " 127.0.0.1" or "http://127.0.0.1"
    passed as well, and `run` then died with "Name or service not known"."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_NAME.fullmatch(host.lower()):
            raise ConfigError(
                f"{name} must be an IP address or a host name without scheme, port or spaces "
                f'(e.g. "127.0.0.1", "::" or "0.0.0.0" for every address), not {host!r}'
            ) from None


def _hosts_overlap(first: str, second: str) -> bool:
    """Whether listening on both addresses with one port would collide: the same address, or a
    wildcard and an address of its family. A host name may resolve to any address: it overlaps.
    0.0.0.0 and :: do not (asyncio sets IPV6_V6ONLY on the IPv6 socket)."""
    try:
        one, two = ipaddress.ip_address(first), ipaddress.ip_address(second)
    except ValueError:
        return True
    if one.version != two.version:
        return False
    return one == two or one.is_unspecified or two.is_unspecified


def _section(cls: type, name: str, values: Any) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"[{name}] must be a table")
    known = {f.name: f for f in fields(cls)}
    for key in values:
        if key not in known:
            raise ConfigError(f"unknown setting {name}.{key} (known: {', '.join(known)})")
    instance = cls()
    for key, value in values.items():
        expected = type(getattr(instance, key))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        shown = "a secret, not shown" if _SECRET_KEY.search(key) else repr(value)
        if type(value) is not expected:
            raise ConfigError(f"{name}.{key} must be a {expected.__name__}, not {type(value).__name__} ({shown})")
        # Why here, for every float setting: TOML has nan and inf, and `nan <= 0` is False, so
        # `time_limit_s = nan` passed the range check and every query was then a 500
        # ("cannot convert float NaN to integer"); inf, the same ("float infinity")
        if expected is float and not math.isfinite(value):
            raise ConfigError(f"{name}.{key} must be a finite number, not {shown}")
        setattr(instance, key, value)
    return instance


def load_config(path: str | Path | None, *, secure: bool = False) -> Config:
    """Defaults, overridden by the TOML file at `path` when given; `secure` enables [security] as the
    file's `enabled = true` does (`run --secure`), before the hosts left unnamed are chosen."""
    if path is None:
        return _from_data({}, secure=secure)
    try:
        return _load(path, secure=secure)
    except ConfigError as error:  # every problem of a file names it, with its line or without
        if error.path is None:
            error.path = path
        raise


def _load(path: str | Path, *, secure: bool = False) -> Config:
    raw = _read(path)
    if raw.startswith(b"\xef\xbb\xbf"):  # tomllib said only "Invalid statement (at line 1, column 1)"
        raise ConfigError(
            "not valid TOML: the file starts with a byte order mark (BOM): save it as UTF-8 without one",
            path=path,
            line=1,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        raise ConfigError(
            f"not valid TOML: not UTF-8 (byte 0x{raw[error.start]:02x} at column {column})", path=path, line=line
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line = toml_error_line(str(error))
        if line is None:
            raise ConfigError(f"not valid TOML: {error}") from error
        raise ConfigError(f"not valid TOML: {error}", path=path, line=line) from error
    except RecursionError:  # tomllib recurses once per level: 900 nested arrays were a traceback
        raise ConfigError("not valid TOML: arrays or inline tables nested too deeply") from None
    try:
        return _from_data(data, secure=secure)
    except ConfigError as error:  # said where: the line of the setting it names, when the file holds it
        error.path, error.line = path, setting_line(text, error.message)
        raise
    except RecursionError:  # a deeply nested value tomllib took, in a check or an error message's repr
        raise ConfigError("a value is nested too deeply") from None


def _read(path: str | Path) -> bytes:
    """The file's bytes: a regular file of at most MAX_CONFIG_BYTES, no more read than that. Opened
    without blocking: a FIFO blocked `check-config` forever in open(), before it could be refused."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ConfigError(f"cannot read {path}: not a regular file")
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror or error}") from error
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"cannot read {path}: larger than {MAX_CONFIG_BYTES} bytes (a configuration is a few KB)")
    return raw


def _from_data(data: dict[str, Any], *, secure: bool = False) -> Config:
    config = Config()
    own = [f.name for f in fields(Config) if f.name != "adapters"]
    for name, values in data.items():
        if name in own:
            setattr(config, name, _section(type(getattr(config, name)), name, values))
        elif name in config.adapters:
            config.adapters[name] = _section(type(config.adapters[name]), name, values)
        else:
            raise ConfigError(f"unknown section [{name}] (known: {', '.join([*own, *config.adapters])})")
    if secure:
        config.security.enabled = True
    named = {section for section in ("http", "coap") if isinstance(data.get(section), dict) and "host" in data[section]}
    if config.security.enabled and "http" not in named:
        # Why: the plain gates have no authentication. A file of an older version upgraded to
        # [security] without [http] host served the whole store, read and write, on every address
        # (an attack pass); with the secure gates on, the plain ones are this board's own. Why
        # `secure` here: `run --secure`, set after loading, left them on 0.0.0.0 (an update from
        # the LAN got 200)
        config.http.host = SECURE_PLAIN_HOST
    if "coap" in config.adapters and not config.security.enabled and "coap" not in named:
        # Why: without [security], CoAP is as unauthenticated as the plain gates (readings in, POST /q
        # reads every graph), yet `[http] host = "127.0.0.1"` left it on "::": a LAN host read the
        # whole store (an attack pass). With [security], network peers must use OSCORE: it stays on "::"
        config.adapters["coap"].host = coap_host_of(config.http.host)
    return config.validate()


def coap_host_of(plain_host: str) -> str:
    """Where CoAP listens when it follows the plain gates' host: the same address (0.0.0.0 is every
    address: "::", which takes IPv4 too), localhost's IPv4 loopback; it listens on an address only,
    so another host name must be matched by naming [coap] host."""
    if plain_host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(plain_host)
    except ValueError:
        if not _HOST_NAME.fullmatch(plain_host.lower()):
            return "::"  # no host at all: validate() says what is wrong with the plain gates' one
        raise ConfigError(
            f"coap.host must be named (an IP address) when http.host is the host name {plain_host!r}: "
            "CoAP listens where the plain gates do, on an address"
        ) from None
    return "::" if address.is_unspecified else plain_host
