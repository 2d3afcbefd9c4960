"""JSAP entries (`updates` / `queries`) validated and resolved against the global sections.

Missing sections take the PROTOCOL.md defaults (http 8000 /query /update, https 8443
/secure/query /secure/update, ws 9000 /subscribe, wss 9443 /secure/subscribe, host localhost).
Forced bindings are checked at load time, default values included, so a JSAP that loads can
always be rendered with its defaults; type names are case-insensitive (`bNode`) and
`"value": ""` means "no default" (sepy's convention). An update may carry a `delay`
(milliseconds or an ISO 8601 duration, checked as the broker checks it): its producers schedule
it (seed 001 §II-C). Errors name the member (`updates.SEND.forcedBindings.text.language: ...`).

Precedence (entry overrides win over globals): an entry's `sparql11protocol` /
`sparql11seprotocol` members, then its `host`, then the global members, then the global `host`.
When an entry switches scheme (http -> https, ws -> wss) and gives no port or path, the defaults
of the new scheme apply rather than the global port of the other scheme. An entry's `graphs`
member replaces the global list of each key it names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from broker.api import PN_CHARS_U
from gateway.jsap.errors import JsapError
from gateway.jsap.members import (
    HTTP_DEFAULTS,
    WS_DEFAULTS,
    choice_member,
    delay_member,
    expected,
    graphs_part,
    host_member,
    http_part,
    iri_member,
    object_member,
    se_part,
    string_member,
)
from gateway.jsap.model import Entry, ForcedBinding, Graphs, HttpOperation, Sparql11Protocol, Sparql11SEProtocol, WsGate
from gateway.jsap.template import TemplateError, analyse
from gateway.jsap.terms import TERM_TYPES, WELL_KNOWN_PREFIXES, TermError, binding_term, check_language

DEFAULT_HOST = "localhost"
_VARNAME = re.compile(f"[{PN_CHARS_U}0-9][{PN_CHARS_U}0-9\u00b7\u0300-\u036f\u203f-\u2040]*")


# -- resolution ------------------------------------------------------------------------------


def _first(*candidates: str | None) -> str:
    return next((candidate for candidate in candidates if candidate), DEFAULT_HOST)


def resolve_http(
    glob: dict[str, Any], entry: dict[str, Any], host: str | None, global_host: str | None
) -> Sparql11Protocol:
    """The effective `sparql11protocol` of an entry (pass `entry={}` and `host=None` for the global one)."""
    global_protocol = glob.get("protocol", "http")
    protocol = entry.get("protocol", global_protocol)
    inherit = protocol == global_protocol  # ports and paths belong to a scheme
    default_port, *default_paths = HTTP_DEFAULTS[protocol]
    operations = []
    for operation, default_path in zip(("query", "update"), default_paths, strict=True):
        mine, theirs = entry.get(operation, {}), glob.get(operation, {})
        path = mine.get("path") or (theirs.get("path") if inherit else None) or default_path
        method = mine.get("method") or theirs.get("method") or "POST"
        result_format = mine.get("format") or theirs.get("format") or "JSON"
        operations.append(HttpOperation(path, method, result_format))
    port = entry.get("port") or (glob.get("port") if inherit else None) or default_port
    chosen_host = _first(entry.get("host"), host, glob.get("host"), global_host)
    return Sparql11Protocol(protocol, chosen_host, port, operations[0], operations[1])


def resolve_se(
    glob: dict[str, Any], entry: dict[str, Any], host: str | None, global_host: str | None
) -> Sparql11SEProtocol:
    """The effective `sparql11seprotocol` of an entry (pass `entry={}` and `host=None` for the global one)."""
    protocol = entry.get("protocol", glob.get("protocol", "ws"))
    reconnect = entry.get("reconnect", glob.get("reconnect", True))
    gates = {}
    for scheme, (default_port, default_path) in WS_DEFAULTS.items():
        mine = entry.get("available", {}).get(scheme, {})
        theirs = glob.get("available", {}).get(scheme, {})
        gates[scheme] = WsGate(
            _first(mine.get("host"), entry.get("host"), host, theirs.get("host"), glob.get("host"), global_host),
            mine.get("port") or theirs.get("port") or default_port,
            mine.get("path") or theirs.get("path") or default_path,
        )
    return Sparql11SEProtocol(protocol, reconnect, MappingProxyType(gates))


# -- entries ---------------------------------------------------------------------------------


class Context:
    """The global, already validated sections an entry is resolved against."""

    def __init__(
        self,
        host: str | None,
        http: dict[str, Any],
        se: dict[str, Any],
        namespaces: dict[str, str],
        graphs: dict[str, tuple[str, ...]],
    ) -> None:
        self.host = host
        self.http = http
        self.se = se
        self.namespaces = namespaces
        self.graphs = graphs


def _variable(key: Any, path: str) -> str:
    name = key[1:] if isinstance(key, str) and key[:1] in ("?", "$") else key
    if not isinstance(name, str) or not _VARNAME.fullmatch(name):
        raise JsapError(path, f"{key!r} is not a SPARQL variable name")
    return name


def _forced_binding(
    raw: Any, path: str, name: str, prefixes: Mapping[str, str], template_slots: tuple[Any, ...]
) -> ForcedBinding:
    obj = object_member(raw, path)
    if obj.get("type") is None:
        raise JsapError(f"{path}.type", f"required: one of {', '.join(TERM_TYPES)}")
    kind = choice_member(obj["type"], f"{path}.type", TERM_TYPES)
    datatype = language = None
    if obj.get("datatype") is not None:
        if kind != "literal":
            raise JsapError(f"{path}.datatype", f"only a literal binding has a datatype (this one is a {kind})")
        datatype = iri_member(obj["datatype"], f"{path}.datatype", prefixes)
    if obj.get("language") is not None:
        if kind != "literal":
            raise JsapError(f"{path}.language", f"only a literal binding has a language (this one is a {kind})")
        try:
            language = check_language(obj["language"])
        except TermError as error:
            raise JsapError(f"{path}.language", str(error)) from None
    value = obj.get("value")
    if value == "":
        value = None  # sepy's convention: an empty default means the caller must give the value
    if value is not None and not isinstance(value, str | int | float):
        raise expected(f"{path}.value", "a string, number or boolean", value)
    default = None
    if value is not None:
        try:
            default = binding_term(value, kind, datatype, language, prefixes)
        except TermError as error:
            raise JsapError(f"{path}.value", str(error)) from None
    if kind == "bnode":
        check_bnode_slots(template_slots, f"{path}.type", name)
    return ForcedBinding(name, kind, value, datatype, language, default)


def check_bnode_slots(slots: tuple[Any, ...], path: str, name: str) -> None:
    """A blank node only where it means "a new node": inside INSERT DATA / INSERT / CONSTRUCT templates.

    Elsewhere (WHERE, DELETE, a projection) a label would match any node or be invalid SPARQL.
    """
    for slot in slots:
        if slot.name == name and (not slot.insertable or slot.kind != "term"):
            raise JsapError(
                path,
                f"a blank node can only be written into an INSERT DATA, INSERT or CONSTRUCT "
                f"template, but ?{name} also occurs at line {slot.line}, column {slot.column}",
            )


def _prologue(namespaces: Mapping[str, str], declared: Mapping[str, str], used: frozenset[str]) -> str:
    lines = [f"PREFIX {prefix}: <{iri}>\n" for prefix, iri in namespaces.items() if prefix not in declared]
    lines += [
        f"PREFIX {prefix}: <{iri}>\n"
        for prefix, iri in WELL_KNOWN_PREFIXES.items()
        if prefix in used and prefix not in declared and prefix not in namespaces
    ]
    return "".join(lines)


def entry(raw: Any, section: str, entry_id: str, context: Context) -> Entry:
    """One member of `updates` (section "updates") or `queries` ("queries"), validated and resolved."""
    path = f"{section}.{entry_id}"
    kind = "update" if section == "updates" else "query"
    obj = object_member(raw, path)
    if obj.get("sparql") is None:
        raise JsapError(f"{path}.sparql", "required")
    sparql = string_member(obj["sparql"], f"{path}.sparql")
    declared = object_member(obj.get("forcedBindings"), f"{path}.forcedBindings")
    names = {key: _variable(key, f"{path}.forcedBindings.{key}") for key in declared}
    try:
        template = analyse(sparql, names.values())
    except TemplateError as error:
        key = next((key for key, name in names.items() if name == error.variable), None)
        raise JsapError(f"{path}.forcedBindings.{key}" if key else f"{path}.sparql", str(error)) from None
    prefixes = {**WELL_KNOWN_PREFIXES, **context.namespaces, **template.declared_prefixes}
    forced = {
        name: _forced_binding(declared[key], f"{path}.forcedBindings.{key}", name, prefixes, template.slots)
        for key, name in names.items()
    }
    host = host_member(obj["host"], f"{path}.host") if obj.get("host") is not None else None
    http = resolve_http(
        context.http, http_part(obj.get("sparql11protocol"), f"{path}.sparql11protocol"), host, context.host
    )
    se = None
    if kind == "query":
        se = resolve_se(
            context.se, se_part(obj.get("sparql11seprotocol"), f"{path}.sparql11seprotocol"), host, context.host
        )
    graphs = Graphs.from_members({**context.graphs, **graphs_part(obj.get("graphs"), f"{path}.graphs")})
    delay = None
    if obj.get("delay") is not None:
        if kind != "update":
            raise JsapError(f"{path}.delay", "only an update can be delayed")
        delay = delay_member(obj["delay"], f"{path}.delay")
    return Entry(
        id=entry_id,
        kind=kind,
        sparql=sparql,
        forced_bindings=MappingProxyType(forced),
        host=_first(host, context.host),
        sparql11protocol=http,
        sparql11seprotocol=se,
        graphs=graphs,
        prefixes=MappingProxyType(prefixes),
        prologue=_prologue(context.namespaces, template.declared_prefixes, template.used_prefixes),
        template=template,
        delay=delay,
    )
