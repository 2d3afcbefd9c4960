"""The gateway as a CoAP client, inside a real `sepa-gateway run`, against a real CoAP peer: an aiocoap
sensor in its own process on 127.0.0.1 (sensor_process.py), over UDP.

What it protects: a resource listed in `[[coap.observe]]` is observed (RFC 7641) and each notification
becomes one observation, through the mappings and content formats of a POSTed reading; one added to
the mappings graph by a SPARQL update is observed without a restart, and left when deleted; a sensor
killed and started again on its port (it forgot its observer) is registered with again and its later
values arrive; a gateway restarted observes again what its store lists; a `[[coap.actuators]]` row
becomes a confirmable PUT the device receives; a section that cannot work is refused at start.
"""

from __future__ import annotations

import json
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiocoap
import cbor2
import pytest
from aiocoap import Code
from aiocoap.optiontypes import BlockOption
from pyoxigraph import Literal, NamedNode

from adapters.coap.actuators import CoapActuator
from adapters.coap.plugin import PLUGIN, CoapConfig
from adapters.coap.targets import ObserveTarget, observe_from_config
from gateway.appliance.config import ConfigError
from tests.conftest import stop_and_check
from tools.coap import libcoap
from tools.launcher import RunningGateway

PREFIXES = (
    "PREFIX sosa: <http://www.w3.org/ns/sosa/> PREFIX qudt: <http://qudt.org/schema/qudt/> "
    "PREFIX gw: <http://w3id.org/sepa-gateway/ns#> "
)
OBSERVATIONS = "<http://w3id.org/sepa-gateway/graph/observations>"
MAPPINGS = "<http://w3id.org/sepa-gateway/graph/mappings>"
TEXT = 0


