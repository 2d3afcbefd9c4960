"""Helpers of the cloud tests: records and batches (and segments as the gateway's shipper makes them), a
self-signed certificate, the landing endpoint on a free port in a thread of this process, and a small
HTTPS client on real sockets."""

from __future__ import annotations

import asyncio
import datetime
import gzip
import http.client
import ipaddress
import json
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pyoxigraph import NamedNode

from broker.api import rfc3339
from cloud.guards import GuardedSite
from cloud.landing import LANDING, Landing, landing_app
from cloud.settings import LandingSettings
from gateway.observations.digest import DigestEntry, ObservationDigest
from gateway.observations.iris import observation_iri
from gateway.observations.reading import Reading
from gateway.observations.vocabulary import GRAPH_OBSERVATIONS
from gateway.shipper.records import assemble_digest, json_line

TOKEN = "test-token-7f3a"
NDJSON_HEADERS = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"}
EX = "http://example.org/"


def record(number: int, **changes: Any) -> dict[str, Any]:
    """A valid observation record; ``changes`` override fields (a value of ``...`` removes the field)."""
    base: dict[str, Any] = {
        "id": f"{EX}observation/{number}",
        "sensor": f"{EX}sensor/{number % 3}",
        "property": f"{EX}property/temperature",
        "feature": f"{EX}room/kitchen",
        "value": 20.0 + number / 8,
        "literal": None,
        "unit": "http://qudt.org/vocab/unit/DEG_C",
        "result_time": f"2026-11-22T18:30:{number % 60:02d}.{number:06d}Z",
        "source_time": None,
        "sequence": number + 1,
        "gateway": "gw-1",
        "source": "zigbee2mqtt/kitchen",
    }
    base.update(changes)
    return {key: value for key, value in base.items() if value is not ...}


def ndjson(records: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(item).encode() + b"\n" for item in records)


def batch(records: Iterable[dict[str, Any]]) -> bytes:
    """The shipper's encoding: gzip with mtime 0, so a batch always has the same bytes."""
    return gzip.compress(ndjson(records), mtime=0)


SEGMENT_BYTES = 1 << 20  # [shipper] segment_max_bytes' default
UPDATE_READINGS = 1000  # [mqtt] batch_max_readings: the readings of one update share its result time
_START_US = 1_795_000_000_000_000
_HOMIE = "living-room-north-wall-multisensor-v2"
_NS = "http://w3id.org/sepa-gateway/ns#"
_DEG_C = "http://qudt.org/vocab/unit/DEG_C"


def _bench(k: int) -> tuple[Reading, int]:
    """The MQTT benchmark's readings: 100 sensors in turn, a new value each time."""
    sensor = f"gateway/bench{k % 100}"
    topic = f"{sensor}/temperature"
    urn = "urn:sepa-gateway:"
    reading = Reading(
        f"{urn}sensor:{sensor}", f"{_NS}temperature", f"{urn}feature:{sensor}", float(k), _DEG_C, topic, None, str(k)
    )
    return reading, k // 100 + 1


def _constant(k: int) -> tuple[Reading, int]:
    """One sensor, the same value every time: the most repetitive records the gateway writes."""
    device = "urn:sepa-gateway:{}:zigbee2mqtt/kitchen"
    reading = Reading(
        device.format("sensor"),
        f"{_NS}temperature",
        device.format("feature"),
        21.5,
        _DEG_C,
        "zigbee2mqtt/kitchen",
        None,
        str(k),
    )
    return reading, k + 1


def _long_names(k: int) -> tuple[Reading, int]:
    """As `_constant`, with the long names of a Homie device: the most repeated bytes a record holds."""
    sensor = f"urn:sepa-gateway:sensor:homie/{_HOMIE}/environment"
    unit = "http://qudt.org/vocab/unit/PERCENT_RH"
    topic = f"homie/5/{_HOMIE}/environment/relative-humidity"
    reading = Reading(
        sensor, f"{_NS}relativeHumidity", f"urn:sepa-gateway:feature:homie/{_HOMIE}", 48.0, unit, topic, None, str(k)
    )
    return reading, k + 1


def _door(k: int) -> tuple[Reading, int]:
    """A contact sensor: a boolean (a literal in the record), always the same."""
    device = "urn:sepa-gateway:{}:zigbee2mqtt/front-door"
    reading = Reading(
        device.format("sensor"),
        f"{_NS}contact",
        device.format("feature"),
        False,
        None,
        "zigbee2mqtt/front-door",
        None,
        str(k),
    )
    return reading, k + 1


GATEWAY_SEGMENTS: dict[str, Callable[[int], tuple[Reading, int]]] = {
    "bench": _bench,
    "constant": _constant,
    "long-names": _long_names,
    "door": _door,
}
"""The readings (and their sequence numbers) of the segments the gateway's own adapters fill."""


def _digest_entry(gateway: str, reading: Reading, sequence: int) -> DigestEntry:
    numeric = not isinstance(reading.value, (bool, str))
    value = float(reading.value) if numeric else None
    literal = None if numeric else str(reading.value).lower()
    iri = observation_iri(gateway, reading)
    unit = reading.unit if numeric else None
    return DigestEntry(
        iri, reading.sensor, reading.property, reading.feature, value, literal, unit, sequence, reading.source
    )


