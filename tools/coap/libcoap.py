"""libcoap's command-line client, the real thing a CoAP user types, and its example server, a real
CoAP peer with block-wise observable resources (Debian package libcoap3-bin).

Debian's libcoap3-bin installs `coap-client-notls`, `-gnutls` and `-openssl` without a plain
`coap-client`; tests/run.sh links `coap-client` to the notls one, and this finds either.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

MISSING = "libcoap's coap-client is not installed (Debian: apt-get install libcoap3-bin; tests/run.sh does it)"


def coap_client() -> str | None:
    """The path of coap-client, or None."""
    return shutil.which("coap-client") or shutil.which("coap-client-notls")


def coap_server() -> str | None:
    """The path of libcoap's coap-server (its `/example_data` takes PUT and is observable), or None."""
    return shutil.which("coap-server") or shutil.which("coap-server-notls")


def text(payload: str) -> str:
    """`payload` as `-e` takes it: coap-client percent-decodes that argument, so `%` must be `%25`."""
    return payload.replace("%", "%25")


def succeeded(done: subprocess.CompletedProcess[str]) -> bool:
    """Whether the response was a success: coap-client exits 0 on 4.xx and 5.xx too, printing the code."""
    output = (done.stdout + done.stderr).lstrip()
    return done.returncode == 0 and output[:2] not in ("4.", "5.")


def run(args: Sequence[str], timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    """`coap-client ARGS`, its output captured (the response payload, and "4.04 ..." on errors)."""
    tool = coap_client()
    if tool is None:
        raise FileNotFoundError(MISSING)
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=timeout)
