"""IRIs with codepoint escapes are the IRIs they spell, in updates, queries and subscriptions alike."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request

import aiohttp

ESCAPED = r"<http://example.org/caf\u00e9>"
PLAIN = "<http://example.org/café>"


def test_an_escaped_iri_names_the_same_node_through_every_gate(start_gateway) -> None:
    """`\\u` escapes may appear anywhere in a SPARQL request (§19.2). pyoxigraph decoded them in
    /query, but the update path's tokenizer refused them: an update or a subscription naming
    `<http://example.org/caf\\u00e9>` was a syntax error."""
    gateway = start_gateway()
    assert gateway.update(f"INSERT DATA {{ {ESCAPED} <http://p> 1 }}").status == 200
    assert gateway.ask(f"ASK {{ {PLAIN} <http://p> 1 }}")

    async def subscribe() -> tuple[dict, dict]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{gateway.ws_url}/subscribe") as ws:
            await ws.send_json({"subscribe": {"sparql": f"SELECT ?o WHERE {{ {ESCAPED} <http://p> ?o }}"}})
            first = json.loads((await ws.receive(timeout=10)).data)
            assert gateway.update(f"INSERT DATA {{ {PLAIN} <http://p> 2 }}").status == 200
            second = json.loads((await ws.receive(timeout=10)).data)
            return first, second

    first, second = asyncio.run(subscribe())
    added = lambda frame: [row["o"]["value"] for row in frame["notification"]["addedResults"]["results"]["bindings"]]  # noqa: E731
    assert added(first) == ["1"] and added(second) == ["2"], (first, second)
    form = urllib.parse.urlencode({"update": f"DELETE DATA {{ {ESCAPED} <http://p> 1 }}"}).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded"}  # as sepy sends it
    request = urllib.request.Request(gateway.http_url + "/update", form, headers)
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200
    assert not gateway.ask(f"ASK {{ {PLAIN} <http://p> 1 }}")


def test_an_escape_to_a_character_no_iri_holds_is_still_a_syntax_error(start_gateway) -> None:
    gateway = start_gateway()
    refused = gateway.update(r"INSERT DATA { <http://example.org/a\u0020b> <http://p> 1 }")
    assert refused.status == 400, refused.body
    assert not gateway.ask("ASK { ?s <http://p> 1 }")


def test_a_less_than_span_is_not_decoded_as_an_iri(start_gateway) -> None:
    """`<` is also less-than: in `FILTER(1<2&&'\\u0027'!='\\u0027'&&3>2)` the span from `<` to `>`
    looks like an IRI. Decoded as one, its strings became three quotes each, and this DELETE,
    whose guard is false (pyoxigraph agrees), deleted every triple."""
    gateway = start_gateway()
    assert gateway.update("INSERT DATA { GRAPH <http://ex/g> { <http://ex/s> <http://ex/p> 'keep' } }").status == 200
    guard = r"FILTER(1<2&&'\u0027'!='\u0027'&&3>2)"
    assert not gateway.ask(f"ASK {{ {guard} }}")
    gateway.update(f"DELETE {{ GRAPH ?g {{ ?s ?p ?o }} }} WHERE {{ GRAPH ?g {{ ?s ?p ?o {guard} }} }}")
    assert gateway.ask("ASK { GRAPH <http://ex/g> { <http://ex/s> <http://ex/p> 'keep' } }")
