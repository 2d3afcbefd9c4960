"""The files of the security directory (broker.security.owned_files): written whole, and durable
once written."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-c", "import sys; from gateway.appliance.cli import main; sys.exit(main())"]


def test_a_registration_is_on_disk_rename_included_when_the_command_returns(tmp_path: Path) -> None:
    """`sepa-gateway clients add`, traced: clients.json is renamed into place and the security
    directory synced before the command ends. Without the fix the trace ended with the rename
    (the temporary file synced, never the directory): a power cut within the file system's commit
    interval brought back the previous clients.json, a registration already given out unknown and
    a revocation already confirmed undone."""
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed (tests/run.sh installs it)", pytrace=False)
    security = tmp_path / "security"
    trace = tmp_path / "trace"
    argv = ["strace", "-f", "-y", "-o", str(trace), "-e", "trace=rename,renameat,renameat2,fsync"]
    argv += [*CLI, "clients", "--security-dir", str(security), "add", "dev1", "--read", "*"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    lines = trace.read_text().splitlines()
    renamed = [index for index, line in enumerate(lines) if "rename" in line and '"clients.json"' in line]
    assert renamed, "clients.json was not written"
    directory = re.compile(r"fsync\(\d+<" + re.escape(str(security)) + r">\) = 0")
    synced = [line for line in lines[renamed[-1] :] if directory.search(line)]
    assert synced, "clients.json renamed, its directory never synced"
