"""Loading the lighting knowledge base into the gateway and into Oxigraph, over HTTP, quickly.

Why not one INSERT DATA per triple: 334k requests would take minutes and measure nothing useful.
The knowledge base is serialized once to N-Triples chunks (pyoxigraph's serializer, in Rust) and:

- ``load`` (default): the harness serves the chunks from a throw-away HTTP server on 127.0.0.1 and
  the gateway pulls each with a ``LOAD <http://127.0.0.1:P/kb/I.nt>`` update, so the triples are
  parsed by pyoxigraph's N-Triples parser, not the gateway's SPARQL quad-block parser (the
  gateway needs ``[engine] allow_load = true``, which the benchmark's config sets);
- ``insert``: a handful of large ``INSERT DATA`` requests (N-Triples is valid SPARQL quad data),
  which needs ``[http] max_request_bytes`` raised, and exercises the gateway's own parser;
- Oxigraph gets the same chunks through its Graph Store endpoint (``POST /store?default``).

Both stores are then asked for their size, so the comparison is known to start from equal data.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from pyoxigraph import RdfFormat, serialize

from tools.wire.processes import HOST, BenchError, free_port
from tools.wire.workload import kb_quads

LOAD_CHUNK_TRIPLES = 60_000  # ~10 MB of N-Triples: well under the gateway's 64 MiB LOAD limit
INSERT_CHUNK_TRIPLES = 20_000  # ~3.5 MB per INSERT DATA request
NTRIPLES = "application/n-triples"
UPDATE = "application/sparql-update"
COUNT_QUERY = "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }"
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=300)


@dataclass(frozen=True)
class KnowledgeBase:
    """The knowledge base as N-Triples chunks, ready to send."""

    chunks: tuple[bytes, ...]
    triples: int
    seconds: float  # generation and serialization time

    @property
    def size_bytes(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)


def generate(lamps_per_road: int | None, chunk_triples: int) -> KnowledgeBase:
    """Serialize the (optionally capped) knowledge base to N-Triples chunks of `chunk_triples`."""
    started = time.perf_counter()
    quads = kb_quads(lamps_per_road)
    chunks: list[bytes] = []
    triples = 0
    while batch := [quad.triple for quad in itertools.islice(quads, chunk_triples)]:
        chunks.append(serialize(batch, format=RdfFormat.N_TRIPLES) or b"")
        triples += len(batch)
    return KnowledgeBase(tuple(chunks), triples, time.perf_counter() - started)


async def _post(session: aiohttp.ClientSession, url: str, body: bytes, content_type: str) -> None:
    async with session.post(url, data=body, headers={"Content-Type": content_type}) as response:
        text = await response.text()
        if response.status >= 300:
            raise BenchError(f"loading failed: {url} answered {response.status}: {text[:300]}")


async def load_gateway(update_url: str, kb: KnowledgeBase, method: str) -> float:
    """Load `kb` into the gateway with LOAD or INSERT DATA requests; returns the seconds it took."""
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        if method == "insert":
            started = time.perf_counter()
            for chunk in kb.chunks:
                await _post(session, update_url, b"INSERT DATA {\n" + chunk + b"\n}", UPDATE)
            return time.perf_counter() - started
        if method != "load":
            raise ValueError(f"unknown load method {method!r}")

        async def serve_chunk(request: web.Request) -> web.Response:
            index = int(request.match_info["index"])
            if not 0 <= index < len(kb.chunks):
                raise web.HTTPNotFound()
            return web.Response(body=kb.chunks[index], content_type=NTRIPLES)

        app = web.Application()
        app.add_routes([web.get("/kb/{index:\\d+}.nt", serve_chunk)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        try:
            await web.TCPSite(runner, HOST, port).start()
            started = time.perf_counter()
            for index in range(len(kb.chunks)):
                await _post(session, update_url, f"LOAD <http://{HOST}:{port}/kb/{index}.nt>".encode(), UPDATE)
            return time.perf_counter() - started
        finally:
            await runner.cleanup()


async def load_oxigraph(base_url: str, kb: KnowledgeBase) -> float:
    """Load `kb` into Oxigraph's default graph through its Graph Store endpoint."""
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        started = time.perf_counter()
        for chunk in kb.chunks:
            await _post(session, f"{base_url}/store?default", chunk, NTRIPLES)
        return time.perf_counter() - started


async def count_triples(query_url: str) -> int:
    """The number of triples in the default graph, asked over the SPARQL protocol."""
    async with (
        aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session,
        session.get(
            query_url, params={"query": COUNT_QUERY}, headers={"Accept": "application/sparql-results+json"}
        ) as response,
    ):
        if response.status != 200:
            raise BenchError(f"{query_url} answered {response.status} to COUNT: {(await response.text())[:300]}")
        body = await response.json(content_type=None)
    return int(body["results"]["bindings"][0]["n"]["value"])
