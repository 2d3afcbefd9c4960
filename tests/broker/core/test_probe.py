"""A subscription's probe result spares the update thread its evaluation, only while the store
holds what the probe saw (`Engine.probe`, `ReevalSpu.load`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyoxigraph import Literal, NamedNode, Store

from broker.core.engine import Engine
from broker.core.notification import Notification
from broker.core.spu import Probed
from broker.store import RdfStore
from broker.workers.codec import rows_from_tsv
from broker.workers.pool import QueryWorkers

# OPTIONAL: re-evaluated, so its first result is the one the probe can give
QUERY = "SELECT ?s ?o WHERE {{ ?s <urn:p> ?o OPTIONAL {{ ?s <urn:q> ?x }} FILTER(?s != <urn:x:{}>) }}"
FAKE = b"?s\t?o\n<urn:fake>\t2\n"


@pytest.fixture
def engine() -> Iterator[Engine]:
    store = RdfStore(Store())
    workers = QueryWorkers(store, count=1, time_limit_s=30.0)
    workers.start()
    try:
        yield Engine(store, workers=workers)
    finally:
        workers.close()


def first_rows(engine: Engine, sparql: str, probed: Probed | None) -> tuple:
    notes: list[Notification] = []
    engine.subscribe(sparql, notes.append, probed=probed)
    return tuple(notes[0].added)


def test_the_probe_result_is_taken_while_the_store_is_unchanged(engine: Engine) -> None:
    engine.update("INSERT DATA { <urn:a> <urn:p> 1 }")
    probed = engine.probe(QUERY.format(0))
    assert probed is not None and probed.changes == engine.store.changes and probed.text is not None
    assert rows_from_tsv(probed.text) == ((NamedNode("urn:a"), Literal(1)),)
    assert first_rows(engine, QUERY.format(0), probed) == ((NamedNode("urn:a"), Literal(1)),)
    # taken, not evaluated again: a result the store does not hold shows it
    fake = Probed(engine.store.changes, FAKE)
    assert first_rows(engine, QUERY.format(1), fake) == ((NamedNode("urn:fake"), Literal(2)),)


def test_a_probe_result_the_store_has_moved_past_is_not_taken(engine: Engine) -> None:
    engine.update("INSERT DATA { <urn:a> <urn:p> 1 }")
    stale = Probed(engine.store.changes, FAKE)
    engine.update("INSERT DATA { <urn:b> <urn:p> 3 }")
    rows = first_rows(engine, QUERY.format(2), stale)
    assert sorted(str(row[0]) for row in rows) == ["<urn:a>", "<urn:b>"]


def test_a_large_result_is_not_kept(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    engine.update("INSERT DATA { " + " ".join(f"<urn:s{i}> <urn:p> {i} ." for i in range(100)) + " }")
    monkeypatch.setattr("broker.core.engine.PROBE_KEEP_BYTES", 200)
    large = engine.probe(QUERY.format(3))
    # counted past the text kept: one more when the last write crossed the limit (see QueryProcessor.tsv)
    assert large is not None and large.text is None and large.rows in (100, 101)
    monkeypatch.setattr("broker.core.engine.PROBE_KEEP_BYTES", 1 << 20)
    kept = engine.probe(QUERY.format(3))
    assert kept is not None and kept.text is not None and kept.rows == 100
    asked = engine.probe("ASK { ?s ?p ?o }")
    assert asked is not None and asked.text is None
