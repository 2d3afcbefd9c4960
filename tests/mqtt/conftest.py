from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from mqtt_support import Mosquitto, missing_tools  # noqa: E402


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
