"""Applying a delta to a pyoxigraph store: as one SPARQL update where it can be written in one, in
pieces when it is large, quad by quad otherwise, and what its removals weigh as dead versions."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from pyoxigraph import BlankNode, DefaultGraph, Literal, NamedNode, Quad, RdfFormat, Store, parse

# quads of a delta written to RocksDB in one transaction at most: pyoxigraph holds a transaction's
# writes in memory (200,000 removals as one update: RSS +94 MB, 2.2 s; quad by quad 2.5 s)
ONE_WRITE_QUADS = 20_000
# in memory, the quads removed since the last compaction are also counted by subject, in this many
# buckets (a hash of the subject's): broker.compaction's rule for a key replaced again and again
HOT_BUCKETS = 4096
HOT_MASK = HOT_BUCKETS - 1
# a removed quad whose object is a literal longer than this counts once more for each this many
# characters in RdfStore.garbage (see dead_weight)
DEAD_CHARS = 256


def delta_update(
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


def pieces(
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


def updated(ox: Store, update: str) -> bool:
    """Run a delta's update; False, having written nothing, if a literal of it does not parse back."""
    try:
        ox.update(update)
    except SyntaxError:
        return False
    return True


def dead_weight(quad: Quad) -> int:
    """What a removed quad counts in RdfStore.garbage: 1, and once more for each DEAD_CHARS
    characters of a long literal object. Why: a dead version keeps its terms until a compaction,
    and counted by quads alone, a client inserting and deleting a 900,000-character literal 300
    times took a 588-quad store's gateway from 82 to 355 MB, and each query worker's replica to 448
    MB, before a compaction came. Only the object is weighed: long terms are literals, and this
    runs for every removal (~0.5 us, a reading's delta removes ~4 quads of its ~370 us)."""
    term = quad.object
    return 1 + len(term.value) // DEAD_CHARS if type(term) is Literal else 1


def growth(ox: Store, added: Iterable[Quad], removed: Iterable[Quad]) -> int:
    """How many quads `ox` holds more once `removed` are removed and then `added` added (fewer: a
    negative number), looked up before the delta is applied: a quad it holds already adds none, one
    it lacks removes none. Why: a journal replayed on RocksDB holds records RocksDB may already have
    (those since the last flush), and its count at open (:func:`broker.store.rdf_store._rocksdb`)
    is kept true through the replay by this, a lookup a quad, where counting again after it is a
    full scan of the store (0.97 s of CPU for 2.4 million quads). The named graphs a delta drops
    are empty by then (their quads are among `removed`)."""
    gone = {quad for quad in removed if quad in ox}
    return sum(1 for quad in set(added) if quad in gone or quad not in ox) - len(gone)


def apply_quads(
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
            count += dead_weight(quad)
    else:
        for quad in removed:
            ox.remove(quad)
            hot[hash(quad.subject) & HOT_MASK] += 1
            count += dead_weight(quad)
    for graph in dropped:
        ox.remove_graph(graph)
    _extend(ox, added)
    for graph in created:
        ox.add_graph(graph)
    return count


def _extend(ox: Store, added: Iterable[Quad]) -> None:
    """Add `added`: at most ONE_WRITE_QUADS at a time when there are more.

    Why: `Store.extend` first copies every quad it is given into a vector of its own, terms and all,
    then inserts them: 250,000 quads at once (a 23.7 MB INSERT DATA) took the process's RSS 51 MB
    past what the store kept (+252 MB at the peak for +195 MB; in slices +201 MB, measured
    2026-12-07), on top of the update's own quads at the peak of a large update. In memory a delta
    was never applied in one transaction (each removal is one), so slices change nothing a reader
    could see of a delta that it could not before."""
    if not isinstance(added, (list, frozenset, set, tuple)) or len(added) <= ONE_WRITE_QUADS:
        ox.extend(added)
        return
    quads = iter(added)
    while piece := list(itertools.islice(quads, ONE_WRITE_QUADS)):
        ox.extend(piece)


def load_nquads(
    ox: Store,
    added: bytes,
    removed: bytes,
    created: list[NamedNode],
    dropped: list[NamedNode],
    hot: list[int] | None = None,
    churned: Iterable[Quad] = (),
) -> int:
    """Apply a delta that came as N-Quads, the added quads loaded by pyoxigraph (no ``_:`` in
    them: `Store.load` renames blank nodes); the number removed (and by subject in `hot`).
    `churned`: quads a replica's backlog added and removed again that `ox` holds (:func:`churn`)."""
    count = 0
    if removed:
        count = apply_quads(ox, (), parse(removed, format=RdfFormat.N_QUADS), (), (), hot)
    if churned:
        count += apply_quads(ox, (), churned, (), (), hot)
    for graph in dropped:
        ox.remove_graph(graph)
    if added:
        ox.load(added, format=RdfFormat.N_QUADS)
    for graph in created:
        ox.add_graph(graph)
    return count


def churn(ox: Store, nquads: bytes) -> tuple[list[Quad], list[NamedNode | BlankNode]]:
    """The quads of `nquads` that `ox` holds, and the named graphs of them all that it does not.

    Why: a replica's netted backlog (:class:`broker.workers.backlog.Backlog`) has quads that its
    deltas added and removed again; the store may hold one only when a delta was replayed (see
    :meth:`broker.workers.pool.QueryWorkers._place`), and looking one up costs less than removing
    it (pyoxigraph 0.5.13, 200,000 quads: 1.1 us against 1.2-2.3 us absent, 2.0-2.5 us present,
    measured 2026-12-07), and a quad never stored is no dead version to count. The graphs: adding
    a quad to a named graph creates the graph, and removing the quad leaves it (an empty graph
    that `GRAPH ?g {}` lists): the deltas replayed in order leave it, so the netted ones must too
    (a hypothesis example found the replica without it, 2026-12-07)."""
    quads = list(parse(nquads, format=RdfFormat.N_QUADS))
    graphs = {quad.graph_name for quad in quads} - {DefaultGraph()}
    missing = [graph for graph in graphs if not ox.contains_named_graph(graph)]  # type: ignore[arg-type]
    return [quad for quad in quads if quad in ox], missing  # type: ignore[return-value]
