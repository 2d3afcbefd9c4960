"""The secure variant of the wire benchmark: one registered client, its token, and TLS verified
against the gateway's own certificate (no verification is turned off).

The harness registers :data:`~tools.wire.processes.BENCH_IDENTITY` and gets one token (long-lived:
the default hour covers any run); the publisher and subscriber processes get the token through a
0600 file and the certificate file as their CA, and send ``Authorization: Bearer`` on every update
and in every subscribe, as any SEPA client of the secure gates does.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.request
from pathlib import Path

from tools.wire.processes import BENCH_IDENTITY, BenchError, GatewayProcess


def tls_context(cafile: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile)


def read_token(path: str) -> str:
    return Path(path).read_text(encoding="utf-8").strip()


def login(gateway: GatewayProcess, workdir: Path) -> tuple[Path, Path]:
    """(token file, CA file) of a freshly registered benchmark client."""
    assert gateway.security_dir is not None
    cafile = gateway.security_dir / "tls-cert.pem"
    context = tls_context(str(cafile))
    body = json.dumps({"register": {"client_identity": BENCH_IDENTITY, "grant_types": ["client_credentials"]}})
    credentials = _post(
        f"{gateway.https_base}/oauth/register", body.encode(), {"Content-Type": "application/json"}, context
    )
    pair = f"{credentials['credentials']['client_id']}:{credentials['credentials']['client_secret']}"
    basic = "Basic " + base64.b64encode(pair.encode()).decode()
    token = _post(f"{gateway.https_base}/oauth/token", b"", {"Authorization": basic}, context)["access_token"]
    token_file = workdir / "bench-token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token)
    return token_file, cafile


def _post(url: str, body: bytes, headers: dict[str, str], context: ssl.SSLContext) -> dict:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as reply:
            return json.loads(reply.read())
    except OSError as error:
        raise BenchError(f"cannot log in to the secure gates at {url}: {error}") from error
