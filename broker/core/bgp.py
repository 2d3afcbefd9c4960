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

import contextlib
from collections.abc import Iterable, Sequence
from functools import lru_cache

from pyoxigraph import BlankNode, DefaultGraph, Literal, NamedNode, Quad, Store

from broker.sparql.patterns import QuadPattern, pattern_skeleton

Binding = dict[str, object]

DEFAULT_GRAPH = DefaultGraph()
CONSTANT, BOUND, FREE, REPEAT = 0, 1, 2, 3


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

# A step: the index of the pattern it matches and, for each of subject, predicate, object and
# graph, a (kind, name) pair: CONSTANT (the pattern's own term; name None), BOUND (a variable bound
# earlier), FREE (a variable this step binds), REPEAT (a variable this step binds twice, whose
# values must agree); then the FREE and REPEAT (position, name) lists. Plans depend only on the
# patterns' skeleton (which positions are which variables), so requests that differ only in
# constants share one plan.
Step = tuple[int, tuple[tuple[int, object], ...], tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]]


def _score(skeleton: tuple[str | None, ...], known: frozenset[str]) -> int:
    """How many of subject, predicate, object are known: the more, the cheaper the lookup."""
    return sum(1 for name in skeleton[:3] if name is None or name in known)


@lru_cache(maxsize=4096)
def plan(skeletons: tuple[tuple[str | None, ...], ...], bound: frozenset[str]) -> tuple[Step, ...]:
    """Join order and per-position roles for patterns of this skeleton entered with `bound`."""
    known = set(bound)
    remaining = list(range(len(skeletons)))
    steps: list[Step] = []
    while remaining:
        best = max(remaining, key=lambda index, known=frozenset(known): _score(skeletons[index], known))
        remaining.remove(best)
        roles = []
        binding_here: set[str] = set()
        for name in skeletons[best]:
            if name is None:
                roles.append((CONSTANT, None))
            elif name in known:
                roles.append((BOUND, name))
            elif name in binding_here:
                roles.append((REPEAT, name))
            else:
                roles.append((FREE, name))
                binding_here.add(name)
        known |= binding_here
        free = tuple((position, role[1]) for position, role in enumerate(roles) if role[0] == FREE)
        repeated = tuple((position, role[1]) for position, role in enumerate(roles) if role[0] == REPEAT)
        steps.append((best, tuple(roles), free, repeated))  # type: ignore[arg-type]
    return tuple(steps)


def evaluate_bgp(
    store: Store,
    patterns: Sequence[QuadPattern],
    binding: Binding | None = None,
    dataset: Dataset = STORE_DATASET,
    skeleton: tuple[tuple[str | None, ...], ...] | None = None,
    *,
    capture: bool = False,
    quads_only: bool = False,
    limit: int | None = None,
) -> list[Binding]:
    """All solutions of the patterns extending `binding` (each a new dict); with `limit`, the first
    `limit` only (evaluation stops there: a product made after the fact by the data would
    otherwise be built in full, see broker.core.lookups).

    `skeleton`: :func:`pattern_skeleton` of `patterns`, for callers that evaluate the same patterns often.
    `capture`: each solution also maps the index of every pattern (an int key, never a variable
    name) to the quad of the store it matched, for callers that would otherwise rebuild that quad.
    `quads_only` (with `capture`): the variables the last pattern looked up binds are left out, for
    callers that only remove the quads matched (`DELETE WHERE`, or a DELETE template that is the
    WHERE pattern): reading a fresh quad's terms is most of the cost of a solution. With the
    VALUES lookups of the retention agent's deletes (broker.sparql.operations.ModifyOp.where_values),
    deleting 500 observations of 11 quads from 20,000 took 117-180 us an observation instead of
    222-337 us through the query engine (three runs each, alternated, one 2-core machine).
    The solutions come as a list: a recursion that appends is several times cheaper per solution
    than nested generators, and every caller keeps all of them anyway.
    """
    start: Binding = dict(binding) if binding else {}
    patterns = tuple(patterns)
    steps = plan(pattern_skeleton(patterns) if skeleton is None else skeleton, frozenset(start))
    out: list[Binding] = []
    cap = -1 if limit is None else max(1, limit)
    with contextlib.suppress(_Enough):
        _run(store, patterns, steps, 0, start, dataset, out, capture, quads_only and capture, cap)
    return out


class _Enough(Exception):
    """The solutions asked for are found (:func:`evaluate_bgp`'s `limit`)."""


# A default-graph lookup anchored on a subject or object is asked of every graph and filtered here
# when that finds few quads elsewhere: pyoxigraph converts a DefaultGraph() argument ~5 µs slower
# than None (it tries NamedNode and BlankNode first, and each failed conversion builds an error).
# Past this many quads in named graphs, the lookup is made again with DefaultGraph() instead.
MAX_SKIPPED = 16


def default_graph_quads(store: Store, subject: object, predicate: object, obj: object) -> Iterable[Quad]:
    """The quads of the store's default graph matching the pattern (None: wildcard)."""
    if subject is None and obj is None:  # not anchored: other graphs may hold any number of matches
        return store.quads_for_pattern(subject, predicate, obj, DEFAULT_GRAPH)  # type: ignore[arg-type]
    found = []
    skipped = 0
    for quad in store.quads_for_pattern(subject, predicate, obj, None):  # type: ignore[arg-type]
        if isinstance(quad.graph_name, DefaultGraph):
            found.append(quad)
        else:
            skipped += 1
            if skipped > MAX_SKIPPED:
                return store.quads_for_pattern(subject, predicate, obj, DEFAULT_GRAPH)  # type: ignore[arg-type]
    return found


