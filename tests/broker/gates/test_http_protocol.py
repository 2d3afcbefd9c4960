"""The HTTP gate as PROTOCOL.md "HTTP: SPARQL 1.1 Protocol" specifies it, over real sockets.

Protects: the three query forms and two update forms (media types compared without parameters),
the update reply (200 JSON counting the quads really added/removed, sent only once the change is
visible), the protocol datasets (default-graph-uri, named-graph-uri, using-graph-uri,
using-named-graph-uri), content negotiation (JSON default, XML, CSV, TSV; Turtle, N-Triples,
JSON-LD; q-values; 406), CORS, the error JSON with its status (400, 404, 405, 413, 415, 429),
survival of garbage input, and /metrics in Prometheus text with counters that move.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import socket
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import pytest
from pyoxigraph import Literal, NamedNode, RdfFormat, Triple, parse

from gateway.appliance.config import Config

if TYPE_CHECKING:
    from tools.launcher import InProcessGateway, Reply, RunningGateway

FORM = "application/x-www-form-urlencoded"
SRX = "{http://www.w3.org/2005/sparql-results#}"
XSD_INTEGER = "http://www.w3.org/2001/XMLSchema#integer"
ERROR_KEYS = {"error", "error_description", "status_code"}


@pytest.fixture
def ex() -> str:
    """A fresh IRI namespace, so the tests sharing one gateway never see each other's data."""
    return f"http://example.org/{uuid.uuid4().hex}/"


def assert_error(reply: Reply, status: int, error: str | None = None) -> dict[str, Any]:
    """The reply is the protocol's error JSON, exactly, with a matching HTTP status."""
    assert reply.status == status, reply.body
    assert reply.media_type == "application/json"
    body = reply.json()
    assert set(body) == ERROR_KEYS, body
    assert body["status_code"] == status
    assert isinstance(body["error"], str) and body["error"]
    assert isinstance(body["error_description"], str) and body["error_description"]
    if error is not None:
        assert body["error"] == error
    return body


def values(gateway: RunningGateway, sparql: str, variable: str = "o", **kwargs: Any) -> set[str]:
    return {row[variable] for row in gateway.select(sparql, **kwargs) if variable in row}


def insert(gateway: RunningGateway, data: str) -> None:
    reply = gateway.update(f"INSERT DATA {{ {data} }}")
    assert reply.status == 200, reply.body


# -- the query and update forms --------------------------------------------------------------


def test_query_via_get(gateway: RunningGateway, ex: str) -> None:
    insert(gateway, f"<{ex}s> <{ex}p> 42")
    sparql = f"SELECT ?o WHERE {{ <{ex}s> <{ex}p> ?o }}"
    reply = gateway.request("GET", f"/query?{urlencode({'query': sparql})}")
    assert reply.status == 200, reply.body
    assert reply.media_type == "application/sparql-results+json"
    assert reply.json()["results"]["bindings"] == [{"o": {"type": "literal", "value": "42", "datatype": XSD_INTEGER}}]


def test_query_via_post_form(gateway: RunningGateway, ex: str) -> None:
    insert(gateway, f"<{ex}s> <{ex}p> 'form'")
    body = urlencode({"query": f"SELECT ?o WHERE {{ <{ex}s> <{ex}p> ?o }}"})
    reply = gateway.request("POST", "/query", body, {"Content-Type": FORM})
    assert reply.status == 200, reply.body
    assert [row["o"]["value"] for row in reply.json()["results"]["bindings"]] == ["form"]


@pytest.mark.parametrize(
    "content_type",
    ["application/sparql-query", "application/sparql-query; charset=UTF-8", "Application/SPARQL-Query"],
)
def test_query_via_post_direct(gateway: RunningGateway, ex: str, content_type: str) -> None:
    insert(gateway, f"<{ex}s> <{ex}p> 'direct'")
    reply = gateway.request(
        "POST", "/query", f"SELECT ?o WHERE {{ <{ex}s> <{ex}p> ?o }}", {"Content-Type": content_type}
    )
    assert reply.status == 200, reply.body
    assert [row["o"]["value"] for row in reply.json()["results"]["bindings"]] == ["direct"]


def test_query_accepts_non_ascii_utf8(gateway: RunningGateway, ex: str) -> None:
    insert(gateway, f"<{ex}s> <{ex}p> 'café ☕ 𝄞'")
    assert values(gateway, f"SELECT ?o WHERE {{ <{ex}s> <{ex}p> ?o }}") == {"café ☕ 𝄞"}
    assert gateway.ask(f"ASK {{ <{ex}s> <{ex}p> 'café ☕ 𝄞' }}")


def test_update_via_post_form(gateway: RunningGateway, ex: str) -> None:
    body = urlencode({"update": f"INSERT DATA {{ <{ex}s> <{ex}p> 1, 2 }}"})
    reply = gateway.request("POST", "/update", body, {"Content-Type": FORM})
    assert reply.status == 200, reply.body
    assert reply.media_type == "application/json"
    assert reply.json()["added"] == 2 and reply.json()["removed"] == 0
    assert values(gateway, f"SELECT ?o WHERE {{ <{ex}s> <{ex}p> ?o }}") == {"1", "2"}


@pytest.mark.parametrize("content_type", ["application/sparql-update", "application/sparql-update; charset=UTF-8"])
def test_update_via_post_direct_counts_real_changes(gateway: RunningGateway, ex: str, content_type: str) -> None:
    def update(sparql: str) -> dict[str, Any]:
        reply = gateway.request("POST", "/update", sparql, {"Content-Type": content_type})
        assert reply.status == 200, reply.body
        assert reply.media_type == "application/json"
        return reply.json()

    first = update(f"INSERT DATA {{ <{ex}s> <{ex}p> 1, 2, 3 }}")
    assert (first["added"], first["removed"]) == (3, 0)
    again = update(f"INSERT DATA {{ <{ex}s> <{ex}p> 1, 4 }}")  # 1 is already there: not added
    assert (again["added"], again["removed"]) == (1, 0)
    delete = update(f"DELETE WHERE {{ <{ex}s> <{ex}p> ?o }}")
    assert (delete["added"], delete["removed"]) == (0, 4)
    assert not gateway.ask(f"ASK {{ <{ex}s> ?p ?o }}")


