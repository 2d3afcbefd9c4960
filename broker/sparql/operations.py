"""The engine's plan of an update request: the operations the parser, the shape cache and the
syntax-tree planner (broker.sparql.plan) produce, and the update processor applies."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyoxigraph import NamedNode, Quad

from broker.sparql.patterns import QuadPattern, pattern_skeleton

GraphRef = NamedNode | str  # a graph IRI, or "DEFAULT" / "NAMED" / "ALL"


@dataclass(frozen=True, slots=True)
class DataOp:
    """INSERT DATA / DELETE DATA with ground quads (INSERT DATA blank nodes are renamed when run)."""

    insert: bool
    quads: tuple[Quad, ...]


@dataclass(frozen=True, slots=True)
class ModifyOp:
    """DELETE/INSERT ... WHERE (and DELETE WHERE, whose pattern is both template and WHERE).

    Template quads without variables or blank nodes are in `delete_ground` / `insert_ground`
    (instantiated once, whatever the solutions), the others in `delete` / `insert`.
    """

    delete: tuple[QuadPattern, ...]
    insert: tuple[QuadPattern, ...]
    where_query: str
    where_bgp: tuple[QuadPattern, ...] | None
    where_pins: tuple[tuple[str, NamedNode], ...]
    with_graph: NamedNode | None
    using: tuple[NamedNode, ...]
    using_named: tuple[NamedNode, ...]
    delete_ground: tuple[Quad, ...] = ()
    insert_ground: tuple[Quad, ...] = ()
    # OPTIONAL { triple patterns } blocks after `where_bgp`, applied in order (left joins): the
    # "replace a value that may not be there yet" update of SEPA applications
    where_optionals: tuple[tuple[QuadPattern, ...], ...] = ()
    # VALUES ?v { <iri> ... } joined with `where_bgp`: (v, the IRIs). The retention agent deletes a
    # list of observations so (gateway.observations.pruning.delete_update), as producers delete a
    # list of subjects: each is looked up in the indexes and its matched quads removed as found,
    # instead of reading every solution of the query engine back into Python
    where_values: tuple[str, tuple[NamedNode, ...]] | None = None
    # Derived from the fields above once, here: a cached request's operation is run many times.
    # where_skeleton: pattern_skeleton(where_bgp). delete_matches: per `delete` pattern, the index of
    # an identical `where_bgp` pattern or None; None when there is none at all.
    where_skeleton: tuple[tuple[str | None, ...], ...] | None = field(init=False, repr=False, compare=False)
    delete_matches: tuple[int | None, ...] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = self.where_bgp
        matches = None
        if where and self.delete:
            # one dict of each pattern's first index: `pattern in where` / `where.index(pattern)`
            # per DELETE pattern was O(delete x where), and a DELETE WHERE of 4,000 patterns (both)
            # held the update thread 8.6 s while it was parsed, before any time limit (bgp_plan.py)
            first: dict[QuadPattern, int] = {}
            for index, pattern in enumerate(where):
                first.setdefault(pattern, index)
            found = tuple(first.get(pattern) for pattern in self.delete)
            if any(index is not None for index in found):
                matches = found
        object.__setattr__(self, "where_skeleton", None if where is None else pattern_skeleton(where))
        object.__setattr__(self, "delete_matches", matches)


@dataclass(frozen=True, slots=True)
class GraphOp:
    """CLEAR, DROP, CREATE (target only) and ADD, MOVE, COPY (source and target)."""

    verb: str
    silent: bool
    target: GraphRef
    source: GraphRef | None = None


@dataclass(frozen=True, slots=True)
class LoadOp:
    silent: bool
    source: NamedNode
    into: NamedNode | None


Operation = DataOp | ModifyOp | GraphOp | LoadOp


@dataclass
class ParsedUpdate:
    operations: list[Operation] = field(default_factory=list)
