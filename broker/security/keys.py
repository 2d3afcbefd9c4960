"""The secure gates' key material: the token signing key and the TLS certificate.

Both are generated on first start into the security directory when the operator gives none, and
kept there with owner-only permissions (0600 files in a 0700 directory), so a restart keeps every
issued token and every pinned certificate valid. Everything cryptographic goes through the
maintained ``cryptography`` package (which pyjwt's ES256 uses too): nothing is written by hand.

Why ES256 (ECDSA P-256) for tokens: asymmetric, so the public half can be handed to clients (the
registration reply's ``signature`` JWK) without letting them mint tokens; small and fast on a
Raspberry Pi (pyjwt 2.15 on the 2-core development machine: 93 us to sign, 229 us to verify)
next to RSA-2048 (1,042 us to sign).

Rotation: stop the gateway, delete ``token-signing-key.pem`` (or the certificate pair), start it.
A new key is generated; tokens signed by the old one get 401 and clients fetch new ones with their
unchanged credentials. See the README, "Security".
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from broker.security.owned_files import write_file

SIGNING_KEY_FILE = "token-signing-key.pem"
CERT_FILE = "tls-cert.pem"
CERT_KEY_FILE = "tls-key.pem"
CERT_VALID_DAYS = 3650  # an appliance's self-signed certificate is pinned by fingerprint, not renewed
T = TypeVar("T")


def private_directory(path: Path) -> Path:
    """Create `path` (0700) if needed; refuse a directory others can read or write."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        os.chmod(path, 0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to a new 0600 file atomically (a reader never sees half a key), not through a
    symlink at its name (owned_files.write_file)."""
    write_file(path, data, 0o600)


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _loaded(path: Path, load: Callable[[bytes], T], what: str) -> T:
    """`load` of the file at `path`; ValueError naming the file if it is not `what`. Why: a damaged
    key or certificate stopped the start with cryptography's words alone ('Unable to load PEM
    file ... MalformedFraming'), naming none of the three files it could be."""
    data = path.read_bytes()
    try:
        return load(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as error:
        reason = " ".join(str(error).split("See https://")[0].split())[:120]
        raise ValueError(f"{path} is not {what} ({reason}): restore it, or remove it to have a new one made") from None


def _private_key(data: bytes) -> object:
    return serialization.load_pem_private_key(data, password=None)


def signing_key(directory: Path) -> ec.EllipticCurvePrivateKey:
    """The token signing key kept in `directory`, generated on first use."""
    path = directory / SIGNING_KEY_FILE
    if path.exists():
        key = _loaded(path, _private_key, "a PEM private key")
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{path} is not an EC private key")
        return key
    private_directory(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    write_private(path, _pem(key))
    return key


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    fingerprint: str  # SHA-256 of the certificate (DER), colon-separated hex, as browsers show it
    generated: bool


def fingerprint(cert_pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def _kept(cert: Path, key: Path) -> TlsFiles:
    """A certificate pair on disk, each file read (ValueError naming the one that does not load)."""
    _loaded(key, _private_key, "a PEM private key")
    return TlsFiles(cert, key, _loaded(cert, fingerprint, "a PEM certificate"), generated=False)


def tls_files(directory: Path, cert: str = "", key: str = "", names: list[str] | None = None) -> TlsFiles:
    """The certificate and key of the secure gates: the operator's, or a self-signed pair in `directory`."""
    if cert or key:
        if not (cert and key):
            raise ValueError("security.tls_cert and security.tls_key go together")
        return _kept(Path(cert), Path(key))
    cert_path, key_path = directory / CERT_FILE, directory / CERT_KEY_FILE
    if cert_path.exists() and key_path.exists():
        return _kept(cert_path, key_path)
    private_directory(directory)
    private_key = ec.generate_private_key(ec.SECP256R1())
    pem = self_signed(private_key, names or [])
    write_private(key_path, _pem(private_key))
    write_private(cert_path, pem)
    return TlsFiles(cert_path, key_path, fingerprint(pem), generated=True)


SIOCGIFADDR = 0x8915  # Linux: an interface's (primary) IPv4 address


def interface_addresses() -> list[str]:
    """This host's addresses on its network interfaces, loopback and link-local left out: IPv4
    from each interface (SIOCGIFADDR), IPv6 from /proc/net/if_inet6. Linux only; elsewhere none.

    Why: a browser on the LAN opening the dashboard at https://192.168.1.20:8443 refused the
    generated certificate even once trusted, which named only the host, HOST.local and loopback."""
    found: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, interface in socket.if_nameindex():
            try:
                request = struct.pack("256s", interface.encode()[:15])
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address
                continue
            found.append(str(ipaddress.IPv4Address(answer[20:24])))
    try:
        lines = Path("/proc/net/if_inet6").read_text(encoding="ascii").splitlines()
    except OSError:
        lines = []
    found += [str(ipaddress.IPv6Address(bytes.fromhex(line.split()[0]))) for line in lines if line.strip()]
    usable = [ipaddress.ip_address(each) for each in found]
    return [str(each) for each in usable if not (each.is_loopback or each.is_link_local or each.is_unspecified)]


def validity_bounds() -> tuple[datetime.datetime, datetime.datetime]:
    """The earlier and the later of the wall clock and this code's installation (its file's time).

    Why: a board without a real-time clock (and without fake-hwclock) starts at 1970 until NTP sets
    its clock; a certificate generated then was valid from 1970 to 1980, expired for every client
    once the clock was set (under libfaketime at 1970: notAfter 1979-12-31). Counted from the later
    of the two, it is valid for CERT_VALID_DAYS from the installation at least; from the earlier,
    a clock ahead of the true time does not make it valid only from then."""
    now = datetime.datetime.now(datetime.UTC)
    installed = datetime.datetime.fromtimestamp(Path(__file__).stat().st_mtime, datetime.UTC)
    return min(now, installed), max(now, installed)


def self_signed(private_key: ec.EllipticCurvePrivateKey, names: list[str]) -> bytes:
    """A self-signed server certificate for this host's names, its interfaces' addresses (as the
    gateway first starts: an address that changes later needs `tls_names`, or a new certificate)
    and loopback, plus `names`."""
    host = socket.gethostname()
    alternatives: list[x509.GeneralName] = []
    seen: set[str] = set()
    for name in [host, f"{host}.local", "localhost", "127.0.0.1", "::1", *interface_addresses(), *names]:
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    # Why name constraints: clients trust this file as a CA (it is its own issuer), and with only
    # CA:TRUE its key could sign a certificate for any site those clients would then accept (an
    # attack pass signed www.bank.example and `openssl verify` said OK). It may now vouch only for
    # the names it carries.
    permitted: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_network(name.value)) if isinstance(name, x509.IPAddress) else name
        for name in alternatives
    ]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sepa-gateway {host}"[:64])])
    earliest, latest = validity_bounds()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(private_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(earliest - datetime.timedelta(minutes=5))
        .not_valid_after(latest + datetime.timedelta(days=CERT_VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(private_key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)