class Sensor:
    """sensor_process.py in a subprocess: its stdout lines in a queue, its stdin to set values."""

    def __init__(self, *args: str, port: int = 0) -> None:
        self.args = args
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.adapters.coap.sensor_process", "--port", str(port), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.port = int(self.wait_for("ready ").split()[1])
        except BaseException:  # no object for the `sensors` fixture to kill at teardown
            self.kill()
            raise

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def wait_for(self, prefix: str, timeout: float = 15.0) -> str:
        """The first line from now on that starts with `prefix`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the sensor did not say {prefix!r}; it said {self.seen}") from None
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def set(self, name: str, payload: bytes, content_format: int = TEXT) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"set {name} {content_format} {payload.hex()}\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def uri(self, path: str) -> str:
        return f"coap://127.0.0.1:{self.port}/{path}"


@pytest.fixture
def sensors() -> Iterator[Callable[..., Sensor]]:
    """Factory of sensor processes; every one is killed at teardown."""
    started: list[Sensor] = []

    def start(*args: str, port: int = 0) -> Sensor:
        started.append(Sensor(*args, port=port))
        return started[-1]

    yield start
    for sensor in started:
        sensor.kill()


def values(gateway: RunningGateway, source: str) -> list[float]:
    """The numeric observations of `source`, oldest first."""
    rows = gateway.select(
        PREFIXES + "SELECT ?v ?time WHERE { GRAPH " + OBSERVATIONS + " { "
        f'?obs a sosa:Observation ; gw:hasCoapResource "{source}" ; sosa:hasResult ?r ; sosa:resultTime ?time . '
        "?r qudt:numericValue ?v } } ORDER BY ?time"
    )
    return [float(row["v"]) for row in rows]


def eventually(predicate: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not met in {timeout} s"
        time.sleep(0.05)


def observe_entry(uri: str, source: str) -> str:
    return f'[[coap.observe]]\nuri = "{uri}"\nsource = "{source}"\n'


def insert_observation(gateway: RunningGateway, node: str, uri: str, source: str) -> None:
    reply = gateway.update(
        f"PREFIX gw: <http://w3id.org/sepa-gateway/ns#> INSERT DATA {{ GRAPH {MAPPINGS} {{ "
        f'<{node}> a gw:CoapObservation ; gw:uri "{uri}" ; gw:source "{source}" }} }}'
    )
    assert reply.status == 200, reply.body


def test_each_notification_of_a_configured_resource_is_stored_once(
    sensors: Callable[..., Sensor], start_gateway: Callable[..., RunningGateway]
) -> None:
    sensor = sensors("--observable", "temperature", "--observable", "meter", "--initial", "temperature=20.5")
    sensor.set("meter", cbor2.dumps([{0: "power", 2: 12.5, 1: "W"}]), content_format=112)  # SenML CBOR
    gateway = start_gateway(
        coap=True,
        toml="[coap]\n"
        + observe_entry(sensor.uri("temperature"), "s/boiler/temperature")
        + observe_entry(sensor.uri("meter"), "s/meter"),
    )
    eventually(lambda: values(gateway, "s/boiler/temperature") == [20.5], what="the first response stored")
    eventually(lambda: values(gateway, "s/meter") == [12.5], what="the SenML CBOR representation")
    for value in (b"21", b"21.5", b"22"):
        sensor.set("temperature", value)
        time.sleep(0.1)
    eventually(lambda: values(gateway, "s/boiler/temperature") == [20.5, 21.0, 21.5, 22.0], what="notifications")
    sensor.set("temperature", b"warm")  # no number: counted, not stored
    sensor.set("meter", cbor2.dumps([{0: "power", 2: 13.5, 1: "W"}]), content_format=112)
    eventually(lambda: values(gateway, "s/meter") == [12.5, 13.5], what="the SenML CBOR notification")
    gateway.wait_for_metric("sepa_coap_observe_bad_payloads", lambda v: v == 1)
    time.sleep(0.3)
    assert values(gateway, "s/boiler/temperature") == [20.5, 21.0, 21.5, 22.0]
    metrics = gateway.metrics()
    assert metrics["sepa_coap_observed"] == 2 and metrics["sepa_coap_observe_failed"] == 0
    assert metrics["sepa_coap_observe_registrations"] == 2 and metrics["sepa_coap_observe_losses"] == 0
    assert metrics["sepa_coap_observe_notifications"] == 5 and metrics["sepa_coap_observe_readings"] == 6
    sensor_row = gateway.select(
        PREFIXES + "SELECT ?sensor WHERE { GRAPH " + OBSERVATIONS + ' { ?obs gw:hasCoapResource "s/meter" ; '
        "sosa:madeBySensor ?sensor } }"
    )
    assert sensor_row == [{"sensor": "urn:sepa-gateway:sensor:coap/meter/power"}] * 2


class RawSensor:
    """A sensor on a real UDP socket, written raw, with faults an aiocoap or libcoap server cannot be
    made to show. Its representation goes block-wise in 1,024-byte blocks (`None`: it never ends,
    every block has "more" set); each block after the first is answered `block_delay_s` late; and
    `notify(count)` sends that many block-wise notifications at once."""

    def __init__(self, representation: bytes | None = None, content_format: int = TEXT, block_delay_s: float = 0.0):
        self.representation = representation
        self.content_format = content_format
        self.block_delay_s = block_delay_s
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.1)
        self.port = self.socket.getsockname()[1]
        self.requests = 0
        self.observer: tuple[Any, bytes] | None = None  # the registration's address and token
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def uri(self, path: str) -> str:
        return f"coap://127.0.0.1:{self.port}/{path}"

    def _block(self, number: int) -> aiocoap.Message:
        if self.representation is None:
            payload, more = b"1" * 1024, True
        else:
            payload = self.representation[number * 1024 : (number + 1) * 1024]
            more = (number + 1) * 1024 < len(self.representation)
        message = aiocoap.Message(code=Code.CONTENT, payload=payload)
        message.opt.content_format = self.content_format
        message.opt.etag = b"\x01"
        message.opt.block2 = BlockOption.BlockwiseTuple(number, more, 6)
        return message

    def _serve(self) -> None:
        while self.running:
            try:
                data, peer = self.socket.recvfrom(2048)
            except TimeoutError:
                continue
            request = aiocoap.Message.decode(data)
            if request.code != Code.GET:
                continue  # the gateway's acknowledgements and resets
            self.requests += 1
            number = request.opt.block2.block_number if request.opt.block2 is not None else 0
            answer = self._block(number)  # a piggybacked answer
            answer.mtype, answer.mid, answer.token = aiocoap.ACK, request.mid, request.token
            if request.opt.observe == 0:
                answer.opt.observe = 1
                self.observer = (peer, request.token)
            if number and self.block_delay_s:
                threading.Timer(self.block_delay_s, self.socket.sendto, (answer.encode(), peer)).start()
            else:
                self.socket.sendto(answer.encode(), peer)

    def notify(self, count: int) -> None:
        assert self.observer is not None
        peer, token = self.observer
        for number in range(count):
            notification = self._block(0)
            notification.mtype, notification.mid, notification.token = aiocoap.NON, 1000 + number, token
            notification.opt.observe = 2 + number
            self.socket.sendto(notification.encode(), peer)

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.socket.close()


@pytest.fixture
def libcoap_server(tmp_path: Path) -> Iterator[Callable[[bytes], None]]:
    """libcoap's coap-server on 127.0.0.1 (fails, never skips, when missing); yields its port's
    `/example_data` URI's setter: a block-wise PUT by coap-client (its observers are notified)."""
    tool = libcoap.coap_server()
    if tool is None:
        pytest.fail(libcoap.MISSING, pytrace=False)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [tool, "-A", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    uri = f"coap://127.0.0.1:{port}/example_data"

    def put(payload: bytes) -> None:
        body = tmp_path / "body"
        body.write_bytes(payload)
        deadline = time.monotonic() + 10
        while not libcoap.succeeded(
            done := libcoap.run(["-m", "put", "-b", "1024", "-t", "110", "-f", str(body), uri])
        ):
            assert time.monotonic() < deadline, done.stdout + done.stderr
            time.sleep(0.1)

    put.uri = uri  # type: ignore[attr-defined]
    yield put
    server.kill()
    server.wait()


def senml(values: range, offset: float = 0.0) -> bytes:
    return json.dumps([{"bn": "urn:dev:meter:", "n": f"p{k}", "u": "W", "v": k + offset} for k in values]).encode()


def test_a_block_wise_notification_is_assembled_up_to_max_payload_bytes_and_no_further(
    libcoap_server: Callable[[bytes], None], start_gateway: Callable[..., RunningGateway]
) -> None:
    """aiocoap assembled an observed resource's blocks without a limit: a sensor (or whoever
    answers for it) that never says "last block" was asked for block after block, the
    representation growing in the gateway's memory for ever (1,712 blocks, 1.7 MB, in 2 s on
    localhost). Now the assembly stops at [coap] max_payload_bytes, the notification is counted
    as a bad payload, and libcoap's block-wise representations within the bound (the first
    response and a notification, ~4.7 KB of SenML each) are stored whole."""
    endless = RawSensor()
    libcoap_server(senml(range(80)))
    try:
        gateway = start_gateway(
            coap=True,
            toml="[coap]\nmax_payload_bytes = 8192\n"
            + observe_entry(endless.uri("temperature"), "s/endless/temperature")
            + observe_entry(libcoap_server.uri, "s/meter"),  # type: ignore[attr-defined]
        )
        gateway.wait_for_metric("sepa_coap_observe_bad_payloads", lambda v: v >= 1, timeout=10)
        eventually(lambda: len(values(gateway, "s/meter")) == 80, what="the first response's 80 readings")
        libcoap_server(senml(range(80), offset=1000.0))
        eventually(lambda: len(values(gateway, "s/meter")) == 160, what="the notification's 80 readings")
        asked = endless.requests
        time.sleep(1.0)
        assert asked <= 8192 // 1024 and endless.requests == asked  # it stopped at the bound
        assert gateway.metric("sepa_coap_observe_bad_payloads") == 1
        assert sorted(values(gateway, "s/meter")) == [float(k) for k in range(80)] + [k + 1000.0 for k in range(80)]
    finally:
        endless.close()


def test_notifications_behind_a_block_wise_one_wait_in_a_bounded_queue(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """Notifications are stored in the order they came, so those that arrive while one's blocks
    are fetched wait behind it: at most MAX_WAITING (8) of them, the rest counted as bad payloads
    and dropped; the waiting ones are then fetched and stored, and the observation goes on."""
    pack = json.dumps([{"n": "temperature", "u": "Cel", "v": 21.5}]).encode().ljust(2500)  # three blocks
    sensor = RawSensor(pack, content_format=110, block_delay_s=0.2)  # SenML JSON; ~0.4 s a representation
    try:
        gateway = start_gateway(coap=True, toml="[coap]\n" + observe_entry(sensor.uri("t"), "s/slow"))
        eventually(lambda: sensor.observer is not None, what="the registration")
        sensor.notify(20)  # while the first response's blocks are still being fetched
        gateway.wait_for_metric("sepa_coap_observe_bad_payloads", lambda v: v == 12, timeout=10)
        eventually(lambda: len(values(gateway, "s/slow")) == 9, what="the first response and 8 notifications")
        time.sleep(0.5)
        assert values(gateway, "s/slow") == [21.5] * 9
        assert gateway.metric("sepa_coap_observe_bad_payloads") == 12 and gateway.metric("sepa_coap_observed") == 1
    finally:
        sensor.close()


def test_an_observation_added_by_a_sparql_update_starts_and_a_deleted_one_stops(
    sensors: Callable[..., Sensor], start_gateway: Callable[..., RunningGateway]
) -> None:
    sensor = sensors("--observable", "temperature", "--initial", "temperature=18")
    gateway = start_gateway(coap=True, toml="[coap]\n")
    assert gateway.metric("sepa_coap_observed") == 0
    insert_observation(gateway, "urn:example:hall", sensor.uri("temperature"), "s/hall/temperature")
    eventually(lambda: values(gateway, "s/hall/temperature") == [18.0], what="observed after the update")
    assert sensor.wait_for("observers temperature ") == "observers temperature 1"
    sensor.set("temperature", b"19")
    eventually(lambda: values(gateway, "s/hall/temperature") == [18.0, 19.0], what="a notification")
    reply = gateway.update(f"DELETE WHERE {{ GRAPH {MAPPINGS} {{ <urn:example:hall> ?p ?o }} }}")
    assert reply.status == 200, reply.body
    gateway.wait_for_metric("sepa_coap_observed", lambda v: v == 0)
    # aiocoap has no deregistration: the first notification after is acknowledged (and dropped), the
    # next one is answered with a reset, and the sensor forgets the gateway
    sensor.set("temperature", b"20")
    time.sleep(0.2)
    sensor.set("temperature", b"21")
    assert sensor.wait_for("observers temperature ") == "observers temperature 0"
    time.sleep(0.3)
    assert values(gateway, "s/hall/temperature") == [18.0, 19.0]


def test_a_sensor_restarted_on_its_port_is_registered_with_again(
    sensors: Callable[..., Sensor], start_gateway: Callable[..., RunningGateway]
) -> None:
    first = sensors("--observable", "temperature", "--initial", "temperature=30", "--max-age", "1")
    gateway = start_gateway(
        coap=True,
        toml="[coap]\nobserve_margin_s = 1.0\nobserve_backoff_max_s = 2.0\n"
        + observe_entry(first.uri("temperature"), "s/attic/temperature"),
    )
    eventually(lambda: 30.0 in values(gateway, "s/attic/temperature"), what="the first value")
    time.sleep(2.5)  # notifications every 0.6 s keep the observation alive: no loss
    assert gateway.metric("sepa_coap_observe_losses") == 0 and gateway.metric("sepa_coap_observe_registrations") == 1
    first.kill()
    second = sensors("--observable", "temperature", "--initial", "temperature=31", "--max-age", "1", port=first.port)
    assert second.wait_for("observers temperature ", timeout=20) == "observers temperature 1"
    eventually(lambda: 31.0 in values(gateway, "s/attic/temperature"), what="the restarted sensor's value")
    second.set("temperature", b"32")
    eventually(lambda: 32.0 in values(gateway, "s/attic/temperature"), what="a later notification")
    metrics = gateway.metrics()
    assert metrics["sepa_coap_observe_losses"] >= 1 and metrics["sepa_coap_observe_registrations"] >= 2
    assert metrics["sepa_coap_observed"] == 1


def test_a_restarted_gateway_observes_again_what_its_store_lists(
    sensors: Callable[..., Sensor], start_gateway: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    sensor = sensors("--observable", "temperature", "--initial", "temperature=5")
    gateway = start_gateway(coap=True, toml="[coap]\n", data_dir=tmp_path / "data")
    insert_observation(gateway, "urn:example:cellar", sensor.uri("temperature"), "s/cellar/temperature")
    eventually(lambda: values(gateway, "s/cellar/temperature") == [5.0], what="observed")
    stop_and_check(gateway)
    sensor.set("temperature", b"6")  # while the gateway is away: its old observation ends here
    restarted = gateway.restart()
    try:
        restarted.wait_for_metric("sepa_coap_observe_registrations", lambda v: v == 1, timeout=10)
        eventually(lambda: 6.0 in values(restarted, "s/cellar/temperature"), what="the value at restart")
        sensor.set("temperature", b"7")
        eventually(lambda: values(restarted, "s/cellar/temperature")[-1] == 7.0, what="a notification")
    finally:
        stop_and_check(restarted)


def test_an_actuator_row_is_put_to_the_device(
    sensors: Callable[..., Sensor], start_gateway: Callable[..., RunningGateway]
) -> None:
    device = sensors("--actuator", "kitchen-lamp")
    gateway = start_gateway(
        coap=True,
        toml="[coap]\n[[coap.actuators]]\n"
        'id = "lamps"\n'
        "query = 'SELECT ?lamp ?power WHERE { GRAPH <urn:lights> { ?l <urn:name> ?lamp ; <urn:power> ?power } }'\n"
        f'uri = "coap://127.0.0.1:{device.port}/{{lamp}}"\n'
        'payload = "{power}"\n',
    )
    reply = gateway.update(
        'INSERT DATA { GRAPH <urn:lights> { <urn:l1> <urn:name> "kitchen-lamp" ; <urn:power> "ON" } }'
    )
    assert reply.status == 200, reply.body
    assert device.wait_for("put ") == f"put kitchen-lamp 0 {b'ON'.hex()}"
    gateway.wait_for_metric("sepa_coap_actuator_sent", lambda v: v == 1)
    reply = gateway.update(
        "INSERT DATA { GRAPH <urn:lights> { "
        '<urn:l2> <urn:name> "garden-lamp" ; <urn:power> "ON" . <urn:l3> <urn:name> "up/stairs" ; <urn:power> "ON" } }'
    )
    assert reply.status == 200, reply.body
    gateway.wait_for_metric("sepa_coap_actuator_failed", lambda v: v == 1)  # 4.04: the device has no garden-lamp
    gateway.wait_for_metric("sepa_coap_actuator_refused", lambda v: v == 1)  # a "/" would add a path level
    reply = gateway.update(
        'DELETE DATA { GRAPH <urn:lights> { <urn:l1> <urn:power> "ON" } } ; '
        'INSERT DATA { GRAPH <urn:lights> { <urn:l1> <urn:power> "OFF" } }'
    )
    assert reply.status == 200, reply.body
    assert device.wait_for("put ") == f"put kitchen-lamp 0 {b'OFF'.hex()}"
    gateway.wait_for_metric("sepa_coap_actuator_sent", lambda v: v == 2)
    assert gateway.metric("sepa_coap_actuator_dropped") == 0 and gateway.metric("sepa_coap_actuator_queued") == 0


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"observe": [{"uri": "http://127.0.0.1/t"}]}, "coap.observe[0]: uri 'http://127.0.0.1/t' is not a coap://"),
        ({"observe": [{"uri": "coap://127.0.0.1"}]}, "coap.observe[0]: uri 'coap://127.0.0.1': no source"),
        ({"observe": [{"uri": "coap://h/t", "every": 5}]}, "coap.observe[0]: unknown key(s) every"),
        ({"observe_margin_s": -1.0}, "coap.observe_margin_s must be between 0 and 3600"),
        ({"actuators": [{"id": "a", "query": "ASK {}", "uri": "coap:///{x}", "payload": "1"}]}, "is not a coap://"),
        ({"actuators": [{"id": "a", "query": "ASK {}", "uri": "coap://h/x", "payload": "1", "qos": 1}]}, "qos"),
    ],
)
def test_a_section_that_cannot_work_is_refused_at_start(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        PLUGIN.check(CoapConfig(**section))


def test_an_observed_resource_without_source_is_mapped_as_its_path() -> None:
    (target,) = observe_from_config([{"uri": "coap://[::1]:5683/s/boiler/temperature"}])
    assert target == ObserveTarget("coap://[::1]:5683/s/boiler/temperature", "s/boiler/temperature")


def test_an_actuator_uri_takes_a_host_or_a_level_from_the_row_never_more() -> None:
    actuator = CoapActuator.from_config(
        {"id": "a", "query": "SELECT * {}", "uri": "coap://[{ip}]:5683/{lamp}", "payload": "{power}"}, 0
    )
    row = ("ip", "lamp", "power")
    assert actuator.render(row, (Literal("fe80::1"), NamedNode("urn:example:kitchen"), Literal("ON"))) == (
        "coap://[fe80::1]:5683/kitchen",
        "ON",
    )
    for ip, lamp in (("fe80::1", "a/b"), ("fe80::1", "x?y"), ("not-an-address", "lamp"), ("::1]@evil", "x")):
        assert actuator.render(row, (Literal(ip), Literal(lamp), Literal("ON"))) is None