def test_update_reply_is_sent_after_the_change_is_visible(gateway: RunningGateway, ex: str) -> None:
    """Each reply is followed at once by a query on another connection: it must see the whole update."""
    numbers = " ".join(str(n) for n in range(300))
    for round_ in range(15):
        reply = gateway.update(
            f"DELETE {{ <{ex}counter> <{ex}value> ?old }} INSERT {{ <{ex}counter> <{ex}value> {round_} }} "
            f"WHERE {{ OPTIONAL {{ <{ex}counter> <{ex}value> ?old }} }} ;\n"
            f"INSERT {{ ?s <{ex}round> {round_} }} WHERE {{ VALUES ?n {{ {numbers} }} "
            f'BIND(IRI(CONCAT("{ex}item", STR(?n))) AS ?s) }}'
        )
        assert reply.status == 200, reply.body
        assert reply.json()["added"] == 301
        rows = gateway.select(
            f"SELECT ?v (COUNT(?s) AS ?n) WHERE {{ <{ex}counter> <{ex}value> ?v . ?s <{ex}round> {round_} }} "
            "GROUP BY ?v"
        )
        assert rows == [{"v": str(round_), "n": "300"}]


# -- protocol datasets ------------------------------------------------------------------------


@pytest.fixture
def graphs(gateway: RunningGateway, ex: str) -> tuple[str, str]:
    """<s> <p> 0 in the default graph, <s> <p> 1 in g1 and <s> <p> 2 in g2."""
    g1, g2 = f"{ex}g1", f"{ex}g2"
    insert(gateway, f"<{ex}s> <{ex}p> 0 . GRAPH <{g1}> {{ <{ex}s> <{ex}p> 1 }} GRAPH <{g2}> {{ <{ex}s> <{ex}p> 2 }}")
    return g1, g2


def test_default_graph_uri_sets_the_default_graph(gateway: RunningGateway, ex: str, graphs: tuple[str, str]) -> None:
    g1, g2 = graphs
    sparql = f"SELECT ?o WHERE {{ <{ex}s> <{ex}p> ?o }}"
    assert "0" in values(gateway, sparql)
    assert values(gateway, sparql, params=[("default-graph-uri", g1)]) == {"1"}
    assert values(gateway, sparql, params=[("default-graph-uri", g1), ("default-graph-uri", g2)]) == {"1", "2"}
    via_get = gateway.request("GET", "/query", params=[("query", sparql), ("default-graph-uri", g2)])
    assert [row["o"]["value"] for row in via_get.json()["results"]["bindings"]] == ["2"]
    via_form = gateway.request(
        "POST", "/query", urlencode([("query", sparql), ("default-graph-uri", g2)]), {"Content-Type": FORM}
    )
    assert [row["o"]["value"] for row in via_form.json()["results"]["bindings"]] == ["2"]


def test_named_graph_uri_sets_the_named_graphs(gateway: RunningGateway, ex: str, graphs: tuple[str, str]) -> None:
    g1, g2 = graphs
    sparql = f"SELECT ?g ?o WHERE {{ GRAPH ?g {{ <{ex}s> <{ex}p> ?o }} }}"
    everything = {(row["g"], row["o"]) for row in gateway.select(sparql)}
    assert {(g1, "1"), (g2, "2")} <= everything
    assert {(row["g"], row["o"]) for row in gateway.select(sparql, params=[("named-graph-uri", g2)])} == {(g2, "2")}
    both = [("named-graph-uri", g1), ("named-graph-uri", g2), ("default-graph-uri", g2)]
    assert {(row["g"], row["o"]) for row in gateway.select(sparql, params=both)} == {(g1, "1"), (g2, "2")}
    assert values(gateway, f"SELECT ?o WHERE {{ <{ex}s> <{ex}p> ?o }}", params=both) == {"2"}


def test_protocol_dataset_overrides_from_in_the_query(
    gateway: RunningGateway, ex: str, graphs: tuple[str, str]
) -> None:
    g1, g2 = graphs
    sparql = f"SELECT ?o FROM <{g1}> WHERE {{ <{ex}s> <{ex}p> ?o }}"
    assert values(gateway, sparql) == {"1"}
    assert values(gateway, sparql, params=[("default-graph-uri", g2)]) == {"2"}


def test_using_graph_uri_sets_the_update_dataset(gateway: RunningGateway, ex: str, graphs: tuple[str, str]) -> None:
    g1, g2 = graphs
    copy = f"INSERT {{ GRAPH <{ex}out> {{ <{ex}s> <{ex}copied> ?o }} }} WHERE {{ <{ex}s> <{ex}p> ?o }}"
    reply = gateway.update(copy, params=[("using-graph-uri", g1)])
    assert reply.status == 200, reply.body
    copied = f"SELECT ?o WHERE {{ GRAPH <{ex}out> {{ <{ex}s> <{ex}copied> ?o }} }}"
    assert values(gateway, copied) == {"1"}
    form = urlencode([("update", copy), ("using-graph-uri", g2)])
    assert gateway.request("POST", "/update", form, {"Content-Type": FORM}).status == 200
    assert values(gateway, copied) == {"1", "2"}
    assert gateway.update(copy).status == 200  # no protocol dataset: the store's default graph
    assert "0" in values(gateway, copied)


def test_using_named_graph_uri_sets_the_update_named_graphs(
    gateway: RunningGateway, ex: str, graphs: tuple[str, str]
) -> None:
    g1, g2 = graphs
    reply = gateway.update(
        f"INSERT {{ GRAPH <{ex}out> {{ ?g <{ex}had> ?o }} }} WHERE {{ GRAPH ?g {{ <{ex}s> <{ex}p> ?o }} }}",
        params=[("using-named-graph-uri", g2)],
    )
    assert reply.status == 200, reply.body
    assert reply.json()["added"] == 1
    rows = gateway.select(f"SELECT ?g ?o WHERE {{ GRAPH <{ex}out> {{ ?g <{ex}had> ?o }} }}")
    assert rows == [{"g": g2, "o": "2"}]


def test_using_graph_uri_conflicting_with_with_is_refused(gateway: RunningGateway, ex: str) -> None:
    reply = gateway.update(
        f"WITH <{ex}g> INSERT {{ <{ex}s> <{ex}p> 9 }} WHERE {{}}", params=[("using-graph-uri", f"{ex}g1")]
    )
    assert_error(reply, 400)
    assert not gateway.ask(f"ASK {{ GRAPH ?g {{ <{ex}s> <{ex}p> 9 }} }}")


def test_invalid_graph_iri_parameter_is_400(gateway: RunningGateway) -> None:
    reply = gateway.query("ASK {}", params=[("default-graph-uri", "not an iri")])
    assert "default-graph-uri" in assert_error(reply, 400)["error_description"]


# -- content negotiation ----------------------------------------------------------------------


@pytest.fixture
def two_rows(gateway: RunningGateway, ex: str) -> str:
    insert(gateway, f"<{ex}a> <{ex}p> 1 . <{ex}b> <{ex}p> 'x,y' .")
    return f"SELECT ?s ?o WHERE {{ ?s <{ex}p> ?o }} ORDER BY ?s"


