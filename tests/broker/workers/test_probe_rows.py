"""The results a subscription may have when it subscribes ([websocket] max_subscription_rows;
broker.workers.jobs.probe, over real sockets at the end).

What it protects: a subscription holds its result for as long as it lives and sends it whole in
its first notification; a 60-byte product of a 700-triple store with itself was a 125 MB first
notification and took the gateway's RSS to 877 MB. Past the limit the subscribe gets a 413 error
frame and nothing is held; the probe still evaluates every result it keeps no text of (the time
limit's guarantee), and keeps the text of a small one as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
import pytest
from pyoxigraph import NamedNode, Quad

from broker.api import RdfStore, ResultTooLarge
from broker.core.query_processor import QueryProcessor
from broker.workers.jobs import probe
from tools.launcher import RunningGateway

EX = "http://example.org/"


def product(side: int) -> str:
    return f"SELECT * WHERE {{ ?s <{EX}p> ?o . ?a <{EX}p{side}> ?c }}"


@pytest.fixture(scope="module")
def processor() -> QueryProcessor:
    """<EX>p: 150 triples; <EX>p10: 10 of them, <EX>p150: 150 (products of 1,500 and 22,500 rows:
    the second's TSV is past the 1 MB kept)."""
    store = RdfStore.memory()
    quads = [Quad(NamedNode(f"{EX}s{i}"), NamedNode(f"{EX}p"), NamedNode(f"{EX}o{i}")) for i in range(150)]
    quads += [Quad(NamedNode(f"{EX}t{i}"), NamedNode(f"{EX}p10"), NamedNode(f"{EX}o{i}")) for i in range(10)]
    quads += [Quad(NamedNode(f"{EX}u{i}"), NamedNode(f"{EX}p150"), NamedNode(f"{EX}o{i}")) for i in range(150)]
    store.ox.extend(quads)
    return QueryProcessor(store)


@pytest.mark.parametrize(("side", "rows"), [(10, 1500), (150, 22_500)])
def test_a_result_of_exactly_the_limit_is_taken_one_more_is_refused(
    processor: QueryProcessor, side: int, rows: int
) -> None:
    counted, kept, _seconds = probe(processor, product(side), keep_bytes=1 << 20, max_rows=rows)
    assert counted == rows
    assert (kept is not None) == (side == 10)  # the small one's text is kept, the large one's not
    with pytest.raises(ResultTooLarge, match=f"more than {rows - 1} rows .*max_subscription_rows"):
        probe(processor, product(side), keep_bytes=1 << 20, max_rows=rows - 1)


def test_without_a_limit_the_probe_keeps_what_it_kept() -> None:
    store = RdfStore.memory()
    store.ox.add(Quad(NamedNode(f"{EX}s"), NamedNode(f"{EX}p"), NamedNode(f"{EX}o")))
    rows, text, _seconds = probe(QueryProcessor(store), f"SELECT ?s WHERE {{ ?s <{EX}p> ?o }}", keep_bytes=1 << 20)
    assert rows == 1 and text is not None and text.splitlines() == [b"?s", f"<{EX}s>".encode()]


def test_a_subscription_past_the_limit_over_real_sockets_gets_an_error_frame_and_the_socket_lives(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    gateway = start_gateway(toml="[websocket]\nmax_subscription_rows = 50\n")
    seed = " ".join(f"<{EX}s{i}> <{EX}p> {i} ." for i in range(51))
    assert gateway.update(f"INSERT DATA {{ {seed} }}").status == 200

    async def main() -> tuple[dict, dict]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{gateway.ws_url}/subscribe") as ws:
            frames = []
            queries = {
                "all": f"SELECT * WHERE {{ ?s <{EX}p> ?o }}",
                "fifty": f"SELECT * WHERE {{ ?s <{EX}p> ?o FILTER(?o < 50) }}",
            }
            for alias, query in queries.items():
                await ws.send_json({"subscribe": {"sparql": query, "alias": alias}})
                frames.append(json.loads((await ws.receive(timeout=10)).data))
            return frames[0], frames[1]

    refused, held = asyncio.run(main())
    assert (refused["status_code"], refused["alias"]) == (413, "all"), refused
    assert "max_subscription_rows" in refused["error_description"]
    assert len(held["notification"]["addedResults"]["results"]["bindings"]) == 50
