"""Evaluation of basic graph patterns by index lookups, without the SPARQL parser.

For the IoT common case (one or a few triple patterns, mostly bound) a nested-loop join over
`quads_for_pattern` costs a few microseconds where a SPARQL query costs tens: the parse alone
dominates. Used for simple WHERE clauses of updates and by incremental SPUs.

A join order is planned once per (patterns, variables bound on entry) and cached: most bound
pattern first, so the first lookup is the most selective.

Semantics are SPARQL's: BGP matching by RDF term equality, GRAPH ?g ranging over named graphs
only, and one solution per distinct mapping of all variables.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache

from pyoxigraph import BlankNode, DefaultGraph, Literal, NamedNode, Store

from broker.sparql.patterns import QuadPattern, Var

Binding = dict[str, object]

DEFAULT_GRAPH = DefaultGraph()
CONSTANT, BOUND, FREE = 0, 1, 2


class Dataset:
    """Where default-graph patterns and GRAPH patterns look.

    default: the single graph that is the default graph (None: the store's default graph).
    named: the named graphs GRAPH may range over (None: all of them).
    """

    __slots__ = ("default", "named")

    def __init__(
        self, default: NamedNode | DefaultGraph | None = None, named: frozenset[NamedNode] | None = None
    ) -> None:
        self.default = DEFAULT_GRAPH if default is None else default
        self.named = named


STORE_DATASET = Dataset()

# A step: for each of subject, predicate, object, graph a (kind, value) pair: CONSTANT with a
# term, BOUND with a variable bound earlier, FREE with a variable this step binds. For the graph,
# a default-graph position is CONSTANT with None (resolved from the dataset at run time).
Step = tuple[tuple[int, object], tuple[int, object], tuple[int, object], tuple[int, object]]


def _score(pattern: QuadPattern, known: frozenset[str]) -> int:
    """How many of subject, predicate, object are known: the more, the cheaper the lookup."""
    return sum(
        1
        for position in (pattern.subject, pattern.predicate, pattern.object)
        if not isinstance(position, Var) or position.name in known
    )


@lru_cache(maxsize=4096)
def plan(patterns: tuple[QuadPattern, ...], bound: frozenset[str]) -> tuple[Step, ...]:
    """Join order and per-position roles for `patterns` entered with `bound` variables."""
    known = set(bound)
    remaining = list(patterns)
    steps: list[Step] = []
    while remaining:
        best = max(remaining, key=lambda pattern, known=frozenset(known): _score(pattern, known))
        remaining.remove(best)
        roles = []
        binding_here: set[str] = set()
        for index, position in enumerate(best.positions()):
            if isinstance(position, Var):
                if position.name in known:
                    roles.append((BOUND, position.name))
                elif position.name in binding_here:
                    roles.append((BOUND, position.name))  # second occurrence within the pattern
                else:
                    roles.append((FREE, position.name))
                    binding_here.add(position.name)
            elif index == 3 and isinstance(position, DefaultGraph):
                roles.append((CONSTANT, None))
            else:
                roles.append((CONSTANT, position))
        known |= binding_here
        steps.append(tuple(roles))  # type: ignore[arg-type]
    return tuple(steps)


def evaluate_bgp(
    store: Store, patterns: Sequence[QuadPattern], binding: Binding | None = None, dataset: Dataset = STORE_DATASET
) -> Iterator[Binding]:
    """All solutions of the patterns extending `binding` (each a new dict)."""
    start: Binding = dict(binding) if binding else {}
    steps = plan(tuple(patterns), frozenset(start))
    yield from _run(store, steps, 0, start, dataset)


def _value(role: tuple[int, object], binding: Binding) -> object:
    kind, value = role
    if kind == CONSTANT:
        return value
    if kind == BOUND:
        return binding.get(value)  # type: ignore[arg-type]
    return None


def _run(store: Store, steps: tuple[Step, ...], index: int, binding: Binding, dataset: Dataset) -> Iterator[Binding]:
    if index == len(steps):
        yield dict(binding)
        return
    s_role, p_role, o_role, g_role = steps[index]
    subject = _value(s_role, binding)
    predicate = _value(p_role, binding)
    obj = _value(o_role, binding)
    if isinstance(subject, Literal) or (predicate is not None and not isinstance(predicate, NamedNode)):
        return
    g_kind, g_value = g_role
    named = dataset.named
    if g_kind == CONSTANT:
        graph = dataset.default if g_value is None else g_value
        if g_value is not None and named is not None and graph not in named:
            return
    elif g_kind == BOUND:
        graph = binding.get(g_value)  # type: ignore[arg-type]
        if not isinstance(graph, NamedNode | BlankNode) or (named is not None and graph not in named):
            return
    else:
        graph = None
    free = [(position, role[1]) for position, role in enumerate(steps[index]) if role[0] == FREE]
    repeated = [
        (position, role[1]) for position, role in enumerate(steps[index]) if role[0] == BOUND and role[1] not in binding
    ]
    following = index + 1
    for quad in store.quads_for_pattern(subject, predicate, obj, graph):
        if graph is None:
            quad_graph = quad.graph_name
            if isinstance(quad_graph, DefaultGraph) or (named is not None and quad_graph not in named):
                continue
        if not free:
            yield from _run(store, steps, following, binding, dataset)
            continue
        values = (quad.subject, quad.predicate, quad.object, quad.graph_name)
        for position, name in free:
            binding[name] = values[position]
        if all(binding[name] == values[position] for position, name in repeated):
            yield from _run(store, steps, following, binding, dataset)
        for _, name in free:
            del binding[name]
