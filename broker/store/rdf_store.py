"""The store itself: :class:`RdfStore`, pyoxigraph in memory or in a data directory, changed only
through :meth:`RdfStore.apply` (:mod:`broker.store` describes the journal, the resident mode, the
compaction and the layout of a data directory)."""

from __future__ import annotations

import collections
import logging
import os
import shutil
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from pyoxigraph import DefaultGraph, NamedNode, Quad, RdfFormat, Store, parse

from broker.background import at_low_priority
from broker.core.clock import EngineClock
from broker.errors import StoreFailed
from broker.headroom import Headroom
from broker.store.delta import (
    HOT_BUCKETS,
    apply_quads,
    churn,
    dead_weight,
    delta_update,
    growth,
    load_nquads,
    pieces,
    updated,
)
from broker.store.durable import sync_directory
from broker.store.journal import (
    GENERATION,
    JOURNAL,
    JOURNALS,
    PROVISIONAL,
    SETTLED,
    Journalled,
    encode_journal_entry,
    generation_of,
    graph_named,
    journal_entry_parts,
    one_line,
    read_journal,
)
from broker.store.live_copy import Recording, contains, copy_live, count_quads, nquads_slices, replay
from broker.store.lock import Claim
from broker.store.snapshot import SNAPSHOT, load_snapshot, write_snapshot

log = logging.getLogger("broker.store")  # the name its records always carried
ONE_WRITE_BYTES = 1 << 20  # a journal record up to this size is joined and written in one write()

# journal size past which the store is flushed and the journal emptied (bounds the replay at start)
CHECKPOINT_BYTES = 16 << 20
# resident: ...and at least this many times the last snapshot's size. Why: a checkpoint writes the
# whole store, so with a fixed 16 MB a store of 18 MB (133,000 quads: 100 sensors with retention) at
# 1,000 readings/s (~3 MB of journal a second) was written every ~5 s, more than the journal itself,
# on a board's SD card; at 2 the snapshots write at most half what the journal does, and a start
# replays at most twice the snapshot's size
SNAPSHOT_RATIO = 2
# resident: ...but never more than this much journal. Why: a start's time follows the journal, and
# twice a large snapshot is a long wait: after a SIGKILL with 200,000 readings of journal (583 MB,
# the bound for a 290 MB snapshot) the start took over 56 s of CPU and 1.9 GB of memory; 20,000
# readings (57 MB), 26 s at a load of 8 (6.4 s of CPU, peak RSS 330 MB). 2026-12-07,
# /tmp/atk-stop/gen.py then startlog.sh (docs/architecture.md, "Restart after a kill"). Its memory
# no longer does: the journal is replayed record by record as it is read (read_journal; the same
# 57 MB opened with a peak RSS of 107-110 MB instead of 248-255). A store past 32 MB of snapshot is
# then written more often than its journal asks: the price of a bounded start
JOURNAL_MAX_BYTES = 64 << 20
# a compaction replays the deltas that came during its copy without the lock, round after round,
# until at most REPLAY_LOCKED_MAX are left for under it (each round is shorter than the last: a
# replay costs less than the update that made the delta); at most REPLAY_ROUNDS_MAX rounds
REPLAY_LOCKED_MAX = 4
REPLAY_ROUNDS_MAX = 20
T = TypeVar("T")
# a store's follower: called with each delta (added, removed, graphs created, graphs dropped) and its
# sequence tag (PROVISIONAL, SETTLED or "": see RdfStore.apply)
Follower = Callable[[list[Quad], list[Quad], list[NamedNode], list[NamedNode], str], None]


@dataclass(frozen=True, slots=True)
class ApplyMark:
    """A tag journalled with one delta, and what to do once that delta is in the store."""

    tag: str
    committed: Callable[[str], None]


def _cancel_or_add(items: Iterable[T], undone: dict[T, None], into: dict[T, None]) -> None:
    """Undo what a journalled delta put in one of its lists: drops it from `undone` (a later delta's
    undo did the opposite) or else adds it to `into`."""
    for item in items:
        if item in undone:
            del undone[item]
        else:
            into[item] = None


