"""Support for the client tests: `sepa-gateway run` subprocesses that can be killed and restarted.

What it protects: the network transport is tested only against the installed gateway over real
sockets. A :class:`GatewayProcess` keeps its ports and its ``--data-dir`` across restarts, so a test
can ``kill -9`` the broker under a connected client and bring it back at the same address with the
same data, which is what a client's reconnection meets in the field.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from gateway.client import SepaClient

from tools.launcher import HOST, RunningGateway, free_ports, gateway_argv, launch_gateway

gateway_command = gateway_argv
T = TypeVar("T")
Connect = Callable[[], "SepaClient"]


class GatewayProcess:
    """A gateway of one test on ports fixed at creation, optionally on disk: start / kill / stop /
    start again at the same address with the same data (tools.launcher starts it each time)."""

    def __init__(self, *, data_dir: Path | None = None, ports: tuple[int, int] | None = None) -> None:
        self.data_dir = data_dir
        self.http_port, self.ws_port = ports or tuple(free_ports(2))
        self.running: RunningGateway | None = None
        self.starts = 0

    @property
    def query_url(self) -> str:
        return f"http://{HOST}:{self.http_port}/query"

    @property
    def update_url(self) -> str:
        return f"http://{HOST}:{self.http_port}/update"

    @property
    def ws_url(self) -> str:
        return f"ws://{HOST}:{self.ws_port}/subscribe"

    subscribe_url = ws_url

    @property
    def endpoints(self) -> tuple[str, str, str]:
        return self.query_url, self.update_url, self.ws_url

    def log(self) -> str:
        return self.running.log() if self.running is not None else ""

    def start(self) -> GatewayProcess:
        self.starts += 1
        self.running = launch_gateway(
            data_dir=self.data_dir, http_port=self.http_port, ws_port=self.ws_port, mqtt=False
        )
        return self

    def kill(self) -> None:
        """SIGKILL: no close frames, no flush; the OS resets the sockets."""
        if self.running is not None and self.running.running:
            self.running.kill()

    def stop(self) -> None:
        if self.running is not None and self.running.running:
            self.running.stop()

    # -- plain HTTP, independent of the client under test ----------------------------------------

    def post_update(self, sparql: str) -> dict[str, Any]:
        data = urllib.parse.urlencode({"update": sparql}).encode()
        with urllib.request.urlopen(self.update_url, data=data, timeout=10) as response:
            return json.loads(response.read())

    def select(self, sparql: str) -> dict[str, Any]:
        request = urllib.request.Request(
            self.query_url + "?" + urllib.parse.urlencode({"query": sparql}),
            headers={"Accept": "application/sparql-results+json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())


def run(coroutine: Awaitable[T], timeout: float = 30.0) -> T:
    """Run a test body on a fresh event loop, bounded in time."""

    async def bounded() -> T:
        return await asyncio.wait_for(coroutine, timeout)

    return asyncio.run(bounded())


async def eventually(check: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Wait until `check()` holds (polling the loop), or fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"{what} still false after {timeout} s")
        await asyncio.sleep(0.01)
