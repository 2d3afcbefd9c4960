"""Fixtures of the client tests: one API, two transports.

What it protects: every test that takes `connect` runs twice, once over the in-process transport
(a fresh Engine behind a Scheduler) and once over the network transport against a real
`sepa-gateway run` subprocess, so the two transports are held to identical behaviour. `connect()`
returns a new :class:`SepaClient` each call (several clients of one broker in one test); the
network gateway is shared by a module and emptied before each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.api import Engine, Scheduler
from gateway.client import InProcessTransport, NetworkTransport, ReconnectPolicy, SepaClient
from tests.gateway.client.client_support import Connect, GatewayProcess


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    """An in-memory gateway shared by the tests of one module, as a restartable handle (the
    network transport's tests kill it under connected clients)."""
    process = GatewayProcess().start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(params=["inprocess", "network"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def connect(transport_kind: str, request: pytest.FixtureRequest) -> Iterator[Connect]:
    """A factory of clients of one broker, over the transport of this parametrization."""
    if transport_kind == "inprocess":
        scheduler = Scheduler(Engine())
        yield lambda: SepaClient(InProcessTransport(scheduler))
        scheduler.close()
        return
    gateway: GatewayProcess = request.getfixturevalue("gateway")
    gateway.post_update("DROP ALL")
    policy = ReconnectPolicy(initial_delay_s=0.05, max_delay_s=0.5)
    yield lambda: SepaClient(NetworkTransport(*gateway.urls, reconnect=policy))
