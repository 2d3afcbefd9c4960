"""The W3C SPARQL 1.1 Protocol test suite, run over real HTTP against `sepa-gateway run`.

Protects: conformance of /query and /update with every test of the W3C protocol manifest
(copied with its data and licence under tests/broker/gates/data/w3c-protocol/ from
w3c-sparql11/protocol/). The manifest encodes each test as a sequence of `ht:Request`s (method,
absolutePath, headers, body with its character encoding) with the expected `ht:Response`
(`mf:expectedStatus` class, `mf:expectedBoolean`, `mf:expectedFormat`); these are executed
literally. Adaptations: the connection authority `www.example` is the gateway's address, the
path prefix `/sparql/` becomes `/query` or `/update` (by the request's media type or parameter,
else by the test name, as the manifest prescribes), the `ut:graphData` files are loaded into
their named graphs before the test, and the store is emptied first.

Additions to the W3C checks: a 4xx reply must be the protocol's error JSON, and a test whose
requests must all be refused must leave a sentinel quad in the default graph and in a named
graph untouched.

Every entry of the protocol manifest is run (ids are the W3C names). None is an expected failure
(EXPECTED_FAILURES is empty): `update_base_uri` and `query_content_type_construct` use
relative IRIs (`<test>`, `<s> <p>`), resolved against the service endpoint URL as base IRI.

Not implemented, because the gateway does not serve what they test:
- service-description/ (returns-rdf, has-endpoint-triple, conforms-to-schema): no SPARQL service
  description is served (GET /query without a query is a 400 by PROTOCOL.md);
- graph-store-protocol/ and http-rdf-update/: the SPARQL 1.1 Graph Store HTTP Protocol is not
  part of the gateway's wire contract;
- service/ and syntax-fed/ (federated query, SERVICE): need other live endpoints; federation is
  not offered by the broker.
"""

from __future__ import annotations

import contextlib
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from pyoxigraph import RdfFormat, parse
from rdflib import RDF, RDFS, Graph, Namespace, URIRef
from rdflib.collection import Collection
from rdflib.term import Node

if TYPE_CHECKING:
    from tools.launcher import Reply, RunningGateway

DATA_DIR = Path(__file__).resolve().parent / "data" / "w3c-protocol"
MANIFEST = DATA_DIR / "manifest.ttl"

MF = Namespace("http://www.w3.org/2001/sw/DataAccess/tests/test-manifest#")
UT = Namespace("http://www.w3.org/2009/sparql/tests/test-update#")
HT = Namespace("http://www.w3.org/2011/http#")
HTS = Namespace("http://www.w3.org/2011/http-statusCodes#")
CNT = Namespace("http://www.w3.org/2011/content#")
DAWGT = Namespace("http://www.w3.org/2001/sw/DataAccess/tests/test-dawg#")

SRX = "{http://www.w3.org/2005/sparql-results#}"
BOOLEAN_TYPES = {"application/sparql-results+json", "application/json", "application/sparql-results+xml"}
TABULAR_TYPES = BOOLEAN_TYPES | {"text/csv", "text/tab-separated-values"}
RDF_TYPES = {
    "application/rdf+xml": RdfFormat.RDF_XML,
    "text/turtle": RdfFormat.TURTLE,
    "application/n-triples": RdfFormat.N_TRIPLES,
}
SENTINEL_GRAPH = "http://example.org/sentinel-graph"
SENTINEL = "<http://example.org/sentinel> <http://example.org/is> 'still here'"

EXPECTED_FAILURES: dict[str, str] = {}  # none: relative IRIs resolve against the endpoint URL


