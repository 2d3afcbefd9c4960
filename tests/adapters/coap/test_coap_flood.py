"""A flood of CoAP requests from the network cannot grow the gateway without bound.

aiocoap keeps a record of every confirmable request it reads for 247 s (about 2 KB with its response);
unrationed, a flood grew the gateway as long as it lasted (figures in adapters/coap/fastpath.py).
Real UDP from this machine's network address, the gateway as the installed service runs it
(--secure, every address).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

from tests.support.coap import host_address, observations

GET, POST = 0x01, 0x02


def datagram(code: int, mid: int, path: str, payload: bytes = b"") -> bytes:
    """A CON request: 4-byte token, Uri-Path options (each segment < 13 bytes), payload."""
    data = struct.pack("!BBH", 0x44, code, mid) + os.urandom(4)
    number = 0
    for segment in path.split("/"):
        data += bytes([(11 - number) << 4 | len(segment)]) + segment.encode()
        number = 11
    return data + (b"\xff" + payload if payload else b"")


def answers(source: str, port: int, requests: list[bytes], wait_s: float = 3.0) -> list[bytes]:
    """Send `requests` from `source` (one socket, paced), then collect every answer for `wait_s`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((source, 0))
        sock.settimeout(0.05)
        received: list[bytes] = []
        for number, request in enumerate(requests):
            sock.sendto(request, (source, port))
            if number % 20 == 19:
                time.sleep(0.01)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                received.append(sock.recv(2048))
        return received


def test_requests_from_the_network_are_rationed_and_unauthenticated_readings_refused_cheaply(start_gateway, tmp_path):
    gateway = start_gateway(
        "--secure",
        "--host",
        "0.0.0.0",
        toml="[coap]\nnetwork_requests_max = 240\n",
        data_dir=tmp_path / "data",
        coap=True,
    )
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    lan = host_address()

    # plain readings from the network: 4.01 each, answered beside aiocoap (no record), within the budget
    readings = [datagram(POST, mid, "s/boiler/temperature", b"63.5") for mid in range(200)]
    refused = answers(lan, port, readings)
    assert len(refused) == 200 and {answer[1] for answer in refused} == {0x81}  # 4.01
    assert b"must be authenticated" in refused[0]
    assert observations(gateway) == []

    # what aiocoap must read (here a GET of a resource): the 40 left in the window, the rest dropped and counted
    gets = [datagram(GET, 1000 + mid, ".well-known/core") for mid in range(100)]
    assert len(answers(lan, port, gets)) == 40
    metrics = gateway.metrics()
    assert metrics["sepa_coap_network_requests_shed_total"] == 60, metrics
    assert metrics["sepa_coap_fast_path_answered"] >= 200

    # this board's own requests are never rationed
    local = answers("127.0.0.1", port, [datagram(GET, 5000 + mid, ".well-known/core") for mid in range(20)])
    assert len(local) == 20
    local_reading = answers("127.0.0.1", port, [datagram(POST, 6000, "s/boiler/temperature", b"63.5")])
    assert [answer[1] for answer in local_reading] == [0x44]  # 2.04
    assert len(observations(gateway)) == 1