def shipper_lines(kind: str, gateway: str = "plant-room-1") -> bytes:
    """The JSON lines of one full segment as the shipper spools them: records built by
    ``assemble_digest`` (the shipper's path for the observation layer's batches, IRIs from
    ``observation_iri``) in updates of :data:`UPDATE_READINGS`, written by ``json_line``, until the
    segment reaches :data:`SEGMENT_BYTES`. ``kind`` is a :data:`GATEWAY_SEGMENTS` key, or
    ``numbered-iris``: observations a SPARQL client wrote itself with numbered IRIs."""
    if kind == "numbered-iris":
        return _numbered_iris(gateway)
    readings = GATEWAY_SEGMENTS[kind]
    lines: list[bytes] = []
    size = k = 0
    while size < SEGMENT_BYTES:
        entries = [_digest_entry(gateway, *readings(n)) for n in range(k, k + UPDATE_READINGS)]
        k += UPDATE_READINGS
        digest = ObservationDigest(NamedNode(GRAPH_OBSERVATIONS), tuple(entries))
        for item in assemble_digest(digest, _START_US + k * 1000, gateway).records:
            lines.append(json_line(item))
            size += len(lines[-1])
    return b"".join(lines)


def _numbered_iris(gateway: str) -> bytes:
    lines: list[bytes] = []
    size = k = 0
    while size < SEGMENT_BYTES:
        result_time = rfc3339(_START_US + k // UPDATE_READINGS * 1000)
        item = record(k, gateway=gateway, sensor=f"{EX}sensor/1", value=21.5, result_time=result_time, source="kitchen")
        lines.append(json_line(item))
        size += len(lines[-1])
        k += 1
    return b"".join(lines)


def shipper_segment(kind: str, level: int = 1) -> bytes:
    """:func:`shipper_lines` gzip'ed as the spool seals a segment (level 1, mtime 0; ``level`` for other clients)."""
    return gzip.compress(shipper_lines(kind), compresslevel=level, mtime=0)


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC)


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed server certificate for 127.0.0.1 and localhost (PEM chain, PEM key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sepa-cloud test")])
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Client:
    """HTTP(S) to one endpoint; a new connection per request, as concurrent tests need."""

    port: int
    cafile: Path | None
    token: str | None = TOKEN
    timeout: float = 30.0
    context: ssl.SSLContext | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.cafile is not None:
            self.context = ssl.create_default_context(cafile=str(self.cafile))

    def request(
        self, method: str, path: str, body: bytes | Iterable[bytes] | None = None, headers: dict[str, str] | None = None
    ) -> Reply:
        if self.context is None:
            connection: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", self.port, self.timeout)
        else:
            connection = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=self.timeout, context=self.context)
        try:
            chunked = body is not None and not isinstance(body, bytes)
            connection.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
            response = connection.getresponse()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        finally:
            connection.close()

    def put(self, batch_id: str, body: bytes | Iterable[bytes], **headers: str) -> Reply:
        """PUT a batch with the contract's headers; ``headers`` override them (an empty value drops one)."""
        sent = dict(NDJSON_HEADERS)
        if self.token is not None:
            sent["Authorization"] = f"Bearer {self.token}"
        sent.update({key.replace("_", "-"): value for key, value in headers.items()})
        return self.request("PUT", f"/v1/batches/{batch_id}", body, {k: v for k, v in sent.items() if v})

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {sample name with labels: value}."""
        text = self.request("GET", "/metrics").body.decode()
        samples = [line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")]
        return {name: float(value) for name, value in samples}


class LandingServer:
    """The endpoint built with :func:`landing_app` and served on a free port by a thread of this process
    (the in-process use the gateway's end-to-end tests make of it)."""

    def __init__(self, settings: LandingSettings, middlewares: Iterable[Any] = ()) -> None:
        self.settings = settings
        self.middlewares = list(middlewares)  # inside the endpoint's own: faults a test puts in front of it
        self.port = 0
        self.landing: Landing | None = None
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="landing-server", daemon=True)

    def __enter__(self) -> LandingServer:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the landing endpoint did not start")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *_exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        try:
            app = landing_app(self.settings)
            app.middlewares.extend(self.middlewares)
            self.landing = app[LANDING]
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            context = self.settings.ssl_context()
            site = GuardedSite(runner, "127.0.0.1", self.settings.port, guard=self.landing.guard, ssl_context=context)
            await site.start()
            self.port = runner.addresses[0][1]
        except BaseException as error:
            self._error = error
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def client(self, token: str | None = TOKEN) -> Client:
        return Client(self.port, self.settings.cert, token)

    def visible_files(self) -> list[str]:
        """What Spark's file source would list: names not starting with ``.`` or ``_``."""
        return sorted(p.name for p in self.settings.landing_dir.iterdir() if not p.name.startswith((".", "_")))

    def all_files(self) -> list[str]:
        return sorted(p.name for p in self.settings.landing_dir.iterdir())
