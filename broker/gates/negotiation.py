"""Content negotiation of query results (SPARQL 1.1 Protocol): Accept header -> serializer."""

from __future__ import annotations

from pyoxigraph import QueryBoolean, QueryResultsFormat, QuerySolutions, QueryTriples, RdfFormat

from broker.core.bounded import BoundedBuffer, TooLarge
from broker.errors import InvalidRequest, ResultTooLarge, SepaError

RESULT_FORMATS: dict[str, QueryResultsFormat] = {
    "application/sparql-results+json": QueryResultsFormat.JSON,
    "application/json": QueryResultsFormat.JSON,
    "application/sparql-results+xml": QueryResultsFormat.XML,
    "application/xml": QueryResultsFormat.XML,
    "text/csv": QueryResultsFormat.CSV,
    "text/tab-separated-values": QueryResultsFormat.TSV,
}
GRAPH_FORMATS: dict[str, RdfFormat] = {
    "text/turtle": RdfFormat.TURTLE,
    "application/n-triples": RdfFormat.N_TRIPLES,
    "application/ld+json": RdfFormat.JSON_LD,
    "application/rdf+xml": RdfFormat.RDF_XML,
    "application/n-quads": RdfFormat.N_QUADS,
    "application/trig": RdfFormat.TRIG,
}

# A CONSTRUCT or DESCRIBE asked for with a result format's media type: the graph in the RDF format of
# the same syntax. Why: SEPA clients send one Accept for every query (sepy:
# application/sparql-results+json), and read the body with a JSON parser; a 406 made every graph
# query fail in them. A graph type the header names still wins (see `choose`).
GRAPH_FOR_RESULT_TYPES: dict[str, str] = {
    "application/sparql-results+json": "application/ld+json",
    "application/json": "application/ld+json",
    "application/sparql-results+xml": "application/rdf+xml",
    "application/xml": "application/rdf+xml",
}


class NotAcceptable(SepaError):
    error = "not_acceptable"
    status_code = 406


def _accepted(accept: str | None) -> tuple[list[str], set[str]]:
    """Media types of an Accept header, best first (q-values honoured, parameters ignored), and the
    media types refused with q=0."""
    if not accept or not accept.strip():
        return ["*/*"], set()
    ranked: list[tuple[float, int, str]] = []
    refused: set[str] = set()
    for position, item in enumerate(accept.split(",")):
        media_type, *parameters = (part.strip() for part in item.split(";"))
        quality = 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if not media_type:
            continue
        if quality > 0:
            ranked.append((-quality, position, media_type.lower()))
        else:
            refused.add(media_type.lower())
    if not ranked and not refused:  # nothing usable in the header: as if it were absent
        return ["*/*"], set()
    return [media_type for _, _, media_type in sorted(ranked)], refused


def choose(result: object, accept: str | None) -> tuple[object, str]:
    """(pyoxigraph format, media type) for this result and Accept header; raises NotAcceptable.

    The header's order of preference (q-values, then position) decides. For a graph, a result type
    stands for the RDF format of its syntax (GRAPH_FOR_RESULT_TYPES) only when the header names no
    graph type at all. Why: the dashboard's console asks for
    `application/sparql-results+json, text/turtle;q=0.9` and must get Turtle for a CONSTRUCT, while
    sepy, which names only a results type, must get JSON-LD."""
    table: dict[str, object] = GRAPH_FORMATS if isinstance(result, QueryTriples) else RESULT_FORMATS  # type: ignore[assignment]
    wanted, refused = _accepted(accept)
    refused_formats = [table[media_type] for media_type in refused if media_type in table]
    fallbacks = GRAPH_FOR_RESULT_TYPES if table is GRAPH_FORMATS and not table.keys() & set(wanted) else {}
    for media_type in wanted:
        if fallbacks.get(media_type, "") in table.keys() - refused:
            media_type = fallbacks[media_type]
        if media_type in table:
            return table[media_type], media_type
        if media_type == "*/*" or media_type.endswith("/*"):
            prefix = "" if media_type == "*/*" else media_type[:-1]
            for candidate in table:  # in order of preference: the first one is the default
                if candidate.startswith(prefix) and table[candidate] not in refused_formats:
                    return table[candidate], candidate
    raise NotAcceptable(f"cannot produce any of {accept!r}; available: {', '.join(table)}")


def evaluation_error(error: Exception) -> InvalidRequest:
    """A failure while a query was evaluated (a SERVICE endpoint that answered garbage or failed):
    the request's problem, said in one line, not an internal fault."""
    return InvalidRequest(f"query evaluation failed: {str(error)[:300]}")


def serialize(
    result: QuerySolutions | QueryBoolean | QueryTriples, accept: str | None, max_bytes: int | None = None
) -> tuple[bytes, str]:
    """Serialize a pyoxigraph result for the client; returns (body, content type).

    Past `max_bytes` the serialization stops and ResultTooLarge is raised. Why: one short query
    (a product of a 1,000-triple store with itself) made a 225 MB JSON body in 4 s, the gateway's
    RSS 710 MB (the body is made in a query worker, sent to the gateway, then to the client): a
    reader could end a gateway on a 1 GB board."""
    result_format, media_type = choose(result, accept)
    output = BoundedBuffer(max_bytes)
    try:
        result.serialize(output, format=result_format)  # type: ignore[arg-type]
    except TooLarge:
        raise ResultTooLarge(
            f"the result is larger than {max_bytes} bytes (the limit of one query: [http] max_result_bytes); "
            "ask for less, with LIMIT and OFFSET"
        ) from None
    except (RuntimeError, OSError) as error:  # evaluation is lazy: a failing SERVICE shows up here
        raise evaluation_error(error) from None
    charset = "; charset=utf-8" if media_type.startswith("text/") or "json" in media_type else ""
    return output.getvalue(), media_type + charset
