"""The solutions of an update's WHERE clause as pyoxigraph evaluates it: on the update thread, or in a
query worker (the ``where_solutions`` job, :mod:`broker.workers.jobs`).

Apart from :mod:`broker.core.update_processor` so that a query worker's process does not import the
update parser it never runs (its regular expressions are compiled at import): importing
broker.workers.replica took 0.57-0.63 s of user time before, 0.32-0.35 s after (load 9), paid at
every query worker start (a gateway's pool, a replaced worker, each example of the differential
tests that evaluate in workers).
"""

from __future__ import annotations

from pyoxigraph import DefaultGraph, NamedNode

from broker.core.held import WEIGHED, row_weight
from broker.errors import UpdateFailed
from broker.sparql.terms import Term
from broker.store import RdfStore

Solutions = list[dict[str, Term]]
LIMIT_SETTING = "the limit of one request: [engine] max_update_quads"


def where_solutions(
    store: RdfStore,
    query: str,
    default_graph: list[NamedNode | DefaultGraph] | None = None,
    named_graphs: list[NamedNode] | None = None,
    limit: int | None = None,
) -> Solutions:
    """The solutions of an update's WHERE clause (the SELECT * the parser wrote), as dicts; past
    `limit` of them, UpdateFailed (before more are read: see MAX_UPDATE_QUADS).

    Raises pyoxigraph's SyntaxError as is (the caller locates it in the request's text)."""
    arguments: dict[str, object] = {}
    if default_graph is not None:
        arguments["default_graph"] = default_graph
    if named_graphs is not None:
        arguments["named_graphs"] = named_graphs
    try:
        solutions = store.query(query, **arguments)
    except (ValueError, RuntimeError) as error:
        raise UpdateFailed(str(error)) from None
    names = [variable.value for variable in solutions.variables]
    try:
        if limit is None:
            return [
                {name: solution[index] for index, name in enumerate(names) if solution[index] is not None}
                for solution in solutions
            ]
        rows = []
        weight = 0  # each solution's terms are copies: weighed (broker.core.held.row_weight)
        for solution in solutions:
            row = {name: solution[index] for index, name in enumerate(names) if solution[index] is not None}
            rows.append(row)
            weight += 1 + row_weight(row.values())
            if weight > limit:
                raise UpdateFailed(f"the WHERE clause has more than {limit} solutions ({WEIGHED}; {LIMIT_SETTING})")
        return rows
    except (RuntimeError, OSError) as error:  # evaluation is lazy: a failing SERVICE shows up here
        raise UpdateFailed(f"the WHERE clause failed: {str(error)[:300]}") from None
