"""The resolved pieces of a JSAP: endpoints, graphs, OAuth and forced-binding declarations.

Everything here is immutable and fully resolved (defaults applied, entry overrides merged), so
code that sends a request reads one object and never re-implements the JSAP precedence rules.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.jsap.template import Template
from gateway.jsap.terms import RdfTerm

GRAPH_KEYS = ("default-graph-uri", "named-graph-uri", "using-graph-uri", "using-named-graph-uri")


def url(scheme: str, host: str, port: int, path: str) -> str:
    """`scheme://host:port/path`, an IPv6 host in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}{path}"


@dataclass(frozen=True)
class HttpOperation:
    """How one SPARQL 1.1 Protocol operation (query or update) is sent."""

    path: str
    method: str  # GET (queries only), POST (direct body) or URL_ENCODED_POST (form)
    format: str  # the result format asked for: JSON, XML, CSV, TSV (queries), JSON or HTML (updates)


@dataclass(frozen=True)
class Sparql11Protocol:
    """The HTTP endpoint of queries and updates (JSAP `sparql11protocol`), resolved."""

    protocol: str  # http | https
    host: str
    port: int
    query: HttpOperation
    update: HttpOperation

    @property
    def query_url(self) -> str:
        return url(self.protocol, self.host, self.port, self.query.path)

    @property
    def update_url(self) -> str:
        return url(self.protocol, self.host, self.port, self.update.path)


@dataclass(frozen=True)
class WsGate:
    """One subscribe gate of `sparql11seprotocol.availableProtocols` (ws or wss)."""

    host: str
    port: int
    path: str


@dataclass(frozen=True)
class Sparql11SEProtocol:
    """The WebSocket subscribe endpoint (JSAP `sparql11seprotocol`), resolved."""

    protocol: str  # ws | wss: the gate in use
    reconnect: bool
    available: Mapping[str, WsGate]  # always holds ws and wss

    @property
    def gate(self) -> WsGate:
        return self.available[self.protocol]

    @property
    def subscribe_url(self) -> str:
        gate = self.gate
        return url(self.protocol, gate.host, gate.port, gate.path)


@dataclass(frozen=True)
class Graphs(Mapping[str, tuple[str, ...]]):
    """The SPARQL 1.1 Protocol dataset parameters of a request (JSAP `graphs`).

    Also a read-only mapping from the JSAP / protocol parameter names (`"using-graph-uri"`...) to
    tuples of IRIs, always holding the four keys, so callers can pass it on as request parameters.
    """

    default_graph_uri: tuple[str, ...] = ()
    named_graph_uri: tuple[str, ...] = ()
    using_graph_uri: tuple[str, ...] = ()
    using_named_graph_uri: tuple[str, ...] = ()

    @classmethod
    def from_members(cls, members: Mapping[str, tuple[str, ...]]) -> Graphs:
        return cls(*(tuple(members.get(key, ())) for key in GRAPH_KEYS))

    def __getitem__(self, key: str) -> tuple[str, ...]:
        if key not in GRAPH_KEYS:
            raise KeyError(key)
        return getattr(self, key.replace("-", "_"))

    def __iter__(self) -> Iterator[str]:
        return iter(GRAPH_KEYS)

    def __len__(self) -> int:
        return len(GRAPH_KEYS)

    def query_params(self) -> dict[str, list[str]]:
        """The non-empty dataset parameters of a query (or a subscribe request)."""
        return {key: list(self[key]) for key in GRAPH_KEYS[:2] if self[key]}

    def update_params(self) -> dict[str, list[str]]:
        """The non-empty dataset parameters of an update."""
        return {key: list(self[key]) for key in GRAPH_KEYS[2:] if self[key]}


@dataclass(frozen=True)
class OAuth:
    """JSAP `oauth`: whether the secure gates are used, and where to register and get tokens."""

    enable: bool
    register: str
    token_request: str


@dataclass(frozen=True)
class ForcedBinding:
    """One `forcedBindings` declaration. `default` is None when the caller must give a value.

    `datatype` is the declared datatype as an absolute IRI (prefixed names expanded at load time).
    `value` is the default as written in the JSAP; `default` the validated term it makes.
    """

    name: str
    type: str  # uri | literal | bnode
    value: Any
    datatype: str | None
    language: str | None
    default: RdfTerm | None

    @property
    def required(self) -> bool:
        return self.default is None


@dataclass(frozen=True)
class Entry:
    """One member of `updates` or `queries`, with its endpoints and graphs resolved.

    `sparql11seprotocol` is None for updates (they are never subscribed). `prefixes` is what a
    prefixed-name value is expanded with (well-known, then JSAP namespaces, then PREFIXes of the
    text); `prologue` the PREFIX declarations prepended to the text. `delay` (updates only) is the
    entry's default delay as the broker's `delay` parameter (milliseconds or an ISO 8601
    duration): its producers schedule it instead of applying it at once (seed 001 §II-C).
    """

    id: str
    kind: str  # "update" | "query"
    sparql: str
    forced_bindings: Mapping[str, ForcedBinding]
    host: str
    sparql11protocol: Sparql11Protocol
    sparql11seprotocol: Sparql11SEProtocol | None
    graphs: Graphs
    prefixes: Mapping[str, str]
    prologue: str
    template: Template
    delay: str | None = None

    @property
    def path(self) -> str:
        """The entry as a JSAP member path: `updates.SEND`, `queries.SENT`."""
        return f"{'updates' if self.kind == 'update' else 'queries'}.{self.id}"
