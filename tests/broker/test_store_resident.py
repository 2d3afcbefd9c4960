"""A resident store (broker.store, `resident=True`): the store in memory, rebuilt at start from its
snapshot and two alternating journals. Every acknowledged delta survives a kill -9, whatever the
checkpoints were doing; a snapshot that cannot be written loses nothing; a RocksDB data directory
is converted once, and a resident one is never opened as RocksDB."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest
from pyoxigraph import BlankNode, Literal, NamedNode, Quad

from broker.compaction import Compactor
from broker.core.engine import Engine
from broker.errors import StoreFailed
from broker.store import JOURNAL, JOURNALS, SNAPSHOT, RdfStore, encode_journal_entry, lock, rdf_store
from broker.store.live_copy import SLICE_BYTES
from tests.support.dump_watch import DumpWatch
from tests.support.leftovers import ended
from tests.support.traced import traced_peak

EX = "http://example.org/"


def _quad(index: int) -> Quad:
    return Quad(NamedNode(f"{EX}s{index}"), NamedNode(f"{EX}p"), Literal(str(index)))


def _latest(index: int) -> Quad:
    return Quad(NamedNode(f"{EX}latest"), NamedNode(f"{EX}value"), Literal(str(index)))


def _open(path: Path) -> RdfStore:
    return RdfStore.open(path, resident=True)


_WRITER = """
import sys, threading
from pyoxigraph import Literal, NamedNode, Quad
from broker.store import RdfStore
EX = {ex!r}
quad = lambda i: Quad(NamedNode(f"{{EX}}s{{i}}"), NamedNode(f"{{EX}}p"), Literal(str(i)))
latest = lambda i: Quad(NamedNode(f"{{EX}}latest"), NamedNode(f"{{EX}}value"), Literal(str(i)))
store = RdfStore.open({path!r}, resident=True)
start = sum(1 for q in store.quads() if q.predicate == NamedNode(f"{{EX}}p"))

def checkpoints():
    while True:
        store.checkpoint()

threading.Thread(target=checkpoints, daemon=True).start()
for i in range(start, start + 1_000_000):
    store.apply([quad(i), latest(i)], [latest(i - 1)])
    store.sync()
    print(i, flush=True)
