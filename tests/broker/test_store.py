"""On-disk stores apply every update whole or not at all, even when the process is killed.

pyoxigraph has no transaction spanning removals and additions, so the store journals each delta
before applying it and replays the journal's complete records when it is opened again.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyoxigraph import BlankNode, DefaultGraph, Literal, NamedNode, Quad, RdfFormat, Store, serialize

import broker.store
from broker.core.engine import Engine
from broker.errors import StoreFailed
from broker.store import JOURNAL, RdfStore, encode_journal_entry, rdf_store
from broker.store import delta as store_delta
from broker.workers.backlog import Backlog

EX = "http://example.org/"


def _quad(index: int) -> Quad:
    return Quad(NamedNode(f"{EX}s{index}"), NamedNode(f"{EX}p"), Literal(str(index)))


def _first_record_whole(journal: Path) -> bool:
    """Whether the journal holds its first record whole: the header's part sizes all written."""
    if not journal.exists():
        return False
    with journal.open("rb") as file:
        header = file.readline()
    if not header.endswith(b"\n"):
        return False
    return journal.stat().st_size >= len(header) + sum(int(size) for size in header.split()[1:])


def kill_once_journalled(child: str, data_dir: Path, after_s: float) -> None:
    """Run `child` (Python source) and kill -9 it `after_s` after its first journal record is whole.

    Whole, not begun: a 200,000-quad record takes a while to write, and a kill inside it leaves a cut
    record the store rightly drops (CI once killed there, and the update was, correctly, not applied)."""
    process = subprocess.Popen([sys.executable, "-c", child])
    journal = data_dir / JOURNAL
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if _first_record_whole(journal):
            time.sleep(after_s)
            break
        time.sleep(0.001)
    assert process.poll() is None, "the child finished before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


def test_a_complete_journal_is_finished_when_the_store_is_opened(tmp_path: Path) -> None:
    store = RdfStore.open(tmp_path)
    store.ox.extend([_quad(1), _quad(2)])
    store.close()
    del store
    # what a process killed after journalling, in the middle of applying, leaves behind
    (tmp_path / JOURNAL).write_bytes(encode_journal_entry([_quad(3)], [_quad(1), _quad(2)], [NamedNode(f"{EX}g")], []))
    reopened = RdfStore.open(tmp_path)
    assert reopened.quads() == {_quad(3)}
    assert list(reopened.ox.named_graphs()) == [NamedNode(f"{EX}g")]
    reopened.close()  # a checkpoint: the store flushed, the journal emptied
    assert (tmp_path / JOURNAL).read_bytes() == b""


def test_a_journal_replays_blank_node_graph_names_and_bare_iris(tmp_path: Path) -> None:
    """Graph names travel as terms (a blank node is one); a bare IRI is what older journals hold."""
    store = RdfStore.open(tmp_path)
    blank = BlankNode("g1")
    store.ox.add_graph(blank)
    store.close()
    del store
    bare = f"{EX}g2".encode()  # created, as an older gateway journalled it
    magic = encode_journal_entry([], [], [], []).split(b" ")[0]
    older = magic + f" 0 0 {len(bare)} 0 0\n".encode() + bare
    (tmp_path / JOURNAL).write_bytes(encode_journal_entry([], [], [NamedNode(f"{EX}g")], [blank]) + older)
    reopened = RdfStore.open(tmp_path)
    assert set(reopened.ox.named_graphs()) == {NamedNode(f"{EX}g"), NamedNode(f"{EX}g2")}
    reopened.close()


def test_every_complete_record_of_the_journal_is_replayed_in_order(tmp_path: Path) -> None:
    """The journal is the write-ahead log: what a power cut leaves of RocksDB's unsynced writes does
    not matter, the synced records are replayed in order; a record cut at the end is ignored."""
    RdfStore.open(tmp_path).close()
    records = [
        encode_journal_entry([_quad(1), _quad(2)], [], [], []),
        encode_journal_entry([_quad(3)], [_quad(1)], [], [], "tag-a"),
        encode_journal_entry([_quad(1)], [_quad(3)], [], []),
    ]
    cut = encode_journal_entry([_quad(9)], [_quad(2)], [], [])[:-3]
    (tmp_path / JOURNAL).write_bytes(b"".join(records) + cut)
    reopened = RdfStore.open(tmp_path)
    assert reopened.quads() == {_quad(1), _quad(2)}
    assert reopened.recovered_tags == ["tag-a"]
    reopened.close()


