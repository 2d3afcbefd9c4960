"""What a query worker evaluates: the jobs, the same functions in a worker or in this process.

A job takes the :class:`~broker.core.query_processor.QueryProcessor` of the store it runs on (a
worker's replica, or the engine's own store when there are no workers) and returns plain, picklable
values: bytes, rows of pyoxigraph terms. Errors are :class:`~broker.errors.SepaError` subclasses, or
pyoxigraph's SyntaxError where the caller locates it in the request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

from pyoxigraph import Quad, QueryBoolean, QueryResultsFormat, QuerySolutions

from broker.core.bounded import BoundedBuffer, TooLarge
from broker.core.held import ROW_CHARS, WEIGHED, text_weight
from broker.core.query_processor import QueryProcessor
from broker.core.results import QueryResult
from broker.core.spu import Mu, ShapeGroup
from broker.core.where import where_solutions
from broker.errors import ResultTooLarge
from broker.gates.negotiation import serialize


def serialized(
    processor: QueryProcessor,
    sparql: str,
    *,
    accept: str | None,
    default_graph_uri: Sequence[str] = (),
    named_graph_uri: Sequence[str] = (),
    base_iri: str | None = None,
    max_bytes: int | None = None,
) -> tuple[bytes, str]:
    """A SPARQL Protocol query, serialized for the client's Accept header: (body, content type);
    ResultTooLarge past `max_bytes` of body."""
    raw = processor.run(sparql, default_graph_uri=default_graph_uri, named_graph_uri=named_graph_uri, base_iri=base_iri)
    return serialize(raw, accept, max_bytes)


def materialized(processor: QueryProcessor, sparql: str, **options: Any) -> QueryResult:
    """A query evaluated in full (the in-process API's :meth:`~broker.core.engine.Engine.query`)."""
    return processor.materialize(processor.run(sparql, **options))


def probe(
    processor: QueryProcessor,
    sparql: str,
    *,
    default_graph_uri: Sequence[str] = (),
    named_graph_uri: Sequence[str] = (),
    prefixes: dict[str, str] | None = None,
    keep_bytes: int = 0,
    max_rows: int | None = None,
) -> tuple[int, bytes | None, float]:
    """Evaluate a subscription's query once, in full: (its results' count, its result as SPARQL TSV
    when it is a SELECT with variables whose TSV takes at most `keep_bytes`, else None, the seconds
    the evaluation took). ResultTooLarge when it has more than `max_rows` results.

    Why: a subscribe evaluates its query on the update thread, which cannot be interrupted; run
    first where it can be, a query that never ends is refused before it gets there. The result
    kept spares the update thread that evaluation when the store did not change in between
    (:meth:`broker.core.engine.Engine.probe`). Why `max_rows`: a subscription holds its result for
    as long as it lives and sends it whole first; a 60-byte product of a 700-triple store with
    itself was a first notification of 125 MB, the gateway's RSS 877 MB. The count lets the update
    thread refuse a subscription past the rows held budgets before evaluating it
    (:mod:`broker.core.held`).

    Why the seconds are measured here: they are what a re-evaluation of the query costs, charged
    to its client (:mod:`broker.core.reeval_cost`). Timed by the caller, they also held the wait
    for an idle worker and for the worker to apply the deltas it lacked: after 10 s of 1,000
    readings/s the dashboard's tiles (a 500-row UNION, evaluated in 2-11 ms) were charged 6.0 and
    6.8 s, and refused as too costly, whatever their client had subscribed."""
    started = time.perf_counter()
    rows, text = _probed(processor, sparql, default_graph_uri, named_graph_uri, prefixes, keep_bytes, max_rows)
    return rows, text, time.perf_counter() - started


def _probed(
    processor: QueryProcessor,
    sparql: str,
    default_graph_uri: Sequence[str],
    named_graph_uri: Sequence[str],
    prefixes: dict[str, str] | None,
    keep_bytes: int,
    max_rows: int | None,
) -> tuple[int, bytes | None]:
    """:func:`probe`'s evaluation: (the count, the TSV kept or None)."""
    raw = processor.run(
        sparql,
        default_graph_uri=default_graph_uri,
        named_graph_uri=named_graph_uri,
        prefixes=prefixes,
        subscription=True,
    )
    rows = 0
    if keep_bytes and isinstance(raw, QuerySolutions) and raw.variables:
        text, whole = processor.tsv(raw, max_bytes=keep_bytes)
        if whole:
            _check_rows(text.count(b"\n") - 1, max_rows)
            return text.count(b"\n") - 1, text
        rows = text.count(b"\n")  # less the header, and one solution read that it had not written
    # evaluated in full (that is the probe's point), or until it has more rows than it may
    # one more than the results if the TSV's last write (the whole of a small result) crossed keep_bytes
    rows += processor.count(raw, limit=None if max_rows is None else max(0, max_rows + 1 - rows))
    _check_rows(rows, max_rows)
    return rows, None


def _check_rows(rows: int, max_rows: int | None) -> None:
    if max_rows is not None and rows > max_rows:
        raise ResultTooLarge(
            f"the subscription's result has more than {max_rows} rows ({WEIGHED}; "
            "the limit of one subscription: [websocket] max_subscription_rows)"
        )


def subscription_rows(
    processor: QueryProcessor,
    sparql: str,
    prefixes: dict[str, str] | None,
    arguments: dict[str, object],
    max_rows: int | None = None,
) -> tuple[tuple[str, ...], bytes | list[tuple[()]], bool | None]:
    """A re-evaluated subscription's result (as :func:`~broker.core.spu.evaluate_rows`): its
    variables, its rows as SPARQL TSV (:func:`broker.workers.codec.rows_from_tsv` reads them back)
    and, for ASK, its boolean.

    Why TSV: written by pyoxigraph, a 1,000-row result costs 1.1 ms with its evaluation, where
    building term tuples and encoding them (codes, then pickle) cost 2.75 ms and pickled terms more;
    the engine reads it back in 0.85 ms. A result without variables has no TSV rows to count: its
    empty rows travel as they are. More than `max_rows` rows, weighed (broker.core.held.row_weight):
    ResultTooLarge, and the subscription is ended."""
    result = processor.store.query(sparql, prefixes=prefixes, **arguments)  # type: ignore[arg-type]
    if isinstance(result, QueryBoolean):
        return (), [], bool(result)
    variables = tuple(variable.value for variable in result.variables)
    if not variables:
        rows = list(islice(result, None if max_rows is None else max_rows + 1))
        _check_rows(len(rows), max_rows)
        return variables, [() for _ in rows], None
    # weighed as the engine will (broker.core.held.text_weight): a text this long has more rows than
    # max_rows, or rows of more characters, so the serialization stops there rather than making it whole
    output = BoundedBuffer(None if max_rows is None else (max_rows + 1) * (ROW_CHARS + 1) + len(sparql))
    try:
        result.serialize(output, format=QueryResultsFormat.TSV)
    except TooLarge:
        _check_rows((max_rows or 0) + 1, max_rows)
    text = output.getvalue()
    _check_rows(text_weight(text), max_rows)
    return variables, text, None


_GROUPS: dict[object, ShapeGroup] = {}  # made again from their arguments, by key (a worker's own)
MAX_GROUPS = 256


def hit_solutions(
    processor: QueryProcessor,
    arguments: tuple[Any, ...],
    ref: tuple[int, int],
    quad: Quad,
    params: tuple[object, ...] | None,
    limit: int | None,
) -> list[Mu] | None:
    """One hit's solutions (:meth:`~broker.core.spu.ShapeGroup.hit_solutions`) of the group
    `arguments` make (:attr:`~broker.core.spu.ShapeGroup.arguments`), for a lookup too costly for
    the update thread (:mod:`broker.core.lookups`)."""
    group = _GROUPS.get(arguments[0])
    if group is None:
        if len(_GROUPS) >= MAX_GROUPS:
            _GROUPS.clear()
        group = _GROUPS[arguments[0]] = ShapeGroup(*arguments)
    return group.hit_solutions(processor.store, ref, quad, params, limit)


JOBS: dict[str, Callable[..., Any]] = {
    "serialized": serialized,
    "materialized": materialized,
    "probe": probe,
    "where_solutions": lambda processor, *args: where_solutions(processor.store, *args),
    "subscription_rows": subscription_rows,
    "hit_solutions": hit_solutions,
}
