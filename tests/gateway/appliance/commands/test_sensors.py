"""`sepa-gateway sensors list`, run as the installer runs it: into a pipe whose reader may be gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]


@pytest.mark.parametrize("coap", [False, True])
def test_list_into_a_pipe_its_reader_left_is_exit_0_and_silent(tmp_path: Path, coap: bool) -> None:
    """Attack pass: the installer's `sepa-gateway sensors list | grep -qx sepa-gateway` under
    pipefail sometimes failed with `[Errno 32] Broken pipe` (grep -q leaves at its first match),
    and the installer then reset the gateway's own MQTT password. Here the reader is gone before
    the command starts (the read end closed first), so every write meets EPIPE."""
    passwords = tmp_path / "sepa-gateway.passwd"
    passwords.write_text("".join(f"sensor{n}:$7$hash\n" for n in range(3)))
    coap_dir = tmp_path / "coap"
    for n in range(3):
        (coap_dir / f"sensor{n}").mkdir(parents=True)
        (coap_dir / f"sensor{n}" / "settings.json").write_text("{}")
    options = ["--coap", "--coap-dir", str(coap_dir)] if coap else ["--password-file", str(passwords)]
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [*CLI, "sensors", *options, "list"], stdout=writer, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (0, "")
