"""A compaction's live copy: a store's live quads copied into a new one without holding the GIL, and
the deltas applied meanwhile recorded for replay into the copy (:meth:`broker.store.RdfStore.compact`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from pyoxigraph import NamedNode, Quad, RdfFormat, Store, parse

from broker.background import at_low_priority
from broker.store.delta import apply_quads, load_nquads

# what :func:`nquads_slices` reads at a time: a query worker's seed and a snapshot go by this much
SLICE_BYTES = 1 << 20


def copy_live(source: Store, target: Store) -> int:
    """Copy every quad of `source` (a snapshot of it) into `target`; how many.

    Through N-Quads (:func:`dump_nquads`), because pyoxigraph dumps and loads without the GIL: 280,000 quads (39 MB)
    dumped in 0.3 s and loaded in 0.7 s with no other thread of the process held up for more than
    6 ms, where copying them as Python objects, 2,000 at a time, held the GIL 1.5-4 s in ~6 ms bites
    (the readings' notification latency was 100-130 ms throughout). Both at the lowest CPU priority
    (:func:`broker.background.at_low_priority`): the gateway's replicas compact at the same moment.
    `Store.load` renames blank nodes, so the lines holding one (rare: readings and mappings have none) are parsed with
    `parse`, which keeps their labels, and added as Python objects.

    Nothing here scans the dump under the GIL: counting its lines and looking for ``_:`` in it held
    every other thread 10-22 ms each (125,000 quads, ~17 MB); libc's memmem through ctypes lets go
    of it, and the copy is counted by a query on `target`, which pyoxigraph evaluates without it."""
    load_keeping_labels(dump_nquads(source), target)
    return at_low_priority(count_quads, target)


def dump_nquads(store: Store) -> bytes:
    """`store` as N-Quads, dumped at the lowest priority, with no copy of it made under the GIL.

    Why not `store.dump()` into bytes: pyoxigraph serializes without the GIL, but makes the bytes
    object under it at the end, a copy of the whole dump, on the dump's thread at niceness 19
    (:func:`broker.background.at_low_priority`), which a busy machine preempts while it holds the
    GIL, and every other thread of the gateway, the event loop too, waits. Into an `io.BytesIO`:
    each write and each growth of its buffer is a copy under the GIL, and a growth under mimalloc
    (the installed service's malloc) copies the whole buffer. So pyoxigraph writes the dump into a
    memory file (a memfd, named by its /proc path), and the bytes are read back from it by the
    kernel with the GIL let go. A thread ticking every 1 ms beside a dump of 130,000 live quads
    (22.5 MB, the store `bench dashboard` compacts), 5-6 of each alternated, 4 runs on the 2-core
    test machine at load average 6-8 (2026-12-06, mimalloc preloaded, `/tmp/atk-nl/dumpab*.py`), its
    longest gap: into bytes 24-383 ms (median 43), into a BytesIO 23-281 ms, through a memfd 5-91
    ms (median 13); the same ticker with nothing to wait for, 3-16 ms. Under glibc's malloc (one
    run): 5-40, 5-10 and 3-6 ms. Without memfds (not Linux) or /proc, or past a file size limit
    (RLIMIT_FSIZE holds for a memfd too): into bytes."""
    if not _MEMFD:
        return at_low_priority(store.dump, format=RdfFormat.N_QUADS)
    fd = os.memfd_create("sepa-dump", os.MFD_CLOEXEC)
    try:
        at_low_priority(store.dump, f"/proc/self/fd/{fd}", format=RdfFormat.N_QUADS)
        with io.FileIO(fd, closefd=False) as file:
            return file.readall()
    except OSError:  # past a file size limit: into bytes then
        return at_low_priority(store.dump, format=RdfFormat.N_QUADS)
    finally:
        os.close(fd)


def nquads_slices(store: Store, size: int = SLICE_BYTES) -> Iterator[bytes]:
    """`store` as N-Quads in slices of `size` bytes (cut anywhere, the last shorter), never whole
    in this process: pyoxigraph dumps into a pipe, at the lowest priority and without the GIL (as
    :func:`dump_nquads`), and the slices are read from it as they are consumed (the dump waits
    on a full pipe meanwhile). A consumer that stops early closes the pipe: the dump ends on it.

    Why: a query worker's seed and a checkpoint were each a `bytes` of the whole dump, 39 MB for
    231,100 quads; at a start after a kill both seeds were held together (the feeding threads kept
    each until the next message) and the gateway's RSS went from 159 to 244 MB before "serving"
    (2026-12-07, docs/architecture.md "Restart after a kill").

    pyoxigraph syncs the file it dumped into (fsync), which a pipe refuses (EINVAL) once every
    byte is written (strace): that one error is the dump's end, any other is raised here, after
    the slices, so that nothing takes a dump cut short for a whole one. Without /proc: whole."""
    if not _MEMFD:
        if data := dump_nquads(store):
            yield data
        return
    read, write = os.pipe()
    failed: list[BaseException] = []

    def dump() -> None:
        try:
            at_low_priority(_dump_into_pipe, store, write)
        except BaseException as error:  # noqa: BLE001 - raised to the consumer
            failed.append(error)
        finally:
            os.close(write)

    thread = threading.Thread(target=dump, name="sepa-dump", daemon=True)
    thread.start()
    try:
        with open(read, "rb", closefd=False) as pipe:
            while chunk := pipe.read(size):
                yield chunk
    finally:
        os.close(read)
        thread.join()
    if failed:
        raise OSError(f"the dump of the store failed ({failed[0]})") from failed[0]


def _dump_into_pipe(store: Store, pipe: int) -> None:
    """`store` dumped into the pipe's write end `pipe`, its closing fsync's EINVAL taken for the end
    (:func:`nquads_slices`). Caught here, not raised through :func:`broker.background.at_low_priority`:
    there the error's traceback held its frame, and so the store, in a cycle, until a collection
    (a RocksDB store converted stayed open, and removing its directory failed)."""
    try:
        store.dump(f"/proc/self/fd/{pipe}", format=RdfFormat.N_QUADS)
    except OSError as error:
        if _PIPE_FSYNC not in str(error):
            raise


def load_slices(slices: Iterable[bytes], target: Store, *, background: bool = True) -> None:
    """Add the N-Quads `slices` (cut anywhere: :func:`nquads_slices`) to `target`, each run of
    whole lines as it comes (:func:`load_keeping_labels`), holding at most a slice and one line
    beside it, not the whole dump (a query worker's seed: 39 MB besides its replica before)."""
    tail = b""
    for chunk in slices:
        pending = tail + chunk
        end = pending.rfind(b"\n") + 1
        if end:
            load_keeping_labels(pending[:end], target, background=background)
        tail = pending[end:]
    if tail:
        load_keeping_labels(tail, target, background=background)


def load_keeping_labels(data: bytes, target: Store, *, background: bool = True) -> None:
    """Add the N-Quads `data` to `target`, blank nodes keeping their labels (see :func:`copy_live`);
    at the lowest priority when `background` (a compaction's copy), else at the caller's (a replica
    being seeded: a query waits for it)."""
    if contains(data, b"_:"):
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


_MEMFD = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")
_PIPE_FSYNC = "(os error 22)"  # EINVAL, as Rust's io::Error says it: see nquads_slices
_COUNT_ALL = "SELECT (COUNT(*) AS ?n) WHERE { { ?s ?p ?o } UNION { GRAPH ?g { ?s ?p ?o } } }"
_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.memmem.restype = ctypes.c_void_p
_libc.memmem.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)


def contains(data: bytes, needle: bytes) -> bool:
    """`needle in data`, without the GIL (ctypes lets go of it around a call into a CDLL)."""
    return _libc.memmem(data, len(data), needle, len(needle)) is not None


# a delta a compaction recorded: as N-Quads (True) or as quads (False), then added, removed, graphs
# created, graphs dropped
RecordedDelta = tuple[bool, Any, Any, list[NamedNode], list[NamedNode]]


class Recording:
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


def replay(ox: Store, delta: RecordedDelta) -> None:
    as_nquads, added, removed, created, dropped = delta
    (load_nquads if as_nquads else apply_quads)(ox, added, removed, created, dropped)
