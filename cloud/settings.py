"""Settings of the landing endpoint, and the TLS context they ask for.

Why a frozen dataclass: the CLI builds one from its arguments, and the gateway's end-to-end tests
build one directly to run the endpoint in their own process (see :func:`cloud.landing.landing_app`).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from cloud.tokens import TokenError, parse_tokens

DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024
DEFAULT_INFLATE_RATIO = 96
"""How many times its own size a batch may inflate (and at most :data:`DEFAULT_MAX_DECOMPRESSED_BYTES`).

Why per batch and not one limit for all: with 1 GiB for any body, a 4.5 MB gzip body inflating to
1 GiB cost ~34 CPU-seconds of record checking (35 MB/s of records checked), and 8 at once stalled
other gateways' uploads for 200+ s; now the work is at most 96 times the bytes received.
Why 96: the shipper's own 1 MiB segments (gzip level 1, records as the observation layer's batches
make them) inflate 12.5 times (100 sensors, changing values), 16.9 (a door contact, always "false"),
18.0 (one sensor, the same value every time) and 22.5 (the same, with a Homie device's long names),
26.6 for that last one at gzip level 9: 96 is 4.3 times the worst measured at the shipper's level and
3.6 times the worst at any level (``tests/cloud/cloud_support.py`` ``shipper_segment``; the margin is
checked by ``tests/cloud/test_landing_inflate.py``). Observations a SPARQL client writes itself with
numbered IRIs (``http://example.org/observation/1``, ``/2``...) compress further, 45.4 at level 1 and
59.1 at level 9: within 96, by 2.1 and 1.6 times only; a deployment shipping such data may raise
``--inflate-ratio``.
"""
DEFAULT_MAX_DECOMPRESSED_BYTES = 1 << 30  # 1 GiB, any batch: the old 64 MiB x 16, ~30 CPU-seconds of checking
# Why 4: a gateway's shipper has at most 4 uploads in flight ([shipper] uploads_in_flight, 1..4, 2 by
# default: gateway/appliance/config.py MAX_UPLOADS_IN_FLIGHT); this must stay >= that, so a gateway
# with its own token never meets 429. A token's uploads then hold 4 x 64 MiB at most.
DEFAULT_MAX_UPLOADS_PER_TOKEN = 4
DEFAULT_HEAD_TIMEOUT_S = 20.0
# Why 60 s: the shipper gives up on an upload after 30 s (upload_timeout_s), so no gateway sends
# longer; a whole 64 MiB batch would need 9 Mbit/s, a default 1 MiB segment 140 kbit/s.
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_IDLE_TIMEOUT_S = 75.0


class SettingsError(ValueError):
    """A setting that cannot work (the CLI prints it on one line and exits 2)."""


@dataclass(frozen=True)
class LandingSettings:
    """Everything the landing endpoint needs. ``tokens`` are the accepted entries, ``<gateway-slug>:<token>``
    or a bare (unbound) ``<token>`` (:mod:`cloud.tokens`); secrets: ``repr`` shows only their count."""

    landing_dir: Path
    tokens: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = 8443
    cert: Path | None = None
    key: Path | None = None
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    inflate_ratio: int = DEFAULT_INFLATE_RATIO
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    # bodies held at once per token: a token holder's 24 concurrent 64 MiB uploads took the endpoint to 1.78 GB
    max_uploads_per_token: int = DEFAULT_MAX_UPLOADS_PER_TOKEN
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
            f"max_batch_bytes={self.max_batch_bytes}, inflate_ratio={self.inflate_ratio}, "
            f"max_uploads_per_token={self.max_uploads_per_token})"
        )

    def inflate_limit(self, body_bytes: int) -> int:
        """The gzip bomb guard: how far a batch of ``body_bytes`` may inflate (see :data:`DEFAULT_INFLATE_RATIO`)."""
        return min(body_bytes * self.inflate_ratio, self.max_decompressed_bytes)

    def validate(self) -> None:
        """Raise :class:`SettingsError` for settings that cannot work."""
        if not self.tokens:
            raise SettingsError("no accepted tokens")
        if (self.cert is None) != (self.key is None):
            raise SettingsError("--cert and --key go together")
        if self.max_batch_bytes < 1:
            raise SettingsError("--max-batch-bytes must be at least 1")
        if self.inflate_ratio < 1:
            raise SettingsError("--inflate-ratio must be at least 1")
        if self.max_decompressed_bytes < 1:
            raise SettingsError("the decompressed size limit must be at least 1")
        if self.max_uploads_per_token < 1:
            raise SettingsError("--max-uploads-per-token must be at least 1")
        try:
            parse_tokens(self.tokens)
        except TokenError as error:
            raise SettingsError(str(error)) from None
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
