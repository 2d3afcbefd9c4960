"""What `pip install .` puts in an environment (pyproject.toml), as systemd/install.sh installs it.

Protects: the wheel holds the examples with their JSAP profiles and the dashboard's files, and one of them runs from the
unpacked wheel alone, outside the clone (the installed environment is enough); both commands,
`sepa-gateway` and `sepa-cloud`, are console scripts of the wheel; its version is pyproject's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGED = ("broker", "adapters", "gateway", "cloud", "tools", "ontologies", "examples")


def test_the_wheel_holds_the_examples_and_both_commands(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building in the clone would leave build/ and *.egg-info there
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in PACKAGED:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("sepa_gateway-*.whl")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.name.startswith(f"sepa_gateway-{declared}-")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(site)
    assert {"examples/chat/chat.jsap", "examples/smart_lighting/smart_lighting.jsap"} <= names
    dashboard = {  # every file the dashboard serves, and uPlot's licence beside it
        "gateway/dashboard/" + path.relative_to(ROOT / "gateway" / "dashboard").as_posix()
        for path in (ROOT / "gateway" / "dashboard" / "static").rglob("*")
        if path.is_file()
    }
    assert "gateway/dashboard/static/vendor/uplot/LICENSE" in dashboard and dashboard <= names, dashboard - names
    (entry_points,) = site.glob("sepa_gateway-*.dist-info/entry_points.txt")
    scripts = entry_points.read_text().split("[console_scripts]")[1].split("[")[0]
    assert "sepa-gateway = gateway.appliance.cli:main" in scripts and "sepa-cloud = cloud.cli:main" in scripts
    done = subprocess.run(
        [sys.executable, "-m", "examples.smart_lighting.smart_lighting", "--inprocess", "--delay", "PT0.3S"],
        cwd=tmp_path,  # not the clone: everything comes from the unpacked wheel
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].endswith("saw ON -> OFF: OFF only Δt after the last presence")
