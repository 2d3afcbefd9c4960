"""`sepa-gateway run` as an operator and systemd see it: a real process, real ports, real signals.

Protects: the "serving" log line lists the URLs really served (ports chosen by the OS included);
SIGTERM, SIGINT and SIGHUP exit 0 (a second one too) after finishing an in-flight update, whose client
gets its 200 reply, and the on-disk store then holds the whole update or none of it, never part; `--data-dir`
persists across restarts; a port in use or a bad configuration (unknown section or key, wrong
type, invalid value, invalid TOML, unreadable or missing file) is ONE line on stderr and exit
code 2; `--config systemd/sepa-gateway.toml` runs; and the annotated systemd/sepa-gateway.toml
documents exactly the defaults the code uses.
"""

from __future__ import annotations

import http.client
import math
import os
import re
import signal
import socket
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from gateway.appliance.cli import main as cli_main
from gateway.appliance.config import Config, load_config
from tests.polling import wait_until

if TYPE_CHECKING:
    from tools.launcher import RunningGateway

REPO = Path(__file__).resolve().parents[4]
SYSTEMD_CONFIG = REPO / "systemd" / "sepa-gateway.toml"
EX = "http://example.org/run/"
BIG = 200  # the big update inserts BIG * BIG quads
# Why a size measured on the machine for the signal tests: the gateway's stop ends within
# STOP_DEADLINE_S (9 s until 2026-12-07) whatever runs, and 40,000 quads took 4.6-6 s here with the other cores busy,
# more than 10 s with core 0 saturated by a busy loop (then "stop took longer than 9 s", exit 1).
# The update is sized to take about IN_FLIGHT_S, measured on the gateway under test.
IN_FLIGHT_S = 1.5
# the long update: past the 6 s the stop waited for updates until 2026-12-07, well within the
# gateway's STOP_DEADLINE_S (20 s); 200 x 200 took 7.2 s here, 250 x 250 12.8 s
LONG_IN_FLIGHT_S = 8.0
LONGEST = 300
CALIBRATION = 60  # 3,600 quads: a size that times the machine in well under a second when quiet
COUNT = f"SELECT (COUNT(*) AS ?n) WHERE {{ ?s <{EX}big> ?o }}"


def big_update(size: int = BIG, predicate: str = "big") -> str:
    numbers = " ".join(str(n) for n in range(size))
    return (
        f"INSERT {{ ?s <{EX}{predicate}> ?b }} WHERE {{ VALUES ?a {{ {numbers} }} VALUES ?b {{ {numbers} }} "
        f'BIND(IRI(CONCAT("{EX}s", STR(?a))) AS ?s) }}'
    )


def sized_to_the_machine(gateway: RunningGateway, seconds: float = IN_FLIGHT_S, most: int = BIG) -> int:
    """The size of a big update that takes about `seconds` on `gateway` now (at most `most`): a
    smaller one of the same shape is timed there, and the time taken as growing with the quads."""
    started = time.monotonic()
    assert gateway.update(big_update(CALIBRATION, "calibration")).status == 200
    per_quad_s = (time.monotonic() - started) / CALIBRATION**2
    return max(CALIBRATION, min(most, int(math.sqrt(seconds / per_quad_s))))


def count_big(gateway: RunningGateway) -> int:
    return int(gateway.select(COUNT)[0]["n"])


