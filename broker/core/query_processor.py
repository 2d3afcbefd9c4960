"""Query processor: evaluates SPARQL 1.1 queries on the store with SPARQL Protocol datasets."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from pyoxigraph import DefaultGraph, NamedNode, QueryBoolean, QueryResultsFormat, QuerySolutions, QueryTriples, Variable

from broker.core.access import DEFAULT_GRAPH_IRI, NO_GRAPH_IRI
from broker.core.bounded import BoundedBuffer, TooLarge
from broker.core.results import QueryResult
from broker.errors import InvalidRequest, SparqlSyntaxError
from broker.sparql.limits import check_structure
from broker.sparql.service import check_services
from broker.sparql.terms import Term
from broker.store import RdfStore

RawResult = QuerySolutions | QueryBoolean | QueryTriples


def syntax_error(error: SyntaxError, text: str | None = None) -> SparqlSyntaxError:
    """Turn pyoxigraph's `error at L:C: message` into a SparqlSyntaxError naming line and column.

    Given the request's `text`, an undeclared prefix is named: pyoxigraph says "expected one of
    Prefix not found, ['%'], ..." and 1,000 characters of character classes, which named neither the
    prefix nor the fix (an application written for a store that declares rdf:, xsd: ... itself)."""
    message = str(error)
    if message.startswith("error at "):
        where, _, rest = message[len("error at ") :].partition(": ")
        line, _, column = where.partition(":")
        if line.isdigit() and column.split("-")[0].isdigit():
            number, at = int(line), int(column.split("-")[0])
            prefix = _undeclared_prefix(rest, text, number, at)
            if prefix is not None:
                return SparqlSyntaxError(f"the prefix '{prefix}:' is not declared (PREFIX {prefix}: <...>)", number, at)
            return SparqlSyntaxError(_shortened(rest), number, at)
    return SparqlSyntaxError(_shortened(message))


_PREFIXED_NAME_END = re.compile(r"([A-Za-z][\w.-]*)?:[\w.:%\\-]*$")


def _undeclared_prefix(message: str, text: str | None, line: int, column: int) -> str | None:
    """The prefix of the prefixed name that ends where pyoxigraph stopped (`line`, `column`, from
    1), when it stopped for an undeclared prefix."""
    if text is None or not message.startswith("expected one of Prefix not found"):
        return None
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return None
    found = _PREFIXED_NAME_END.search(lines[line - 1][: max(column - 1, 0)])
    return None if found is None else found.group(1) or ""


def _shortened(message: str) -> str:
    return message[:240].rsplit(",", 1)[0] + ", ..." if len(message) > 240 else message


def graph_list(iris: Sequence[str], what: str) -> list[NamedNode]:
    """Protocol graph IRIs (default-graph-uri, named-graph-uri...) as NamedNodes, validated.

    :data:`~broker.core.access.DEFAULT_GRAPH_IRI` names the store's default graph (in default-graph-uri
    only) and :data:`~broker.core.access.NO_GRAPH_IRI` stands for no graph (an explicitly empty list).
    """
    try:
        terms = [DefaultGraph() if iri == DEFAULT_GRAPH_IRI else NamedNode(iri) for iri in iris if iri != NO_GRAPH_IRI]
    except ValueError as error:
        raise InvalidRequest(f"invalid {what} IRI: {error}") from error
    if what != "default-graph-uri" and DEFAULT_GRAPH_IRI in iris:
        raise InvalidRequest(f"the default graph cannot be a {what}")
    return terms  # type: ignore[return-value]


def dataset_arguments(default_graph_uri: Sequence[str], named_graph_uri: Sequence[str]) -> dict[str, object]:
    """pyoxigraph keyword arguments for a SPARQL Protocol dataset (none given: the store's own).

    With named-graph-uri alone the default graph is empty (SPARQL 1.1 Query §13.2).
    """
    arguments: dict[str, object] = {}
    if default_graph_uri or named_graph_uri:  # a protocol dataset: its default graph may be empty
        arguments["default_graph"] = graph_list(default_graph_uri, "default-graph-uri")
    if named_graph_uri:
        arguments["named_graphs"] = graph_list(named_graph_uri, "named-graph-uri")
    return arguments


class QueryProcessor:
    """Runs queries; safe to call from several threads at once."""

    def __init__(self, store: RdfStore, *, service_allow: Sequence[str] = (), service_timeout_s: float = 10.0) -> None:
        self.store = store
        self.service_allow = tuple(service_allow)
        self.service_timeout_s = service_timeout_s  # how long a query's client waits for allowed SERVICE calls

    def calls_service(self, sparql: str, base_iri: str | None = None) -> bool:
        """Whether `sparql` calls a SERVICE (raises InvalidRequest when one is not allowed)."""
        return check_services(sparql, self.service_allow, base_iri)

    def run(
        self,
        sparql: str,
        *,
        default_graph_uri: Sequence[str] = (),
        named_graph_uri: Sequence[str] = (),
        base_iri: str | None = None,
        prefixes: dict[str, str] | None = None,
        substitutions: dict[Variable, Term] | None = None,
        subscription: bool = False,
    ) -> RawResult:
        """Evaluate and return pyoxigraph's lazy result (iterate it, or serialize it directly).

        A `subscription` may not call SERVICE at all (:func:`broker.sparql.service.check_services`)."""
        check_structure(sparql)
        check_services(sparql, self.service_allow, base_iri, prefixes, where="subscriptions" if subscription else None)
        try:
            return self.store.query(
                sparql,
                base_iri=base_iri,
                prefixes=prefixes,
                substitutions=substitutions,
                **dataset_arguments(default_graph_uri, named_graph_uri),
            )
        except SyntaxError as error:
            raise syntax_error(error, sparql) from error
        except (ValueError, RuntimeError) as error:
            raise InvalidRequest(str(error)) from error

    @staticmethod
    def materialize(raw: RawResult) -> QueryResult:
        """Evaluate a lazy result in full; a failure on the way (a failing SERVICE) is InvalidRequest."""
        try:
            return QueryProcessor._materialize(raw)
        except (RuntimeError, OSError) as error:
            raise InvalidRequest(f"query evaluation failed: {str(error)[:300]}") from None

    @staticmethod
    def count(raw: RawResult, limit: int | None = None) -> int:
        """The number of results of a lazy result, evaluated in full (up to `limit` of them) without
        building its rows."""
        try:
            if isinstance(raw, QueryBoolean):
                return 1
            return sum(1 for _ in (raw if limit is None else itertools.islice(raw, limit)))
        except (RuntimeError, OSError) as error:
            raise InvalidRequest(f"query evaluation failed: {str(error)[:300]}") from None

    @staticmethod
    def tsv(raw: QuerySolutions, max_bytes: int | None = None) -> tuple[bytes, bool]:
        """A lazy SELECT result written as SPARQL TSV (by pyoxigraph), and whether whole: past
        `max_bytes` it stops, the rest of `raw` left to evaluate, and returns what it serialized
        (pyoxigraph writes a few KB at a time). Measured with pyoxigraph 0.5: the rows of the
        result are then exactly the lines returned (the header's line counting for one solution
        it had read and not written) and the solutions left in `raw`; tests/broker/workers/
        test_probe_rows.py checks it at the limit."""
        output = BoundedBuffer(max_bytes)
        try:
            raw.serialize(output, format=QueryResultsFormat.TSV)
        except TooLarge:
            return output.getvalue() + output.refused, False
        except (RuntimeError, OSError) as error:
            raise InvalidRequest(f"query evaluation failed: {str(error)[:300]}") from None
        return output.getvalue(), True

    @staticmethod
    def _materialize(raw: RawResult) -> QueryResult:
        if isinstance(raw, QueryBoolean):
            return QueryResult("ask", boolean=bool(raw))
        if isinstance(raw, QuerySolutions):
            variables = tuple(variable.value for variable in raw.variables)
            rows = tuple(map(tuple, raw))  # a solution iterates its values, None where unbound
            return QueryResult("select", variables, rows)
        return QueryResult("graph", triples=tuple(raw))


DEFAULT_GRAPH = DefaultGraph()
