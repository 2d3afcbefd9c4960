"""gateway.jsap: loading and validating JSAP files, endpoint resolution, and safe forced bindings.

The forced-binding tests are property-based because the promise is universal: *no* value can
change the shape of the SPARQL. Every generated value is bound into an update and a query that
pyoxigraph then runs on a store: the text must parse, insert exactly one triple (whatever quotes,
braces, `#`, newlines or `DROP ALL` the value holds), drop nothing, and the term read back must be
exactly the term written (lexical form, datatype, language).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyoxigraph as ox
import pytest
from hypothesis import HealthCheck, assume, example, given, note, settings
from hypothesis import strategies as st

from broker.api import term_to_json
from gateway.jsap import Graphs, Jsap, JsapError, binding_term

ROOT = Path(__file__).resolve().parents[3]
CHAT = ROOT / "examples" / "chat" / "chat.jsap"
XSD = "http://www.w3.org/2001/XMLSchema#"
CHAT_NS = "http://wot.arces.unibo.it/chat#"
# JSAP_EXAMPLES scales the property tests for a long local bug hunt (300 examples each take ~1 s).
PROPERTY = settings(
    max_examples=int(os.environ.get("JSAP_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def make(**sections: Any) -> Jsap:
    return Jsap.from_dict(sections)


def error_of(data: Any) -> JsapError:
    with pytest.raises(JsapError) as caught:
        Jsap.from_dict(data)
    return caught.value


# -- the chat application of seed 000 §5.4 -----------------------------------------------------


@pytest.fixture(scope="module")
def chat() -> Jsap:
    return Jsap.load(CHAT)


def test_chat_jsap_describes_the_application(chat: Jsap) -> None:
    assert chat.host == "localhost"
    assert chat.update_url("SEND") == "http://localhost:8000/update"
    assert chat.query_url("SENT") == "http://localhost:8000/query"
    assert chat.subscribe_url("RECEIVED") == "ws://localhost:9000/subscribe"
    assert chat.sparql11seprotocol.available["wss"].path == "/secure/subscribe"
    assert chat.oauth.enable is False and chat.oauth.token_request == "https://localhost:8443/oauth/token"
    assert chat.reconnect is True
    assert chat.namespaces["schema"] == "http://schema.org/"
    assert set(chat.updates) >= {"SEND", "SET_RECEIVED", "REMOVE"}
    assert set(chat.queries) >= {"SENT", "RECEIVED"}
    assert {name: b.type for name, b in chat.update("SEND").forced_bindings.items()} == {
        "sender": "uri",
        "receiver": "uri",
        "text": "literal",
    }
    assert list(chat.query("SENT").forced_bindings) == ["receiver"]
    assert list(chat.query("RECEIVED").forced_bindings) == ["sender"]
    assert all(b.required for entry in chat.updates.values() for b in entry.forced_bindings.values())
    assert chat.extended["graph"] == "http://wot.arces.unibo.it/chat"


def _rows(store: ox.Store, sparql: str) -> list[dict[str, Any]]:
    result = store.query(sparql)
    names = [variable.value for variable in result.variables]
    return [{name: row[name] for name in names if row[name] is not None} for row in result]


def test_chat_message_lifecycle_on_a_store(chat: Jsap) -> None:
    """SEND -> SENT notifies the receiver -> SET_RECEIVED -> RECEIVED notifies the sender -> REMOVE."""
    store = ox.Store()
    alice, bob = "chat:PersonURI1", "chat:PersonURI2"
    store.update(chat.update_text("REGISTER_USER", {"user": alice, "userName": "Alice"}))
    store.update(chat.update_text("REGISTER_USER", {"user": bob, "userName": "Bob"}))
    text = 'Hi Bob, "quotes" } ; DROP ALL ; # and\nnewlines \\ too'
    store.update(chat.update_text("SEND", {"sender": alice, "receiver": bob, "text": text}))

    sent = _rows(store, chat.query_text("SENT", {"receiver": bob}))
    assert len(sent) == 1
    assert sent[0]["text"] == ox.Literal(text)
    assert sent[0]["sender"] == ox.NamedNode(CHAT_NS + "PersonURI1")
    assert sent[0]["name"] == ox.Literal("Alice")
    assert sent[0]["time"].datatype == ox.NamedNode(XSD + "dateTime")
    assert _rows(store, chat.query_text("SENT", {"receiver": alice})) == []
    assert _rows(store, chat.query_text("RECEIVED", {"sender": alice})) == []

    # The Receiver passes the term of the notification straight back (SPARQL JSON form).
    message = sent[0]["message"]
    store.update(chat.update_text("SET_RECEIVED", {"message": term_to_json(message)}))
    store.update(chat.update_text("SET_RECEIVED", {"message": message}))  # idempotent
    received = _rows(store, chat.query_text("RECEIVED", {"sender": alice}))
    assert [(row["message"], row["receiver"]) for row in received] == [(message, ox.NamedNode(CHAT_NS + "PersonURI2"))]

    store.update(chat.update_text("REMOVE", {"message": message.value}))
    assert _rows(store, chat.query_text("SENT", {"receiver": bob})) == []
    assert _rows(store, chat.query_text("RECEIVED", {"sender": alice})) == []
    assert len(_rows(store, chat.query_text("USERS"))) == 2


def test_chat_bindings_are_checked(chat: Jsap) -> None:
    with pytest.raises(JsapError) as caught:
        chat.update_text("SEND", {"sender": "chat:a", "receiver": "chat:b"})
    assert caught.value.path == "updates.SEND.forcedBindings.text"
    with pytest.raises(JsapError, match=r"^updates\.SEND: unknown forced binding 'txt'"):
        chat.update_text("SEND", {"sender": "chat:a", "receiver": "chat:b", "txt": "x"})
    with pytest.raises(JsapError, match=r"^updates\.SEND\.forcedBindings\.receiver: invalid IRI"):
        chat.update_text("SEND", {"sender": "chat:a", "receiver": "not an IRI", "text": "x"})
    with pytest.raises(JsapError, match=r"^queries\.NOPE: no such query"):
        chat.query_text("NOPE")
    # `?x` / `$x` spellings of the keys are accepted
    assert "<urn:b>" in chat.query_text("SENT", {"?receiver": "urn:b"})


def test_sepy_bundled_profile_loads() -> None:
    """The YAML profile sepy ships (the same structure as a JSAP) loads leniently, defaults included."""
    sepy = pytest.importorskip("sepy")
    jsap = Jsap.load(Path(sepy.__file__).parent / "tests" / "testUnsecure.ysap")
    assert jsap.query_url("QUERY_GREETINGS") == "http://localhost:8000/query"
    assert jsap.subscribe_url("QUERY_GREETINGS") == "ws://localhost:9000/subscribe"
    entry = jsap.update("INSERT_VARIABLE_GREETING")
    assert all(b.required for b in entry.forced_bindings.values())  # sepy: "value": "" means required
    text = jsap.update_text("INSERT_VARIABLE_GREETING", {"nome": "test:Luca", "qualcosa": "Ciao 'Luca'"})
    store = ox.Store()
    store.update(text)
    assert list(store) == [
        ox.Quad(
            ox.NamedNode("http://wot.arces.unibo.it/test#Luca"),
            ox.NamedNode("http://wot.arces.unibo.it/test#dice"),
            ox.Literal("Ciao 'Luca'"),
        )
    ]


# -- defaults and overrides ------------------------------------------------------------------------


def test_missing_sections_take_protocol_md_defaults() -> None:
    jsap = make()
    assert (jsap.host, jsap.query_url(), jsap.update_url(), jsap.subscribe_url()) == (
        "localhost",
        "http://localhost:8000/query",
        "http://localhost:8000/update",
        "ws://localhost:9000/subscribe",
    )
    assert jsap.sparql11protocol.query.method == "POST" and jsap.sparql11protocol.update.format == "JSON"
    assert jsap.extended == {} and dict(jsap.namespaces) == {} and jsap.updates == {} and jsap.queries == {}
    assert jsap.oauth.register == "https://localhost:8443/oauth/register"
    secure = make(host="gw.local", sparql11protocol={"protocol": "https"}, sparql11seprotocol={"protocol": "wss"})
    assert secure.query_url() == "https://gw.local:8443/secure/query"
    assert secure.update_url() == "https://gw.local:8443/secure/update"
    assert secure.subscribe_url() == "wss://gw.local:9443/secure/subscribe"
    assert make(host="::1").query_url() == "http://[::1]:8000/query"


OVERRIDES = {
    "host": "global.example",
    "sparql11protocol": {"protocol": "http", "port": 8080, "query": {"path": "/q", "method": "GET"}},
    "sparql11seprotocol": {"protocol": "ws", "availableProtocols": {"ws": {"port": 9090, "path": "/ws"}}},
    "graphs": {"default-graph-uri": ["http://g/default"], "using-graph-uri": "http://g/using"},
    "updates": {
        "PLAIN": {"sparql": "CLEAR DEFAULT"},
        "ELSEWHERE": {"sparql": "CLEAR DEFAULT", "host": "other.example"},
        "SECURE": {"sparql": "CLEAR DEFAULT", "sparql11protocol": {"protocol": "https"}},
        "PORT": {"sparql": "CLEAR DEFAULT", "host": "h", "sparql11protocol": {"port": 7000, "host": "exact"}},
    },
    "queries": {
        "PLAIN": {"sparql": "ASK {}"},
        "WSS": {"sparql": "ASK {}", "sparql11seprotocol": {"protocol": "wss"}, "host": "sub.example"},
        "GATE": {"sparql": "ASK {}", "sparql11seprotocol": {"availableProtocols": {"ws": {"port": 1234}}}},
        "GRAPHS": {"sparql": "ASK {}", "graphs": {"default-graph-uri": ["http://g/mine"], "named-graph-uri": []}},
    },
}


def test_entry_overrides_win_over_globals() -> None:
    jsap = Jsap.from_dict(OVERRIDES)
    assert jsap.update_url("PLAIN") == "http://global.example:8080/update"
    assert jsap.query_url("PLAIN") == "http://global.example:8080/q"
    assert jsap.query("PLAIN").sparql11protocol.query.method == "GET"
    assert jsap.update_url("ELSEWHERE") == "http://other.example:8080/update"
    # a new scheme brings its own default port and path, not the global http ones
    assert jsap.update_url("SECURE") == "https://global.example:8443/secure/update"
    assert jsap.update_url("PORT") == "http://exact:7000/update"  # sparql11protocol.host beats the entry host
    assert jsap.subscribe_url("PLAIN") == "ws://global.example:9090/ws"
    assert jsap.subscribe_url("WSS") == "wss://sub.example:9443/secure/subscribe"
    assert jsap.subscribe_url("GATE") == "ws://global.example:1234/ws"
    assert jsap.graphs_for("PLAIN", "query").default_graph_uri == ("http://g/default",)
    assert jsap.graphs_for("PLAIN", "update")["using-graph-uri"] == ("http://g/using",)
    mine = jsap.graphs_for("GRAPHS")
    assert mine == Graphs(("http://g/mine",), (), ("http://g/using",), ())
    assert mine.query_params() == {"default-graph-uri": ["http://g/mine"]}
    assert dict(mine)["named-graph-uri"] == () and len(mine) == 4
    with pytest.raises(JsapError, match="both an update and a query"):
        jsap.graphs_for("PLAIN")


# -- malformed JSAPs: the error names the member at fault -----------------------------------------


def _q(sparql: str = "SELECT * WHERE { ?s ?p ?x }", **entry: Any) -> dict[str, Any]:
    return {"queries": {"Q": {"sparql": sparql, **entry}}}


def _fb(**binding: Any) -> dict[str, Any]:
    return _q(forcedBindings={"x": binding})


def _off(**entry: Any) -> dict[str, Any]:
    return {"updates": {"OFF": {"sparql": "DELETE DATA { <urn:lamp> <urn:status> <urn:ON> }", **entry}}}


MALFORMED = [
    ([], "", "a JSAP must be a JSON object, got list"),
    (
        {
            "queries": {
                "RECEIVED": {
                    "sparql": "SELECT ?m WHERE { ?m <urn:p> ?sender }",
                    "forcedBindings": {"sender": {"type": "url"}},
                }
            }
        },
        "queries.RECEIVED.forcedBindings.sender.type",
        "expected one of uri, literal, bnode, got 'url'",
    ),
    ({"updates": {"U": {"forcedBindings": {}}}}, "updates.U.sparql", "required"),
    (_q(42), "queries.Q.sparql", "expected a string, got number"),
    (_q("SELECT ?x WHERE { ?x ?p ?o \u0001 }"), "queries.Q.sparql", "SPARQL syntax error at line 1"),
    ({"updates": []}, "updates", "expected an object, got array"),
    ({"host": "http://gw:8000"}, "host", "expected a host name"),
    ({"sparql11protocol": {"port": "eighty"}}, "sparql11protocol.port", "expected a port number"),
    ({"sparql11protocol": {"port": "\u00b2"}}, "sparql11protocol.port", "expected a port number"),  # not int()'s
    ({"sparql11protocol": {"port": "9" * 5000}}, "sparql11protocol.port", "expected a port number"),
    ({"sparql11protocol": {"protocol": "ftp"}}, "sparql11protocol.protocol", "expected one of http, https, got 'ftp'"),
    (
        {"sparql11protocol": {"update": {"method": "GET"}}},
        "sparql11protocol.update.method",
        "expected one of POST, URL_ENCODED_POST, got 'GET'",
    ),
    ({"sparql11seprotocol": {"protocol": "mqtt"}}, "sparql11seprotocol.protocol", "expected one of ws, wss"),
    ({"sparql11seprotocol": {"reconnect": "yes"}}, "sparql11seprotocol.reconnect", "expected true or false"),
    (
        {"sparql11seprotocol": {"availableProtocols": {"wss": {"port": 0}}}},
        "sparql11seprotocol.availableProtocols.wss.port",
        "expected a port number",
    ),
    ({"oauth": {"enable": "false"}}, "oauth.enable", "expected true or false, got string"),
    ({"namespaces": {"ex": "not an IRI"}}, "namespaces.ex", "invalid IRI"),
    ({"namespaces": {"1ex": "http://ex.org/"}}, "namespaces.1ex", "not a SPARQL prefix name"),
    ({"graphs": {"default-graph-uri": ["http://g/1", "g 2"]}}, "graphs.default-graph-uri[1]", "invalid IRI"),
    (_q(graphs={"named-graph-uri": 7}), "queries.Q.graphs.named-graph-uri", "expected an array of IRIs"),
    (_q(sparql11protocol={"port": 70000}), "queries.Q.sparql11protocol.port", "expected a port number"),
    (_q(forcedBindings=["x"]), "queries.Q.forcedBindings", "expected an object, got array"),
    (_q(forcedBindings={"a b": {"type": "uri"}}), "queries.Q.forcedBindings.a b", "not a SPARQL variable name"),
    (_fb(), "queries.Q.forcedBindings.x.type", "required"),
    (_fb(type="literal", language="en_GB"), "queries.Q.forcedBindings.x.language", "invalid language tag"),
    (_fb(type="literal", datatype="xsd:date time"), "queries.Q.forcedBindings.x.datatype", "invalid IRI"),
    (_fb(type="uri", datatype="xsd:string"), "queries.Q.forcedBindings.x.datatype", "only a literal binding"),
    (_fb(type="uri", value="no IRI"), "queries.Q.forcedBindings.x.value", "invalid IRI"),
    (_fb(type="literal", value=[1]), "queries.Q.forcedBindings.x.value", "expected a string, number or boolean"),
    (_fb(type="bnode"), "queries.Q.forcedBindings.x.type", "a blank node can only be written into"),
    (
        _q("SELECT ?y WHERE { BIND(1 AS ?x) }", forcedBindings={"x": {"type": "literal"}}),
        "queries.Q.forcedBindings.x",
        "assigned by AS",
    ),
    (
        _q("SELECT ?y WHERE { VALUES ?x { 1 } }", forcedBindings={"x": {"type": "literal"}}),
        "queries.Q.forcedBindings.x",
        "declared by VALUES",
    ),
    (_off(delay=-5), "updates.OFF.delay", "a delay cannot be negative, got -5"),
    (_off(delay=1.5), "updates.OFF.delay", "expected milliseconds (a non-negative integer) or an ISO 8601 duration"),
    (_off(delay=True), "updates.OFF.delay", "got boolean"),
    (_off(delay=""), "updates.OFF.delay", "must not be empty"),
    (_off(delay="soon"), "updates.OFF.delay", "delay must be milliseconds or an ISO 8601 duration"),
    (_off(delay="P1M"), "updates.OFF.delay", "years and months are not fixed lengths"),
    (_off(delay=10**12), "updates.OFF.delay", "longer than ten years"),
    (_q(delay="PT5S"), "queries.Q.delay", "only an update can be delayed"),
]


@pytest.mark.parametrize(("data", "path", "detail"), MALFORMED, ids=[case[1] or "root" for case in MALFORMED])
def test_malformed_jsap_names_the_member(data: Any, path: str, detail: str) -> None:
    error = error_of(data)
    assert error.path == path
    assert detail in error.detail
    assert str(error).startswith(f"{path}: " if path else detail)


def test_the_documented_message_form() -> None:
    error = error_of(MALFORMED[1][0])
    assert str(error) == "queries.RECEIVED.forcedBindings.sender.type: expected one of uri, literal, bnode, got 'url'"


def test_an_update_may_carry_a_delay() -> None:
    """Seed 001 §II-C: the JSAP says which updates are delayed, as the broker's `delay` parameter."""
    jsap = make(
        updates={
            "OFF": _off(delay=1500)["updates"]["OFF"],
            "LATER": _off(delay=" PT1M30S ")["updates"]["OFF"],
            "DIGITS": _off(delay="250")["updates"]["OFF"],
            "NOW": _off(delay=None)["updates"]["OFF"],
        },
    )
    assert jsap.update_delay("OFF") == "1500" and jsap.update("OFF").delay == "1500"
    assert jsap.update_delay("LATER") == "PT1M30S"
    assert jsap.update_delay("DIGITS") == "250"
    assert jsap.update_delay("NOW") is None
    with pytest.raises(JsapError) as unknown:
        jsap.update_delay("ON")
    assert unknown.value.path == "updates.ON"
    lighting = Jsap.load(ROOT / "examples" / "smart_lighting" / "smart_lighting.jsap")
    assert lighting.update_delay("SWITCH_OFF") == "PT2S" and lighting.update_delay("SWITCH_ON") is None


