"""Readings in over CoAP, with real clients over real UDP: libcoap's coap-client and aiocoap's.

What each test would see without the adapter: nothing listens on the gateway's CoAP port, so every
request times out and no observation appears.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import aiocoap
import cbor2
import pytest
from aiocoap import Code

from adapters.coap import datagrams
from broker.api import meminfo
from gateway.kernel_clock import kernel_synchronised
from tests.support.bystander import asking_meanwhile
from tests.support.coap import DEG_C, SENSOR, add_sensor, host_address, observations, sensor_side
from tests.support.readings import CATASTROPHIC_MAPPING, CATASTROPHIC_PAYLOAD
from tools.coap import libcoap
from tools.coap.relay import LossyRelay


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


async def request(uri: str, payload: bytes, content_format: int | None = None, **options: object) -> aiocoap.Message:
    context = await aiocoap.Context.create_client_context()
    try:
        message = aiocoap.Message(code=Code.POST, uri=uri, payload=payload, **options)
        if content_format is not None:
            message.opt.content_format = content_format
        return await context.request(message).response
    finally:
        await context.shutdown()


def test_a_coap_client_post_is_an_observation_visible_over_http_within_a_second(start_gateway, coap_client) -> None:
    gateway = start_gateway(coap=True)
    started = time.monotonic()
    done = libcoap.run(["-m", "post", "-t", "0", "-e", "63.5", f"{gateway.coap_url}/s/boiler/temperature"])
    assert libcoap.succeeded(done), done
    assert observations(gateway) == [(SENSOR + "boiler", 63.5, DEG_C)]  # stored before the 2.04
    assert time.monotonic() - started < 1.0
    assert gateway.metrics()["sepa_coap_readings"] == 1


def test_senml_json_and_cbor_packs_are_one_observation_per_record(start_gateway, coap_client) -> None:
    gateway = start_gateway(coap=True)
    pack = [{"bn": "tank1/", "n": "temperature", "u": "Cel", "v": 21.5}, {"n": "humidity", "u": "%RH", "v": 40}]
    done = libcoap.run(["-m", "post", "-t", "110", "-e", libcoap.text(json.dumps(pack)), f"{gateway.coap_url}/s/tank"])
    assert libcoap.succeeded(done), done
    cbor = cbor2.dumps([{-2: "tank2/", 0: "temperature", 1: "Cel", 2: 19.25}, {0: "pressure", 1: "hPa", 2: 1013}])
    response = asyncio.run(request(f"{gateway.coap_url}/s/tank", cbor, 112))
    assert response.code == Code.CHANGED, response.payload
    sensors = {row[0]: row[1] for row in observations(gateway)}
    assert sensors == {
        SENSOR + "tank/tank1/temperature": 21.5,
        SENSOR + "tank/tank1/humidity": 40.0,
        SENSOR + "tank/tank2/temperature": 19.25,
        SENSOR + "tank/tank2/pressure": 1013.0,
    }


def test_a_large_senml_pack_arrives_block_wise_and_an_oversized_one_is_refused(start_gateway, coap_client) -> None:
    gateway = start_gateway(coap=True, toml="[coap]\nmax_payload_bytes = 8192\n")
    pack = [{"bn": "big/", "n": f"temperature{index}", "u": "Cel", "v": index / 4} for index in range(120)]
    text = json.dumps(pack)
    assert 4096 < len(text) <= 8192
    done = libcoap.run(["-m", "post", "-b", "64", "-t", "110", "-e", text, f"{gateway.coap_url}/s/bulk"], timeout=60)
    assert libcoap.succeeded(done), done
    assert len(observations(gateway)) == 120
    huge = json.dumps([{"bn": "huge/", "n": f"t{index}", "u": "Cel", "v": 1.0} for index in range(400)])
    assert len(huge) > 8192
    done = libcoap.run(["-m", "post", "-b", "64", "-t", "110", "-e", huge, f"{gateway.coap_url}/s/bulk"], timeout=60)
    assert "4.13" in done.stdout + done.stderr, done
    assert len(observations(gateway)) == 120  # nothing of it stored
    assert gateway.metrics()["sepa_coap_refused_4_13"] >= 1


@pytest.mark.parametrize(
    ("args", "path", "code"),
    [
        (["-e", "hot"], "s/boiler/temperature", "4.00"),
        (["-t", "50", "-e", "true"], "s/boiler/temperature", "4.00"),  # a boolean is not a temperature
        (["-t", "110", "-e", '[{"n": "t", "v": "warm"}]'], "s/pack", "4.00"),
        (["-e", "1"], "nothing/maps/this", "4.04"),
        (["-t", "41", "-e", "<v>1</v>"], "s/boiler/temperature", "4.15"),
        (["-t", "110", "-e", "[]"], "s/boiler/temperature", "4.15"),  # SenML where a value is read
    ],
)
def test_bad_input_gets_a_clear_code_is_counted_per_resource_and_stores_nothing(
    start_gateway, coap_client, args: list[str], path: str, code: str
) -> None:
    gateway = start_gateway(coap=True)
    done = libcoap.run(["-m", "post", *args, f"{gateway.coap_url}/{path}"])
    assert (done.stdout + done.stderr).startswith(code), done
    assert len((done.stdout + done.stderr).strip()) > len(code) + 3  # a diagnostic, not a bare code
    metrics = gateway.metrics()
    assert metrics[f"sepa_coap_refused_{code.replace('.', '_')}"] == 1
    assert metrics["sepa_coap_bad_input"] == 1
    text = gateway.request("GET", "/metrics").text
    assert f'sepa_coap_bad_input_by_resource{{source="{path}"}} 1' in text  # counted per resource
    assert observations(gateway) == []
    assert libcoap.succeeded(libcoap.run(["-m", "post", "-e", "20", f"{gateway.coap_url}/s/boiler/temperature"]))


def test_a_reading_of_the_year_9999_is_refused_while_the_gateways_clock_is_synchronised(
    start_gateway, coap_client
) -> None:
    """docs/adapters.md "Source times": a SenML time more than a day after the gateway's clock is
    a 4.00 naming both times (it was stored as the reading's own), unless the kernel says the
    gateway's clock is unsynchronised: then that clock may be the wrong one, and the time is taken.
    This machine's kernel decides which branch runs; tests/gateway/observations/test_obs_mappings.py
    runs both."""
    gateway = start_gateway(coap=True)
    pack = '[{"n": "temperature", "u": "Cel", "v": 1, "t": 253402300799}]'
    done = libcoap.run(["-m", "post", "-t", "110", "-e", pack, f"{gateway.coap_url}/s/pack"])
    if kernel_synchronised() is False:
        assert libcoap.succeeded(done), done
        assert len(observations(gateway)) == 1
    else:
        assert (done.stdout + done.stderr).startswith("4.00"), done
        assert "after the gateway's clock" in done.stdout + done.stderr
        assert gateway.metrics()["sepa_coap_bad_input"] == 1
        assert observations(gateway) == []


def test_a_mapping_added_with_sparql_takes_a_new_resource_without_a_restart(start_gateway, coap_client) -> None:
    gateway = start_gateway(coap=True)
    uri = f"{gateway.coap_url}/plant/room1/flow"
    done = libcoap.run(["-m", "post", "-e", "3.5", uri])
    assert (done.stdout + done.stderr).startswith("4.04"), done
    gw = "http://w3id.org/sepa-gateway/ns#"
    gateway.update(
        f"""INSERT DATA {{ GRAPH <http://w3id.org/sepa-gateway/graph/mappings> {{
        <urn:sepa-gateway:mapping:flow> a <{gw}TopicMapping> ; <{gw}mappingId> "flow" ;
          <{gw}topicFilter> "plant/{{room}}/flow" ; <{gw}extract> "number" ;
          <{gw}sensorTemplate> "urn:example:flow/{{room}}" ; <{gw}propertyTemplate> "temperature" }} }}"""
    )
    wait_for(lambda: libcoap.succeeded(libcoap.run(["-m", "post", "-e", "3.5", uri])))
    assert observations(gateway)[0][:2] == ("urn:example:flow/room1", 3.5)


def test_a_catastrophic_mapping_regex_costs_its_request_only(start_gateway, coap_client) -> None:
    """The MQTT adapter's catastrophic pattern (issue 16) over CoAP: one mapping serves both
    transports, so a mapping written over SPARQL whose pattern backtracks exponentially is met by
    POSTs too, matched on the event loop. Each is refused 4.00 at the pattern's time limit, and a
    client asking back to back all the while is answered. No test covered this path. Measured with
    coap-client, 2026-12-07 (load 3-8, `pytest tests/adapters/coap/test_coap_readings.py -k
    catastrophic`): the slowest ask 0.12-0.17 s with the 50 ms limit; without it the asker's
    request timed out (30 s), and with a limit of 2 s an ask waited 29.0 s for four requests (30 s,
    timed out, in a second run): a request refused on the fast path was mapped again on aiocoap's,
    the pattern ran 8 times for the 4 requests (now answered where it is refused, once)."""
    gateway = start_gateway(coap=True)
    assert gateway.update(CATASTROPHIC_MAPPING).status == 200
    uri = f"{gateway.coap_url}/evil/x"
    probe = f"{gateway.coap_url}/evil/probe"

    def refused(done: subprocess.CompletedProcess[str]) -> bool:
        return (done.stdout + done.stderr).startswith("4.00")

    wait_for(lambda: refused(libcoap.run(["-m", "post", "-e", "a!", probe])))  # 4.04 until the mapping takes it
    answers: list[str] = []
    with asking_meanwhile(gateway) as asked:
        wait_for(lambda: len(asked.answers) >= 5)  # answered before the requests, as after
        first = time.monotonic()
        for _ in range(4):
            done = libcoap.run(["-m", "post", "-e", CATASTROPHIC_PAYLOAD, uri], timeout=120)
            answers.append((done.stdout + done.stderr).strip())
            time.sleep(0.3)
        last = time.monotonic()
    during = asked.between(first, last)
    assert max(during) < 1.0, f"an ask waited {max(during):.2f} s while the pattern ran"
    assert len(during) >= 10, f"{len(during)} asks while the requests were processed"
    assert answers[0].startswith("4.00") and "took over 50 ms on this payload" in answers[0], answers
    assert all(answer.startswith("4.00") for answer in answers), answers  # the rest: the limit or the budget
    assert gateway.metrics()['sepa_coap_bad_input_by_resource{source="evil/x"}'] == 4
    assert libcoap.succeeded(libcoap.run(["-m", "post", "-e", "20", f"{gateway.coap_url}/s/boiler/temperature"]))


def _confirmable_post(mid: int, path: list[str], payload: bytes) -> bytes:
    """A CoAP CON POST written byte by byte (RFC 7252 §3): what a sensor's firmware sends."""
    header = struct.pack("!BBH", 0x40, 0x02, mid)  # version 1, CON, no token; POST
    options, previous = b"", 0
    for segment in path:
        data = segment.encode()
        delta, previous = 11 - previous, 11  # Uri-Path (11), short segments
        options += bytes([(delta << 4) | len(data)]) + data
    return header + options + b"\xff" + payload