def test_a_journal_cut_while_being_written_is_ignored(tmp_path: Path) -> None:
    store = RdfStore.open(tmp_path)
    store.ox.extend([_quad(1)])
    store.close()
    del store
    record = encode_journal_entry([_quad(3)], [_quad(1)], [], [])
    (tmp_path / JOURNAL).write_bytes(record[:-5])  # the apply had not started
    assert RdfStore.open(tmp_path).quads() == {_quad(1)}


def test_a_record_appended_after_a_cut_one_is_replayed_too(tmp_path: Path) -> None:
    """The cut record is dropped at the start: appended after it, the next update's record was cut
    off with it at the next replay (acknowledged, and lost if the store had not written it)."""
    RdfStore.open(tmp_path).close()
    cut = encode_journal_entry([_quad(9)], [], [], [])[:-3]
    (tmp_path / JOURNAL).write_bytes(encode_journal_entry([_quad(1)], [], [], []) + cut)
    store = RdfStore.open(tmp_path)
    assert (tmp_path / JOURNAL).read_bytes() == encode_journal_entry([_quad(1)], [], [], [])
    store.apply([_quad(2)], [])
    store._journal.flush()  # as the process leaves it when killed: in the kernel, not checkpointed
    journal = (tmp_path / JOURNAL).read_bytes()
    store.ox.remove(_quad(2))  # the store had not written it (a power cut): only the journal has it
    store.ox.flush()
    del store
    (tmp_path / JOURNAL).write_bytes(journal)
    assert RdfStore.open(tmp_path).quads() == {_quad(1), _quad(2)}


def test_the_journal_is_emptied_at_a_checkpoint(tmp_path: Path) -> None:
    engine = Engine(RdfStore.open(tmp_path))
    engine.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")
    assert (tmp_path / JOURNAL).read_bytes().startswith(b"SEPA-DELTA")  # kept until a checkpoint
    limit, rdf_store.CHECKPOINT_BYTES = rdf_store.CHECKPOINT_BYTES, 1
    try:
        engine.update(f"DELETE DATA {{ <{EX}a> <{EX}p> 1 }}")
    finally:
        rdf_store.CHECKPOINT_BYTES = limit
    assert (tmp_path / JOURNAL).read_bytes() == b""
    engine.store.close()


def test_killed_in_the_middle_of_a_large_delete_the_update_is_applied_whole(tmp_path: Path) -> None:
    """A real kill -9 while 200,000 quads are being removed one by one."""
    count = 200_000
    setup = Engine(RdfStore.open(tmp_path))
    setup.store.ox.extend(_quad(index) for index in range(count))
    setup.store.close()
    del setup
    child = textwrap.dedent(
        f"""
        from broker.core.engine import Engine
        from broker.store import RdfStore
        engine = Engine(RdfStore.open({str(tmp_path)!r}))
        engine.update("DELETE WHERE {{ ?s <{EX}p> ?o }}")
        """
    )
    kill_once_journalled(child, tmp_path, 0.05)  # well inside the removals
    reopened = RdfStore.open(tmp_path)
    assert len(reopened.quads()) == 0  # not some of the 200,000: all of them are gone