def test_load_reports_file_problems(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsap"
    broken.write_text('{"host": "x",\n "updates": {,}}')
    with pytest.raises(JsapError, match=r"invalid JSON at line 2"):
        Jsap.load(broken)
    bad = tmp_path / "bad.jsap"
    bad.write_text(json.dumps(MALFORMED[1][0]))
    with pytest.raises(JsapError) as caught:
        Jsap.load(bad)
    assert caught.value.path == "queries.RECEIVED.forcedBindings.sender.type"
    assert str(bad) in str(caught.value)
    with pytest.raises(JsapError, match="cannot read"):
        Jsap.load(tmp_path / "missing.jsap")


def test_leniency_of_real_files() -> None:
    jsap = make(
        **{"#include": ["other.jsap"], "comment": "ignored"},
        sparql11protocol={"protocol": "HTTP", "port": "8000", "update": {"method": "post", "path": "update"}},
        namespaces={"": "http://default.example/"},
        updates={
            "U": {
                "sparql": "INSERT DATA { ?x :p ?y }",
                "authentication": {},
                "forcedBindings": {
                    "x": {"type": "bNode", "value": "b0"},
                    "y": {"type": "literal", "value": 3, "datatype": "xsd:int"},
                },
            }
        },
    )
    assert jsap.update_url("U") == "http://localhost:8000/update"
    assert jsap.sparql11protocol.update.method == "POST"
    text = jsap.update_text("U")
    assert "_:b0" in text and f'"3"^^<{XSD}int>' in text and "PREFIX : <http://default.example/>" in text
    store = ox.Store()
    store.update(text)
    assert len(store) == 1


# -- namespaces and placement of terms --------------------------------------------------------------


def test_namespaces_become_prefix_declarations_once() -> None:
    jsap = make(
        namespaces={"ex": "http://ex.org/", "schema": "http://schema.org/"},
        queries={
            "Q": {
                "sparql": "PREFIX ex: <http://other.org/>\nSELECT ?s WHERE { ?s a ex:T ; xsd:x ?v }",
                "forcedBindings": {"v": {"type": "uri"}},
            }
        },
    )
    text = jsap.query_text("Q", {"v": "ex:thing"})
    assert text.startswith("PREFIX schema: <http://schema.org/>\nPREFIX xsd: <http://www.w3.org/2001/XMLSchema#>\n")
    assert text.count("PREFIX ex:") == 1  # the text's own declaration is kept, not repeated
    assert "<http://other.org/thing>" in text  # values expand with the text's own prefixes
    ox.Store().query(text)


def test_forced_variables_are_replaced_token_wise() -> None:
    sparql = (
        'SELECT ?x ?o WHERE { $x ?p ?o . FILTER(?o != "?x" && ?p != <urn:?x>) ?xx ?p ?x } # ?x\n'
        "ORDER BY ?x DESC(?x) GROUP BY ?x"
    )
    jsap = make(queries={"Q": {"sparql": sparql, "forcedBindings": {"x": {"type": "uri"}}}})
    text = jsap.query_text("Q", {"x": "urn:v"})
    assert text == (
        'SELECT (<urn:v> AS ?x) ?o WHERE { <urn:v> ?p ?o . FILTER(?o != "?x" && ?p != <urn:?x>) ?xx ?p <urn:v> } # ?x\n'
        "ORDER BY (<urn:v>) DESC( <urn:v> ) GROUP BY (<urn:v>)"
    )


def test_projection_rewrite_is_valid_sparql() -> None:
    store = ox.Store()
    store.update("INSERT DATA { <urn:a> <urn:p> 1 , 2 }")
    queries = {
        "PROJECT": "SELECT ?x ?o WHERE { ?x <urn:p> ?o } ORDER BY ?o",
        "AGGREGATE": "SELECT ?x (COUNT(*) AS ?n) WHERE { ?x ?p ?o } GROUP BY ?x",
        "NESTED": "SELECT ?x WHERE { { SELECT DISTINCT ?x WHERE { ?x ?p ?o } } }",
        "STAR": "SELECT * WHERE { ?x <urn:p> 1 }",
    }
    jsap = make(queries={name: {"sparql": q, "forcedBindings": {"x": {"type": "uri"}}} for name, q in queries.items()})
    a = ox.NamedNode("urn:a")
    rows = {name: _rows(store, jsap.query_text(name, {"x": "urn:a"})) for name in queries}
    assert rows["PROJECT"] == [{"x": a, "o": ox.Literal(1)}, {"x": a, "o": ox.Literal(2)}]
    assert rows["AGGREGATE"] == [{"x": a, "n": ox.Literal(2)}]
    assert rows["NESTED"] == [{"x": a}]
    assert rows["STAR"] == [{}]  # SELECT * cannot name a replaced variable: it leaves the results


def test_blank_nodes_only_where_they_make_a_new_node() -> None:
    jsap = make(
        updates={
            "NEW": {"sparql": "INSERT DATA { ?b <urn:p> 1 }", "forcedBindings": {"b": {"type": "bnode"}}},
            "MATCH": {"sparql": "DELETE WHERE { ?b <urn:p> ?o }", "forcedBindings": {"b": {"type": "uri"}}},
        }
    )
    assert "_:n1 " in jsap.update_text("NEW", {"b": "_:n1"})
    for label in ("", "_:", "a b", "-x", "x.", "a}"):
        with pytest.raises(JsapError, match="invalid blank node label"):
            jsap.update_text("NEW", {"b": label})
    with pytest.raises(JsapError, match="a blank node can only be written into"):
        jsap.update_text("MATCH", {"b": {"type": "bnode", "value": "n1"}})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Decimal("NaN"), "xsd:decimal has no NaN"),
        (dt.datetime(2020, 1, 1, tzinfo=dt.timezone(dt.timedelta(seconds=30))), "whole minutes"),
        ("bad\ud800", "lone surrogate"),
        (object(), "cannot write a object"),
        ({"type": "literal", "value": "x", "language": "en", "datatype": "xsd:string"}, "both a language tag"),
        ({"type": "literal"}, "needs a value"),
        ({"type": "iri", "value": "urn:x"}, "expected one of uri, literal, bnode"),
        ({"type": "literal", "value": "x", "language": "e n"}, "invalid language tag"),
    ],
)
def test_unwritable_values_are_errors(value: Any, message: str) -> None:
    update = {"sparql": "INSERT DATA { <urn:s> <urn:p> ?v }", "forcedBindings": {"v": {"type": "literal"}}}
    jsap = make(updates={"U": update})
    with pytest.raises(JsapError, match=message) as caught:
        jsap.update_text("U", {"v": value})
    assert caught.value.path == "updates.U.forcedBindings.v"


