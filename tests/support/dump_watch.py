"""Where a store's dumps went: a compaction's copy and a checkpoint must not make their dump into
bytes under the GIL (:func:`broker.store.dump_nquads`)."""

from __future__ import annotations

from typing import Any


class DumpWatch:
    """A pyoxigraph store that records where each of its dumps was written (None: into bytes)."""

    def __init__(self, ox: Any) -> None:
        self.ox = ox
        self.outputs: list[object] = []

    def dump(self, output: object = None, format: Any = None, **options: Any) -> Any:  # noqa: A002 - pyoxigraph's
        self.outputs.append(output)
        return self.ox.dump(output, format, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ox, name)
