"""A BOOSTER worker's answers for a bounded group stop at the limit (broker.workers.booster,
Booster._bounded): the engine learns of the solutions only from the reply, and a product of a graph
with itself made one of 980,000 solutions from a 700-triple update, 892 MB once unpickled."""

from __future__ import annotations

import pytest
from pyoxigraph import NamedNode, Quad

from broker.api import Engine, RdfStore
from broker.workers.booster import Booster
from broker.workers.codec import OVER, encode_all

EX = "http://example.org/"
G = NamedNode(f"{EX}g")
PRODUCT = f"SELECT * WHERE {{ GRAPH <{EX}g> {{ ?s <{EX}p> ?o }} GRAPH <{EX}g> {{ ?a <{EX}p> ?c }} }}"


def quads(count: int) -> list[Quad]:
    return [Quad(NamedNode(f"{EX}s{i}"), NamedNode(f"{EX}p"), NamedNode(f"{EX}o{i}"), G) for i in range(count)]


@pytest.mark.parametrize("one_spu", [True, False], ids=["hits-of-one-spu", "hits-of-any-spu"])
def test_an_spu_past_the_limit_is_answered_over_and_its_hits_are_not_evaluated_any_more(one_spu: bool) -> None:
    """Hits of one SPU carry its parameter values; hits that may concern any SPU of the group do
    not, and their solutions are counted by the values they carry."""
    engine = Engine()
    engine.subscribe(PRODUCT, lambda _: None)
    (group,) = engine.spus.groups.values()
    (spu,) = group.spus.values()
    store = RdfStore.memory()
    added = quads(30)  # each added triple: 30 solutions of the other pattern
    store.ox.extend(added)
    booster = Booster(store, len(store.ox))
    booster.add_group(0, group.arguments)
    booster.want(0, tuple(encode_all(branch) for branch in spu.params), 1)
    params = encode_all(spu.params[0])
    hits = [(index, params if one_spu else None) for index in range(30)]
    made: list[object] = []
    solutions = booster.groups[0].solutions

    def counted(*args: object, **kwargs: object) -> object:
        for mu in solutions(*args, **kwargs):  # type: ignore[arg-type]
            made.append(mu)
            yield mu

    booster.groups[0].solutions = counted  # type: ignore[method-assign]
    (bounded,) = booster.solve([(0, 0, 0, hits, 100, True)], added)
    assert [len(answer) for answer in bounded[:3]] == [30, 30, 30]  # type: ignore[arg-type]
    assert bounded[3:] == [OVER] * 27  # 4 x 30 > 100: the fourth on
    assert len(made) == 4 * 30
    (unbounded,) = booster.solve([(0, 0, 0, hits, None, False)], added)
    assert OVER not in unbounded and sum(map(len, unbounded)) == 900  # type: ignore[arg-type]
