"""Slow, stalled and vanished subscribers cannot hurt the gateway or the other clients.

What it protects (PROTOCOL.md "Liveness", the WebSocket gate's per-connection queues, and the
`websocket.queue_limit` / `websocket.heartbeat_s` settings of systemd/sepa-gateway.toml):

(a) a subscriber that stops reading while updates flow does not delay anyone else: the
    notification latency of a healthy subscriber and the update replies stay what they are without
    the stalled one (percentiles of phases alone and beside it, alternated, with a generous margin), and
    the stalled connection really is backed up meanwhile. With a small `queue_limit` the stalled
    client is disconnected, its subscription ended and its socket freed, and the gateway logs why;
(b) a client that vanishes without a close frame is noticed: one that stops answering pings is
    dropped within the heartbeat (its subscriptions end, its socket is freed, even when it also
    had unread data piling up), and a killed client process is dropped at once. A healthy client
    on the same gateway stays connected through several heartbeats.

The misbehaving clients are raw sockets (`RawWebSocket`) that complete the WebSocket handshake and
then simply stop reading and never answer pings; a small SO_RCVBUF makes the stall back up fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.appliance.config import Config
from tests.broker.gates.secure_support import secure_config
from tests.broker.gates.subscribe_support import (
    RawWebSocket,
    RunningGateway,
    holds_connection_from,
    post_update,
    receive_json,
    send_queue_to,
    subscribe,
    wait_for_metric,
)
from tests.support.coap import host_address
from tools.launcher import InProcessGateway

EX = "http://example.org/slow/"
SUBJECT, PREDICATE = f"<{EX}s>", f"<{EX}p>"
ROOT = Path(__file__).resolve().parents[3]
QUERY = f"SELECT ?o WHERE {{ {SUBJECT} {PREDICATE} ?o }}"
TINY_RECEIVE_BUFFER = 4096


def replace_value(index: int, size: int) -> str:
    """An update whose notification carries one removed and one added literal of about `size` bytes."""
    value = f"{index}-" + "x" * size
    return f'DELETE WHERE {{ {SUBJECT} {PREDICATE} ?o }} ; INSERT DATA {{ {SUBJECT} {PREDICATE} "{value}" }}'


def stalled_subscriber(gateway: RunningGateway) -> RawWebSocket:
    """A client that subscribes, reads its sequence-0 notification and then never reads again."""
    client = RawWebSocket(gateway.ws_port, receive_buffer=TINY_RECEIVE_BUFFER)
    client.send_json({"subscribe": {"sparql": QUERY, "alias": "stalled"}})
    assert client.receive_json()["notification"]["sequence"] == 0
    return client


def percentile(samples: list[float], fraction: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[round(fraction * 100) - 1]


async def updates_with_latency(
    session: aiohttp.ClientSession,
    gateway: RunningGateway,
    ws: aiohttp.ClientWebSocketResponse,
    start: int,
    count: int,
    size: int,
) -> tuple[list[float], list[float]]:
    """Run `count` updates; per update, the time to the HTTP reply and to the healthy notification."""
    loop = asyncio.get_running_loop()
    replies, latencies = [], []
    for index in range(start, start + count):
        sent = loop.time()
        await post_update(session, gateway, replace_value(index, size))
        replied = loop.time()
        notification = (await receive_json(ws))["notification"]
        received = loop.time()
        assert notification["addedResults"]["results"]["bindings"][0]["o"]["value"].startswith(f"{index}-")
        replies.append(replied - sent)
        latencies.append(received - sent)
    return replies, latencies


def test_a_stalled_subscriber_does_not_delay_the_others(gateway: RunningGateway) -> None:
    """Phases alone and beside a stalled subscriber alternate, 100 updates each (a new stalled
    socket for each phase beside one), and each percentile compared is the median of the phases'.

    Why: the phases ran once each, one after the other (300 updates alone, then 300 beside the
    stalled one), so load that rose or fell between them moved the comparison, and a burst of it
    in either phase moved its p95 (shared 2-core machine at load 5-13, 2026-12-07). Alternated,
    a drift reaches both kinds alike and a burst reaches one phase of three or four."""
    rounds, updates, size = 3, 100, 8000  # ~16 kB per notification

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as ws:
            await subscribe(ws, {"sparql": QUERY, "alias": "healthy"})
            await updates_with_latency(session, gateway, ws, 0, 20, size)  # warm-up
            alone = [await updates_with_latency(session, gateway, ws, 100, updates, size)]
            beside: list[tuple[list[float], list[float]]] = []
            for number in range(1, rounds + 1):
                stalled = await asyncio.get_running_loop().run_in_executor(None, stalled_subscriber, gateway)
                try:
                    # ~6 MB first: past what the kernel takes for it (tcp_wmem's 4 MB here), so the
                    # gateway's writer for it is stuck and its queue grows while the phase runs
                    await updates_with_latency(session, gateway, ws, 1000 * number + 200, 30, 100_000)
                    beside.append(await updates_with_latency(session, gateway, ws, 1000 * number, updates, size))
                    # The stall was real: the stalled subscription is still there and its socket is backed up.
                    assert await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value >= 2) == 2
                    backlog = send_queue_to(gateway, stalled.local_port)
                    if backlog is not None:
                        assert backlog > 64 * 1024, f"the stalled client was not backed up (send queue {backlog} B)"
                finally:
                    stalled.close()
                await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 1, timeout=60)
                alone.append(await updates_with_latency(session, gateway, ws, 1000 * number + 500, updates, size))

        def typical(phases: list[tuple[list[float], list[float]]], kind: int, fraction: float) -> float:
            return statistics.median(percentile(phase[kind], fraction) for phase in phases)

        report = ", ".join(
            f"{name} p50/p95 alone {typical(alone, kind, 0.5) * 1e3:.2f}/{typical(alone, kind, 0.95) * 1e3:.2f} ms, "
            f"beside a stalled subscriber {typical(beside, kind, 0.5) * 1e3:.2f}/"
            f"{typical(beside, kind, 0.95) * 1e3:.2f} ms"
            for kind, name in ((0, "replies"), (1, "healthy NL"))
        )
        for fraction, margin in ((0.5, 0.005), (0.95, 0.015)):
            for kind in (0, 1):
                assert typical(beside, kind, fraction) <= 3 * typical(alone, kind, fraction) + margin, report

    asyncio.run(scenario())


def test_a_stalled_subscriber_past_the_queue_limit_is_disconnected_and_logged(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """Two of them: one line (a client opening socket after socket wrote one each), both counted."""
    gateway = start_gateway(toml="[websocket]\nqueue_limit = 20\n")
    stalled = [stalled_subscriber(gateway) for _ in range(2)]

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as ws:
            await subscribe(ws, {"sparql": QUERY, "alias": "healthy"})
            await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 3)
            await updates_with_latency(session, gateway, ws, 0, 70, 60_000)  # ~8 MB: past the kernel buffers
            # Only the healthy subscriber and its connection remain.
            await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 1)
            await wait_for_metric(session, gateway, "sepa_ws_connections", lambda value: value == 1)
            await updates_with_latency(session, gateway, ws, 100, 5, 10)

    try:
        asyncio.run(scenario())
        for each in stalled:
            wait_until_released(gateway, each.local_port)
    finally:
        for each in stalled:
            each.close()
    lines = [line for line in gateway.log().splitlines() if "slow subscriber" in line]
    assert len(lines) == 1, gateway.log()
    assert re.search(r"level=warning .*queue full", lines[0]), lines[0]
    assert gateway.metric("sepa_ws_slow_subscribers_disconnected_total") == 2


def test_a_stalled_subscriber_past_the_rows_it_may_have_queued_is_disconnected_long_before_the_queue_limit(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """Each update adds or removes 1,000 rows of the stalled client's subscription: 3 notifications
    queued are past `queue_rows` = 2,500, 40 updates far below `queue_limit` (10,000 messages)."""
    gateway = start_gateway(toml="[websocket]\nqueue_rows = 2500\n")
    rows = 1000
    many = f"SELECT ?s ?o WHERE {{ ?s <{EX}copy> ?o }}"
    client = RawWebSocket(gateway.ws_port, receive_buffer=TINY_RECEIVE_BUFFER)

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as ws:
            data = " ".join(f"<{EX}s{i}> <{EX}p> {i} ." for i in range(rows))
            await post_update(session, gateway, f"INSERT DATA {{ {data} }}")
            client.send_json({"subscribe": {"sparql": many, "alias": "stalled"}})
            assert client.receive_json()["notification"]["sequence"] == 0  # then it never reads again
            await subscribe(ws, {"sparql": QUERY, "alias": "healthy"})
            # read as they come: at most 2,000 rows queued at once (an update's two notifications)
            for alias in ("many-1", "many-2"):
                await subscribe(ws, {"sparql": many, "alias": alias})
            await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 4)
            for _ in range(20):  # ~100 kB a notification: past the kernel buffers
                await post_update(session, gateway, f"INSERT {{ ?s <{EX}copy> ?o }} WHERE {{ ?s <{EX}p> ?o }}")
                for _ in range(2):
                    assert rows_in(await receive_json(ws), "addedResults") == rows
                await post_update(session, gateway, f"DELETE WHERE {{ ?s <{EX}copy> ?o }}")
                for _ in range(2):
                    assert rows_in(await receive_json(ws), "removedResults") == rows
            await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 3)
            await wait_for_metric(session, gateway, "sepa_ws_connections", lambda value: value == 1)
            await updates_with_latency(session, gateway, ws, 100, 5, 10)  # the healthy one is served on

    line = dropped_once(gateway, client, scenario)
    queued = re.search(r"queued=(\d+) .*queued_rows=(\d+)", line)
    assert queued is not None and int(queued.group(1)) < 10 and int(queued.group(2)) > 1500, line


def test_a_stalled_subscriber_past_the_characters_it_may_have_queued_is_disconnected(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """Each update replaces a 100,000-character literal: ~200,000 characters a notification of 2
    rows, so 60 updates are far below `queue_limit` and `queue_rows` and, past the kernel buffers,
    past `queue_bytes` = 2,000,000 (rows of 900 KB literals queued ~1 MB an update unbounded)."""
    gateway = start_gateway(toml="[websocket]\nqueue_bytes = 2000000\n")
    client = stalled_subscriber(gateway)

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as ws:
            await subscribe(ws, {"sparql": QUERY, "alias": "healthy"})
            await updates_with_latency(session, gateway, ws, 0, 60, 100_000)
            await wait_for_metric(session, gateway, "sepa_ws_connections", lambda value: value == 1)
            await wait_for_metric(session, gateway, "sepa_ws_slow_subscribers_disconnected_total", lambda v: v == 1)
            await updates_with_latency(session, gateway, ws, 100, 5, 10)  # the healthy one is served on

    line = dropped_once(gateway, client, scenario)
    queued = re.search(r"queued=(\d+) .*queued_rows=(\d+) .*queued_bytes=(\d+)", line)
    assert queued is not None, line
    assert int(queued.group(1)) < 60 and int(queued.group(2)) < 120 and int(queued.group(3)) > 1_500_000, line


def beside_stalled(
    gateway: RunningGateway, count: int, scenario: Callable[[], Awaitable[None]], **options: Any
) -> None:
    """Run `scenario` beside `count` sockets (RawWebSocket `options`) that subscribe to QUERY, read
    their first notification and never read again."""
    stalled = []
    try:
        for number in range(count):
            client = RawWebSocket(gateway.ws_port, receive_buffer=TINY_RECEIVE_BUFFER, **options)
            stalled.append(client)
            client.send_json({"subscribe": {"sparql": QUERY, "alias": f"stalled {number}"}})
            assert client.receive_json()["notification"]["sequence"] == 0
        asyncio.run(scenario())
    finally:
        for client in stalled:
            client.close()


def test_the_sockets_of_one_address_share_the_characters_they_may_have_queued(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """A host may open 256 sockets, and each that never read held its own `queue_bytes`: the
    bound is now the address's, all its sockets together. Eight stalled sockets of a LAN host,
    each notified ~200,000 characters an update: sockets are cut while their own queue is far
    below `queue_bytes` = 2,000,000 (without the shared bound a socket is cut only past it), and
    the loopback client reading as it should is served throughout."""
    gateway = start_gateway("--host", "0.0.0.0", toml="[websocket]\nqueue_bytes = 2000000\n")

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as ws:
            await subscribe(ws, {"sparql": QUERY, "alias": "healthy"})
            await updates_with_latency(session, gateway, ws, 0, 30, 100_000)
            await wait_for_metric(session, gateway, "sepa_ws_slow_subscribers_disconnected_total", lambda v: v >= 1)
            await updates_with_latency(session, gateway, ws, 100, 5, 10)  # the healthy one is served on

    beside_stalled(gateway, 8, scenario, address=host_address())
    lines = [line for line in gateway.log().splitlines() if "slow subscriber" in line]
    own = [int(match.group(1)) for line in lines if (match := re.search(r"queued_bytes=(\d+)", line))]
    assert own and min(own) < 1_000_000, lines


class PeakResident:
    """The peak VmRSS (MB) of a process, sampled every 50 ms on a thread while in the block."""

    def __init__(self, pid: int) -> None:
        self.status = Path(f"/proc/{pid}/status")
        self.start = self.peak = self._now()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _now(self) -> float:
        line = next(line for line in self.status.read_text().splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            self.peak = max(self.peak, self._now())

    def __enter__(self) -> PeakResident:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_every_sockets_queues_together_are_bounded_loopback_included(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """Each socket's queue is bounded, and an address's sockets together, but a loopback socket is
    a share of its own: 100 loopback sockets that subscribed and never read took the gateway to
    2.97 GB of RSS (each under its own 64 MiB) before their stalled writes cut them. Now every
    socket's characters together are at most `queue_bytes_total`, past which the sockets holding
    the most are cut (1008, counted, logged). Twelve stalled loopback sockets, 40 updates of two
    ~200,000-character literals (the stalled writes are given 120 s here, so they cut nothing):
    peak RSS +180 MB without the bound, +50 MB with a 4 MB bound; the client reading as it should
    is served throughout and never cut."""
    gateway = start_gateway(toml="[websocket]\nqueue_bytes_total = 4000000\n[http]\nrequest_timeout_s = 120\n")

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as ws:
            await subscribe(ws, {"sparql": QUERY, "alias": "healthy"})
            with PeakResident(gateway.process.pid) as resident:
                await updates_with_latency(session, gateway, ws, 0, 40, 200_000)
            assert resident.peak - resident.start < 100, f"RSS {resident.start:.0f} -> {resident.peak:.0f} MB"
            await wait_for_metric(session, gateway, "sepa_ws_queues_full_disconnected_total", lambda v: v >= 1)
            await updates_with_latency(session, gateway, ws, 100, 5, 10)  # the healthy one is served on

    beside_stalled(gateway, 12, scenario)
    lines = [line for line in gateway.log().splitlines() if "outgoing queues are full" in line]
    assert lines and "queued_bytes=" in lines[0], gateway.log()


def dropped_once(gateway: RunningGateway, client: RawWebSocket, scenario: Callable[[], Awaitable[None]]) -> str:
    """Run `scenario` while `client` stalls; its socket must be freed and one line logged: returned."""
    try:
        asyncio.run(scenario())
        wait_until_released(gateway, client.local_port)
    finally:
        client.close()
    lines = [line for line in gateway.log().splitlines() if "slow subscriber" in line]
    assert len(lines) == 1, gateway.log()
    return lines[0]


def rows_in(frame: dict[str, Any], part: str) -> int:
    return len(frame["notification"][part]["results"]["bindings"])


def wait_until_released(gateway: RunningGateway, client_port: int, timeout: float = 5.0) -> None:
    """The gateway process no longer holds a socket for that client (checked where /proc exists)."""
    deadline = time.monotonic() + timeout
    while (held := holds_connection_from(gateway, client_port)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not held, f"the gateway still holds the connection of client port {client_port}"


HEARTBEAT_S = 1.0


def test_a_client_that_stops_answering_pings_is_dropped_within_the_heartbeat(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    gateway = start_gateway(toml=f"[websocket]\nheartbeat_s = {HEARTBEAT_S}\n")

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(gateway.subscribe_url) as healthy:
            # aiohttp answers pings while the socket is being read, as a live client's socket always is.
            inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

            async def read_forever() -> None:
                async for message in healthy:
                    inbox.put_nowait(json.loads(message.data))

            reader = asyncio.create_task(read_forever())
            connected = time.monotonic()
            await healthy.send_json({"subscribe": {"sparql": QUERY, "alias": "healthy"}})
            first = (await asyncio.wait_for(inbox.get(), 5))["notification"]
            silent = RawWebSocket(gateway.ws_port)
            try:
                silent.send_json({"subscribe": {"sparql": QUERY, "alias": "silent"}})
                assert silent.receive_json()["notification"]["sequence"] == 0
                went_silent = time.monotonic()  # from now on it neither reads nor answers pings
                await wait_for_metric(session, gateway, "sepa_subscriptions", lambda value: value == 2)
                await wait_for_metric(
                    session, gateway, "sepa_subscriptions", lambda value: value == 1, timeout=4 * HEARTBEAT_S
                )
                detected = time.monotonic() - went_silent
                assert detected <= 2 * HEARTBEAT_S + 0.5, f"detected after {detected:.2f} s"
                await wait_for_metric(session, gateway, "sepa_ws_connections", lambda value: value == 1)
                await asyncio.get_running_loop().run_in_executor(None, wait_until_released, gateway, silent.local_port)
            finally:
                silent.close()
            # The client that answers pings is still connected after more than two heartbeats.
            await asyncio.sleep(max(0.0, connected + 2.5 * HEARTBEAT_S - time.monotonic()))
            await post_update(session, gateway, f"INSERT DATA {{ {SUBJECT} {PREDICATE} 1 }}")
            notification = (await asyncio.wait_for(inbox.get(), 5))["notification"]
            assert (notification["spuid"], notification["sequence"]) == (first["spuid"], 1)
            assert not healthy.closed
            reader.cancel()

    asyncio.run(scenario())


def test_a_stalled_client_dropped_by_the_heartbeat_releases_its_socket(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """Unread data must not keep a dead client's socket open: aborted, not closed gracefully."""
    gateway = start_gateway(toml=f"[websocket]\nheartbeat_s = {HEARTBEAT_S}\n")  # default queue_limit: the
    stalled = stalled_subscriber(gateway)  # heartbeat, not the queue, has to catch this one

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            for index in range(70):  # ~8 MB of notifications: more than the kernel buffers take
                await post_update(session, gateway, replace_value(index, 60_000))
            backlog = send_queue_to(gateway, stalled.local_port)
            if backlog is not None and backlog == 0:
                pytest.fail("the gateway sent everything: the client did not stall")
            await wait_for_metric(
                session, gateway, "sepa_subscriptions", lambda value: value == 0, timeout=4 * HEARTBEAT_S
            )

    try:
        asyncio.run(scenario())
        wait_until_released(gateway, stalled.local_port)
    finally:
        stalled.close()


