"""Where the gateway's log goes: a rotated file without systemd, stderr (the journal) under it.

Protects: a log file never grows past its size, old files are kept up to their number and the
newest lines are in FILE; a real `sepa-gateway run --log-file` writes its lifecycle lines there and
nothing on stderr; the same command whose stderr is the stream named by JOURNAL_STREAM (as systemd
starts it) writes to stderr and leaves the file alone; a JOURNAL_STREAM that is not our stderr (a
shell started from a service) does not count; a file that cannot be opened is one line, exit 2.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.appliance.logs import KeyValueFormatter, setup_logging, under_journald
from tests.support.leftovers import ended
from tools.launcher import HOST, free_ports

LINE = "x" * 100


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Give the root logger back as it was (pytest's capture handlers included)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level


def test_the_file_is_rotated_at_its_size_keeping_its_backups(
    tmp_path: Path, root_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    log = tmp_path / "sepa-gateway.log"
    assert setup_logging("INFO", str(log), max_bytes=4096, backups=2) == str(log)
    for number in range(200):  # about 30 KB of lines
        logging.getLogger("sepa_gateway").info("line", extra={"number": number, "pad": LINE})
    files = sorted(path.name for path in tmp_path.iterdir())
    assert files == ["sepa-gateway.log", "sepa-gateway.log.1", "sepa-gateway.log.2"]
    assert all((tmp_path / name).stat().st_size <= 4096 for name in files)
    assert "number=199 " in log.read_text().splitlines()[-1]  # the newest line is in FILE
    assert "number=199 " not in (tmp_path / "sepa-gateway.log.1").read_text()


def gateway_with_stderr(
    gateway_command: list[str], stderr: Path, env: dict[str, str], *args: str
) -> tuple[subprocess.Popen[bytes], int]:
    """`sepa-gateway run ARGS` with stderr to a file; returns it once it answers, and its HTTP port."""
    http, ws = free_ports(2)
    argv = [*gateway_command, "run", "--host", HOST, "--http-port", str(http), "--ws-port", str(ws)]
    with stderr.open("wb") as sink:
        process = subprocess.Popen([*argv, "--no-mqtt", "--no-coap", *args], stderr=sink, env=env)
    deadline = time.monotonic() + 30
    try:
        while True:
            assert process.poll() is None, stderr.read_text()
            try:
                with urllib.request.urlopen(f"http://{HOST}:{http}/health/live", timeout=2) as reply:
                    if reply.status == 200:
                        return process, http
            except OSError:
                pass
            assert time.monotonic() < deadline, stderr.read_text()
            time.sleep(0.1)
    except BaseException:  # not answering in time: the caller never gets it to stop
        ended(process)
        raise


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        assert process.wait(20) == 0
    finally:
        ended(process)


def test_run_logs_to_the_file_without_systemd(tmp_path: Path, gateway_command: list[str]) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("JOURNAL_STREAM", "INVOCATION_ID")}
    log, stderr = tmp_path / "sepa-gateway.log", tmp_path / "stderr"
    process, _ = gateway_with_stderr(gateway_command, stderr, env, "--log-file", str(log))
    stop(process)
    text = log.read_text()
    assert 'msg="sepa-gateway serving"' in text and 'msg="sepa-gateway stopped"' in text
    assert stderr.read_text() == ""


def test_run_under_journald_logs_to_stderr(tmp_path: Path, gateway_command: list[str]) -> None:
    log, stderr = tmp_path / "sepa-gateway.log", tmp_path / "stderr"
    stderr.touch()
    status = stderr.stat()
    env = {**os.environ, "JOURNAL_STREAM": f"{status.st_dev}:{status.st_ino}", "INVOCATION_ID": "0" * 32}
    process, _ = gateway_with_stderr(gateway_command, stderr, env, "--log-file", str(log))
    stop(process)
    assert 'msg="sepa-gateway serving"' in stderr.read_text()
    assert not log.exists()


def test_a_journal_stream_that_is_not_our_stderr_does_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    other.touch()
    status = other.stat()
    monkeypatch.setenv("JOURNAL_STREAM", f"{status.st_dev}:{status.st_ino}")
    assert not under_journald()
    monkeypatch.setenv("JOURNAL_STREAM", "nonsense")
    assert not under_journald()


def test_a_log_file_that_cannot_be_opened_is_one_line_and_exit_2(tmp_path: Path, gateway_command: list[str]) -> None:
    env = {key: value for key, value in os.environ.items() if key != "JOURNAL_STREAM"}
    missing = tmp_path / "no" / "such" / "dir" / "gateway.log"
    done = subprocess.run(
        [*gateway_command, "run", "--no-mqtt", "--no-coap", "--log-file", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2
    assert done.stderr == f"sepa-gateway: cannot open the log file {missing}: No such file or directory\n"


@pytest.mark.parametrize(
    "hostile",
    ["\x1b[2J\x1b[1;31mroot", "a\x00b", "line\x0bvertical", "next\x85line", "para\u2028graph", "\u202eevil", "\ud800"],
)
def test_a_value_from_a_client_cannot_draw_on_the_operators_terminal(hostile: str) -> None:
    """A registration's identity went into the log with its ESC sequences, NUL, VT, NEL and U+2028
    as they were: a client could clear or recolour an operator's terminal, or forge a line."""
    record = logging.LogRecord("sepa", logging.WARNING, __file__, 1, "registration refused", None, None)
    record.identity = hostile
    line = KeyValueFormatter().format(record)
    assert line.isprintable(), line
    assert line.encode("utf-8")  # an unpaired surrogate is escaped too: the handler can write it
    assert "identity=" in line