def test_select_defaults_to_sparql_json(gateway: RunningGateway, ex: str, two_rows: str) -> None:
    for accept in (None, "*/*", "application/*", "application/sparql-results+json", "application/json"):
        reply = gateway.query(two_rows, accept=accept)
        assert reply.status == 200, (accept, reply.body)
        assert reply.media_type in ("application/sparql-results+json", "application/json"), accept
        body = reply.json()
        assert body["head"]["vars"] == ["s", "o"]
        assert [row["s"]["value"] for row in body["results"]["bindings"]] == [f"{ex}a", f"{ex}b"]
    assert gateway.query(two_rows).media_type == "application/sparql-results+json"


def test_select_as_xml(gateway: RunningGateway, ex: str, two_rows: str) -> None:
    reply = gateway.query(two_rows, accept="application/sparql-results+xml")
    assert reply.status == 200 and reply.media_type == "application/sparql-results+xml"
    root = ET.fromstring(reply.body)
    assert [v.get("name") for v in root.iter(f"{SRX}variable")] == ["s", "o"]
    results = list(root.iter(f"{SRX}result"))
    assert len(results) == 2
    first = {b.get("name"): b[0] for b in results[0].iter(f"{SRX}binding")}
    assert first["s"].tag == f"{SRX}uri" and first["s"].text == f"{ex}a"
    assert first["o"].tag == f"{SRX}literal" and first["o"].get("datatype") == XSD_INTEGER and first["o"].text == "1"


def test_select_as_csv(gateway: RunningGateway, ex: str, two_rows: str) -> None:
    reply = gateway.query(two_rows, accept="text/csv")
    assert reply.status == 200 and reply.media_type == "text/csv"
    assert list(csv.reader(io.StringIO(reply.text))) == [["s", "o"], [f"{ex}a", "1"], [f"{ex}b", "x,y"]]


def test_select_as_tsv(gateway: RunningGateway, ex: str, two_rows: str) -> None:
    reply = gateway.query(two_rows, accept="text/tab-separated-values")
    assert reply.status == 200 and reply.media_type == "text/tab-separated-values"
    lines = [line.split("\t") for line in reply.text.splitlines()]
    assert lines == [["?s", "?o"], [f"<{ex}a>", "1"], [f"<{ex}b>", '"x,y"']]


@pytest.mark.parametrize(
    ("accept", "media_type"),
    [
        ("text/csv;q=0.1, application/sparql-results+xml;q=0.9", "application/sparql-results+xml"),
        ("application/sparql-results+xml;q=0.2, text/csv", "text/csv"),
        ("text/csv;q=0, */*;q=0.1", "application/sparql-results+json"),
        ("image/png, text/tab-separated-values;q=0.5", "text/tab-separated-values"),
        ("text/*", "text/csv"),
        ("application/sparql-results+json;q=0, */*", "application/sparql-results+xml"),
        ("application/json;q=0, application/*;q=0.8, text/csv;q=0.5", "application/sparql-results+xml"),
    ],
)
def test_q_values_are_honoured(gateway: RunningGateway, two_rows: str, accept: str, media_type: str) -> None:
    reply = gateway.query(two_rows, accept=accept)
    assert reply.status == 200, reply.body
    assert reply.media_type == media_type


@pytest.mark.parametrize("answer", [True, False])
def test_ask_as_json_and_xml(gateway: RunningGateway, ex: str, answer: bool) -> None:
    insert(gateway, f"<{ex}s> <{ex}p> 1")
    sparql = f"ASK {{ <{ex}s> <{ex}p> {1 if answer else 2} }}"
    reply = gateway.query(sparql)
    assert reply.media_type == "application/sparql-results+json"
    assert reply.json()["boolean"] is answer
    xml = gateway.query(sparql, accept="application/sparql-results+xml")
    assert xml.media_type == "application/sparql-results+xml"
    assert ET.fromstring(xml.body).find(f"{SRX}boolean").text == str(answer).lower()  # type: ignore[union-attr]


def expected_graph(ex: str) -> set[Triple]:
    return {
        Triple(NamedNode(f"{ex}a"), NamedNode(f"{ex}q"), Literal("1", datatype=NamedNode(XSD_INTEGER))),
        Triple(NamedNode(f"{ex}b"), NamedNode(f"{ex}q"), Literal("x,y")),
    }


@pytest.mark.parametrize(
    ("accept", "media_type", "rdf_format"),
    [
        (None, "text/turtle", RdfFormat.TURTLE),
        ("text/turtle", "text/turtle", RdfFormat.TURTLE),
        ("application/n-triples", "application/n-triples", RdfFormat.N_TRIPLES),
        ("application/ld+json", "application/ld+json", RdfFormat.JSON_LD),
        ("text/turtle;q=0.5, application/n-triples", "application/n-triples", RdfFormat.N_TRIPLES),
        ("application/sparql-results+json, application/ld+json;q=0.1", "application/ld+json", RdfFormat.JSON_LD),
        # what SEPA clients send for every query (sepy): the graph in the RDF syntax of that family
        ("application/sparql-results+json", "application/ld+json", RdfFormat.JSON_LD),
        ("application/json", "application/ld+json", RdfFormat.JSON_LD),
        ("application/sparql-results+xml", "application/rdf+xml", RdfFormat.RDF_XML),
        # a graph type the header names wins over the fallback, whatever its q (the dashboard's console)
        ("application/sparql-results+json, text/turtle;q=0.9", "text/turtle", RdfFormat.TURTLE),
        ("text/turtle;q=0.5, application/json", "text/turtle", RdfFormat.TURTLE),
        # and the fallback wins over a wildcard: a JSON parser reads the body
        ("application/sparql-results+json, */*;q=0.1", "application/ld+json", RdfFormat.JSON_LD),
    ],
)
def test_construct_as_rdf(
    gateway: RunningGateway, ex: str, two_rows: str, accept: str | None, media_type: str, rdf_format: RdfFormat
) -> None:
    reply = gateway.query(f"CONSTRUCT {{ ?s <{ex}q> ?o }} WHERE {{ ?s <{ex}p> ?o }}", accept=accept)
    assert reply.status == 200, reply.body
    assert reply.media_type == media_type
    if rdf_format == RdfFormat.JSON_LD:
        assert isinstance(json.loads(reply.body), list | dict)
    assert {quad.triple for quad in parse(reply.body, format=rdf_format)} == expected_graph(ex)


