"""Re-evaluated subscriptions at scale: N OPTIONAL subscriptions on one WebSocket.

Each subscription is ``SELECT ?s ?v WHERE { ?s a <urn:t:Sensor> OPTIONAL { ?s <urn:t:value> ?v }
FILTER(?s != <urn:x:i>) }``: OPTIONAL makes it re-evaluated (not incremental), the FILTER makes
each text its own SPU, and each result has one row per sensor. Reported: the time until every
subscription had its first notification, the gateway's RSS before, after subscribing, after one
update that matches them all (and its reply time: every subscription is re-evaluated before the
reply), and 3 s after all were ended (memory given back).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tools.wire.processes import Children, rss_mb, start_gateway

Log = Callable[[str], None]
SETTLE_S = 3.0  # after the last unsubscribe: the trimmer runs 1 s after a burst


@dataclass(frozen=True)
class ReevalOptions:
    subscriptions: int = 1000
    rows: int = 200  # sensors: the rows of each result


def _update(url: str, sparql: str) -> float:
    started = time.perf_counter()
    request = urllib.request.Request(url, sparql.encode(), {"Content-Type": "application/sparql-update"})
    with urllib.request.urlopen(request, timeout=600) as response:
        response.read()
    return (time.perf_counter() - started) * 1000


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
        report["matching_update_ms"] = round(
            await asyncio.to_thread(_update, update_url, "INSERT DATA { <urn:s:0> <urn:t:value> -1 }"), 1
        )
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