"""


def _consistent_prefix(store: RdfStore) -> int:
    """The last delta the store holds, checking that it holds every delta before it, whole."""
    quads = store.quads()
    numbered = sorted(int(q.object.value) for q in quads if q.predicate == NamedNode(f"{EX}p"))
    last = len(numbered) - 1
    assert numbered == list(range(last + 1)), "a delta is missing or out of order"
    assert [q for q in quads if q.subject == NamedNode(f"{EX}latest")] == [_latest(last)], "a delta half applied"
    return last


def test_every_acknowledged_delta_survives_kill_9_while_checkpoints_switch_journals(tmp_path: Path) -> None:
    """A real kill -9, three times, of a writer that syncs and acknowledges (prints) each delta
    while another thread takes checkpoints back to back: after each, the store is every delta up
    to at least the last acknowledged one, whole, in order."""
    acknowledged = -1
    for kill_after in (300, 1_000, 2_000):
        child = _WRITER.format(ex=EX, path=str(tmp_path))
        process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        seen = 0
        for line in process.stdout:
            acknowledged, seen = int(line), seen + 1
            if seen == kill_after:
                os.kill(process.pid, signal.SIGKILL)
        process.wait()
        assert seen >= kill_after, "the writer ended before it could be killed"
        store = _open(tmp_path)
        assert _consistent_prefix(store) >= acknowledged
        del store
    assert (tmp_path / SNAPSHOT).exists()


def test_a_snapshot_that_cannot_be_written_loses_nothing_and_is_written_at_the_next_checkpoint(
    tmp_path: Path,
) -> None:
    store = _open(tmp_path)
    store.apply([_quad(0), _latest(0)], [])
    (tmp_path / f"{SNAPSHOT}.tmp").mkdir()  # the snapshot's file cannot be opened: a real OSError
    with pytest.raises(OSError):
        store.checkpoint()  # the journals switched first
    store.apply([_quad(1), _latest(1)], [_latest(0)])
    store.sync()
    assert store.checkpoint_due  # the journal left still waits for a snapshot
    assert _consistent_prefix(_open_copy(tmp_path)) == 1
    (tmp_path / f"{SNAPSHOT}.tmp").rmdir()
    assert store.checkpoint()
    assert not store.checkpoint_due
    store.apply([_quad(2), _latest(2)], [_latest(1)])
    store.sync()
    assert _consistent_prefix(_open_copy(tmp_path)) == 2
    store.close()
    assert _consistent_prefix(_open(tmp_path)) == 2


def _open_copy(path: Path) -> RdfStore:
    """The store a start would find now (in a copy of the directory: the store stays open)."""
    copy = path.parent / f"{path.name}-copy-{time.monotonic_ns()}"
    shutil.copytree(path, copy)
    return _open(copy)


def test_a_checkpoint_empties_what_a_start_replays(tmp_path: Path) -> None:
    """The Compactor's thread takes a checkpoint once the journal passed CHECKPOINT_BYTES: the next
    start loads the snapshot and replays only what came after it."""
    store = _open(tmp_path)
    compactor = Compactor(store)
    for index in range(20):
        store.apply([_quad(index)], [])
    assert not compactor.maybe_checkpoint()  # under CHECKPOINT_BYTES
    limit, rdf_store.CHECKPOINT_BYTES = rdf_store.CHECKPOINT_BYTES, 100
    try:
        assert compactor.maybe_checkpoint()
    finally:
        rdf_store.CHECKPOINT_BYTES = limit
    assert compactor.stats["checkpoints"] == 1
    store.apply([_quad(20)], [])
    store.sync()
    records = [_count_records(tmp_path / name) for name in JOURNALS]
    assert sorted(records) == [2, 21]  # each a generation record, then its deltas
    stale = tmp_path / JOURNALS[records.index(21)]
    with stale.open("ab") as file:  # what the snapshot holds is not replayed again
        file.write(encode_journal_entry([_quad(99)], [], [], []))
    reopened = _open_copy(tmp_path)
    assert reopened.quads() == {_quad(index) for index in range(21)}
    store.close()


def test_a_checkpoint_waits_for_twice_the_snapshot_in_journal(tmp_path: Path) -> None:
    """A checkpoint writes the whole store: a large store is not written again for every
    CHECKPOINT_BYTES of journal, only once the journal is SNAPSHOT_RATIO times the snapshot."""
    store = _open(tmp_path)
    store.apply([_quad(index) for index in range(1_000)], [])
    assert store.checkpoint()
    size = (tmp_path / SNAPSHOT).stat().st_size
    limit, rdf_store.CHECKPOINT_BYTES = rdf_store.CHECKPOINT_BYTES, 100
    try:
        index = 1_000
        while store._journal_bytes <= size:  # past CHECKPOINT_BYTES and the snapshot's size
            store.apply([_latest(index)], [_latest(index - 1)])
            index += 1
        assert not store.checkpoint_due
        while store._journal_bytes <= rdf_store.SNAPSHOT_RATIO * size:
            store.apply([_latest(index)], [_latest(index - 1)])
            index += 1
        assert store.checkpoint_due
    finally:
        rdf_store.CHECKPOINT_BYTES = limit
    store.close()


def test_a_checkpoint_is_due_past_journal_max_bytes_whatever_the_snapshot(tmp_path: Path) -> None:
    """A start replays at most JOURNAL_MAX_BYTES of journal: twice a large snapshot was 583 MB of
    journal after a kill (200,000 readings), a start of over 56 s of CPU and 1.9 GB of memory."""
    store = _open(tmp_path)
    store.apply([_quad(index) for index in range(1_000)], [])
    assert store.checkpoint()
    size = (tmp_path / SNAPSHOT).stat().st_size
    limits = rdf_store.CHECKPOINT_BYTES, rdf_store.JOURNAL_MAX_BYTES
    rdf_store.CHECKPOINT_BYTES, rdf_store.JOURNAL_MAX_BYTES = 100, size // 2
    try:
        index = 1_000
        while store._journal_bytes <= size // 2:
            assert not store.checkpoint_due
            store.apply([_latest(index)], [_latest(index - 1)])
            index += 1
        assert store.checkpoint_due  # well before twice the snapshot's size
    finally:
        rdf_store.CHECKPOINT_BYTES, rdf_store.JOURNAL_MAX_BYTES = limits
    store.close()


def test_a_rocksdb_data_directory_is_converted_once_and_a_resident_one_is_not_opened_as_rocksdb(
    tmp_path: Path,
) -> None:
    blank = Quad(BlankNode("b1"), NamedNode(f"{EX}p"), Literal("x"))
    empty = NamedNode(f"{EX}empty")
    old = RdfStore.open(tmp_path)
    old.apply([_quad(1), blank], [], [empty])
    old.sync()  # not closed: its journal holds the delta, as after a kill
    del old
    converted = _open(tmp_path)
    assert converted.quads() == {_quad(1), blank}
    assert list(converted.ox.named_graphs()) == [empty]
    assert not (tmp_path / "store").exists() and not (tmp_path / JOURNAL).exists()
    converted.apply([_quad(2)], [])
    converted.close()
    with pytest.raises(StoreFailed, match="resident"):
        RdfStore.open(tmp_path)
    assert _open(tmp_path).quads() == {_quad(1), _quad(2), blank}


def _count_records(journal: Path) -> int:
    """Records in a journal, begun or whole (each starts with the magic word of its header)."""
    return journal.read_bytes().count(b"SEPA-DELTA ")


def _records(path: Path) -> int:
    """Deltas in the resident journals (their generation records not counted)."""
    return sum(max(0, _count_records(path / name) - 1) for name in JOURNALS)


def test_killed_inside_a_request_of_several_operations_none_of_them_is_kept(tmp_path: Path) -> None:
    """As on RocksDB (tests/broker/test_store.py): the first operation's record is provisional, and
    the replay after a kill -9 inside the second one's WHERE undoes it."""
    setup = _open(tmp_path)
    setup.apply([_quad(index) for index in range(3_000)], [])
    setup.close()
    del setup
    slow = f"SELECT (COUNT(*) AS ?n) WHERE {{ ?a <{EX}p> ?b . ?c <{EX}p> ?d . FILTER(?b != ?d) }}"
    request = f'INSERT DATA {{ <{EX}x> <{EX}first> "1" }} ; INSERT {{ <{EX}x> <{EX}count> ?n }} WHERE {{ {slow} }}'
    child = textwrap.dedent(
        f"""
        from broker.core.engine import Engine
        from broker.store import RdfStore
        engine = Engine(RdfStore.open({str(tmp_path)!r}, resident=True))
        engine.update({request!r})
        """
    )
    process = subprocess.Popen([sys.executable, "-c", child])
    deadline = time.monotonic() + 60
    while _records(tmp_path) == 0 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.001)
    time.sleep(0.2)  # inside the second operation's WHERE (9 million pairs)
    assert process.poll() is None, "the child finished before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    reopened = _open(tmp_path)
    assert [q for q in reopened.quads() if q.subject == NamedNode(f"{EX}x")] == []
    assert len(reopened.quads()) == 3_000
    reopened.apply([_quad(5_000)], [])
    reopened.close()
    assert Engine(_open(tmp_path)).store.quads() == {_quad(index) for index in [*range(3_000), 5_000]}


