"""A CoAP client process: confirmable POSTs of value k to `/s/bench<i>/temperature`, k = first..first+count-1.

Run as ``python -m tools.coap_bench.client --uri coap://127.0.0.1:P --first K --count N --sensors S
--in-flight W [--rate R] [--patient]``. Reading k goes to sensor k % S, so (sensor, value) names it
and the store can be checked for every reading, once. The process prints ``{"ready": true}`` once its
W endpoints are open, starts on a line on stdin (so that every client of a phase starts at the
same moment, not when its interpreter happened to finish starting), and prints one JSON
line when every request has its answer: the counts, the first send and last answer times
(``time.monotonic_ns``, one clock for every process of the machine), its CPU seconds, and with
`--rate` the send time of each reading (for the latency phase). `--rate 0` sends as fast as the
gateway answers.

Why W endpoints: each is a UDP socket with one confirmable request in flight (RFC 7252's NSTART = 1),
as W sensors would be; each sends its next reading once the previous one is answered (2.04 Changed:
stored).

Why the datagrams are written here (:func:`adapters.coap.datagrams.request`), not with aiocoap's
client: aiocoap took 0.55-0.65 ms of CPU a reading in the client (0.95 ms before the host was
resolved once), CPU the gateway beside the clients on a 2-core machine needs; at 3,000 readings/s
that alone was more than a core. A constrained sensor writes these bytes by hand too. Retransmission
follows RFC 7252 §4.2: a first timeout drawn from [ACK_TIMEOUT, ACK_TIMEOUT x 1.5], doubled at each of
MAX_RETRANSMIT retransmissions; an empty ACK stops them and the response then comes in its own
message (acknowledged if confirmable). The real clients of the suite (libcoap's coap-client,
aiocoap) are tests/adapters/coap's.

`--patient` is the timing of a sensor on a lossy link (ACK_TIMEOUT 0.5 s, MAX_RETRANSMIT 8, as in
tests/adapters/coap/test_coap_readings.py); without it, RFC 7252's (2 s, 4).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import time
from collections import Counter
from typing import Any, cast
from urllib.parse import urlsplit

from adapters.coap import datagrams

TEXT_PLAIN = 0
RFC_TIMING = (2.0, 4)  # ACK_TIMEOUT (s), MAX_RETRANSMIT
PATIENT_TIMING = (0.5, 8)
ACK_RANDOM_FACTOR = 1.5


class Timeout(Exception):
    """No answer after MAX_RETRANSMIT retransmissions."""


class Endpoint(asyncio.DatagramProtocol):
    """One sensor's socket: sends a confirmable request and waits for its response."""

    def __init__(self, remote: tuple[Any, ...], timing: tuple[float, int]) -> None:
        self.remote = remote
        self.ack_timeout, self.max_retransmit = timing
        self.transport: asyncio.DatagramTransport | None = None
        self.mid = random.randrange(1 << 16)
        self.token = random.randrange(1 << 32)
        self.answer: asyncio.Future[int] | None = None
        self.retransmission: asyncio.TimerHandle | None = None
        self.sent = b""
        self.tries = 0
        self.retransmissions = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    async def post(self, path: str, payload: bytes) -> int:
        """The response code of a confirmable POST of `payload` to `path`; Timeout if none came."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.mid = (self.mid + 1) & 0xFFFF
        self.token = (self.token + 1) & 0xFFFFFFFF
        self.sent = datagrams.request(self.mid, self.token.to_bytes(4, "big"), path, payload, TEXT_PLAIN)
        self.answer = loop.create_future()
        self.tries = 0
        self._send(self.ack_timeout * random.uniform(1.0, ACK_RANDOM_FACTOR))
        try:
            return await self.answer
        finally:
            self._stop_retransmitting()

    def _send(self, timeout: float) -> None:
        assert self.transport is not None
        self.transport.sendto(self.sent, self.remote)
        self.retransmission = asyncio.get_running_loop().call_later(timeout, self._timed_out, timeout)

    def _timed_out(self, timeout: float) -> None:
        if self.answer is None or self.answer.done():
            return
        if self.tries >= self.max_retransmit:
            self.answer.set_exception(Timeout())
            return
        self.tries += 1
        self.retransmissions += 1
        self._send(timeout * 2)

    def _stop_retransmitting(self) -> None:
        if self.retransmission is not None:
            self.retransmission.cancel()
            self.retransmission = None

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if len(data) < 4 or self.answer is None or self.answer.done():
            return
        kind, tkl, code, mid = (data[0] >> 4) & 3, data[0] & 0x0F, data[1], int.from_bytes(data[2:4], "big")
        token = data[4 : 4 + tkl]
        if kind == datagrams.ACK and mid == self.mid:
            if code == 0:
                self._stop_retransmitting()  # an empty ACK: the response comes in a message of its own
            elif token == self.token.to_bytes(4, "big"):
                self.answer.set_result(code)
        elif kind in (datagrams.CON, datagrams.NON) and token == self.token.to_bytes(4, "big"):
            if kind == datagrams.CON and self.transport is not None:
                self.transport.sendto(bytes((datagrams.VERSION << 6 | datagrams.ACK << 4, 0)) + data[2:4], addr)
            self.answer.set_result(code)


def dotted(code: int) -> str:
    return f"{code >> 5}.{code & 0x1F:02d}"


def resolve(base: str) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    parts = urlsplit(base)
    family, _, _, _, address = socket.getaddrinfo(parts.hostname, parts.port or 5683, type=socket.SOCK_DGRAM)[0]
    return family, address


async def send_all(
    base: str, first: int, count: int, sensors: int, in_flight: int, rate: float, patient: bool
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    family, remote = resolve(base)
    timing = PATIENT_TIMING if patient else RFC_TIMING
    endpoints: list[Endpoint] = []
    for _ in range(in_flight):
        _, endpoint = await loop.create_datagram_endpoint(lambda: Endpoint(remote, timing), family=family)
        endpoints.append(endpoint)
    sent = [0] * count
    codes: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    done_ns = 0
    late_ms: list[float] = []  # with a rate: how long after its due time each reading went out
    numbers = iter(range(count))  # shared by the workers: each takes the next reading to send

    async def worker(endpoint: Endpoint) -> None:
        nonlocal done_ns
        for n in numbers:
            k = first + n
            if rate > 0:
                delay = started + n / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                late_ms.append(max(0.0, -delay) * 1000)
            sent[n] = time.monotonic_ns()
            try:
                code = await endpoint.post(f"s/bench{k % sensors}/temperature", str(k).encode())
            except Timeout as error:
                errors[type(error).__name__] += 1
            else:
                codes[dotted(code)] += 1
            done_ns = time.monotonic_ns()

    print(json.dumps({"ready": True}), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    started = loop.time()
    cpu_before = time.process_time()
    try:
        await asyncio.gather(*(worker(endpoint) for endpoint in endpoints))
    finally:
        for endpoint in endpoints:
            if endpoint.transport is not None:
                endpoint.transport.close()
    acknowledged = codes.get("2.04", 0)
    return {
        "first": first,
        "acknowledged": acknowledged,
        "failed": count - acknowledged,
        "codes": dict(codes),
        "errors": dict(errors),
        "retransmissions": sum(endpoint.retransmissions for endpoint in endpoints),
        "first_sent_ns": min(sent) if count else 0,
        "done_ns": done_ns,
        "cpu_s": round(time.process_time() - cpu_before, 3),
        "sent_ns": sent if rate > 0 else [],
        "late_p99_ms": round(sorted(late_ms)[int(0.99 * (len(late_ms) - 1))], 3) if late_ms else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True, help="coap://host:port of the gateway (or of a relay before it)")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--sensors", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=32, help="sensor endpoints, one request in flight each")
    parser.add_argument("--rate", type=float, default=0.0, help="readings per second (0: as fast as answered)")
    parser.add_argument("--patient", action="store_true", help="a lossy link's timing (ACK_TIMEOUT 0.5 s, 8 tries)")
    args = parser.parse_args(argv)
    result = asyncio.run(
        send_all(args.uri, args.first, args.count, args.sensors, args.in_flight, args.rate, args.patient)
    )
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
