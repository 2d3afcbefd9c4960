"""`Jsap`: a loaded JSON SPARQL Application Profile, and the requests an application makes from it.

A SEPA application (its producers, consumers and aggregators) is described by one JSAP file:
where the broker is, which namespaces the SPARQL uses, and every update and query with the
variables an agent fills in at run time (forced bindings). Agents ask this class for the URL of
an operation and for the SPARQL text with their values bound, and never build either by hand,
which is where injection and wrong-endpoint bugs come from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gateway.jsap import loader, members
from gateway.jsap.errors import JsapError
from gateway.jsap.model import Entry, Graphs, OAuth, Sparql11Protocol, Sparql11SEProtocol
from gateway.jsap.terms import TermError, binding_term

_YAML_SUFFIXES = (".ysap", ".yaml", ".yml")


class Jsap:
    """A validated JSAP. Build it with :meth:`load` or :meth:`from_dict`; it is read-only."""

    host: str
    oauth: OAuth
    sparql11protocol: Sparql11Protocol
    sparql11seprotocol: Sparql11SEProtocol
    namespaces: Mapping[str, str]
    graphs: Graphs
    extended: Any
    updates: Mapping[str, Entry]
    queries: Mapping[str, Entry]

    def __init__(self, data: Mapping[str, Any]) -> None:
        """Validate `data` (the parsed JSON document); prefer the :meth:`from_dict` spelling."""
        if not isinstance(data, Mapping):
            raise JsapError("", f"a JSAP must be a JSON object, got {type(data).__name__}")
        global_host = members.host_member(data["host"], "host") if data.get("host") is not None else None
        http = members.http_part(data.get("sparql11protocol"), "sparql11protocol")
        se = members.se_part(data.get("sparql11seprotocol"), "sparql11seprotocol")
        namespaces = members.namespaces_section(data.get("namespaces"))
        graphs = members.graphs_part(data.get("graphs"), "graphs")
        context = loader.Context(global_host, http, se, namespaces, graphs)
        self.host = global_host or loader.DEFAULT_HOST
        self.oauth = members.oauth_section(data.get("oauth"), self.host)
        self.sparql11protocol = loader.resolve_http(http, {}, None, global_host)
        self.sparql11seprotocol = loader.resolve_se(se, {}, None, global_host)
        self.namespaces = MappingProxyType(namespaces)
        self.graphs = Graphs.from_members(graphs)
        self.extended = data.get("extended") if data.get("extended") is not None else {}
        sections = {}
        for section in ("updates", "queries"):
            raw = members.object_member(data.get(section), section)
            sections[section] = MappingProxyType(
                {str(key): loader.entry(value, section, str(key), context) for key, value in raw.items()}
            )
        self.updates = sections["updates"]
        self.queries = sections["queries"]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Jsap:
        """A JSAP from its parsed JSON document. Raises JsapError naming the member at fault."""
        return cls(data)

    @classmethod
    def load(cls, path: str | PathLike[str]) -> Jsap:
        """A JSAP file: JSON, or YAML (sepy's `.ysap`) when the name ends in .ysap, .yaml or .yml.

        Errors name the member at fault and end with `(in <file>)`.
        """
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise JsapError(str(file), f"cannot read the JSAP file: {error}") from None
        data = _parse_yaml(text, file) if file.suffix.lower() in _YAML_SUFFIXES else _parse_json(text, file)
        try:
            return cls(data)
        except JsapError as error:
            raise JsapError(error.path, f"{error.detail} (in {file})") from None

    @property
    def reconnect(self) -> bool:
        """Whether a client should re-open a dropped subscribe socket (`sparql11seprotocol.reconnect`)."""
        return self.sparql11seprotocol.reconnect

    def __repr__(self) -> str:
        return f"<Jsap host={self.host!r} updates={list(self.updates)} queries={list(self.queries)}>"

    # -- entries and endpoints ---------------------------------------------------------------

    def update(self, id: str) -> Entry:
        """The `updates` member `id` (JsapError if there is none)."""
        return _lookup(self.updates, "updates", id)

    def query(self, id: str) -> Entry:
        """The `queries` member `id` (JsapError if there is none)."""
        return _lookup(self.queries, "queries", id)

    def query_url(self, id: str | None = None) -> str:
        """Where to send query `id` (its overrides applied); the global endpoint when None."""
        protocol = self.sparql11protocol if id is None else self.query(id).sparql11protocol
        return protocol.query_url

    def update_url(self, id: str | None = None) -> str:
        """Where to send update `id` (its overrides applied); the global endpoint when None."""
        protocol = self.sparql11protocol if id is None else self.update(id).sparql11protocol
        return protocol.update_url

    def subscribe_url(self, id: str | None = None) -> str:
        """The ws:// or wss:// URL to subscribe to query `id`, by its `sparql11seprotocol.protocol`."""
        if id is None:
            return self.sparql11seprotocol.subscribe_url
        protocol = self.query(id).sparql11seprotocol
        assert protocol is not None  # queries always have one
        return protocol.subscribe_url

    def update_delay(self, id: str) -> str | None:
        """Update `id`'s `delay` (milliseconds or an ISO 8601 duration, as the broker takes it), or None.

        A producer of a delayed entry schedules the update (seed 001 §II-C) instead of applying it.
        """
        return self.update(id).delay

    def graphs_for(self, id: str, kind: str | None = None) -> Graphs:
        """The dataset parameters of an entry (its `graphs` overriding the global ones, key by key).

        `kind` ("query" or "update") is needed only when both sections have an entry `id`.
        """
        if kind is None:
            in_queries, in_updates = id in self.queries, id in self.updates
            if in_queries and in_updates:
                raise JsapError(id, "both an update and a query have this name: pass kind='update' or 'query'")
            kind = "update" if in_updates else "query"
        if kind not in ("update", "query"):
            raise JsapError(id, f"kind must be 'update' or 'query', got {kind!r}")
        return (self.update(id) if kind == "update" else self.query(id)).graphs

    # -- SPARQL text ---------------------------------------------------------------------------

    def update_text(self, id: str, bindings: Mapping[str, Any] | None = None) -> str:
        """The SPARQL of update `id`, its forced bindings written as terms, with PREFIXes.

        `bindings` maps variable names (with or without `?`/`$`) to a plain value (str, int,
        float, bool, Decimal, datetime/date/time, a pyoxigraph term) or a binding object
        (`{"type", "value", "datatype", "language"}`, as in the JSAP or in a notification).
        A binding left out (or None) takes the JSAP default; without one it is an error.
        """
        return self.render(self.update(id), bindings)

    def query_text(self, id: str, bindings: Mapping[str, Any] | None = None) -> str:
        """The SPARQL of query `id` (also what is subscribed), bound as :meth:`update_text`."""
        return self.render(self.query(id), bindings)

    def render(self, entry: Entry, bindings: Mapping[str, Any] | None = None) -> str:
        """`entry`'s SPARQL text with `bindings` written in (see :meth:`update_text`)."""
        given: dict[str, Any] = {}
        unknown = []
        for key, value in (bindings or {}).items():
            name = key[1:] if isinstance(key, str) and key[:1] in ("?", "$") else key
            if name not in entry.forced_bindings:
                unknown.append(repr(key))
            given[name] = value
        if unknown:
            declared = ", ".join(entry.forced_bindings) or "none"
            raise JsapError(entry.path, f"unknown forced binding {', '.join(unknown)} (declared: {declared})")
        terms = {}
        for name, declaration in entry.forced_bindings.items():
            path = f"{entry.path}.forcedBindings.{name}"
            value = given.get(name)
            if value is None:
                if declaration.default is None:
                    raise JsapError(path, "no value: the caller gave none and the JSAP has no default")
                term = declaration.default
            else:
                try:
                    term = binding_term(
                        value, declaration.type, declaration.datatype, declaration.language, entry.prefixes
                    )
                except TermError as error:
                    raise JsapError(path, str(error)) from None
                if term.kind == "bnode":
                    loader.check_bnode_slots(entry.template.slots, path, name)
            terms[name] = term.text
        return entry.template.render(terms, entry.prologue)


def _lookup(section: Mapping[str, Entry], name: str, id: str) -> Entry:
    found = section.get(id)
    if found is None:
        known = ", ".join(section) or "none"
        raise JsapError(
            f"{name}.{id}", f"no such {name[:-1] if name == 'updates' else 'query'} in the JSAP (known: {known})"
        )
    return found


def _parse_json(text: str, file: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise JsapError(str(file), f"invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}") from None


def _parse_yaml(text: str, file: Path) -> Any:
    try:
        import yaml  # optional: only sepy-style .ysap files need it
    except ImportError:
        raise JsapError(str(file), "reading a YAML profile needs PyYAML (pip install pyyaml)") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise JsapError(str(file), f"invalid YAML: {error}") from None
