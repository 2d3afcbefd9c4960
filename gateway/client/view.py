"""ResultView: the current result of a subscribed query, kept up to date by its notifications.

Why a multiset (``Counter`` of rows): PROTOCOL.md defines a notification as the multiset
difference between two consecutive results, so only a multiset reproduces the query's result
exactly (a SELECT without DISTINCT may return the same row twice, and removing one copy must leave
the other). Rows are tuples of pyoxigraph terms in ``variables`` order (None where unbound), the
engine's own representation, so rows from the network and in-process transports compare equal.

The view is also what makes reconnection seamless: after a re-subscription the broker sends the
complete result again (sequence 0); :meth:`ResultView.diff` turns it into the added/removed rows
relative to what the application already holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from broker.api import Notification, QueryResult, Row, Term


def _aligned(variables: Sequence[str], source: Sequence[str], rows: Iterable[Row]) -> list[Row]:
    """Rows of `source` variable order rewritten in `variables` order (identity when equal)."""
    if tuple(variables) == tuple(source):
        return list(rows)
    position = {name: index for index, name in enumerate(source)}
    picks = [position.get(name) for name in variables]
    return [tuple(None if pick is None else row[pick] for pick in picks) for row in rows]


class ResultView:
    """A query's current result: a multiset of rows (SELECT) or a boolean (ASK)."""

    __slots__ = ("variables", "rows", "boolean", "inconsistencies")

    def __init__(self, variables: Sequence[str] = (), rows: Iterable[Row] = (), boolean: bool | None = None) -> None:
        self.variables: tuple[str, ...] = tuple(variables)
        self.rows: Counter[Row] = Counter(rows)
        self.boolean: bool | None = boolean
        # removals of rows the view did not hold: a broker bug; counted, never fatal for the application
        self.inconsistencies = 0

    @classmethod
    def of(cls, result: QueryResult) -> ResultView:
        """The view equal to a query result (what a fresh query returns)."""
        return cls(result.variables, result.rows, result.boolean)

    def apply(self, notification: Notification) -> None:
        """Apply one notification: removed rows first, then added rows (PROTOCOL.md order)."""
        if notification.boolean is not None:
            self.boolean = notification.boolean
            return
        if not self.variables and notification.variables:
            self.variables = tuple(notification.variables)
        removed = _aligned(self.variables, notification.variables, notification.removed)
        added = _aligned(self.variables, notification.variables, notification.added)
        rows = self.rows
        for row in removed:
            count = rows.get(row, 0)
            if count <= 1:
                if count == 0:
                    self.inconsistencies += 1
                rows.pop(row, None)
            else:
                rows[row] = count - 1
        for row in added:
            rows[row] += 1

    def diff(self, full: Notification) -> tuple[tuple[Row, ...], tuple[Row, ...]]:
        """(added, removed) that turn this view into the complete result carried by `full`.

        `full` is a sequence-0 notification (its added rows are the whole result). Multiset
        differences, so duplicates are handled exactly.
        """
        target = Counter(_aligned(self.variables or full.variables, full.variables, full.added))
        added = tuple((target - self.rows).elements())
        removed = tuple((self.rows - target).elements())
        return added, removed

    def __len__(self) -> int:
        return self.rows.total()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, QueryResult):
            other = ResultView.of(other)
        if not isinstance(other, ResultView):
            return NotImplemented
        if self.boolean is not None or other.boolean is not None:
            return self.boolean == other.boolean
        if self.variables == other.variables:
            return self.rows == other.rows
        if set(self.variables) != set(other.variables):
            return False
        return self.rows == Counter(_aligned(self.variables, other.variables, other.rows.elements()))

    __hash__ = None  # type: ignore[assignment]  # mutable

    def bindings(self) -> list[dict[str, Term]]:
        """The rows as {variable: term} dicts (unbound variables left out), for applications."""
        return [
            {name: term for name, term in zip(self.variables, row, strict=True) if term is not None}
            for row in self.rows.elements()
        ]

    def __repr__(self) -> str:
        if self.boolean is not None:
            return f"ResultView(boolean={self.boolean})"
        return f"ResultView(variables={self.variables}, rows={len(self)})"