KILLABLE_CLIENT = """
import sys, time
from tests.broker.gates.subscribe_support import RawWebSocket
client = RawWebSocket(int(sys.argv[1]))
client.send_json({"subscribe": {"sparql": sys.argv[2], "alias": "doomed"}})
assert client.receive_json()["notification"]["sequence"] == 0
print("subscribed", flush=True)
time.sleep(60)
"""


def test_a_killed_client_process_is_dropped_at_once(gateway: RunningGateway) -> None:
    """No close frame, no heartbeat needed (the default is 30 s): the lost TCP connection suffices."""
    gateway.wait_for_metric("sepa_subscriptions", lambda value: value == 0)
    client = subprocess.Popen(
        [sys.executable, "-c", KILLABLE_CLIENT, str(gateway.ws_port), QUERY],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,  # the checkout, where `tests` is a package
    )
    try:
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "subscribed"
        gateway.wait_for_metric("sepa_subscriptions", lambda value: value == 1)
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=5)
        gateway.wait_for_metric("sepa_subscriptions", lambda value: value == 0, timeout=3.0)
        gateway.wait_for_metric("sepa_ws_connections", lambda value: value == 0)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        if client.stdout is not None:
            client.stdout.close()


def frame(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    """One masked client frame (mask zero: the payload goes as it is)."""
    size = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    if size < 126:
        head += bytes([0x80 | size])
    else:
        head += bytes([0x80 | 127]) + size.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload


def closed_by_gateway(client: RawWebSocket, timeout: float) -> bool:
    """Whether the gateway ends the connection within `timeout` (pings and frames read meanwhile)."""
    client.sock.settimeout(timeout)
    try:
        while client.sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


def test_a_message_that_never_ends_is_cut_off_within_the_request_timeout(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """A WebSocket message must arrive whole within [http] request_timeout_s of its first byte, as
    an HTTP request must. Before, a client (no token needed on the secure port: the upgrade is not
    authenticated) could open a message and never finish it, fragment after fragment or a frame
    trickling in, and aiohttp kept up to 4 MiB per connection for as long as the socket lived:
    40 such sockets held 150 MB of the gateway, 256 from one address a gigabyte. A message split in
    fragments that arrives in time, pings, and a client that only waits are untouched."""
    gateway = start_gateway(toml="[http]\nrequest_timeout_s = 1.0\n[websocket]\nheartbeat_s = 300.0\n")
    never_ending = RawWebSocket(gateway.ws_port)
    never_ending.sock.sendall(frame(0x1, b"x" * 256 * 1024, fin=False) + frame(0x0, b"x" * 256 * 1024, fin=False))
    trickling = RawWebSocket(gateway.ws_port)
    trickling.sock.sendall(frame(0x1, b"x" * 256 * 1024)[: 128 * 1024])
    waiting = RawWebSocket(gateway.ws_port)
    fragmented = RawWebSocket(gateway.ws_port)
    message = json.dumps({"subscribe": {"sparql": QUERY, "alias": "in pieces"}}).encode("utf-8")
    fragmented.sock.sendall(frame(0x1, message[:10], fin=False) + frame(0x9, b"ping"))
    time.sleep(0.5)
    fragmented.sock.sendall(frame(0x0, message[10:20], fin=False))
    time.sleep(0.3)
    fragmented.sock.sendall(frame(0x0, message[20:]))
    assert fragmented.receive_json()["notification"]["alias"] == "in pieces"
    try:
        assert closed_by_gateway(never_ending, timeout=5.0)
        assert closed_by_gateway(trickling, timeout=5.0)
        assert not closed_by_gateway(waiting, timeout=0.5)
        waiting.send_frame(0x9, b"still here")
        waiting.send_json({"subscribe": {"sparql": QUERY, "alias": "later"}})
        assert waiting.receive_json()["notification"]["alias"] == "later"
        gateway.wait_for_metric("sepa_subscriptions", lambda value: value == 2)
    finally:
        for client in (never_ending, trickling, waiting, fragmented):
            client.close()


def test_a_flood_of_control_frames_is_cut_off_and_other_clients_are_served(gateway: RunningGateway) -> None:
    """Empty pongs or pings, as fast as the socket takes them: aiohttp answered each ping and took
    each pong without handing the event loop back, so one such socket (no token needed on the
    secure port) took another client's updates from 8 ms to 0.9 s at p50 and froze the loop for
    up to 14.6 s. Past FRAME_BURST frames, then FRAME_RATE a second, the connection is aborted. A
    burst of 500 pings and a fragmented message are a client's right, not a flood."""
    polite = RawWebSocket(gateway.ws_port)
    polite.sock.sendall(frame(0x9, b"") * 500)
    message = json.dumps({"subscribe": {"sparql": QUERY, "alias": "fragments"}}).encode("utf-8")
    polite.sock.sendall(
        b"".join(
            frame(0x1 if i == 0 else 0x0, message[i : i + 4], fin=i + 4 >= len(message))
            for i in range(0, len(message), 4)
        )
    )
    while (answer := polite.receive_json()).get("notification") is None:
        pass
    assert answer["notification"]["alias"] == "fragments"
    floods = gateway.metric("sepa_ws_frame_floods_total")
    for opcode in (0xA, 0x9):
        flooder = RawWebSocket(gateway.ws_port)
        flood = frame(opcode, b"") * 10_000
        started = time.monotonic()
        try:
            while time.monotonic() - started < 5:
                flooder.sock.sendall(flood)
        except OSError:  # reset by the gateway
            pass
        try:
            assert closed_by_gateway(flooder, timeout=2.0), f"opcode {opcode:#x}: the flood goes on"
        finally:
            flooder.close()
    gateway.wait_for_metric("sepa_ws_frame_floods_total", lambda value: value == floods + 2)
    started = time.monotonic()
    assert gateway.update(f"INSERT DATA {{ {SUBJECT} {PREDICATE} 1 }}").status == 200
    assert time.monotonic() - started < 2
    polite.send_frame(0x9, b"still here")
    assert polite.receive_json()["notification"]["sequence"] == 1  # the polite socket was kept
    polite.close()


def test_the_control_frame_budget_is_an_addresses_not_each_sockets(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """60 sockets of one LAN host, each pinging within its own budget, took an honest client's
    notification latency p99 to 5.1 s: the budget (FRAME_BURST, then FRAME_RATE a second) is now
    the address's, all its sockets together. Eight LAN sockets sending 600 pings each overdraw it
    (without the shared budget, none is cut: each is within its own 1,000); the same from loopback
    (this board's processes, each socket its own budget) is no flood; and once the flood stops,
    the LAN host is served again."""
    gateway = start_gateway("--host", "0.0.0.0")
    lan = host_address()
    floods = gateway.metric("sepa_ws_frame_floods_total")
    pings = frame(0x9, b"") * 600
    local = [RawWebSocket(gateway.ws_port) for _ in range(8)]
    for client in local:
        client.sock.sendall(pings)
    try:
        assert not any(closed_by_gateway(client, timeout=0.3) for client in local)
    finally:
        for client in local:
            client.close()
    assert gateway.metric("sepa_ws_frame_floods_total") == floods
    flooders = [RawWebSocket(gateway.ws_port, address=lan) for _ in range(8)]
    try:
        for client in flooders:
            with contextlib.suppress(OSError):  # reset by the gateway
                client.sock.sendall(pings)
        assert sum(closed_by_gateway(client, timeout=0.5) for client in flooders) >= 1
    finally:
        for client in flooders:
            client.close()
    gateway.wait_for_metric("sepa_ws_frame_floods_total", lambda value: value > floods)
    time.sleep(1.5)  # the address's budget refills
    honest = RawWebSocket(gateway.ws_port, address=lan)
    try:
        honest.send_frame(0x9, b"still here")
        honest.send_json({"subscribe": {"sparql": QUERY, "alias": "after the flood"}})
        while (answer := honest.receive_json()).get("notification") is None:
            pass
        assert answer["notification"]["alias"] == "after the flood"
    finally:
        honest.close()


def _asking(port: int, sparql: str, *, receive_buffer: int | None = None) -> socket.socket:
    """A raw connection that asked for `sparql`'s result and reads nothing yet."""
    client = socket.socket()
    if receive_buffer is not None:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    client.connect(("127.0.0.1", port))
    target = "/query?" + urllib.parse.urlencode({"query": sparql})
    client.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/tab-separated-values\r\n\r\n".encode())
    return client


def test_a_reply_never_read_is_cut_off_and_a_slow_reader_of_one_is_not(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """aiohttp has no send timeout: 20 HTTPS connections of one read-only token that asked for a
    33 MB result and never read it held the gateway at 2.2 GB of RSS for as long as they stayed.
    A connection whose outgoing buffer does not shrink for [http] request_timeout_s is aborted and
    counted; one that reads a 10 MB reply slowly, over longer than that limit, gets all of it (more
    than the kernel's socket buffers take, so the gateway's own buffer fills and writing pauses)."""
    gateway = start_gateway(toml="[http]\nrequest_timeout_s = 1.0\n")
    for index in range(25):
        gateway.update(f'INSERT DATA {{ <{EX}s{index}> <{EX}big> "{"x" * 400_000}" }}')
    sparql = f"SELECT ?o WHERE {{ ?s <{EX}big> ?o }}"
    never = _asking(gateway.http_port, sparql, receive_buffer=TINY_RECEIVE_BUFFER)
    slow = _asking(gateway.http_port, sparql)
    received = bytearray()
    started = time.monotonic()
    try:
        while not received.endswith(b"\n") or received.count(b"\n") < 27:  # head, blank, ?o, 25 rows
            chunk = slow.recv(256 * 1024)
            assert chunk, f"the slow reader was cut off after {len(received)} bytes"
            received += chunk
            time.sleep(0.05)
        assert time.monotonic() - started > 1.0  # it read for longer than the limit
        assert received.startswith(b"HTTP/1.1 200") and received.count(b"x" * 400_000) == 25
        gateway.wait_for_metric("sepa_write_stalls_total", lambda value: value == 1, timeout=10.0)
        never.settimeout(5.0)
        got = 0
        with contextlib.suppress(ConnectionResetError):
            while chunk := never.recv(1 << 20):  # what the kernel held, then the end: not the whole reply
                got += len(chunk)
        assert got < 25 * 400_000
    finally:
        never.close()
        slow.close()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_the_replies_being_written_are_bounded_together(start_gateway: Callable[..., RunningGateway]) -> None:
    """A reply's body is bounded (`max_result_bytes`), and one never read is cut once its write
    stalled, but not many of them together: 30 loopback connections that asked for a 30 MB result
    and read it slowly took the gateway from 115 MB to 1.93 GB of RSS within 15 s (each body held
    twice, the transport's buffer filled by one write). Now bodies are written a chunk at a time
    and what is left to write of them all is at most `[http] reply_bytes_total`: here 12 readers
    that never read a 10 MB result (their stalls given 120 s) get one reply written and 429 with
    Retry-After for the others (peak RSS +233 MB before, +44 MB now); a bystander's small query
    is served at once, cutting the reply with the most left to write."""
    gateway = start_gateway(toml="[http]\nreply_bytes_total = 12000000\nrequest_timeout_s = 120\n")
    for index in range(25):
        gateway.update(f'INSERT DATA {{ <{EX}s{index}> <{EX}big> "{"x" * 400_000}" }}')
    sparql = f"SELECT ?o WHERE {{ ?s <{EX}big> ?o }}"
    readers: list[socket.socket] = []
    try:
        with PeakResident(gateway.process.pid) as resident:
            for _ in range(12):
                readers.append(_asking(gateway.http_port, sparql, receive_buffer=TINY_RECEIVE_BUFFER))
                time.sleep(0.3)  # its reply made and held (or refused) before the next asks
        assert resident.peak - resident.start < 80, f"RSS {resident.start:.0f} -> {resident.peak:.0f} MB"
        heads = []
        for reader in readers:
            # not the subject: at load 9-13 a reply's head came past 5 s (TimeoutError, 1 run in 22)
            reader.settimeout(60.0)
            heads.append(reader.recv(4096))
        refused = [head for head in heads if head.startswith(b"HTTP/1.1 429")]
        assert len(refused) >= 10 and all(b"Retry-After: 1" in head for head in refused), heads
        started = time.monotonic()
        assert gateway.ask(f"ASK {{ <{EX}s0> <{EX}big> ?o }}")
        assert time.monotonic() - started < 5.0
        assert gateway.metrics()["sepa_http_replies_cut_total"] >= 1
    finally:
        for reader in readers:
            reader.close()


def _updating(port: int, sparql: str) -> socket.socket:
    """A raw connection that sent `sparql` as an update asking for its quads back, and reads nothing yet."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, TINY_RECEIVE_BUFFER)
    client.connect(("127.0.0.1", port))
    body = sparql.encode()
    head = (
        "POST /update HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sparql-update\r\n"
        f"Prefer: return=representation\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    client.sendall(head.encode() + body)
    return client


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_update_replies_with_their_quads_count_in_the_replies_being_written(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """An update's reply with its quads (`Prefer: return=representation`) is as large as what it
    changed: 20 connections that each sent an update of ~18 MB of quads and did not read took the
    gateway from 105 to 844 MB. It counts in `reply_bytes_total` too, but is never refused (the
    update is applied): the others are cut. Here 12 such updates of ~10 MB, never read: peak RSS
    +343 MB before, +181 MB now (the rest is the updates' own copies of their quads as they run)."""
    gateway = start_gateway(toml="[http]\nreply_bytes_total = 12000000\nrequest_timeout_s = 120\n")
    for index in range(25):
        gateway.update(f'INSERT DATA {{ <{EX}s{index}> <{EX}big> "{"x" * 400_000}" }}')
    toggles = [f"INSERT {{ ?s <{EX}copy> ?o }} WHERE {{ ?s <{EX}big> ?o }}", f"DELETE WHERE {{ ?s <{EX}copy> ?o }}"]
    writers: list[socket.socket] = []
    try:
        with PeakResident(gateway.process.pid) as resident:
            for number in range(12):
                writers.append(_updating(gateway.http_port, toggles[number % 2]))
                time.sleep(0.5)
            gateway.wait_for_metric("sepa_updates_total", lambda value: value >= 25 + 12, timeout=30.0)
        assert resident.peak - resident.start < 260, f"RSS {resident.start:.0f} -> {resident.peak:.0f} MB"
        assert gateway.metrics()["sepa_http_reply_bytes"] <= 12_000_000 + 10_500_000
    finally:
        for writer in writers:
            writer.close()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_the_request_bodies_in_flight_are_bounded_together(start_gateway: Callable[..., RunningGateway]) -> None:
    """A body is bounded (`max_request_bytes`), but not the bodies of many requests waiting for the
    query pool: 1,000 loopback connections that each POSTed a 1 MB query took the gateway from 85 MB
    to 1.59 GB of RSS, none refused. Now the bodies in flight are at most `request_bytes_total`,
    past which a request is refused 429 with Retry-After before its body is read. Here 150
    connections POST a 500 KB query (a comment and a product that runs to the time limit): most are
    refused, peak RSS +35 MB (+127 MB before), and a bystander's small update is served meanwhile."""
    gateway = start_gateway(toml="[http]\nrequest_bytes_total = 4000000\n[engine]\ntime_limit_s = 2\n")
    gateway.update("INSERT DATA { " + " ".join(f"<{EX}s{index}> <{EX}p> {index} ." for index in range(1000)) + " }")
    body = ("# " + "x" * 500_000 + "\nSELECT (COUNT(*) AS ?n) WHERE { ?a ?b ?c . ?d ?e ?f . ?g ?h ?i }").encode()
    head = (
        "POST /query HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sparql-query\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    askers: list[socket.socket] = []
    try:
        with PeakResident(gateway.process.pid) as resident:
            for _ in range(150):
                asker = socket.create_connection(("127.0.0.1", gateway.http_port))
                asker.sendall(head + body)
                askers.append(asker)
            started = time.monotonic()
            assert gateway.update(f"INSERT DATA {{ <{EX}bystander> <{EX}p> 1 }}").status == 200
            assert time.monotonic() - started < 5.0
        assert resident.peak - resident.start < 70, f"RSS {resident.start:.0f} -> {resident.peak:.0f} MB"
        refused = 0
        for asker in askers:
            asker.settimeout(30.0)
            head_line = asker.recv(4096)
            refused += head_line.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in head_line
        assert refused >= 100, refused
    finally:
        for asker in askers:
            asker.close()


SLOW_PRODUCT = "SELECT (COUNT(*) AS ?n) WHERE { ?a ?b ?c . ?d ?e ?f . ?g ?h ?i }"


def test_incoming_websocket_messages_count_in_the_request_bodies_held_together(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """aiohttp assembles a WebSocket message (up to 4 x max_message_bytes) before the gate sees it,
    and the gate takes no more of a socket's messages while its 3 slots are busy: 100 loopback
    sockets that held their slots with slow subscribes, then sent a 3.9 MB message each, took the
    gateway from 85 to 568 MB. Now those bytes are held against `[http] request_bytes_total` until
    the gate is done with the message; past it, a socket holding more than a small message is cut
    (counted). Here 40 sockets send a 3 MB message behind 3 slow probes each, with a 4 MB bound:
    peak RSS +10 MB (+152 MB without), and a bystander's update is served meanwhile."""
    gateway = start_gateway(toml="[http]\nrequest_bytes_total = 4000000\n[engine]\ntime_limit_s = 5\n")
    gateway.update("INSERT DATA { " + " ".join(f"<{EX}s{index}> <{EX}p> {index} ." for index in range(1000)) + " }")
    big = frame(0x1, json.dumps({"subscribe": {"sparql": "#" + "x" * 3_000_000, "alias": "big"}}).encode())
    senders: list[RawWebSocket] = []
    try:
        for index in range(40):
            sender = RawWebSocket(gateway.ws_port)
            for slot in range(3):
                sender.send_json({"subscribe": {"sparql": SLOW_PRODUCT, "alias": f"slow-{index}-{slot}"}})
            senders.append(sender)
        time.sleep(0.5)
        with PeakResident(gateway.process.pid) as resident:
            for sender in senders:
                with contextlib.suppress(OSError):  # cut already
                    sender.sock.sendall(big)
            started = time.monotonic()
            assert gateway.update(f"INSERT DATA {{ <{EX}bystander> <{EX}p> 1 }}").status == 200
            assert time.monotonic() - started < 5.0
            time.sleep(1.0)
        assert resident.peak - resident.start < 60, f"RSS {resident.start:.0f} -> {resident.peak:.0f} MB"
        gateway.wait_for_metric("sepa_ws_incoming_cut_total", lambda value: value >= 30)
    finally:
        for sender in senders:
            sender.close()


def test_the_secure_sockets_are_counted_in_the_same_total_as_the_plain_ones(
    in_process_gateway: Callable[[Config], InProcessGateway], tmp_path: Path
) -> None:
    """WSS sockets queue into the one `queue_bytes_total` of the plain sockets, as their addresses'
    shares are one: a bound per gate would let each gate hold it."""
    config = secure_config(data_dir=str(tmp_path / "data"))
    config.websocket.queue_bytes_total = 3_000_000
    gates = in_process_gateway(config).gateway.gates
    assert gates.secure is not None
    assert gates.secure.websocket.total is gates.websocket.total
    assert gates.websocket.total.limit == 3_000_000
