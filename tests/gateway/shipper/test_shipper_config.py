"""The [shipper] section: what `sepa-gateway run` refuses in one line with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.appliance.cli import main as cli_main

LOCAL = ["--host", "127.0.0.1", "--http-port", "0", "--ws-port", "0", "--no-mqtt"]


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ('url = "http://cloud.example"\n', "https://"),
        ('url = "https://cloud.example"\ntoken_file = "/nonexistent/token"\n', "token_file"),
        ('url = "https://cloud.example"\n', "bearer token"),
        ('url = "https://cloud.example"\ntoken_file = "{token}"\n', "spool_dir is required"),  # in-memory store
        # what check-config passed and the first upload failed on (a password was logged at start)
        ('url = "https://gw:hunter2@cloud.example"\ntoken_file = "{token}"\n', "credentials"),
        ('url = "https://[::1"\ntoken_file = "{token}"\n', "not a valid URL"),
        ('url = "https://cloud.example:99999"\ntoken_file = "{token}"\n', "not a valid URL"),
        ('url = "https://"\ntoken_file = "{token}"\n', "names no host"),
        ('url = "https://cloud.example\\r\\nX: y"\ntoken_file = "{token}"\n', "control character"),
        ('url = "https://cloud.example/?a=1"\ntoken_file = "{token}"\n', "query"),
        ('url = "https://cloud.example"\ntoken_file = "{token}"\nuploads_in_flight = 20000000\n', "1..4"),
        ('url = "https://cloud.example"\ntoken_file = "{token}"\nuploads_in_flight = 0\n', "1..4"),
    ],
)
def test_a_shipper_that_cannot_work_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, section: str, fragment: str
) -> None:
    monkeypatch.delenv("SEPA_GATEWAY_SHIPPER_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    config = tmp_path / "gateway.toml"
    config.write_text("[shipper]\nenabled = true\n" + section.format(token=token))
    assert cli_main(["run", "--config", str(config), *LOCAL]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "secret-token" not in err and "hunter2" not in err
