"""An existing SEPA client library, unmodified from PyPI, works against the gateway.

What it protects (PROTOCOL.md: "Existing SEPA clients ... must work against it unchanged, with
their default JSAP files"): `sepy` (the Python client of the SEPA project) is driven only through
its public API (`SAPObject`, `SEPA.update` / `query` / `subscribe` / `unsubscribe`) with the
application profile it ships itself (`sepy/tests/testUnsecure.ysap`). Its paths and default ports
are the ones PROTOCOL.md documents; only host and ports are changed, through the profile, to reach
the test gateway on its free ports. sepy parses the notifications itself (`parseWSMessage`) and
hands added / removed bindings to the handler, so a wrong member name or shape shows up here.
sepy closes its socket when it reads `{"unsubscribed": ...}`: the connection count dropping after
`unsubscribe` proves the reply was understood.

Known sepy quirks that the gateway cannot fix and this test avoids: it needs `requests` and
`pkg_resources` (setuptools < 82) without declaring them, its `on_close` has the pre-1.0
websocket-client signature (a harmless logged error) and it sends `named_graph` as
`default-graph-uri`.
"""

from __future__ import annotations

import json
import logging
import queue
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from sepy.SAPObject import SAPObject
from sepy.SEPA import SEPA
from websocket import WebSocketConnectionClosedException

from tests.broker.gates.subscribe_support import HOST, RunningGateway
from tests.conftest import stop_and_check

TEST_NS = "http://wot.arces.unibo.it/test#"
Notification = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def sepy_profile() -> dict[str, Any]:
    """The unsecure application profile sepy ships with, parsed as sepy's own tests do."""
    text = (resources.files("sepy.tests") / "testUnsecure.ysap").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def test_sepy_default_profile_uses_the_documented_paths_and_ports() -> None:
    profile = sepy_profile()
    http, se = profile["sparql11protocol"], profile["sparql11seprotocol"]
    assert (http["protocol"], http["port"], http["query"]["path"], http["update"]["path"]) == (
        "http",
        8000,
        "/query",
        "/update",
    )
    assert (se["protocol"], se["availableProtocols"]["ws"]["port"], se["availableProtocols"]["ws"]["path"]) == (
        "ws",
        9000,
        "/subscribe",
    )


def sepy_engine(gateway: RunningGateway) -> Any:
    """sepy's SEPA engine over its own profile, pointed at `gateway`'s host and ports."""
    profile = sepy_profile()
    profile["host"] = HOST
    profile["sparql11protocol"]["port"] = gateway.http_port
    profile["sparql11seprotocol"]["availableProtocols"]["ws"]["port"] = gateway.ws_port
    engine = SEPA(sapObject=SAPObject(profile, log=logging.ERROR), logLevel=logging.ERROR)
    assert engine.sap.subscribe_url == f"ws://{HOST}:{gateway.ws_port}/subscribe"
    return engine


@pytest.fixture
def sepa(gateway: RunningGateway) -> Iterator[Any]:
    """sepy's SEPA engine over its own profile, pointed at the test gateway's host and ports."""
    engine = sepy_engine(gateway)
    yield engine
    for socket in list(engine.get_subscriptions().values()):
        socket.close()


def binding(name: str, text: str) -> dict[str, Any]:
    return {"nome": {"type": "uri", "value": TEST_NS + name}, "qualcosa": {"type": "literal", "value": text}}


def rows(bindings: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(row, sort_keys=True) for row in bindings)


def next_notification(inbox: queue.Queue[Notification]) -> Notification:
    return inbox.get(timeout=5)


