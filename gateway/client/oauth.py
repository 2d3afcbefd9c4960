"""OAuth 2.0 client credentials for the network transport (PROTOCOL.md "OAuth 2.0 ... and JWT").

An :class:`OAuthSession` registers its identity once, keeps the credentials in a file (0600) so that
the next run of the program does not register again (a gateway allows one registration per
identity), gets a token, and renews it before it expires (at :data:`RENEW_AT` of its lifetime) or
when the broker answers 401. The transport asks it for the ``Authorization`` value of every HTTP
request and of every subscribe and unsubscribe, so a reconnected socket resubscribes with a
fresh token.

TLS: :func:`tls` turns the user's choice into what aiohttp takes: a CA file (the gateway's own
self-signed certificate works as one), a pinned SHA-256 fingerprint (the one the gateway logs at
start), or the system trust store. Verification is never turned off.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gateway.client.errors import SepaClientError, SepaConnectionError

RENEW_AT = 0.8  # of a token's lifetime: renewed before it expires, so a request never carries a dead one


def default_credentials_file(register_url: str, identity: str) -> Path:
    """Where credentials are kept by default: one file per gateway and identity, in the user's config."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "sepa-gateway" / "credentials"
    host = aiohttp.helpers.URL(register_url)
    return base / f"{host.host}-{host.port}-{identity}.json"


def tls(cafile: str | None = None, fingerprint: str | None = None) -> ssl.SSLContext | aiohttp.Fingerprint | None:
    """aiohttp's `ssl` argument for a CA file or a pinned SHA-256 certificate fingerprint (hex, colons
    allowed); None: the system trust store."""
    if fingerprint:
        digest = bytes.fromhex(fingerprint.replace(":", "").strip())
        return aiohttp.Fingerprint(digest)
    if cafile:
        return ssl.create_default_context(cafile=cafile)
    return None


@dataclass(frozen=True)
class Credentials:
    client_id: str
    client_secret: str

    @classmethod
    def load(cls, path: Path) -> Credentials | None:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            return cls(str(document["client_id"]), str(document["client_secret"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise SepaClientError(
                "invalid_credentials", f"cannot read the credentials in {path}: {error}", 400
            ) from error

    def save(self, path: Path) -> None:
        """Written into a new file of this user's, 0600, then renamed into place. Why a fresh name
        (mkstemp: O_EXCL, 0600): PATH.tmp opened with O_CREAT|O_TRUNC reused one left there, or planted
        by another user in a shared directory, keeping its owner and mode: the secret ended up 0666,
        owned by that user."""
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump({"client_id": self.client_id, "client_secret": self.client_secret}, out)
            os.replace(name, path)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode("ascii")


class OAuthSession:
    """One client identity's registration and tokens at one gateway."""

    def __init__(
        self,
        register_url: str,
        token_url: str,
        identity: str,
        *,
        credentials_file: str | Path | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.register_url = register_url
        self.token_url = token_url
        self.identity = identity
        self.credentials_file = (
            Path(credentials_file) if credentials_file else default_credentials_file(register_url, identity)
        )
        self.credentials = credentials
        self.tokens_fetched = 0
        self._token: str | None = None
        self._renew_at = 0.0
        self._lock: asyncio.Lock | None = None

    async def authorization(self, http: aiohttp.ClientSession, ssl_option: Any) -> str:
        """``Bearer <token>``, registering and fetching a token first when needed."""
        if self._token is None or time.monotonic() >= self._renew_at:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self._token is None or time.monotonic() >= self._renew_at:
                    await self._fetch(http, ssl_option)
        return f"Bearer {self._token}"

    def invalidate(self) -> None:
        """The broker refused the token (401): the next request fetches a new one."""
        self._token = None

    async def _fetch(self, http: aiohttp.ClientSession, ssl_option: Any) -> None:
        credentials = self.credentials or Credentials.load(self.credentials_file)
        if credentials is None:
            credentials = await self._register(http, ssl_option)
            credentials.save(self.credentials_file)
        self.credentials = credentials
        status, document = await _post(http, self.token_url, None, {"Authorization": credentials.basic()}, ssl_option)
        if status != 201 or not isinstance(document.get("access_token"), str):
            raise SepaClientError.from_json(document, status_code=status, fallback=f"token request refused ({status})")
        lifetime = document.get("expires_in")
        lifetime = lifetime if isinstance(lifetime, int | float) and lifetime > 0 else 60
        self._token = document["access_token"]
        self._renew_at = time.monotonic() + RENEW_AT * lifetime
        self.tokens_fetched += 1

    async def _register(self, http: aiohttp.ClientSession, ssl_option: Any) -> Credentials:
        body = {"register": {"client_identity": self.identity, "grant_types": ["client_credentials"]}}
        status, document = await _post(http, self.register_url, body, {}, ssl_option)
        credentials = document.get("credentials")
        if status != 201 or not isinstance(credentials, dict):
            raise SepaClientError.from_json(document, status_code=status, fallback=f"registration refused ({status})")
        return Credentials(str(credentials["client_id"]), str(credentials["client_secret"]))


async def _post(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str], ssl_option: Any
) -> tuple[int, dict[str, Any]]:
    try:
        async with http.post(
            url,
            json=body,
            headers={"Accept": "application/json", **headers},
            ssl=ssl_option if ssl_option is not None else True,
            timeout=aiohttp.ClientTimeout(total=30),
        ) as reply:
            text = await reply.text()
            status = reply.status
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        raise SepaConnectionError("connection_failed", f"cannot reach {url}: {error}") from error
    try:
        document = json.loads(text)
    except ValueError:
        document = {}
    return status, document if isinstance(document, dict) else {}
