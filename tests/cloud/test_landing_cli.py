"""``sepa-cloud landing`` as a real process: TLS or plain HTTP, tokens from file and environment,
clean shutdown on SIGTERM, one-line errors with exit code 2."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cloud.tokens import TOKENS_ENV, TokenError, load_tokens
from tests.cloud.cloud_support import Client, batch, record
from tools.launcher import free_port

SEPA_CLOUD = [sys.executable, "-m", "cloud.cli"]


def _environment(tokens: str | None) -> dict[str, str]:
    environ = {key: value for key, value in os.environ.items() if key != TOKENS_ENV}
    if tokens is not None:
        environ[TOKENS_ENV] = tokens
    return environ


@contextmanager
def running(
    args: list[str], tokens: str | None, port: int, host: str | None = "127.0.0.1"
) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [*SEPA_CLOUD, "landing", *(("--host", host) if host else ()), "--port", str(port), *args],
        env=_environment(tokens),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"sepa-cloud landing exited {process.returncode}: {process.stderr.read()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_https_with_token_file_then_clean_sigterm(tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    tokens = tmp_path / "tokens"
    tokens.write_text("# shipper of gateway 1\n\n  file-token  \n")
    port = free_port()
    args = ["--landing-dir", str(tmp_path / "landing"), "--cert", str(cert), "--key", str(key)]
    with running([*args, "--token-file", str(tokens)], "env-token", port) as process:
        for token in ("file-token", "env-token"):
            reply = Client(port, cert, token).put(f"b-{token}", batch([record(1)]))
            assert reply.status == 201, reply.body
        assert Client(port, cert, "# shipper of gateway 1").put("b3", batch([record(1)])).status == 401
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        stderr = process.stderr.read()
    assert sorted(p.name for p in (tmp_path / "landing").iterdir()) == ["b-env-token.json.gz", "b-file-token.json.gz"]
    assert "landing endpoint stopping" in stderr
    assert "file-token" not in stderr and "env-token" not in stderr
    assert "https://127.0.0.1" in stderr
    assert stderr.count("tokens not bound to a gateway") == 1 and "count=2" in stderr


def test_tokens_bound_to_gateways_from_file_and_environment(tmp_path: Path) -> None:
    """The normal form, <gateway-slug>:<token>: each token writes its own gateway's batches only, and
    nothing is warned about."""
    tokens = tmp_path / "tokens"
    tokens.write_text("# plant room 1\nplant-room-1:file-secret\n")
    port = free_port()
    mine, theirs = "plant-room-1-0a1b2c3d-000000000001", "gw-b-0a1b2c3d-000000000001"
    with running(
        ["--landing-dir", str(tmp_path / "landing"), "--token-file", str(tokens)], "gw-b:env-secret", port
    ) as process:
        assert Client(port, None, "file-secret").put(theirs, batch([record(1)])).status == 403
        assert Client(port, None, "env-secret").put(mine, batch([record(1)])).status == 403
        assert Client(port, None, "file-secret").put(mine, batch([record(1)])).status == 201
        assert Client(port, None, "env-secret").put(theirs, batch([record(1)])).status == 201
        assert Client(port, None, "plant-room-1:file-secret").put(mine, batch([record(1)])).status == 401
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        stderr = process.stderr.read()
    assert sorted(p.name for p in (tmp_path / "landing").iterdir()) == [f"{theirs}.json.gz", f"{mine}.json.gz"]
    assert "not bound" not in stderr
    assert "secret" not in stderr


def test_plain_http_warns_and_listens_on_loopback_unless_told(tmp_path: Path) -> None:
    """Without TLS the tokens and observations cross the network in clear: a plain landing is for a
    proxy on the same host, so it no longer listens on every address by default (an attack pass)."""
    port = free_port()
    with running(["--landing-dir", str(tmp_path / "landing")], "t1", port, host=None) as process:
        assert Client(port, None, "t1").put("b1", batch([record(1)])).status == 201
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        stderr = process.stderr.read()
    assert "level=warning" in stderr and "plain HTTP" in stderr
    assert f"http://127.0.0.1:{port}/v1/" in stderr


def _fails(args: list[str], tokens: str | None = "t1") -> str:
    """Run the CLI expecting exit code 2 and a one-line error; return that line."""
    done = subprocess.run([*SEPA_CLOUD, *args], env=_environment(tokens), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 or lines[-1].startswith("sepa-cloud"), done.stderr
    return lines[-1]


def test_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _fails(["landing", "--landing-dir", str(tmp_path), "--host", "127.0.0.1", "--port", str(port)])
    assert line.startswith("sepa-cloud: cannot listen on 127.0.0.1:") and "in use" in line


@pytest.mark.parametrize(
    ("args", "tokens", "message"),
    [
        ([], None, "no accepted tokens"),
        (["--token-file", "/nonexistent/tokens"], None, "cannot read the token file"),
        (["--cert", "c.pem"], "t1", "--cert and --key go together"),
        (["--cert", "/nonexistent/c.pem", "--key", "/nonexistent/k.pem"], "t1", "cannot load the TLS certificate"),
        (["--max-batch-bytes", "0"], "t1", "--max-batch-bytes must be at least 1"),
        (["--max-uploads-per-token", "0"], "t1", "--max-uploads-per-token must be at least 1"),
        (["--inflate-ratio", "0"], "t1", "--inflate-ratio must be at least 1"),
        ([], "gw/1:t1", "token number 1: the part before ':' is not a gateway"),
        (["--port", "70000"], "t1", "is not a TCP port"),
        (["--bogus"], "t1", "unrecognized arguments: --bogus"),
    ],
    ids=[
        "no-tokens",
        "token-file",
        "cert-without-key",
        "bad-cert",
        "max-bytes",
        "max-uploads",
        "inflate-ratio",
        "bad-binding",
        "port",
        "unknown-argument",
    ],  # fmt: skip
)
def test_bad_arguments_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], tokens: str | None, message: str
) -> None:
    line = _fails(["landing", "--landing-dir", str(tmp_path / "landing"), "--port", "0", *args], tokens)
    assert message in line
    assert not (tmp_path / "landing").exists()


def test_token_loading(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("a1\n# comment\n\n b2 \na1\n")
    assert load_tokens(str(tokens), {TOKENS_ENV: "c3, ,d4"}) == ("a1", "b2", "c3", "d4")
    assert load_tokens(None, {TOKENS_ENV: "only"}) == ("only",)
    with pytest.raises(TokenError, match="no accepted tokens"):
        load_tokens(None, {TOKENS_ENV: " , "})
    tokens.write_text("two words\n")
    with pytest.raises(TokenError, match="white space") as raised:
        load_tokens(str(tokens), {})
    assert "two words" not in str(raised.value)


@pytest.mark.parametrize("command", ["stream", "stats"])
def test_spark_commands_without_pyspark_say_how_to_get_it(command: str) -> None:
    """A gateway installed without the cloud extra: one line naming the extra, exit 2, no traceback."""
    hide = "import sys; sys.modules['pyspark'] = None; from cloud.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", hide, command, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"sepa-cloud: {command} needs pyspark and Java 17+: pip install 'sepa-gateway[cloud]' "
        "(on an installed gateway: SEPA_GATEWAY_CLOUD=1 ./systemd/install.sh)\n"
    )