@pytest.mark.parametrize(
    ("sparql", "accept"),
    [
        ("SELECT * WHERE { ?s ?p ?o } LIMIT 1", "image/png"),
        ("SELECT * WHERE { ?s ?p ?o } LIMIT 1", "text/turtle"),
        ("SELECT * WHERE { ?s ?p ?o } LIMIT 1", "application/sparql-results+json;q=0"),
        ("CONSTRUCT WHERE { ?s ?p ?o }", "text/csv, image/*"),
        ("CONSTRUCT WHERE { ?s ?p ?o }", "application/sparql-results+json, application/ld+json;q=0"),
    ],
)
def test_unsatisfiable_accept_is_406(gateway: RunningGateway, sparql: str, accept: str) -> None:
    assert_error(gateway.query(sparql, accept=accept), 406, "not_acceptable")


# -- CORS: see test_origin_policy.py ----------------------------------------------------------


def test_no_cors_headers_for_an_origin_nobody_allowed(gateway: RunningGateway) -> None:
    reply = gateway.request("GET", "/query?query=ASK%7B%7D", headers={"Origin": "http://dashboard.example"})
    assert reply.status == 200 and "Access-Control-Allow-Origin" not in reply.headers


# -- errors ----------------------------------------------------------------------------------


def test_query_syntax_error_names_line_and_column(gateway: RunningGateway) -> None:
    reply = gateway.query("SELECT ?s\nWHERE { ?s ?p ?o . FILTER( }")
    description = assert_error(reply, 400, "invalid_request")["error_description"]
    where = re.search(r"line (\d+), column (\d+)", description)
    assert where is not None, description
    assert int(where.group(1)) == 2
    assert 1 <= int(where.group(2)) <= len("WHERE { ?s ?p ?o . FILTER( }") + 1


def test_bad_update_leaves_the_store_unchanged(gateway: RunningGateway, ex: str) -> None:
    insert(gateway, f"<{ex}s> <{ex}p> 'kept'")
    before = gateway.select(f"SELECT ?s ?p ?o WHERE {{ ?s ?p ?o FILTER(STRSTARTS(STR(?s), '{ex}')) }}")
    syntax = gateway.update(
        f"DELETE DATA {{ <{ex}s> <{ex}p> 'kept' }} ;\nCLEAR XYZ"
    )  # first operation fine, second one malformed
    description = assert_error(syntax, 400, "invalid_request")["error_description"]
    assert re.search(r"line 2, column \d+", description), description
    gateway.update(f"CREATE SILENT GRAPH <{ex}g>")
    runtime = gateway.update(f"INSERT DATA {{ <{ex}t> <{ex}p> 2 }} ; CREATE GRAPH <{ex}g>")  # fails when run
    assert_error(runtime, 400)
    after = gateway.select(f"SELECT ?s ?p ?o WHERE {{ ?s ?p ?o FILTER(STRSTARTS(STR(?s), '{ex}')) }}")
    assert after == before


@pytest.mark.parametrize(
    ("method", "path", "body", "content_type"),
    [
        ("GET", "/query", None, None),
        ("GET", "/query?default-graph-uri=http%3A%2F%2Fexample.org%2Fg", None, None),
        ("POST", "/query", "default-graph-uri=http%3A%2F%2Fexample.org%2Fg", FORM),
        ("POST", "/update", "using-graph-uri=http%3A%2F%2Fexample.org%2Fg", FORM),
        ("POST", "/update", "", FORM),
    ],
    ids=["get-no-query", "get-only-dataset", "form-no-query", "form-no-update", "form-empty"],
)
def test_missing_parameter_is_400(
    gateway: RunningGateway, method: str, path: str, body: str | None, content_type: str | None
) -> None:
    reply = gateway.request(method, path, body, {"Content-Type": content_type} if content_type else {})
    assert "missing" in assert_error(reply, 400, "invalid_request")["error_description"]


def test_duplicate_parameter_is_400(gateway: RunningGateway, ex: str) -> None:
    insert_a, insert_b = (f"INSERT DATA {{ <{ex}{name}> <{ex}p> 1 }}" for name in "ab")
    cases = [
        gateway.request("GET", "/query", params=[("query", "ASK {}"), ("query", "SELECT * {}")]),
        gateway.request(
            "POST", "/query", urlencode([("query", "ASK {}"), ("query", "ASK {}")]), {"Content-Type": FORM}
        ),
        gateway.request(
            "POST", "/update", urlencode([("update", insert_a), ("update", insert_b)]), {"Content-Type": FORM}
        ),
        gateway.request(  # in the URL and in the body
            "POST",
            f"/update?{urlencode({'update': insert_a})}",
            urlencode({"update": insert_b}),
            {"Content-Type": FORM},
        ),
        gateway.request(
            "POST", f"/query?{urlencode({'query': 'ASK {}'})}", "ASK {}", {"Content-Type": "application/sparql-query"}
        ),
    ]
    for reply in cases:
        assert_error(reply, 400, "invalid_request")
    assert not gateway.ask(f"ASK {{ ?s <{ex}p> ?o }}")


def test_wrong_operation_parameter_is_400(gateway: RunningGateway, ex: str) -> None:
    update = f"INSERT DATA {{ <{ex}s> <{ex}p> 1 }}"
    assert_error(gateway.request("GET", "/query", params=[("query", "ASK {}"), ("update", update)]), 400)
    assert_error(
        gateway.request(
            "POST", "/update", urlencode([("update", update), ("query", "ASK {}")]), {"Content-Type": FORM}
        ),
        400,
    )
    assert not gateway.ask(f"ASK {{ <{ex}s> ?p ?o }}")


# not "/": it is the dashboard's
@pytest.mark.parametrize("path", ["/nothing-here", "/sparql", "/query/more", "/updates", "/QUERY"])
def test_wrong_path_is_404(gateway: RunningGateway, path: str) -> None:
    assert_error(gateway.request("GET", f"{path}?query=ASK%7B%7D"), 404, "not_found")
    assert_error(gateway.request("POST", path, "ASK {}", {"Content-Type": "application/sparql-query"}), 404)


def test_wrong_method_is_405(gateway: RunningGateway, ex: str) -> None:
    update = quote(f"INSERT DATA {{ <{ex}s> <{ex}p> 1 }}")
    assert_error(gateway.request("GET", f"/update?update={update}"), 405, "method_not_allowed")
    assert_error(gateway.request("PUT", "/query?query=ASK%7B%7D", "", {"Content-Type": FORM}), 405)
    assert_error(gateway.request("DELETE", "/query?query=ASK%7B%7D"), 405)
    assert_error(gateway.request("PUT", "/update", f"INSERT DATA {{ <{ex}s> <{ex}p> 1 }}", {"Content-Type": FORM}), 405)
    # a HEAD with a body ran the update (and the cross-origin check looks at unsafe methods only)
    insert = f"INSERT DATA {{ <{ex}s> <{ex}p> 1 }}"
    head = gateway.request("HEAD", "/update", insert, {"Content-Type": "application/sparql-update"})
    assert head.status == 405
    assert not gateway.ask(f"ASK {{ <{ex}s> ?p ?o }}")


