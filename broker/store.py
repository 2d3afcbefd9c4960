"""The embedded store: pyoxigraph in memory or in a data directory on disk.

The engine changes the store only through :meth:`RdfStore.apply` with an exact delta computed by
the update processor, so what subscriptions are told is exactly what the store did.

On disk, pyoxigraph has no way to sync RocksDB's own write-ahead log. So every delta is first
appended to a journal (`apply.journal` beside the `store` directory), then written to RocksDB in
one transaction (one SPARQL update, :meth:`RdfStore._apply` says why), and the journal is the
gateway's write-ahead log: :meth:`RdfStore.sync` makes what it holds durable (fdatasync), and the
scheduler acknowledges updates only after it (group commit: one sync per batch of updates the
update thread ran back to back). Every CHECKPOINT_BYTES of journal the store is flushed (RocksDB
writes and syncs its memtables to table files) and the journal emptied. A store opened with a
journal re-applies it in order (removals and additions are idempotent) up to its last complete
record: after a kill or a power cut, every acknowledged update is in the store, whole, and an
update cut in the middle is either whole or absent.
A record cut at the end of the file (what a crash while appending leaves) is cut off; a journal
damaged anywhere else refuses the start, naming the file and the offset, and is kept as it is
(:func:`_read_journal`).

An update may carry an :class:`ApplyMark` (a delayed update firing does): its tag is journalled
with the delta, the journal synced, and its `committed` callback runs after the store was changed.
Tags re-applied at start-up are in :attr:`RdfStore.recovered_tags`, so whoever owns the tag learns
that its update is in the store even when the process died between the store write and the
callback: that is what makes delayed updates run exactly once across kill -9 and power cuts.

A request of several operations is computed by applying them one by one and undoing them all
(:mod:`broker.core.update_processor`): those deltas are journalled as *provisional*, and the undo
that ends them as *settling* them. A journal replay that ends with provisional deltas not settled
(the gateway was killed, or the power cut, while such a request ran) undoes them, journalled as a
settling record, so that no operation of a request is kept without the others; no checkpoint is
taken while deltas are provisional (it would empty the journal that tells how to undo them).

Replicas (the query workers of :mod:`broker.workers`) follow the store: :meth:`RdfStore.follow`
takes a snapshot and registers a follower atomically, and every later delta reaches each follower
(as the lists of quads and graphs the store applied), in the order the store applied them.

Dead versions: pyoxigraph keeps what an update removed. In memory, a removed quad stays in the
indexes for good (500,000 quads inserted then removed: RSS +340 MB, and a scan of the empty store
9 ms); on disk, RocksDB keeps tombstones until it compacts. A value replaced 50,000 times made a
lookup of it 55x slower in memory (0.018 -> 1.0 ms) and 250x on disk (0.021 -> 5.25 ms). So the
store counts what it removed (:attr:`RdfStore.garbage`) and :meth:`RdfStore.compact` rebuilds an
in-memory store from its live quads (then swaps it in) or has RocksDB compact (Store.optimize,
which lets go of the GIL); :mod:`broker.compaction` decides when.

Resident (:meth:`RdfStore.open` with `resident=True`, the appliance's default): the store is
pyoxigraph's in-memory one, and the data directory holds what rebuilds it: `snapshot.nq` (the store
as N-Quads, written whole to a temporary file, synced, then renamed) and two journals,
`apply.journal.0` and `apply.journal.1`, each starting with a record naming its generation. Deltas
are journalled and synced exactly as on RocksDB, then applied in memory. A checkpoint
(:meth:`RdfStore.checkpoint`, on the compaction thread) switches to the other journal under the lock
(a sync, a truncate, a header: milliseconds), then dumps the store without the lock or the GIL and
writes it as the snapshot of every generation before the new one; the journal it left is then
stale, and only a stale journal is ever switched to. At start the snapshot is loaded and every
journal of a later generation replayed, oldest first: a delta the snapshot already holds is replayed
harmlessly (the last delta naming a quad or graph decides it, as in :meth:`RdfStore.compact`). A
snapshot cut short, or journals that do not follow it without a gap, refuse the start
(:func:`_load_snapshot`, :meth:`RdfStore._check_contiguous`). Why:
RocksDB costs ~12 us a quad added and ~6.5 us one removed on the 2-core test machine, ~30 quad
writes a reading, so on disk the gateway could not keep up with 1,000 readings/s, where in memory it
runs at a fraction of a core (docs/architecture.md, "The store"). Cost: the whole store in memory,
in the gateway and in each replica (on RocksDB a replica is a checkpoint sharing its files).

One process at a time: :meth:`RdfStore.open` takes an exclusive flock on `gateway.lock` in the data
directory and refuses, naming the directory and the holder's pid, when another process holds it.
Without it two gateways on one directory both ran: on a fresh directory the second's journal,
opened from its start, was written over by the first's records, a checkpoint of either marked the
other's synced deltas covered, and acknowledged updates were gone after a restart (found by the
durability attack pass). The lock goes with the process (a kill -9 too); the query workers and the
sync helper are exec'd children, which do not inherit it (Python's descriptors are close-on-exec).

Layout of a data directory: `gateway.lock`, `store/` (Oxigraph/RocksDB) and `apply.journal`, or, resident,
`snapshot.nq`, `apply.journal.0` and `apply.journal.1`; `replicas/` (the query workers'
checkpoints, hard links to RocksDB's files) and `replicas-reeval/` (the re-evaluation worker's).
A RocksDB data directory opened resident is converted once: its journal replayed, the store written
as the snapshot, then `store/` and `apply.journal` removed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import re
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from pyoxigraph import BlankNode, DefaultGraph, Literal, NamedNode, Quad, RdfFormat, Store, parse, serialize

from broker.background import at_low_priority
from broker.core.clock import EngineClock
from broker.errors import StoreFailed
from broker.headroom import Headroom

log = logging.getLogger(__name__)

JOURNAL = "apply.journal"
# the file a process holding the data directory keeps locked (flock), its pid written in it
LOCK = "gateway.lock"
# how long an open waits for the lock before refusing: a gateway still stopping (a checkpoint at
# close) lets go of it within seconds, and a refusal at once would spend one of systemd's starts
LOCK_WAIT_S = 5.0
# resident: the store's snapshot, and the two journals that alternate (see the module docstring)
SNAPSHOT = "snapshot.nq"
JOURNALS = ("apply.journal.0", "apply.journal.1")
_SNAPSHOT_MAGIC = b"SEPA-SNAPSHOT"
# the tag of the record a resident journal starts with, followed by its generation
GENERATION = "\x00generation "
# journal size past which the store is flushed and the journal emptied (bounds the replay at start)
CHECKPOINT_BYTES = 16 << 20
# resident: ...and at least this many times the last snapshot's size. Why: a checkpoint writes the
# whole store, so with a fixed 16 MB a store of 18 MB (133,000 quads: 100 sensors with retention) at
# 1,000 readings/s (~3 MB of journal a second) was written every ~5 s, more than the journal itself,
# on a board's SD card; at 2 the snapshots write at most half what the journal does, and a start
# replays at most twice the snapshot's size
SNAPSHOT_RATIO = 2
# quads of a delta written to RocksDB in one transaction at most: pyoxigraph holds a transaction's
# writes in memory (200,000 removals as one update: RSS +94 MB, 2.2 s; quad by quad 2.5 s)
ONE_WRITE_QUADS = 20_000
# a compaction replays the deltas that came during its copy without the lock, round after round,
# until at most REPLAY_LOCKED_MAX are left for under it (each round is shorter than the last: a
# replay costs less than the update that made the delta); at most REPLAY_ROUNDS_MAX rounds
REPLAY_LOCKED_MAX = 4
REPLAY_ROUNDS_MAX = 20
# in memory, the quads removed since the last compaction are also counted by subject, in this many
# buckets (a hash of the subject's): broker.compaction's rule for a key replaced again and again
HOT_BUCKETS = 4096
HOT_MASK = HOT_BUCKETS - 1
# a removed quad whose object is a literal longer than this counts once more for each this many
# characters in RdfStore.garbage (see _dead_weight)
DEAD_CHARS = 256
T = TypeVar("T")
# a store's follower: called with each delta (added, removed, graphs created, graphs dropped) and its
# sequence tag (PROVISIONAL, SETTLED or "": see RdfStore.apply)
Follower = Callable[[list[Quad], list[Quad], list[NamedNode], list[NamedNode], str], None]
_MAGIC = b"SEPA-DELTA"
# tags of the records of a request's operations and of the undo that settles them (a tag starting
# with NUL is no delayed update's: see ApplyMark)
PROVISIONAL = "\x00provisional"
SETTLED = "\x00settled"


def copy_live(source: Store, target: Store) -> int:
    """Copy every quad of `source` (a snapshot of it) into `target`; how many.

    Through N-Quads, because pyoxigraph dumps and loads without the GIL: 280,000 quads (39 MB)
    dumped in 0.3 s and loaded in 0.7 s with no other thread of the process held up for more than
    6 ms, where copying them as Python objects, 2,000 at a time, held the GIL 1.5-4 s in ~6 ms bites
    (the readings' notification latency was 100-130 ms throughout). Both at the lowest CPU priority
    (:func:`broker.background.at_low_priority`): the gateway's replicas compact at the same moment.
    `Store.load` renames blank nodes, so the lines holding one (rare: readings and mappings have none) are parsed with
    `parse`, which keeps their labels, and added as Python objects.

    Nothing here scans the dump under the GIL: counting its lines and looking for ``_:`` in it held
    every other thread 10-22 ms each (125,000 quads, ~17 MB); libc's memmem through ctypes lets go
    of it, and the copy is counted by a query on `target`, which pyoxigraph evaluates without it."""
    load_keeping_labels(at_low_priority(source.dump, format=RdfFormat.N_QUADS), target)
    return at_low_priority(count_quads, target)


def load_keeping_labels(data: bytes, target: Store, *, background: bool = True) -> None:
    """Add the N-Quads `data` to `target`, blank nodes keeping their labels (see :func:`copy_live`);
    at the lowest priority when `background` (a compaction's copy), else at the caller's (a replica
    being seeded: a query waits for it)."""
    if _contains(data, b"_:"):
        lines = data.split(b"\n")
        target.extend(parse(b"\n".join(line for line in lines if b"_:" in line), format=RdfFormat.N_QUADS))
        data = b"\n".join(line for line in lines if b"_:" not in line)
    if background:
        at_low_priority(target.load, data, format=RdfFormat.N_QUADS, lenient=True)
    else:
        target.load(data, format=RdfFormat.N_QUADS, lenient=True)


def count_quads(store: Store) -> int:
    """How many quads `store` holds, counted by a query, which pyoxigraph evaluates without the GIL
    (`len(store)` held it 38-41 ms for 280,000 quads; ~390 ns a quad, 130 ms for 334k)."""
    return int(next(iter(store.query(_COUNT_ALL)))["n"].value)


_COUNT_ALL = "SELECT (COUNT(*) AS ?n) WHERE { { ?s ?p ?o } UNION { GRAPH ?g { ?s ?p ?o } } }"
_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.memmem.restype = ctypes.c_void_p
_libc.memmem.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)


def _contains(data: bytes, needle: bytes) -> bool:
    """`needle in data`, without the GIL (ctypes lets go of it around a call into a CDLL)."""
    return _libc.memmem(data, len(data), needle, len(needle)) is not None


def _delta_update(
    added: list[Quad], removed: list[Quad], created: list[NamedNode], dropped: list[NamedNode]
) -> str | None:
    """A delta as one SPARQL update, in :meth:`RdfStore._apply`'s order; None when a term of it
    cannot be written in one (a blank node, which DELETE DATA refuses and INSERT DATA renames, or a
    triple term)."""
    if not all(type(graph) is NamedNode for graph in (*created, *dropped)):
        return None
    deleted, inserted = _data(removed), _data(added)
    if deleted is None or inserted is None:
        return None
    operations = [f"DELETE DATA {{\n{deleted}\n}}"] if deleted else []
    operations += [f"DROP SILENT GRAPH {graph}" for graph in dropped]
    operations += [f"INSERT DATA {{\n{inserted}\n}}"] if inserted else []
    operations += [f"CREATE SILENT GRAPH {graph}" for graph in created]
    return " ;\n".join(operations) or None


def _data(quads: list[Quad]) -> str | None:
    """The body of an INSERT DATA or DELETE DATA holding `quads`; None if one cannot be written there.

    From each triple's N-Triples text (pyoxigraph's, valid SPARQL: 0.3 us a quad, where four terms
    formatted apart cost 1.8 us); one holding `_:` or `<<` may hold a blank node or a triple term,
    and rare false alarms (a literal or an IRI with those characters) only cost the quad-by-quad way.
    """
    lines = []
    for quad in quads:
        triple, graph = str(quad.triple), quad.graph_name
        if "_:" in triple or "<<" in triple:
            return None
        if type(graph) is NamedNode:
            lines.append(f"GRAPH {graph} {{ {triple} }}")
        elif type(graph) is DefaultGraph:
            lines.append(f"{triple} .")
        else:
            return None
    return "\n".join(lines)


def _pieces(
    added: list[Quad], removed: list[Quad], created: list[NamedNode], dropped: list[NamedNode]
) -> Iterator[tuple[list[Quad], list[Quad], list[NamedNode], list[NamedNode]]]:
    """The delta, or its parts of at most ONE_WRITE_QUADS quads each, in the order they apply in."""
    if len(added) + len(removed) <= ONE_WRITE_QUADS:
        yield added, removed, created, dropped
        return
    for start in range(0, len(removed), ONE_WRITE_QUADS):
        yield [], removed[start : start + ONE_WRITE_QUADS], [], []
    yield [], [], [], dropped
    for start in range(0, len(added), ONE_WRITE_QUADS):
        yield added[start : start + ONE_WRITE_QUADS], [], [], []
    yield [], [], created, []


def _updated(ox: Store, update: str) -> bool:
    """Run a delta's update; False, having written nothing, if a literal of it does not parse back."""
    try:
        ox.update(update)
    except SyntaxError:
        return False
    return True


def _dead_weight(quad: Quad) -> int:
    """What a removed quad counts in RdfStore.garbage: 1, and once more for each DEAD_CHARS
    characters of a long literal object. Why: a dead version keeps its terms until a compaction,
    and counted by quads alone, a client inserting and deleting a 900,000-character literal 300
    times took a 588-quad store's gateway from 82 to 355 MB, and each query worker's replica to 448
    MB, before a compaction came. Only the object is weighed: long terms are literals, and this
    runs for every removal (~0.5 us, a reading's delta removes ~4 quads of its ~370 us)."""
    term = quad.object
    return 1 + len(term.value) // DEAD_CHARS if type(term) is Literal else 1


def _apply_quads(
    ox: Store,
    added: Iterable[Quad],
    removed: Iterable[Quad],
    created: Iterable[NamedNode],
    dropped: Iterable[NamedNode],
    hot: list[int] | None = None,
) -> int:
    """Apply a delta quad by quad (each removal a transaction of its own); the number removed.
    `hot`: the removals counted by subject too (:attr:`RdfStore.hot`)."""
    count = 0
    if hot is None:
        for quad in removed:
            ox.remove(quad)
            count += _dead_weight(quad)
    else:
        for quad in removed:
            ox.remove(quad)
            hot[hash(quad.subject) & HOT_MASK] += 1
            count += _dead_weight(quad)
    for graph in dropped:
        ox.remove_graph(graph)
    ox.extend(added)
    for graph in created:
        ox.add_graph(graph)
    return count


def _load_nquads(
    ox: Store,
    added: bytes,
    removed: bytes,
    created: list[NamedNode],
    dropped: list[NamedNode],
    hot: list[int] | None = None,
) -> int:
    """Apply a delta that came as N-Quads, the added quads loaded by pyoxigraph (no ``_:`` in
    them: `Store.load` renames blank nodes); the number removed (and by subject in `hot`)."""
    count = 0
    if removed:
        count = _apply_quads(ox, (), parse(removed, format=RdfFormat.N_QUADS), (), (), hot)
    for graph in dropped:
        ox.remove_graph(graph)
    if added:
        ox.load(added, format=RdfFormat.N_QUADS)
    for graph in created:
        ox.add_graph(graph)
    return count


# a delta a compaction recorded: as N-Quads (True) or as quads (False), then added, removed, graphs
# created, graphs dropped
RecordedDelta = tuple[bool, Any, Any, list[NamedNode], list[NamedNode]]


class _Recording:
    """A compaction's follower: the deltas applied during its copy, for :meth:`RdfStore.compact` to
    replay into the copy, each as it came. Why keep a replica's N-Quads as they are: replayed (and
    applied, since a follower made the replica take the slow way) as Python quads, a replica
    compacting beside its jobs fell 32 MB of deltas behind in a 15 s phase at 1,000 readings/s
    with the dashboard open, and the pool replaced both (where the build before, which compacted
    between messages, did not)."""

    def __init__(self) -> None:
        self.deltas: list[RecordedDelta] = []

    def __call__(
        self, added: list[Quad], removed: list[Quad], created: list[NamedNode], dropped: list[NamedNode], _: str
    ) -> None:
        self.deltas.append((False, added, removed, created, dropped))

    def nquads(self, added: bytes, removed: bytes, created: list[NamedNode], dropped: list[NamedNode]) -> None:
        self.deltas.append((True, added, removed, created, dropped))


def _replay(ox: Store, delta: RecordedDelta) -> None:
    as_nquads, added, removed, created, dropped = delta
    (_load_nquads if as_nquads else _apply_quads)(ox, added, removed, created, dropped)


@dataclass(frozen=True, slots=True)
class ApplyMark:
    """A tag journalled with one delta, and what to do once that delta is in the store."""

    tag: str
    committed: Callable[[str], None]


def graph_text(graph: NamedNode | BlankNode) -> str:
    """A graph name as it travels in a journal record or to a worker: ``<iri>`` or ``_:label``.

    Why not the bare IRI: a graph name may be a blank node (pyoxigraph takes
    ``INSERT { GRAPH ?x { ... } } WHERE { BIND(BNODE() AS ?x) }``), and a DROP ALL then crashed every
    replica that read its label back as an IRI (its subscriptions ended, the next query failed)."""
    return str(graph)


def graph_named(text: str) -> NamedNode | BlankNode:
    """The graph name :func:`graph_text` wrote (a bare IRI: a journal written before it)."""
    if text.startswith("_:"):
        return BlankNode(text[2:])
    if text.startswith("<") and text.endswith(">"):
        return NamedNode(text[1:-1])
    return NamedNode(text)


def encode_journal_entry(
    added: list[Quad], removed: list[Quad], created: list[NamedNode], dropped: list[NamedNode], tag: str = ""
) -> bytes:
    """One journal record: the delta (N-Quads) and its tag, written before the store changes."""
    parts = [
        serialize(removed, format=RdfFormat.N_QUADS) if removed else b"",
        serialize(added, format=RdfFormat.N_QUADS) if added else b"",
        "\n".join(map(graph_text, created)).encode(),
        "\n".join(map(graph_text, dropped)).encode(),
        tag.encode(),
    ]
    header = _MAGIC + b" " + b" ".join(str(len(part)).encode() for part in parts) + b"\n"
    return header + b"".join(parts)


Journalled = tuple[list[Quad], list[Quad], list[NamedNode], list[NamedNode], str]


# a record's header line: the magic and the sizes of its parts (four: a journal written before tags)
_HEADER = re.compile(rb"SEPA-DELTA(?: \d+){4,5}\n")


class JournalDamaged(Exception):
    """A journal record that is not what the store wrote, followed by more than a crash leaves."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset, self.reason = offset, reason


def _decode(data: bytes, limit: int | None = None) -> tuple[list[Journalled], int]:
    """The journalled deltas with their tags, in order, up to the last complete record (at most
    `limit` of them), and the bytes those records take; what follows is for :func:`_torn` to judge.
    JournalDamaged for a record whose header is whole and whose parts do not decode, unless it is
    the last one and holds zeros (a power cut that lengthened the file but lost its data).

    By offsets into `data`: slicing off each record's rest copied what followed it, and a 16 MB
    journal of 3,647 readings-like deltas took 2.8 s to decode (quadratic), a start's whole wait."""
    entries: list[Journalled] = []
    position, whole = 0, len(data)
    while position < whole and (limit is None or len(entries) < limit):
        newline = data.find(b"\n", position)
        if newline < 0 or _HEADER.fullmatch(data, position, newline + 1) is None:
            break
        sizes = [int(field) for field in data[position:newline].split()[1:]]
        offset = newline + 1
        if whole - offset < sum(sizes):
            break  # cut while being written: never acknowledged
        parts = []
        for size in sizes:
            parts.append(data[offset : offset + size])
            offset += size
        try:
            entries.append(_entry(parts))
        except (SyntaxError, ValueError) as error:
            if b"\0" in data[position:offset] and not data[offset:].strip(b"\0"):
                break
            raise JournalDamaged(position, f"its record there does not decode: {_one_line(error)}") from None
        position = offset
    return entries, position


def _one_line(error: Exception) -> str:
    """An error's text on one line of at most 200 characters (pyoxigraph's parser errors name the
    line and column of what they read)."""
    return " ".join(str(error).split())[:200]


def _entry(parts: list[bytes]) -> Journalled:
    """A record's delta and tag from its parts (SyntaxError or ValueError if they do not decode)."""
    removed = list(parse(parts[0], format=RdfFormat.N_QUADS)) if parts[0] else []
    added = list(parse(parts[1], format=RdfFormat.N_QUADS)) if parts[1] else []
    created = [graph_named(line) for line in parts[2].decode().splitlines() if line]
    dropped = [graph_named(line) for line in parts[3].decode().splitlines() if line]
    return added, removed, created, dropped, parts[4].decode() if len(parts) > 4 else ""


def _torn(tail: bytes) -> bool:
    """Whether `tail`, what follows a journal's last whole record, is what a crash while appending
    leaves: the start of one record (its header cut, or whole with its parts cut), then at most
    zeros (a power cut can leave the file longer than the data that reached it). Anything else
    (a damaged header followed by the later records, a record whose sizes run past the next
    record's header) is damage: cutting it off silently dropped 91 of 100 acknowledged deltas
    after one flipped bit in the 10th record's header, and truncated the evidence."""
    tail = tail.rstrip(b"\0")
    header = _HEADER.match(tail)
    if header is not None:
        return _HEADER.search(tail, header.end()) is None
    start = tail[: len(_MAGIC)]
    return _MAGIC.startswith(start) and re.fullmatch(rb"( [\d ]*)?", tail[len(_MAGIC) :]) is not None


def _cancel_or_add(items: Iterable[T], undone: dict[T, None], into: dict[T, None]) -> None:
    """Undo what a journalled delta put in one of its lists: drops it from `undone` (a later delta's
    undo did the opposite) or else adds it to `into`."""
    for item in items:
        if item in undone:
            del undone[item]
        else:
            into[item] = None


def _read_journal(journal: Path, covered: int | None = None) -> list[Journalled]:
    """A journal's records up to the last complete one; a record cut while being written (a kill,
    a full disk) is cut off the file, since records appended after it would be cut off with it at
    the next replay, though acknowledged. Resident, `covered` is the generation the snapshot holds:
    a journal it holds is stale, and only its first record (its generation) is read.

    A damaged journal (a record that does not decode, or more than a crash leaves after the last
    whole one) is StoreFailed naming the file and the offset, and the file is left as it is: a
    start that went on would drop every acknowledged record after the damage for good."""
    if not journal.exists():
        return []
    data = journal.read_bytes()
    try:
        if covered is not None:
            first, _ = _decode(data, limit=1)
            if -1 < _generation_of(first) <= covered:
                return first  # nothing in it that the snapshot lacks, and the next switch rewrites it
        entries, complete = _decode(data)
    except JournalDamaged as damaged:
        raise StoreFailed(_damage(journal, damaged.offset, damaged.reason)) from None
    if complete < len(data):
        if not _torn(data[complete:]):
            raise StoreFailed(_damage(journal, complete, "a record there is not one this gateway wrote"))
        log.warning("the journal ends in a cut record: dropped", extra={"bytes": len(data) - complete})
        with journal.open("r+b") as file:
            file.truncate(complete)
            os.fsync(file.fileno())
    return entries


def _damage(journal: Path, offset: int, reason: str) -> str:
    """What a start refused for a damaged journal says: where, and what the operator may do."""
    return (
        f"{journal} is damaged at byte {offset} of {journal.stat().st_size} ({reason}); nothing was changed. "
        f"Keep a copy of the data directory; to start with the updates before that byte only (the later "
        f"ones are lost), truncate the file there: truncate -s {offset} {journal}"
    )


def _generation_of(entries: list[Journalled]) -> int:
    """The generation a resident journal's first record names; -1 for none (empty, or cut)."""
    if entries and entries[0][4].startswith(GENERATION):
        return int(entries[0][4][len(GENERATION) :])
    return -1


def sync_directory(path: Path) -> None:
    """Make the names created or renamed in `path` durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_snapshot(directory: Path, covered: int, graphs: list[NamedNode], data: bytes) -> None:
    """Write `data` (N-Quads) as the snapshot holding every generation up to `covered`: whole or not
    at all (a temporary file, synced, renamed, the directory synced). Its first line names the
    generation, how many named graph lines follow (empty graphs are not in N-Quads) and how many
    bytes follow it (see :func:`_load_snapshot`). A write that fails (a full disk) takes its
    temporary file away with it: the journals hold every delta."""
    names = b"".join(graph_text(graph).encode() + b"\n" for graph in graphs)
    header = b"%s %d %d %d\n" % (_SNAPSHOT_MAGIC, covered, len(graphs), len(names) + len(data))
    temporary = directory / f"{SNAPSHOT}.tmp"
    try:
        with temporary.open("wb") as file:
            file.write(header + names)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, directory / SNAPSHOT)
    except OSError:
        if temporary.is_file():
            temporary.unlink()
        raise
    sync_directory(directory)


def _load_snapshot(snapshot: Path, target: Store) -> int:
    """Load a snapshot :func:`_write_snapshot` wrote into `target`; the generation it holds.

    Its header's byte count is checked: a snapshot cut at a line boundary (a copy or a restore cut
    short) loaded without a word, 495 of 1,000 quads, and the next checkpoint made the loss
    permanent. A snapshot written before the count (three fields) is read as it is; the next
    checkpoint writes it with one."""
    data = snapshot.read_bytes()
    newline = data.find(b"\n")
    fields = data[:newline].split()
    numbers = all(field.lstrip(b"-").isdigit() for field in fields[1:])
    if len(fields) not in (3, 4) or fields[0] != _SNAPSHOT_MAGIC or not numbers:
        raise StoreFailed(f"{snapshot} is not a snapshot this gateway wrote")
    covered, graph_count = int(fields[1]), int(fields[2])
    if len(fields) == 4 and len(data) - newline - 1 != int(fields[3]):
        raise StoreFailed(
            f"{snapshot} is cut short or lengthened: {len(data) - newline - 1} bytes after its header, which says "
            f"{int(fields[3])}; restore it from a copy (the gateway does not start without the whole store)"
        )
    lines = data.split(b"\n", graph_count + 1)
    graphs, body = lines[1 : graph_count + 1], lines[graph_count + 1] if len(lines) > graph_count + 1 else b""
    try:
        load_keeping_labels(body, target)
        for graph in graphs:
            target.add_graph(graph_named(graph.decode()))
    except (SyntaxError, ValueError) as error:  # a disk that damaged it: said, not a traceback
        raise StoreFailed(f"{snapshot} cannot be read ({_one_line(error)})") from None
    return covered


class _Claim:
    """This process's hold on a data directory (see the module docstring): one flock per directory
    and process, shared by the stores this process opens there (the tests reopen a directory in
    one process), let go of once the last of them closed or was dropped."""

    _held: dict[Path, tuple[BinaryIO, int]] = {}
    _guard = threading.Lock()

    def __init__(self, directory: Path) -> None:
        self.key = directory.resolve()
        with self._guard:
            file, count = self._held.get(self.key) or (_locked(directory), 0)
            self._held[self.key] = (file, count + 1)
        self.released = False

    def release(self) -> None:
        with self._guard:
            if self.released:
                return
            self.released = True
            file, count = self._held.pop(self.key)
            if count > 1:
                self._held[self.key] = (file, count - 1)
            else:
                file.close()  # the flock goes with the last descriptor of its open file


def _locked(directory: Path) -> BinaryIO:
    """`directory`'s lock file, flocked by this process, its pid written in it; StoreFailed if
    another process holds it past LOCK_WAIT_S."""
    file = (directory / LOCK).open("a+b")  # not "w": the holder's pid stays readable until we hold it
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                file.seek(0)
                holder = file.read(32).decode(errors="replace").strip() or "unknown"
                file.close()
                raise StoreFailed(
                    f"{directory} is in use by another process (pid {holder}, holding {directory / LOCK}): "
                    "stop it first, two gateways on one data directory lose each other's updates"
                ) from None
            time.sleep(0.1)
    file.truncate(0)
    file.write(b"%d\n" % os.getpid())
    file.flush()
    return file


def _convert(directory: Path) -> None:
    """Write a RocksDB data directory's store (its journal replayed first) as a resident snapshot."""
    log.warning("converting the data directory to a resident store", extra={"directory": str(directory)})
    old = RdfStore(Store(str(directory / "store")), directory)
    old.close()
    _write_snapshot(directory, -1, list(old.ox.named_graphs()), old.ox.dump(format=RdfFormat.N_QUADS))
    del old  # RocksDB's lock goes with the last reference


