"""Where tests write what a person should look at afterwards (screenshots, figures): the fixture
`artifacts`, a folder per test module under `$SEPA_TEST_ARTIFACTS` (default: `artifacts/` in
pytest's base temporary directory, which pytest keeps for the last three runs), and the list of
what was written, printed at the end of the run so that nobody has to look for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_WRITTEN: list[Path] = []


class Artifacts:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, name: str) -> Path:
        """A file to write; it is listed in the run's summary."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / name
        _WRITTEN.append(path)
        return path


@pytest.fixture(scope="module")
def artifacts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    root = os.environ.get("SEPA_TEST_ARTIFACTS")
    base = Path(root) if root else tmp_path_factory.getbasetemp() / "artifacts"
    return Artifacts(base / request.module.__name__.rsplit(".", 1)[-1])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    written = [path for path in _WRITTEN if path.exists()]
    if written:
        terminalreporter.section("test artifacts")
        for path in written:
            terminalreporter.write_line(str(path))