@pytest.mark.parametrize("form", [False, True], ids=["direct", "form"])
def test_too_large_body_is_413(gateway: RunningGateway, ex: str, form: bool) -> None:
    sparql = f"INSERT DATA {{ <{ex}s> <{ex}p> '{'a' * (1 << 20)}' }}"  # > http.max_request_bytes (1 MiB)
    if form:
        reply = gateway.request("POST", "/update", urlencode({"update": sparql}), {"Content-Type": FORM})
    else:
        reply = gateway.update(sparql)
    assert_error(reply, 413, "request_too_large")
    assert not gateway.ask(f"ASK {{ <{ex}s> ?p ?o }}")
    assert gateway.update(f"INSERT DATA {{ <{ex}s> <{ex}p> '{'a' * 1000}' }}").status == 200  # small is fine


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/query", "text/plain"),
        ("/query", "application/sparql-update"),
        ("/query", "application/json"),
        ("/update", "text/plain"),
        ("/update", "application/sparql-query"),
        ("/update", "multipart/form-data; boundary=x"),
        ("/update", None),
    ],
)
def test_wrong_media_type_is_415(gateway: RunningGateway, ex: str, path: str, content_type: str | None) -> None:
    body = "ASK {}" if path == "/query" else f"INSERT DATA {{ <{ex}s> <{ex}p> 1 }}"
    reply = gateway.request("POST", path, body, {"Content-Type": content_type} if content_type else {})
    assert_error(reply, 415, "unsupported_media_type")
    assert not gateway.ask(f"ASK {{ <{ex}s> ?p ?o }}")


def _slow_update(ex: str, size: int) -> str:
    """An update that holds the update thread for a while (a size**3-row aggregate), then adds one quad."""
    numbers = " ".join(str(n) for n in range(size))
    return (
        f"INSERT {{ <{ex}slow> <{ex}sum> ?n }} WHERE {{ SELECT (SUM(?a * ?b + ?c) AS ?n) "
        f"WHERE {{ VALUES ?a {{ {numbers} }} VALUES ?b {{ {numbers} }} VALUES ?c {{ {numbers} }} }} }}"
    )


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_full_scheduler_queue_is_429(start_gateway: Callable[..., RunningGateway], tmp_path: Path, ex: str) -> None:
    """queue_size = 1 (config file): while a slow update is in flight, concurrent requests get 429 and
    nothing of a refused update is applied; the slow one completes and the queue frees again."""
    config = tmp_path / "gateway.toml"
    config.write_text("[scheduler]\nqueue_size = 1\n")
    gateway = start_gateway(config=config)
    with ThreadPoolExecutor(max_workers=8) as pool:
        slow = pool.submit(gateway.update, _slow_update(ex, 160))
        _wait_for(lambda: slow.done() or gateway.metrics()["sepa_scheduler_in_flight"] == 1)
        assert not slow.done(), "the slow update finished before the concurrent requests: make it slower"
        updates = [pool.submit(gateway.update, f"INSERT DATA {{ <{ex}r{n}> <{ex}p> {n} }}") for n in range(5)]
        queries = [pool.submit(gateway.query, f"ASK {{ <{ex}slow> ?p ?o }}") for _ in range(2)]
        update_replies = [future.result(30) for future in updates]
        query_replies = [future.result(30) for future in queries]
        slow_reply = slow.result(60)
    assert slow_reply.status == 200, slow_reply.body
    refused = [reply for reply in update_replies + query_replies if reply.status == 429]
    assert refused, [reply.status for reply in update_replies + query_replies]
    for reply in refused:
        assert_error(reply, 429, "too_many_requests")
    for n, reply in enumerate(update_replies):
        assert reply.status in (200, 429), reply.body
        assert gateway.ask(f"ASK {{ <{ex}r{n}> <{ex}p> {n} }}") is (reply.status == 200)
    assert gateway.ask(f"ASK {{ <{ex}slow> <{ex}sum> ?n }}")
    assert gateway.metrics()["sepa_scheduler_rejected_total"] == len(refused)
    assert gateway.update(f"INSERT DATA {{ <{ex}after> <{ex}p> 1 }}").status == 200


def test_429_while_the_queue_is_held(in_process_gateway: Callable[[Config], InProcessGateway], ex: str) -> None:
    """Deterministic variant in process: one request holds the only slot; HTTP requests are refused
    (update not applied) until it is released."""
    config = Config()
    config.scheduler.queue_size = 1
    endpoint = in_process_gateway(config)
    scheduler = endpoint.gateway.scheduler
    release = threading.Event()
    held = endpoint.submit(scheduler.serialized(release.wait, 10))
    try:
        _wait_for(lambda: scheduler.in_flight == 1)
        assert_error(endpoint.update(f"INSERT DATA {{ <{ex}s> <{ex}p> 1 }}"), 429, "too_many_requests")
        assert_error(endpoint.query("ASK {}"), 429, "too_many_requests")
    finally:
        release.set()
    assert held.result(10) is True
    _wait_for(lambda: scheduler.in_flight == 0)
    assert not endpoint.ask(f"ASK {{ <{ex}s> ?p ?o }}")
    assert endpoint.update(f"INSERT DATA {{ <{ex}s> <{ex}p> 1 }}").status == 200
    assert endpoint.ask(f"ASK {{ <{ex}s> <{ex}p> 1 }}")


# -- garbage ---------------------------------------------------------------------------------


def test_invalid_utf8_is_400_and_changes_nothing(gateway: RunningGateway, ex: str) -> None:
    update = f"INSERT DATA {{ <{ex}s> <{ex}p> '".encode() + b"\xff\xfe\xc3(" + b"' }"
    assert_error(gateway.request("POST", "/update", update, {"Content-Type": "application/sparql-update"}), 400)
    query = b"ASK { ?s ?p '\xc3\x28' }"
    assert_error(gateway.request("POST", "/query", query, {"Content-Type": "application/sparql-query"}), 400)
    escaped = "update=" + quote(f"INSERT DATA {{ <{ex}s> <{ex}p> '") + "%FF%FE" + quote("' }")
    assert_error(gateway.request("POST", "/update", escaped, {"Content-Type": FORM}), 400)  # bad UTF-8 behind %XX
    raw_form = b"update=" + quote(f"INSERT DATA {{ <{ex}s> <{ex}p> '").encode() + b"\xff" + quote("' }").encode()
    assert_error(gateway.request("POST", "/update", raw_form, {"Content-Type": FORM}), 400)
    assert not gateway.ask(f"ASK {{ <{ex}s> ?p ?o }}")


