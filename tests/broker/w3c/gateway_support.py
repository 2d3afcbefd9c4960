"""Running W3C SPARQL 1.1 Query tests against a real gateway: load a test's dataset through /update,
send its query to /query and to the WebSocket subscribe gate, and compare results as the W3C suite does.

What it protects: third-party clients and testers send the W3C queries to the gateway's own gates,
which parse, shape and restrict a query before pyoxigraph answers it; these helpers exercise exactly
that path over real sockets. Results are compared as multisets of solutions with blank nodes mapped
one-to-one (ordered only when the query has ORDER BY). Decimal, float and double literals are
compared by value within their datatype ("2.0"^^xsd:decimal is "2"^^xsd:decimal: pyoxigraph writes
the shortest form, the W3C files often another); other terms as rdflib parses them.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pyoxigraph import RdfFormat, parse
from rdflib import XSD, BNode, Graph, Literal
from rdflib.compare import isomorphic
from rdflib.query import Result
from rdflib.term import Identifier

from tools.launcher import Reply, RunningGateway

from .manifest import DatasetSpec, ManifestEntry

Row = Mapping[str, Any]
ACCEPT = "application/sparql-results+json, application/n-triples"
RESULT_PARSERS = {".srx": "xml", ".srj": "json", ".tsv": "tsv", ".csv": "csv"}
SUBSCRIBE_TIMEOUT_S = 30.0
_ORDER_BY = re.compile(r"\bORDER\s+BY\b", re.IGNORECASE)
_BY_VALUE = {XSD.decimal, XSD.double, XSD.float}


def approved_params(cases: Sequence[ManifestEntry], expected_failures: Mapping[str, str]) -> list[Any]:
    """pytest params of the Approved entries; those in `expected_failures` are strict xfails with
    their reason, so one that starts passing fails the run until it is taken off the list."""
    params = []
    for entry in cases:
        if entry.approved:
            reason = expected_failures.get(entry.id)
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            params.append(pytest.param(entry, id=entry.id, marks=marks))
    return params


def dataset_updates(spec: DatasetSpec) -> list[str]:
    """One INSERT DATA per file (blank nodes stay per file); qt:graphData files into their graphs."""
    updates = []
    files = [(None, path) for path in spec.default] + [(iri, path) for iri, path in spec.named]
    for graph, path in files:
        fmt = RdfFormat.from_extension(path.suffix.lstrip("."))
        triples = " .\n".join(
            f"{t.subject} {t.predicate} {t.object}" for t in parse(path=path, format=fmt, base_iri=path.as_uri())
        )
        if triples:
            body = f"GRAPH <{graph}> {{ {triples} }}" if graph else triples
            updates.append(f"INSERT DATA {{ {body} }}")
    return updates


def load(gateway: RunningGateway, spec: DatasetSpec) -> None:
    """Empty the store, then load the dataset through /update."""
    gateway.post_update("DROP ALL")
    for update in dataset_updates(spec):
        gateway.post_update(update)


def with_base(query_file: Path) -> str:
    """The query text, its relative IRIs resolved against its own file as the W3C suite expects
    (the gateway's base IRI is its own `urn:`); a BASE in the query still wins."""
    return f"BASE <{query_file.as_uri()}>\n" + query_file.read_text(encoding="utf-8")


def ordered(query: str) -> bool:
    return bool(_ORDER_BY.search(query))


def send_query(gateway: RunningGateway, query: str) -> Reply:
    return gateway.query(query, accept=ACCEPT)


def parse_results(body: bytes, fmt: str) -> Result:
    return Result.parse(io.BytesIO(body), format=fmt)


def expected_result(path: Path) -> Result | Graph:
    """The W3C expected results: a result set (.srx/.srj/.tsv/.csv) or a graph (.ttl, CONSTRUCT)."""
    if path.suffix == ".ttl":
        return Graph().parse(path, format="turtle", publicID=path.as_uri())
    return parse_results(path.read_bytes(), RESULT_PARSERS[path.suffix])


def _comparable(term: Identifier) -> Identifier | tuple[object, ...]:
    """The term, or (datatype, value) for a decimal, float or double literal of a valid lexical form."""
    if isinstance(term, Literal) and term.datatype in _BY_VALUE and term.value is not None:
        return (term.datatype, term.value)
    return term


def rows(result: Result) -> list[dict[str, Any]]:
    """Solutions as {variable: comparable term}, unbound variables left out."""
    return [{str(var): _comparable(term) for var, term in row.items() if term is not None} for row in result.bindings]


def _match(expected: Sequence[Row], actual: Sequence[Row], ordered: bool, mapping: dict[BNode, BNode]) -> bool:
    """Backtracking search for a row bijection consistent with one blank-node bijection."""
    if not expected:
        return not actual
    first, rest = expected[0], expected[1:]
    candidates = [0] if ordered else range(len(actual))
    for index in candidates:
        if index >= len(actual):
            continue
        row = actual[index]
        if row.keys() != first.keys():
            continue
        extended = dict(mapping)
        if not all(_bind(first[k], row[k], extended) for k in first):
            continue
        if _match(rest, [*actual[:index], *actual[index + 1 :]], ordered, extended):
            return True
    return False


def _bind(expected: Any, actual: Any, mapping: dict[BNode, BNode]) -> bool:
    if isinstance(expected, BNode) and isinstance(actual, BNode):
        if expected in mapping:
            return mapping[expected] == actual
        if actual in mapping.values():
            return False
        mapping[expected] = actual
        return True
    return expected == actual and not isinstance(expected, BNode)


def same_rows(expected: Sequence[Row], actual: Sequence[Row], ordered: bool = False) -> bool:
    """Equal as multisets (as sequences when `ordered`), blank nodes mapped one-to-one."""
    if len(expected) != len(actual):
        return False
    if not ordered:
        # Rows without blank nodes need no search: compare them as multisets, match the rest.
        def plain(row: Row) -> bool:
            return not any(isinstance(t, BNode) for t in row.values())

        def key(row: Row) -> frozenset[tuple[str, Any]]:
            return frozenset(row.items())

        if Counter(key(r) for r in expected if plain(r)) != Counter(key(r) for r in actual if plain(r)):
            return False
        expected = [r for r in expected if not plain(r)]
        actual = [r for r in actual if not plain(r)]
    return _match(expected, actual, ordered, {})


def check_reply(reply: Reply, expected: Result | Graph, query: str, fmt: str = "json") -> None:
    """Assert that a /query reply (results in `fmt`, an rdflib result format) carries the expected results."""
    assert reply.status == 200, f"{reply.status}: {reply.body[:500]!r}"
    if isinstance(expected, Graph):
        assert reply.media_type == "application/n-triples", reply.media_type
        actual = Graph().parse(data=reply.text, format="nt")
        assert isomorphic(actual, expected), f"graph differs:\n{reply.text}"
        return
    actual_result = parse_results(reply.body, fmt)
    if expected.type == "ASK":
        assert actual_result.askAnswer == expected.askAnswer
        return
    assert same_rows(rows(expected), rows(actual_result), ordered(query)), (
        f"expected {rows(expected)}\n got {rows(actual_result)}"
    )


def _results(added_or_removed: Mapping[str, Any]) -> list[dict[str, Any]]:
    return rows(parse_results(json.dumps(added_or_removed).encode(), "json"))


async def _receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    message = await ws.receive(timeout=SUBSCRIBE_TIMEOUT_S)
    assert message.type == aiohttp.WSMsgType.TEXT, f"socket ended: {message}"
    frame: dict[str, Any] = json.loads(message.data)
    return frame


async def _first_notification(gateway: RunningGateway, query: str) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=SUBSCRIBE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.ws_connect(gateway.subscribe_url) as ws:
        await ws.send_json({"subscribe": {"sparql": query, "alias": "w3c"}})
        return await _receive(ws)


def subscribe(gateway: RunningGateway, query: str) -> dict[str, Any]:
    """Subscribe over a fresh WebSocket and return the first frame (notification 0 or an error)."""
    return asyncio.run(_first_notification(gateway, query))


def check_subscription(gateway: RunningGateway, query: str, expected: Result) -> None:
    """Notification 0's added bindings are the query's results (as a multiset: no order)."""
    frame = subscribe(gateway, query)
    assert "notification" in frame, frame
    added = _results(frame["notification"]["addedResults"])
    assert same_rows(rows(expected), added), f"expected {rows(expected)}\n got {added}"


async def _follow(gateway: RunningGateway, query: str, phases: Sequence[Sequence[str]]) -> list[list[dict[str, Any]]]:
    """Subscribe on an empty store, run the phases' updates, and apply every notification in order
    (each update's reply says how many it sent): the rows a client following the subscription holds
    after notification 0 and after each phase."""
    held: Counter[str] = Counter()
    snapshots = []

    def apply(notification: Mapping[str, Any]) -> None:
        for binding in notification["addedResults"]["results"]["bindings"]:
            held[json.dumps(binding, sort_keys=True)] += 1
        for binding in notification["removedResults"]["results"]["bindings"]:
            key = json.dumps(binding, sort_keys=True)
            assert held[key] > 0, f"removed a row the client does not hold: {key}"
            held[key] -= 1

    def snapshot() -> None:
        bindings = [json.loads(key) for key, count in held.items() for _ in range(count)]
        snapshots.append(_results({"head": head, "results": {"bindings": bindings}}))

    timeout = aiohttp.ClientTimeout(total=SUBSCRIBE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(gateway.update_url, data={"update": "DROP ALL"}) as reply:
            assert reply.status == 200, await reply.text()
        async with session.ws_connect(gateway.subscribe_url) as ws:
            await ws.send_json({"subscribe": {"sparql": query, "alias": "w3c"}})
            frame = await _receive(ws)
            assert "notification" in frame, frame
            head = frame["notification"]["addedResults"]["head"]
            apply(frame["notification"])
            snapshot()
            for updates in phases:
                for update in updates:
                    async with session.post(gateway.update_url, data={"update": update}) as reply:
                        assert reply.status == 200, await reply.text()
                        sent = (await reply.json())["notifications"]
                    for _ in range(sent):
                        frame = await _receive(ws)
                        assert "notification" in frame, frame
                        apply(frame["notification"])
                snapshot()
    return snapshots


def check_followed_subscription(gateway: RunningGateway, query: str, spec: DatasetSpec, expected: Result) -> None:
    """A subscription made before the data arrives follows it: the notifications of the updates
    that load the data, applied in order (docs/protocol.md, "Notification semantics"), give the W3C
    expected results; those of a DROP ALL then give the empty store's results again (notification 0's),
    and reloading gives the expected ones again. Leaves the dataset loaded."""
    load_updates = dataset_updates(spec)
    empty, loaded, dropped, reloaded = asyncio.run(_follow(gateway, query, [load_updates, ["DROP ALL"], load_updates]))
    assert same_rows(rows(expected), loaded), f"after loading: expected {rows(expected)}\n held {loaded}"
    assert same_rows(empty, dropped), f"after DROP ALL: expected {empty}\n held {dropped}"
    assert same_rows(rows(expected), reloaded), f"after reloading: expected {rows(expected)}\n held {reloaded}"