def _rocksdb(directory: Path) -> tuple[Store, int]:
    """The data directory's RocksDB store and how many quads it holds; StoreFailed, naming it and the
    way out, if RocksDB finds it damaged. Why: a damaged CURRENT, MANIFEST or table file (a disk or a
    copy that failed) made the start a raw traceback (RuntimeError: Corruption: ...), exit status 1,
    which systemd restarts in a loop, where a damaged journal or snapshot is refused in one line,
    exit status 2. Nothing is repaired: RocksDB's repair drops what it cannot read, and the journal
    holds only the deltas since the last flush. RocksDB reads a table file's data blocks only when
    asked for them, so the quads are counted here: a damaged data block was found only by the first
    query worker's count of its replica (a checkpoint of the same files), whose thread died, and the
    start was an EOFError traceback, exit status 1. The count is the one full scan of a start: the
    query workers are told it with their checkpoint (:meth:`RdfStore.backup`) rather than count
    their replicas again. Nothing cheaper finds such a block: opening reads none, and pyoxigraph
    0.5.13 has no check of RocksDB's files (`Store` has no `validate`)."""
    store = directory / "store"
    try:
        opened = Store(str(store))
        return opened, len(opened)
    except RuntimeError as error:
        raise StoreFailed(
            f"{store} (RocksDB) is damaged ({one_line(error, 400)}); nothing was changed. Keep a copy of the data "
            "directory and restore it from a backup (the gateway does not start without the whole store)"
        ) from None


def _convert(directory: Path) -> None:
    """Write a RocksDB data directory's store (its journal replayed first) as a resident snapshot."""
    log.warning("converting the data directory to a resident store", extra={"directory": str(directory)})
    old = RdfStore(_rocksdb(directory)[0], directory)
    old.close()
    write_snapshot(directory, -1, list(old.ox.named_graphs()), nquads_slices(old.ox))
    del old  # RocksDB's lock goes with the last reference