def test_killed_inside_a_request_of_several_operations_none_of_them_is_kept(tmp_path: Path) -> None:
    """A real kill -9 after the first operation of `INSERT DATA ; INSERT ... WHERE { slow }` was
    applied (its record in the journal) and while the second one's WHERE runs: the first was
    kept on restart, a request half applied. Now its record is provisional and the replay undoes it."""
    setup = Engine(RdfStore.open(tmp_path))
    setup.store.ox.extend(_quad(index) for index in range(3_000))
    setup.store.close()
    del setup
    slow = f"SELECT (COUNT(*) AS ?n) WHERE {{ ?a <{EX}p> ?b . ?c <{EX}p> ?d . FILTER(?b != ?d) }}"
    request = f'INSERT DATA {{ <{EX}x> <{EX}first> "1" }} ; INSERT {{ <{EX}x> <{EX}count> ?n }} WHERE {{ {slow} }}'
    child = textwrap.dedent(
        f"""
        from broker.core.engine import Engine
        from broker.store import RdfStore
        engine = Engine(RdfStore.open({str(tmp_path)!r}))
        engine.update({request!r})
        """
    )
    kill_once_journalled(child, tmp_path, 0.2)  # inside the second operation's WHERE (9 million pairs)
    reopened = RdfStore.open(tmp_path)
    assert [q for q in reopened.quads() if q.subject == NamedNode(f"{EX}x")] == []
    assert len(reopened.quads()) == 3_000
    reopened.apply([_quad(5_000)], [])
    reopened.close()
    del reopened
    again = RdfStore.open(tmp_path)  # the undo was journalled: a later record is not undone with it
    assert len(again.quads()) == 3_001 and _quad(5_000) in again.quads()


_UNIVERSE = [
    Quad(
        NamedNode(f"{EX}s{i}"),
        NamedNode(f"{EX}p"),
        Literal(str(i)),
        NamedNode(f"{EX}g{i % 2}") if i % 3 else DefaultGraph(),
    )
    for i in range(8)
]
_operations = st.lists(st.tuples(st.sets(st.integers(0, 7)), st.sets(st.integers(0, 7))), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(st.tuples(_operations, st.booleans()), max_size=4), unfinished=_operations)
def test_a_replay_undoes_the_operations_of_the_request_a_kill_cut_and_only_those(
    tmp_path_factory: pytest.TempPathFactory, requests: list, unfinished: list
) -> None:
    """Requests of several operations as the update processor journals them (each operation
    provisional, then the undo that settles them, then the net delta if the request succeeded),
    then one cut by a kill after some of its operations: opened again, the store is as it was
    before that one, whatever the operations added and removed (one undoing another's work too),
    and stays so at the next opening."""
    directory = tmp_path_factory.mktemp("store")
    store = RdfStore.open(directory)
    state: set[Quad] = set()

    def run(store: RdfStore, operations: list) -> None:
        for to_add, to_remove in operations:
            added = [_UNIVERSE[i] for i in sorted(to_add) if _UNIVERSE[i] not in state]
            removed = [_UNIVERSE[i] for i in sorted(to_remove - to_add) if _UNIVERSE[i] in state]
            store.apply(added, removed, sequence=broker.store.PROVISIONAL)
            state.difference_update(removed)
            state.update(added)

    for operations, succeeded in requests:
        before = set(state)
        run(store, operations)
        after = set(state)
        store.apply(list(before - after), list(after - before), sequence=broker.store.SETTLED)
        state.clear()
        state.update(before)
        if succeeded:
            store.apply(list(after - before), list(before - after))
            state.update(after - before)
            state.difference_update(before - after)
    expected = set(state)
    run(store, unfinished)
    store.close()  # as a kill leaves it: the journal is not emptied while operations are provisional
    del store
    reopened = RdfStore.open(directory)
    assert reopened.quads() == expected
    reopened.apply([_UNIVERSE[0]] if _UNIVERSE[0] not in expected else [], [])
    reopened.close()
    del reopened
    assert RdfStore.open(directory).quads() == expected | {_UNIVERSE[0]}


