"""What the CoAP tests share: the observations a gateway stored, an address LAN peers reach, OSCORE sensors."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import aiocoap
from aiocoap import Code

from tools.launcher import RunningGateway

OBSERVATIONS = """PREFIX sosa: <http://www.w3.org/ns/sosa/>
PREFIX qudt: <http://qudt.org/schema/qudt/>
SELECT ?sensor ?value ?unit WHERE { GRAPH <http://w3id.org/sepa-gateway/graph/observations> {
  ?o sosa:madeBySensor ?sensor ; sosa:hasResult ?r . ?r qudt:numericValue ?value .
  OPTIONAL { ?r qudt:unit ?unit } } }"""
SENSOR = "urn:sepa-gateway:sensor:coap/"
DEG_C = "http://qudt.org/vocab/unit/DEG_C"


def observations(gateway: RunningGateway) -> list[tuple[str, float, str]]:
    return sorted((row["sensor"], float(row["value"]), row.get("unit", "")) for row in gateway.select(OBSERVATIONS))


def host_address() -> str:
    """An address of this machine that is not loopback (where a LAN peer reaches it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        address = probe.getsockname()[0]
    assert not address.startswith("127."), "this machine has no network address to test from"
    return address


CLI = [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]


def add_sensor(directory: Path, name: str) -> dict[str, str]:
    done = subprocess.run(
        [*CLI, "sensors", "--coap", "--coap-dir", str(directory), "add", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    return json.loads(text[text.index("{") : text.index("}") + 1])


async def post(uri: str, payload: bytes, context_dir: Path | None) -> aiocoap.Message:
    context = await aiocoap.Context.create_client_context()
    try:
        if context_dir is not None:
            context.client_credentials.load_from_dict(
                {uri.rsplit("/s/", 1)[0] + "/*": {"oscore": {"basedir": str(context_dir) + "/"}}}
            )
        return await asyncio.wait_for(
            context.request(aiocoap.Message(code=Code.POST, uri=uri, payload=payload)).response, 30
        )
    finally:
        await context.shutdown()


def sensor_side(tmp_path: Path, name: str, settings: dict[str, str]) -> Path:
    folder = tmp_path / "sensor-side" / name
    folder.mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps(settings))
    return folder
