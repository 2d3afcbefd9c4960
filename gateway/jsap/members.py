"""Validation of the JSAP sections that are not SPARQL: host, protocols, namespaces, graphs, oauth.

Lenient where real JSAP files are: unknown members are ignored (files carry `#include`,
`authentication`, application comments...), `null` counts as absent and names are
case-insensitive (`"method": "post"`). Strict where a mistake would only show up later as a
failed connection: hosts, ports, paths, methods and IRIs are checked now, and the error names the
member as a path (`sparql11protocol.update.method: expected one of ...`).

Sections are returned *partial* (only the members present, validated): an entry's override and
the global section are merged later, with defaults applied last (see `loader`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from broker.api import PN_PREFIX, SepaError, parse_delay
from gateway.jsap.errors import JsapError
from gateway.jsap.model import GRAPH_KEYS, OAuth, url
from gateway.jsap.terms import TermError, expand_prefixed, iri_term

HTTP_DEFAULTS = {"http": (8000, "/query", "/update"), "https": (8443, "/secure/query", "/secure/update")}
WS_DEFAULTS = {"ws": (9000, "/subscribe"), "wss": (9443, "/secure/subscribe")}
QUERY_METHODS = ("GET", "POST", "URL_ENCODED_POST")
UPDATE_METHODS = ("POST", "URL_ENCODED_POST")

_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[^\s/?#@\[\]]+")
_PREFIX = re.compile(f"(?:{PN_PREFIX})?")  # the empty prefix is the default one (`:name`)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def expected(path: str, what: str, value: Any) -> JsapError:
    return JsapError(path, f"expected {what}, got {json_type(value)}")


def object_member(value: Any, path: str) -> Mapping[str, Any]:
    """An optional object member (absent or null: empty)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise expected(path, "an object", value)
    return value


