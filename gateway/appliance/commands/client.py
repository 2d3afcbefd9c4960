"""``sepa-gateway query | update | subscribe``: the client API from the shell.

Why these live in the gateway's own command line: operators debugging a deployment need to look
at the store, poke an update and watch a subscription without writing a program, and they should
do it through the same client code the adapters use (:mod:`gateway.client` over the network
transport, PROTOCOL.md only), so what the shell shows is what an application would see. The
commands work against any SEPA broker, not only this one.

The request is either raw SPARQL (a positional argument) or a JSAP entry (``--jsap FILE ID``),
whose namespaces, forced bindings and graphs are applied exactly as an agent would
(:meth:`gateway.jsap.Jsap.render`). ``-b var=value`` fills a forced binding:

* with ``--jsap`` the value is typed by the entry's declaration (a ``uri`` binding takes an IRI,
  ``<iri>`` or a prefixed name; a literal with a declared datatype gets that datatype);
* with raw SPARQL there is no declaration: the value is a plain string literal, unless it is
  written ``<iri>``, which makes it an IRI. The variable is replaced where it occurs (a projected
  variable becomes ``(<term> AS ?var)``), never inside strings or IRIs, and the value is escaped
  so it cannot change the shape of the SPARQL (same code as JSAP forced bindings).

Endpoints: ``--url http://host:port`` is the broker (``/query`` and ``/update`` are appended; an
https URL uses the PROTOCOL.md secure paths ``/secure/query``...). The subscribe WebSocket is
derived from it, ``ws://host:9000/subscribe`` (``wss://host:9443/secure/subscribe`` for https),
unless ``--ws-url`` is given. Without ``--url``, a ``--jsap`` entry's own endpoints are used, and
without either, ``http://localhost:8000``.

Exit codes: 0 success (a subscription stopped by Ctrl-C, SIGTERM or ``--count`` included); 1 when
the broker refused the request or could not be reached, or the JSAP or a binding is wrong (one
line on stderr, never a traceback); 2 for command-line usage errors (argparse).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import logging
import os
import re
import signal
import sys
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from pyoxigraph import BlankNode, Literal, NamedNode

from broker.api import Notification, QueryResult, Row, rows_to_bindings
from gateway.client import (
    NetworkTransport,
    ReconnectPolicy,
    Scheduled,
    SepaClient,
    SepaClientError,
    SepaConnectionError,
)
from gateway.client.oauth import OAuthSession, tls
from gateway.jsap import Jsap, JsapError
from gateway.jsap.model import url as make_url
from gateway.jsap.template import TemplateError, analyse
from gateway.jsap.terms import WELL_KNOWN_PREFIXES, XSD, XSD_STRING, TermError, iri_term, literal_term

DEFAULT_URL = "http://localhost:8000"
GRAPH_OPTIONS = {
    "query": (("--default-graph", "default-graph-uri"), ("--named-graph", "named-graph-uri")),
    "subscribe": (("--default-graph", "default-graph-uri"), ("--named-graph", "named-graph-uri")),
    "update": (("--using-graph", "using-graph-uri"), ("--using-named-graph", "using-named-graph-uri")),
}
_BARE_DATATYPES = frozenset({XSD + "integer", XSD + "boolean"})  # written bare in Turtle, unambiguously
_SIMPLE_LOCAL = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_HELP = {
    "query": "evaluate a SPARQL query and print its result",
    "update": "apply a SPARQL update and print what it added and removed",
    "subscribe": "subscribe to a SELECT or ASK query and print each notification as it arrives",
}


# -- endpoints ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoints:
    """The three URLs a client needs (PROTOCOL.md "Ports and paths")."""

    query_url: str
    update_url: str
    subscribe_url: str


def broker_endpoints(url: str = DEFAULT_URL, ws_url: str | None = None) -> Endpoints:
    """Endpoints of the broker at `url` (``http://host:port``, optionally ``/query`` or a base path).

    Why derived rather than asked for one by one: a broker is one host with the PROTOCOL.md
    default paths, and the WebSocket gate is on its own port (9000; 9443 for TLS) whatever the
    HTTP port is, so only ``--ws-url`` is needed when a deployment moved it. Raises ValueError.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the broker URL must look like http://host:port, got {url!r}")
    secure = parts.scheme == "https"
    try:
        port = parts.port or (8443 if secure else 8000)
    except ValueError:
        raise ValueError(f"bad port in the broker URL {url!r}") from None
    base = parts.path.rstrip("/")
    for suffix in ("/query", "/update"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    if not base and secure:
        base = "/secure"
    host = parts.hostname
    if ws_url is None:
        ws_url = make_url("wss" if secure else "ws", host, 9443 if secure else 9000, f"{base}/subscribe")
    else:
        ws_parts = urllib.parse.urlsplit(ws_url)
        if ws_parts.scheme not in ("ws", "wss") or not ws_parts.hostname:
            raise ValueError(f"the WebSocket URL must look like ws://host:port/path, got {ws_url!r}")
    return Endpoints(
        make_url(parts.scheme, host, port, f"{base}/query"),
        make_url(parts.scheme, host, port, f"{base}/update"),
        ws_url,
    )


def jsap_with_endpoints(data: Mapping[str, Any], url: str | None, ws_url: str | None = None) -> dict[str, Any]:
    """A copy of a parsed JSAP document whose global endpoints are those of `url` / `ws_url`.

    Why a dict copy: :class:`~gateway.jsap.Jsap` is immutable and fully resolved, so pointing an
    application's JSAP at another broker (a test gateway on free ports, a remote host) is done on
    the document before it is validated. Only the global ``sparql11protocol`` and
    ``sparql11seprotocol`` members change (with ``--url`` alone, the WebSocket is derived as in
    :func:`broker_endpoints`); an entry that overrides its own host or port keeps it.
    """
    document = copy.deepcopy(dict(data))
    if url is None and ws_url is None:
        return document
    if url is not None:
        endpoints = broker_endpoints(url, ws_url)
        query, update = urllib.parse.urlsplit(endpoints.query_url), urllib.parse.urlsplit(endpoints.update_url)
        http = dict(document.get("sparql11protocol") or {})
        http.update(protocol=query.scheme, host=_jsap_host(query.hostname), port=query.port)
        http["query"] = {**(http.get("query") or {}), "path": query.path}
        http["update"] = {**(http.get("update") or {}), "path": update.path}
        document["sparql11protocol"] = http
        ws_url = endpoints.subscribe_url
    assert ws_url is not None
    ws = urllib.parse.urlsplit(ws_url)
    if ws.scheme not in ("ws", "wss") or not ws.hostname:
        raise ValueError(f"the WebSocket URL must look like ws://host:port/path, got {ws_url!r}")
    se = dict(document.get("sparql11seprotocol") or {})
    available = dict(se.get("availableProtocols") or {})
    gate = {**(available.get(ws.scheme) or {}), "host": _jsap_host(ws.hostname)}
    gate["port"] = ws.port or (9443 if ws.scheme == "wss" else 9000)
    if ws.path:
        gate["path"] = ws.path
    available[ws.scheme] = gate
    se.update(protocol=ws.scheme, availableProtocols=available)
    document["sparql11seprotocol"] = se
    return document


def _jsap_host(host: str | None) -> str:
    assert host is not None
    return f"[{host}]" if ":" in host else host


# -- building the request -------------------------------------------------------------------------


@dataclass
class Request:
    """What one command sends: the SPARQL text, its graphs, where to, and how to show terms."""

    sparql: str
    endpoints: Endpoints
    graphs: dict[str, tuple[str, ...]]
    prefixes: Mapping[str, str]
    alias: str | None = None
    reconnect: bool = True
    delay: str | None = None  # updates: run later (a JSAP entry's "delay", or --delay / --at)
    at: str | None = None
    oauth: tuple[str, str] | None = None  # the secure gates' registration and token URLs


def oauth_urls(query_url: str) -> tuple[str, str] | None:
    """Registration and token URLs of the broker serving `query_url` when it is https (PROTOCOL.md paths)."""
    parts = urllib.parse.urlsplit(query_url)
    if parts.scheme != "https":
        return None
    base = f"https://{parts.netloc}"
    return f"{base}/oauth/register", f"{base}/oauth/token"


def positive(text: str) -> int:
    """argparse type of ``--count``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def parse_binding(text: str) -> tuple[str, str]:
    """argparse type of ``-b var=value`` (``?var`` and ``$var`` accepted)."""
    name, equals, value = text.partition("=")
    name = name.strip()
    if name[:1] in ("?", "$"):
        name = name[1:]
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"expected var=value, got {text!r}")
    return name, value


def bind_raw(sparql: str, bindings: Sequence[tuple[str, str]]) -> str:
    """Raw SPARQL with `bindings` written in: ``<iri>`` an IRI, anything else a plain literal.

    Why not text substitution: the template code of JSAP forced bindings knows where a variable
    really is (not in a string or IRI) and what may be written there. Raises ValueError.
    """
    if not bindings:
        return sparql
    values = dict(bindings)
    template = analyse(sparql, values)
    terms = {}
    for name, value in values.items():
        if not template.slots_of(name):
            raise ValueError(f"-b {name}: ?{name} does not occur in the SPARQL (or cannot be replaced there)")
        try:
            term = iri_term(value[1:-1]) if value.startswith("<") and value.endswith(">") else literal_term(value)
        except TermError as error:
            raise ValueError(f"-b {name}: {error}") from None
        terms[name] = term.text
    return template.render(terms)


def build_request(args: argparse.Namespace) -> Request:
    """The request of `args` (raw SPARQL or a JSAP entry). Raises ValueError (JsapError included)."""
    kind = "update" if args.command == "update" else "query"
    bindings: list[tuple[str, str]] = args.bind or []
    url_given = args.url is not None
    endpoints = broker_endpoints(args.url or DEFAULT_URL, args.ws_url)
    reconnect = True
    alias = getattr(args, "alias", None)
    if args.jsap is not None:
        path, entry_id = args.jsap
        jsap = Jsap.load(path)
        entry = jsap.update(entry_id) if kind == "update" else jsap.query(entry_id)
        typed: dict[str, Any] = {}
        for name, value in bindings:
            declaration = entry.forced_bindings.get(name)
            if declaration is not None and declaration.type == "uri" and value.startswith("<") and value.endswith(">"):
                value = value[1:-1]
            typed[name] = value
        sparql = jsap.render(entry, typed)
        delay = entry.delay if kind == "update" else None
        graphs = {key: tuple(entry.graphs[key]) for key in entry.graphs}
        prefixes: Mapping[str, str] = entry.prefixes
        reconnect = jsap.reconnect
        if alias is None and kind == "query":
            alias = entry_id
        if not url_given:
            http = entry.sparql11protocol
            se = entry.sparql11seprotocol
            endpoints = Endpoints(
                http.query_url,
                http.update_url,
                args.ws_url or (se.subscribe_url if se is not None else endpoints.subscribe_url),
            )
    else:
        delay = None
        sparql = bind_raw(args.sparql, bindings)
        graphs = {}
        prefixes = dict(WELL_KNOWN_PREFIXES)
        with contextlib.suppress(TemplateError):
            prefixes.update(analyse(args.sparql, ()).declared_prefixes)
    for option, key in GRAPH_OPTIONS[args.command]:
        given = getattr(args, option[2:].replace("-", "_"))
        if given:
            graphs[key] = tuple(given)
    at = getattr(args, "at", None)
    if getattr(args, "delay", None) is not None or at is not None:
        delay = getattr(args, "delay", None)  # the command line overrides the JSAP entry's delay
    reconnect = reconnect and not getattr(args, "no_reconnect", False)
    oauth = oauth_urls(endpoints.query_url)
    if args.jsap is not None and jsap.oauth.enable and not url_given:
        oauth = (jsap.oauth.register, jsap.oauth.token_request)
    return Request(sparql, endpoints, graphs, prefixes, alias, reconnect, delay, at, oauth)


# -- showing results ------------------------------------------------------------------------------


def show_term(term: Any, prefixes: Mapping[str, str]) -> str:
    """A term as Turtle would write it, IRIs shortened with the known prefixes; '' when unbound."""
    if term is None:
        return ""
    if isinstance(term, NamedNode):
        return _shorten(term.value, prefixes)
    if isinstance(term, BlankNode):
        return f"_:{term.value}"
    if isinstance(term, Literal):
        quoted = str(Literal(term.value))  # N-Triples escaping: one line whatever the text holds
        if term.language:
            return f"{quoted}@{term.language}"
        datatype = term.datatype.value
        if datatype == XSD_STRING:
            return quoted
        if datatype in _BARE_DATATYPES and term.value == str(term.value).strip():
            return term.value
        return f"{quoted}^^{_shorten(datatype, prefixes)}"
    return str(term)


def _shorten(iri: str, prefixes: Mapping[str, str]) -> str:
    best = None
    for prefix, namespace in prefixes.items():
        fits = namespace and iri.startswith(namespace) and _SIMPLE_LOCAL.fullmatch(iri[len(namespace) :])
        if fits and (best is None or len(namespace) > len(prefixes[best])):
            best = prefix
    return f"{best}:{iri[len(prefixes[best]) :]}" if best is not None else f"<{iri}>"


def format_table(
    variables: Sequence[str], rows: Iterable[Row], prefixes: Mapping[str, str], marks: Sequence[str] | None = None
) -> list[str]:
    """Rows as an aligned text table (a first column of `marks` when given), header first."""
    header = list(variables)
    cells = [[show_term(term, prefixes) for term in row] for row in rows]
    if marks is not None:
        header = [" ", *header]
        cells = [[mark, *row] for mark, row in zip(marks, cells, strict=True)]
    widths = [max([len(name), *(len(row[index]) for row in cells)]) for index, name in enumerate(header)]

    def line(values: Sequence[str]) -> str:
        padded = [value.ljust(width) for value, width in zip(values, widths, strict=True)]
        while len(padded) > 1 and not padded[-1].strip():  # trailing unbound cells: no dangling "|"
            padded.pop()
        return " | ".join(padded).rstrip()

    return [line(header), "-+-".join("-" * width for width in widths), *(line(row) for row in cells)]


def result_json(result: QueryResult) -> dict[str, Any]:
    """A query result as SPARQL JSON; CONSTRUCT/DESCRIBE as bindings of subject/predicate/object."""
    if result.kind == "ask":
        return {"head": {}, "boolean": result.boolean}
    variables, rows = _rows(result)
    return {"head": {"vars": list(variables)}, "results": {"bindings": rows_to_bindings(variables, rows)}}


def _rows(result: QueryResult) -> tuple[tuple[str, ...], tuple[Row, ...]]:
    if result.kind == "graph":
        return ("subject", "predicate", "object"), tuple((t.subject, t.predicate, t.object) for t in result.triples)
    return result.variables, result.rows


def format_result(result: QueryResult, prefixes: Mapping[str, str]) -> list[str]:
    """A query result for people: a table and a row count, or true/false for ASK."""
    if result.kind == "ask":
        return ["true" if result.boolean else "false"]
    variables, rows = _rows(result)
    noun = "triple" if result.kind == "graph" else "row"
    return [*format_table(variables, rows, prefixes), f"({len(rows)} {noun}{'' if len(rows) == 1 else 's'})"]


def format_notification(notification: Notification, prefixes: Mapping[str, str]) -> list[str]:
    """One notification for people: its sequence and counts, then removed (-) and added (+) rows."""
    note = " (re-synchronised after a reconnection)" if notification.extra.get("resync") else ""
    if notification.boolean is not None:
        was = "" if notification.previous is None else f" (was {'true' if notification.previous else 'false'})"
        return [f"sequence {notification.sequence}: {'true' if notification.boolean else 'false'}{was}{note}"]
    head = f"sequence {notification.sequence}: {len(notification.added)} added, {len(notification.removed)} removed"
    if notification.sequence == 0:
        head += f" [{notification.spuid}]"
    lines = [head + note]
    if notification.added or notification.removed:
        rows = [*notification.removed, *notification.added]
        marks = ["-"] * len(notification.removed) + ["+"] * len(notification.added)
        lines += format_table(notification.variables, rows, prefixes, marks)
    return lines


def _out(lines: Iterable[str]) -> None:
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    sys.stdout.flush()


# -- the commands ---------------------------------------------------------------------------------


def _client(request: Request, args: argparse.Namespace, *, reconnect: bool) -> SepaClient:
    # query/update: no retries (the shell user wants the answer or the error now); subscribe:
    # reconnect and re-synchronise, like any long-lived subscriber, unless told otherwise
    policy = ReconnectPolicy() if reconnect else ReconnectPolicy(enabled=False)
    endpoints = request.endpoints
    oauth = None
    if request.oauth is not None:
        if not args.identity:
            raise ValueError("the secure gates need a client identity: give --identity NAME")
        oauth = OAuthSession(*request.oauth, args.identity, credentials_file=args.credentials)
    transport = NetworkTransport(
        endpoints.query_url,
        endpoints.update_url,
        endpoints.subscribe_url,
        reconnect=policy,
        request_timeout_s=args.timeout,
        oauth=oauth,
        ssl=tls(args.cafile, args.fingerprint),
    )
    return SepaClient(transport)


async def _query(request: Request, args: argparse.Namespace) -> int:
    async with _client(request, args, reconnect=False) as client:
        result = await client.query(
            request.sparql,
            default_graph_uri=request.graphs.get("default-graph-uri"),
            named_graph_uri=request.graphs.get("named-graph-uri"),
        )
    _out(
        [json.dumps(result_json(result), ensure_ascii=False)] if args.json else format_result(result, request.prefixes)
    )
    return 0


async def _update(request: Request, args: argparse.Namespace) -> int:
    async with _client(request, args, reconnect=False) as client:
        summary = await client.update(
            request.sparql,
            using_graph_uri=request.graphs.get("using-graph-uri"),
            using_named_graph_uri=request.graphs.get("using-named-graph-uri"),
            delay=request.delay,
            at=request.at,
        )
    if isinstance(summary, Scheduled):
        due = summary.due.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        _out(
            [
                json.dumps({"scheduled": {"id": summary.id, "due": due}})
                if args.json
                else f"scheduled {summary.id} {due}"
            ]
        )
        return 0
    if args.json:
        body = {"added": summary.added, "removed": summary.removed, "notifications": summary.notifications}
        _out([json.dumps(body)])
    else:
        _out([f"added {summary.added}, removed {summary.removed}"])
    return 0


async def _subscribe(request: Request, args: argparse.Namespace) -> int:
    """Print notifications until --count, Ctrl-C or SIGTERM (0), or until the subscription fails (raises)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)

    async def stream(client: SepaClient) -> None:
        subscription = await client.subscribe(
            request.sparql,
            request.alias,
            default_graph_uri=request.graphs.get("default-graph-uri"),
            named_graph_uri=request.graphs.get("named-graph-uri"),
        )
        seen = 0
        async for notification in subscription:
            if args.json:
                _out([json.dumps(notification.to_json(), ensure_ascii=False)])
            else:
                _out(format_notification(notification, request.prefixes))
            seen += 1
            if args.count is not None and seen >= args.count:
                return

    client = _client(request, args, reconnect=request.reconnect)
    try:
        body = asyncio.create_task(stream(client))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({body, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not body.done():
            body.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await body
            return 0
        body.result()  # raises the subscription's error, if it ended with one
        return 0
    finally:
        with contextlib.suppress(SepaClientError):
            await client.close()


_RUNNERS = {"query": _query, "update": _update, "subscribe": _subscribe}


def run(args: argparse.Namespace) -> int:
    """Handler of the three commands: build the request, run it, turn expected failures into one line."""
    command = args.command
    if (args.sparql is None) == (args.jsap is None):
        args.parser.error("give either the SPARQL text or --jsap FILE ID (not both)")
    _setup_logging(args.verbose)
    try:
        request = build_request(args)
        return asyncio.run(_RUNNERS[command](request, args))
    except SepaConnectionError as error:  # no broker reply: its synthetic 503 would only mislead
        return _fail(command, _one_line(error.error_description))
    except SepaClientError as error:
        return _fail(command, f"{_one_line(error.error_description)} ({error.error}, {error.status_code})")
    except (JsapError, TemplateError, ValueError) as error:
        return _fail(command, _one_line(str(error)))
    except KeyboardInterrupt:  # before the loop's own handler was installed
        return 0 if command == "subscribe" else 130
    except BrokenPipeError:  # `... | head`: the reader left; nothing more to say
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _fail(command: str, message: str) -> int:
    print(f"sepa-gateway {command}: {message}", file=sys.stderr)
    return 1


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(no description)"


def _setup_logging(verbose: bool) -> None:
    # the client logs lost connections and refused re-subscriptions; a command reports its one
    # error line itself, so without -v nothing may reach stderr through logging's last resort
    root = logging.getLogger()
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    elif not root.handlers:
        root.addHandler(logging.NullHandler())


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``query``, ``update`` and ``subscribe`` to the ``sepa-gateway`` sub-parsers."""
    for command in ("query", "update", "subscribe"):
        parser = subparsers.add_parser(
            command,
            description=f"{_HELP[command][0].upper()}{_HELP[command][1:]}. "
            "Give the SPARQL text, or --jsap FILE ID to use an entry of a JSAP file.",
            epilog="-b var=value: with --jsap the value is typed by the entry's forced-binding declaration; "
            "with raw SPARQL it is a plain literal unless written <iri>. Exit status: 0 ok, 1 refused or "
            "unreachable (one line on stderr), 2 usage.",
        )
        parser.add_argument("sparql", nargs="?", help="the SPARQL text (or use --jsap)")
        parser.add_argument(
            "--jsap",
            nargs=2,
            metavar=("FILE", "ID"),
            help=f"the {'update' if command == 'update' else 'query'} ID of "
            "a JSAP file: its namespaces, forced bindings, graphs and (without --url) endpoints",
        )
        parser.add_argument(
            "-b",
            "--bind",
            action="append",
            type=parse_binding,
            metavar="VAR=VALUE",
            help="a forced binding (repeatable)",
        )
        parser.add_argument(
            "--url",
            help=f"the broker, http://host:port (default: the JSAP's endpoints with --jsap, else {DEFAULT_URL})",
        )
        parser.add_argument(
            "--ws-url", help="the subscribe WebSocket (default: ws://HOST:9000/subscribe, HOST from --url)"
        )
        for option, key in GRAPH_OPTIONS[command]:
            parser.add_argument(option, action="append", metavar="IRI", help=f"{key} (repeatable)")
        secure = parser.add_argument_group(
            "secure gates (an https URL, or a JSAP with oauth enabled)",
            "registers the identity once and keeps its credentials; tokens are fetched and renewed as needed",
        )
        secure.add_argument("--identity", help="the client identity the gateway's operator allowed")
        secure.add_argument(
            "--credentials",
            metavar="FILE",
            help="where the credentials are kept (default ~/.config/sepa-gateway/credentials/HOST-PORT-IDENTITY.json)",
        )
        secure.add_argument("--cafile", help="trust this CA or certificate file (e.g. the gateway's tls-cert.pem)")
        secure.add_argument("--fingerprint", help="or pin the gateway certificate's SHA-256 (as its log shows it)")
        parser.add_argument("--json", action="store_true", help=_JSON_HELP[command])
        parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a reply (default 30)")
        parser.add_argument("-v", "--verbose", action="store_true", help="log the client's activity on stderr")
        if command == "update":
            parser.add_argument("--delay", help="run the update later: milliseconds or an ISO 8601 duration (PT30S)")
            parser.add_argument("--at", help="run the update at this RFC 3339 instant (2026-11-22T18:30:00Z)")
        if command == "subscribe":
            parser.add_argument(
                "--count", type=positive, metavar="N", help="exit after N notifications (sequence 0 counts)"
            )
            parser.add_argument("--alias", help="the subscription's alias (default: the JSAP entry ID, else none)")
            parser.add_argument(
                "--no-reconnect", action="store_true", help="exit 1 when the connection drops instead of reconnecting"
            )
        parser.set_defaults(handler=run, parser=parser)


_JSON_HELP = {
    "query": "print the SPARQL JSON result (CONSTRUCT/DESCRIBE: subject/predicate/object bindings)",
    "update": 'print {"added": N, "removed": N, "notifications": N} (delayed: {"scheduled": {"id": .., "due": ..}})',
    "subscribe": "print each notification as one JSON object per line (the PROTOCOL.md shape)",
}
