"""The fixtures every test folder shares: gateways started by tools/launcher.py, the one launcher of
the tests and the tools (a `sepa-gateway run` subprocess, or a Gateway on a thread's loop).

Every one listens on 127.0.0.1, on ports the OS picks unless a test fixes them, and is reached over
real sockets. A subprocess gateway still running at teardown gets SIGTERM and must exit with 0.
The observation layer's `mapper` and `read` fixtures come from tests/support/readings.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.api import Engine, Scheduler
from gateway.appliance.config import Config
from gateway.client import InProcessTransport, NetworkTransport, ReconnectPolicy, SepaClient
from tests.gateway.client.client_support import Connect, GatewayProcess
from tools.launcher import (
    STOP_TIMEOUT_S,
    InProcessGateway,
    RunningGateway,
    gateway_argv,
    launch_gateway,
    start_in_process,
)

# tests.support.leftovers (the guard against processes left running) is not loaded yet: its first
# full run's alarms are dealt with (2026-12-07: the leak of a gateway refused at start, fixed in
# gateway.appliance.app; the resource tracker, started by the guard before the first test), but
# loaded, a run of the whole tests/tools failed test_wire_bench.py::test_interrupted_run_stops_its_processes
# twice (the bench outlived its SIGINT by 30 s; it passes alone, and in tests/tools without the guard)
pytest_plugins = ("tests.support.readings", "tests.support.artifacts", "tests.support.clock")

# Every subprocess a test starts (`sepa-gateway run`, a CLI command) imports this checkout's code,
# not the checkout the virtualenv's editable install points at: run from a git worktree, the tests
# started main's gateway, and a "fails without the fix" check there proved nothing.
ROOT = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def stop_and_check(gateway: RunningGateway) -> None:
    """SIGTERM, and the gateway must exit 0 (a clean shutdown)."""
    if gateway.running:
        code = gateway.stop(signal.SIGTERM)
        assert code == 0, f"gateway exited {code} on SIGTERM: {gateway.stderr_lines}"


@pytest.fixture(scope="session")
def gateway_command() -> list[str]:
    """argv of the `sepa-gateway` command (add "run" and its options)."""
    return gateway_argv()


@pytest.fixture(scope="module")
def gateway() -> Iterator[RunningGateway]:
    """A `sepa-gateway run` subprocess on an in-memory store, shared by the tests of one module."""
    running = launch_gateway()
    yield running
    stop_and_check(running)


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Callable[..., RunningGateway]]:
    """Factory: start `sepa-gateway run` with extra options, a config file or a config text (`toml`);
    every one still running at teardown gets SIGTERM and must exit 0 (each is stopped, also after
    another's non-zero exit)."""
    started: list[RunningGateway] = []
    stack = contextlib.ExitStack()

    def start(
        *args: str,
        config: Path | None = None,
        toml: str | None = None,
        data_dir: Path | None = None,
        http_port: int = 0,
        ws_port: int = 0,
        coap: bool = False,
    ) -> RunningGateway:
        if toml is not None:
            config = tmp_path / f"gateway-{len(started)}.toml"
            config.write_text(toml, encoding="utf-8")
        mqtt = False if toml is not None else None  # a config file of a test may turn MQTT on
        running = launch_gateway(
            *args, config=config, data_dir=data_dir, http_port=http_port, ws_port=ws_port, mqtt=mqtt, coap=coap
        )
        started.append(stack.enter_context(running))
        return running

    with stack:
        yield start


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """Factory: gateways of one test that keep their ports and data across kill and start (the
    client tests' GatewayProcess over tools.launcher); all are stopped afterwards."""
    made: list[GatewayProcess] = []

    def make(*, on_disk: bool = True, ports: tuple[int, int] | None = None) -> GatewayProcess:
        process = GatewayProcess(data_dir=(tmp_path / "data") if on_disk else None, ports=ports)
        made.append(process)
        return process

    yield make
    for process in made:
        with contextlib.suppress(Exception):
            process.stop()


@pytest.fixture(params=["inprocess", "network"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def connect(transport_kind: str, request: pytest.FixtureRequest) -> Iterator[Connect]:
    """A factory of clients of one broker, over the transport of this parametrization: every test
    that takes it runs twice, in process (a fresh Engine behind a Scheduler) and over the network
    against the module's `sepa-gateway run` (emptied first), so the two transports are held to
    identical behaviour. Each call returns a new SepaClient (several clients of one broker)."""
    if transport_kind == "inprocess":
        scheduler = Scheduler(Engine())
        yield lambda: SepaClient(InProcessTransport(scheduler))
        scheduler.close()
        return
    gateway: RunningGateway = request.getfixturevalue("gateway")
    gateway.post_update("DROP ALL")
    policy = ReconnectPolicy(initial_delay_s=0.05, max_delay_s=0.5)
    yield lambda: SepaClient(NetworkTransport(*gateway.endpoints, reconnect=policy))


@pytest.fixture
def in_process_gateway() -> Iterator[Callable[[Config], InProcessGateway]]:
    """Factory: a Gateway for `config` (host and ports forced to 127.0.0.1:0) on a thread's loop."""
    running: list[tuple[InProcessGateway, threading.Thread]] = []

    def start(config: Config | None = None) -> InProcessGateway:
        running.append(start_in_process(config or Config()))
        return running[-1][0]

    yield start
    for endpoint, thread in running:
        endpoint.call(endpoint.gateway.stop(), timeout=STOP_TIMEOUT_S)
        endpoint.loop.call_soon_threadsafe(endpoint.loop.stop)
        thread.join(STOP_TIMEOUT_S)
        endpoint.loop.close()