def test_a_retransmitted_confirmable_request_is_not_a_second_observation(start_gateway) -> None:
    gateway = start_gateway(coap=True)
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    datagram = _confirmable_post(0x1234, ["s", "boiler", "temperature"], b"70.5")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(10)
        replies = []
        for _ in range(3):  # the first ACK "lost": the sensor sends the same message again
            sock.sendto(datagram, ("127.0.0.1", port))
            replies.append(sock.recv(1500))
    assert all(reply[:4] == bytes([0x60, 0x44, 0x12, 0x34]) for reply in replies), replies  # ACK 2.04, same MID
    assert observations(gateway) == [(SENSOR + "boiler", 70.5, DEG_C)]


def test_plain_readings_take_the_fast_path_and_a_burst_of_one_message_is_one_observation(start_gateway) -> None:
    """The same confirmable datagram sent three times at once (a sensor retransmitting while its
    first copy waits for the commit) and then once more: one observation, every answer an ACK 2.04
    of that message, and the answers came from the fast path, not from aiocoap's message layer."""
    gateway = start_gateway(coap=True)
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    datagram = datagrams.request(0x2345, b"\x07\x08", "s/boiler/temperature", b"72.5")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(10)
        for _ in range(3):
            sock.sendto(datagram, ("127.0.0.1", port))
        first = sock.recv(1500)
        sock.sendto(datagram, ("127.0.0.1", port))
        again = sock.recv(1500)
    assert first == again == bytes([0x62, 0x44, 0x23, 0x45, 0x07, 0x08])  # ACK 2.04, same MID and token
    assert observations(gateway) == [(SENSOR + "boiler", 72.5, DEG_C)]
    metrics = gateway.metrics()
    assert metrics["sepa_coap_fast_path_answered"] >= 2
    assert metrics["sepa_coap_readings"] == 1
    assert metrics["sepa_coap_requests"] >= 2


