"""`sepa-gateway query | update | subscribe`: the installed console script against a real gateway.

What it protects: the shell commands an operator uses to inspect a broker. Every test runs the
`sepa-gateway` script as a subprocess against a `sepa-gateway run` subprocess (real sockets):
an update then a query shows the row (table and SPARQL JSON); raw SPARQL takes `-b` bindings as
literals or `<iri>`; a JSAP entry takes `-b` bindings typed by its declarations, with the JSAP's
own endpoints or `--url`; `subscribe --json --count 2` prints sequence 0 then the notification of
an update made meanwhile, and the human form shows +/- rows; Ctrl-C and SIGTERM end a
subscription with status 0; a syntax error, an unknown JSAP entry, an unreachable broker or a
dropped connection (`--no-reconnect`) give one line on stderr and status 1, never a traceback.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.appliance.commands.client import broker_endpoints, jsap_with_endpoints
from tests.gateway.client.client_support import GatewayProcess, free_ports, gateway_command
from tests.support.leftovers import ended
from tools.launcher import RunningGateway

ROOT = Path(__file__).resolve().parents[4]
CHAT_JSAP = ROOT / "examples" / "chat" / "chat.jsap"
EX = "http://example.org/"
PREFIX = f"PREFIX ex: <{EX}> "
TIMEOUT_S = 20


def cli(*args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*gateway_command(), *args], capture_output=True, text=True, timeout=timeout)


def url_of(gateway: GatewayProcess | RunningGateway) -> list[str]:
    return ["--url", f"http://127.0.0.1:{gateway.http_port}", "--ws-url", gateway.subscribe_url]


def one_error_line(done: subprocess.CompletedProcess[str], command: str) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"sepa-gateway {command}: "), done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


def read_line(process: subprocess.Popen[str]) -> str:
    """One line of a subprocess's stdout (a timer kills the process if nothing comes, so no hang)."""
    timer = threading.Timer(TIMEOUT_S, process.kill)
    timer.start()
    try:
        assert process.stdout is not None
        return process.stdout.readline()
    finally:
        timer.cancel()


@pytest.fixture
def empty(gateway: RunningGateway) -> RunningGateway:
    assert gateway.update("DROP ALL").status == 200
    return gateway


def test_update_then_query_as_table_and_json(empty: RunningGateway) -> None:
    urls = url_of(empty)
    done = cli(
        "update",
        *urls,
        PREFIX + 'INSERT DATA { ex:lamp1 ex:level 40 ; ex:name "Lamp \\"one\\"" . ex:lamp2 ex:level 7 }',
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "added 3, removed 0\n", "")

    select = (
        PREFIX
        + "SELECT ?lamp ?level ?name WHERE { ?lamp ex:level ?level OPTIONAL { ?lamp ex:name ?name } } ORDER BY ?lamp"
    )
    done = cli("query", *urls, select)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "lamp     | level | name",
        "---------+-------+---------------",
        'ex:lamp1 | 40    | "Lamp \\"one\\""',
        "ex:lamp2 | 7",
        "(2 rows)",
    ]

    done = cli("query", *urls, "--json", select)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["head"]["vars"] == ["lamp", "level", "name"]
    assert document["results"]["bindings"][0] == {
        "lamp": {"type": "uri", "value": f"{EX}lamp1"},
        "level": {"type": "literal", "value": "40", "datatype": "http://www.w3.org/2001/XMLSchema#integer"},
        "name": {"type": "literal", "value": 'Lamp "one"'},
    }

    # raw SPARQL with bindings: <iri> is an IRI, anything else a plain literal (escaped, no injection)
    done = cli(
        "query", *urls, "-b", f"lamp=<{EX}lamp2>", PREFIX + "SELECT ?lamp ?level WHERE { ?lamp ex:level ?level }"
    )
    assert done.stdout.splitlines()[2:] == ["ex:lamp2 | 7", "(1 row)"]
    done = cli("query", *urls, "--json", "-b", 'name=Lamp "one"', PREFIX + "SELECT ?lamp WHERE { ?lamp ex:name ?name }")
    assert [b["lamp"]["value"] for b in json.loads(done.stdout)["results"]["bindings"]] == [f"{EX}lamp1"]
    done = cli("update", *urls, "--json", "-b", "v=x } ; DROP ALL ; #", PREFIX + "INSERT DATA { ex:lamp3 ex:name ?v }")
    assert json.loads(done.stdout) == {"added": 1, "removed": 0, "notifications": 0}
    done = cli("query", *urls, "ASK { ?s ?p ?o }")
    assert done.stdout == "true\n"  # the DROP ALL stayed inside the literal


