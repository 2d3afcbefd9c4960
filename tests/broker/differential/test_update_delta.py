"""Differential property test of the update processor, with pyoxigraph itself as the oracle.

Why: every subscription sees only the delta the update processor reports (ARCHITECTURE.md
principle 2), so a wrong delta is a wrong notification for everyone. pyoxigraph's own
``Store.update`` is a complete SPARQL 1.1 Update implementation over the very same store type, so
running the same request text on an independent store and comparing the final quads checks both
the semantics of every update form and the delta, without writing a second SPARQL engine here.

Random requests that insert blank nodes are excluded (``update_requests(bnodes=False)``): fresh
blank node labels would make the two stores differ for no fault. The initial data may contain
blank nodes: the oracle is loaded with the engine's quads, so both sides share the labels.

For each request of a short random sequence:
- both succeed or both fail; a refusal is a client error (4xx), never an internal one;
- after a failure the engine's store is exactly as before (the oracle is reset to its copy, since
  the point is the engine's atomicity, not pyoxigraph's);
- after a success both stores hold the same quads and the same named graphs (graph existence
  decides whether a later CREATE / DROP / MOVE fails, so it is part of the state);
- ``result.added == after - before`` and ``result.removed == before - after`` on the engine's own
  store (net change as sets: a quad deleted and re-inserted is in neither).
"""

from __future__ import annotations

import pytest
from hypothesis import given, note
from pyoxigraph import Quad, Store

from broker.core.engine import Engine
from broker.errors import SepaError
from tests.broker.differential.strategies import Scenario, budget, scenarios

MODES = ("incremental", "naive")


def _quads(store: Store) -> frozenset[Quad]:
    return frozenset(store)


def _show(quads: frozenset[Quad]) -> list[str]:
    return sorted(map(str, quads))


@pytest.mark.parametrize("mode", MODES)
@budget(400)
@given(scenario=scenarios(max_updates=4, bnodes=False))
def test_update_matches_pyoxigraph(mode: str, scenario: Scenario) -> None:
    """Same request on the engine and on a plain pyoxigraph store: same outcome, exact delta."""
    engine = Engine(mode=mode)
    engine.update(scenario.dataset)
    oracle = Store()
    oracle.extend(engine.store.ox)
    assert all(request.deterministic for request in scenario.updates)
    for request in scenario.updates:
        note(f"update: {request}")
        before = _quads(engine.store.ox)
        assert before == _quads(oracle), "stores diverged before the update"
        oracle_error: Exception | None = None
        try:
            oracle.update(request.oracle_sparql)
        except (SyntaxError, OSError, RuntimeError, ValueError) as error:
            oracle_error = error
        try:
            result = engine.update(
                request.sparql,
                using_graph_uri=request.using_graph_uri,
                using_named_graph_uri=request.using_named_graph_uri,
            )
        except SepaError as error:
            assert oracle_error is not None, f"engine refused ({type(error).__name__}: {error}); pyoxigraph accepted"
            assert error.status_code < 500, f"refusal reported as internal error: {error!r}"
            assert _quads(engine.store.ox) == before, "a refused update changed the engine's store"
            # pyoxigraph is atomic too, but reset anyway: this test is about the engine.
            oracle = Store()
            oracle.extend(engine.store.ox)
            for graph in engine.store.ox.named_graphs():
                oracle.add_graph(graph)
            continue
        assert oracle_error is None, f"engine accepted what pyoxigraph refused: {oracle_error}"
        after = _quads(engine.store.ox)
        expected = _quads(oracle)
        assert after == expected, (
            f"final quads differ\n  missing: {_show(expected - after)}\n  extra:   {_show(after - expected)}"
        )
        engine_graphs = set(engine.store.ox.named_graphs())
        oracle_graphs = set(oracle.named_graphs())
        assert engine_graphs == oracle_graphs, (
            f"named graphs differ: engine {sorted(map(str, engine_graphs))}, "
            f"pyoxigraph {sorted(map(str, oracle_graphs))}"
        )
        assert result.added == after - before, f"added {_show(result.added)} != store diff {_show(after - before)}"
        assert result.removed == before - after, (
            f"removed {_show(result.removed)} != store diff {_show(before - after)}"
        )