def test_sepy_query_update_subscribe_unsubscribe(gateway: RunningGateway, sepa: Any) -> None:
    gateway.wait_for_metric("sepa_subscriptions", lambda value: value == 0)

    reply = sepa.update("INSERT_GREETING")  # sepy returns the body of a 200 reply
    assert json.loads(reply)["added"] == 1
    answer = sepa.query("QUERY_GREETINGS")
    assert set(answer["head"]["vars"]) == {"nome", "qualcosa"}
    assert rows(answer["results"]["bindings"]) == rows([binding("Francesco", "Ciao")])

    inbox: queue.Queue[Notification] = queue.Queue()
    spuid = sepa.subscribe("QUERY_GREETINGS", "greetings", handler=lambda added, removed: inbox.put((added, removed)))
    assert spuid.startswith("sepa://subscription/")
    added, removed = next_notification(inbox)  # sequence 0: the current results
    assert (rows(added), removed) == (rows([binding("Francesco", "Ciao")]), [])
    assert gateway.metric("sepa_subscriptions") == 1

    # A forced-binding update from the profile, then a plain SPARQL one: sepy parses both notifications.
    sepa.update("INSERT_VARIABLE_GREETING", forcedBindings={"nome": TEST_NS + "Fabio", "qualcosa": "Hello"})
    added, removed = next_notification(inbox)
    assert (rows(added), removed) == (rows([binding("Fabio", "Hello")]), [])
    sepa.sparql_update(f"DELETE DATA {{ <{TEST_NS}Francesco> <{TEST_NS}dice> 'Ciao' }}")
    added, removed = next_notification(inbox)
    assert (added, rows(removed)) == ([], rows([binding("Francesco", "Ciao")]))
    everything = sepa.query_all()["results"]["bindings"]
    assert everything == [
        {
            "a": {"type": "uri", "value": TEST_NS + "Fabio"},
            "b": {"type": "uri", "value": TEST_NS + "dice"},
            "c": {"type": "literal", "value": "Hello"},
        }
    ]

    sepa.unsubscribe(spuid)
    gateway.wait_for_metric("sepa_subscriptions", lambda value: value == 0)
    gateway.wait_for_metric("sepa_ws_connections", lambda value: value == 0)  # sepy understood "unsubscribed"

    # A new sepy subscription is notified of the next update; the ended one is not.
    again: queue.Queue[Notification] = queue.Queue()
    sepa.subscribe("QUERY_GREETINGS", "again", handler=lambda added, removed: again.put((added, removed)))
    assert rows(next_notification(again)[0]) == rows([binding("Fabio", "Hello")])
    sepa.update("INSERT_VARIABLE_GREETING", forcedBindings={"nome": TEST_NS + "Adriano", "qualcosa": "Salve"})
    added, removed = next_notification(again)
    assert (rows(added), removed) == (rows([binding("Adriano", "Salve")]), [])
    assert inbox.empty()


def test_sepy_runs_construct_and_describe(gateway: RunningGateway, sepa: Any) -> None:
    """sepy asks every query with Accept: application/sparql-results+json and parses the body as
    JSON: a graph comes as JSON-LD (it was a 406, and sepy raised)."""
    ns = TEST_NS + "graphs/"
    sepa.sparql_update(f"INSERT DATA {{ <{ns}Ada> <{ns}dice> 'Salve' }}")
    graph = sepa.sparql_query(f"CONSTRUCT {{ ?s <{ns}says> ?o }} WHERE {{ ?s <{ns}dice> ?o }}")
    assert graph == [{"@id": ns + "Ada", ns + "says": [{"@value": "Salve"}]}]
    described = sepa.sparql_query(f"DESCRIBE <{ns}Ada>")
    assert [node["@id"] for node in described] == [ns + "Ada"]