def test_python_values_are_typed() -> None:
    def term(value: Any, **declared: Any) -> str:
        return binding_term(value, "literal", **declared).text

    assert term(True) == f'"true"^^<{XSD}boolean>'
    assert term(7) == f'"7"^^<{XSD}integer>'
    assert term(1.0) == f'"1"^^<{XSD}double>'
    assert term(float("-inf")) == f'"-INF"^^<{XSD}double>'
    assert term(float("nan")) == f'"NaN"^^<{XSD}double>'
    assert term(Decimal("-0.500")) == f'"-0.5"^^<{XSD}decimal>'
    assert term(dt.date(2024, 2, 29)) == f'"2024-02-29"^^<{XSD}date>'
    noon = dt.datetime(2024, 2, 29, 12, 0, 0, 250000, tzinfo=dt.UTC)
    assert term(noon) == f'"2024-02-29T12:00:00.25Z"^^<{XSD}dateTime>'
    assert term("5", datatype=XSD + "int") == f'"5"^^<{XSD}int>'
    assert term("chat", language="FR-be") == '"chat"@fr-be'
    assert term("tab\there\x00\x7f") == '"tab\\there\\u0000\\u007F"'


# -- property-based: no value can change the shape of the SPARQL -----------------------------------

INJECTIONS = [
    '" } ; DROP ALL ; INSERT DATA { <a:b> <a:c> "',
    "' } ; DROP ALL ; INSERT DATA { <a:b> <a:c> '",
    '"""} ; CLEAR ALL #',
    '\\" } ; DROP ALL ; #',
    "\\u0022 } ; DROP ALL ; #",
    "\\\\u0022 } ; DROP ALL ; #",
    '"\n} ; DROP ALL ; #',
    "> ; DROP ALL ; <",
    "?v $v",
]
SPARQLISH = st.text(alphabet="\"'\\{}()<>#;.,?$@^_:-\n\r\t uU0123ADLOPRTXabc\u00e9\u2028\U0001f600\x00\x7f")
TEXTS = st.one_of(st.text(), SPARQLISH, st.sampled_from(INJECTIONS))
TEXT_SPARQL = {
    "updates": {
        "INSERT": {"sparql": "INSERT DATA { <urn:s> <urn:p> ?v }", "forcedBindings": {"v": {"type": "literal"}}},
        "DELETE": {"sparql": "DELETE DATA { <urn:s> <urn:p> ?v }", "forcedBindings": {"v": {"type": "literal"}}},
    },
    "queries": {
        "MATCH": {"sparql": "SELECT ?s ?v WHERE { ?s <urn:p> ?v }", "forcedBindings": {"v": {"type": "literal"}}},
    },
}
SENTINELS = "INSERT DATA { <urn:keep> <urn:keep> 1 . GRAPH <urn:g> { <urn:keep> <urn:keep> 2 } }"


