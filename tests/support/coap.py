"""What the CoAP tests share: the observations a gateway stored, and an address LAN peers reach."""

from __future__ import annotations

import socket

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
