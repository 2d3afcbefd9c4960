"""The embedded store: pyoxigraph in memory or in a data directory on disk.

The engine changes the store only through :meth:`RdfStore.apply` with an exact delta computed by
the update processor, so what subscriptions are told is exactly what the store did.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pyoxigraph import DefaultGraph, NamedNode, Quad, Store

from broker.core.clock import EngineClock


class RdfStore:
    """A pyoxigraph Store plus the one mutating operation the engine uses."""

    def __init__(self, ox: Store, path: Path | None = None) -> None:
        self.ox = ox
        self.path = path
        self.clock = EngineClock()

    def query(self, sparql: str, **options: Any) -> Any:
        """pyoxigraph's query with the engine clock's SPARQL functions (broker.core.clock)."""
        return self.ox.query(sparql, custom_functions=self.clock.functions(), **options)

    @classmethod
    def memory(cls) -> RdfStore:
        return cls(Store())

    @classmethod
    def open(cls, path: str | Path) -> RdfStore:
        """Open (creating if needed) an on-disk store in `path`."""
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        return cls(Store(str(directory)), directory)

    @property
    def on_disk(self) -> bool:
        return self.path is not None

    def apply(
        self,
        added: Iterable[Quad],
        removed: Iterable[Quad],
        graphs_created: Iterable[NamedNode] = (),
        graphs_dropped: Iterable[NamedNode] = (),
    ) -> None:
        """Remove then add exactly these quads, then create/drop empty named graphs."""
        remove = self.ox.remove
        for quad in removed:
            remove(quad)
        for graph in graphs_dropped:
            self.ox.remove_graph(graph)
        self.ox.extend(added)
        for graph in graphs_created:
            self.ox.add_graph(graph)

    def graph_exists(self, graph: NamedNode | DefaultGraph) -> bool:
        return isinstance(graph, DefaultGraph) or self.ox.contains_named_graph(graph)

    def quads(self) -> set[Quad]:
        """Every quad (for tests and small stores)."""
        return set(self.ox.quads_for_pattern(None, None, None, None))

    def flush(self) -> None:
        if self.on_disk:
            self.ox.flush()
