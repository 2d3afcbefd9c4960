"""Runs the wire benchmark: gateway phase, then Oxigraph phase, each with its own processes.

Procedure:

1. Generate the knowledge base as N-Triples chunks (:mod:`tools.wire.loader`).
2. Start ``sepa-gateway run`` (in-memory store, free 127.0.0.1 ports), load the knowledge base
   over HTTP and check the store's size with a COUNT query.
3. Start the subscriber process; it holds profile S (1,004 subscriptions) on a few WebSockets and
   reports once every sequence-0 reply arrived.
4. Start the publisher process; it sends the N updates with C in flight and reports its stamps.
5. Tell the subscriber to stop once it has the expected notifications; stop the gateway.
6. Start ``oxigraph serve`` (in-memory), load the same chunks, run the same publisher, stop it.

The phases run one after the other so that the gateway and Oxigraph each have the machine to
themselves (with their clients). Every process is stopped on the way out, whatever happens.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.wire import loader, oxigraph, processes, report, workload
from tools.wire.processes import BenchError, Children, python_module
from tools.wire.secure import login

Log = Callable[[str], None]
INSERT_MAX_REQUEST_BYTES = 64 << 20
ENGINE_STAGES = ("t_update", "t_lutt", "t_booster", "t_notify")  # t_apply is inside t_update


@dataclass(frozen=True)
class WireOptions:
    """What one run does; the defaults are the benchmark's."""

    updates: int = 3000
    concurrency: int = 8
    sockets: int = 4
    lamps_per_road: int | None = None  # None: the full ~334k-triple knowledge base
    load_method: str = "load"  # "load" (LOAD of served N-Triples) or "insert" (INSERT DATA chunks)
    oxigraph: bool = True
    timeout_s: float = 900.0
    secure: bool = False  # also run the gateway phase over HTTPS + WSS with a registered client and its token
    on_disk: bool = False  # the gateway with a data directory (durable acknowledgements)
    mode: str = "sequential"  # the gateway's engine mode: "sequential" or "parallel"
    workers: int = 0  # parallel mode's BOOSTER workers (0: the gateway's default)


class Deadline:
    """The run's overall time budget; each wait takes at most what is left of it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self, cap: float) -> float:
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise BenchError(f"the benchmark did not finish within its {self.seconds:.0f} s limit (--timeout)")
        return min(cap, remaining)


def engine_seconds(metrics_url: str) -> float:
    """Seconds the gateway's engine spent in updates so far, from its /metrics stage timers."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for stage, value in re.findall(r'^sepa_stage_seconds_total\{stage="(\w+)"\} (\S+)$', text, re.MULTILINE):
        if stage in ENGINE_STAGES:
            total += float(value)
    return total


def publish(
    children: Children,
    url: str,
    options: WireOptions,
    deadline: Deadline,
    label: str,
    log: Log,
    credentials: tuple[str, ...] = (),
) -> dict:
    """Run the publisher process against `url` and return its report (`credentials`: its secure options)."""
    limit = deadline.left(options.timeout_s)
    argv = python_module(
        "tools.wire.publisher",
        "--url",
        url,
        "--updates",
        str(options.updates),
        "--concurrency",
        str(options.concurrency),
        "--timeout",
        f"{limit:.0f}",
        *credentials,
    )
    log(f"{label}: sending {options.updates:,} updates, {options.concurrency} in flight")
    publisher = children.start(f"{label} publisher", argv, pipes=True)
    try:
        result = publisher.receive(limit + 10)
    finally:
        children.stop(publisher)
    ups = report.throughput(result)
    problems = f": {result['errors']}" if result["errors"] else ""
    log(f"{label}: {ups or 0:,.0f} updates/s, {result['failed']} failed{problems}")
    return result


