"""The project's own client over the secure gates: the Python API, a JSAP with `oauth`, and the CLI.

Registration happens once per identity and the credentials are kept (a second registration would
be refused, so reusing them is checked by the second program run succeeding); tokens are renewed
before they expire; a reconnected socket resubscribes with a token; TLS is verified against the
gateway's certificate file or its pinned fingerprint, and a wrong one is refused.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gateway.client import SepaClient, client_for
from gateway.client.errors import SepaClientError
from gateway.client.network import NetworkTransport
from gateway.client.oauth import OAuthSession, tls
from gateway.jsap import Jsap
from tests.broker.gates.secure_support import secure_config
from tools.launcher import InProcessGateway, launch_gateway

EX = "http://example.org/secure-client/"
CLI = [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]
APP = {"identity": "app", "read": ["*"], "write": ["*"]}


def transport(gateway: InProcessGateway, credentials: Path, **options: Any) -> NetworkTransport:
    oauth = OAuthSession(
        f"{gateway.https_url}/oauth/register", f"{gateway.https_url}/oauth/token", "app", credentials_file=credentials
    )
    cert = str(gateway.gateway.secure.tls.cert)  # type: ignore[union-attr]
    return NetworkTransport(
        f"{gateway.https_url}/secure/query",
        f"{gateway.https_url}/secure/update",
        f"{gateway.wss_url}/secure/subscribe",
        oauth=oauth,
        ssl=tls(cafile=cert),
        **options,
    )


def test_register_once_keep_credentials_renew_tokens(in_process_gateway, tmp_path: Path) -> None:
    config = secure_config(APP)
    config.security.token_lifetime_s = 10  # renewed at 80 %: after 8 s
    gateway = in_process_gateway(config)
    credentials = tmp_path / "credentials.json"

    async def main() -> None:
        first = transport(gateway, credentials)
        async with SepaClient(first) as client:
            assert (await client.update(f"INSERT DATA {{ <{EX}a> <{EX}p> 1 }}")).added == 1
        assert credentials.stat().st_mode & 0o777 == 0o600
        second = transport(gateway, credentials)  # another run of the program: no new registration
        async with SepaClient(second) as client:
            assert len((await client.query(f"SELECT * WHERE {{ <{EX}a> ?p ?o }}")).rows) == 1
            await asyncio.sleep(8.5)
            assert len((await client.query(f"SELECT * WHERE {{ <{EX}a> ?p ?o }}")).rows) == 1
        assert second.oauth is not None and second.oauth.tokens_fetched == 2

    asyncio.run(main())


def test_a_reconnected_socket_resubscribes_with_a_token(in_process_gateway, tmp_path: Path) -> None:
    gateway = in_process_gateway(secure_config(APP))

    async def main() -> None:
        async with SepaClient(transport(gateway, tmp_path / "c.json")) as client:
            subscription = await client.subscribe(f"SELECT ?o WHERE {{ <{EX}lamp> <{EX}level> ?o }}")
            gateway.call(gateway.gateway.gates.close_connections())  # the gateway drops every socket
            deadline = time.monotonic() + 10
            while gateway.gateway.engine.subscription_count == 0 or client.transport.stats.connects < 2:  # type: ignore[attr-defined]
                assert time.monotonic() < deadline, "no resubscription"
                await asyncio.sleep(0.05)
            await client.update(f"INSERT DATA {{ <{EX}lamp> <{EX}level> 40 }}")
            while len(subscription.view.rows) != 1:
                assert time.monotonic() < deadline, "no notification after the reconnection"
                await asyncio.sleep(0.05)

    asyncio.run(main())


def test_a_jsap_with_oauth_drives_the_same_flow(in_process_gateway, tmp_path: Path) -> None:
    gateway = in_process_gateway(secure_config(APP))
    https, wss = urlsplit(gateway.https_url).port, urlsplit(gateway.wss_url).port
    jsap = Jsap.from_dict(
        {
            "host": "127.0.0.1",
            "oauth": {
                "enable": True,
                "register": f"https://127.0.0.1:{https}/oauth/register",
                "tokenRequest": f"https://127.0.0.1:{https}/oauth/token",
            },
            "sparql11protocol": {
                "protocol": "https",
                "port": https,
                "query": {"path": "/secure/query", "method": "POST", "format": "JSON"},
                "update": {"path": "/secure/update", "method": "POST", "format": "JSON"},
            },
            "sparql11seprotocol": {
                "protocol": "wss",
                "availableProtocols": {"wss": {"port": wss, "path": "/secure/subscribe"}},
            },
            "updates": {"ON": {"sparql": f"INSERT DATA {{ <{EX}lamp> <{EX}on> true }}"}},
        }
    )
    cert = str(gateway.gateway.secure.tls.cert)  # type: ignore[union-attr]

    async def main() -> None:
        client = client_for(jsap, identity="app", credentials_file=str(tmp_path / "c.json"), ssl=tls(cafile=cert))
        async with client:
            assert (await client.update(f"INSERT DATA {{ <{EX}lamp> <{EX}on> true }}")).added == 1
        unauthenticated = client_for(jsap, ssl=tls(cafile=cert))  # no identity: no token
        async with unauthenticated:
            with pytest.raises(SepaClientError) as refused:
                await unauthenticated.query("ASK {}")
            assert refused.value.status_code == 401

    asyncio.run(main())


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def test_the_cli_against_a_secure_service(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[security]\nclients = [{identity = "app", read = ["*"], write = ["*"]}]\n')
    gateway = launch_gateway("--secure", "--no-mqtt", config=config, data_dir=tmp_path / "data")
    try:
        cert = tmp_path / "data" / "security" / "tls-cert.pem"
        secure = ["--url", gateway.https_url, "--ws-url", f"{gateway.wss_url}/secure/subscribe"]
        login = ["--identity", "app", "--credentials", str(tmp_path / "app.json")]
        done = cli("update", *secure, *login, "--cafile", str(cert), f"INSERT DATA {{ <{EX}cli> <{EX}p> 1 }}")
        assert done.returncode == 0, done.stderr
        from broker.api import fingerprint

        pin = fingerprint(cert.read_bytes())
        done = cli("query", *secure, *login, "--fingerprint", pin, "--json", f"SELECT ?o WHERE {{ <{EX}cli> ?p ?o }}")
        assert done.returncode == 0, done.stderr
        assert [row["o"]["value"] for row in json.loads(done.stdout)["results"]["bindings"]] == ["1"]
        done = cli("subscribe", *secure, *login, "--cafile", str(cert), "--count", "1", "--json", "ASK { ?s ?p ?o }")
        assert done.returncode == 0 and json.loads(done.stdout)["notification"]["sequence"] == 0, done.stderr
        missing = cli("query", *secure, "--cafile", str(cert), "ASK {}")
        assert missing.returncode == 1 and "--identity" in missing.stderr
        wrong_pin = cli("query", *secure, *login, "--fingerprint", "00" * 32, "ASK {}")
        assert wrong_pin.returncode == 1 and "Traceback" not in wrong_pin.stderr
        untrusted = cli("query", *secure, *login, "ASK {}")  # the system trust store knows no self-signed pair
        assert untrusted.returncode == 1 and "Traceback" not in untrusted.stderr
    finally:
        assert gateway.stop() == 0
