"""TLS with a CA made here (server and client certificates) and username/password, on both protocols."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import subprocess
import uuid
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from adapters.mqtt.connection import MqttConnection
from adapters.mqtt.ingest import Ingestor
from adapters.mqtt.settings import MqttSettings, TlsSettings
from tools.mosquitto import Mosquitto, until


def issue(directory: Path, name: str, ca: tuple | None = None, server: bool = False) -> tuple:
    """Write <name>.pem and <name>.key; self-signed when `ca` is None."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = (ca[0].subject, ca[1]) if ca else (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca is None, path_length=None), critical=True)
    )
    if server:
        san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert, key


@pytest.fixture
def tls_broker(tmp_path: Path, mosquitto: Mosquitto):
    """A second mosquitto: TLS only, client certificate required, password file, no anonymous access."""
    mosquitto.stop()
    ca = issue(tmp_path, "ca")
    issue(tmp_path, "server", ca, server=True)
    issue(tmp_path, "client", ca)
    passwords = tmp_path / "passwords"
    passwords.touch()
    subprocess.run(["mosquitto_passwd", "-b", str(passwords), "sensor-gw", "s3cret pass"], check=True)
    listener = (
        f"cafile {tmp_path / 'ca.pem'}\ncertfile {tmp_path / 'server.pem'}\nkeyfile {tmp_path / 'server.key'}\n"
        f"require_certificate true\npassword_file {passwords}\nallow_anonymous false"
    )
    directory = tmp_path / "tls"
    directory.mkdir()
    broker = Mosquitto(directory, listener=listener)
    broker.start()
    yield broker, tmp_path
    broker.stop()


def tls_settings(broker: Mosquitto, certs: Path, protocol: str, password: str = "s3cret pass") -> MqttSettings:
    return MqttSettings(
        host="127.0.0.1",
        port=broker.port,
        client_id=f"tls-{uuid.uuid4().hex[:8]}",
        protocol=protocol,
        username="sensor-gw",
        password=password,
        tls=TlsSettings(ca=str(certs / "ca.pem"), cert=str(certs / "client.pem"), key=str(certs / "client.key")),
        reconnect_min_s=0.05,
        reconnect_max_s=0.2,
    )


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_tls_client_certificate_and_password(tls_broker, protocol: str) -> None:
    broker, certs = tls_broker

    async def scenario() -> None:
        received = []

        async def commit(batch) -> None:
            received.extend(m.payload for m in batch)

        connection = MqttConnection(tls_settings(broker, certs, protocol))
        await connection.start(["secure/#"])
        ingest = asyncio.create_task(Ingestor(connection, commit).run())
        async with asyncio.timeout(5):
            await connection.wait_connected()
        await asyncio.sleep(0.1)
        await connection.publish("secure/a", b"21.5")
        tls_pub = ["--cafile", str(certs / "ca.pem"), "--cert", str(certs / "client.pem")]
        tls_pub += ["--key", str(certs / "client.key"), "-u", "sensor-gw", "-P", "s3cret pass"]
        await asyncio.to_thread(broker.pub, "secure/b", "22.5", extra=tuple(tls_pub))
        await until(lambda: sorted(received) == [b"21.5", b"22.5"], what="both readings over TLS")
        await connection.stop()
        ingest.cancel()

    asyncio.run(scenario())


def test_wrong_password_is_refused_and_reported(tls_broker) -> None:
    broker, certs = tls_broker

    async def scenario() -> None:
        connection = MqttConnection(tls_settings(broker, certs, "5", password="Wr0ng-Pa55"))
        await connection.start(["secure/#"])
        await until(lambda: connection.stats.connect_failures >= 2, what="refused connection attempts")
        assert not connection.stats.connected
        assert "refused" in connection.stats.last_error
        assert "Wr0ng-Pa55" not in repr(connection.settings)
        await connection.stop()

    asyncio.run(scenario())
