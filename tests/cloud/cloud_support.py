"""Helpers of the cloud tests: records and batches, a self-signed certificate, the landing endpoint on a
free port in a thread of this process, and a small HTTPS client on real sockets."""

from __future__ import annotations

import asyncio
import datetime
import gzip
import http.client
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cloud.guards import GuardedSite
from cloud.landing import LANDING, Landing, landing_app
from cloud.settings import LandingSettings

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
