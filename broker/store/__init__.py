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
record, each record applied as it is read, so a start's memory is the store's plus one record's
(on RocksDB the journal is read through once first, so that a damaged one changes nothing):
after a kill or a power cut, every acknowledged update is in the store, whole, and an update cut
in the middle is either whole or absent.
A record cut at the end of the file (what a crash while appending leaves) is cut off; a journal
damaged anywhere else refuses the start, naming the file and the offset, and is kept as it is
(:func:`broker.store.journal.read_journal`).

An update may carry an :class:`ApplyMark` (a delayed update firing does): its tag is journalled
with the delta, the journal synced, and its `committed` callback runs after the store was changed.
Tags re-applied at start-up are in :attr:`RdfStore.recovered_tags`, so whoever owns the tag learns
that its update is in the store even when the process died between the store write and the
callback: that is what makes delayed updates run exactly once across kill -9 and power cuts. No
checkpoint is taken until their owner has claimed them (it would make the journal naming them stale).

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
writes it, slice by slice as it is dumped (never whole in memory), as the snapshot of every
generation before the new one; the journal it left is then stale, and only a stale journal is
ever switched to. At start the snapshot is loaded (slice by slice too) and every journal of a
later generation replayed, oldest first: a delta the snapshot already holds is replayed
harmlessly (the last delta naming a quad or graph decides it, as in :meth:`RdfStore.compact`). A
snapshot cut short, or journals that do not follow it without a gap, refuse the start
(:func:`broker.store.snapshot.load_snapshot`, :meth:`RdfStore._check_contiguous`). Why:
RocksDB costs ~12 us a quad added and ~6.5 us one removed on the 2-core test machine, ~30 quad
writes a reading, so on disk the gateway could not keep up with 1,000 readings/s, where in memory it
runs at a fraction of a core (docs/architecture.md, "The store"). Cost: the whole store in memory,
in the gateway and in each replica (on RocksDB a replica is a checkpoint sharing its files).

One process at a time: :mod:`broker.store.lock` (the data directory's lock, and why).

Layout of a data directory: `gateway.lock`, `store/` (Oxigraph/RocksDB) and `apply.journal`, or, resident,
`snapshot.nq`, `apply.journal.0` and `apply.journal.1`; `replicas/` (the query workers'
checkpoints, hard links to RocksDB's files) and `replicas-reeval/` (the re-evaluation worker's).
A RocksDB data directory opened resident is converted once: its journal replayed, the store written
as the snapshot, then `store/` and `apply.journal` removed.

The package, by layer (each module's docstring says why it is as it is):
- :mod:`broker.store.journal`: the journal's record format, reading a journal back and telling
  damage from a crash's cut record;
- :mod:`broker.store.snapshot`: a resident store's snapshot, written and loaded;
- :mod:`broker.store.lock`: the data directory's lock (one process at a time);
- :mod:`broker.store.durable`: syncing a directory's names;
- :mod:`broker.store.delta`: applying a delta to a pyoxigraph store, and the dead versions it leaves;
- :mod:`broker.store.live_copy`: a compaction's copy of the live quads and its recorded deltas,
  and the store dumped or loaded as N-Quads (whole, or in slices: a seed, a snapshot);
- :mod:`broker.store.rdf_store`: :class:`RdfStore`, which uses them all.
"""

from broker.store.durable import sync_directory
from broker.store.journal import JOURNAL, JOURNALS, PROVISIONAL, SETTLED, encode_journal_entry, graph_named, graph_text
from broker.store.live_copy import copy_live, dump_nquads, load_keeping_labels, load_slices, nquads_slices
from broker.store.rdf_store import ApplyMark, RdfStore
from broker.store.snapshot import SNAPSHOT

__all__ = [
    "JOURNAL",
    "JOURNALS",
    "PROVISIONAL",
    "SETTLED",
    "SNAPSHOT",
    "ApplyMark",
    "RdfStore",
    "copy_live",
    "dump_nquads",
    "encode_journal_entry",
    "graph_named",
    "graph_text",
    "load_keeping_labels",
    "load_slices",
    "nquads_slices",
    "sync_directory",
]