def _round_trip(jsap: Jsap, value: Any) -> ox.Literal | ox.NamedNode:
    """Insert `value`, check the store's shape, read it back by pattern and by query; return the stored term."""
    store = ox.Store()
    store.update(SENTINELS)
    insert = jsap.update_text("INSERT", {"v": value})
    note(insert)
    store.update(insert)
    assert len(store) == 3  # exactly one triple added, nothing dropped
    stored = [quad.object for quad in store.quads_for_pattern(ox.NamedNode("urn:s"), None, None)]
    assert len(stored) == 1
    match = _rows(store, jsap.query_text("MATCH", {"v": value}))
    assert match == [{"s": ox.NamedNode("urn:s"), "v": stored[0]}]
    store.update(jsap.update_text("DELETE", {"v": value}))
    assert len(store) == 2
    return stored[0]


@PROPERTY
@given(TEXTS)
@example("")
@example(INJECTIONS[0])
def test_any_text_is_one_literal(value: str) -> None:
    jsap = Jsap.from_dict(TEXT_SPARQL)
    assert _round_trip(jsap, value) == ox.Literal(value)


@PROPERTY
@given(TEXTS, st.from_regex(r"[a-zA-Z]{1,8}(-[a-zA-Z0-9]{1,8}){0,2}", fullmatch=True))
def test_language_tagged_text_round_trips(value: str, language: str) -> None:
    try:
        expected = ox.Literal(value, language=language)
    except ValueError:
        with pytest.raises(JsapError, match="invalid language tag"):
            Jsap.from_dict(TEXT_SPARQL).update_text("INSERT", {"v": {"value": value, "language": language}})
        return
    assert _round_trip(Jsap.from_dict(TEXT_SPARQL), {"value": value, "language": language}) == expected


