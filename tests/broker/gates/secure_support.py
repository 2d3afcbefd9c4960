"""A wire-level client of the secure gates for the tests: raw aiohttp over TLS, nothing of ours.

Why not the project's client: these tests check the wire contract (PROTOCOL.md "OAuth 2.0"), so the
requests are written out as any third-party client would send them.
"""

from __future__ import annotations

import base64
import json
import ssl
import sys
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.appliance.config import Config

ADMIN = {"identity": "admin", "read": ["*"], "write": ["*"]}
# `sepa-gateway` of this checkout (the cwd first on sys.path), as the operator runs it
CLI = [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]


def secure_config(*clients: dict[str, Any], data_dir: str = "") -> Config:
    """A config with the secure gates on and `clients` allowed (admin when none given)."""
    config = Config()
    config.security.enabled = True
    config.security.clients = list(clients) or [ADMIN]
    config.store.data_dir = data_dir
    return config


def tls_context(cert: str) -> ssl.SSLContext:
    """Verify the gateway against its own (self-signed) certificate, as a pinned CA."""
    return ssl.create_default_context(cafile=cert)


@dataclass
class Credentials:
    client_id: str
    client_secret: str

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()


class SecureClient:
    """register / token / query / update / subscribe against one gateway's secure gates."""

    def __init__(self, session: aiohttp.ClientSession, https_url: str, wss_url: str, cert: str) -> None:
        self.session = session
        self.https_url = https_url
        self.wss_url = wss_url
        self.ssl = tls_context(cert)

    async def register(self, identity: str) -> tuple[int, dict[str, Any]]:
        body = {"register": {"client_identity": identity, "grant_types": ["client_credentials"]}}
        async with self.session.post(f"{self.https_url}/oauth/register", json=body, ssl=self.ssl) as reply:
            return reply.status, await reply.json()

    async def token_reply(self, authorization: str) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": authorization}
        async with self.session.post(f"{self.https_url}/oauth/token", headers=headers, ssl=self.ssl) as reply:
            return reply.status, await reply.json()

    async def login(self, identity: str) -> str:
        """Register `identity` and return a fresh access token."""
        status, document = await self.register(identity)
        assert status == 201, document
        return await self.token(
            Credentials(document["credentials"]["client_id"], document["credentials"]["client_secret"])
        )

    async def token(self, credentials: Credentials) -> str:
        """A fresh access token for `credentials`."""
        status, document = await self.token_reply(credentials.basic())
        assert status == 201, document
        return str(document["access_token"])

    async def update(self, token: str | None, sparql: str, **params: str) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/sparql-update"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        url = f"{self.https_url}/secure/update"
        async with self.session.post(url, data=sparql, headers=headers, params=params, ssl=self.ssl) as reply:
            return reply.status, await reply.json(content_type=None)

    async def query(self, token: str | None, sparql: str, **params: str) -> tuple[int, dict[str, Any]]:
        headers = {"Accept": "application/sparql-results+json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        url = f"{self.https_url}/secure/query"
        async with self.session.get(url, params={"query": sparql, **params}, headers=headers, ssl=self.ssl) as reply:
            return reply.status, await reply.json(content_type=None)

    async def rows(self, token: str, sparql: str) -> set[tuple[tuple[str, str], ...]]:
        status, document = await self.query(token, sparql)
        assert status == 200, document
        return {tuple(sorted((k, v["value"]) for k, v in b.items())) for b in document["results"]["bindings"]}

    async def socket(self) -> aiohttp.ClientWebSocketResponse:
        return await self.session.ws_connect(f"{self.wss_url}/secure/subscribe", ssl=self.ssl)


async def receive(ws: aiohttp.ClientWebSocketResponse, timeout: float = 10.0) -> dict[str, Any]:
    message = await ws.receive(timeout=timeout)
    assert message.type == aiohttp.WSMsgType.TEXT, message
    return json.loads(message.data)
