"""Graph access rights of one request: which graphs it may read and which it may write.

Why in the engine and not only in the gates: reading is enforced by the dataset a request is
evaluated on, so a client that may read some graphs only ever evaluates its query, its
subscription or its update's WHERE clause over those graphs; no result row, notification or
derived quad can come from another one. Writing is enforced on the exact delta the update
processor computes, before anything is applied: whatever form the update takes (DATA, templates
with ``GRAPH ?g``, DROP ALL, MOVE...), every quad it would add or remove and every graph it would
create or drop must be in a writable graph, or nothing happens (403).

The store's default graph is named :data:`DEFAULT_GRAPH_IRI` in rights and protocol datasets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyoxigraph import DefaultGraph, NamedNode, Quad

from broker.errors import Forbidden
from broker.sparql.datasets import dataset_clauses

# names the store's default graph wherever graphs are given as IRIs (rights, default-graph-uri)
DEFAULT_GRAPH_IRI = "urn:x-sepa:default-graph"
# an explicitly empty list of named graphs in a protocol dataset (an empty list means "not given")
NO_GRAPH_IRI = "urn:x-sepa:no-graph"

GraphTerm = NamedNode | DefaultGraph


def graph_term(iri: str) -> GraphTerm:
    return DefaultGraph() if iri == DEFAULT_GRAPH_IRI else NamedNode(iri)


@dataclass(frozen=True)
class GraphAccess:
    """The graphs a request may read and write, as IRIs (:data:`DEFAULT_GRAPH_IRI` for the default
    graph); ``None`` means every graph."""

    read: frozenset[str] | None = None
    write: frozenset[str] | None = frozenset()

    def readable_terms(self) -> frozenset[GraphTerm] | None:
        return None if self.read is None else frozenset(graph_term(iri) for iri in self.read)

    def may_read(self, iri: str) -> bool:
        return self.read is None or iri in self.read

    def may_write(self, iri: str) -> bool:
        return self.write is None or iri in self.write

    def restrict_dataset(
        self,
        default_graph_uri: Sequence[str],
        named_graph_uri: Sequence[str],
        sparql: str | None = None,
        base_iri: str | None = None,
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The protocol dataset a query or subscription of this client is evaluated on.

        Unrestricted readers keep what they asked for. For the others, a requested graph (protocol
        parameters, else the FROM / FROM NAMED of `sparql`) they may not read is a 403 (a clear
        error, not a silently smaller answer); with no dataset requested, the dataset is every
        graph they may read: the default graph (if readable) as default graph, the readable named
        graphs as named graphs.
        """
        default, named = tuple(default_graph_uri), tuple(named_graph_uri)
        if self.read is None:
            return default, named
        if not (default or named) and sparql is not None:
            default, named = dataset_clauses(sparql, base_iri)
        if default or named:
            refused = [iri for iri in (*default, *named) if iri not in self.read and iri != NO_GRAPH_IRI]
            if refused:
                raise Forbidden(f"this client may not read the graph <{refused[0]}>")
            return default, named or (NO_GRAPH_IRI,)
        if not self.read:
            raise Forbidden("this client may not read any graph")
        readable_named = tuple(sorted(iri for iri in self.read if iri != DEFAULT_GRAPH_IRI))
        default = (DEFAULT_GRAPH_IRI,) if DEFAULT_GRAPH_IRI in self.read else ()
        return default, readable_named or (NO_GRAPH_IRI,)

    def readable_quads(self, quads: frozenset[Quad]) -> frozenset[Quad]:
        """The quads of `quads` in graphs this client may read (all of them for unrestricted readers)."""
        if self.read is None:
            return quads
        readable = self.readable_terms()
        assert readable is not None
        return frozenset(quad for quad in quads if quad.graph_name in readable)

    def writable_terms(self) -> frozenset[GraphTerm] | None:
        return None if self.write is None else frozenset(graph_term(iri) for iri in self.write)

    def check_writes(self, delta: object) -> None:
        """Raise Forbidden unless every quad and graph the delta touches is writable (the graphs a
        request writes to whatever the store holds are checked while it is computed:
        ``UpdateProcessor.compute(writable=...)``)."""
        if self.write is None:
            return
        writable = frozenset(graph_term(iri) for iri in self.write)
        for quads in (delta.added, delta.removed):  # type: ignore[attr-defined]
            for quad in quads:
                if quad.graph_name not in writable:
                    raise Forbidden(f"this client may not write to {self._shown(quad.graph_name)}")
        for graph in (*delta.graphs_created, *delta.graphs_dropped):  # type: ignore[attr-defined]
            if graph not in writable:
                raise Forbidden(f"this client may not create or drop {self._shown(graph)}")

    def _shown(self, graph: object) -> str:
        """`graph` as an error names it: not at all if this client may not read it. Why: DROP ALL,
        CLEAR NAMED and DROP SILENT NAMED touch every graph there is, and the refusal named one
        the client could neither read nor write (`<http://hr/salaries-2025-confidential>`)."""
        if isinstance(graph, DefaultGraph):
            return "the graph DEFAULT" if self.may_read(DEFAULT_GRAPH_IRI) else "a graph it may not read"
        readable = isinstance(graph, NamedNode) and self.may_read(graph.value)
        return f"the graph {graph}" if readable else "a graph it may not read"
