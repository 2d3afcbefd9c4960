"""What a query worker evaluates: the jobs, the same functions in a worker or in this process.

A job takes the :class:`~broker.core.query_processor.QueryProcessor` of the store it runs on (a
worker's replica, or the engine's own store when there are no workers) and returns plain, picklable
values: bytes, rows of pyoxigraph terms. Errors are :class:`~broker.errors.SepaError` subclasses, or
pyoxigraph's SyntaxError where the caller locates it in the request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from broker.core.query_processor import QueryProcessor
from broker.core.results import QueryResult
from broker.core.spu import evaluate_rows
from broker.core.update_processor import where_solutions
from broker.gates.negotiation import serialize
from broker.workers.codec import Code, encode_all


def serialized(
    processor: QueryProcessor,
    sparql: str,
    *,
    accept: str | None,
    default_graph_uri: Sequence[str] = (),
    named_graph_uri: Sequence[str] = (),
    base_iri: str | None = None,
) -> tuple[bytes, str]:
    """A SPARQL Protocol query, serialized for the client's Accept header: (body, content type)."""
    raw = processor.run(sparql, default_graph_uri=default_graph_uri, named_graph_uri=named_graph_uri, base_iri=base_iri)
    return serialize(raw, accept)


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
) -> int:
    """Evaluate a subscription's query once, in full: the number of its results.

    Why: a subscribe evaluates its query on the update thread, which cannot be interrupted; run
    first where it can be, a query that never ends is refused before it gets there."""
    return processor.count(
        processor.run(
            sparql,
            default_graph_uri=default_graph_uri,
            named_graph_uri=named_graph_uri,
            prefixes=prefixes,
            subscription=True,
        )
    )


def subscription_rows(
    processor: QueryProcessor, sparql: str, prefixes: dict[str, str] | None, arguments: dict[str, object]
) -> tuple[tuple[str, ...], list[tuple[Code, ...]], bool | None]:
    """A re-evaluated subscription's result (:func:`~broker.core.spu.evaluate_rows`), its rows as
    term codes (:mod:`broker.workers.codec`).

    Why codes: pickled, a pyoxigraph term costs ~2.7 us to dump and ~0.9 us to load; 1,000
    subscriptions of 1,000 rows re-evaluated by one update are 2 million terms."""
    variables, rows, boolean = evaluate_rows(processor.store, sparql, prefixes, arguments)
    return variables, [encode_all(row) for row in rows], boolean


JOBS: dict[str, Callable[..., Any]] = {
    "serialized": serialized,
    "materialized": materialized,
    "probe": probe,
    "where_solutions": lambda processor, *args: where_solutions(processor.store, *args),
    "subscription_rows": subscription_rows,
}
