"""Waiting in tests for something another thread or process does: one helper for every test."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout: float = 10.0, every: float = 0.02) -> None:
    """Return once `condition()` is true; fail the test past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"condition not met within {timeout:g} s"
        time.sleep(every)