@dataclass(frozen=True)
class HttpRequest:
    """One `ht:Request` of a test, with the expectations of its `ht:resp`."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes | None
    status_classes: frozenset[int]  # 2 for hts:StatusCode2xx...
    boolean: bool | None
    result_format: str | None  # "boolean", "tabular" or "RDF"

    @property
    def content_type(self) -> str:
        for name, value in self.headers:
            if name.lower() == "content-type":
                return value.split(";")[0].strip().lower()
        return ""


@dataclass(frozen=True)
class ProtocolTest:
    id: str
    name: str
    graph_data: tuple[tuple[str, Path], ...]  # (graph IRI, N-Triples file)
    requests: tuple[HttpRequest, ...]


def _status_class(node: Node) -> int:
    text = str(node).removeprefix(str(HTS))  # StatusCode2xx
    assert text.startswith("StatusCode") and text.endswith("xx"), node
    return int(text[len("StatusCode")])


def _request(g: Graph, node: Node) -> HttpRequest:
    headers: list[tuple[str, str]] = []
    header_list = g.value(node, HT.headers)
    if header_list is not None:
        for header in Collection(g, header_list):
            headers.append((str(g.value(header, HT.fieldName)), str(g.value(header, HT.fieldValue))))
    body = None
    body_node = g.value(node, HT.body)
    if body_node is not None:
        encoding = str(g.value(body_node, CNT.characterEncoding) or "UTF-8")
        body = str(g.value(body_node, CNT.chars)).encode(encoding)
    response = g.value(node, HT.resp)
    boolean = g.value(response, MF.expectedBoolean)
    result_format = g.value(response, MF.expectedFormat)
    return HttpRequest(
        method=str(g.value(node, HT.methodName)),
        path=str(g.value(node, HT.absolutePath)),
        headers=tuple(headers),
        body=body,
        status_classes=frozenset(_status_class(status) for status in g.objects(response, MF.expectedStatus)),
        boolean=None if boolean is None else bool(boolean.toPython()),  # type: ignore[union-attr]
        result_format=None if result_format is None else str(result_format),
    )


def _file(node: Node | None) -> Path:
    parsed = urlsplit(str(node))
    assert parsed.scheme == "file", node
    return Path(unquote(parsed.path))


def load_manifest() -> list[ProtocolTest]:
    g = Graph()
    g.parse(MANIFEST, format="turtle", publicID=MANIFEST.as_uri())
    (manifest,) = g.subjects(RDF.type, MF.Manifest)
    tests = []
    for entry in Collection(g, g.value(manifest, MF.entries)):
        assert isinstance(entry, URIRef)
        if g.value(entry, DAWGT.approval) == DAWGT.Withdrawn:
            continue
        action = g.value(entry, MF.action)
        graph_data = tuple(
            sorted(
                (str(g.value(data, RDFS.label)), _file(g.value(data, UT.graph)))
                for data in g.objects(entry, UT.graphData)
            )
        )
        requests = tuple(_request(g, node) for node in Collection(g, g.value(action, HT.requests)))
        tests.append(ProtocolTest(str(entry).rpartition("#")[2], str(g.value(entry, MF.name)), graph_data, requests))
    return tests


TESTS = load_manifest()


def _operation(test: ProtocolTest, request: HttpRequest) -> str:
    """Which of our endpoints a `/sparql/` request is meant for."""
    if request.content_type == "application/sparql-query":
        return "query"
    if request.content_type == "application/sparql-update":
        return "update"
    parameters = parse_qs(urlsplit(request.path).query)
    if request.body is not None and request.content_type in ("", "application/x-www-form-urlencoded"):
        with contextlib.suppress(UnicodeDecodeError):
            parameters.update(parse_qs(request.body.decode("utf-8")))
    if "update" in parameters:
        return "update"
    if "query" in parameters:
        return "query"
    return "update" if "update" in test.id else "query"


def _endpoint_path(gateway: RunningGateway, test: ProtocolTest, request: HttpRequest) -> str:
    assert request.path.startswith("/sparql/"), request.path
    endpoint = gateway.query_path if _operation(test, request) == "query" else gateway.update_path
    return endpoint + request.path.removeprefix("/sparql/")


def _boolean(reply: Reply) -> bool:
    if reply.media_type == "application/sparql-results+xml":
        node = ET.fromstring(reply.body).find(f"{SRX}boolean")
        assert node is not None and node.text in ("true", "false"), reply.body
        return node.text == "true"
    value = json.loads(reply.body)["boolean"]
    assert isinstance(value, bool)
    return value


def _check_format(reply: Reply, expected: str) -> None:
    if expected == "boolean":
        assert reply.media_type in BOOLEAN_TYPES, reply.media_type
        _boolean(reply)
    elif expected == "tabular":
        assert reply.media_type in TABULAR_TYPES, reply.media_type
        if "json" in reply.media_type:
            assert isinstance(json.loads(reply.body)["results"]["bindings"], list)
        elif "xml" in reply.media_type:
            assert ET.fromstring(reply.body).find(f"{SRX}results") is not None
    elif expected == "RDF":
        assert reply.media_type in RDF_TYPES, reply.media_type
        list(parse(reply.body, format=RDF_TYPES[reply.media_type]))  # well-formed
    else:
        raise AssertionError(f"unknown mf:expectedFormat {expected!r}")


def _load(gateway: RunningGateway, test: ProtocolTest) -> None:
    """Empty store, then the sentinel quads and the test's ut:graphData in their named graphs."""
    blocks = [SENTINEL, f"GRAPH <{SENTINEL_GRAPH}> {{ {SENTINEL} }}"]
    blocks += [f"GRAPH <{iri}> {{ {path.read_text(encoding='utf-8')} }}" for iri, path in test.graph_data]
    reply = gateway.update(f"DROP ALL ; INSERT DATA {{ {' '.join(blocks)} }}")
    assert reply.status == 200, reply.body


def _sentinels_intact(gateway: RunningGateway) -> bool:
    return gateway.ask(f"ASK {{ {SENTINEL} GRAPH <{SENTINEL_GRAPH}> {{ {SENTINEL} }} }}")


def _params(test: ProtocolTest) -> object:
    marks = []
    if test.id in EXPECTED_FAILURES:
        marks.append(pytest.mark.xfail(reason=EXPECTED_FAILURES[test.id], strict=True))
    return pytest.param(test, id=test.id, marks=marks)


def test_manifest_is_complete() -> None:
    """Every manifest entry was read, with at least one request each (guards the reader)."""
    assert len(TESTS) == 34
    assert all(test.requests and all(r.status_classes for r in test.requests) for test in TESTS)
    assert {test.id for test in TESTS} >= {"query_get", "query_multiple_dataset", "bad_update_dataset_conflict"}


@pytest.mark.parametrize("test", [_params(test) for test in TESTS])
def test_w3c_protocol(gateway: RunningGateway, test: ProtocolTest) -> None:
    _load(gateway, test)
    for step, request in enumerate(test.requests):
        reply = gateway.request(
            request.method, _endpoint_path(gateway, test, request), request.body, dict(request.headers)
        )
        where = f"{test.id} request {step + 1}: {request.method} {request.path} -> {reply.status} {reply.body[:300]!r}"
        assert reply.status // 100 in request.status_classes, where
        if reply.status >= 400:
            body = reply.json()
            assert set(body) == {"error", "error_description", "status_code"}, where
            assert body["status_code"] == reply.status, where
        if request.result_format is not None:
            _check_format(reply, request.result_format)
        if request.boolean is not None:
            assert _boolean(reply) is request.boolean, where
    if all(request.status_classes == {4} for request in test.requests):
        assert _sentinels_intact(gateway), f"{test.id}: a refused request changed the store"