def test_sepy_profile_with_a_graph_and_a_typed_forced_binding(gateway: RunningGateway) -> None:
    """A profile as sepy's template (ysap_template.sap) writes one: `graphs` members as single IRIs
    (sepy sends `default-graph-uri` as a string, not an array), a namespace, and a literal forced
    binding with a prefixed `datatype`. The subscription sees only its graph; the handler gets the
    typed literal as the store holds it."""
    profile = sepy_profile()
    profile["host"] = HOST
    profile["sparql11protocol"]["port"] = gateway.http_port
    profile["sparql11seprotocol"]["availableProtocols"]["ws"]["port"] = gateway.ws_port
    profile["graphs"] = {"default-graph-uri": TEST_NS + "g"}
    profile["namespaces"]["xsd"] = "http://www.w3.org/2001/XMLSchema#"
    profile["updates"]["SET_LEVEL"] = {
        "sparql": f"INSERT DATA {{ GRAPH <{TEST_NS}g> {{ ?lamp test:level ?level }} }}",
        "forcedBindings": {
            "lamp": {"type": "uri", "value": ""},
            "level": {"type": "literal", "datatype": "xsd:integer", "value": ""},
        },
    }
    profile["queries"]["LEVELS"] = {"sparql": "SELECT ?lamp ?level WHERE { ?lamp test:level ?level }"}
    engine = SEPA(sapObject=SAPObject(profile, log=logging.ERROR), logLevel=logging.ERROR)
    inbox: queue.Queue[Notification] = queue.Queue()
    engine.sparql_update(f"INSERT DATA {{ <{TEST_NS}other> <{TEST_NS}level> 1 }}")  # the default graph: not seen
    try:
        engine.subscribe("LEVELS", "levels", handler=lambda added, removed: inbox.put((added, removed)))
        assert next_notification(inbox) == ([], [])
        engine.update("SET_LEVEL", forcedBindings={"lamp": TEST_NS + "lamp", "level": "007"})
        added, removed = next_notification(inbox)
        level = {"type": "literal", "value": "7", "datatype": "http://www.w3.org/2001/XMLSchema#integer"}
        assert (added, removed) == ([{"lamp": {"type": "uri", "value": TEST_NS + "lamp"}, "level": level}], [])
    finally:
        for socket in list(engine.get_subscriptions().values()):
            socket.close()


def test_sepy_across_a_gateway_restart(
    start_gateway: Callable[..., RunningGateway], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """sepy does not reconnect (docs/protocol.md, "What clients should know"): at a stop its socket
    hears the gateway's 1001 and ends, its handler is not called again, its `unsubscribe` of the
    dead subscription raises; the application subscribes again, and sequence 0 brings what
    changed meanwhile. Pinned: the 1001 close frame (websocket-client logs its code and reason,
    the only sign a sepy application gets), and that a new subscription on the same ports works."""
    gateway = start_gateway(data_dir=tmp_path / "data")
    engine = sepy_engine(gateway)
    inbox: queue.Queue[Notification] = queue.Queue()

    def notified(added: list[dict[str, Any]], removed: list[dict[str, Any]]) -> None:
        inbox.put((added, removed))

    spuid = engine.subscribe("QUERY_GREETINGS", "greetings", handler=notified)
    assert next_notification(inbox) == ([], [])
    socket = engine.get_subscriptions()[spuid]
    with caplog.at_level(logging.ERROR, logger="websocket"):
        assert gateway.stop() == 0
        deadline = time.monotonic() + 30
        while socket.sock is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert socket.sock is None, "sepy's socket is still open after the gateway stopped"
    assert "Connection closed (code 1001): gateway shutting down" in caplog.text, caplog.text
    restarted = gateway.restart()
    try:
        engine.update("INSERT_GREETING")
        time.sleep(1.0)  # room for a notification sepy will not get: it has no reconnection code
        assert inbox.empty()
        with pytest.raises(WebSocketConnectionClosedException):
            engine.unsubscribe(spuid)
        again = engine.subscribe("QUERY_GREETINGS", "greetings", handler=notified)
        assert again != spuid
        added, removed = next_notification(inbox)  # sequence 0: the greeting written while it was away
        assert (rows(added), removed) == (rows([binding("Francesco", "Ciao")]), [])
        engine.update("INSERT_VARIABLE_GREETING", forcedBindings={"nome": TEST_NS + "Fabio", "qualcosa": "Hello"})
        added, removed = next_notification(inbox)
        assert (rows(added), removed) == (rows([binding("Fabio", "Hello")]), [])
    finally:
        for open_socket in list(engine.get_subscriptions().values()):
            open_socket.close()
        stop_and_check(restarted)
