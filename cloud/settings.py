"""Settings of the landing endpoint, and the TLS context they ask for.

Why a frozen dataclass: the CLI builds one from its arguments, and the gateway's end-to-end tests
build one directly to run the endpoint in their own process (see :func:`cloud.landing.landing_app`).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024
DEFAULT_INFLATE_RATIO = 16
DEFAULT_HEAD_TIMEOUT_S = 20.0
# Why 60 s: the shipper gives up on an upload after 30 s (upload_timeout_s), so no gateway sends
# longer; a whole 64 MiB batch would need 9 Mbit/s, a default 1 MiB segment 140 kbit/s.
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_IDLE_TIMEOUT_S = 75.0


class SettingsError(ValueError):
    """A setting that cannot work (the CLI prints it on one line and exits 2)."""


@dataclass(frozen=True)
class LandingSettings:
    """Everything the landing endpoint needs. ``tokens`` are secrets: ``repr`` shows only their count."""

    landing_dir: Path
    tokens: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = 8443
    cert: Path | None = None
    key: Path | None = None
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    inflate_ratio: int = DEFAULT_INFLATE_RATIO
    # cloud.guards: connections open at once (0: half the open-file limit), and how long a request's
    # head, its body and an idle kept-alive connection may take
    max_connections: int = 0
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    def __repr__(self) -> str:
        return (
            f"LandingSettings(landing_dir={str(self.landing_dir)!r}, tokens=<{len(self.tokens)}>, "
            f"host={self.host!r}, port={self.port}, tls={self.cert is not None}, "
            f"max_batch_bytes={self.max_batch_bytes})"
        )

    @property
    def max_decompressed_bytes(self) -> int:
        """The gzip bomb guard: how far a batch may inflate."""
        return self.max_batch_bytes * self.inflate_ratio

    def validate(self) -> None:
        """Raise :class:`SettingsError` for settings that cannot work."""
        if not self.tokens:
            raise SettingsError("no accepted tokens")
        if (self.cert is None) != (self.key is None):
            raise SettingsError("--cert and --key go together")
        if self.max_batch_bytes < 1:
            raise SettingsError("--max-batch-bytes must be at least 1")
        if self.inflate_ratio < 1:
            raise SettingsError("the inflate ratio must be at least 1")
        if self.max_connections < 0:
            raise SettingsError("--max-connections must be 0 (half the open-file limit) or more")
        for name, value in (("head", self.head_timeout_s), ("body", self.body_timeout_s)):
            if not value > 0:
                raise SettingsError(f"--{name}-timeout must be more than 0 seconds")
        if not self.idle_timeout_s > 0:
            raise SettingsError("the idle timeout must be more than 0 seconds")
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"--port {self.port} is not a TCP port")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server TLS context (TLS 1.2 or later, stdlib defaults otherwise), or None for plain HTTP."""
        if self.cert is None or self.key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as error:
            raise SettingsError(f"cannot load the TLS certificate {self.cert} / key {self.key}: {error}") from error
        return context