def _lookup(
    store: Store, pattern: QuadPattern, roles: tuple[tuple[int, object], ...], binding: Binding, dataset: Dataset
) -> tuple[Iterable[Quad], bool]:
    """The quads one step's lookup finds under `binding`, and whether they are of any graph (GRAPH
    ?g free: each quad's graph is still to be checked with :func:`_in_named`)."""
    (s_kind, s_name), (p_kind, p_name), (o_kind, o_name), (g_kind, g_name) = roles
    # CONSTANT: the pattern's own term; BOUND: the variable's value; FREE or REPEAT: a wildcard
    subject = pattern.subject if s_kind == CONSTANT else binding.get(s_name) if s_kind == BOUND else None  # type: ignore[arg-type]
    predicate = pattern.predicate if p_kind == CONSTANT else binding.get(p_name) if p_kind == BOUND else None  # type: ignore[arg-type]
    obj = pattern.object if o_kind == CONSTANT else binding.get(o_name) if o_kind == BOUND else None  # type: ignore[arg-type]
    if isinstance(subject, Literal) or (predicate is not None and not isinstance(predicate, NamedNode)):
        return (), False
    named = dataset.named
    if g_kind == CONSTANT:
        default = isinstance(pattern.graph, DefaultGraph)
        graph = dataset.default if default else pattern.graph
        if not default and named is not None and graph not in named:
            return (), False
    elif g_kind == BOUND:
        graph = binding.get(g_name)  # type: ignore[arg-type]
        if not isinstance(graph, NamedNode | BlankNode) or (named is not None and graph not in named):
            return (), False
    else:
        graph = None
    if isinstance(graph, DefaultGraph):
        return default_graph_quads(store, subject, predicate, obj), False
    return store.quads_for_pattern(subject, predicate, obj, graph), graph is None  # type: ignore[arg-type]


def _in_named(quad: Quad, named: frozenset[NamedNode] | None) -> bool:
    """Whether a quad found with GRAPH ?g free is in one of the dataset's named graphs."""
    quad_graph = quad.graph_name
    return not isinstance(quad_graph, DefaultGraph) and (named is None or quad_graph in named)


def values_quads(
    store: Store,
    pattern: QuadPattern,
    binding: Binding,
    name: str,
    values: Iterable[object],
    dataset: Dataset = STORE_DATASET,
) -> list[Quad] | None:
    """The quads of the store `pattern` matches, extending `binding` with each of `values` for the
    variable `name` in turn (a value `binding` gives `name` already keeps only itself): what
    :func:`evaluate_bgp` with `capture` and `quads_only` finds for each value, as the quads alone.
    None when that is not all a solution would hold (a variable the lookup binds twice must agree).

    Why: the retention agent's delete (`DELETE { P } WHERE { VALUES ?s { ... } P }`) only removes
    the quads P matched, and one dict per quad, one evaluate_bgp (its plan's cache key hashed) per
    value and the template loop over those dicts were about half of its compute. Measured
    2026-12-07 (`/tmp/atk-cpu/mb_del.py`: 500 observations of 11 quads out of 20,000, in memory,
    best of 15 compute calls): 67-70 us an observation before, ~35 after; reading the quads out of
    pyoxigraph alone is ~33."""
    steps = plan(pattern_skeleton((pattern,)), frozenset(binding) | {name})
    _, roles, _, repeated = steps[0]
    if repeated:
        return None
    named = dataset.named
    bound = binding.get(name)
    found: list[Quad] = []
    step_binding = dict(binding)
    for value in values:
        if bound is not None and bound != value:
            continue
        step_binding[name] = value
        quads, any_graph = _lookup(store, pattern, roles, step_binding, dataset)
        if any_graph:
            found.extend(quad for quad in quads if _in_named(quad, named))
        else:
            found.extend(quads)
    return found


def _run(
    store: Store,
    patterns: tuple[QuadPattern, ...],
    steps: tuple[Step, ...],
    index: int,
    binding: Binding,
    dataset: Dataset,
    out: list[Binding],
    capture: bool,
    quads_only: bool,
    cap: int,
) -> None:
    if index == len(steps):
        out.append(dict(binding))
        if len(out) == cap:
            raise _Enough
        return
    pattern_index, roles, free, repeated = steps[index]
    quads, any_graph = _lookup(store, patterns[pattern_index], roles, binding, dataset)
    named = dataset.named
    following = index + 1
    if quads_only and following == len(steps) and not repeated:  # nothing reads the terms
        for quad in quads:
            if any_graph and not _in_named(quad, named):
                continue
            out.append({**binding, pattern_index: quad})
        return
    for quad in quads:
        if any_graph and not _in_named(quad, named):
            continue
        if capture:
            binding[pattern_index] = quad  # type: ignore[index]
        if not free:
            _run(store, patterns, steps, following, binding, dataset, out, capture, quads_only, cap)
            continue
        values = (quad.subject, quad.predicate, quad.object, quad.graph_name)
        for position, name in free:
            binding[name] = values[position]
        if all(binding[name] == values[position] for position, name in repeated):
            _run(store, patterns, steps, following, binding, dataset, out, capture, quads_only, cap)
        for _, name in free:
            del binding[name]
    if capture:
        binding.pop(pattern_index, None)  # type: ignore[call-overload]
