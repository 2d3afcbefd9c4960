"""Fixtures of the subscribe tests: real `sepa-gateway run` processes on free ports.

What it protects: every test here runs against the installed gateway over real sockets, never an
in-process app, so what passes is what a deployed SEPA client would see. `gateway` is one process
per test module with the embedded defaults; `start_gateway` starts extra ones with a TOML config
(small limits, short heartbeat) and stops them after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from subscribe_support import GatewayProcess, running_gateway


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway with the default configuration, shared by the tests of one module."""
    with running_gateway(tmp_path_factory.mktemp("gateway")) as process:
        yield process


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Callable[[str | None], GatewayProcess]]:
    """Start gateways with a given TOML configuration text; all are stopped after the test."""
    with ExitStack() as stack:
        count = 0

        def start(config: str | None = None) -> GatewayProcess:
            nonlocal count
            count += 1
            return stack.enter_context(running_gateway(tmp_path / f"gateway-{count}", config))

        yield start
