"""The LUTT: one index over the quad patterns of every subscription (seed 001 §III, seed 003).

As in the TP-automata of seed 003, a pattern is reduced to which of subject, predicate, object
are constants (a *mask*) plus the constants themselves; every pattern with the same mask lives in
one hash table keyed by its constants and its graph. Matching a changed quad is then at most
8 masks x 3 graph keys hash lookups, however many subscriptions there are (10 or 100,000).

Graph keys: a graph IRI or DefaultGraph for fixed graphs, NAMED for `GRAPH ?g` over all named
graphs, ANY for patterns that may match in any graph.

An entry maps a *reference* (what to evaluate: a shape pattern or a re-evaluating SPU) to the
set of SPUs registered under that key, or to None when the whole shape is concerned.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from pyoxigraph import DefaultGraph, Quad

NAMED = "named"
ANY = "any"

Key = tuple[int, object, object, object, object]


def make_key(graph: object, subject: object, predicate: object, obj: object) -> Key:
    """Key of a pattern; None positions are wildcards."""
    mask = (subject is not None) | (predicate is not None) << 1 | (obj is not None) << 2
    return (mask, graph, subject, predicate, obj)


class Lutt:
    """Look-up table of triple patterns -> references (with refcounted SPU sets)."""

    def __init__(self) -> None:
        self._entries: dict[Key, dict[Hashable, set[object] | None]] = {}
        self._mask_use: dict[int, int] = {}
        self._masks: tuple[int, ...] = ()
        # Entries per graph key: a quad in a graph no pattern names (a batch's observations, when every
        # subscription watches the latest view) is dismissed with one lookup instead of masks x graph keys.
        self._graph_use: dict[object, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, key: Key, ref: Hashable, spu: object | None) -> None:
        """Register `ref` under `key`: for one SPU, or for all SPUs of the shape when spu is None."""
        refs = self._entries.get(key)
        if refs is None:
            refs = self._entries[key] = {}
            self._mask_use[key[0]] = self._mask_use.get(key[0], 0) + 1
            self._masks = tuple(sorted(self._mask_use))
            self._graph_use[key[1]] = self._graph_use.get(key[1], 0) + 1
        if spu is None:
            refs[ref] = None
        else:
            spus = refs.setdefault(ref, set())
            if spus is not None:
                spus.add(spu)

    def remove(self, key: Key, ref: Hashable, spu: object | None) -> None:
        refs = self._entries.get(key)
        if refs is None or ref not in refs:
            return
        if spu is None:
            del refs[ref]
        else:
            spus = refs[ref]
            if spus is not None:
                spus.discard(spu)
                if spus:
                    return
            del refs[ref]
        if not refs:
            del self._entries[key]
            self._mask_use[key[0]] -= 1
            if not self._mask_use[key[0]]:
                del self._mask_use[key[0]]
            self._masks = tuple(sorted(self._mask_use))
            self._graph_use[key[1]] -= 1
            if not self._graph_use[key[1]]:
                del self._graph_use[key[1]]

    def match(self, quad: Quad) -> list[tuple[Hashable, set[object] | None]]:
        """Every (reference, SPUs) whose pattern the quad matches."""
        graph = quad.graph_name
        use = self._graph_use
        keys = (graph, ANY) if isinstance(graph, DefaultGraph) else (graph, NAMED, ANY)
        graphs = [key for key in keys if key in use]
        if not graphs:
            return []
        subject, predicate, obj = quad.subject, quad.predicate, quad.object
        entries = self._entries
        found: list[tuple[Hashable, set[object] | None]] = []
        for mask in self._masks:
            s = subject if mask & 1 else None
            p = predicate if mask & 2 else None
            o = obj if mask & 4 else None
            for graph_key in graphs:
                refs = entries.get((mask, graph_key, s, p, o))
                if refs:
                    found.extend(refs.items())
        return found

    def match_all(self, quads: Iterable[Quad]) -> dict[Hashable, list[tuple[Quad, set[object] | None]]]:
        """References hit by any of the quads, each with the quads (and SPUs) that hit it."""
        hits: dict[Hashable, list[tuple[Quad, set[object] | None]]] = {}
        use = self._graph_use
        own_graph_only = NAMED not in use and ANY not in use  # then a quad can only hit through its own graph
        for quad in quads:
            if own_graph_only and quad.graph_name not in use:
                continue
            for ref, spus in self.match(quad):
                hits.setdefault(ref, []).append((quad, spus))
        return hits
