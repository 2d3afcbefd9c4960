"""A mirror of the latest-value graph, so that an update deletes old values as constants.

Deleting a known old triple is a constant in the DELETE template, which costs the engine nothing
to evaluate; deleting an unknown one needs OPTIONAL patterns in the WHERE clause. The adapter
keeps the mirror exact with two calls:

* `load(rows)` with the rows of LATEST_QUERY (the whole latest graph) at start-up, which makes the
  mirror *complete*: a (sensor, property) it does not hold has no node in the store;
* `apply(added, removed)` with the exact quads each committed update added and removed (the
  engine's UpdateResult, which the in-process client returns in `UpdateSummary.result`).

Without a complete mirror, `unknown(latest IRIs of a batch)` + `nodes_query` + `learn` fetch just
the nodes a batch touches before its update is built.

This is exact as long as nobody else writes the latest graph (it belongs to the adapters). When a
commit's outcome is unknown, or no delta is available (network transport), `clear()`: updates
then fall back to OPTIONAL patterns, slower but exact, until the next `load`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pyoxigraph import NamedNode, Quad

from broker.sparql.terms import term_from_json
from gateway.observations.vocabulary import GRAPH_LATEST, GW, LATEST_PREFIX, RDF_TYPE

LATEST_QUERY = f"SELECT ?latest ?p ?o WHERE {{ GRAPH <{GRAPH_LATEST}> {{ ?latest ?p ?o }} }}"


def nodes_query(iris: Iterable[str]) -> str:
    """LATEST_QUERY restricted to some latest nodes (for `learn`); the IRIs are hash IRIs we minted."""
    values = " ".join(f"<{iri}>" for iri in iris if iri.startswith(LATEST_PREFIX) and iri.isascii() and ">" not in iri)
    return f"SELECT ?latest ?p ?o WHERE {{ VALUES ?latest {{ {values} }} GRAPH <{GRAPH_LATEST}> {{ ?latest ?p ?o }} }}"


# Triples of a latest node that never change (its IRI is a hash of sensor and property).
FIXED_PREDICATES = frozenset({RDF_TYPE, GW + "sensor", GW + "property"})
SEQUENCE = GW + "sequenceNumber"
_INTEGER = re.compile(r'"(\d+)"\^\^<http://www\.w3\.org/2001/XMLSchema#integer>')
_GRAPH = NamedNode(GRAPH_LATEST)


class LatestCache:
    """Latest node IRI -> its (predicate IRI, object as SPARQL text) pairs; see the module docstring."""

    def __init__(self, *, max_entries: int = 200_000) -> None:
        self.nodes: dict[str, set[tuple[str, str]]] = {}
        self.complete = False
        self.max_entries = max_entries

    def known(self, iri: str) -> bool:
        """Whether the mirror knows exactly what the store holds for this node (maybe nothing)."""
        return iri in self.nodes or self.complete

    def changing(self, iri: str) -> list[tuple[str, str]]:
        """The node's triples an update must delete (all but the fixed ones), as (predicate, object)."""
        return sorted(pair for pair in self.nodes.get(iri, ()) if pair[0] not in FIXED_PREDICATES)

    def sequence(self, iri: str) -> int:
        """The node's gw:sequenceNumber (0 for a node the store does not have)."""
        for predicate, obj in self.nodes.get(iri, ()):
            if predicate == SEQUENCE:
                match = _INTEGER.fullmatch(obj)
                return int(match.group(1)) if match else 0
        return 0

    def unknown(self, iris: Iterable[str]) -> list[str]:
        """Those of these latest nodes the mirror does not know (query them with `nodes_query`)."""
        return [iri for iri in dict.fromkeys(iris) if not self.known(iri)]

    def learn(self, iris: Iterable[str], rows: Iterable[dict[str, Any]]) -> None:
        """Record the current content of these nodes: the rows of `nodes_query(iris)` (none = absent)."""
        for iri in iris:
            if len(self.nodes) < self.max_entries:
                self.nodes.setdefault(iri, set()).clear()
        for row in rows:
            subject, predicate, obj = _term(row["latest"]), _term(row["p"]), _term(row["o"])
            pairs = self.nodes.get(subject.value) if isinstance(subject, NamedNode) else None
            if pairs is not None and isinstance(predicate, NamedNode):
                pairs.add((predicate.value, str(obj)))

    def clear(self) -> None:
        """Forget everything: updates use OPTIONAL patterns until the next `load`."""
        self.nodes.clear()
        self.complete = False

    def load(self, rows: Iterable[dict[str, Any]]) -> None:
        """Replace the mirror with the rows of LATEST_QUERY (terms or SPARQL JSON objects)."""
        self.nodes.clear()
        for row in rows:
            subject, predicate, obj = _term(row["latest"]), _term(row["p"]), _term(row["o"])
            if isinstance(subject, NamedNode) and isinstance(predicate, NamedNode):
                self.nodes.setdefault(subject.value, set()).add((predicate.value, str(obj)))
        self.complete = len(self.nodes) <= self.max_entries
        if not self.complete:
            self.nodes.clear()

    def apply(self, added: Iterable[Quad], removed: Iterable[Quad]) -> None:
        """Follow one committed update's exact delta (quads outside the latest graph are ignored)."""
        for quad in removed:
            if quad.graph_name == _GRAPH and isinstance(quad.subject, NamedNode):
                pairs = self.nodes.get(quad.subject.value)
                if pairs is not None:
                    pairs.discard((quad.predicate.value, str(quad.object)))
        for quad in added:
            if quad.graph_name != _GRAPH or not isinstance(quad.subject, NamedNode):
                continue
            pairs = self.nodes.get(quad.subject.value)
            if pairs is None:
                if not self.complete:
                    continue  # a node first seen in a delta may have unchanged triples we never saw
                if len(self.nodes) >= self.max_entries:
                    self.complete = False  # we stop tracking: absence can no longer be assumed
                    continue
                pairs = self.nodes[quad.subject.value] = set()
            pairs.add((quad.predicate.value, str(quad.object)))


def _term(value: Any) -> Any:
    return term_from_json(value) if isinstance(value, dict) else value