def test_a_snapshot_cut_short_by_a_full_disk_leaves_the_last_one_and_no_temporary_file(tmp_path: Path) -> None:
    """A real EFBIG (RLIMIT_FSIZE, in a child: no root needed): the new snapshot is larger than the
    limit, the old one and the journals are what a start finds, and nothing half written stays."""
    store = _open(tmp_path)
    store.apply([_quad(index) for index in range(20_000)], [])  # ~1.2 MB of N-Quads
    assert store.checkpoint()
    store.close()
    child = textwrap.dedent(
        f"""
        import resource, signal
        from pyoxigraph import Literal, NamedNode, Quad
        from broker.store import RdfStore
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, 500_000))
        store = RdfStore.open({str(tmp_path)!r}, resident=True)
        store.apply([Quad(NamedNode("{EX}s20000"), NamedNode("{EX}p"), Literal("20000"))], [])
        store.sync()
        try:
            store.checkpoint()
        except OSError as error:
            print("refused", error.errno)
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "refused 27", done  # EFBIG
    assert not (tmp_path / f"{SNAPSHOT}.tmp").exists()
    assert _open(tmp_path).quads() == {_quad(index) for index in range(20_001)}


def test_a_damaged_snapshot_is_a_clear_error(tmp_path: Path) -> None:
    store = _open(tmp_path)
    store.apply([_quad(1)], [])
    assert store.checkpoint()
    store.close()
    snapshot = tmp_path / SNAPSHOT
    snapshot.write_bytes(snapshot.read_bytes().replace(b" .", b" <"))
    with pytest.raises(StoreFailed, match="cannot be read"):
        _open(tmp_path)
    snapshot.write_bytes(b"not a snapshot\n")
    with pytest.raises(StoreFailed, match="not a snapshot"):
        _open(tmp_path)


_HOLDER = """
import sys
from broker.store import RdfStore
store = RdfStore.open({path!r}, resident={resident})
print("open", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("resident", [True, False], ids=["resident", "rocksdb"])
def test_a_data_directory_is_one_processs_until_that_process_ends(tmp_path: Path, resident: bool) -> None:
    """A second process opening the directory is refused, naming it and the holder's pid (two stores
    on one directory overwrote each other's journal records and dropped each other's synced
    deltas at a checkpoint); the holder's kill -9 frees it, and so does a close."""
    child = _HOLDER.format(path=str(tmp_path), resident=resident)
    holder = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        started = time.monotonic()
        with pytest.raises(StoreFailed, match=rf"{tmp_path} is in use by another process \(pid {holder.pid},"):
            RdfStore.open(tmp_path, resident=resident)
        assert time.monotonic() - started >= lock.LOCK_WAIT_S  # it waited for a holder still stopping
    finally:
        ended(holder)  # the kill -9 of the docstring; it waits for a line on stdin until then
    store = RdfStore.open(tmp_path, resident=resident)
    store.close()
    del store  # RocksDB's own lock goes with the store
    done = subprocess.run([sys.executable, "-c", child], input="\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _journalled(path: Path, count: int) -> tuple[Path, list[int]]:
    """A store of `count` synced deltas left as a kill leaves it: its journal and its records' offsets."""
    store = _open(path)
    for index in range(count):
        store.apply([_quad(index)], [])
        store.sync()
    del store
    journal = path / JOURNALS[0]
    data = journal.read_bytes()
    return journal, [index for index in range(len(data)) if data.startswith(b"SEPA-DELTA ", index)]


def _damaged(data: bytes, at: int, how: str) -> bytes:
    """`data` with one byte changed in the record at `at`: its magic, a size, or a quad of it."""
    spot = {"magic": at + 9, "size": data.index(b" ", at + 11) - 1, "body": data.index(b"<", at) + 1}[how]
    return (
        data[:spot]
        + bytes([data[spot] ^ 0x01 if how == "magic" else ord("9" if how == "size" else " ")])
        + data[spot + 1 :]
    )


@pytest.mark.parametrize("how", ["magic", "size", "body"])
def test_one_damaged_byte_in_a_journal_record_refuses_the_start_and_keeps_the_file(tmp_path: Path, how: str) -> None:
    """A bit flipped in the header of the 11th of 100 acknowledged records was taken for a record
    cut by a crash: the start went on with 10 of 100 quads, said 'the journal ends in a cut record' and
    truncated the file from 4,715 to 440 bytes; a damaged quad was a raw SyntaxError traceback.
    Now the start is refused with the file and the offset named and the file kept as it was; the
    truncation the message proposes starts with the records before the damage."""
    journal, records = _journalled(tmp_path, 100)
    damaged = _damaged(journal.read_bytes(), records[11], how)
    journal.write_bytes(damaged)
    with pytest.raises(
        StoreFailed, match=rf"^{journal} is damaged at byte {records[11]} of {len(damaged)} \("
    ) as refused:
        _open(tmp_path)
    assert f"truncate -s {records[11]} {journal}" in str(refused.value) and "\n" not in str(refused.value)
    assert journal.read_bytes() == damaged
    os.truncate(journal, records[11])
    assert _open(tmp_path).quads() == {_quad(index) for index in range(10)}


@pytest.mark.parametrize("zeros", [0, 4096], ids=["cut", "cut-then-zeros"])
def test_a_record_cut_at_the_end_is_still_cut_off(tmp_path: Path, zeros: int) -> None:
    """What a crash while appending leaves (a record's start; after a power cut, maybe zeros after
    it) is cut off as before, the records before it kept; a record whose data a power cut turned to
    zeros too."""
    journal, records = _journalled(tmp_path, 20)
    data = journal.read_bytes()
    for cut in (records[-1] + 5, records[-1] + 30, len(data) - 3):
        journal.write_bytes(data[:cut] + bytes(zeros))
        assert _open(tmp_path).quads() == {_quad(index) for index in range(19)}
        assert journal.read_bytes() == data[: records[-1]]
    zeroed = data[: len(data) - 10] + bytes(10 + zeros)  # the record's size written, its last bytes not
    journal.write_bytes(zeroed)
    assert _open(tmp_path).quads() == {_quad(index) for index in range(19)}


def test_a_stale_journal_is_not_read_past_its_generation(tmp_path: Path) -> None:
    """A journal the snapshot holds is not decoded (nor truncated): damage there loses nothing, and
    its start (a raw traceback, then a restart loop under systemd) is not refused."""
    journal, records = _journalled(tmp_path, 20)
    store = _open(tmp_path)
    assert store.checkpoint()
    store.apply([_quad(20)], [])
    store.sync()
    del store
    damaged = _damaged(journal.read_bytes(), records[5], "body")
    journal.write_bytes(damaged)
    assert _open(tmp_path).quads() == {_quad(index) for index in range(21)}
    assert journal.read_bytes() == damaged


def _checkpointed(path: Path, count: int) -> Path:
    """A closed store of `count` quads, checkpointed twice (its journals at generations 1 and 2),
    then one more delta in its journal; its snapshot."""
    store = _open(path)
    store.apply([_quad(index) for index in range(count - 1)], [])
    assert store.checkpoint()
    store.apply([_quad(count - 1)], [])
    assert store.checkpoint()
    store.apply([_quad(count)], [])
    store.close()
    return path / SNAPSHOT


def test_a_snapshot_cut_short_at_a_line_boundary_is_refused(tmp_path: Path) -> None:
    """Cut at a line (a copy or a restore cut short), it loaded without a word (495 of 1,000 quads),
    and the next checkpoint made the loss permanent."""
    snapshot = _checkpointed(tmp_path, 1_000)
    data = snapshot.read_bytes()
    cut = data[: data.rindex(b"\n", 0, len(data) // 2) + 1]
    snapshot.write_bytes(cut)
    with pytest.raises(StoreFailed, match=rf"^{snapshot} is cut short or lengthened: \d+ bytes after its header"):
        _open(tmp_path)
    assert snapshot.read_bytes() == cut
    snapshot.write_bytes(data)
    assert _open(tmp_path).quads() == {_quad(index) for index in range(1_001)}


def test_a_missing_snapshot_is_refused_once_the_journals_no_longer_start_at_generation_0(tmp_path: Path) -> None:
    """Removed, the store started from the journals alone (22 of 30 quads), silently. (With the
    journals at generations 0 and 1, the first one still holds every delta: that start is whole.)"""
    snapshot = _checkpointed(tmp_path, 20)
    snapshot.unlink()
    with pytest.raises(StoreFailed, match=rf"^{snapshot} is missing: the journals beside it start at generation 1"):
        _open(tmp_path)
    fresh = tmp_path / "fresh"  # a directory never checkpointed has no snapshot, and that is fine
    store = _open(fresh)
    store.apply([_quad(1)], [])
    store.close()
    assert _open(fresh).quads() == {_quad(1)}


def test_a_snapshot_written_before_its_byte_count_is_read_and_rewritten_with_one(tmp_path: Path) -> None:
    snapshot = _checkpointed(tmp_path, 50)
    header, rest = snapshot.read_bytes().split(b"\n", 1)
    snapshot.write_bytes(b" ".join(header.split()[:3]) + b"\n" + rest)  # the format before this change
    store = _open(tmp_path)
    assert store.quads() == {_quad(index) for index in range(51)}
    assert store.checkpoint()
    assert len(snapshot.read_bytes().split(b"\n", 1)[0].split()) == 4


_TAGGED = """
import os, signal, sys
from pyoxigraph import Literal, NamedNode, Quad
from broker.store import ApplyMark, RdfStore, rdf_store
rdf_store.CHECKPOINT_BYTES = 1  # every journal is due: as after a long run, or two live journals
store = RdfStore.open(sys.argv[1], resident=True)
if sys.argv[2] == "run":  # a delayed update's delta, killed before its owner removed its row
    store.apply([Quad(NamedNode("urn:ran"), NamedNode("urn:p"), Literal("1"))], [], mark=ApplyMark("id-1", print))
else:  # the restart: the compaction thread's first checkpoint, before the delayed updates start
    print(store.recovered_tags, store.checkpoint(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_recovered_tag_outlives_a_checkpoint_and_a_second_kill_before_its_owner_claims_it(tmp_path: Path) -> None:
    """A delayed update's delta journalled with its tag, then kill -9 before its row was removed;
    the restart's compaction thread checkpoints (it starts before the delayed updates, which claim
    the tag), then a second kill -9. The third start must still recover the tag, or the update runs
    twice. Without the fix the checkpoint was taken, the journal holding the tag became stale, and
    the third start recovered nothing (recovered_tags == [])."""
    for step in ("run", "restart"):
        done = subprocess.run([sys.executable, "-c", _TAGGED, str(tmp_path), step], capture_output=True, text=True)
        assert done.returncode == -signal.SIGKILL, done.stderr
    store = _open(tmp_path)
    assert store.recovered_tags == ["id-1"]
    assert Quad(NamedNode("urn:ran"), NamedNode("urn:p"), Literal("1")) in store.quads()
    assert done.stdout.strip() == "['id-1'] False", done.stdout  # recovered, and no checkpoint taken


def test_a_checkpoint_dumps_into_a_memory_file_not_bytes_made_under_the_gil(tmp_path: Path) -> None:
    """A checkpoint's dump, like a compaction's copy (tests/broker/test_compaction.py), is written
    into a memfd without the GIL, not made into bytes under it by its thread at niceness 19; the
    snapshot written from it restores the store."""
    store = _open(tmp_path)
    for index in range(50):
        store.apply([_quad(index)], [])
    watch = DumpWatch(store.ox)
    store.ox = watch  # type: ignore[assignment]
    limit, rdf_store.CHECKPOINT_BYTES = rdf_store.CHECKPOINT_BYTES, 100
    try:
        assert Compactor(store).maybe_checkpoint()
    finally:
        rdf_store.CHECKPOINT_BYTES = limit
    assert watch.outputs and all(isinstance(output, str) for output in watch.outputs)
    assert _open_copy(tmp_path).quads() == {_quad(index) for index in range(50)}
    store.close()


def test_a_large_delta_is_journalled_without_a_second_copy_of_its_n_quads(tmp_path: Path) -> None:
    """The journal record was built whole (its parts, then them joined) and kept until the delta was
    in the store: two copies of the delta's N-Quads at the update path's highest point (24 MB of
    INSERT DATA took a gateway's peak RSS +69-135 MB). Its parts are written one after the other and
    let go of before the store is changed: what applying allocates, beside the delta's own quads,
    is about one copy of its N-Quads."""
    store = _open(tmp_path)
    padding = "x" * 100
    added = [
        Quad(NamedNode(f"{EX}s{index}"), NamedNode(f"{EX}p"), Literal(f"{padding}{index}")) for index in range(50_000)
    ]
    nquads = len(encode_journal_entry(added, [], [], []))
    try:
        tracemalloc.start()
        store.apply(added, [])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        store.close()
    assert peak < 1.5 * nquads, f"{peak / 1e6:.1f} MB allocated to journal and apply {nquads / 1e6:.1f} MB of N-Quads"
    reopened = _open(tmp_path)
    try:
        assert len(reopened.ox) == len(added) and added[-1] in reopened.ox  # the journal replays it whole
    finally:
        reopened.close()


def test_a_start_replays_the_journal_record_by_record_not_decoded_whole_first(tmp_path: Path) -> None:
    """A start read the whole journal and decoded every record into Python quads before it replayed
    them: its memory followed the journal, not the store (57 MB of journal, 20,000 readings: a peak
    RSS of 330 MB). Each record is now applied as it is read and let go of: what the start allocates
    beside the store (pyoxigraph's, not traced here) is about one record's, however long the journal."""
    store = _open(tmp_path)
    padding = "x" * 100
    for record in range(200):
        added = [Quad(NamedNode(f"{EX}s{record}-{index}"), NamedNode(f"{EX}p"), Literal(f"{padding}{index}"))
                 for index in range(250)]  # fmt: skip
        store.apply(added, [])
    store.sync()
    del store  # as a kill leaves it: the journal holds every delta
    journal = (tmp_path / JOURNALS[0]).stat().st_size
    record = journal // 200
    reopened, peak = traced_peak(lambda: _open(tmp_path))
    try:
        assert len(reopened.ox) == 200 * 250 and added[-1] in reopened.ox
    finally:
        reopened.close()
    assert peak < 10 * record, (
        f"{peak / 1e6:.2f} MB allocated to replay {journal / 1e6:.1f} MB of journal in records of {record / 1e3:.0f} kB"
    )


def test_a_checkpoint_and_a_start_go_through_the_snapshot_a_slice_at_a_time_not_whole(tmp_path: Path) -> None:
    """A checkpoint dumped the store into one `bytes` and wrote it, and a start read the snapshot
    whole and split it: 39 MB for 231,100 quads, twice at the start, on top of the store, when a
    board's memory is tightest (after a kill: docs/architecture.md, "Restart after a kill"). Now
    the dump is written as it is read from a pipe, and the snapshot loaded as it is read, a slice at
    a time (broker.store.nquads_slices, load_slices): what either allocates beside the store
    (pyoxigraph's, not traced here) is a few slices, however large the store (2.1 and 5.1 MB here,
    a 16 MB snapshot; each at least the snapshot's size before). The snapshot is
    whole all the same: the store reopened from it alone holds every quad and graph."""
    store = _open(tmp_path)
    padding = "x" * 100
    quads = [Quad(NamedNode(f"{EX}s{n}"), NamedNode(f"{EX}p"), Literal(f"{padding}{n}")) for n in range(100_000)]
    store.apply([*quads, Quad(BlankNode("b1"), NamedNode(f"{EX}p"), Literal("blank"))], [], [NamedNode(f"{EX}empty")])
    try:
        checkpointed, written_peak = traced_peak(store.checkpoint)
        assert checkpointed
    finally:
        store.close()
    snapshot = (tmp_path / SNAPSHOT).stat().st_size
    reopened, loaded_peak = traced_peak(lambda: _open(tmp_path))
    try:
        assert len(reopened.ox) == 100_001 and quads[-1] in reopened.ox
        assert Quad(BlankNode("b1"), NamedNode(f"{EX}p"), Literal("blank")) in reopened.ox  # its label kept
        assert list(reopened.ox.named_graphs()) == [NamedNode(f"{EX}empty")]
    finally:
        reopened.close()
    assert max(written_peak, loaded_peak) < 6 * SLICE_BYTES, (
        f"{written_peak / 1e6:.2f} MB allocated to write and {loaded_peak / 1e6:.2f} MB to load a snapshot of "
        f"{snapshot / 1e6:.1f} MB"
    )
