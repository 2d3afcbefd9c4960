"""The notification a subscription receives: added and removed results since the previous one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.sparql.terms import Row, rows_to_bindings


@dataclass(frozen=True, slots=True)
class Notification:
    """One notification of one subscription (PROTOCOL.md "Notification semantics").

    SELECT subscriptions carry `added` / `removed` rows (tuples of terms in `variables` order,
    None where unbound). ASK subscriptions carry `boolean` (the new value) and `previous`;
    their rows are empty.
    """

    spuid: str
    alias: str | None
    sequence: int
    variables: tuple[str, ...]
    added: tuple[Row, ...] = ()
    removed: tuple[Row, ...] = ()
    boolean: bool | None = None
    previous: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def results(self, rows: tuple[Row, ...], boolean: bool | None) -> dict[str, Any]:
        if self.boolean is not None:
            return {"head": {}} if boolean is None else {"head": {}, "boolean": boolean}
        return {"head": {"vars": list(self.variables)}, "results": {"bindings": rows_to_bindings(self.variables, rows)}}

    def to_json(self) -> dict[str, Any]:
        """The wire form: `{"notification": {...}}` exactly as PROTOCOL.md shows it."""
        body: dict[str, Any] = {"spuid": self.spuid, "alias": self.alias, "sequence": self.sequence}
        if self.boolean is not None:
            body["addedResults"] = self.results((), self.boolean)
            body["removedResults"] = self.results((), self.previous if self.sequence else None)
        else:
            body["addedResults"] = self.results(self.added, None)
            body["removedResults"] = self.results(self.removed, None)
        return {"notification": body}
