"""tests/support/leftovers.py, run by a pytest of its own on small test files: a process a test
leaves running fails the run and is killed; the processes of fixtures, ended at their teardown or
started before the tests, do not."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FIXTURES = """
import subprocess
import sys
import pytest

SLEEP = [sys.executable, "-c", "import time; time.sleep(300)", "leftovers-canary"]


@pytest.fixture(scope="session")
def shared():
    # like pyspark's JVM: never ended by the fixture, it ends when the interpreter does (its stdin closes)
    reader = [sys.executable, "-c", "import sys; sys.stdin.read()", "leftovers-canary"]
    process = subprocess.Popen(reader, stdin=subprocess.PIPE)
    yield process


@pytest.fixture(scope="module")
def module_wide():
    process = subprocess.Popen(SLEEP)
    yield process
    process.kill()
    process.wait()
"""


def run(tmp_path: Path, tests: str) -> subprocess.CompletedProcess[str]:
    """pytest with the guard alone (-p) on a file of `tests`; its output and exit code."""
    (tmp_path / "conftest.py").write_text(FIXTURES)
    (tmp_path / "test_it.py").write_text(tests)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.support.leftovers", "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*command, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def canaries() -> list[str]:
    """The sleepers of these runs still alive anywhere (a left one belongs to init once pytest exits)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"leftovers-canary" in cmdline and b"pytest" not in cmdline:
                found.append(entry.name)
    return found


def test_a_process_a_failing_test_leaves_fails_the_run_and_is_killed(tmp_path: Path) -> None:
    done = run(
        tmp_path,
        "import subprocess\nfrom conftest import SLEEP\n\n"
        "def test_leaks():\n    subprocess.Popen(SLEEP)\n    assert False, 'on purpose'\n\n"
        "def test_leaks_and_passes():\n    subprocess.Popen(SLEEP)\n",
    )
    assert done.returncode == 1, done.stdout
    assert "processes left running by tests (killed)" in done.stdout, done.stdout
    assert "test_it.py::test_leaks left pid" in done.stdout, done.stdout
    assert "test_it.py::test_leaks_and_passes left pid" in done.stdout, done.stdout
    time.sleep(0.5)  # the children are killed and reaped before pytest exits; this is margin only
    assert canaries() == []


def test_processes_of_fixtures_and_those_ended_by_the_test_pass(tmp_path: Path) -> None:
    done = run(
        tmp_path,
        "import multiprocessing\nimport subprocess\nfrom conftest import SLEEP\n\n"
        "def test_asks_late(request):\n    assert request.getfixturevalue('module_wide').poll() is None\n\n"
        "def test_uses_fixtures(shared, module_wide):\n    assert shared.poll() is None\n\n"
        "def test_ends_its_own():\n    process = subprocess.Popen(SLEEP)\n    process.kill()\n    process.wait()\n\n"
        # the first semaphore of the interpreter: multiprocessing's resource tracker (tools/reeval's test)
        "def test_makes_a_semaphore():\n    multiprocessing.get_context('spawn').Event().set()\n",
    )
    assert done.returncode == 0, done.stdout
    assert "left pid" not in done.stdout, done.stdout
    assert "4 passed" in done.stdout, done.stdout
