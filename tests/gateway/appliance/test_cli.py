"""The `sepa-gateway` command itself: `--version` as an operator types it.

Protects: the version printed is the installed package's, which is pyproject.toml's (one source of
truth), and it needs no subcommand.
"""

from __future__ import annotations

import subprocess
import tomllib
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_version_is_the_packages(gateway_command: list[str]) -> None:
    done = subprocess.run([*gateway_command, "--version"], capture_output=True, text=True, timeout=60)
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (done.returncode, done.stdout, done.stderr) == (0, f"sepa-gateway {declared}\n", "")
    assert version("sepa-gateway") == declared
