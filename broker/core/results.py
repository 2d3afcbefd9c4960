"""Plain result objects of the in-process API."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyoxigraph import Quad, Triple

from broker.sparql.terms import Row


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """What an update really changed: quads added and removed (net, as sets).

    A quad deleted and re-inserted by the same request is in neither; inserting an existing
    quad adds nothing. `timings` holds the per-stage seconds of this update.
    """

    added: frozenset[Quad]
    removed: frozenset[Quad]
    notifications: int = 0
    timings: dict[str, float] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, object]:
        return {"added": len(self.added), "removed": len(self.removed), "notifications": self.notifications}


@dataclass(frozen=True, slots=True)
class QueryResult:
    """A materialized query result.

    kind is "select" (variables + rows), "ask" (boolean) or "graph" (triples, for
    CONSTRUCT/DESCRIBE).
    """

    kind: str
    variables: tuple[str, ...] = ()
    rows: tuple[Row, ...] = ()
    boolean: bool | None = None
    triples: tuple[Triple, ...] = ()