@PROPERTY
@given(TEXTS, st.sampled_from(["xsd:token", f"{XSD}anyURI", "http://example.org/type#t", "urn:dt"]))
def test_typed_text_round_trips(value: str, datatype: str) -> None:
    jsap = Jsap.from_dict(TEXT_SPARQL)
    expected = ox.Literal(value, datatype=ox.NamedNode(datatype.replace("xsd:", XSD)))
    assert _round_trip(jsap, {"type": "literal", "value": value, "datatype": datatype}) == expected


ZONES = st.one_of(
    st.none(),
    st.just(dt.UTC),
    st.integers(-14 * 60, 14 * 60).map(lambda minutes: dt.timezone(dt.timedelta(minutes=minutes))),
)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**6), max_value=10**6),
    st.booleans(),
    st.datetimes(timezones=ZONES),
    st.dates(),
    st.times(timezones=ZONES),
)
NATURAL = [
    (bool, "boolean"),
    (int, "integer"),
    (float, "double"),
    (Decimal, "decimal"),
    (dt.datetime, "dateTime"),
    (dt.date, "date"),
    (dt.time, "time"),
]


def _same_value(value: Any, lexical: str) -> bool:
    if isinstance(value, bool):
        return lexical == str(value).lower()
    if isinstance(value, float):
        parsed = float(lexical.replace("INF", "inf"))
        return (math.isnan(value) and math.isnan(parsed)) or (
            parsed == value and math.copysign(1, parsed) == math.copysign(1, value)
        )
    if isinstance(value, int | Decimal):
        return type(value)(lexical) == value
    if isinstance(value, dt.datetime):
        return dt.datetime.fromisoformat(lexical.replace("Z", "+00:00")) == value
    if isinstance(value, dt.time):
        return dt.time.fromisoformat(lexical.replace("Z", "+00:00")) == value
    return dt.date.fromisoformat(lexical) == value


