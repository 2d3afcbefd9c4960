"""What the worker tests share: deltas as N-Quads, and a store compaction held mid-copy."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

import pytest
from pyoxigraph import Literal, NamedNode, Quad, RdfFormat, serialize

from broker.store import RdfStore

EX = "http://example.org/"


def nquads(numbers: Iterable[int]) -> bytes:
    quads = [Quad(NamedNode(f"{EX}s{n}"), NamedNode(f"{EX}p"), Literal(n)) for n in numbers]
    return serialize(quads, format=RdfFormat.N_QUADS)


@pytest.fixture
def held_compaction(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, ...]]:
    """A compaction whose copy waits until released (a copy takes ~1 s at 1,000 readings/s, and 23 s
    with two busy processes on a 2-core board, at its lowest priority): (copying, release, compacted)."""
    import broker.store.rdf_store as store_module

    copying, release, compacted = threading.Event(), threading.Event(), threading.Event()
    copy_live, compact = store_module.copy_live, RdfStore.compact

    def held_copy(source: object, target: object) -> int:
        copying.set()
        assert release.wait(30)
        return copy_live(source, target)  # type: ignore[arg-type]

    def compact_and_tell(self: RdfStore) -> int | None:
        try:
            return compact(self)
        finally:
            compacted.set()

    monkeypatch.setattr(store_module, "copy_live", held_copy)
    monkeypatch.setattr(RdfStore, "compact", compact_and_tell)
    yield copying, release, compacted
    release.set()
