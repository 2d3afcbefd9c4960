"""Re-evaluated subscriptions at scale: N OPTIONAL subscriptions on one WebSocket.

Each subscription is ``SELECT ?s ?v WHERE { ?s a <urn:t:Sensor> OPTIONAL { ?s <urn:t:value> ?v }
FILTER(?s != <urn:x:i>) }``: OPTIONAL makes it re-evaluated (not incremental), the FILTER makes
each text its own SPU, and each result has one row per sensor. Reported: the time until every
subscription had its first notification, the gateway's RSS before, after subscribing, after one
update that matches them all (and its reply time: every subscription is re-evaluated before the
reply), and 3 s after all were ended (memory given back).

Beside it, a bystander: another client with one subscription of its own (on other data) that
updates, queries and waits for its own notification every BYSTANDER_PERIOD_S, first alone
(`bystander.quiet`), then while the attacker sends `storms` matching updates back to back
(`bystander.storm`): what the attack costs everybody else (issue 16's bar: p99 under 50 ms).
Measured on the 2-core test machine, 1,000 x 200 rows, 20 storms: update p99 16-19 ms during the
storm (0.9 s when the update thread waited for the re-evaluations, see docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tools.wire.processes import Children, rss_mb, start_gateway
from tools.wire.report import percentile

Log = Callable[[str], None]
SETTLE_S = 3.0  # after the last unsubscribe: the trimmer runs 1 s after a burst
BYSTANDER_PERIOD_S = 0.05
QUIET_S = 2.0  # the bystander alone, before the storm


@dataclass(frozen=True)
class ReevalOptions:
    subscriptions: int = 1000
    rows: int = 200  # sensors: the rows of each result
    storms: int = 20  # matching updates sent back to back while the bystander measures (~10 rounds each)


class Bystander:
    """Another client: an update of its own data, the notification of it on its own WebSocket,
    and a query, every BYSTANDER_PERIOD_S; each one's latency in milliseconds, apart for the quiet
    phase and the storm. It runs in a process of its own, so that the attacker's client (which
    reads every notification of the storm) does not delay its measurements."""

    def __init__(self, ws_url: str, update_url: str) -> None:
        self.ws_url = ws_url
        self.update_url = update_url
        self.query_url = update_url.rsplit("/", 1)[0] + "/query"
        self.samples: dict[str, dict[str, list[float]]] = {
            phase: {"update": [], "notification": [], "query": []} for phase in ("quiet", "storm")
        }

    async def run(self, ready: Any, storming: Any, stop: Any) -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(self.ws_url) as ws:
            sparql = "SELECT ?v WHERE { <urn:b:x> <urn:b:v> ?v }"
            await ws.send_str(json.dumps({"subscribe": {"sparql": sparql, "alias": "bystander"}}))
            await ws.receive(timeout=600)  # its notification 0
            ready.set()
            count = 0
            # at least one round in the storm phase, even when the storm was shorter than a round
            while not (stop.is_set() and self.samples["storm"]["query"]):
                samples = self.samples["storm" if storming.is_set() else "quiet"]
                count += 1
                value = f"-{count}"
                started = time.perf_counter()
                async with session.post(
                    self.update_url,
                    data=f"INSERT DATA {{ <urn:b:x> <urn:b:v> {value} }}",
                    headers={"Content-Type": "application/sparql-update"},
                ) as reply:
                    await reply.read()
                samples["update"].append((time.perf_counter() - started) * 1000)
                while True:  # its own notification (sent before the reply: it may be read already)
                    message = json.loads((await ws.receive(timeout=600)).data)
                    added = message.get("notification", {}).get("addedResults", {}).get("results", {})
                    if any(row["v"]["value"] == value for row in added.get("bindings", [])):
                        break
                samples["notification"].append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                async with session.post(
                    self.query_url,
                    data="ASK { <urn:b:x> <urn:b:v> 0 }",
                    headers={"Content-Type": "application/sparql-query", "Accept": "application/sparql-results+json"},
                ) as reply:
                    await reply.read()
                samples["query"].append((time.perf_counter() - started) * 1000)
                await asyncio.sleep(BYSTANDER_PERIOD_S)

    def report(self) -> dict[str, Any]:
        """Per phase: p50 and p99 of each kind, and how many rounds."""
        out: dict[str, Any] = {}
        for phase, kinds in self.samples.items():
            figures: dict[str, Any] = {"rounds": len(kinds["query"])}
            for kind, values in kinds.items():
                figures[f"{kind}_p50_ms"] = round(percentile(values, 50) or 0.0, 1)
                figures[f"{kind}_p99_ms"] = round(percentile(values, 99) or 0.0, 1)
            out[phase] = figures
        return out


def _update(url: str, sparql: str) -> float:
    started = time.perf_counter()
    request = urllib.request.Request(url, sparql.encode(), {"Content-Type": "application/sparql-update"})
    with urllib.request.urlopen(request, timeout=600) as response:
        response.read()
    return (time.perf_counter() - started) * 1000


def bystander_main(ws_url: str, update_url: str, ready: Any, storming: Any, stop: Any, results: Any) -> None:
    """The bystander process: measure until `stop`, then put its report on `results`."""
    bystander = Bystander(ws_url, update_url)
    asyncio.run(bystander.run(ready, storming, stop))
    results.put(bystander.report())


async def _measure(url: str, update_url: str, pid: int, options: ReevalOptions) -> dict[str, Any]:
    report: dict[str, Any] = {"rss_start_mb": rss_mb(pid)}
    async with aiohttp.ClientSession() as session, session.ws_connect(url, max_msg_size=0) as ws:
        started = time.perf_counter()
        for i in range(options.subscriptions):
            sparql = (
                "SELECT ?s ?v WHERE { ?s a <urn:t:Sensor> OPTIONAL { ?s <urn:t:value> ?v } "
                f"FILTER(?s != <urn:x:{i}>) }}"
            )
            await ws.send_str(json.dumps({"subscribe": {"sparql": sparql, "alias": f"a{i}"}}))
        spuids: list[str] = []
        while len(spuids) < options.subscriptions:
            message = json.loads((await ws.receive(timeout=600)).data)
            if "error" in message:
                raise RuntimeError(f"subscribe refused: {message}")
            if message.get("notification", {}).get("sequence") == 0:
                spuids.append(message["notification"]["spuid"])
        report["subscribe_s"] = round(time.perf_counter() - started, 2)
        report["rss_subscribed_mb"] = rss_mb(pid)

        async def drain() -> None:
            while True:
                await ws.receive()

        draining = asyncio.create_task(drain())
        context = multiprocessing.get_context("spawn")
        ready, storming, stop, results = context.Event(), context.Event(), context.Event(), context.Queue()
        bystander = context.Process(
            target=bystander_main, args=(url, update_url, ready, storming, stop, results), daemon=True
        )
        bystander.start()
        await asyncio.to_thread(ready.wait, 60)
        await asyncio.sleep(QUIET_S)
        storming.set()
        replies: list[float] = []
        for k in range(1, options.storms + 1):
            sparql = f"INSERT DATA {{ <urn:s:0> <urn:t:value> -{k} }}"
            replies.append(await asyncio.to_thread(_update, update_url, sparql))
        stop.set()
        report["bystander"] = await asyncio.to_thread(results.get, True, 600)
        bystander.join(10)
        report["matching_update_ms"] = round(replies[0], 1)
        report["matching_updates_ms"] = [round(reply, 1) for reply in replies]
        report["rss_after_update_mb"] = rss_mb(pid)
        draining.cancel()
        await asyncio.gather(draining, return_exceptions=True)
        for spuid in spuids:
            await ws.send_str(json.dumps({"unsubscribe": {"spuid": spuid}}))
        ended = 0
        while ended < len(spuids):
            ended += "unsubscribed" in json.loads((await ws.receive(timeout=600)).data)
    await asyncio.sleep(SETTLE_S)
    report["rss_ended_mb"] = rss_mb(pid)
    return report


def run(options: ReevalOptions, log: Log | None = None) -> dict[str, Any]:
    say = log or (lambda _message: None)
    with tempfile.TemporaryDirectory(prefix="sepa-bench-reeval-") as directory, Children() as children:
        gateway = start_gateway(children, Path(directory), allow_load=False, max_request_bytes=64 << 20)
        sensors = " ".join(
            f"<urn:s:{i}> a <urn:t:Sensor> ." + (f" <urn:s:{i}> <urn:t:value> {i} ." if i % 2 else "")
            for i in range(options.rows)
        )
        _update(gateway.update_url, f"INSERT DATA {{ {sensors} }}")
        say(f"{options.rows} sensors loaded; subscribing {options.subscriptions}")
        report = asyncio.run(_measure(gateway.subscribe_url, gateway.update_url, gateway.child.pid, options))
        say(" ".join(f"{key}={value}" for key, value in report.items()))
        return {"subscriptions": options.subscriptions, "rows": options.rows, **report}
