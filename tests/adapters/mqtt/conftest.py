from __future__ import annotations

from pathlib import Path

import pytest

from tools.mosquitto import Mosquitto, missing_tools


@pytest.fixture
def mosquitto(tmp_path: Path):
    """A running mosquitto of our own (fails, never skips, when it is not installed)."""
    problem = missing_tools()
    if problem:
        pytest.fail(problem, pytrace=False)
    broker = Mosquitto(tmp_path)
    broker.start()
    yield broker
    broker.stop()
