"""Compaction drops pyoxigraph's dead versions and nothing else, while updates go on."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyoxigraph import BlankNode, DefaultGraph, Literal, NamedNode, Quad, RdfFormat, serialize

import broker.store.rdf_store as store_module
from broker.compaction import HOT_MIN_S, HOT_REMOVALS, REPLICA_DEAD_PER_LIVE, Compactor
from broker.store import RdfStore
from broker.store.delta import DEAD_CHARS
from tests.support.dump_watch import DumpWatch

EX = "http://example.org/"
GRAPHS = [DefaultGraph(), NamedNode(f"{EX}g1"), NamedNode(f"{EX}g2")]


def _quad(value: int, graph: int) -> Quad:
    subject = BlankNode(f"b{value % 3}") if value % 5 == 0 else NamedNode(f"{EX}s{value % 7}")
    return Quad(subject, NamedNode(f"{EX}p"), Literal(str(value)), GRAPHS[graph])


_changes = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "drop"]), st.lists(st.integers(0, 40), max_size=8), st.integers(0, 2)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=_changes, during=_changes, empty_graph=st.booleans())
def test_a_compaction_under_concurrent_updates_keeps_exactly_the_live_quads(
    monkeypatch, before, during, empty_graph
) -> None:
    """The update path keeps applying deltas while an in-memory compaction copies and swaps: the
    store ends with exactly what the deltas left (blank node labels and empty named graphs too)."""
    store, expected, graphs = RdfStore.memory(), set(), set()
    removed = [0]

    def apply(changes) -> None:
        for kind, values, graph in changes:
            quads = {_quad(value, graph) for value in values}
            if kind == "add":
                store.apply(quads - expected, [])
                expected.update(quads)
                if quads and graph:
                    graphs.add(GRAPHS[graph])
            elif kind == "remove" or not graph:
                store.apply([], quads & expected)
                removed[0] += len(quads & expected)
                expected.difference_update(quads)
            else:  # a DROP GRAPH: its quads removed, then the graph
                dropped = {quad for quad in expected if quad.graph_name == GRAPHS[graph]}
                store.apply([], dropped, [], [GRAPHS[graph]])
                removed[0] += len(dropped)
                expected.difference_update(dropped)
                graphs.discard(GRAPHS[graph])

    apply(before)
    if empty_graph:
        store.apply([], [], [NamedNode(f"{EX}empty")])
    half = len(during) // 2

    def copy_live(source, target) -> int:  # deltas land before the snapshot and during the copy
        apply(during[:half])
        copied = real_copy_live(source, target)
        apply(during[half:])
        return copied

    real_copy_live = store_module.copy_live
    monkeypatch.setattr(store_module, "copy_live", copy_live)
    removed[0] = 0
    store.compact()
    assert store.quads() == expected
    assert set(store.ox.named_graphs()) == graphs | ({NamedNode(f"{EX}empty")} if empty_graph else set())
    assert store.garbage <= removed[0]  # what was removed before the compaction is gone


def test_in_memory_the_compactor_waits_for_two_dead_quads_a_live_one_and_counts_them() -> None:
    """Due at DEAD_PER_LIVE (2) removed quads per live one, not at one: copying the live quads
    costs ~9 us each, four times a removal, and three processes (the gateway, two replicas) did it
    every ~7 s at 1,000 readings/s with retention."""
    store = RdfStore.memory()
    compactor = Compactor(store, min_garbage=100)
    quads = [_quad(value, 1) for value in range(300)]
    store.apply(quads, [])
    store.apply([], quads[:199])  # 199 dead, 101 alive: more dead than alive, not twice as many
    assert not compactor.maybe_compact() and store.garbage == 199
    assert compactor.threshold == 202  # counted again at twice the live quads
    fresh = [_quad(value, 2) for value in range(3)]
    store.apply(fresh, quads[199:202])  # values replaced: 202 dead, 101 alive
    assert compactor.maybe_compact()
    assert store.garbage == 0 and store.quads() == set(quads[202:]) | set(fresh)
    assert compactor.stats["compactions"] == 1 and compactor.stats["compacted_quads"] == 202


def test_a_replica_compacts_at_its_own_ratio_not_at_the_gateways_moment() -> None:
    """A query worker's replica follows the gateway's deltas, so at the same ratio it compacted at
    the same moment as the gateway, and the three copies and frees took both cores at once (the
    NL spikes of bench dashboard): at REPLICA_DEAD_PER_LIVE (2.5) it is not due at 2."""
    quads = [_quad(value, 1) for value in range(400)]
    gateway, replica = RdfStore.memory(), RdfStore.memory()
    for store in (gateway, replica):
        store.apply(quads, [])
        store.apply([], quads[:270])  # 270 dead, 130 alive
    assert Compactor(gateway, min_garbage=100).maybe_compact()
    compactor = Compactor(replica, min_garbage=100, dead_per_live=REPLICA_DEAD_PER_LIVE)
    assert not compactor.maybe_compact() and compactor.threshold == 325
    replica.apply([], quads[270:330])  # 330 dead, 70 alive
    assert compactor.maybe_compact()
    assert replica.garbage == 0 and replica.quads() == set(quads[330:])


def test_on_disk_the_compactor_compacts_after_min_garbage_removals_and_counts_them(tmp_path: Path) -> None:
    store = RdfStore.open(tmp_path / "data")
    compactor = Compactor(store, min_garbage=100)
    quads = [_quad(value, 1) for value in range(1, 200) if value % 5]
    store.apply(quads, [])
    store.apply([], quads[:99])
    assert not compactor.maybe_compact() and store.garbage == 99
    store.apply([], quads[99:100])
    assert compactor.maybe_compact()
    assert store.garbage == 0 and store.quads() == set(quads[100:])
    assert compactor.stats["compactions"] == 1 and compactor.stats["compacted_quads"] == 100
    store.close()


def test_on_disk_the_next_compaction_waits_in_proportion_to_the_last_one(tmp_path: Path) -> None:
    store = RdfStore.open(tmp_path / "data")
    compactor = Compactor(store, min_garbage=1, duty=0.0001)
    quads = [_quad(value, 0) for value in range(1, 50) if value % 5]
    store.apply(quads, [])
    store.apply([], quads)
    assert compactor.maybe_compact()
    store.apply(quads, [])
    store.apply([], quads)
    assert not compactor.maybe_compact()  # its cost / 0.01 % is seconds away
    store.close()


def test_in_memory_compaction_is_paced_by_removals_alone() -> None:
    """As many dead quads as live ones: due, however long the last compaction took (pacing by
    duration ran away under steady removals, each wait letting more dead quads pile up)."""
    store = RdfStore.memory()
    compactor = Compactor(store, min_garbage=1, duty=0.0001)
    live = [_quad(value, 1) for value in range(1, 30) if value % 5]
    store.apply(live, [])
    for _ in range(3):
        dead = [_quad(value, 2) for value in range(1, 60) if value % 5]
        store.apply(dead, [])
        store.apply([], dead)
        assert compactor.maybe_compact()
    assert store.quads() == set(live)


def test_the_live_count_is_every_quad_of_every_graph() -> None:
    store = RdfStore.memory()
    quads = [_quad(value, graph) for value in range(1, 40) for graph in range(3)]
    store.apply(quads, [])
    store.apply([], quads[:10], [NamedNode(f"{EX}empty")])
    assert store.live_quads() == len(store.ox) == len(quads) - 10


def test_a_compactor_told_how_many_quads_a_replica_holds_does_not_count_them(monkeypatch) -> None:
    """A worker's replica is seeded with a known number of quads: its compactor waits for that
    many removals before it counts or copies anything (counting 334k quads stopped a BOOSTER worker
    130 ms at its first check)."""
    store = RdfStore.memory()
    quads = [_quad(value, 1) for value in range(3000)]
    store.apply(quads, [])
    counted: list[int] = []
    live_quads = store.live_quads
    monkeypatch.setattr(store, "live_quads", lambda: counted.append(1) or live_quads())
    compactor = Compactor(store, live=len(store.ox))
    store.apply([], quads[:1500])
    assert not compactor.maybe_compact() and not counted  # 1,500 dead of 3,000: not yet
    store.apply([], quads[1500:])
    assert compactor.maybe_compact() and len(store.ox) == 0


def test_a_compaction_replays_the_deltas_of_its_copy_mostly_without_the_lock(monkeypatch) -> None:
    """The update path waits for the store's lock while a compaction replays under it: only the
    last few deltas may be replayed there (50 came during the copy; all 50 were, 17-62 ms of the
    update path's time in a microbenchmark of 150,000 live quads and a 1.5 s copy)."""
    store = RdfStore.memory()
    store.apply([_quad(n, 1) for n in range(200)], [])
    real_copy_live, real_replay = store_module.copy_live, store_module.replay
    under_lock = []

    def copy_live(source, target) -> int:
        copied = real_copy_live(source, target)
        for n in range(50):
            store.apply([Quad(NamedNode(f"{EX}new{n}"), NamedNode(f"{EX}p"), Literal(str(n)))], [])
        return copied

    def replay(ox, delta):
        if store.lock.locked():
            under_lock.append(delta)
        return real_replay(ox, delta)

    monkeypatch.setattr(store_module, "copy_live", copy_live)
    monkeypatch.setattr(store_module, "replay", replay)
    store.compact()
    assert len(under_lock) <= 4
    assert len(store.ox) == len({_quad(n, 1) for n in range(200)}) + 50


def test_a_replica_compacting_applies_and_replays_n_quads_deltas_as_they_came(monkeypatch) -> None:
    """A replica's deltas (N-Quads, :meth:`RdfStore.apply_nquads`) during a compaction's copy: loaded
    by pyoxigraph and kept as N-Quads for the copy (not parsed into Python quads twice), the ones
    with blank nodes the slow way; the compacted store holds what a store without compaction holds."""

    def nquads(quads) -> bytes:
        return serialize(list(quads), format=RdfFormat.N_QUADS) if quads else b""

    deltas = [
        (nquads([_quad(n, 1) for n in range(10, 20)]), nquads([_quad(n, 1) for n in range(5)]), ("<http://e/g>",), ()),
        (nquads([_quad(0, 2), _quad(6, 2)]), b"", (), ()),
        (b"", nquads([_quad(12, 1)]), (), ("<http://e/g>",)),
        (nquads([_quad(21, 0)]), nquads([_quad(0, 2)]), (), ()),
    ]
    reference, store = RdfStore.memory(), RdfStore.memory()
    for each in (reference, store):
        each.apply([_quad(n, 1) for n in range(10)], [])
    for delta in deltas:
        reference.apply_nquads(*delta)
    real_copy_live = store_module.copy_live
    as_nquads = []
    real_nquads = store_module.Recording.nquads

    def copy_live(source, target) -> int:
        copied = real_copy_live(source, target)
        for delta in deltas:
            store.apply_nquads(*delta)
        return copied

    def record(self, *delta) -> None:
        as_nquads.append(delta)
        real_nquads(self, *delta)

    monkeypatch.setattr(store_module, "copy_live", copy_live)
    monkeypatch.setattr(store_module.Recording, "nquads", record)
    store.compact()
    assert store.quads() == reference.quads()
    assert set(store.ox.named_graphs()) == set(reference.ox.named_graphs())
    # the two whose added quads hold no blank node (_quad makes one of every fifth value)
    assert [delta[0] for delta in as_nquads] == [deltas[2][0], deltas[3][0]]


def _replaced(store: RdfStore, subject: NamedNode, times: int, first: int = 0) -> None:
    """The value of `subject` replaced `times` times, one delta each (an actuator, a latest value)."""
    predicate = NamedNode(f"{EX}value")
    for value in range(first, first + times):
        store.apply([Quad(subject, predicate, Literal(value + 1))], [Quad(subject, predicate, Literal(value))])


def _large_store() -> RdfStore:
    store = RdfStore.memory()
    store.apply([Quad(NamedNode(f"{EX}s{n}"), NamedNode(f"{EX}p"), Literal(n)) for n in range(20_000)], [])
    store.apply([Quad(NamedNode(f"{EX}hot"), NamedNode(f"{EX}value"), Literal(0))], [])
    return store


def test_in_memory_one_key_replaced_again_and_again_makes_a_compaction_due_in_a_large_store() -> None:
    """20,000 live quads wait for 40,000 removals; one subject's value replaced 1,500 times is due
    at HOT_REMOVALS (1,000) once HOT_MIN_S passed, then not again until HOT_SPACING times the
    compaction's duration, at least HOT_MIN_S, passed. Before: due at 40,000, and every lookup of
    the hot key read past its dead versions until then."""
    store = _large_store()
    compactor = Compactor(store, live=len(store.ox))
    hot = NamedNode(f"{EX}hot")
    _replaced(store, hot, 1_500)
    assert store.hottest() >= 1_500
    assert not compactor.maybe_compact()  # HOT_MIN_S after the start not passed yet
    compactor._hot_after = 0.0  # noqa: SLF001 - as if HOT_MIN_S had passed
    assert compactor.maybe_compact()
    assert compactor.stats["hot_compactions"] == 1 and store.garbage == 0 and store.hottest() == 0
    assert Quad(hot, NamedNode(f"{EX}value"), Literal(1_500)) in store.ox and len(store.ox) == 20_001
    assert compactor._hot_after - time.monotonic() > HOT_MIN_S - 1  # noqa: SLF001 - spaced from this one
    _replaced(store, hot, 1_500, first=1_500)
    assert not compactor.maybe_compact()
    compactor._hot_after = 0.0  # noqa: SLF001
    assert compactor.maybe_compact() and compactor.stats["hot_compactions"] == 2


def test_in_memory_as_many_removals_spread_over_many_keys_wait_for_the_count_of_all() -> None:
    """Retention's deletes (each observation's quads once) are no hot key: 1,500 removals of 1,500
    subjects leave the compaction for the count of all removals."""
    store = _large_store()
    compactor = Compactor(store, live=len(store.ox))
    compactor._hot_after = 0.0  # noqa: SLF001 - as if HOT_MIN_S had passed
    store.apply([], [Quad(NamedNode(f"{EX}s{n}"), NamedNode(f"{EX}p"), Literal(n)) for n in range(1_500)])
    assert store.garbage == 1_500 and store.hottest() < HOT_REMOVALS
    assert not compactor.maybe_compact() and compactor.stats["compactions"] == 0


def test_a_replica_counts_the_removals_of_its_n_quads_deltas_by_subject_too() -> None:
    store = _large_store()
    predicate = NamedNode(f"{EX}value")
    hot = NamedNode(f"{EX}hot")
    for value in range(1_200):
        added = serialize([Quad(hot, predicate, Literal(value + 1))], format=RdfFormat.N_QUADS)
        removed = serialize([Quad(hot, predicate, Literal(value))], format=RdfFormat.N_QUADS)
        store.apply_nquads(added, removed, (), ())
    assert store.garbage == 1_200 and store.hottest() >= 1_200


def test_a_dead_long_literal_weighs_its_length_and_makes_a_compaction_due() -> None:
    """Counted by quads alone, a client inserting and deleting a 900,000-character literal 300
    times took a 588-quad store's gateway from 82 to 355 MB, and each replica to 448 MB, before a
    compaction came: a dead version keeps its terms. It counts once more for each DEAD_CHARS
    characters of its literal, so one such removal makes a compaction due, which frees it."""
    store = RdfStore.memory()
    live = [Quad(NamedNode(f"{EX}s{index}"), NamedNode(f"{EX}p"), Literal(str(index))) for index in range(588)]
    store.apply(live, [])
    compactor = Compactor(store, live=len(live))
    big = Quad(NamedNode(f"{EX}big"), NamedNode(f"{EX}p"), Literal("x" * 900_000), DefaultGraph())
    store.apply([big], [])
    store.apply([], [big])
    assert store.garbage == 1 + 900_000 // DEAD_CHARS
    assert compactor.maybe_compact()
    assert store.garbage == 0 and store.quads() == set(live)


def test_a_compaction_copies_through_a_memory_file_not_bytes_made_under_the_gil() -> None:
    """pyoxigraph makes a dump's bytes under the GIL, and a compaction's dump runs at niceness 19:
    on a loaded machine that thread, preempted, held every other thread of the gateway (the event
    loop too) 25-216 ms for 130,000 live quads. The copy goes through a memfd written without the
    GIL and read back by the kernel (:func:`broker.store.dump_nquads`), and is whole."""
    store = RdfStore.memory()
    quads = [_quad(n, n % 3) for n in range(300)]
    store.apply(quads, [])
    store.apply([], quads[:100])
    watch = DumpWatch(store.ox)
    store.ox = watch  # type: ignore[assignment]
    assert store.compact() == len(set(quads[100:]))
    assert watch.outputs and all(isinstance(output, str) for output in watch.outputs)
    assert store.quads() == set(quads[100:])
