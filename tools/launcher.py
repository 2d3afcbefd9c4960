"""The one way the tests and the tools start a gateway: a `sepa-gateway run` subprocess, or a
Gateway on a thread's event loop, reached over real sockets on 127.0.0.1; and the one free-port helper.

Why one: four launchers had grown apart (each test folder and the wire benchmark had its own), each
with its own idea of when a gateway is up and how it must stop. Here a subprocess gateway listens on
the ports it is given, port 0 by default (the OS picks free ones, so test files can run in parallel),
is found through the URLs its "sepa-gateway serving" log line announces, and is polled until it
answers. `stop()` sends SIGTERM and returns the exit code; `restart()` brings it back on the same
ports with the same options and data directory (what a client's reconnection meets in the field).
The pytest fixtures built on it are in tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import json
import os
import queue
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from gateway.appliance.app import STOP_DEADLINE_S, Gateway
from gateway.appliance.config import Config

HOST = "127.0.0.1"
# Why 90 s, not 20: on the shared 2-core machine at load 10-11 (2026-12-07) `launch_gateway()`
# took 13.3 and 15.1 s to see "serving" (timed by hand), and 3 times not within 20 s, failing
# the test before it began. How fast a gateway starts is not what these tests are about.
STARTUP_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = STOP_DEADLINE_S + 10.0  # the gateway ends itself by then, as under systemd's TimeoutStopSec
SERVING = re.compile(r'msg="sepa-gateway serving" urls="([^"]+)"')


def free_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago (bound to port 0, then released)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 a moment ago."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Reply:
    """One HTTP reply, read completely."""

    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def media_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.body)


class Endpoint:
    """A running gateway reached over HTTP: `request` and the SPARQL shortcuts `query` / `update`."""

    http_url: str  # http://127.0.0.1:PORT (no path)
    ws_url: str  # ws://127.0.0.1:PORT (no path)
    query_path = "/query"
    update_path = "/update"

    @property
    def query_url(self) -> str:
        return self.http_url + self.query_path

    @property
    def update_url(self) -> str:
        return self.http_url + self.update_path

    @property
    def subscribe_url(self) -> str:
        """The subscribe gate on the WebSocket port."""
        return self.ws_url + "/subscribe"

    @property
    def subscribe_url_on_http_port(self) -> str:
        """The same gate, also served on the HTTP port (one origin for browsers)."""
        return self.http_url.replace("http://", "ws://") + "/subscribe"

    @property
    def endpoints(self) -> tuple[str, str, str]:
        """(query, update, subscribe) URLs, as NetworkTransport and SEPA clients take them."""
        return self.query_url, self.update_url, self.subscribe_url

    @property
    def http_port(self) -> int:
        port = urlsplit(self.http_url).port
        assert port is not None
        return port

    @property
    def ws_port(self) -> int:
        port = urlsplit(self.ws_url).port
        assert port is not None
        return port

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        params: Sequence[tuple[str, str]] | Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Reply:
        """Send one request on a fresh connection and read the whole reply."""
        if params:
            path = f"{path}{'&' if '?' in path else '?'}{urlencode(params)}"
        if isinstance(body, str):
            body = body.encode("utf-8")
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=dict(headers or {}))
            response = connection.getresponse()
            return Reply(response.status, response.headers, response.read())
        finally:
            connection.close()

    def query(
        self,
        sparql: str,
        *,
        accept: str | None = None,
        params: Sequence[tuple[str, str]] = (),
    ) -> Reply:
        """POST a query directly (application/sparql-query)."""
        headers = {"Content-Type": "application/sparql-query"}
        if accept is not None:
            headers["Accept"] = accept
        return self.request("POST", self.query_path, sparql, headers, params=params)

    def select(self, sparql: str, *, params: Sequence[tuple[str, str]] = ()) -> list[dict[str, str]]:
        """Rows of a SELECT as {variable: lexical value}; fails unless the reply is 200."""
        reply = self.query(sparql, params=params)
        assert reply.status == 200, reply.body
        return [{name: term["value"] for name, term in row.items()} for row in reply.json()["results"]["bindings"]]

    def ask(self, sparql: str, *, params: Sequence[tuple[str, str]] = ()) -> bool:
        reply = self.query(sparql, params=params)
        assert reply.status == 200, reply.body
        return bool(reply.json()["boolean"])

    def update(self, sparql: str, *, params: Sequence[tuple[str, str]] = (), timeout: float = 30.0) -> Reply:
        """POST an update directly (application/sparql-update); `timeout` for a reply that waits for
        slow re-evaluations."""
        headers = {"Content-Type": "application/sparql-update"}
        return self.request("POST", self.update_path, sparql, headers, params=params, timeout=timeout)

    def post_update(self, sparql: str) -> dict[str, Any]:
        """POST an update as a form (what most SEPA clients send); the reply's JSON, 200 or it fails."""
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        reply = self.request("POST", self.update_path, urlencode({"update": sparql}), headers)
        assert reply.status == 200, reply.body
        return reply.json()

    def metrics(self) -> dict[str, float]:
        """The /metrics samples, keyed by the sample name with its labels."""
        reply = self.request("GET", "/metrics")
        assert reply.status == 200, reply.body
        samples = {}
        for line in reply.text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples


def gateway_argv() -> list[str]:
    """The `sepa-gateway` command of the interpreter running the tests."""
    script = Path(sys.executable).parent / "sepa-gateway"
    if script.exists():
        return [str(script)]
    found = shutil.which("sepa-gateway")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]


@dataclass
class RunningGateway(Endpoint):
    """A `sepa-gateway run` subprocess; its stderr is collected line by line."""

    process: subprocess.Popen[str]
    urls: list[str] = field(default_factory=list)
    stderr_lines: list[str] = field(default_factory=list)
    _lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    _reader: threading.Thread | None = None
    http_url: str = ""
    ws_url: str = ""
    https_url: str = ""  # the secure gates, when enabled
    wss_url: str = ""
    coap_url: str = ""  # coap://127.0.0.1:PORT (no path), when the CoAP adapter runs
    launch: dict[str, Any] = field(default_factory=dict)  # how it was started: restart() starts it again

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr_lines.append(line.rstrip("\n"))
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first stderr line (from now on) matching `pattern`."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no stderr line matching {pattern.pattern!r}: {self.stderr_lines}")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(
                    f"gateway exited ({self.process.wait()}) before {pattern.pattern!r}: {self.stderr_lines}"
                )
            match = pattern.search(line)
            if match:
                return match

    def stop(self, signum: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Send `signum` and wait for the exit code (killed after `timeout`, then the test fails)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"gateway did not stop within {timeout}s after signal {signum}") from None
        if self._reader is not None:
            self._reader.join(timeout)  # every stderr line is in stderr_lines once stop() returns
        return code

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def __enter__(self) -> RunningGateway:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        """Stopped on the way out, whatever ended the block: a test that failed between a start and
        its `finally` left a `sepa-gateway run` holding its ports for the rest of the session
        (2026-12-07). Without an exception in flight, the SIGTERM must end it with 0 (a clean
        shutdown); with one, that exception is the test's failure and is left alone."""
        if self.running:
            code = self.stop()
            assert kind is not None or code == 0, f"gateway exited {code} on SIGTERM: {self.stderr_lines}"

    def kill(self) -> int:
        """SIGKILL: no close frames, no flush; the OS resets the sockets."""
        return self.stop(signal.SIGKILL)

    def restart(self) -> RunningGateway:
        """The same gateway started again (after stop or kill) on the same ports, options and data."""
        assert not self.running, "stop or kill the gateway before restarting it"
        launch = {**self.launch, "http_port": self.http_port, "ws_port": self.ws_port}
        return launch_gateway(*launch.pop("args"), **launch)

    def log(self) -> str:
        """Everything it wrote on stderr so far (its log)."""
        return "\n".join(self.stderr_lines)

    def metric(self, name: str) -> float:
        return self.metrics().get(name, 0.0)

    def wait_for_metric(self, name: str, accept: Any, timeout: float = 5.0) -> float:
        """Poll /metrics until `accept(value)`; fails with the last value seen after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.metric(name)
            if accept(value):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} is still {value} after {timeout} s")
            time.sleep(0.02)


def wait_until_answering(endpoint: Endpoint, timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Poll /metrics on the HTTP port and a TCP connect on the WebSocket port until both answer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if endpoint.request("GET", "/metrics", timeout=2).status == 200:
                socket.create_connection(("127.0.0.1", endpoint.ws_port), timeout=2).close()
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"gateway at {endpoint.http_url} does not answer")
        time.sleep(0.02)


def _limit_files(size: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def launch_gateway(
    *args: str,
    config: Path | None = None,
    data_dir: Path | None = None,
    http_port: int = 0,
    ws_port: int = 0,
    mqtt: bool | None = None,
    coap: bool = False,
    coap_port: int = 0,
    file_size_limit: int | None = None,
    environment: Mapping[str, str] | None = None,
    host: str | None = "127.0.0.1",
) -> RunningGateway:
    """Start `sepa-gateway run --http-port P --ws-port Q [...]` and wait until it answers.

    `host`: the `--host` option; None gives none, so that the config file and the defaults choose.

    `file_size_limit`: the process may write no file past this many bytes (RLIMIT_FSIZE; a write
    past it fails with EFBIG, Python ignoring SIGXFSZ): a full disk, without root to mount one.

    MQTT is off unless asked for (or a config file is given): tests of the MQTT adapter run their
    own Mosquitto (tests/adapters/mqtt), and no other test may depend on a broker at localhost:1883.
    CoAP is off unless asked for (`coap=True`): its adapter holds subscriptions of its own (the
    mappings graph), which tests counting `sepa_subscriptions` do not expect; when on, it binds
    `coap_port` (0: a free one, see `RunningGateway.coap_url`).
    `environment`: variables set for the gateway (the installed unit's, tools/dashboard_bench/installed.py).
    """
    argv = [*gateway_argv(), "run", *(("--host", host) if host is not None else ()), "--http-port", str(http_port)]
    argv += ["--ws-port", str(ws_port)]
    argv += ["--https-port", "0", "--wss-port", "0"]  # used only when a test's config or flag enables [security]
    if mqtt is False or (mqtt is None and config is None):
        argv.append("--no-mqtt")
    if coap:
        argv += ["--coap-port", str(coap_port)]  # 0: any free port (test files run in parallel); see coap_url
    else:
        argv.append("--no-coap")
    if config is not None:
        argv += ["--config", str(config)]
    if data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    argv += list(args)
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(environment or {})},
        preexec_fn=None if file_size_limit is None else functools.partial(_limit_files, file_size_limit),
    )
    launch = {
        "args": args,
        "config": config,
        "data_dir": data_dir,
        "mqtt": mqtt,
        "coap": coap,
        "environment": environment,
        "host": host,
    }
    gateway = RunningGateway(process=process, launch=launch)
    gateway._reader = threading.Thread(target=gateway._drain, name="gateway-stderr", daemon=True)
    gateway._reader.start()
    try:
        match = gateway.wait_for_line(SERVING, STARTUP_TIMEOUT_S)
        gateway.urls = match.group(1).split()
        query_url = urlsplit(gateway.urls[0])
        ws = urlsplit(gateway.urls[2])
        gateway.http_url = f"http://127.0.0.1:{query_url.port}"
        gateway.ws_url = f"ws://127.0.0.1:{ws.port}"
        gateway.query_path = query_url.path
        gateway.update_path = urlsplit(gateway.urls[1]).path
        for url in gateway.urls:
            if url.endswith("/secure/query"):
                gateway.https_url = f"https://127.0.0.1:{urlsplit(url).port}"
            elif url.endswith("/secure/subscribe"):
                gateway.wss_url = f"wss://127.0.0.1:{urlsplit(url).port}"
            elif url.startswith("coap://"):
                gateway.coap_url = f"coap://127.0.0.1:{urlsplit(url).port}"
                launch["coap_port"] = urlsplit(url).port  # restart() comes back on the same port
        wait_until_answering(gateway)
    except BaseException:
        if process.poll() is None:
            process.kill()
        process.wait()
        raise
    return gateway


@dataclass
class InProcessGateway(Endpoint):
    """A :class:`gateway.appliance.app.Gateway` serving from an event loop on a background thread."""

    gateway: Gateway
    loop: asyncio.AbstractEventLoop
    http_url: str = ""
    ws_url: str = ""
    https_url: str = ""  # the secure gates, when enabled
    wss_url: str = ""

    def call(self, coroutine: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the gateway's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def submit(self, coroutine: Any) -> Any:
        """Start a coroutine on the gateway's loop; returns its concurrent future."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)


def start_in_process(config: Config) -> tuple[InProcessGateway, threading.Thread]:
    """Start a Gateway for `config` on 127.0.0.1:0, MQTT off (the MQTT tests run it on their own broker)
    and CoAP off (tests/adapters/coap runs it in subprocess gateways)."""
    if "mqtt" in config.adapters:
        config.adapter("mqtt").enabled = False
    if "coap" in config.adapters:  # off, as in launch_gateway: its own subscriptions would count
        config.adapter("coap").enabled = False
    config.http.host = "127.0.0.1"
    config.http.port = 0
    config.websocket.port = 0
    config.security.host = "127.0.0.1"
    config.security.https_port = 0
    config.security.wss_port = 0
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="gateway-loop", daemon=True)
    thread.start()

    async def build() -> tuple[Gateway, list[str]]:
        built = Gateway(config.validate())
        return built, await built.start()

    built, urls = asyncio.run_coroutine_threadsafe(build(), loop).result(STARTUP_TIMEOUT_S)
    endpoint = InProcessGateway(
        gateway=built,
        loop=loop,
        http_url=f"http://127.0.0.1:{urlsplit(urls[0]).port}",
        ws_url=f"ws://127.0.0.1:{urlsplit(urls[2]).port}",
    )
    if built.secure is not None:
        endpoint.https_url = f"https://127.0.0.1:{built.ports['https']}"
        endpoint.wss_url = f"wss://127.0.0.1:{built.ports['wss']}"
    wait_until_answering(endpoint)
    return endpoint, thread