def test_graph_options(empty: RunningGateway) -> None:
    urls, graph = url_of(empty), f"{EX}g"
    empty.post_update(f"INSERT DATA {{ GRAPH <{graph}> {{ <{EX}a> <{EX}in> 1 }} }}")
    select = PREFIX + "SELECT ?s WHERE { ?s ex:in ?o }"
    assert cli("query", *urls, select).stdout.splitlines()[-1] == "(0 rows)"  # not in the default graph
    assert cli("query", *urls, "--default-graph", graph, select).stdout.splitlines()[2:] == ["ex:a", "(1 row)"]
    delete = PREFIX + "DELETE { GRAPH ex:g { ?s ex:in ?o } } WHERE { ?s ex:in ?o }"
    assert cli("update", *urls, "--using-graph", graph, delete).stdout == "added 0, removed 1\n"


def test_jsap_entries_with_typed_bindings(empty: RunningGateway, tmp_path: Path) -> None:
    # a small JSAP pointing at the test gateway (no --url: the JSAP's own endpoints are used)
    profile = {
        "host": "127.0.0.1",
        "sparql11protocol": {"port": empty.http_port},
        "sparql11seprotocol": {"protocol": "ws", "availableProtocols": {"ws": {"port": empty.ws_port}}},
        "namespaces": {"ex": EX},
        "updates": {
            "SET_LEVEL": {
                "sparql": "DELETE { ?lamp ex:level ?old } INSERT { ?lamp ex:level ?level } "
                "WHERE { OPTIONAL { ?lamp ex:level ?old } }",
                "forcedBindings": {"lamp": {"type": "uri"}, "level": {"type": "literal", "datatype": "xsd:integer"}},
            }
        },
        "queries": {
            "LEVEL": {
                "sparql": "SELECT ?lamp ?level WHERE { ?lamp ex:level ?level }",
                "forcedBindings": {"lamp": {"type": "uri", "value": "ex:lamp1"}},
            }
        },
    }
    jsap = tmp_path / "lamps.jsap"
    jsap.write_text(json.dumps(profile), encoding="utf-8")
    done = cli("update", "--jsap", str(jsap), "SET_LEVEL", "-b", "lamp=ex:lamp1", "-b", "level=42")
    assert (done.returncode, done.stdout) == (0, "added 1, removed 0\n"), done.stderr
    done = cli("update", "--jsap", str(jsap), "SET_LEVEL", "-b", f"lamp=<{EX}lamp2>", "-b", "?level=5")
    assert done.stdout == "added 1, removed 0\n"
    done = cli("query", "--jsap", str(jsap), "LEVEL")  # the declared default: ex:lamp1
    assert done.stdout.splitlines() == ["lamp     | level", "---------+------", "ex:lamp1 | 42", "(1 row)"]
    done = cli("query", "--jsap", str(jsap), "LEVEL", "--json", "-b", "lamp=ex:lamp2")
    [binding] = json.loads(done.stdout)["results"]["bindings"]
    assert binding["level"] == {"type": "literal", "value": "5", "datatype": "http://www.w3.org/2001/XMLSchema#integer"}

    bad = one_error_line(
        cli("update", "--jsap", str(jsap), "SET_LEVEL", "-b", "lamp=not an iri", "-b", "level=1"), "update"
    )
    assert "updates.SET_LEVEL.forcedBindings.lamp: invalid IRI" in bad
    bad = one_error_line(cli("query", "--jsap", str(jsap), "NOPE"), "query")
    assert "queries.NOPE: no such query in the JSAP (known: LEVEL)" in bad
    bad = one_error_line(cli("query", "--jsap", str(jsap), "LEVEL", "-b", "who=1"), "query")
    assert "unknown forced binding" in bad

    # the chat JSAP of the example, its endpoints replaced by --url / --ws-url
    urls = url_of(empty)
    chat = ["--jsap", str(CHAT_JSAP)]
    sender, receiver = "sender=chat:PersonURI1", "receiver=<http://wot.arces.unibo.it/chat#PersonURI2>"
    done = cli("update", *chat, "SEND", *urls, "-b", sender, "-b", receiver, "-b", 'text=hi "you"\nthere')
    assert done.stdout == "added 5, removed 0\n", done.stderr
    done = cli("query", *chat, "SENT", *urls, "--json", "-b", "receiver=chat:PersonURI2")
    [row] = json.loads(done.stdout)["results"]["bindings"]
    assert row["sender"]["value"] == "http://wot.arces.unibo.it/chat#PersonURI1"
    assert row["text"] == {"type": "literal", "value": 'hi "you"\nthere'}
    done = cli("query", *chat, "SENT", *urls, "-b", "receiver=chat:PersonURI1")
    assert done.stdout.splitlines()[-1] == "(0 rows)"


