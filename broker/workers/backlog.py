"""A query worker's deltas, kept unapplied until a job needs them, and netted meanwhile.

A replica only needs to hold the store's state when a job reaches it (:mod:`broker.workers.replica`
reads its socket in order, so a job still sees every delta sent before it). Kept as their N-Quads
lines, the deltas of a while come down to the last change of each quad: the latest-view churn of a
sensor gateway (each reading replaces the ~4 quads of its sensor's latest view that the reading
before added) then never touches the store but for the last value, where each delta applied as it
came loaded those quads (~5.6 us a quad, `Store.load`) and removed them again (~2-3 us a quad, and a
dead version each, hastening the replica's compactions). Figures: docs/architecture.md, "Query
workers".

Which quads the store holds before the backlog is applied is not known here: a replica replays the
deltas after its place in the log that its snapshot already holds, and those a request's provisional
deltas showed it (:meth:`broker.workers.pool.QueryWorkers._place`, `_settle`). So the net effect is
the last change of each quad, which is what replaying those deltas in order leaves too: a quad the
backlog last added is added, one it last removed is removed, and one whose first change here was an
addition (the store holds it only after such a replay) is looked up and removed only if present.
"""

from __future__ import annotations

import time

from broker.store import RdfStore

# applied without waiting for a job past this many bytes of N-Quads received, or this long after
# its first delta (a delta larger than MAX_BYTES is applied as it comes, after the backlog); at
# 1,000 readings/s, ~2 MB/s: a job waits for at most ~1 s of deltas (~25 ms) before it starts
MAX_BYTES = 4 << 20
MAX_AGE_S = 1.0

_ADDED = 1  # the last change of the line added its quad
_FIRST_ADDED = 2  # the first change of the line (since the backlog was last applied) added it


class Backlog:
    """The deltas received since the last :meth:`apply`, as the last change of each N-Quads line.

    A quad is one line of pyoxigraph's N-Quads (its serializer's, the same for equal quads), so a
    line stands for its quad; a newline inside a term is escaped, so the deltas split on b"\\n"."""

    def __init__(self) -> None:
        self._lines: dict[bytes, int] = {}  # a line -> _ADDED and _FIRST_ADDED bits
        self._bytes = 0
        self._since = 0.0  # time.monotonic() of the first delta kept

    def receive(
        self, store: RdfStore, added: bytes, removed: bytes, created: tuple[str, ...], dropped: tuple[str, ...]
    ) -> None:
        """One delta, in N-Quads, for `store`: kept, or (creating or dropping a graph, whose effect
        on the quads in it depends on the store, or larger than MAX_BYTES) applied after the backlog."""
        if created or dropped or len(added) + len(removed) > MAX_BYTES:
            self.apply(store)
            store.apply_nquads(added, removed, created, dropped)
            return
        self.add(added, removed)
        if self._bytes >= MAX_BYTES or self.wait_s() == 0.0:
            self.apply(store)

    def add(self, added: bytes, removed: bytes) -> None:
        """Keep a delta (its removals before its additions, as :meth:`RdfStore.apply` applies them)."""
        if not self._lines:
            self._since = time.monotonic()
        lines = self._lines
        for part, change in ((removed, 0), (added, _ADDED)):
            for line in part.split(b"\n"):
                if line:
                    before = lines.get(line)
                    lines[line] = change | (change << 1) if before is None else (before & _FIRST_ADDED) | change
        self._bytes += len(added) + len(removed)

    def wait_s(self) -> float | None:
        """How long it may still wait for a job (0: apply it now); None when empty."""
        if not self._lines:
            return None
        return max(0.0, self._since + MAX_AGE_S - time.monotonic())

    def apply(self, store: RdfStore) -> None:
        """Apply the net effect of the deltas kept to `store`, and forget them."""
        if not self._lines:
            return
        added, removed, churned = [], [], []
        for line, changes in self._lines.items():
            if changes & _ADDED:
                added.append(line)
            else:
                (churned if changes & _FIRST_ADDED else removed).append(line)
        self._lines, self._bytes = {}, 0
        store.apply_nquads(_joined(added), _joined(removed), (), (), _joined(churned))


def _joined(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n" if lines else b""
