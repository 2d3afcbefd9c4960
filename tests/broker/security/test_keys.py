"""The generated TLS certificate, over real TLS handshakes with Python's ssl (OpenSSL)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from broker.security.keys import CERT_FILE, self_signed
from tests.conftest import stop_and_check
from tests.support.clock import SteppedClock
from tools.launcher import launch_gateway


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _leaf_signed_by(issuer_pem: bytes, issuer_key: ec.EllipticCurvePrivateKey, name: str) -> tuple[bytes, bytes]:
    """A server certificate for `name` issued by the gateway's certificate, as whoever took its key would."""
    issuer = x509.load_pem_x509_certificate(issuer_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(issuer_key, hashes.SHA256())
    )
    return leaf.public_bytes(serialization.Encoding.PEM) + issuer_pem, _pem_key(key)


def _handshake(tmp_path: Path, chain: bytes, key: bytes, trusted: bytes, server_hostname: str) -> None:
    """One TLS handshake over a real socket: a server presenting `chain`, a client trusting only
    `trusted` and checking `server_hostname`. Raises the client's verification error."""
    (tmp_path / "chain.pem").write_bytes(chain)
    (tmp_path / "key.pem").write_bytes(key)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "chain.pem", tmp_path / "key.pem")
    client_context = ssl.create_default_context(cadata=trusted.decode())
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        try:
            with server_context.wrap_socket(connection, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass  # the client refused the certificate

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        with (
            socket.create_connection(listener.getsockname(), timeout=10) as raw,
            client_context.wrap_socket(raw, server_hostname=server_hostname),
        ):
            pass
    finally:
        server.join(10)
        listener.close()


def test_the_generated_certificate_serves_its_own_names(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = self_signed(key, ["gw.plant.example"])
    for name in ("localhost", "gw.plant.example"):
        _handshake(tmp_path, pem, _pem_key(key), pem, name)


def test_the_generated_certificate_cannot_vouch_for_another_site(tmp_path: Path) -> None:
    """Clients trust the file as a CA: with CA:TRUE alone, its key signed www.bank.example and
    clients trusting the gateway accepted it (an attack pass). Name constraints hold it to its names."""
    key = ec.generate_private_key(ec.SECP256R1())
    pem = self_signed(key, ["gw.plant.example"])
    chain, leaf_key = _leaf_signed_by(pem, key, "www.bank.example")
    with pytest.raises(ssl.SSLCertVerificationError, match="(?i)name constraint|permitted"):
        _handshake(tmp_path, chain, leaf_key, pem, "www.bank.example")
    chain, leaf_key = _leaf_signed_by(pem, key, "gw.plant.example")
    _handshake(tmp_path, chain, leaf_key, pem, "gw.plant.example")  # its own names it may still vouch for


def _addresses_ip_reports() -> list[str]:
    """This machine's global and site addresses, as iproute2's `ip -j addr` lists them."""
    listed = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, check=True, text=True).stdout)
    found = []
    for interface in listed:
        for entry in interface.get("addr_info", []):
            address = ipaddress.ip_address(entry["local"])
            if not (address.is_loopback or address.is_link_local):
                found.append(str(address))
    return found


def test_the_generated_certificate_serves_this_machines_addresses(tmp_path: Path) -> None:
    """A browser on the LAN opening https://<the board's address>:8443 refused the certificate,
    trusted or not: it named the host, HOST.local and loopback only."""
    addresses = _addresses_ip_reports()
    assert addresses, "this machine has no address but loopback: the test cannot tell"
    key = ec.generate_private_key(ec.SECP256R1())
    pem = self_signed(key, [])
    names = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    carried = {str(each) for each in names.value.get_values_for_type(x509.IPAddress)}
    assert set(addresses) <= carried, (addresses, carried)
    for address in addresses:
        _handshake(tmp_path, pem, _pem_key(key), pem, address)


def test_a_certificate_generated_at_1970_is_valid_once_ntp_sets_the_clock(
    tmp_path: Path, stepped_clock: SteppedClock
) -> None:
    """A board without a real-time clock nor fake-hwclock starts at 1970 until NTP sets its clock:
    the certificate generated on the secure gates' first start then was valid from 1970 to 1980,
    expired for every client once the clock was set (libfaketime at 1970: notAfter 1979-12-31)."""
    stepped_clock.step("@1970-01-02 00:00:00")
    gateway = launch_gateway("--secure", data_dir=tmp_path / "data", environment=stepped_clock.environment)
    stop_and_check(gateway)
    certificate = x509.load_pem_x509_certificate((tmp_path / "data" / "security" / CERT_FILE).read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    assert certificate.not_valid_before_utc < now - datetime.timedelta(days=365 * 50)  # valid at 1970 too
    assert certificate.not_valid_after_utc > now + datetime.timedelta(days=365 * 9), certificate.not_valid_after_utc