def test_invalid_utf8_behind_url_escapes_is_400_not_a_replacement_character(gateway: RunningGateway, ex: str) -> None:
    """%FF in a URL parameter was decoded to U+FFFD: the query matched a stored "\ufffd" and
    answered 200 with its row, where a form body holding the same %FF is a 400."""
    insert(gateway, f"<{ex}s> <{ex}p> '\ufffd'")
    prefix, suffix = quote(f"SELECT ?s WHERE {{ ?s <{ex}p> '"), quote("' }")
    assert_error(gateway.request("GET", f"/query?query={prefix}%FF{suffix}"), 400, "invalid_request")
    form = f"query={prefix}%FF{suffix}"
    assert_error(
        gateway.request("POST", f"/query?default-graph-uri={quote(ex, safe='')}%FF", form, {"Content-Type": FORM}), 400
    )
    assert values(gateway, f"SELECT ?s WHERE {{ ?s <{ex}p> '\ufffd' }}", "s") == {f"{ex}s"}
    reply = gateway.request("GET", f"/query?query={prefix}%EF%BF%BD{suffix}")  # the same character, well encoded
    assert reply.status == 200, reply.body
    assert len(reply.json()["results"]["bindings"]) == 1


@pytest.mark.parametrize("charset", ["UTF-16", "latin-1", "no-such-charset"])
def test_non_utf8_charset_is_refused(gateway: RunningGateway, ex: str, charset: str) -> None:
    update = f"INSERT DATA {{ <{ex}s> <{ex}p> 1 }}"
    body = update.encode("utf-16") if charset == "UTF-16" else update.encode("ascii")
    reply = gateway.request("POST", "/update", body, {"Content-Type": f"application/sparql-update; charset={charset}"})
    assert_error(reply, 400)
    assert not gateway.ask(f"ASK {{ <{ex}s> ?p ?o }}")


def test_binary_junk_bodies_are_400(gateway: RunningGateway) -> None:
    junk = bytes(range(256)) * 8 + uuid.uuid4().bytes
    for path, content_type in (
        ("/query", "application/sparql-query"),
        ("/update", "application/sparql-update"),
        ("/query", FORM),
        ("/update", FORM),
    ):
        assert_error(gateway.request("POST", path, junk, {"Content-Type": content_type}), 400)
    before = gateway.metrics()
    assert not any(name.startswith('sepa_errors_total{error="internal_error"') for name in before)


def _raw_exchange(port: int, data: bytes, *, shut_write: bool = False, read: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(data)
        if shut_write:
            connection.shutdown(socket.SHUT_WR)
        received = b""
        if read:
            try:
                while chunk := connection.recv(65536):
                    received += chunk
            except (ConnectionResetError, TimeoutError):
                pass
        return received


def test_garbage_connections_do_not_disturb_the_server(gateway: RunningGateway, ex: str) -> None:
    port = gateway.http_port
    half_update = (
        b"POST /update HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sparql-update\r\n"
        b"Content-Length: 200\r\n\r\n" + f"INSERT DATA {{ <{ex}half> <{ex}p> 1 }} ; INSERT DA".encode()
    )
    _raw_exchange(port, half_update, read=False)  # body cut short, connection closed
    _raw_exchange(port, half_update, shut_write=True)  # body cut short, then half-closed
    _raw_exchange(port, b"POST /update HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty", read=False)  # headers cut short
    for junk in (
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),  # a TLS hello
        b"GARBAGE\x00\xff\r\n\r\n",
        b"GET /query?query=ASK%7B%7D HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -1\r\n\r\n",
        b"POST /query HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nASK {}\r\n",
    ):
        answer = _raw_exchange(port, junk)
        assert answer == b"" or re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:200]
    assert gateway.request("GET", "/query?query=ASK%7B%7D").json()["boolean"] is True
    assert not gateway.ask(f"ASK {{ <{ex}half> ?p ?o }}")
    assert gateway.update(f"INSERT DATA {{ <{ex}after> <{ex}p> 1 }}").status == 200
    assert gateway.ask(f"ASK {{ <{ex}after> <{ex}p> 1 }}")
    assert not any(name.startswith('sepa_errors_total{error="internal_error"') for name in gateway.metrics())


def _replies(answer: bytes) -> list[bytes]:
    """The status lines of the replies in `answer`."""
    return re.findall(rb"HTTP/\d\.\d \d{3} ", answer)


@pytest.mark.parametrize(
    ("version", "coding", "status"),
    [
        ("HTTP/1.1", "identity, chunked", b"HTTP/1.1 501 "),
        ("HTTP/1.1", "gzip, chunked", b"HTTP/1.1 501 "),
        ("HTTP/1.0", "chunked", b"HTTP/1.0 400 "),
    ],
)
def test_a_transfer_coding_not_served_is_refused_unread(
    gateway: RunningGateway, ex: str, version: str, coding: str, status: bytes
) -> None:
    """Before: aiohttp framed `identity, chunked` (any coding before chunked) as chunked alone and
    the update applied (200), and took chunked on HTTP/1.0 (faulty framing, RFC 9112 6.1). A proxy
    in front may frame such a request otherwise: now it is refused, its body unread, and the
    connection closed (the request after it is never read)."""
    update = f"INSERT DATA {{ <{ex}s> <{ex}p> 1 }}".encode()
    head = (
        f"POST /update {version}\r\nHost: 127.0.0.1\r\nContent-Type: application/sparql-update\r\n"
        f"Transfer-Encoding: {coding}\r\n\r\n"
    )
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(update), update)
    # on HTTP/1.1, a request after it (never read); HTTP/1.0 closes after one anyway
    after = b"GET /query?query=ASK%7B%7D HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" if version == "HTTP/1.1" else b""
    answer = _raw_exchange(gateway.http_port, head.encode() + body + after)
    assert _replies(answer) == [status], answer[:300]
    assert not gateway.ask(f"ASK {{ <{ex}s> ?p ?o }}")
    served = head.replace(f" {version}\r\n", " HTTP/1.1\r\nConnection: close\r\n").replace(coding, "chunked")
    assert _replies(_raw_exchange(gateway.http_port, served.encode() + body)) == [b"HTTP/1.1 200 "]
    assert gateway.ask(f"ASK {{ <{ex}s> <{ex}p> 1 }}")


@pytest.mark.parametrize("version", ["HTTP/2.0", "HTTP/0.9"])
def test_a_request_line_of_a_version_not_served_is_505(gateway: RunningGateway, version: str) -> None:
    """Before: `GET /query?... HTTP/2.0` was served, answered `HTTP/2.0 200 OK` in HTTP/1.1's text."""
    request = f"GET /query?query=ASK%7B%7D {version}\r\nHost: 127.0.0.1\r\n\r\n".encode()
    answer = _raw_exchange(gateway.http_port, request)
    assert _replies(answer) == [b"HTTP/1.1 505 "], answer[:300]
    assert b'"http_version_not_supported"' in answer


