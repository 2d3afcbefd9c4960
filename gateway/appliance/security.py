"""The `[security]` section turned into the secure gates' parts: directory, keys, TLS context, authority.

Why here: the broker knows tokens and rights but not where an appliance keeps its files; the
appliance decides (``security.dir``, else ``<store.data_dir>/security``, else a temporary directory
that lives as long as the process: a development run without a data directory).
"""

from __future__ import annotations

import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from broker.api import Authority, TlsFiles, private_directory, tls_files
from gateway.appliance.config import Config


@dataclass
class SecureParts:
    authority: Authority
    ssl_context: ssl.SSLContext
    tls: TlsFiles
    directory: Path
    temporary: tempfile.TemporaryDirectory[str] | None


def security_directory(config: Config) -> tuple[Path, tempfile.TemporaryDirectory[str] | None]:
    """Where the keys, certificate and client registry live (created 0700)."""
    if config.security.dir:
        return private_directory(Path(config.security.dir)), None
    if config.store.data_dir:
        return private_directory(Path(config.store.data_dir) / "security"), None
    temporary = tempfile.TemporaryDirectory(prefix="sepa-gateway-security-")
    return private_directory(Path(temporary.name)), temporary


def server_context(tls: TlsFiles) -> ssl.SSLContext:
    """The ssl module's server defaults (TLS 1.2 at least, its cipher choice), with our pair loaded."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(tls.cert), str(tls.key))
    except ssl.SSLError as error:  # each loads alone (keys.tls_files): they do not go together
        raise ValueError(f"{tls.cert} and {tls.key} are not a pair ({error.reason or error})") from None
    return context


def secure_parts(config: Config, gateway_id: str) -> SecureParts:
    security = config.security
    directory, temporary = security_directory(config)
    tls = tls_files(directory, security.tls_cert, security.tls_key, list(security.tls_names))
    authority = Authority(
        directory,
        issuer=security.issuer or f"sepa-gateway:{gateway_id}",
        lifetime_s=security.token_lifetime_s,
        configured=list(security.clients),
        failure_burst=security.auth_failure_burst,
        failures_per_s=security.auth_failures_per_s,
    )
    return SecureParts(authority, server_context(tls), tls, directory, temporary)
