"""The publisher process: sends the update stream over HTTP with C requests in flight.

Run as ``python -m tools.wire.publisher --url URL --updates N --concurrency C``; prints one JSON
line with, per update k, when it was sent and when its reply arrived (``time.monotonic_ns``,
which on Linux is CLOCK_MONOTONIC, one clock for every process of the machine, so the subscriber
process's receive times can be subtracted from these send times).

Why a process of its own: the gateway replies to an update only after every subscription
processed it, and the client work (building requests, parsing replies) must not share an event
loop or a GIL with the subscriber's socket reads, or latency would measure the harness. The same
process, unchanged, sends the stream to Oxigraph, so the two throughputs are comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from typing import Any

import aiohttp

from tools.wire.secure import read_token, tls_context
from tools.wire.workload import MAX_CONCURRENCY, update_stream

UPDATE_TYPE = "application/sparql-update"
REQUEST_TIMEOUT_S = 30.0


async def publish(
    url: str, n: int, concurrency: int, token: str | None = None, cafile: str | None = None
) -> dict[str, Any]:
    """Send updates 0..n-1 in order, `concurrency` at a time, each on a keep-alive connection (with
    `token` and `cafile`: to the secure gates, a bearer token on each, TLS verified)."""
    bodies = [update.sparql.encode() for update in update_stream(n)]
    sent = [0] * n
    done = [0] * n
    status = [0] * n
    errors: list[str] = []
    headers = {"Content-Type": UPDATE_TYPE}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    next_k = 0
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=tls_context(cafile) if cafile else True)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            nonlocal next_k
            while next_k < n:
                k = next_k
                next_k += 1
                sent[k] = time.monotonic_ns()
                try:
                    async with session.post(url, data=bodies[k], headers=headers) as response:
                        body = await response.read()
                        status[k] = response.status
                        if response.status >= 300 and len(errors) < 5:
                            errors.append(f"update {k}: {response.status} {body[:200].decode(errors='replace')}")
                except (TimeoutError, aiohttp.ClientError) as error:
                    status[k] = -1
                    if len(errors) < 5:
                        errors.append(f"update {k}: {type(error).__name__}: {error}")
                done[k] = time.monotonic_ns()

        started = time.monotonic_ns()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        finished = time.monotonic_ns()
    codes = Counter(str(code) for code in status)
    return {
        "updates": n,
        "concurrency": concurrency,
        "started_ns": started,
        "finished_ns": finished,
        "sent_ns": sent,
        "done_ns": done,
        "status": dict(codes),
        "failed": sum(count for code, count in codes.items() if not code.startswith("2")),
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the SPARQL update endpoint")
    parser.add_argument("--updates", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    parser.add_argument("--token-file", help="secure gates: the bearer token, in a file")
    parser.add_argument("--cafile", help="secure gates: the certificate to verify them with")
    args = parser.parse_args(argv)
    token = read_token(args.token_file) if args.token_file else None
    if not (1 <= args.concurrency <= MAX_CONCURRENCY and args.updates >= 1):
        print(json.dumps({"error": f"need updates >= 1 and 1 <= concurrency <= {MAX_CONCURRENCY}"}), flush=True)
        return 2
    try:
        result = asyncio.run(
            asyncio.wait_for(publish(args.url, args.updates, args.concurrency, token, args.cafile), args.timeout)
        )
    except TimeoutError:
        print(json.dumps({"error": f"the stream did not finish within {args.timeout:.0f} s"}), flush=True)
        return 1
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