def test_pipelined_requests_on_one_connection(gateway: RunningGateway, ex: str) -> None:
    update = f"INSERT DATA {{ <{ex}s> <{ex}p> 7 }}".encode()
    query = quote(f"ASK {{ <{ex}s> <{ex}p> 7 }}")
    data = (
        b"POST /update HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sparql-update\r\n"
        + f"Content-Length: {len(update)}\r\n\r\n".encode()
        + update
        + f"GET /query?query={query} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    )
    answer = _raw_exchange(gateway.http_port, data)
    assert answer.count(b"HTTP/1.1 200 OK") == 2, answer
    assert answer.endswith(b'{"head":{},"boolean":true}')


# -- /metrics --------------------------------------------------------------------------------

SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*")*\})? \S+$'
)


def test_metrics_is_prometheus_text(gateway: RunningGateway) -> None:
    reply = gateway.request("GET", "/metrics")
    assert reply.status == 200
    assert reply.media_type == "text/plain"
    lines = [line for line in reply.text.splitlines() if line and not line.startswith("#")]
    assert lines
    for line in lines:
        assert SAMPLE.match(line), line
        float(line.rpartition(" ")[2])
    names = {line.split("{")[0].split(" ")[0] for line in lines}
    assert {"sepa_updates_total", "sepa_scheduler_in_flight", "sepa_scheduler_rejected_total"} <= names


def test_metrics_counters_move(gateway: RunningGateway, ex: str) -> None:
    not_found = 'sepa_errors_total{error="not_found",status="404"}'
    syntax = 'sepa_errors_total{error="invalid_request",status="400"}'
    before = gateway.metrics()
    gateway.request("GET", "/no/such/path")
    gateway.request("GET", "/no/such/path")
    gateway.query("ASK {")
    insert(gateway, f"<{ex}s> <{ex}p> 1")
    gateway.ask("ASK {}")
    after = gateway.metrics()
    assert after[not_found] == before.get(not_found, 0) + 2
    assert after[syntax] == before.get(syntax, 0) + 1
    assert after["sepa_updates_total"] == before["sepa_updates_total"] + 1
    assert after["sepa_http_updates_total"] == before.get("sepa_http_updates_total", 0) + 1
    assert after["sepa_http_queries_total"] == before.get("sepa_http_queries_total", 0) + 2


def test_prefer_return_representation_adds_the_quads_of_the_update(gateway: RunningGateway, ex: str) -> None:
    """RFC 7240: on request, the reply carries the update's own quads as N-Quads; never otherwise."""
    headers = {"Content-Type": "application/sparql-update", "Prefer": "return=representation"}
    sparql = f"INSERT DATA {{ GRAPH <{ex}g> {{ <{ex}pr> <{ex}p> 'é' }} }}"
    reply = gateway.request("POST", "/update", sparql, headers)
    assert reply.status == 200 and reply.headers["Preference-Applied"] == "return=representation"
    body = reply.json()
    assert (body["added"], body["removed"]) == (1, 0)
    assert body["quads"] == {"added": f'<{ex}pr> <{ex}p> "é" <{ex}g> .\n', "removed": ""}
    plain = gateway.update(f"DELETE DATA {{ GRAPH <{ex}g> {{ <{ex}pr> <{ex}p> 'é' }} }}")
    assert plain.json() == {"added": 0, "removed": 1, "notifications": 0}
    assert "Preference-Applied" not in plain.headers


def test_an_idle_kept_alive_connection_is_closed(start_gateway: Any) -> None:
    """A client that keeps a connection open without sending a request is not kept forever
    ([http] idle_timeout_s; aiohttp's own default was an hour): the gateway closes it."""
    import socket
    import time

    gateway = start_gateway(toml="[http]\nidle_timeout_s = 1.0\n")
    with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=10) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        received = b""
        while b"\r\n\r\n" not in received:
            received += client.recv(65536)
        assert received.startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        while client.recv(65536):  # the rest of the reply, then the end of the connection
            assert time.monotonic() - started < 8, "the idle connection is still open"
        assert time.monotonic() - started < 8
    assert gateway.running


def _trickle(client: Any, data: bytes, every_s: float, until_s: float) -> bytes:
    """Send `data` a byte at a time (slowloris) until the gateway answers or closes; what it answered."""
    import time

    client.settimeout(every_s)
    started = time.monotonic()
    for byte in data:
        try:
            client.sendall(bytes([byte]))
        except OSError:
            break
        try:
            answer = client.recv(65536)
        except TimeoutError:
            assert time.monotonic() - started < until_s, "the trickling request is still being read"
            continue
        return answer
    return b""


def test_a_request_head_that_trickles_in_is_timed_out(start_gateway: Any) -> None:
    """Slowloris: header lines a byte at a time. aiohttp has no header timeout; the gateway answers
    408 and closes once [http] request_timeout_s has passed since the request's first byte, while a
    connection that was merely idle longer than that still gets its next request served."""
    import socket
    import time

    gateway = start_gateway(toml="[http]\nrequest_timeout_s = 1.0\nidle_timeout_s = 30.0\n")
    head = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=10) as client:
        answer = _trickle(client, head, 0.1, 5)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert 1.0 <= time.monotonic() - started < 2.5
    body = b"INSERT DATA { <urn:slow> <urn:p> 1 }"
    request = b"POST /update HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sparql-update\r\n"
    request += b"Content-Length: %d\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=10) as client:
        client.sendall(request)
        answer = _trickle(client, body, 0.1, 5)  # a body that trickles in
    assert b" 408 " in answer.split(b"\r\n")[0] and b"request_timeout" in answer, answer
    assert not gateway.ask("ASK { <urn:slow> <urn:p> 1 }")
    with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=10) as client:
        time.sleep(1.5)  # idle, past the request limit but not the idle one
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert client.recv(65536).startswith(b"HTTP/1.1 200")
    assert gateway.metrics()['sepa_errors_total{error="request_timeout",status="408"}'] == 2