def test_a_reading_refused_on_the_fast_path_is_answered_there_and_mapped_once(start_gateway) -> None:
    """A payload that cannot be read is refused 4.00 by the fast path itself, with aiocoap's
    diagnostic and counters. Before, it was handed to aiocoap, which mapped it again: a mapping's
    pattern ran twice per refused request (fast_path_answered stayed 0 here)."""
    gateway = start_gateway(coap=True)
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(10)
        sock.sendto(datagrams.request(0x3456, b"\x09", "s/boiler/temperature", b"warm"), ("127.0.0.1", port))
        reply = sock.recv(1500)
    assert reply[:5] == bytes([0x61, 0x80, 0x34, 0x56, 0x09]), reply  # ACK 4.00, same MID and token
    assert b"warm" in reply or b"number" in reply, reply  # the diagnostic says what was wrong
    metrics = gateway.metrics()
    assert metrics["sepa_coap_fast_path_answered"] == 1
    assert metrics["sepa_coap_requests"] == 1
    assert metrics['sepa_coap_bad_input_by_resource{source="s/boiler/temperature"}'] == 1
    assert observations(gateway) == []


def test_with_security_a_peer_on_the_network_is_refused_and_this_board_is_not(start_gateway, coap_client) -> None:
    gateway = start_gateway("--secure", "--host", "0.0.0.0", coap=True)  # plain gates and CoAP on every address
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    refused = libcoap.run(["-m", "post", "-e", "1", f"coap://{host_address()}:{port}/s/boiler/temperature"])
    assert (refused.stdout + refused.stderr).startswith("4.01"), refused
    assert observations(gateway) == []
    assert libcoap.succeeded(libcoap.run(["-m", "post", "-e", "2", f"coap://127.0.0.1:{port}/s/boiler/temperature"]))
    assert observations(gateway) == [(SENSOR + "boiler", 2.0, DEG_C)]


