"""A CoAP client process: confirmable POSTs of value k to `/s/bench<i>/temperature`, k = first..first+count-1.

Run as ``python -m tools.coap_bench.client --uri coap://127.0.0.1:P --first K --count N --sensors S
--in-flight W [--rate R] [--patient]``. Reading k goes to sensor k % S, so (sensor, value) names it
and the store can be checked for every reading, once. The process prints ``{"ready": true}`` once its
W client contexts are open, starts on a line on stdin (so that every client of a phase starts at the
same moment, not when its interpreter happened to finish importing aiocoap), and prints one JSON
line when every request has its answer: the counts, the first send and last answer times
(``time.monotonic_ns``, one clock for every process of the machine), its CPU seconds, and with
`--rate` the send time of each reading (for the latency phase). `--rate 0` sends as fast as the
gateway answers.

Why W client contexts, not W requests on one: aiocoap keeps RFC 7252's NSTART = 1, one confirmable
exchange at a time per server in a context (the others wait in its backlog), so a single context
never has more than one request in flight. W contexts are W UDP endpoints, as W sensors would be;
each sends its next reading once the previous one is answered (2.04 Changed: stored).

Why a request names the gateway by the address its context's first answer came from, not by its
URI: with a URI, aiocoap resolves the host for every request (getaddrinfo, on an executor thread),
which was ~40% of a client's CPU (py-spy, 8 s of the throughput phase): 0.95 ms CPU per reading
before, 0.55-0.65 ms after, CPU the gateway beside the clients on a 2-core machine needs.

`--patient` is the timing of a sensor on a lossy link (ACK_TIMEOUT 0.5 s, MAX_RETRANSMIT 8, as in
tests/adapters/coap/test_coap_readings.py); without it, RFC 7252's (2 s, 4).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from typing import Any

import aiocoap
import aiocoap.error
from aiocoap import Code
from aiocoap.numbers import TransportTuning

TEXT_PLAIN = 0


class Patient(TransportTuning):
    """RFC 7252's timing with more retransmissions, sooner: a sensor set up for a lossy link."""

    ACK_TIMEOUT = 0.5
    MAX_RETRANSMIT = 8


def uri(base: str, sensor: int) -> str:
    return f"{base}/s/bench{sensor}/temperature"


async def send_all(
    base: str, first: int, count: int, sensors: int, in_flight: int, rate: float, patient: bool
) -> dict[str, Any]:
    contexts = [await aiocoap.Context.create_client_context(transports=["udp6"]) for _ in range(in_flight)]
    tuning = Patient() if patient else None
    sent = [0] * count
    codes: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    done_ns = 0
    late_ms: list[float] = []  # with a rate: how long after its due time each reading went out
    numbers = iter(range(count))  # shared by the workers: each takes the next reading to send

    async def worker(context: aiocoap.Context) -> None:
        nonlocal done_ns
        loop = asyncio.get_running_loop()
        remote: Any = None  # the gateway's address as this context resolved it, from its first answer
        for n in numbers:
            k = first + n
            if rate > 0:
                delay = started + n / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                late_ms.append(max(0.0, -delay) * 1000)
            if remote is None:
                message = aiocoap.Message(code=Code.POST, uri=uri(base, k % sensors), payload=str(k).encode())
            else:  # what the URI says, without resolving its host again (see the module docstring)
                path = ("s", f"bench{k % sensors}", "temperature")
                message = aiocoap.Message(code=Code.POST, uri_path=path, payload=str(k).encode())
                message.remote = remote
            message.opt.content_format = TEXT_PLAIN
            if tuning is not None:
                message.transport_tuning = tuning
            sent[n] = time.monotonic_ns()
            try:
                response = await context.request(message).response
            except aiocoap.error.Error as error:
                errors[type(error).__name__] += 1
            else:
                codes[response.code.dotted] += 1
                remote = response.remote
            done_ns = time.monotonic_ns()

    print(json.dumps({"ready": True}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    started = asyncio.get_running_loop().time()
    cpu_before = time.process_time()
    try:
        await asyncio.gather(*(worker(context) for context in contexts))
    finally:
        for context in contexts:
            await context.shutdown()
    acknowledged = codes.get(Code.CHANGED.dotted, 0)
    return {
        "first": first,
        "acknowledged": acknowledged,
        "failed": count - acknowledged,
        "codes": dict(codes),
        "errors": dict(errors),
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
    parser.add_argument("--in-flight", type=int, default=32, help="client contexts, one request in flight each")
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
