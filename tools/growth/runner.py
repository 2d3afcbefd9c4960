"""Store growth: one value replaced N times over HTTP; lookup and update cost as it goes.

pyoxigraph keeps dead versions (broker/store/): without compaction, a value replaced 50,000
times made its lookup 55x slower in memory and 250x on disk. The gateway is started as for the
wire benchmark (in memory, or with a data directory), `filler` unrelated triples are loaded (1,000;
more, a large store: a compaction due at twice its live quads came late for one hot key, see
broker.compaction), then
the value `<s> <p> ?o` is replaced N times, one HTTP update at a time on a kept-alive connection.
Every window of replacements reports the median update reply and the median of 100 lookups of
the value; the figure of merit is the worst window against the first.
"""

from __future__ import annotations

import http.client
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tools.wire.processes import Children, rss_mb, start_gateway

Log = Callable[[str], None]
UPDATE = "application/sparql-update"
FILLER_CHUNK = 20_000  # triples of one INSERT DATA (~0.8 MB)
LOOKUP = "SELECT ?o WHERE { <urn:growth:s> <urn:growth:p> ?o }"
REPLACE = "DELETE { <urn:growth:s> <urn:growth:p> ?o } INSERT { <urn:growth:s> <urn:growth:p> %d } WHERE { <urn:growth:s> <urn:growth:p> ?o }"  # noqa: E501


@dataclass(frozen=True)
class GrowthOptions:
    replacements: int = 50_000
    window: int = 2_500
    lookups: int = 100
    filler: int = 1_000


class _Client:
    def __init__(self, update_url: str) -> None:
        parts = urlsplit(update_url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)

    def post(self, path: str, body: str, content_type: str) -> float:
        started = time.perf_counter()
        self.connection.request(
            "POST", path, body.encode(), {"Content-Type": content_type, "Accept": "application/json"}
        )
        response = self.connection.getresponse()
        response.read()
        if response.status >= 300:
            raise RuntimeError(f"{path}: HTTP {response.status}")
        return (time.perf_counter() - started) * 1000


def _one_store(options: GrowthOptions, on_disk: bool, say: Log) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sepa-bench-growth-") as directory, Children() as children:
        gateway = start_gateway(children, Path(directory), allow_load=False, max_request_bytes=1 << 20, on_disk=on_disk)
        client = _Client(gateway.update_url)
        for start in range(0, options.filler, FILLER_CHUNK):  # under the request size limit
            numbers = range(start, min(options.filler, start + FILLER_CHUNK))
            filler = " ".join(f"<urn:growth:x{n}> <urn:growth:p> {n} ." for n in numbers)
            client.post("/update", f"INSERT DATA {{ {filler} }}", UPDATE)
        client.post("/update", "INSERT DATA { <urn:growth:s> <urn:growth:p> 0 }", UPDATE)
        windows: list[dict[str, float]] = []
        done = 0
        while done < options.replacements:
            updates = []
            for _ in range(min(options.window, options.replacements - done)):
                done += 1
                updates.append(client.post("/update", REPLACE % done, UPDATE))
            lookups = [client.post("/query", LOOKUP, "application/sparql-query") for _ in range(options.lookups)]
            windows.append({
                "replacements": done,
                "update_ms": round(statistics.median(updates), 3),
                "lookup_ms": round(statistics.median(lookups), 3),
                "rss_mb": rss_mb(gateway.child.pid),
            })  # fmt: skip
            say(f"{'disk' if on_disk else 'memory'}: {windows[-1]}")
        first = windows[0]
        return {
            "lookup_first_ms": first["lookup_ms"],
            "lookup_worst_ratio": round(max(w["lookup_ms"] for w in windows) / first["lookup_ms"], 2),
            "update_first_ms": first["update_ms"],
            "update_worst_ratio": round(max(w["update_ms"] for w in windows) / first["update_ms"], 2),
            "windows": windows,
        }


def run(options: GrowthOptions, log: Log | None = None) -> dict[str, Any]:
    say = log or (lambda _message: None)
    return {
        "replacements": options.replacements,
        "filler": options.filler,
        "memory": _one_store(options, False, say),
        "disk": _one_store(options, True, say),
    }