def test_on_disk_a_delta_reaches_rocksdbs_log_in_one_write(tmp_path: Path) -> None:
    """Why it matters: the kernel writes RocksDB's log and the journal back in no set order, so
    after a power cut RocksDB may hold a delta whose journal record is lost. Written in one write
    (one transaction), that delta is whole or absent there; written quad by quad (one transaction
    per removal: four writes for this delta), it could come back half applied. Traced with strace."""
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed (tests/run.sh installs it)", pytrace=False)
    child = textwrap.dedent(
        f"""
        import os
        from pyoxigraph import Literal, NamedNode, Quad
        from broker.store import RdfStore
        store = RdfStore.open({str(tmp_path)!r})
        graph, other = NamedNode("{EX}g"), NamedNode("{EX}other")
        quads = [Quad(NamedNode("{EX}s%d" % index), NamedNode("{EX}p"), Literal(index), graph) for index in range(5)]
        store.apply(quads + [Quad(NamedNode("{EX}o"), NamedNode("{EX}p"), Literal(0), other)], [])
        os.write(2, b"<<before>>\\n")
        store.apply([Quad(NamedNode("{EX}x"), NamedNode("{EX}p"), Literal('a"b\\\\c'), graph)], quads[:3], [], [other])
        os.write(2, b"<<after>>\\n")
        """
    )
    trace = subprocess.run(
        ["strace", "-f", "-y", "-e", "trace=write,writev,pwrite64", sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stderr
    during = trace[trace.index("<<before>>") : trace.index("<<after>>")]
    log_writes = [line for line in during.splitlines() if "/store/" in line and ".log>" in line]
    assert len(log_writes) == 1, during
    reopened = RdfStore.open(tmp_path)
    assert {quad.subject.value for quad in reopened.quads()} == {f"{EX}s3", f"{EX}s4", f"{EX}x"}
    assert list(reopened.ox.named_graphs()) == [NamedNode(f"{EX}g")]
    reopened.close()


def _iri(path: str) -> NamedNode | None:
    try:
        return NamedNode(f"{EX}{path}")
    except ValueError:  # a code point IRIs do not allow
        return None


_iris = (
    st.text(st.characters(exclude_categories=("Cc", "Cs", "Zs"), exclude_characters='<>"{}|^`\\ '), max_size=6)
    .map(_iri)
    .filter(bool)
)
_texts = st.text(max_size=8)  # quotes, backslashes, control characters, newlines, any plane
_literals = st.one_of(
    st.builds(Literal, _texts),
    st.builds(lambda text, tag: Literal(text, language=tag), _texts, st.sampled_from(["en", "en-GB", "zh-Hant-TW"])),
    st.builds(  # typed literals, valid lexical forms or not: stored as written
        lambda text, kind: Literal(text, datatype=NamedNode(f"http://www.w3.org/2001/XMLSchema#{kind}")),
        st.one_of(_texts, st.sampled_from(["01", "1", "-0", "1e0", "NaN", "INF", "true", "0.10"])),
        st.sampled_from(["integer", "decimal", "double", "boolean", "string", "dateTime"]),
    ),
)
_quads = st.builds(
    Quad,
    st.one_of(_iris, st.builds(BlankNode, st.sampled_from(["b1", "b2"]))),
    _iris,
    st.one_of(_iris, _literals),
    st.one_of(st.just(DefaultGraph()), st.builds(NamedNode, st.sampled_from([f"{EX}g1", f"{EX}g2"]))),
)
_deltas = st.lists(
    st.tuples(
        st.lists(_quads, max_size=6),  # added
        st.lists(st.integers(0, 30), max_size=6),  # removed: quads added before, by position
        st.lists(st.sampled_from([f"{EX}g1", f"{EX}g3"]), max_size=1),  # graphs created
        st.lists(st.sampled_from([f"{EX}g1", f"{EX}g2"]), max_size=1),  # graphs dropped
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(deltas=_deltas, one_write=st.sampled_from([2, store_delta.ONE_WRITE_QUADS]))
def test_on_disk_deltas_written_as_updates_leave_the_store_a_quad_by_quad_apply_does(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, deltas: list, one_write: int
) -> None:
    """Any term a delta can hold, on disk (one SPARQL update per delta, or per piece of a large one;
    blank nodes quad by quad) against in memory (quad by quad), after every delta and once the
    store is opened again."""
    monkeypatch.setattr(store_delta, "ONE_WRITE_QUADS", one_write)
    directory = tmp_path_factory.mktemp("store")
    disk, memory = RdfStore.open(directory), RdfStore.memory()
    seen: list[Quad] = []
    for added, removed, created, dropped in deltas:
        removed_quads = [seen[index % len(seen)] for index in removed] if seen else []
        created_graphs, dropped_graphs = [NamedNode(g) for g in created], [NamedNode(g) for g in dropped]
        for store in (disk, memory):
            store.apply(added, removed_quads, created_graphs, dropped_graphs)
        seen += added
        assert disk.quads() == memory.quads()
        assert set(disk.ox.named_graphs()) == set(memory.ox.named_graphs())
    disk.close()
    del disk, store  # pyoxigraph lets go of RocksDB's lock once the Store is gone
    reopened = RdfStore.open(directory)
    assert reopened.quads() == memory.quads()
    reopened.close()


@settings(max_examples=60, deadline=None)
@given(deltas=_deltas, followed=st.booleans())
def test_a_delta_applied_from_n_quads_leaves_the_store_applying_its_quads_does(deltas: list, followed: bool) -> None:
    """What a replica does with the deltas it is sent (Store.load for the added quads, unless blank
    nodes or a follower need them as objects) against the store's own apply: the same quads, graphs
    and dead-version count after every delta; a blank node a delta added is the one a later delta
    removes (Store.load alone renames it: the replica would keep a quad the store removed)."""
    replica, store = RdfStore.memory(), RdfStore.memory()
    followed_deltas: list[tuple] = []
    if followed:
        replica.follow(lambda *delta: followed_deltas.append(delta[:2]))
    seen: list[Quad] = []
    for added, removed, created, dropped in deltas:
        removed_quads = [seen[index % len(seen)] for index in removed] if seen else []
        store.apply(added, removed_quads, [NamedNode(g) for g in created], [NamedNode(g) for g in dropped])
        replica.apply_nquads(
            serialize(added, format=RdfFormat.N_QUADS) if added else b"",
            serialize(removed_quads, format=RdfFormat.N_QUADS) if removed_quads else b"",
            created,
            dropped,
        )
        seen += added
        assert replica.quads() == store.quads()
        assert set(replica.ox.named_graphs()) == set(store.ox.named_graphs())
        assert (replica.garbage, replica.changes) == (store.garbage, store.changes)
    if followed:
        assert [quad for added, _ in followed_deltas for quad in added] == seen


@settings(max_examples=80, deadline=None)
@given(deltas=_deltas, data=st.data())
def test_a_replica_s_netted_backlog_leaves_it_the_store_applying_each_delta_does(
    deltas: list, data: st.DataObject
) -> None:
    """A query worker's replica keeps its deltas in a backlog, netted, until a job (here: at drawn
    points) or a graph's creation or drop: it then holds what the store held at that point, and no
    more dead versions than the store. Its snapshot may be taken after some of the deltas it then
    replays (:meth:`broker.workers.pool.QueryWorkers._place`): quads the backlog adds and removes
    again are then in the replica before, and must go."""
    store = RdfStore.memory()
    sent: list[tuple[bytes, bytes, tuple[str, ...], tuple[str, ...]]] = []
    states: list[tuple[list[Quad], set[object]]] = []
    seen: list[Quad] = []
    for added, removed, created, dropped in deltas:
        removed_quads = [seen[index % len(seen)] for index in removed] if seen else []
        store.apply(added, removed_quads, [NamedNode(g) for g in created], [NamedNode(g) for g in dropped])
        seen += added
        sent.append((store_nquads(added), store_nquads(removed_quads), tuple(created), tuple(dropped)))
        states.append((store.quads(), set(store.ox.named_graphs())))
    snapshot_after = data.draw(st.integers(0, len(deltas)))
    replica = RdfStore.memory()
    if snapshot_after:
        quads, graphs = states[snapshot_after - 1]
        replica.ox.extend(quads)
        for graph in graphs:
            replica.ox.add_graph(graph)  # type: ignore[arg-type]
    jobs = data.draw(st.sets(st.integers(0, len(deltas) - 1)))
    backlog = Backlog()
    for position, delta in enumerate(sent):
        backlog.receive(replica, *delta)
        if position in jobs or position == len(sent) - 1:
            backlog.apply(replica)
            if position + 1 >= snapshot_after:  # before, the replica replays what its snapshot holds
                assert replica.quads() == states[position][0]
                assert set(replica.ox.named_graphs()) == states[position][1]
    if not snapshot_after:
        assert replica.garbage <= store.garbage


def test_a_quad_the_backlog_adds_and_removes_again_leaves_its_named_graph_as_the_store_does() -> None:
    """Adding a quad to a named graph creates the graph, and removing the quad leaves it (empty,
    listed by `GRAPH ?g {}`): the store keeps it, and so must a replica whose backlog netted the
    two deltas away (the hypothesis test above found it once, 2026-12-07)."""
    graph = NamedNode("http://example.org/g1")
    quad = Quad(NamedNode("http://example.org/s"), NamedNode("http://example.org/p"), Literal("1"), graph)
    store = RdfStore.memory()
    store.apply([quad], [])
    store.apply([], [quad])
    replica = RdfStore.memory()
    backlog = Backlog()
    backlog.receive(replica, store_nquads([quad]), b"", (), ())
    backlog.receive(replica, b"", store_nquads([quad]), (), ())
    backlog.apply(replica)
    assert set(store.ox.named_graphs()) == {graph}
    assert set(replica.ox.named_graphs()) == {graph} and not replica.quads()


def store_nquads(quads: list[Quad]) -> bytes:
    """`quads` as the pool sends them to a replica."""
    return serialize(quads, format=RdfFormat.N_QUADS) if quads else b""


_TAGGED_ON_ROCKSDB = """
import os, signal, sys
from pyoxigraph import Literal, NamedNode, Quad
from broker.store import PROVISIONAL, ApplyMark, RdfStore, rdf_store
store = RdfStore.open(sys.argv[1])
if sys.argv[2] == "run":  # a delayed update's delta, then a request of several operations: killed in both
    store.apply([Quad(NamedNode("urn:ran"), NamedNode("urn:p"), Literal("1"))], [], mark=ApplyMark("id-1", print))
    store.apply([Quad(NamedNode("urn:half"), NamedNode("urn:p"), Literal("1"))], [], sequence=PROVISIONAL)
else:  # the restart, past CHECKPOINT_BYTES: the undo's record would flush RocksDB and empty the journal
    print(store.recovered_tags, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_on_rocksdb_a_recovered_tag_outlives_a_second_kill_before_its_owner_claims_it(tmp_path: Path) -> None:
    """On RocksDB: a delayed update's delta journalled with its tag, a request of several operations
    provisional after it, kill -9; the restart undoes the request (a settling record) with its journal
    past CHECKPOINT_BYTES, then a second kill -9 before the delayed updates claimed the tag. The third
    start must still recover the tag, or the update runs twice. Without the fix the settling record
    flushed RocksDB and emptied the journal that named the tag (the resident store's checkpoint
    already waited for its owner): the third start recovered nothing (recovered_tags == [])."""
    for step, limit in (("run", 16 << 20), ("restart", 1)):
        script = f"from broker.store import rdf_store; rdf_store.CHECKPOINT_BYTES = {limit}\n" + _TAGGED_ON_ROCKSDB
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path), step], capture_output=True, text=True)
        assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.strip() == "['id-1']", done.stdout
    store = RdfStore.open(tmp_path)
    assert store.recovered_tags == ["id-1"]
    assert store.quads() == {Quad(NamedNode("urn:ran"), NamedNode("urn:p"), Literal("1"))}  # the request undone


_PEAK_OF_A_LARGE_INSERT = """
import sys
from pyoxigraph import Literal, NamedNode, Quad
from broker.store import RdfStore
def status(key):
    with open("/proc/self/status") as file:
        return next(int(line.split()[1]) << 10 for line in file if line.startswith(key))
store = RdfStore.memory()
quads = [Quad(NamedNode(f"urn:s{n}"), NamedNode("urn:p"), Literal(f"value number {n}")) for n in range(100_000)]
with open("/proc/self/clear_refs", "w") as file:
    file.write("5")  # VmHWM from here
before = status("VmRSS")
store.apply(quads, [])
print(status("VmHWM") - before, status("VmRSS") - before)
"""


def test_a_large_insert_into_the_memory_store_takes_no_copy_of_its_quads_beside_them() -> None:
    """pyoxigraph's `Store.extend` copies every quad it is given into a vector of its own before it
    inserts them: 100,000 quads at once took the process's RSS 24 MB past what the store kept (250,000,
    a 23.7 MB INSERT DATA through a gateway: 51 MB, on top of its own quads at its peak). Given
    ONE_WRITE_QUADS at a time, the peak is what the store keeps. Measured in a process of its own
    (VmHWM, reset first): the copy is Rust's, which tracemalloc does not see."""
    done = subprocess.run([sys.executable, "-c", _PEAK_OF_A_LARGE_INSERT], capture_output=True, text=True, check=True)
    peak, kept = map(int, done.stdout.split())
    assert peak - kept < 8 << 20, f"RSS peaked {(peak - kept) / 1e6:.1f} MB above the {kept / 1e6:.1f} MB kept"


def test_a_damaged_journal_leaves_rocksdb_as_it_was(tmp_path: Path) -> None:
    """Refused for damage, a start has changed nothing (the message says so): on RocksDB, which
    keeps what a replay applied, the journal is read whole before a record of it is applied, so the
    records before the damage are not in RocksDB either (only RocksDB's, after a power cut)."""
    RdfStore.open(tmp_path).close()
    records = [encode_journal_entry([_quad(index)], [], [], []) for index in range(20)]
    damaged = records[11].replace(b"<", b" ", 1)
    (tmp_path / JOURNAL).write_bytes(b"".join([*records[:11], damaged, *records[12:]]))
    with pytest.raises(StoreFailed, match="is damaged at byte"):
        RdfStore.open(tmp_path)
    assert len(Store(str(tmp_path / "store"))) == 0


def test_a_checkpoint_of_rocksdb_is_told_the_quads_a_count_of_it_finds_until_the_store_changes(tmp_path: Path) -> None:
    """The count at open (the damage check) is handed to the query workers with their checkpoint
    (`RdfStore.backup`) instead of each counting its replica again, a full scan of the store: so it
    must be what that count finds. Through a replay after a kill too, whose records RocksDB may
    hold already (those since its last flush): here one adds a quad RocksDB has, one removes a quad
    it lacks, one adds a quad twice, one removes and adds the same quad, 11 in the end. Once the store has changed
    since, nothing is told (the worker counts)."""
    setup = RdfStore.open(tmp_path)
    setup.ox.extend(_quad(index) for index in range(10))
    setup.close()
    del setup  # RocksDB's lock goes with the last reference
    records = [
        encode_journal_entry([_quad(5), _quad(10)], [], [], []),  # 5 is there already
        encode_journal_entry([], [_quad(20), _quad(0)], [], []),  # 20 is not
        encode_journal_entry([_quad(11), _quad(11)], [], [], []),
        encode_journal_entry([_quad(1)], [_quad(1), _quad(2)], [], []),
        encode_journal_entry([_quad(12)], [], [], []),
    ]
    (tmp_path / JOURNAL).write_bytes(b"".join(records))
    reopened = RdfStore.open(tmp_path)
    try:
        told = reopened.backup(str(tmp_path / "checkpoint"))
        assert told == len(Store(str(tmp_path / "checkpoint"))) == len(reopened.quads()) == 11
        reopened.apply([_quad(30)], [])
        assert reopened.backup(str(tmp_path / "later")) is None
    finally:
        reopened.close()
