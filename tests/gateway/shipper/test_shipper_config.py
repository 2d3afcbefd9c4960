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
    assert err.count("\n") == 1 and fragment in err and "secret-token" not in err