def gateway_phase(
    children: Children,
    workdir: Path,
    kb: loader.KnowledgeBase,
    options: WireOptions,
    expected: int,
    deadline: Deadline,
    log: Log,
    secure: bool = False,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(facts, publisher report, subscriber report) of the gateway with its subscriptions.

    With `secure`, the updates and the subscriptions go through the secure gates (HTTPS + WSS, a
    bearer token on each); the knowledge base is still loaded through the plain gate."""
    label = "secure gateway" if secure else "gateway"
    gateway = processes.start_gateway(
        children,
        workdir,
        allow_load=options.load_method == "load",
        max_request_bytes=INSERT_MAX_REQUEST_BYTES,
        timeout=deadline.left(60),
        secure=secure,
        on_disk=options.on_disk,
        mode=options.mode,
        workers=options.workers,
    )
    credentials: tuple[str, ...] = ()
    update_url, subscribe_url = gateway.update_url, gateway.subscribe_url
    if secure:
        token_file, cafile = login(gateway, workdir)
        credentials = ("--token-file", str(token_file), "--cafile", str(cafile))
        update_url, subscribe_url = gateway.secure_update_url, gateway.secure_subscribe_url
    log(f"{label}: pid {gateway.child.pid}, {update_url}, {subscribe_url}")
    with processes.explain_failure(gateway.child):
        load_s = asyncio.run(
            asyncio.wait_for(loader.load_gateway(gateway.update_url, kb, options.load_method), deadline.left(600))
        )
        triples = asyncio.run(loader.count_triples(gateway.query_url))
        log(f"gateway: {triples:,} triples loaded in {load_s:.2f} s ({options.load_method}, {len(kb.chunks)} requests)")
        if triples != kb.triples:
            raise BenchError(f"the gateway holds {triples} triples after loading, not {kb.triples}")

        argv = python_module(
            "tools.wire.subscriber",
            "--url",
            subscribe_url,
            "--sockets",
            str(options.sockets),
            "--timeout",
            f"{deadline.left(300):.0f}",
            *credentials,
        )
        subscriber = children.start("subscriber", argv, pipes=True)
        ready = subscriber.receive(deadline.left(300) + 10)
        log(
            f"subscriber: {ready['subscriptions']:,} subscriptions on {ready['sockets']} WebSockets, "
            f"every sequence-0 reply in {ready['seconds']:.2f} s"
        )

        metrics_url = f"http://{processes.HOST}:{gateway.http_port}/metrics"
        engine_before = engine_seconds(metrics_url)
        published = publish(children, update_url, options, deadline, label, log, credentials)
        engine_s = engine_seconds(metrics_url) - engine_before

        subscriber.send({"stop": True, "expect": expected, "grace_s": 5.0})
        notes = subscriber.receive(deadline.left(30))
        children.stop(subscriber)
        log(f"subscriber: {len(notes['notifications']):,} notifications received (expected {expected:,})")
    code = children.stop(gateway.child)
    if code not in (0, None):
        log(f"gateway: exited with code {code}:\n{gateway.child.log_tail()}")
    wall_s = (published["finished_ns"] - published["started_ns"]) / 1e9
    facts = {
        "triples": triples,
        "load_seconds": round(load_s, 2),
        "load_method": options.load_method,
        "subscriptions": ready["subscriptions"],
        "sockets": ready["sockets"],
        "subscribe_seconds": round(ready["seconds"], 2),
        "engine_ms_per_update": round(1000 * engine_s / options.updates, 4),
        "engine_busy_percent": round(100 * engine_s / wall_s, 1) if wall_s > 0 else None,
    }
    return facts, published, notes


def oxigraph_phase(
    children: Children,
    workdir: Path,
    kb: loader.KnowledgeBase,
    binary: str,
    options: WireOptions,
    deadline: Deadline,
    log: Log,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(facts, publisher report) of Oxigraph with the same knowledge base and stream."""
    server = oxigraph.start(children, binary, workdir, timeout=deadline.left(60))
    log(f"oxigraph: pid {server.child.pid}, {server.base_url}")
    with processes.explain_failure(server.child):
        load_s = asyncio.run(asyncio.wait_for(loader.load_oxigraph(server.base_url, kb), deadline.left(600)))
        triples = asyncio.run(loader.count_triples(server.query_url))
        log(f"oxigraph: {triples:,} triples loaded in {load_s:.2f} s")
        if triples != kb.triples:
            raise BenchError(f"Oxigraph holds {triples} triples after loading, not {kb.triples}")
        published = publish(children, server.update_url, options, deadline, "oxigraph", log)
    children.stop(server.child)
    return {"oxigraph_triples": triples, "oxigraph_load_seconds": round(load_s, 2)}, published


def run(options: WireOptions, log: Log | None = None) -> dict[str, Any]:
    """The whole benchmark; returns the JSON document of :func:`tools.wire.report.summarize`."""
    say = log or (lambda _message: None)
    if not 1 <= options.concurrency <= workload.MAX_CONCURRENCY:
        raise BenchError(f"--concurrency must be between 1 and {workload.MAX_CONCURRENCY}")
    deadline = Deadline(options.timeout_s)
    binary = oxigraph.find_binary() if options.oxigraph else None
    if options.oxigraph and binary is None:
        raise BenchError(oxigraph.INSTALL_HINT + "; or run with --no-oxigraph")

    stream = workload.update_stream(options.updates)
    expected = workload.expected_notifications(stream, workload.subscriptions())
    chunk = loader.LOAD_CHUNK_TRIPLES if options.load_method == "load" else loader.INSERT_CHUNK_TRIPLES
    kb = loader.generate(options.lamps_per_road, chunk)
    say(
        f"knowledge base: {kb.triples:,} triples, {kb.size_bytes / 1e6:.0f} MB of N-Triples in "
        f"{len(kb.chunks)} chunks, generated in {kb.seconds:.1f} s"
    )

    with tempfile.TemporaryDirectory(prefix="sepa-wire-") as tmp, Children() as children:
        workdir = Path(tmp)
        facts, published, notes = gateway_phase(children, workdir, kb, options, len(expected), deadline, say)
        secure = None
        if options.secure:
            secure = gateway_phase(children, workdir, kb, options, len(expected), deadline, say, secure=True)
        oxigraph_published = None
        if binary is not None:
            oxigraph_facts, oxigraph_published = oxigraph_phase(children, workdir, kb, binary, options, deadline, say)
            facts.update(oxigraph_facts)
    matching = report.match(expected, stream, notes["notifications"], published["sent_ns"])
    result = report.summarize(
        published=published, matching=matching, oxigraph_published=oxigraph_published, facts=facts
    )
    if secure is not None:
        _, secure_published, secure_notes = secure
        secure_matching = report.match(expected, stream, secure_notes["notifications"], secure_published["sent_ns"])
        result.update(report.summarize_secure(secure_published, secure_matching, published))
    return result