class RdfStore:
    """A pyoxigraph Store plus the one mutating operation the engine uses."""

    def __init__(self, ox: Store, path: Path | None = None, resident: bool = False, quads: int | None = None) -> None:
        """`quads`: how many quads `ox` holds, when they were counted (RocksDB's, at open)."""
        self.ox = ox
        self.path = path
        # resident: in memory, rebuilt at start from a snapshot and journals (see :mod:`broker.store`)
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
        self.garbage = 0  # quads removed since the last compaction (dead versions), weighed by dead_weight
        # ...in memory, by bucket of their subject (see hottest; ~0.26 us a removal)
        self.hot = [0] * HOT_BUCKETS
        self.changes = 0  # calls of apply so far: while it holds, the store holds the same quads
        # the quads counted and `changes` then: true while `changes` is the same (see backup)
        self._counted: tuple[int, int] | None = None if quads is None else (quads, 0)
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
        self._claim: Claim | None = None  # the data directory's lock (set by open)
        if path is not None:
            if self.resident:
                unsettled = self._recover_resident()
            else:
                journal = path / JOURNAL
                # read whole once before anything is applied: RocksDB keeps what a replay applied,
                # and a damaged journal refuses the start with nothing changed (read_journal). Its
                # price, a second decoding of at most CHECKPOINT_BYTES, only after a kill
                collections.deque(read_journal(journal), maxlen=0)
                unsettled = self._replay_journals([read_journal(journal)])
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
        (see :mod:`broker.store`; a RocksDB directory is converted once)."""
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        claim = Claim(directory)  # before anything in the directory is read or written
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
            opened, quads = _rocksdb(directory)
            return cls(opened, directory, quads=quads)
        if (directory / "store").is_dir():
            if not (directory / SNAPSHOT).exists():
                _convert(directory)
            shutil.rmtree(directory / "store")  # converted (a conversion cut after its snapshot too)
            (directory / JOURNAL).unlink(missing_ok=True)
        return cls(Store(), directory, resident=True)

    def _replay_journals(self, journals: list[Iterator[Journalled]]) -> list[Journalled]:
        """Re-apply the journals' records, in order, each as it is read (see :mod:`broker.store`);
        returns the provisional deltas at the end that nothing settled. They are kept until the
        next checkpoint: the owners of their tags hear of them after start-up, and a second crash
        before then finds them again."""
        unsettled: list[Journalled] = []
        records = 0
        for entries in journals:
            for entry in entries:
                added, removed, created, dropped, tag = entry
                if self._counted is not None:
                    self._counted = (self._counted[0] + growth(self.ox, added, removed), self.changes)
                self._apply(added, removed, created, dropped)
                if tag == PROVISIONAL:
                    unsettled.append(entry)
                elif tag == SETTLED:
                    unsettled.clear()
                elif tag:
                    self.recovered_tags.append(tag)
                records += 1
        if records:
            log.info("replayed the journal", extra={"updates": records})
        return unsettled

    def _recover_resident(self) -> list[Journalled]:
        """Load the snapshot, replay every journal of a later generation (oldest first), and go on
        writing the newest of them (or a new generation); :meth:`_replay_journals` returns."""
        assert self.path is not None
        snapshot = self.path / SNAPSHOT
        if snapshot.exists():
            self._covered = load_snapshot(snapshot, self.ox)
            self._snapshot_bytes = snapshot.stat().st_size
        live: list[tuple[int, int, Iterator[Journalled]]] = []
        for index, name in enumerate(JOURNALS):
            if not (self.path / name).exists():  # both, for the sync helper to open
                (self.path / name).touch()
                sync_directory(self.path)
            entries = read_journal(self.path / name)
            generation = generation_of(next(entries, None))
            self._generations[index] = generation
            if generation > self._covered:
                live.append((generation, index, entries))
            elif generation > -1:
                entries.close()  # stale: the snapshot holds it all, and the next switch rewrites it
            else:
                collections.deque(entries, maxlen=0)  # none named: a cut tail is cut, damage refused
        live.sort(key=lambda journal: journal[:2])
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
        size (or JOURNAL_MAX_BYTES), or the other one still waits for a snapshot (a checkpoint that failed, or a crash
        before one)."""
        return self.resident and (
            self._journal_bytes > max(CHECKPOINT_BYTES, min(SNAPSHOT_RATIO * self._snapshot_bytes, JOURNAL_MAX_BYTES))
            or self._generations[1 - self._index] > self._covered
        )

    def checkpoint(self) -> bool:
        """Resident: switch journals (under the lock: a sync, a truncate, a header), then write the
        store as the snapshot of every generation before the new one, without the lock (the dump
        lets go of the GIL). Whether it did (not while a request's operations are provisional: the
        journal they are in is what tells a replay to undo them; nor while :attr:`recovered_tags`
        wait for their owner, for the same reason: the compaction thread starts before the delayed
        updates claim them, and a checkpoint taken in between, then a kill, left the journal that
        said "this delayed update ran" stale: the next start ran it a second time). From one thread
        at a time (the compaction's, which also swaps the store)."""
        with self.lock:
            if not self.resident or self._journal is None or self.failed is not None or self._journal_needed:
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
        written = write_snapshot(self.path, covered, graphs, nquads_slices(ox))
        self._covered, self._snapshot_bytes = covered, written
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

        With a `mark`, its callback runs once the change is in the store (see :mod:`broker.store`).
        `sequence` is PROVISIONAL for an operation of a request of several, SETTLED for the undo
        that ends them (see :mod:`broker.store`).

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
        self,
        added: bytes,
        removed: bytes,
        graphs_created: Iterable[str],
        graphs_dropped: Iterable[str],
        churned: bytes = b"",
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
        own) keeps them as N-Quads for its copy (:class:`Recording`).

        `churned`: quads to remove where the store holds them (those a replica's netted backlog
        added and removed again, :class:`broker.workers.backlog.Backlog`)."""
        created = [graph_named(graph) for graph in graphs_created]
        dropped = [graph_named(graph) for graph in graphs_dropped]
        with self.lock:
            stored, made = churn(self.ox, churned) if churned else ([], [])
            created += made  # type: ignore[arg-type]
            recordings = self._followers
            fast = self._journal is None and self.path is None and all(isinstance(f, Recording) for f in recordings)
            if fast and not (added and contains(added, b"_:")):
                self.changes += 1
                self.garbage += load_nquads(self.ox, added, removed, created, dropped, self.hot, stored)
                for recording in recordings:  # the copy may hold a churned quad: removed there if so
                    recording.nquads(added, removed + churned, created, dropped)  # type: ignore[union-attr]
                return
        self.apply(
            parse(added, format=RdfFormat.N_QUADS) if added else (),
            [*parse(removed, format=RdfFormat.N_QUADS), *stored] if removed or stored else (),
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
            # a large record in parts, not joined (see journal_entry_parts); a small one in one write,
            # as before: its parts through the file's buffer were two writes (strace), and
            # test_coap_readings_are_acknowledged_only_once_their_journal_is_synced failed 2 runs in 4
            entry = journal_entry_parts(added, removed, graphs_created, graphs_dropped, tag)  # type: ignore[arg-type]
            if sum(map(len, entry)) <= ONE_WRITE_BYTES:
                entry = [b"".join(entry)]
            journal.writelines(entry)
            journal.flush()  # in the kernel: safe from a kill now, from a power cut once synced
            self._written += 1
            self.sync_mark = (self._written, self._index)
            self._journal_bytes += sum(map(len, entry))
            del entry
            if mark is not None:
                self.sync()  # before the mark's owner records elsewhere that the update ran
        self.garbage += self._apply(added, removed, graphs_created, graphs_dropped)
        for follower in followers:
            follower(added, removed, graphs_created, graphs_dropped, sequence)  # type: ignore[arg-type]
        if mark is not None:
            mark.committed(mark.tag)
        if self.rocksdb and self._journal_bytes > CHECKPOINT_BYTES and not self._journal_needed:
            self._checkpoint()

    @property
    def _journal_needed(self) -> bool:
        """The journal tells a replay more than the store does: provisional deltas to undo, or the
        :attr:`recovered_tags` of deltas whose owner has not claimed them yet. Then no checkpoint
        empties it (resident: makes it stale). Why the tags, on RocksDB too: a delayed update's
        tagged delta, a request killed while provisional, and a restart whose undo passed
        CHECKPOINT_BYTES flushed RocksDB and emptied the journal; a second kill before the delayed
        updates started, and the third start ran that delayed update again (no tag recovered)."""
        return self._unsettled or bool(self.recovered_tags)

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
            return apply_quads(self.ox, added, removed, graphs_created, graphs_dropped, self.hot)
        removed = list(removed)
        for piece in pieces(list(added), removed, list(graphs_created), list(graphs_dropped)):
            update = delta_update(*piece)
            if update is None or not updated(self.ox, update):
                apply_quads(self.ox, *piece)
        return sum(map(dead_weight, removed))

    def hottest(self) -> int:
        """The most quads removed since the last compaction from the subjects of one bucket: a lower
        bound of the dead versions a lookup of the hottest subject reads past (in memory). Why: a
        lookup reads past every dead version of its key, ~16 ns each (a value replaced 10,000 times
        in a store of 300,000 quads: 161 us a lookup against 0.7; 200,000 times: 3.5 ms), and the
        count of all removals let one key pile up to twice the store's size of them."""
        return max(self.hot)

    def compact(self) -> int | None:
        """Drop the dead versions pyoxigraph keeps (see :mod:`broker.store`). Updates go on
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
        recording = Recording()
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
                    replay(fresh.ox, delta)
                    replayed += 1
            with self.lock:
                for delta in deltas[replayed:]:
                    replay(fresh.ox, delta)
                self.ox = fresh.ox
        finally:
            self.unfollow(recording)
        return copied

    def backup(self, directory: str) -> int | None:
        """Write a RocksDB checkpoint of the store into `directory` (hard links: milliseconds); how
        many quads it holds, when that is known without counting them: no delta was applied since
        they were counted at open (and through the journal's replay), before or while it was taken.

        Why: each query worker counted its replica at its seed (`len`, the compactor's starting
        count), a full scan of the store on top of the one at open: a RocksDB store of 2.4 million
        quads (774 MB) took 1.10-1.53 s of CPU in each of the two workers, 0.27-0.47 s told (5 pairs
        alternated at a load of 10-12, `/tmp/atk-scn/start.py`, 2026-12-07). A worker seeded later,
        after the store changed, counts its own as before."""
        changes = self.changes  # an apply under way bumped it already: then not known
        self.ox.backup(directory)
        if self._counted is not None and self._counted[1] == changes == self.changes:
            return self._counted[0]
        return None

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
                if self.failed is None and not self._journal_needed:
                    self._checkpoint()
                with self._sync_lock:
                    self._journal.close()
                    self._journal = None
        self.flush()
        if self._claim is not None:
            self._claim.release()
