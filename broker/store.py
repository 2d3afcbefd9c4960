"""The embedded store: pyoxigraph in memory or in a data directory on disk.

The engine changes the store only through :meth:`RdfStore.apply` with an exact delta computed by
the update processor, so what subscriptions are told is exactly what the store did.

On disk, a delta's removals and additions are several pyoxigraph writes (pyoxigraph has no
multi-write transaction), so a process killed in the middle would leave an update half-applied.
The delta is therefore journalled first (`apply.journal` beside the `store` directory) and the
journal emptied once applied; a store opened with a non-empty, complete journal re-applies it
(removals and additions are idempotent), so after a crash every update is applied whole or not at
all. The journal is not fsync'd, like RocksDB's own write-ahead log: it guards against the process
being killed, not against power loss.

An update may carry an :class:`ApplyMark` (a delayed update firing does): its tag is journalled
with the delta and its `committed` callback runs after the store was changed and before the
journal is emptied. A journal re-applied at start-up keeps its tag in :attr:`RdfStore.recovered_tags`
(and on disk until the next apply), so whoever owns the tag learns that its update is in the store
even when the process was killed between the store write and the callback: that is what makes
delayed updates run exactly once across kill -9.

Replicas (the query workers of :mod:`broker.workers`) follow the store: :meth:`RdfStore.follow`
takes a snapshot and registers a follower atomically, and every later delta reaches each follower
(as the lists of quads and graphs the store applied), in the order the store applied them.

Layout of a data directory: `store/` (Oxigraph/RocksDB), `apply.journal` and `replicas/` (the
workers' checkpoints, hard links to the store's files).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from pyoxigraph import DefaultGraph, NamedNode, Quad, RdfFormat, Store, parse, serialize

from broker.core.clock import EngineClock

log = logging.getLogger(__name__)

JOURNAL = "apply.journal"
T = TypeVar("T")
Follower = Callable[[list[Quad], list[Quad], list[NamedNode], list[NamedNode]], None]
_MAGIC = b"SEPA-DELTA"


@dataclass(frozen=True, slots=True)
class ApplyMark:
    """A tag journalled with one delta, and what to do once that delta is in the store."""

    tag: str
    committed: Callable[[str], None]


def encode_journal_entry(
    added: list[Quad], removed: list[Quad], created: list[NamedNode], dropped: list[NamedNode], tag: str = ""
) -> bytes:
    """One journal record: the delta (N-Quads) and its tag, written before the store changes."""
    parts = [
        serialize(removed, format=RdfFormat.N_QUADS) if removed else b"",
        serialize(added, format=RdfFormat.N_QUADS) if added else b"",
        "\n".join(graph.value for graph in created).encode(),
        "\n".join(graph.value for graph in dropped).encode(),
        tag.encode(),
    ]
    header = _MAGIC + b" " + b" ".join(str(len(part)).encode() for part in parts) + b"\n"
    return header + b"".join(parts)


Journalled = tuple[list[Quad], list[Quad], list[NamedNode], list[NamedNode], str]


def _decode(data: bytes) -> Journalled | None:
    """The journalled delta and tag, or None when the journal is empty or was cut while being written."""
    header, newline, body = data.partition(b"\n")
    fields = header.split()
    if not newline or len(fields) not in (5, 6) or fields[0] != _MAGIC:
        return None
    sizes = [int(field) for field in fields[1:]]
    if len(body) != sum(sizes):
        return None
    parts, offset = [], 0
    for size in sizes:
        parts.append(body[offset : offset + size])
        offset += size
    removed = list(parse(parts[0], format=RdfFormat.N_QUADS)) if parts[0] else []
    added = list(parse(parts[1], format=RdfFormat.N_QUADS)) if parts[1] else []
    created = [NamedNode(line) for line in parts[2].decode().splitlines() if line]
    dropped = [NamedNode(line) for line in parts[3].decode().splitlines() if line]
    tag = parts[4].decode() if len(parts) > 4 else ""
    return added, removed, created, dropped, tag


class RdfStore:
    """A pyoxigraph Store plus the one mutating operation the engine uses."""

    def __init__(self, ox: Store, path: Path | None = None) -> None:
        self.ox = ox
        self.path = path
        self.clock = EngineClock()
        self._journal: BinaryIO | None = None
        self.recovered_tags: list[str] = []
        self.lock = threading.Lock()  # held while a delta is applied and sent to the followers
        self._followers: list[Follower] = []
        if path is not None:
            journal = path / JOURNAL
            self._recover(journal)
            self._journal = journal.open("r+b" if journal.exists() else "w+b")

    def query(self, sparql: str, **options: Any) -> Any:
        """pyoxigraph's query with the engine clock's SPARQL functions (broker.core.clock)."""
        return self.ox.query(sparql, custom_functions=self.clock.functions(), **options)

    @classmethod
    def memory(cls) -> RdfStore:
        return cls(Store())

    @classmethod
    def open(cls, path: str | Path) -> RdfStore:
        """Open (creating if needed) an on-disk store in the data directory `path`."""
        directory = Path(path)
        (directory / "store").mkdir(parents=True, exist_ok=True)
        return cls(Store(str(directory / "store")), directory)

    def _recover(self, journal: Path) -> None:
        """Finish an apply that a killed process left half done (see the module docstring)."""
        if not journal.exists():
            return
        delta = _decode(journal.read_bytes())
        if delta is not None:
            added, removed, created, dropped, tag = delta
            log.warning("finishing an interrupted update from the journal", extra={"quads": len(added) + len(removed)})
            self._apply(added, removed, created, dropped)
            self.ox.flush()
            if tag:
                self.recovered_tags.append(tag)
                return  # kept until the next apply, in case we are killed before the tag's owner hears of it
        journal.write_bytes(b"")

    @property
    def on_disk(self) -> bool:
        return self.path is not None

    def apply(
        self,
        added: Iterable[Quad],
        removed: Iterable[Quad],
        graphs_created: Iterable[NamedNode] = (),
        graphs_dropped: Iterable[NamedNode] = (),
        mark: ApplyMark | None = None,
    ) -> None:
        """Remove then add exactly these quads, then create/drop empty named graphs: whole or not at all.

        With a `mark`, its callback runs once the change is in the store (see the module docstring).
        """
        with self.lock:
            journal, followers = self._journal, self._followers
            if journal is None and not followers:
                self._apply(added, removed, graphs_created, graphs_dropped)
                if mark is not None:
                    mark.committed(mark.tag)
                return
            added, removed = list(added), list(removed)
            graphs_created, graphs_dropped = list(graphs_created), list(graphs_dropped)
            if not (added or removed or graphs_created or graphs_dropped or mark):
                return
            if journal is not None:
                tag = mark.tag if mark is not None else ""
                journal.seek(0)
                journal.write(encode_journal_entry(added, removed, graphs_created, graphs_dropped, tag))  # type: ignore[arg-type]
                journal.truncate()
                journal.flush()
            self._apply(added, removed, graphs_created, graphs_dropped)
            for follower in followers:
                follower(added, removed, graphs_created, graphs_dropped)  # type: ignore[arg-type]
            if mark is not None:
                mark.committed(mark.tag)
            if journal is not None:
                journal.seek(0)
                journal.truncate()
                journal.flush()

    def follow(self, follower: Follower) -> None:
        """Call `follower` with every later delta (added, removed, graphs created, graphs dropped),
        under the store's lock: it must only keep it. A replica that starts from a snapshot taken
        :meth:`at_rest` and applies the deltas that follow, in order, is the store."""
        with self.lock:
            self._followers = [*self._followers, follower]

    def unfollow(self, follower: Follower) -> None:
        with self.lock:
            self._followers = [each for each in self._followers if each is not follower]

    def at_rest(self, call: Callable[[RdfStore], T]) -> T:
        """`call(self)` while no delta is being applied (a snapshot between two deltas)."""
        with self.lock:
            return call(self)

    def _apply(
        self,
        added: Iterable[Quad],
        removed: Iterable[Quad],
        graphs_created: Iterable[NamedNode],
        graphs_dropped: Iterable[NamedNode],
    ) -> None:
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

    def close(self) -> None:
        """Flush and release the journal (the pyoxigraph store closes when dropped)."""
        self.flush()
        if self._journal is not None:
            self._journal.close()
            self._journal = None