def string_member(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise expected(path, "a string", value)
    if not value.strip():
        raise JsapError(path, "must not be empty")
    return value


def choice_member(value: Any, path: str, choices: tuple[str, ...], upper: bool = False) -> str:
    normalised = (value.upper() if upper else value.lower()) if isinstance(value, str) else value
    if normalised not in choices:
        raise JsapError(path, f"expected one of {', '.join(choices)}, got {value!r}")
    return normalised


def port_member(value: Any, path: str) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise JsapError(path, f"expected a port number 1..65535, got {value!r}")
    return value


def host_member(value: Any, path: str) -> str:
    host = string_member(value, path)
    if not _HOST.fullmatch(host) or "://" in host:
        raise JsapError(path, f"expected a host name or address (no scheme, port or path), got {host!r}")
    return host


def path_member(value: Any, path: str) -> str:
    text = string_member(value, path)
    if any(char.isspace() or char in "?#" for char in text):
        raise JsapError(path, f"expected a URL path, got {text!r}")
    return text if text.startswith("/") else "/" + text


def bool_member(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise expected(path, "true or false", value)
    return value


def iri_member(value: Any, path: str, prefixes: Mapping[str, str] | None = None) -> str:
    text = string_member(value, path)
    try:
        return iri_term(expand_prefixed(text, prefixes) if prefixes else text).value
    except TermError as error:
        raise JsapError(path, str(error)) from None


def delay_member(value: Any, path: str) -> str:
    """An update's `delay`, as the broker's `delay` parameter: milliseconds or an ISO 8601 duration.

    Checked with the broker's own rules (seed 001 §II-C), so a profile that loads never produces a
    delayed update the broker refuses for its delay.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise expected(path, "milliseconds (a non-negative integer) or an ISO 8601 duration string", value)
    if isinstance(value, int):
        if value < 0:
            raise JsapError(path, f"a delay cannot be negative, got {value}")
        text = str(value)
    else:
        text = string_member(value, path).strip()
    try:
        parse_delay(text)
    except SepaError as error:
        raise JsapError(path, error.description) from None
    return text


# -- sections (partial: only the members present, validated) ---------------------------------


def http_part(raw: Any, path: str) -> dict[str, Any]:
    """A `sparql11protocol` member, global or entry override."""
    obj = object_member(raw, path)
    part: dict[str, Any] = {}
    if obj.get("protocol") is not None:
        part["protocol"] = choice_member(obj["protocol"], f"{path}.protocol", tuple(HTTP_DEFAULTS))
    if obj.get("host") is not None:
        part["host"] = host_member(obj["host"], f"{path}.host")
    if obj.get("port") is not None:
        part["port"] = port_member(obj["port"], f"{path}.port")
    for operation, methods in (("query", QUERY_METHODS), ("update", UPDATE_METHODS)):
        where = f"{path}.{operation}"
        members = object_member(obj.get(operation), where)
        fields: dict[str, str] = {}
        if members.get("path") is not None:
            fields["path"] = path_member(members["path"], f"{where}.path")
        if members.get("method") is not None:
            fields["method"] = choice_member(members["method"], f"{where}.method", methods, upper=True)
        if members.get("format") is not None:
            fields["format"] = string_member(members["format"], f"{where}.format").upper()
        part[operation] = fields
    return part


def se_part(raw: Any, path: str) -> dict[str, Any]:
    """A `sparql11seprotocol` member, global or entry override."""
    obj = object_member(raw, path)
    part: dict[str, Any] = {}
    if obj.get("protocol") is not None:
        part["protocol"] = choice_member(obj["protocol"], f"{path}.protocol", tuple(WS_DEFAULTS))
    if obj.get("host") is not None:
        part["host"] = host_member(obj["host"], f"{path}.host")
    if obj.get("reconnect") is not None:
        part["reconnect"] = bool_member(obj["reconnect"], f"{path}.reconnect")
    available = object_member(obj.get("availableProtocols"), f"{path}.availableProtocols")
    part["available"] = {}
    for scheme in WS_DEFAULTS:  # other gates (e.g. mqtt) are not subscribe gates of this broker: ignored
        where = f"{path}.availableProtocols.{scheme}"
        gate = object_member(available.get(scheme), where)
        fields: dict[str, Any] = {}
        if gate.get("host") is not None:
            fields["host"] = host_member(gate["host"], f"{where}.host")
        if gate.get("port") is not None:
            fields["port"] = port_member(gate["port"], f"{where}.port")
        if gate.get("path") is not None:
            fields["path"] = path_member(gate["path"], f"{where}.path")
        part["available"][scheme] = fields
    return part


def graphs_part(raw: Any, path: str) -> dict[str, tuple[str, ...]]:
    """A `graphs` member: each key a list of IRIs (a single string is taken as a list of one)."""
    obj = object_member(raw, path)
    part = {}
    for key in GRAPH_KEYS:
        value = obj.get(key)
        if value is None:
            continue
        where = f"{path}.{key}"
        if isinstance(value, str):
            part[key] = (iri_member(value, where),)
        elif isinstance(value, list):
            part[key] = tuple(iri_member(item, f"{where}[{index}]") for index, item in enumerate(value))
        else:
            raise expected(where, "an array of IRIs", value)
    return part


def namespaces_section(raw: Any) -> dict[str, str]:
    obj = object_member(raw, "namespaces")
    namespaces = {}
    for prefix, iri in obj.items():
        where = f"namespaces.{prefix}"
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise JsapError(where, f"{prefix!r} is not a SPARQL prefix name")
        namespaces[prefix] = iri_member(iri, where)
    return namespaces


def oauth_section(raw: Any, host: str) -> OAuth:
    obj = object_member(raw, "oauth")
    enable = False if obj.get("enable") is None else bool_member(obj["enable"], "oauth.enable")
    register = url("https", host, 8443, "/oauth/register")
    token = url("https", host, 8443, "/oauth/token")
    if obj.get("register") is not None:
        register = iri_member(obj["register"], "oauth.register")
    if obj.get("tokenRequest") is not None:
        token = iri_member(obj["tokenRequest"], "oauth.tokenRequest")
    return OAuth(enable, register, token)