def test_subscribe_json_count_prints_sequence_0_then_the_update(empty: RunningGateway) -> None:
    empty.post_update(f"INSERT DATA {{ <{EX}a> <{EX}level> 1 }}")
    command = [*gateway_command(), "subscribe", *url_of(empty), "--json", "--count", "2", "--alias", "levels"]
    command.append(PREFIX + "SELECT ?s ?level WHERE { ?s ex:level ?level }")
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            first = json.loads(read_line(process))["notification"]
            assert (first["sequence"], first["alias"]) == (0, "levels")
            assert first["addedResults"]["head"]["vars"] == ["s", "level"]
            assert [b["s"]["value"] for b in first["addedResults"]["results"]["bindings"]] == [f"{EX}a"]
            assert first["removedResults"]["results"]["bindings"] == []
            empty.post_update(f"DELETE DATA {{ <{EX}a> <{EX}level> 1 }} ; INSERT DATA {{ <{EX}a> <{EX}level> 2 }}")
            out, err = process.communicate(timeout=TIMEOUT_S)
        finally:  # a failed assertion: Popen's exit would wait for ever for a subscriber
            ended(process)
    assert process.returncode == 0 and err == ""
    [line] = out.splitlines()
    second = json.loads(line)["notification"]
    assert (second["sequence"], second["spuid"]) == (1, first["spuid"])
    assert [b["level"]["value"] for b in second["addedResults"]["results"]["bindings"]] == ["2"]
    assert [b["level"]["value"] for b in second["removedResults"]["results"]["bindings"]] == ["1"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_subscribe_human_output_until_a_signal(empty: RunningGateway, signum: int) -> None:
    command = [
        *gateway_command(),
        "subscribe",
        *url_of(empty),
        PREFIX + "SELECT ?s ?level WHERE { ?s ex:level ?level }",
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            assert read_line(process).startswith("sequence 0: 0 added, 0 removed [sepa://subscription/")
            empty.post_update(f"INSERT DATA {{ <{EX}b> <{EX}level> 3 }}")
            lines = [read_line(process) for _ in range(4)]
            empty.post_update(f"DELETE DATA {{ <{EX}b> <{EX}level> 3 }}")
            lines += [read_line(process) for _ in range(4)]
            process.send_signal(signum)
            out, err = process.communicate(timeout=TIMEOUT_S)
        finally:  # a failed assertion: Popen's exit would wait for ever for a subscriber
            ended(process)
    assert process.returncode == 0, err
    assert err == "" and out == ""
    assert [line.rstrip("\n") for line in lines] == [
        "sequence 1: 1 added, 0 removed",
        "  | s    | level",
        "--+------+------",
        "+ | ex:b | 3",
        "sequence 2: 0 added, 1 removed",
        "  | s    | level",
        "--+------+------",
        "- | ex:b | 3",
    ]


def test_errors_are_one_line_and_status_1(empty: RunningGateway) -> None:
    urls = url_of(empty)
    for command in ("query", "subscribe"):
        line = one_error_line(cli(command, *urls, "SELEC * WHERE { ?s ?p ?o }"), command)
        assert "SPARQL syntax error at line 1" in line and "(invalid_request, 400)" in line
    line = one_error_line(cli("update", *urls, "INSERT DATA { <a> <b> }"), "update")
    assert "SPARQL syntax error" in line
    line = one_error_line(cli("query", *urls, "-b", "x=1", "SELECT ?s WHERE { ?s ?p ?o }"), "query")
    assert "?x does not occur in the SPARQL" in line
    usage = cli("query", *urls)  # neither SPARQL nor --jsap: a usage error
    assert usage.returncode == 2 and "give either the SPARQL text or --jsap" in usage.stderr


def test_update_with_delay_or_at_is_scheduled_and_runs_later(empty: RunningGateway) -> None:
    urls = url_of(empty)
    done = cli("update", *urls, "--json", "--delay", "PT5S", PREFIX + "INSERT DATA { ex:later ex:v 1 }")
    assert done.returncode == 0, done.stderr
    scheduled = json.loads(done.stdout)["scheduled"]
    assert set(scheduled) == {"id", "due"}
    table = cli("update", *urls, "--at", "2020-01-01T00:00:00Z", PREFIX + "INSERT DATA { ex:past ex:v 2 }")
    assert table.returncode == 0 and table.stdout.startswith("scheduled "), table.stdout
    before_due = cli("query", *urls, PREFIX + "SELECT ?s WHERE { ?s ex:v ?v }").stdout
    if datetime.now(UTC) < datetime.fromisoformat(scheduled["due"]):  # a loaded machine may be later
        assert "ex:later" not in before_due
    deadline = time.monotonic() + TIMEOUT_S
    while "later" not in cli("query", *urls, PREFIX + "SELECT ?s WHERE { ?s ex:v ?v }").stdout:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    line = one_error_line(cli("update", *urls, "--delay", "soon", PREFIX + "INSERT DATA { ex:x ex:v 3 }"), "update")
    assert "delay must be milliseconds or an ISO 8601 duration" in line


def test_broker_down_is_one_line_and_status_1() -> None:
    http_port, ws_port = free_ports(2)  # nothing listens there
    urls = ["--url", f"http://127.0.0.1:{http_port}", "--ws-url", f"ws://127.0.0.1:{ws_port}/subscribe"]
    processes = {
        command: subprocess.Popen(
            [*gateway_command(), command, *urls, sparql], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for command, sparql in (
            ("query", "SELECT * WHERE { ?s ?p ?o }"),
            ("update", "INSERT DATA { <http://e/a> <http://e/b> 1 }"),
            ("subscribe", "SELECT * WHERE { ?s ?p ?o }"),
        )
    }
    for command, process in processes.items():
        out, err = process.communicate(timeout=TIMEOUT_S)
        done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        assert (
            "cannot" in one_error_line(done, command)
            and f"127.0.0.1:{http_port if command != 'subscribe' else ws_port}" in err
        )


def test_subscription_dropped_without_reconnect(restartable: Callable[..., GatewayProcess]) -> None:
    gateway = restartable(on_disk=False).start()
    command = [*gateway_command(), "subscribe", *url_of(gateway), "--no-reconnect", "ASK { ?s ?p ?o }"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            assert read_line(process) == "sequence 0: false\n"
            gateway.kill()
            out, err = process.communicate(timeout=TIMEOUT_S)
        finally:  # a failed assertion: Popen's exit would wait for ever for a subscriber
            ended(process)
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert "connection" in one_error_line(done, "subscribe")


def test_endpoint_derivation() -> None:
    assert broker_endpoints("http://gw:8000") == broker_endpoints("http://gw:8000/query/")
    endpoints = broker_endpoints("http://gw:8080")
    assert (endpoints.query_url, endpoints.update_url, endpoints.subscribe_url) == (
        "http://gw:8080/query",
        "http://gw:8080/update",
        "ws://gw:9000/subscribe",
    )
    secure = broker_endpoints("https://[::1]")
    assert (secure.query_url, secure.subscribe_url) == (
        "https://[::1]:8443/secure/query",
        "wss://[::1]:9443/secure/subscribe",
    )
    assert broker_endpoints("http://gw", "ws://other:1/ws").subscribe_url == "ws://other:1/ws"
    for bad in ("gw:8000", "ftp://gw", "http://gw:notaport"):
        with pytest.raises(ValueError):
            broker_endpoints(bad)
    document = json.loads(CHAT_JSAP.read_text(encoding="utf-8"))
    moved = jsap_with_endpoints(document, "http://10.0.0.5:18000")
    assert moved["sparql11protocol"]["port"] == 18000 and moved["sparql11protocol"]["host"] == "10.0.0.5"
    assert moved["sparql11seprotocol"]["availableProtocols"]["ws"] == {
        "port": 9000,
        "path": "/subscribe",
        "host": "10.0.0.5",
    }
    assert document["sparql11protocol"]["port"] == 8000  # a copy: the original is untouched