async def _send_through(relay_port: int, readings: int, senders: int) -> tuple[int, int]:
    """`readings` confirmable POSTs with distinct values from `senders` clients; (acknowledged, failed)."""
    acknowledged = failed = 0

    async def sender(index: int) -> None:
        nonlocal acknowledged, failed
        context = await aiocoap.Context.create_client_context()
        try:
            for value in range(index, readings, senders):
                uri = f"coap://127.0.0.1:{relay_port}/s/sensor{index}/temperature"
                message = aiocoap.Message(code=Code.POST, uri=uri, payload=str(value).encode())
                message.transport_tuning = _Patient()
                try:
                    response = await context.request(message).response
                except aiocoap.error.Error:
                    failed += 1
                    continue
                assert response.code == Code.CHANGED, response
                acknowledged += 1
        finally:
            await context.shutdown()

    await asyncio.gather(*(sender(index) for index in range(senders)))
    return acknowledged, failed


class _Patient(aiocoap.numbers.TransportTuning):
    """RFC 7252's timing with more retransmissions (8 instead of 4), as a sensor on a lossy link is set up."""

    MAX_RETRANSMIT = 8
    ACK_TIMEOUT = 0.5


def test_ten_percent_loss_both_ways_loses_nothing_acknowledged_and_duplicates_nothing(start_gateway) -> None:
    gateway = start_gateway(coap=True)
    server = ("127.0.0.1", int(gateway.coap_url.rsplit(":", 1)[1]))

    async def scenario() -> tuple[int, int, LossyRelay]:
        relay = LossyRelay(server, loss=0.10)
        port = await relay.start()
        try:
            acknowledged, failed = await _send_through(port, readings=300, senders=4)
        finally:
            relay.close()
        return acknowledged, failed, relay

    acknowledged, failed, relay = asyncio.run(scenario())
    assert relay.stats.dropped_up > 10 and relay.stats.dropped_down > 10  # the loss really happened
    stored = [(sensor, value) for sensor, value, _ in observations(gateway)]
    assert len(stored) == len(set(stored)), "a retransmission was stored twice"
    values = sorted(value for _, value in stored)
    assert failed == 0 and acknowledged == 300
    assert values == [float(value) for value in range(300)]  # every acknowledged reading, once


