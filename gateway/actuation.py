"""Actuation shared by the adapters: the rows a subscription adds, rendered into commands.

Protocol-neutral: the MQTT adapter publishes what this renders (adapters/mqtt/actuators.py), the CoAP
adapter PUTs it (adapters/coap/actuators.py). One place so that `{name}` means the same in an MQTT
topic and in a CoAP URI: the row's value of ?name, a literal's lexical form or an IRI's last segment
(after the last `/`, `#` or `:`). Each protocol says which values may go where (`accept`): a value
that would change a topic's or a URI's structure is refused for that row, never sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pyoxigraph import Literal, NamedNode


class ActuatorError(ValueError):
    """An actuator entry of the configuration is wrong (said in one line, naming it)."""


def checked_entry(entry: Any, name: str, allowed: Iterable[str], required: Sequence[str]) -> Mapping[str, Any]:
    """A `[[<adapter>.actuators]]` table with no unknown key and its `required` keys non-empty strings."""
    if not isinstance(entry, Mapping):
        raise ActuatorError(f"{name}: expected a table")
    allowed = set(allowed)
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ActuatorError(f"{name}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    for key in required:
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise ActuatorError(f"{name}: '{key}' is required (a non-empty string)")
    return entry


PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def term_text(term: Any) -> str | None:
    """What `{name}` becomes for one term; None for a blank node or an unbound variable."""
    if isinstance(term, NamedNode):
        return re.split(r"[/#:]", term.value)[-1]
    if isinstance(term, Literal):
        return term.value
    return None


def row_values(variables: Sequence[str], row: Sequence[Any]) -> dict[str, str | None]:
    """A notification row as {variable: text}."""
    return {name: term_text(term) for name, term in zip(variables, row, strict=True)}


def fill(template: str, values: Mapping[str, str | None], accept: Callable[[str], bool] | None = None) -> str | None:
    """`template` with every `{name}` replaced by its value; None when one is missing or not accepted."""
    out: list[str] = []
    position = 0
    for match in PLACEHOLDER.finditer(template):
        value = values.get(match.group(1))
        if value is None or (accept is not None and not accept(value)):
            return None
        out += [template[position : match.start()], value]
        position = match.end()
    return "".join([*out, template[position:]])


def added_rows(notification: Any, initial: bool) -> Iterable[tuple[Any, ...]]:
    """The rows to act on: the added ones, except those present at subscription time (sequence 0)
    unless `initial` (then the current state is re-sent at every start)."""
    if notification.sequence == 0 and not initial:
        return ()
    return notification.added