@PROPERTY
@given(NUMBERS)
@example(Decimal("-0.000"))
@example(Decimal("1E+30"))
@example(Decimal("0.1000000000000000000001"))
@example(-0.0)
@example(1e16)
@example(5e-324)
@example(float("nan"))
@example(2**63)
@example(dt.datetime(1, 1, 1, 0, 0, 0, 120000, tzinfo=dt.timezone(dt.timedelta(hours=14))))
@example(dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone(-dt.timedelta(hours=14))))
def test_numbers_booleans_and_dates_round_trip_exactly(value: Any) -> None:
    jsap = Jsap.from_dict(TEXT_SPARQL)
    stored = _round_trip(jsap, value)
    written = binding_term(value, "literal").to_pyoxigraph()
    assert stored == written  # the canonical form was written: what comes back is identical
    datatype = next(name for kind, name in NATURAL if isinstance(value, kind))
    assert isinstance(stored, ox.Literal) and stored.datatype == ox.NamedNode(XSD + datatype)
    assert _same_value(value, stored.value)


IRI_CHARS = st.text(alphabet="abcXYZ019-._~:/?#[]@!$&'()*+,;=%é\u4e2d \"<>{}|\\^`\n\t\x00")
IRI_SPARQL = {
    "updates": {
        "INSERT": {"sparql": "INSERT DATA { <urn:s> <urn:p> ?v }", "forcedBindings": {"v": {"type": "uri"}}},
        "DELETE": {"sparql": "DELETE DATA { <urn:s> <urn:p> ?v }", "forcedBindings": {"v": {"type": "uri"}}},
    },
    "queries": {"MATCH": {"sparql": "SELECT ?s ?v WHERE { ?s <urn:p> ?v }", "forcedBindings": {"v": {"type": "uri"}}}},
}


@PROPERTY
@given(st.sampled_from(["http://example.org/", "urn:x:", "tag:", "", "mailto:"]), IRI_CHARS)
def test_iris_are_validated_never_written_when_invalid(scheme: str, rest: str) -> None:
    iri = scheme + rest
    assume(not iri.startswith(("rdf:", "rdfs:", "owl:", "xsd:")))  # well-known prefixes expand
    jsap = Jsap.from_dict(IRI_SPARQL)
    try:
        expected = ox.NamedNode(iri)
    except ValueError:
        with pytest.raises(JsapError, match=r"^updates\.INSERT\.forcedBindings\.v: invalid IRI"):
            jsap.update_text("INSERT", {"v": iri})
        return
    assert _round_trip(jsap, iri) == expected