def test_a_retransmission_after_a_kill_and_restart_is_not_a_second_observation(start_gateway, tmp_path) -> None:
    """The sensor's ACK is lost, the gateway is killed (-9) and back within the sensor's
    retransmission span: the same message again is answered 2.04 and stored once."""
    gateway = start_gateway(coap=True, data_dir=tmp_path / "data")
    port = int(gateway.coap_url.rsplit(":", 1)[1])
    datagram = _confirmable_post(0x4321, ["s", "boiler", "temperature"], b"71.5")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(10)
        sock.sendto(datagram, ("127.0.0.1", port))
        assert sock.recv(1500)[:4] == bytes([0x60, 0x44, 0x43, 0x21])
        gateway.kill()
        with gateway.restart() as again:  # start_gateway stops the first one only
            assert int(again.coap_url.rsplit(":", 1)[1]) == port
            sock.sendto(datagram, ("127.0.0.1", port))  # from the same endpoint, as a retransmission is
            assert sock.recv(1500)[:4] == bytes([0x60, 0x44, 0x43, 0x21])
            assert observations(again) == [(SENSOR + "boiler", 71.5, DEG_C)]
            assert again.metrics()["sepa_coap_duplicates_skipped"] == 1
            sock.sendto(_confirmable_post(0x4322, ["s", "boiler", "temperature"], b"71.5"), ("127.0.0.1", port))
            assert sock.recv(1500)[:4] == bytes([0x60, 0x44, 0x43, 0x22])  # a new message with the same value
            assert len(observations(again)) == 2  # is a new reading


def test_short_of_memory_a_reading_gets_5_03_and_is_stored_when_sent_again_with_room(
    start_gateway, coap_client, tmp_path
) -> None:
    """broker.headroom: a floor above the machine's memory is the gateway short of memory."""
    data = tmp_path / "data"
    short = tmp_path / "short.toml"
    short.write_text(f"[store]\nmemory_floor_mb = {(meminfo()['MemTotal'] >> 20) * 2}\n")
    gateway = start_gateway(config=short, data_dir=data, coap=True)
    done = libcoap.run(["-m", "post", "-e", "63.5", f"{gateway.coap_url}/s/boiler/temperature"])
    assert (done.stdout + done.stderr).startswith("5.03"), done
    assert "store_full" in done.stdout + done.stderr
    assert gateway.metrics()["sepa_coap_refused_5_03"] == 1
    assert observations(gateway) == []
    assert gateway.stop() == 0
    roomy = tmp_path / "roomy.toml"
    roomy.write_text("[store]\nmemory_floor_mb = 1\n")
    gateway = start_gateway(config=roomy, data_dir=data, coap=True)
    assert libcoap.succeeded(libcoap.run(["-m", "post", "-e", "63.5", f"{gateway.coap_url}/s/boiler/temperature"]))
    assert observations(gateway) == [(SENSOR + "boiler", 63.5, DEG_C)]


async def oscore_posts(base: str, context_dir: Path, posts: list[tuple[str, bytes]]) -> list[Code]:
    """The POSTs in order from one OSCORE client context (aiocoap locks a context directory)."""
    context = await aiocoap.Context.create_client_context()
    try:
        context.client_credentials.load_from_dict({base + "/*": {"oscore": {"basedir": f"{context_dir}/"}}})
        codes = []
        for path, payload in posts:
            message = aiocoap.Message(code=Code.POST, uri=base + path, payload=payload)
            codes.append((await asyncio.wait_for(context.request(message).response, 30)).code)
        return codes
    finally:
        await context.shutdown()


def test_one_sensors_forbidden_paths_leave_every_other_sensor_its_bad_input_counted(start_gateway, tmp_path) -> None:
    """An OSCORE sensor posts to 1,100 paths it may not write (4.03): they are counted under one
    entry, "(forbidden to boiler)", and another sensor's bad reading afterwards is still counted
    under its own resource. Without the fix each forbidden path took a per-resource slot: the 998
    left went to s/x0... and the other sensor's bad input was counted under "(other topics)"."""
    data = tmp_path / "data"
    boiler = add_sensor(data / "coap-sensors", "boiler")
    pump = add_sensor(data / "coap-sensors", "pump")
    gateway = start_gateway("--secure", "--host", "0.0.0.0", data_dir=data, coap=True)
    base = f"coap://{host_address()}:{int(gateway.coap_url.rsplit(':', 1)[1])}"

    forbidden = [(f"/s/x{number}/temperature", b"1") for number in range(1_100)]
    codes = asyncio.run(oscore_posts(base, sensor_side(tmp_path, "boiler", boiler), forbidden))
    assert set(codes) == {Code.FORBIDDEN}
    bad = asyncio.run(oscore_posts(base, sensor_side(tmp_path, "pump", pump), [("/s/pump/temperature", b"true")]))
    assert bad == [Code.BAD_REQUEST]
    metrics = gateway.metrics()
    assert metrics.get('sepa_coap_bad_input_by_resource{source="s/pump/temperature"}') == 1
    assert metrics.get('sepa_coap_bad_input_by_resource{source="(forbidden to boiler)"}') == 1_100
