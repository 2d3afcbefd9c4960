"""The resources the gateway observes (`[[coap.observe]]`, the mappings graph): checked, without aiocoap.

Why a module apart from the observer: `sepa-gateway check-config` checks these entries, and the
observer imports aiocoap, pyoxigraph and the client (see adapters/coap/plugin.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from gateway.observations.vocabulary import URN

OBSERVATION_PREFIX = URN + "coap-observation:"
_KEYS = {"uri", "source"}


class ObserveError(ValueError):
    """A resource to observe that cannot be: the message says which and why."""


@dataclass(frozen=True)
class ObserveTarget:
    """A resource to observe and the source path its notifications are mapped as."""

    uri: str
    source: str

    @classmethod
    def of(cls, uri: Any, source: Any = None) -> ObserveTarget:
        """Checked: a coap:// URI with a host, and a source (by default the URI's path)."""
        if not isinstance(uri, str) or not uri or any(c.isspace() for c in uri):
            raise ObserveError(f"uri {uri!r} is not a coap:// URI")
        try:
            parts = urlsplit(uri)
            port = parts.port
        except ValueError as error:
            raise ObserveError(f"uri {uri!r}: {error}") from None
        if parts.scheme != "coap" or not parts.hostname or parts.username is not None or parts.fragment:
            raise ObserveError(f"uri {uri!r} is not a coap://host[:port]/path URI")
        if port == 0:
            raise ObserveError(f"uri {uri!r}: port 0")
        if source is None:
            source = unquote(parts.path)
        if not isinstance(source, str):
            raise ObserveError(f"uri {uri!r}: source must be a string")
        source = source.strip("/")
        if not source:
            raise ObserveError(f"uri {uri!r}: no source (give `source`, or a uri with a path)")
        return cls(uri, source)

    @property
    def node(self) -> str:
        """Its IRI in the mappings graph (stable: a restart rewrites the same node)."""
        return OBSERVATION_PREFIX + quote(self.uri, safe="") + "," + quote(self.source, safe="")


def observe_from_config(entries: Iterable[Any]) -> list[ObserveTarget]:
    """The `[[coap.observe]]` tables as targets; ObserveError naming the first bad one."""
    targets: list[ObserveTarget] = []
    for position, entry in enumerate(entries):
        name = f"coap.observe[{position}]"
        if not isinstance(entry, Mapping):
            raise ObserveError(f"{name}: expected a table")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ObserveError(f"{name}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}")
        if "uri" not in entry:
            raise ObserveError(f"{name}: 'uri' is required")
        try:
            targets.append(ObserveTarget.of(entry["uri"], entry.get("source")))
        except ObserveError as error:
            raise ObserveError(f"{name}: {error}") from None
    return list(dict.fromkeys(targets))