def test_a_request_the_parser_refuses_is_counted_and_its_header_never_logged(gateway: RunningGateway) -> None:
    """An Authorization header past aiohttp's 8 KB line limit: aiohttp answered 400 and logged an
    ERROR traceback quoting the start of the line, a Basic header's client id and most of its
    secret; any client could add a traceback per request. Its text/plain reply quoted the line
    back too (to whatever proxy logs reply bodies): now the gates' JSON error shape, quoting nothing."""
    secret = "U0VDUkVUU0VDUkVU"
    before = gateway.metric('sepa_errors_total{error="invalid_request",status="400"}')
    logged = len(gateway.log())
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=5) as sock:
            sock.sendall(
                b"POST /update HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic "
                + secret.encode() * 600
                + b"\r\nContent-Length: 0\r\n\r\n"
            )
            head, _, body = _whole_reply(sock).partition(b"\r\n\r\n")
            assert b" 400 " in head.split(b"\r\n")[0]
            assert b"application/json" in head and b"U0VD" not in body, body
            assert json.loads(body)["error"] == "invalid_request"
    gateway.wait_for_metric('sepa_errors_total{error="invalid_request",status="400"}', lambda v: v == before + 3)
    log = gateway.log()[logged:]
    assert secret not in log and "Traceback" not in log


def _whole_reply(sock: socket.socket) -> bytes:
    """What the gateway sent until it closed the connection (it closes after a parser's refusal)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


@pytest.mark.parametrize("form", [False, True], ids=["direct", "form"])
@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "GZIP "])
def test_a_coded_body_is_415_and_nothing_is_applied(gateway: RunningGateway, ex: str, form: bool, coding: str) -> None:
    """No SEPA client compresses a request. aiohttp inflated a gzip body itself: a body cut short
    was applied as the text it inflated to, and one that was not gzip was a 500 with a traceback."""
    sparql = f"INSERT DATA {{ <{ex}s> <{ex}p> 1 }}"
    text = (urlencode({"update": sparql}) if form else sparql).encode()
    headers = {"Content-Type": FORM if form else "application/sparql-update", "Content-Encoding": coding}
    for body in (gzip.compress(text), gzip.compress(text)[:-9], text, gzip.compress(text * 100_000)):
        reply = gateway.request("POST", "/update", body, headers)
        assert_error(reply, 415, "unsupported_media_type")
        assert reply.headers["Accept-Encoding"] == "identity"
    assert not gateway.ask(f"ASK {{ <{ex}s> ?p ?o }}")
    identity = {"Content-Type": headers["Content-Type"], "Content-Encoding": "identity"}
    assert gateway.request("POST", "/update", text, identity).status == 200
    assert gateway.ask(f"ASK {{ <{ex}s> <{ex}p> 1 }}")


def test_an_update_reply_with_its_quads_holds_no_copies_of_them() -> None:
    """The reply with the quads (`Prefer: return=representation`) was made as the N-Quads bytes,
    then str, then the JSON document's str, then its bytes, three copies of the quads at once
    beside the update's own (an update of 24 MB of quads: the gateway's peak RSS, VmHWM, +137-149
    MB with the header, +69-123 MB without; 40 MB of quads: every peak with it above every peak
    without, by 35-48 MB). Now it is made a slice at a time and the reply holds each once, never
    joined: here 20 MB of quads, what Python allocates to make the reply (tracemalloc's peak) is
    under 1.5 copies of them (3.0 before)."""
    import tracemalloc

    from aiohttp.test_utils import make_mocked_request
    from pyoxigraph import Quad
    from pyoxigraph import serialize as rdf_serialize

    from broker.core.results import UpdateResult
    from broker.gates.http import update_reply
    from broker.gates.replies import HeldReplies

    ex = "http://example.org/representation/"
    quads = frozenset(
        Quad(NamedNode(f"{ex}s{index}"), NamedNode(f"{ex}p"), Literal(chr(97 + index % 26) * 200_000))
        for index in range(100)
    )
    request = make_mocked_request("POST", "/update", headers={"Prefer": "return=representation"})
    text = rdf_serialize(sorted(quads, key=str), format=RdfFormat.N_QUADS).decode()
    expected = json.dumps({"added": 100, "removed": 0, "notifications": 0, "quads": {"added": text, "removed": ""}})
    del text
    tracemalloc.start()
    try:
        reply = update_reply(UpdateResult(added=quads, removed=frozenset()), request, HeldReplies(None))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reply.content_length == len(expected)
    assert peak < 30_000_000, f"{peak / 1e6:.1f} MB to make the reply of 20 MB of quads"


def test_a_large_update_reply_with_its_quads_is_sent_whole(gateway: RunningGateway, ex: str) -> None:
    """The reply past 64 KiB is written from its parts (broker.gates.replies HeldReply): all of them."""
    headers = {"Content-Type": "application/sparql-update", "Prefer": "return=representation"}
    data = " ".join(f'<{ex}w{index}> <{ex}p> "{"é" * 10_000}\\n" .' for index in range(40))
    reply = gateway.request("POST", "/update", f"INSERT DATA {{ {data} }}", headers)
    assert reply.status == 200 and int(reply.headers["Content-Length"]) == len(reply.body) > 1 << 16
    body = reply.json()
    assert (body["added"], body["removed"]) == (40, 0) and body["quads"]["removed"] == ""
    added = list(parse(body["quads"]["added"].encode(), format=RdfFormat.N_QUADS))
    assert added == sorted(added, key=str)  # in the order the whole text had
    assert [quad.object.value for quad in added] == ["é" * 10_000 + "\n"] * 40
    assert {quad.subject.value for quad in added} == {f"{ex}w{index}" for index in range(40)}


def test_a_large_update_s_body_is_not_held_beside_its_text(in_process_gateway: Any, monkeypatch) -> None:
    """A body still arriving when its handler ran was read by `request.read()`, which keeps its bytes
    on the request until the handler returns: a large update's bytes stayed beside its text for all
    of its processing (one 23.7 MB INSERT DATA: the gateway's peak RSS +347 MB, +325 MB without).
    What Python holds when the update reaches the scheduler is its text, not twice its size."""
    import tracemalloc
    import urllib.request

    from broker.core.results import UpdateResult

    config = Config()
    config.http.max_request_bytes = 32 << 20
    running = in_process_gateway(config)
    held: list[int] = []

    async def update(sparql: str, **kwargs: Any) -> UpdateResult:
        held.append(tracemalloc.get_traced_memory()[0])
        return UpdateResult(added=frozenset(), removed=frozenset())

    monkeypatch.setattr(running.gateway.scheduler, "update", update)
    lines = "".join(f'<urn:s{index}> <urn:p> "value number {index} of a large update" .\n' for index in range(150_000))
    body = f"INSERT DATA {{\n{lines}}}".encode()
    del lines
    request = urllib.request.Request(
        running.http_url + "/update", data=body, headers={"Content-Type": "application/sparql-update"}
    )
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with urllib.request.urlopen(request, timeout=60) as reply:
            assert reply.status == 200
    finally:
        tracemalloc.stop()
    assert held, "the update never reached the scheduler"
    grown = held[0] - before
    assert grown < 1.3 * len(body), f"{grown / 1e6:.1f} MB held for a {len(body) / 1e6:.1f} MB body"