def assert_one_line_exit_2(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stderr.endswith("\n"), result.stderr
    assert lines[0].startswith("sepa-gateway: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


class UpdateInFlight:
    """A big update sent on its own connection from a thread; `reply` is (status, body) or the
    exception the client saw."""

    def __init__(self, gateway: RunningGateway, size: int = BIG) -> None:
        self.size = size
        self.connection = http.client.HTTPConnection("127.0.0.1", gateway.http_port, timeout=60)
        self.sent = threading.Event()
        self.reply: tuple[int, bytes] | Exception | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.connection.request(
                "POST", "/update", big_update(self.size).encode(), {"Content-Type": "application/sparql-update"}
            )
            self.sent.set()
            response = self.connection.getresponse()
            self.reply = (response.status, response.read())
        except Exception as error:  # noqa: BLE001 - the client's view is what the test checks
            self.reply = error
        finally:
            self.sent.set()
            self.connection.close()

    def result(self, timeout: float = 60.0) -> tuple[int, bytes] | Exception | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the update client never finished"
        return self.reply


# -- serving ---------------------------------------------------------------------------------


def test_run_logs_the_urls_it_serves(start_gateway: Callable[..., RunningGateway]) -> None:
    gateway = start_gateway(coap=True)
    http_port, ws_port = gateway.http_port, gateway.ws_port
    assert http_port != 0 and ws_port != 0 and http_port != ws_port
    assert gateway.urls == [
        f"http://127.0.0.1:{http_port}/query",
        f"http://127.0.0.1:{http_port}/update",
        f"ws://127.0.0.1:{ws_port}/subscribe",
        f"ws://127.0.0.1:{http_port}/subscribe",
        f"http://127.0.0.1:{http_port}/metrics",
        f"http://127.0.0.1:{http_port}/scheduled",
        f"coap://127.0.0.1:{urlsplit(gateway.coap_url).port}/",  # the CoAP adapter listens where the gates do
    ]
    serving = next(line for line in gateway.stderr_lines if "sepa-gateway serving" in line)
    assert "store=memory" in serving and "mode=incremental" in serving
    assert gateway.request("GET", urlsplit(gateway.urls[0]).path + "?query=ASK%7B%7D").json()["boolean"] is True
    assert gateway.update(f"INSERT DATA {{ <{EX}s> <{EX}p> 1 }}").status == 200
    assert gateway.request("GET", urlsplit(gateway.urls[4]).path).status == 200
    for url in gateway.urls[2:4]:  # both subscribe URLs accept a WebSocket handshake
        port = urlsplit(url).port
        assert port is not None
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(
                b"GET /subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            assert connection.recv(4096).startswith(b"HTTP/1.1 101 "), url
    started = time.monotonic()
    assert gateway.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 10
    assert gateway.stderr_lines[-1].endswith('msg="sepa-gateway stopped"'), gateway.stderr_lines


def test_data_dir_persists_across_restart(start_gateway: Callable[..., RunningGateway], tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    first = start_gateway(data_dir=data_dir)
    assert any(f"store={data_dir}" in line for line in first.stderr_lines)
    assert (
        first.update(f"INSERT DATA {{ <{EX}s> <{EX}p> 'kept' . GRAPH <{EX}g> {{ <{EX}s> <{EX}p> 2 }} }}").status == 200
    )
    assert first.stop() == 0
    second = start_gateway(data_dir=data_dir)
    rows = second.select(
        f"SELECT ?g ?o WHERE {{ {{ <{EX}s> <{EX}p> ?o }} UNION {{ GRAPH ?g {{ <{EX}s> <{EX}p> ?o }} }} }}"
    )
    assert sorted((row.get("g", ""), row["o"]) for row in rows) == [("", "kept"), (f"{EX}g", "2")]


# -- signals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_signal_finishes_the_in_flight_update(
    start_gateway: Callable[..., RunningGateway], tmp_path: Path, signum: int
) -> None:
    """The signal arrives while the update is being processed: its client gets 200 with the full
    count, the process exits 0, and after a restart the store holds the whole update."""
    data_dir = tmp_path / "store"
    gateway = start_gateway(data_dir=data_dir)
    size = sized_to_the_machine(gateway)
    update = UpdateInFlight(gateway, size)
    wait_until(lambda: update.reply is not None or gateway.metrics()["sepa_scheduler_in_flight"] == 1)
    assert update.reply is None, f"the update finished before the signal: {update.reply!r}"
    assert gateway.stop(signum) == 0, gateway.stderr_lines
    reply = update.result()
    assert isinstance(reply, tuple), f"the in-flight update got no reply: {reply!r}"
    status, body = reply
    assert status == 200, body
    assert f'"added": {size * size}'.encode() in body
    assert any("stopping" in line for line in gateway.stderr_lines)
    assert any("sepa-gateway stopped" in line for line in gateway.stderr_lines)
    assert count_big(start_gateway(data_dir=data_dir)) == size * size


def test_a_second_sigterm_after_the_stop_still_exits_0(start_gateway: Callable[..., RunningGateway]) -> None:
    """A second SIGTERM (or Ctrl-C) once the gateway logged "stopped", while the process exits (then
    the interpreter's finalization, ~2.5 s; now a flush of the logs): it killed the process, exit 143
    instead of 0 (systemd and an operator saw a stop that failed); now it only ends the exit sooner."""
    gateway = start_gateway()
    gateway.process.send_signal(signal.SIGTERM)
    gateway.wait_for_line(re.compile("sepa-gateway stopped"), 30)
    assert gateway.stop(signal.SIGTERM) == 0, gateway.stderr_lines[-3:]


def test_a_flood_of_stop_signals_after_the_stop_still_exits_0(start_gateway: Callable[..., RunningGateway]) -> None:
    """SIGTERMs sent back to back from the line "sepa-gateway stopped" until the process is gone:
    asyncio.run's close of the loop gave SIGTERM its default action back before run installed its
    own handler, and one SIGTERM falling in between killed the process (exit 143; once in CI with
    the test above). Each signal may only end the exit sooner."""
    gateway = start_gateway()
    gateway.process.send_signal(signal.SIGTERM)
    gateway.wait_for_line(re.compile("sepa-gateway stopped"), 30)
    while gateway.process.poll() is None:
        os.kill(gateway.process.pid, signal.SIGTERM)
    assert gateway.process.returncode == 0, gateway.stderr_lines[-3:]


# The process's exit once "sepa-gateway stopped" is logged, in CPU-seconds (the gateway's and its
# reaped children's, so that a load on the machine does not count): the interpreter's finalization
# took 0.40 on an empty store and 0.47-0.53 with LOADED_QUADS here (its garbage collections walking
# the heap, then the store freed), now 0.0-0.05 (2026-12-07, load 8-10). Ticks are 10 ms.
EXIT_CPU_S = 0.2
LOADED_QUADS = 100_000


def test_the_process_ends_without_freeing_its_heap_once_stopped(start_gateway: Callable[..., RunningGateway]) -> None:
    """Once the stop is done (everything durable flushed, children reaped), the process ends at
    once with the stop's status: the interpreter's finalization freed the heap, ~0.6-2.5 s of a
    core after "stopped" in every restart and every test's stop."""
    gateway = start_gateway()
    for start in range(0, LOADED_QUADS, 10_000):
        triples = " ".join(f"<{EX}s{n}> <{EX}p> {n} ." for n in range(start, start + 10_000))
        assert gateway.update(f"INSERT DATA {{ {triples} }}").status == 200
    tasks = Path(f"/proc/{gateway.process.pid}/task").glob("*/children")  # under the thread that forked each
    children = [int(pid) for task in tasks for pid in task.read_text().split()]
    assert children, "no worker process to watch"
    gateway.process.send_signal(signal.SIGTERM)
    gateway.wait_for_line(re.compile("sepa-gateway stopped"), 30)
    at_stopped = _cpu_s(gateway.process.pid)
    _pid, status, usage = os.wait4(gateway.process.pid, 0)
    gateway.process.returncode = os.waitstatus_to_exitcode(status)
    assert gateway.process.returncode == 0, gateway.stderr_lines[-3:]
    exit_cpu_s = usage.ru_utime + usage.ru_stime - at_stopped
    assert exit_cpu_s < EXIT_CPU_S, f"{exit_cpu_s:.2f} CPU-s after the stop"
    assert not [pid for pid in children if Path(f"/proc/{pid}").exists()], "a child process outlived the gateway"


def _cpu_s(pid: int) -> float:
    """CPU-seconds of `pid` and of its children it reaped, from /proc (its exited threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(ticks) for ticks in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def test_a_long_update_in_flight_gets_its_reply(start_gateway: Callable[..., RunningGateway], tmp_path: Path) -> None:
    """An update still running LONG_IN_FLIGHT_S after SIGTERM is finished AND answered: until
    2026-12-07 the stop waited 6 s for the updates in flight, then closed their connections while
    the update went on and was applied and journalled (a 200 x 200 insert of 7.2 s: applied, its
    client got RemoteDisconnected). The update is sized to the machine, at most LONGEST x LONGEST
    (under the 100,000 quads of [engine] max_update_quads); on a loaded machine its WHERE may pass
    the time limit (10 s), and then the reply that comes is that 503, with nothing applied."""
    data_dir = tmp_path / "store"
    gateway = start_gateway(data_dir=data_dir)
    size = sized_to_the_machine(gateway, LONG_IN_FLIGHT_S, LONGEST)
    update = UpdateInFlight(gateway, size)
    wait_until(lambda: update.reply is not None or gateway.metrics()["sepa_scheduler_in_flight"] == 1)
    assert update.reply is None, f"the update finished before the signal: {update.reply!r}"
    assert gateway.stop(signal.SIGTERM) == 0, gateway.stderr_lines[-3:]
    reply = update.result()
    assert isinstance(reply, tuple), f"the update in flight got no reply: {reply!r}"
    status, body = reply
    if status == 200:
        assert f'"added": {size * size}'.encode() in body, body
    else:  # a loaded machine: its WHERE ran past [engine] time_limit_s, nothing applied, and said so
        assert status == 503 and b'"timeout"' in body, reply
    assert count_big(start_gateway(data_dir=data_dir)) == (size * size if status == 200 else 0)


def test_a_query_in_flight_does_not_hold_the_stop(start_gateway: Callable[..., RunningGateway]) -> None:
    """A query evaluating at SIGTERM is abandoned, not waited for: the stop waited for its handler
    until the time limit (10 s by default) ended it, and was forced at 9 s ("stop took longer than
    9 s", exit 1). 6,000 x 6,000 solutions with a FILTER: far past the time limit, here 60 s, so
    that a stop waiting for it is forced at STOP_DEADLINE_S (20 s, exit 1) whatever the load."""
    gateway = start_gateway(toml="[engine]\ntime_limit_s = 60\n")
    for predicate in "pq":
        triples = " ".join(f"<{EX}{predicate}{i}> <{EX}{predicate}> {i} ." for i in range(6000))
        assert gateway.update(f"INSERT DATA {{ {triples} }}").status == 200
    slow = f"SELECT * WHERE {{ ?a <{EX}p> ?x . ?b <{EX}q> ?y FILTER(STRLEN(STR(?x)) + STRLEN(STR(?y)) > 100) }}"
    with ThreadPoolExecutor(1) as pool:
        asking = pool.submit(gateway.query, slow)
        wait_until(lambda: gateway.metrics()["sepa_scheduler_in_flight"] == 1)
        time.sleep(0.5)  # into its evaluation
        started = time.monotonic()
        assert gateway.stop(signal.SIGTERM) == 0, gateway.stderr_lines[-3:]
        took = time.monotonic() - started
        with pytest.raises(OSError):  # its connection closed, unanswered (RemoteDisconnected)
            asking.result()
    # Without the fix the stop waits for the query's time limit: 8 s was the bar against the default
    # 10 s, and the stop took 4.0 and 5.7 s at load 10 (2026-12-07; ~2.5 s earlier, 5 s failed
    # once). With a 60 s limit it is forced at 20 s (exit 1), so 15 s leaves a loaded machine room.
    assert took < 15.0, took


def test_sigterm_right_after_sending_is_all_or_nothing(
    start_gateway: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    """SIGTERM as soon as the request bytes are sent: the client gets 200 (then the update is
    all there after restart) or a cleanly closed connection (then all or nothing is there)."""
    data_dir = tmp_path / "store"
    gateway = start_gateway(data_dir=data_dir)
    update = UpdateInFlight(gateway)
    assert update.sent.wait(10)
    assert gateway.stop(signal.SIGTERM) == 0, gateway.stderr_lines
    reply = update.result()
    count = count_big(start_gateway(data_dir=data_dir))
    if isinstance(reply, tuple):
        assert reply[0] == 200, reply
        assert count == BIG * BIG
    else:
        assert isinstance(reply, ConnectionError | http.client.RemoteDisconnected), repr(reply)
        assert count in (0, BIG * BIG)


# -- startup failures ------------------------------------------------------------------------
# The cases named by the operator's contract run as real `sepa-gateway run` processes (concurrently,
# once per module); the other configuration errors go through the same command in process.

CONFIG_CASES: dict[str, tuple[bytes | None, str]] = {
    "unknown-key": (b"[http]\nprot = 8000\n", "http.prot"),
    "wrong-type": (b'[http]\nport = "8000"\n', "http.port"),
    "invalid-toml": (b"[http\nport = 8000\n", "not valid TOML"),
    "missing-file": (None, "cannot read"),
}
MORE_CONFIG_CASES: dict[str, tuple[bytes | None, str]] = {
    "unknown-section": (b"[htp]\nport = 8000\n", "[htp]"),
    "bool-for-int": (b"[scheduler]\nqueue_size = true\n", "scheduler.queue_size"),
    "float-for-int": (b"[http]\nmax_request_bytes = 1.5\n", "http.max_request_bytes"),
    "section-not-table": (b"http = 8000\n", "[http]"),
    "invalid-value": (b'[engine]\nmode = "fast"\n', "engine.mode"),
    "out-of-range": (b"[websocket]\nport = 70000\n", "websocket.port"),
    "not-positive": (b"[scheduler]\nqueue_size = 0\n", "scheduler.queue_size"),
    "not-utf8": (b'[http]\nhost = "\xff"\n', "not valid TOML"),
    "directory": (None, "cannot read"),
    "not-finite": (b"[engine]\ntime_limit_s = nan\n", "engine.time_limit_s must be a finite number"),
    "secure-ports-equal": (b"[security]\nenabled = true\nhttps_port = 8555\nwss_port = 8555\n", "wss_port must differ"),
    "nested-too-deeply": (b"a = " + b"[" * 900 + b"]" * 900 + b"\n", "nested too deeply"),
}
LOCAL = ("--host", "127.0.0.1", "--http-port", "0", "--ws-port", "0")
Refused = tuple[dict[str, "subprocess.CompletedProcess[str]"], int, Path]
# in the environment of the refused starts, which their worker processes inherit: what finds one
# left running once its gateway has exited (then a child of init, out of the guard's sight)
REFUSED_MARK = f"SEPA_TEST_REFUSED_START={os.getpid()}"


def marked_processes() -> list[int]:
    """The processes running with REFUSED_MARK in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:  # gone, or another user's
                continue
            if REFUSED_MARK.encode() in environ.split(b"\0"):
                found.append(int(entry.name))
    return found


def _config_file(folder: Path, case: str, content: bytes | None) -> Path:
    path = folder / f"{case}.toml"
    if case == "directory":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    return path


@pytest.fixture(scope="module")
def refused_starts(tmp_path_factory: pytest.TempPathFactory, gateway_command: list[str]) -> Iterator[Refused]:
    """{case: completed process} for the startups that must fail, the busy port, the bad data dir."""
    folder = tmp_path_factory.mktemp("refused")
    invocations = {
        f"config:{case}": ["--config", str(_config_file(folder, case, content)), *LOCAL]
        for case, (content, _) in CONFIG_CASES.items()
    }
    not_a_directory = folder / "file"
    not_a_directory.write_text("x")
    invocations["data-dir"] = [*LOCAL, "--data-dir", str(not_a_directory)]
    token = folder / "token"
    token.write_text("secret-token\n")
    shipper = folder / "shipper.toml"  # refused once the query workers are up: no spool_dir, in memory
    shipper.write_text(f'[shipper]\nenabled = true\nurl = "https://cloud.example"\ntoken_file = "{token}"\n')
    invocations["shipper"] = ["--config", str(shipper), *LOCAL, "--no-mqtt", "--no-coap"]
    name, value = REFUSED_MARK.split("=")
    env = {**os.environ, name: value}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy = blocker.getsockname()[1]
        invocations["port:http"] = ["--host", "127.0.0.1", "--http-port", str(busy), "--ws-port", "0"]
        invocations["port:ws"] = ["--host", "127.0.0.1", "--http-port", "0", "--ws-port", str(busy)]

        def run(args: list[str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*gateway_command, "run", *args],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                env=env,
            )

        with ThreadPoolExecutor(max_workers=len(invocations)) as pool:
            futures = {case: pool.submit(run, args) for case, args in invocations.items()}
            results = {case: future.result() for case, future in futures.items()}
    yield results, busy, not_a_directory


@pytest.mark.parametrize("which", ["http", "ws"])
def test_port_in_use_is_one_line_and_exit_2(refused_starts: Refused, which: str) -> None:
    results, busy, _ = refused_starts
    assert_one_line_exit_2(results[f"port:{which}"], str(busy), "in use")


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config_is_one_line_and_exit_2(refused_starts: Refused, case: str) -> None:
    assert_one_line_exit_2(refused_starts[0][f"config:{case}"], "bad configuration", CONFIG_CASES[case][1])


def test_unusable_data_dir_is_one_line_and_exit_2(refused_starts: Refused) -> None:
    results, _, not_a_directory = refused_starts
    assert_one_line_exit_2(results["data-dir"], "data directory", str(not_a_directory))


def test_a_refused_start_leaves_no_process(refused_starts: Refused) -> None:
    """Every refusal above, the workers already up for the shipper's and the busy ports: none of
    their processes outlives the command (gateway.appliance.app.Gateway closes what it started; the
    workers also die with the thread that started them). Generous: a kill is seen a moment later."""
    assert_one_line_exit_2(refused_starts[0]["shipper"], "spool_dir is required")
    wait_until(lambda: not marked_processes(), timeout=30)


@pytest.mark.parametrize("case", [*MORE_CONFIG_CASES, "cli-port"])
def test_more_bad_configs_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    """The command's `main` refuses these before serving anything: one line, exit 2."""
    if case == "cli-port":
        argv, fragment = ["run", "--http-port", "65536"], "http.port"
    else:
        content, fragment = MORE_CONFIG_CASES[case]
        argv = ["run", "--config", str(_config_file(tmp_path, case, content)), *LOCAL]
    code = cli_main(argv)
    captured = capsys.readouterr()
    line = assert_one_line_exit_2(subprocess.CompletedProcess(argv, code, captured.out, captured.err), fragment)
    if case != "cli-port":  # a problem of the file names it, with its line or without (a value nested too deep)
        assert line.startswith(f"sepa-gateway: bad configuration: {tmp_path / case}.toml"), line


# -- the systemd configuration ---------------------------------------------------------------


def test_systemd_config_runs(start_gateway: Callable[..., RunningGateway]) -> None:
    # its ports are overridden by --http-port/--ws-port 0; its MQTT login exists only where installed
    gateway = start_gateway("--no-mqtt", config=SYSTEMD_CONFIG)
    assert gateway.update(f"INSERT DATA {{ <{EX}s> <{EX}p> 1 }}").json()["added"] == 1
    assert gateway.ask(f"ASK {{ <{EX}s> <{EX}p> 1 }}")


def _leaves(instance: Any, prefix: str = "") -> dict[str, Any]:
    """Every setting of a config dataclass, as {"section.key": value}."""
    found: dict[str, Any] = {}
    for item in fields(instance):
        value = getattr(instance, item.name)
        if is_dataclass(value):
            found.update(_leaves(value, f"{prefix}{item.name}."))
        elif item.name == "adapters":  # the plug-ins' sections, [mqtt]...
            for name, section in value.items():
                found.update(_leaves(section, f"{prefix}{name}."))
        else:
            found[f"{prefix}{item.name}"] = value
    return found


# the installed appliance's two choices (secure by default): the only settings that differ from the defaults
INSTALLED_CHOICES = {
    "security.enabled": True,
    "http.host": "127.0.0.1",
    "mqtt.username": "sepa-gateway",
    "mqtt.password_file": "/etc/sepa-gateway/mqtt-password",
    "mqtt.port": 1884,  # Mosquitto's listener for this board only (systemd/mosquitto-sepa-gateway.conf)
}


def test_systemd_config_documents_exactly_the_defaults() -> None:
    installed = _leaves(load_config(SYSTEMD_CONFIG))
    defaults = _leaves(Config())
    changed = {key: value for key, value in installed.items() if value != defaults[key]}
    assert changed == INSTALLED_CHOICES
    data = tomllib.loads(SYSTEMD_CONFIG.read_text(encoding="utf-8"))
    documented = {f"{section}.{key}" for section, table in data.items() for key in table}
    assert documented == set(_leaves(Config())), "systemd/sepa-gateway.toml must show every setting"


def test_plain_gates_on_a_network_address_without_security_are_logged_as_insecure(gateway_command) -> None:
    from tools.launcher import launch_gateway

    for host, warned in (("0.0.0.0", True), ("127.0.0.1", False)):
        running = launch_gateway("--host", host)
        try:
            time.sleep(0.2)
            assert any("INSECURE" in line for line in running.stderr_lines) is warned, running.stderr_lines
        finally:
            assert running.stop() == 0


@pytest.mark.parametrize(
    ("toml", "host"),
    [
        ("[security]\nenabled = true\n", "127.0.0.1"),  # a pre-security file upgraded: served the LAN, read-write
        ("[security]\nenabled = true\n[http]\nport = 8000\n", "127.0.0.1"),
        ('[security]\nenabled = true\n[http]\nhost = "0.0.0.0"\n', "0.0.0.0"),  # asked for: logged as INSECURE
        ("[http]\nport = 8000\n", "0.0.0.0"),
    ],
)
def test_with_security_on_the_plain_gates_stay_on_this_board_unless_told(tmp_path: Path, toml: str, host: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(toml, encoding="utf-8")
    assert load_config(path).http.host == host


def test_plain_gates_on_a_network_address_are_logged_as_insecure_with_security_too(
    gateway_command, tmp_path: Path
) -> None:
    from tools.launcher import launch_gateway

    path = tmp_path / "gateway.toml"
    path.write_text("[security]\nenabled = true\n", encoding="utf-8")
    running = launch_gateway("--host", "0.0.0.0", config=path, data_dir=tmp_path / "data", mqtt=False)
    try:
        time.sleep(0.2)
        assert any("INSECURE" in line for line in running.stderr_lines), running.stderr_lines
    finally:
        assert running.stop() == 0


def coap_pong(address: str, port: int) -> bool:
    """Whether a CoAP ping (an empty confirmable message) to address:port gets its reset back."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.settimeout(2)
        probe.sendto(b"\x40\x00\x12\x34", (address, port))
        try:
            return probe.recvfrom(64)[0][:4] == b"\x70\x00\x12\x34"
        except OSError:  # a timeout, or ICMP port unreachable
            return False


def reaches(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return False
    return True


def test_coap_follows_the_plain_gates_host_named_in_the_file(tmp_path: Path) -> None:
    """[security] off and `[http] host = "127.0.0.1"`: CoAP stayed on "::", and a LAN host could POST
    /q and read every graph (an attack pass). It now listens where the plain gates do, as `--host` does."""
    from tests.support.coap import host_address
    from tools.launcher import launch_gateway

    lan = host_address()
    path = tmp_path / "gateway.toml"
    for toml, coap_on_lan in (('[http]\nhost = "127.0.0.1"\n', False), ("[http]\nport = 8000\n", True)):
        path.write_text(toml, encoding="utf-8")
        running = launch_gateway(config=path, host=None, mqtt=False, coap=True)
        try:
            port = urlsplit(running.coap_url).port
            assert port is not None and coap_pong("127.0.0.1", port)
            assert coap_pong(lan, port) is coap_on_lan, (toml, running.stderr_lines)
        finally:
            assert running.stop() == 0


def test_run_secure_keeps_the_plain_gates_on_this_board(tmp_path: Path) -> None:
    """`run --secure` set [security] after the file was loaded: the plain gates stayed on 0.0.0.0 and
    an update from the LAN address got 200 (an attack pass). Now as the file's `enabled = true`."""
    from tests.support.coap import host_address
    from tools.launcher import launch_gateway

    lan = host_address()
    running = launch_gateway("--secure", host=None, data_dir=tmp_path / "data", mqtt=False)
    try:
        assert running.https_url and reaches("127.0.0.1", running.http_port)
        assert not reaches(lan, running.http_port) and not reaches(lan, running.ws_port)
        assert reaches(lan, urlsplit(running.https_url).port or 0)  # the secure gates, on every address
    finally:
        assert running.stop() == 0


@pytest.mark.parametrize(
    ("toml", "coap_host"),
    [
        ('[http]\nhost = "127.0.0.1"\n', "127.0.0.1"),
        ('[http]\nhost = "::1"\n', "::1"),
        ('[http]\nhost = "localhost"\n', "127.0.0.1"),
        ('[http]\nhost = "0.0.0.0"\n', "::"),
        ("[http]\nport = 8000\n", "::"),
        ('[http]\nhost = "127.0.0.1"\n[coap]\nhost = "::"\n', "::"),  # named: kept
        ('[http]\nhost = "127.0.0.1"\n[security]\nenabled = true\n', "::"),  # network peers use OSCORE
    ],
)
def test_coap_host_left_unnamed_follows_the_plain_gates_without_security(
    tmp_path: Path, toml: str, coap_host: str
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(toml, encoding="utf-8")
    assert load_config(path).adapter("coap").host == coap_host


def test_coap_cannot_follow_a_host_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[http]\nhost = "gw.plant.example"\n', encoding="utf-8")
    assert cli_main(["check-config", str(path)]) == 2
    assert f"{path}:2: coap.host must be named (an IP address)" in capsys.readouterr().err


def test_an_adapter_that_cannot_start_is_one_line_and_exit_2(tmp_path: Path, gateway_command: list[str]) -> None:
    """A TLS file MQTT cannot load (here not PEM) passes check-config (the file is there): its
    MqttError escaped as a 45-line traceback at start, systemd restarting the gateway in a loop."""
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    path = tmp_path / "gateway.toml"
    path.write_text(f'[mqtt]\nhost = "127.0.0.1"\ntls = true\ntls_ca = "{not_pem}"\n', encoding="utf-8")
    done = subprocess.run(
        [*gateway_command, "run", "--config", str(path), *LOCAL, "--no-coap"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    line = assert_one_line_exit_2(done, "mqtt: cannot load the TLS files")
    assert "mqtt: mqtt:" not in line


def test_an_address_the_board_does_not_hold_yet_is_exit_1_for_systemd_to_retry(gateway_command: list[str]) -> None:
    """The installed unit does not restart exit 2 (a refused start: retried every ~3 s for ever),
    but an address the board does not hold yet (DHCP still at work at boot) may be there at the next
    try: exit 1, which it restarts. 192.0.2.1 is TEST-NET-1, on no interface."""
    done = subprocess.run(
        [*gateway_command, "run", "--host", "192.0.2.1", *LOCAL[2:], "--no-mqtt", "--no-coap"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert done.stderr.splitlines()[-1].startswith("sepa-gateway: cannot listen on 192.0.2.1:0: "), done.stderr
