"""The processes of the wire benchmark: started on 127.0.0.1, talked to by JSON lines, always stopped.

Why this much care: a benchmark that leaves a gateway or an Oxigraph server running after Ctrl-C,
an error or a crash of the harness keeps ports, memory and CPU busy and skews the next run. So:

- every child runs in its own session, so a terminal's Ctrl-C reaches only the harness, which
  then stops the children itself, in order (SIGTERM, a grace period, then SIGKILL);
- on Linux every child also asks the kernel to SIGKILL it when the harness dies without
  cleaning up (``PR_SET_PDEATHSIG``), e.g. on SIGKILL or the OOM killer;
- :class:`Children` is a context manager that stops whatever is still alive on the way out.

The two client processes (subscriber, publisher) speak one JSON object per line on stdout and
read commands on stdin; their stderr goes to the harness's stderr (progress only).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp

from tools.launcher import free_port, gateway_argv

HOST = "127.0.0.1"
Log = Callable[[str], None]


class BenchError(Exception):
    """The benchmark cannot go on (a child died, a phase timed out...): one line for the user."""


def _load_libc() -> Any:
    """libc, loaded once in the harness: a child must not dlopen between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Run in the child before exec: own session, and SIGKILL when the harness dies (Linux only)."""
    os.setsid()
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Child:
    """One child process; stdout lines are read by a thread so reads can time out."""

    def __init__(self, name: str, argv: Sequence[str], *, log_path: Path | None = None, pipes: bool = False) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[bytes] | None = open(log_path, "wb") if log_path is not None else None  # noqa: SIM115
        out: Any = subprocess.PIPE if pipes else (self._log or subprocess.DEVNULL)
        err: Any = self._log if self._log is not None else None  # None: inherit the harness's stderr
        self.popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            preexec_fn=_die_with_parent,
            close_fds=True,
        )
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        if pipes:
            threading.Thread(target=self._pump, name=f"{name}-stdout", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def send(self, message: dict[str, Any]) -> None:
        """One JSON command on the child's stdin."""
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(json.dumps(message).encode() + b"\n")
            self.popen.stdin.flush()
        except BrokenPipeError as error:
            raise BenchError(f"{self.name} exited (code {self.popen.poll()})") from error

    def receive(self, timeout: float) -> dict[str, Any]:
        """The next JSON line the child prints, within `timeout` seconds."""
        try:
            line = self._lines.get(timeout=max(timeout, 0.0))
        except queue.Empty as error:
            raise BenchError(f"{self.name}: no answer within {timeout:.0f} s") from error
        if line is None:
            raise BenchError(f"{self.name} exited (code {self.popen.wait()}) before answering")
        try:
            message = json.loads(line)
        except ValueError as error:
            raise BenchError(f"{self.name} printed a line that is not JSON: {line[:200]!r}") from error
        if "error" in message:
            raise BenchError(f"{self.name}: {message['error']}")
        return dict(message)

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL; returns the exit code."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.popen.kill()
                self.popen.wait(grace)
        for stream in (self.popen.stdin, self.popen.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.popen.returncode

    def log_tail(self, lines: int = 15) -> str:
        """The end of the child's log file, to explain a failure."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])


class Children:
    """Every child of one run; leaving the ``with`` block stops those still alive, newest first."""

    def __init__(self) -> None:
        self.children: list[Child] = []

    def start(self, name: str, argv: Sequence[str], **options: Any) -> Child:
        child = Child(name, argv, **options)
        self.children.append(child)
        return child

    def stop(self, child: Child) -> int | None:
        code = child.stop()
        if child in self.children:
            self.children.remove(child)
        return code

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for child in reversed(self.children):
            child.stop()
        self.children.clear()


@contextlib.contextmanager
def explain_failure(child: Child, lines: int = 12) -> Iterator[None]:
    """Failures inside (ours, or the server's socket going away) become a BenchError that ends with
    `child`'s log: the server usually saw why."""
    try:
        yield
    except (BenchError, OSError, TimeoutError, aiohttp.ClientError) as error:
        message = str(error) if isinstance(error, BenchError) else f"{child.name}: {type(error).__name__}: {error}"
        tail = child.log_tail(lines)
        raise BenchError(message + (f"\n--- end of the {child.name} log ---\n{tail}" if tail else "")) from error


def python_module(module: str, *args: str) -> list[str]:
    """argv running `module` with this interpreter (the venv the harness runs in)."""
    return [sys.executable, "-m", module, *args]


def wait_http(url: str, child: Child, timeout: float) -> None:
    """Wait until `url` answers any HTTP status (the server is listening), or fail early if the child dies."""
    deadline = time.monotonic() + timeout
    while True:
        if not child.alive():
            tail = child.log_tail()
            raise BenchError(f"{child.name} exited with code {child.popen.returncode}" + (f":\n{tail}" if tail else ""))
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"{child.name} did not answer on {url} within {timeout:.0f} s")
        time.sleep(0.05)


@dataclass(frozen=True)
class GatewayProcess:
    """A running ``sepa-gateway run`` and its URLs."""

    child: Child
    http_port: int
    ws_port: int
    https_port: int | None = None  # the secure gates, when started with `secure`
    wss_port: int | None = None
    security_dir: Path | None = None

    @property
    def update_url(self) -> str:
        return f"http://{HOST}:{self.http_port}/update"

    @property
    def secure_update_url(self) -> str:
        return f"https://{HOST}:{self.https_port}/secure/update"

    @property
    def secure_subscribe_url(self) -> str:
        return f"wss://{HOST}:{self.wss_port}/secure/subscribe"

    @property
    def https_base(self) -> str:
        return f"https://{HOST}:{self.https_port}"

    @property
    def query_url(self) -> str:
        return f"http://{HOST}:{self.http_port}/query"

    @property
    def subscribe_url(self) -> str:
        return f"ws://{HOST}:{self.ws_port}/subscribe"


def rss_mb(pid: int) -> float:
    """A process's resident memory, in MB (from /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return round(int(status.split("VmRSS:")[1].split()[0]) / 1024, 1)


GATEWAY_CONFIG = """\
# Written by `sepa-gateway bench wire` for one run; deleted afterwards.
[engine]
allow_load = {allow_load}  # the loader may LOAD the knowledge base from its own 127.0.0.1 file server
time_limit_s = 300  # the benches' own checks read every observation (60,000 took >10 s on a loaded machine)
mode = "{mode}"
workers = {workers}

[http]
host = "{host}"
max_request_bytes = {max_request_bytes}  # the loader's INSERT DATA chunks are a few MB each

{mqtt}

[logging]
level = "WARNING"
"""


NO_MQTT = "[mqtt]\nenabled = false  # the benchmark measures the SPARQL gates only"

SECURE_CONFIG = """
[security]
enabled = true
host = "{host}"
dir = "{dir}"
clients = [{{identity = "{identity}", read = ["*"], write = ["*"]}}]
"""
BENCH_IDENTITY = "wire-bench"


def start_gateway(
    children: Children,
    workdir: Path,
    *,
    allow_load: bool,
    max_request_bytes: int,
    timeout: float = 30.0,
    mqtt: str = NO_MQTT,
    secure: bool = False,
    on_disk: bool = False,
    mode: str = "sequential",
    workers: int = 0,
) -> GatewayProcess:
    """Start ``sepa-gateway run`` on free ports and wait until it serves: with an in-memory store, or
    `on_disk` with a data directory in `workdir` (every update then waits for its group's fdatasync).

    With `secure`, its secure gates too (HTTPS + WSS, a self-signed certificate in
    ``<workdir>/security``, the client :data:`BENCH_IDENTITY` allowed to read and write everything).
    `mode` and `workers`: the engine's (``[engine]``: sequential or parallel, BOOSTER workers).
    Retries on fresh ports if the first pick was taken in between (exit code 2, "cannot listen").
    """
    config = workdir / ("gateway-secure.toml" if secure else "gateway.toml")
    text = GATEWAY_CONFIG.format(
        allow_load=str(allow_load).lower(),
        host=HOST,
        max_request_bytes=max_request_bytes,
        mqtt=mqtt,
        mode=mode,
        workers=workers,
    )
    security_dir = workdir / "security"
    if secure:
        text += SECURE_CONFIG.format(host=HOST, dir=security_dir, identity=BENCH_IDENTITY)
    config.write_text(text, encoding="utf-8")
    for attempt in range(3):
        http_port, ws_port = free_port(), free_port()
        https_port, wss_port = (free_port(), free_port()) if secure else (None, None)
        argv = [*gateway_argv(), "run", "--config", str(config)]
        argv += ["--http-port", str(http_port), "--ws-port", str(ws_port)]
        if on_disk:
            argv += ["--data-dir", str(workdir / f"data-{attempt}")]
        if secure:
            argv += ["--https-port", str(https_port), "--wss-port", str(wss_port)]
        child = children.start("gateway", argv, log_path=workdir / f"gateway-{attempt}.log")
        try:
            wait_http(f"http://{HOST}:{http_port}/metrics", child, timeout)
        except BenchError:
            children.stop(child)
            if attempt == 2 or "cannot listen" not in child.log_tail():
                raise
            continue
        if secure:
            return GatewayProcess(child, http_port, ws_port, https_port, wss_port, security_dir)
        return GatewayProcess(child, http_port, ws_port)
    raise AssertionError("unreachable")
