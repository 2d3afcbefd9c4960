"""W3C SPARQL 1.1 Update evaluation tests: the final store and the delta the engine reports.

Subscriptions are notified from the returned UpdateResult, not from the store, so besides the W3C
expected dataset every test also checks that the delta is exactly what the store really did.
"""

from __future__ import annotations

import re

import pytest
from pyoxigraph import CanonicalizationAlgorithm, Dataset, DefaultGraph, NamedNode, Quad, RdfFormat, Store

from broker.core.engine import Engine
from broker.errors import SepaError

from .manifest import EVALUATION, EVALUATION_FOLDERS, DatasetSpec, ManifestEntry, entries

CASES = [pytest.param(e, id=e.id) for e in entries((EVALUATION,), EVALUATION_FOLDERS)]
_LOAD = re.compile(r"\bLOAD\b", re.IGNORECASE)


def load(store: Store, spec: DatasetSpec) -> None:
    """Load each file into its graph; files are parsed separately, so blank nodes are per file."""
    files = [(DefaultGraph(), p) for p in spec.default] + [(NamedNode(iri), p) for iri, p in spec.named]
    for graph, path in files:
        store.load(path=path, format=RdfFormat.TURTLE, base_iri=path.as_uri(), to_graph=graph)


def quads(store: Store) -> set[Quad]:
    """The store's quads, blank nodes as stored (so before/after differences are exact)."""
    return set(store.quads_for_pattern(None, None, None, None))


def canonical(dataset: set[Quad]) -> set[Quad]:
    """Blank-node canonical form of a whole dataset: isomorphic datasets become equal sets.

    Canonicalizing the dataset (not graph by graph) respects blank nodes shared between graphs.
    Empty named graphs are not compared: the W3C results do not distinguish them from absent ones.
    """
    ds = Dataset(dataset)
    ds.canonicalize(CanonicalizationAlgorithm.UNSTABLE)
    return set(ds)


def expected_quads(spec: DatasetSpec) -> set[Quad]:
    """The W3C expected dataset, loaded the same way as the initial data."""
    store = Store()
    load(store, spec)
    return quads(store)


@pytest.mark.parametrize("case", CASES)
def test_update_evaluation(case: ManifestEntry) -> None:
    """The request turns the initial dataset into the expected one, and the delta says exactly how."""
    request = case.request.read_text(encoding="utf-8")
    # LOAD is refused by default; the LOAD SILENT tests are about SILENT, so let them really run.
    engine = Engine(allow_load=bool(_LOAD.search(request)))
    load(engine.store.ox, case.data)
    before = quads(engine.store.ox)

    if case.expect_error:
        with pytest.raises(SepaError):
            engine.update(request, base_iri=case.request.as_uri())
        assert quads(engine.store.ox) == before, "a failed update changed the store"
        return

    result = engine.update(request, base_iri=case.request.as_uri())
    after = quads(engine.store.ox)

    assert canonical(after) == canonical(expected_quads(case.expected)), "final store != W3C result"
    assert set(result.added) == after - before, "UpdateResult.added != quads really added"
    assert set(result.removed) == before - after, "UpdateResult.removed != quads really removed"