class RdfStore:
    """A pyoxigraph Store plus the one mutating operation the engine uses."""

    def __init__(self, ox: Store, path: Path | None = None, resident: bool = False) -> None:
        self.ox = ox
        self.path = path
        # resident: in memory, rebuilt at start from a snapshot and journals (see the module docstring)
        self.resident = resident and path is not None
        self.rocksdb = path is not None and not resident
        self.clock = EngineClock()
        self._journal: BinaryIO | None = None
        self.recovered_tags: list[str] = []
        self.lock = threading.Lock()  # held while a delta is applied and sent to the followers
        # why the store on disk stopped writing (None: it writes); then every apply is refused
        self.failed: str | None = None
        self.on_failure: Callable[[str], None] | None = None  # told once, from the thread that failed
        self._followers: list[Follower] = []
        self._written = 0  # journal records written (to the kernel)
        self._synced = 0  # journal records known to be on stable storage
        self._sync_lock = threading.Lock()  # one fdatasync at a time; taken after `lock`, never before
        self._journal_bytes = 0
        self.garbage = 0  # quads removed since the last compaction (dead versions), weighed by _dead_weight
        # ...in memory, by bucket of their subject (see hottest; ~0.26 us a removal)
        self.hot = [0] * HOT_BUCKETS
        self.changes = 0  # calls of apply so far: while it holds, the store holds the same quads
        self._unsettled = False  # a provisional delta was applied and not settled yet
        # the thread whose request's operations are in the store until their undo, and how many
        # such requests began (see settled_read)
        self._provisional_owner: int | None = None
        self._provisional_epoch = 0
        self._settled = threading.Condition(threading.Lock())
        # resident: which of JOURNALS is written, each one's generation (-1: none), and the last
        # generation the snapshot on disk holds
        self._index = 0
        self._generations = [-1, -1]
        self._covered = -1
        self._snapshot_bytes = 0  # the size of the snapshot on disk
        # the floor of available memory under which the store may not grow (None: no floor)
        self.headroom: Headroom | None = None
        self.sync_mark = (0, 0)  # (records written, the journal they are in): read whole by a syncer
        self._claim: _Claim | None = None  # the data directory's lock (set by open)
        if path is not None:
            if self.resident:
                unsettled = self._recover_resident()
            else:
                journal = path / JOURNAL
                unsettled = self._replay_journals([_read_journal(journal)])
                self._journal = journal.open("ab")
                self._journal_bytes = self._journal.tell()
            if unsettled:
                self._settle_recovered(unsettled)

    def query(self, sparql: str, **options: Any) -> Any:
        """pyoxigraph's query with the engine clock's SPARQL functions (broker.core.clock)."""
        return self.ox.query(sparql, custom_functions=self.clock.functions(), **options)

    @classmethod
    def memory(cls) -> RdfStore:
        return cls(Store())

    @classmethod
    def open(cls, path: str | Path, resident: bool = False) -> RdfStore:
        """Open (creating if needed) a store in the data directory `path`: on RocksDB, or resident
        (see the module docstring; a RocksDB directory is converted once)."""
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        claim = _Claim(directory)  # before anything in the directory is read or written
        try:
            store = cls._opened(directory, resident)
        except BaseException:
            claim.release()
            raise
        store._claim = claim
        weakref.finalize(store, claim.release)  # a store dropped unclosed lets go of it too
        return store

    @classmethod
    def _opened(cls, directory: Path, resident: bool) -> RdfStore:
        """:meth:`open`'s work, once the directory is this process's."""
        if not resident:
            if (directory / SNAPSHOT).exists():
                raise StoreFailed(f"{directory} holds a resident store ({SNAPSHOT}): open it resident")
            (directory / "store").mkdir(exist_ok=True)
            return cls(Store(str(directory / "store")), directory)
        if (directory / "store").is_dir():
            if not (directory / SNAPSHOT).exists():
                _convert(directory)
            shutil.rmtree(directory / "store")  # converted (a conversion cut after its snapshot too)
            (directory / JOURNAL).unlink(missing_ok=True)
        return cls(Store(), directory, resident=True)

    def _replay_journals(self, journals: list[list[Journalled]]) -> list[Journalled]:
        """Re-apply the journals' records, in order (see the module docstring); returns the
        provisional deltas at the end that nothing settled. They are kept until the next
        checkpoint: the owners of their tags hear of them after start-up, and a second crash
        before then finds them again."""
        unsettled: list[Journalled] = []
        records = sum(len(entries) for entries in journals)
        if records:
            log.info("replaying the journal", extra={"updates": records})
        for entries in journals:
            for entry in entries:
                added, removed, created, dropped, tag = entry
                self._apply(added, removed, created, dropped)
                if tag == PROVISIONAL:
                    unsettled.append(entry)
                elif tag == SETTLED:
                    unsettled.clear()
                elif tag:
                    self.recovered_tags.append(tag)
        return unsettled

    def _recover_resident(self) -> list[Journalled]:
        """Load the snapshot, replay every journal of a later generation (oldest first), and go on
        writing the newest of them (or a new generation); :meth:`_replay_journals` returns."""
        assert self.path is not None
        snapshot = self.path / SNAPSHOT
        if snapshot.exists():
            self._covered = _load_snapshot(snapshot, self.ox)
            self._snapshot_bytes = snapshot.stat().st_size
        live = []
        for index, name in enumerate(JOURNALS):
            if not (self.path / name).exists():  # both, for the sync helper to open
                (self.path / name).touch()
                sync_directory(self.path)
            entries = _read_journal(self.path / name, self._covered)
            generation = _generation_of(entries)
            self._generations[index] = generation
            if generation > self._covered:
                live.append((generation, index, entries[1:]))
        live.sort()
        self._check_contiguous(snapshot, [generation for generation, _, _ in live])
        unsettled = self._replay_journals([entries for _, _, entries in live])
        if live:
            generation, index, _ = live[-1]
            self._index = index
            self._journal = (self.path / JOURNALS[index]).open("ab")
            self._journal_bytes = self._journal.tell()
            self.sync_mark = (0, index)
        else:
            self._start_journal(0, max(self._covered, *self._generations) + 1)
        return unsettled

    def _check_contiguous(self, snapshot: Path, generations: list[int]) -> None:
        """StoreFailed unless the journals to replay follow the snapshot without a gap: a journal
        is started only once the snapshot holds the generation before it, so a gap is a snapshot
        lost or replaced by an older one (removed, it started silently with the journals alone: 22
        of 30 quads, made permanent by the next checkpoint)."""
        expected = list(range(self._covered + 1, self._covered + 1 + len(generations)))
        if generations == expected:
            return
        if not snapshot.exists():
            raise StoreFailed(
                f"{snapshot} is missing: the journals beside it start at generation {generations[0]} and only replay "
                "what came after it; restore it from a copy (the gateway does not start without the whole store)"
            )
        raise StoreFailed(
            f"{snapshot} holds generations up to {self._covered}, and the journals beside it start at "
            f"{generations[0]}: what lies between is missing; restore the snapshot the gateway wrote last"
        )

    def _start_journal(self, index: int, generation: int) -> None:
        """Write journal `index` from its start, as `generation` (its first record, synced), and
        write the later deltas there. Only a stale journal (one the snapshot holds) is started."""
        assert self.path is not None
        path = self.path / JOURNALS[index]
        created = not path.exists()
        journal = path.open("wb")
        try:
            journal.write(encode_journal_entry([], [], [], [], f"{GENERATION}{generation}"))
            journal.flush()
            os.fdatasync(journal.fileno())
            if created:
                sync_directory(self.path)
        except BaseException:
            journal.close()
            raise
        previous, self._journal = self._journal, journal
        self._index = index
        self._generations[index] = generation
        self._journal_bytes = 0
        self.sync_mark = (self._written, index)
        if previous is not None:
            previous.close()

    @property
    def checkpoint_due(self) -> bool:
        """Resident: the journal passed CHECKPOINT_BYTES and SNAPSHOT_RATIO times the snapshot's
        size, or the other one still waits for a snapshot (a checkpoint that failed, or a crash
        before one)."""
        return self.resident and (
            self._journal_bytes > max(CHECKPOINT_BYTES, SNAPSHOT_RATIO * self._snapshot_bytes)
            or self._generations[1 - self._index] > self._covered
        )

    def checkpoint(self) -> bool:
        """Resident: switch journals (under the lock: a sync, a truncate, a header), then write the
        store as the snapshot of every generation before the new one, without the lock (the dump
        lets go of the GIL). Whether it did (not while a request's operations are provisional: the
        journal they are in is what tells a replay to undo them). From one thread at a time (the
        compaction's, which also swaps the store)."""
        with self.lock:
            if not self.resident or self._journal is None or self.failed is not None or self._unsettled:
                return False
            other = 1 - self._index
            if self._generations[other] > self._covered:
                covered = self._generations[other]  # that journal first; this one is replayed after it
            else:
                covered = self._generations[self._index]
                with self._sync_lock:
                    os.fdatasync(self._journal.fileno())
                    self._synced = self._written
                    self._start_journal(other, covered + 1)
            graphs = list(self.ox.named_graphs())
            ox = self.ox
        assert self.path is not None
        data = at_low_priority(ox.dump, format=RdfFormat.N_QUADS)
        _write_snapshot(self.path, covered, graphs, data)
        self._covered, self._snapshot_bytes = covered, len(data)
        return True

    def _settle_recovered(self, unsettled: list[Journalled]) -> None:
        """Undo the provisional deltas a replay ended with, last first, as one settling record."""
        added: dict[Quad, None] = {}
        removed: dict[Quad, None] = {}
        created: dict[NamedNode, None] = {}
        dropped: dict[NamedNode, None] = {}
        for entry_added, entry_removed, entry_created, entry_dropped, _tag in reversed(unsettled):
            # exact deltas: undoing each, last first, gives the store as it was before them
            _cancel_or_add(entry_added, added, removed)
            _cancel_or_add(entry_removed, removed, added)
            _cancel_or_add(entry_created, created, dropped)
            _cancel_or_add(entry_dropped, dropped, created)
        log.warning("the journal ends inside a request of several operations: its operations undone",
                    extra={"records": len(unsettled)})  # fmt: skip
        with self.lock:
            self._unsettled = True  # the settling record is written even when the undo is empty
            self._apply_locked(list(added), list(removed), list(created), list(dropped), None, SETTLED)
        self.sync()

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
        sequence: str = "",
    ) -> None:
        """Remove then add exactly these quads, then create/drop empty named graphs: whole or not at all.

        With a `mark`, its callback runs once the change is in the store (see the module docstring).
        `sequence` is PROVISIONAL for an operation of a request of several, SETTLED for the undo
        that ends them (see the module docstring).

        On disk, an I/O error (the disk full: ENOSPC, EFBIG) raises StoreFailed, and so does every
        apply after it. Measured with a 40 MB data directory filled by 2,000-triple updates: the
        update that met the full disk was in the journal and not in RocksDB, and RocksDB refused
        every write after, even once space was back; a restart replayed the journal and wrote again.
        So this store stops writing at the first error, and tells `on_failure` (the gateway stops,
        for systemd to start it again), rather than append to a journal with a torn entry in it.
        """
        with self.lock:
            if self.failed is not None:
                raise StoreFailed(self._failure(self.failed))
            if sequence == PROVISIONAL:  # before it is in the store: see settled_read
                self._provisional_owner = threading.get_ident()
                self._provisional_epoch += 1
            try:
                self._apply_locked(added, removed, graphs_created, graphs_dropped, mark, sequence)
            except OSError as error:
                if not self.on_disk:
                    raise
                self.failed = str(error)[:300]
                log.critical("the store cannot write: it refuses every update now", extra={"reason": self.failed})
                if self.on_failure is not None:
                    self.on_failure(self.failed)
                raise StoreFailed(self._failure(self.failed)) from None
            finally:
                if sequence == SETTLED and self._provisional_owner is not None:  # the undo is in the store
                    with self._settled:
                        self._provisional_owner = None
                        self._settled.notify_all()

    def check_growth(self, growth: int) -> None:
        """Raise StoreFull, before anything is applied, if a delta adding `growth` quads more than
        it removes may not run now (:mod:`broker.headroom`). Called on the update thread under the
        engine's lock, for a request's net delta and for each of its operations before it is
        applied, so a refused request changes nothing."""
        if self.headroom is not None:
            self.headroom.check(growth)

    def settled_read(self, read: Callable[[], T]) -> T:
        """`read()` (a query: pyoxigraph takes its snapshot when it is called) on a store that holds no
        operation of a request still running on another thread.

        Why: a request of several operations applies each one before computing the next and undoes
        them all if a later one fails (:mod:`broker.core.update_processor`); the query workers keep
        them from every job but the request's own (:mod:`broker.workers.pool`), and this keeps them
        from this process's own readers (`trusted` queries on the store, run on the query threads):
        without it, `INSERT DATA {...} ; INSERT {...} WHERE {slow}` showed its first operation to
        them for as long as the WHERE ran, and then never again. The reader waits for the undo (a
        network client's request runs at most its time limit; the reader is on a query thread,
        never the event loop). The request's own
        thread does not wait: its later WHEREs see its earlier operations (SPARQL 1.1 Update).

        No lock is held while `read` runs: a request that began meanwhile bumped the epoch before
        its first operation reached the store, so the snapshot is taken again."""
        me = threading.get_ident()
        while True:
            with self._settled:
                while self._provisional_owner not in (None, me):
                    self._settled.wait(1.0)
                epoch = self._provisional_epoch
            result = read()
            if self._provisional_epoch == epoch:
                return result

    def apply_nquads(
        self, added: bytes, removed: bytes, graphs_created: Iterable[str], graphs_dropped: Iterable[str]
    ) -> None:
        """:meth:`apply` for a delta that came as N-Quads (a replica's, :func:`broker.workers.pool.batched`)
        and graphs as their texts (:func:`graph_text`).

        Why not parse it into quads and apply those: in a replica no one follows the store and
        nothing is journalled, so the added quads can go to `Store.load`, which parses them in Rust
        without making a Python object of each. Measured on the test machine (a reading's delta:
        9 quads added, ~4 removed, in deltas of 5 to 500 readings, on a store of 108,000 quads):
        2.1-2.9 us a quad against 3.1-3.6 (17-35 % less CPU). The query workers' replicas took
        ~0.17 core each at 1,000 readings/s, at niceness 10 (as installed, 3 alternated runs, the
        difference was within the machine's noise). `Store.load` renames blank nodes, and later deltas name them by
        their labels: a delta with ``_:`` anywhere in its added quads goes the slow way, as does
        one the store must journal or tell followers about. A replica compacting (on a thread of its
        own) keeps them as N-Quads for its copy (:class:`_Recording`)."""
        created = [graph_named(graph) for graph in graphs_created]
        dropped = [graph_named(graph) for graph in graphs_dropped]
        with self.lock:
            recordings = self._followers
            fast = self._journal is None and self.path is None and all(isinstance(f, _Recording) for f in recordings)
            if fast and not (added and _contains(added, b"_:")):
                self.changes += 1
                self.garbage += _load_nquads(self.ox, added, removed, created, dropped, self.hot)
                for recording in recordings:
                    recording.nquads(added, removed, created, dropped)  # type: ignore[union-attr]
                return
        self.apply(
            parse(added, format=RdfFormat.N_QUADS) if added else (),
            parse(removed, format=RdfFormat.N_QUADS) if removed else (),
            created,
            dropped,
        )

    @staticmethod
    def _failure(reason: str) -> str:
        return (
            f"the store on disk cannot write ({reason}); whether this update is stored is known once the "
            "gateway has started again"
        )

    def _apply_locked(
        self,
        added: Iterable[Quad],
        removed: Iterable[Quad],
        graphs_created: Iterable[NamedNode],
        graphs_dropped: Iterable[NamedNode],
        mark: ApplyMark | None,
        sequence: str = "",
    ) -> None:
        """:meth:`apply`'s work, under the lock."""
        self.changes += 1
        journal, followers = self._journal, self._followers
        if journal is None and not followers:
            self.garbage += self._apply(added, removed, graphs_created, graphs_dropped)
            if mark is not None:
                mark.committed(mark.tag)
            return
        added, removed = list(added), list(removed)
        graphs_created, graphs_dropped = list(graphs_created), list(graphs_dropped)
        # written and followed even empty: it closes the provisional ones
        settles = sequence == SETTLED and self._unsettled
        if not (added or removed or graphs_created or graphs_dropped or mark or settles):
            return
        if sequence:
            self._unsettled = sequence == PROVISIONAL
        if journal is not None:
            tag = mark.tag if mark is not None else sequence
            entry = encode_journal_entry(added, removed, graphs_created, graphs_dropped, tag)  # type: ignore[arg-type]
            journal.write(entry)
            journal.flush()  # in the kernel: safe from a kill now, from a power cut once synced
            self._written += 1
            self.sync_mark = (self._written, self._index)
            self._journal_bytes += len(entry)
            if mark is not None:
                self.sync()  # before the mark's owner records elsewhere that the update ran
        self.garbage += self._apply(added, removed, graphs_created, graphs_dropped)
        for follower in followers:
            follower(added, removed, graphs_created, graphs_dropped, sequence)  # type: ignore[arg-type]
        if mark is not None:
            mark.committed(mark.tag)
        if self.rocksdb and self._journal_bytes > CHECKPOINT_BYTES and not self._unsettled:
            self._checkpoint()

    @property
    def unsynced(self) -> bool:
        """Some delta applied so far is not known to be on stable storage yet."""
        return self._synced < self._written

    @property
    def journal_paths(self) -> list[Path]:
        """The journals' files (none in memory), for a syncer of its own (:mod:`broker.journal_sync`):
        the index in :attr:`sync_mark` names the one its records are in."""
        if self.path is None:
            return []
        return [self.path / name for name in JOURNALS] if self.resident else [self.path / JOURNAL]

    def synced_to(self, mark: int) -> None:
        """Record that the first `mark` journal records are on stable storage (someone else synced
        the file). Without the sync lock, so that the event loop never waits for a sync running on
        another thread: racing with :meth:`sync`, the lower of two marks may win, which only makes
        a later sync happen that was not needed, never an unsynced record count as synced."""
        self._synced = max(self._synced, mark)

    def sync(self) -> None:
        """Make every delta applied so far durable (no-op in memory, or when nothing is new).

        Safe from any thread, without the store's lock: deltas go on being applied during the
        fdatasync (which lets go of the GIL), and a caller that finds a sync under way waits for it
        and is often covered by it (group commit)."""
        if self._journal is None or self._synced >= self._written:
            return
        with self._sync_lock:
            # read here: a checkpoint switches journals under this lock, after syncing the one it
            # leaves; every record counted in `target` is in `journal` or was synced by it
            journal, target = self._journal, self._written
            if journal is None or self._synced >= target or journal.closed:
                return
            os.fdatasync(journal.fileno())
            self._synced = max(self._synced, target)

    def _checkpoint(self) -> None:
        """RocksDB: flush the store (RocksDB syncs its table files), then empty the journal (hold the lock)."""
        assert self._journal is not None
        self.ox.flush()
        with self._sync_lock:
            self._journal.truncate(0)
            os.fdatasync(self._journal.fileno())
            self._synced = self._written
        self._journal_bytes = 0

    def follow(self, follower: Follower) -> None:
        """Call `follower` with every later delta (added, removed, graphs created, graphs dropped),
        under the store's lock: it must only keep it. A replica that starts from a snapshot taken
        :meth:`at_rest` and applies the deltas that follow, in order, is the store."""
        with self.lock:
            self._followers = [*self._followers, follower]

    def unfollow(self, follower: Follower) -> None:
        with self.lock:
            # ==, not is: a bound method is a new object at each access (pool.close never unfollowed)
            self._followers = [each for each in self._followers if each != follower]

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
    ) -> int:
        """Apply one delta; the number of quads it removed.

        On disk, as one SPARQL update: pyoxigraph runs an update in one RocksDB transaction, so the
        delta reaches RocksDB's own log in one write, and a power cut leaves it whole or absent
        there too (the journal restores it if it was acknowledged). Applied quad by quad, an
        unacknowledged delta whose journal record was lost with the page cache could come back half
        applied: each `remove` is a transaction of its own, and the kernel writes RocksDB's log and
        the journal back in no set order. A delta larger than ONE_WRITE_QUADS goes in pieces of that
        size (a transaction holds its writes in memory), and what no update can carry (blank nodes,
        triple terms) quad by quad: those two are whole after a kill, not after a power cut.

        What it costs, measured on the 2-core test machine: the update's text is parsed, ~2.5 us a
        quad more than `remove` and `extend` (a reading's delta of 4 removals and 15 additions:
        ~370-430 us against ~315-345 quad by quad); `bench mqtt --on-disk` and `bench wire --on-disk`
        about 0.9x of the build before, alternated (noisy, 4 and 8 pairs)."""
        if not self.rocksdb:
            return _apply_quads(self.ox, added, removed, graphs_created, graphs_dropped, self.hot)
        removed = list(removed)
        for piece in _pieces(list(added), removed, list(graphs_created), list(graphs_dropped)):
            update = _delta_update(*piece)
            if update is None or not _updated(self.ox, update):
                _apply_quads(self.ox, *piece)
        return sum(map(_dead_weight, removed))

    def hottest(self) -> int:
        """The most quads removed since the last compaction from the subjects of one bucket: a lower
        bound of the dead versions a lookup of the hottest subject reads past (in memory). Why: a
        lookup reads past every dead version of its key, ~16 ns each (a value replaced 10,000 times
        in a store of 300,000 quads: 161 us a lookup against 0.7; 200,000 times: 3.5 ms), and the
        count of all removals let one key pile up to twice the store's size of them."""
        return max(self.hot)

    def compact(self) -> int | None:
        """Drop the dead versions pyoxigraph keeps (see the module docstring). Updates go on
        meanwhile: in memory, the deltas are followed from a point between two of them, the live
        quads of a later snapshot are copied into a new store (:func:`copy_live`), every followed
        delta is replayed into it, and it replaces the old one between two deltas (queries running
        on the old one finish there). Replaying a delta the snapshot already holds is harmless:
        each removal, addition, graph creation or drop sets the state of what it names, so the
        last delta naming a quad or graph decides it, as it did in the store. Returns the number
        of live quads copied (in memory), None on disk."""
        if self.rocksdb:
            self.garbage = 0
            at_low_priority(self.ox.optimize)
            return None
        recording = _Recording()
        deltas = recording.deltas
        with self.lock:
            old = self.ox
            graphs = list(old.named_graphs())
            self._followers = [*self._followers, recording]
            self.garbage = 0
            self.hot = [0] * HOT_BUCKETS
        fresh = RdfStore(Store())
        try:
            copied = copy_live(old, fresh.ox)
            for graph in graphs:
                fresh.ox.add_graph(graph)
            replayed = 0
            # without holding up the update path, until at most a few are left for under the lock
            for _ in range(REPLAY_ROUNDS_MAX):
                if len(deltas) - replayed <= REPLAY_LOCKED_MAX:
                    break
                for delta in deltas[replayed : len(deltas)]:
                    _replay(fresh.ox, delta)
                    replayed += 1
            with self.lock:
                for delta in deltas[replayed:]:
                    _replay(fresh.ox, delta)
                self.ox = fresh.ox
        finally:
            self.unfollow(recording)
        return copied

    def live_quads(self) -> int:
        """How many quads the store holds (:func:`count_quads`: every thread of the gateway stopped
        for `len(store)` whenever a compaction was due)."""
        return count_quads(self.ox)

    def graph_exists(self, graph: NamedNode | DefaultGraph) -> bool:
        return isinstance(graph, DefaultGraph) or self.ox.contains_named_graph(graph)

    def quads(self) -> set[Quad]:
        """Every quad (for tests and small stores)."""
        return set(self.ox.quads_for_pattern(None, None, None, None))

    def flush(self) -> None:
        if self.rocksdb and self.failed is None:  # a failed RocksDB refuses (the restart recovers it)
            self.ox.flush()

    def close(self) -> None:
        """Flush, empty and release the journal (the pyoxigraph store closes when dropped); resident,
        release the journals, after a checkpoint only if one is due: the next start replays at most
        CHECKPOINT_BYTES of journal (a second or two), where a snapshot of a large store written at
        every stop could take longer than a stop may (an SD card writes 10-20 MB/s)."""
        if self.resident and self._journal is not None:
            try:
                if self.checkpoint_due:
                    self.checkpoint()
            except OSError as error:  # the journals still hold every delta
                log.warning("no snapshot written at close", extra={"error": str(error)})
            with self.lock, self._sync_lock:
                self._journal.close()
                self._journal = None
        if self._journal is not None:
            with self.lock:
                # else the journal is replayed at the next start (and what is provisional undone)
                if self.failed is None and not self._unsettled:
                    self._checkpoint()
                with self._sync_lock:
                    self._journal.close()
                    self._journal = None
        self.flush()
        if self._claim is not None:
            self._claim.release()
