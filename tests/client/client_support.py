"""Support for the client tests: `sepa-gateway run` subprocesses that can be killed and restarted.

What it protects: the network transport is tested only against the installed gateway over real
sockets. Unlike tests/subscribe's launcher, a :class:`GatewayProcess` here keeps its ports and its
``--data-dir`` across restarts, so a test can ``kill -9`` the broker under a connected client and
bring it back at the same address with the same data, which is what a client's reconnection
meets in the field.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from gateway.client import SepaClient

HOST = "127.0.0.1"
START_TIMEOUT_S = 15.0
T = TypeVar("T")
Connect = Callable[[], "SepaClient"]


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports that were free a moment ago."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def gateway_command() -> list[str]:
    script = Path(sys.executable).with_name("sepa-gateway")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
        return True
    return False


class GatewayProcess:
    """A `sepa-gateway run` on fixed ports, optionally on disk; start / kill / stop / restart."""

    def __init__(self, directory: Path, *, data_dir: Path | None = None, ports: tuple[int, int] | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.data_dir = data_dir
        self.http_port, self.ws_port = ports or tuple(free_ports(2))
        self.process: subprocess.Popen[bytes] | None = None
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

    @property
    def urls(self) -> tuple[str, str, str]:
        return self.query_url, self.update_url, self.ws_url

    def log(self) -> str:
        return "\n".join(
            path.read_text(encoding="utf-8", errors="replace") for path in sorted(self.directory.glob("gateway-*.log"))
        )

    def start(self) -> GatewayProcess:
        self.starts += 1
        command = [*gateway_command(), "run", "--host", HOST, "--no-mqtt"]
        command += ["--http-port", str(self.http_port), "--ws-port", str(self.ws_port)]
        if self.data_dir is not None:
            command += ["--data-dir", str(self.data_dir)]
        with open(self.directory / f"gateway-{self.starts}.log", "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (_accepts(self.http_port) and _accepts(self.ws_port)):
            if self.process.poll() is not None:
                raise RuntimeError(f"sepa-gateway exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"sepa-gateway did not start within {START_TIMEOUT_S} s:\n{self.log()}")
            time.sleep(0.03)
        return self

    def kill(self) -> None:
        """SIGKILL: no close frames, no flush; the OS resets the sockets."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

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
