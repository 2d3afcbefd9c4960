"""The subscriber process: holds profile S over a few WebSockets and timestamps every notification.

Run as ``python -m tools.wire.subscriber --url ws://... --sockets 4``. It subscribes the 1,004
queries of profile S, spread evenly over the sockets (many subscriptions per socket, as a real
dashboard or adapter would), waits for every sequence-0 reply and prints ``{"ready": ...}``. Then
it records each later notification with ``time.monotonic_ns()`` taken as the message is handed
to it, before any JSON parsing. On ``{"stop": true, "expect": E}`` on stdin it waits until E
notifications arrived (or ``grace_s`` passed), prints them and exits. EOF on stdin (the harness
is gone) ends it too.

Why a process of its own: see :mod:`tools.wire.publisher`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

from tools.wire.secure import read_token, tls_context
from tools.wire.workload import subscriptions

Record = list[Any]  # [alias, sequence, received_ns, [[lamp or None, dimming or None], ...]]


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Subscriber:
    """The sockets, the sequence-0 bookkeeping and the notification records."""

    def __init__(self, expected_aliases: set[str]) -> None:
        self.waiting_zero = set(expected_aliases)
        self.ready = asyncio.Event()
        self.records: list[Record] = []
        self.enough = asyncio.Event()
        self.expect: int | None = None
        self.errors: list[Any] = []
        self.failed = asyncio.Event()
        self.closing = False

    def on_message(self, received_ns: int, data: str) -> None:
        body = json.loads(data)
        notification = body.get("notification") if isinstance(body, dict) else None
        if notification is None:
            self.errors.append(body)
            self.failed.set()
            return
        alias = notification.get("alias")
        sequence = notification.get("sequence")
        if sequence == 0:
            self.waiting_zero.discard(alias)
            if not self.waiting_zero:
                self.ready.set()
            return
        rows = notification["addedResults"]["results"]["bindings"]
        added = [[row.get("lamp", {}).get("value"), row.get("dimming", {}).get("value")] for row in rows]
        self.records.append([alias, sequence, received_ns, added])
        if self.expect is not None and len(self.records) >= self.expect:
            self.enough.set()

    async def read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for message in ws:
            received_ns = time.monotonic_ns()
            if message.type == aiohttp.WSMsgType.TEXT:
                self.on_message(received_ns, message.data)
            elif message.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSED):
                break
        if not self.closing:
            self.errors.append(f"socket closed by the gateway (code {ws.close_code})")
            self.failed.set()


async def _first(*events: asyncio.Event, timeout: float) -> None:
    """Wait until any of `events` is set, or `timeout` passes."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def run(url: str, sockets: int, timeout: float, token: str | None = None, cafile: str | None = None) -> int:
    subs = subscriptions()
    state = Subscriber({sub.name for sub in subs})
    loop = asyncio.get_running_loop()
    tls = tls_context(cafile) if cafile else True
    async with aiohttp.ClientSession() as session:
        connections = [await session.ws_connect(url, max_msg_size=64 << 20, ssl=tls) for _ in range(sockets)]
        readers = [asyncio.create_task(state.read(ws)) for ws in connections]
        started = time.perf_counter()
        for index, sub in enumerate(subs):
            message: dict[str, Any] = {"subscribe": {"sparql": sub.sparql, "alias": sub.name}}
            if token is not None:
                message["subscribe"]["authorization"] = f"Bearer {token}"
            await connections[index * sockets // len(subs)].send_str(json.dumps(message))
        await _first(state.ready, state.failed, timeout=timeout)
        if state.failed.is_set() or not state.ready.is_set():
            problem = state.errors[:3] or f"{len(state.waiting_zero)} sequence-0 replies missing after {timeout:.0f} s"
            _say({"error": f"subscribing failed: {problem}"})
            return 1
        _say({"ready": True, "subscriptions": len(subs), "sockets": sockets, "seconds": time.perf_counter() - started})

        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return 0  # the harness is gone
        command = json.loads(line)
        state.expect = int(command.get("expect", 0))
        if len(state.records) >= state.expect:
            state.enough.set()
        await _first(state.enough, state.failed, timeout=float(command.get("grace_s", 5.0)))
        _say({"notifications": state.records, "errors": [str(error)[:300] for error in state.errors[:5]]})
        state.closing = True
        for ws in connections:
            await ws.close()
        for reader in readers:
            reader.cancel()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the gateway's subscribe WebSocket URL")
    parser.add_argument("--sockets", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed for subscribing")
    parser.add_argument("--token-file", help="secure gates: the bearer token, in a file")
    parser.add_argument("--cafile", help="secure gates: the certificate to verify them with")
    args = parser.parse_args(argv)
    token = read_token(args.token_file) if args.token_file else None
    try:
        return asyncio.run(run(args.url, max(1, args.sockets), args.timeout, token, args.cafile))
    except (aiohttp.ClientError, OSError) as error:
        _say({"error": f"{type(error).__name__}: {error}"})
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
