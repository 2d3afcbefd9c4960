"""Real Chromium for the tests (tools/browser.py). A missing browser fails the test with what to
install, never skips it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tools import browser
from tools.browser import console_errors, trusting

__all__ = ["chromium", "console_errors", "trusting"]


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 900, flags: tuple[str, ...] = ()) -> Iterator[Any]:
    """tools.browser.chromium, or the test fails saying what to install."""
    problem = browser.missing()
    if problem:
        pytest.fail(problem, pytrace=False)
    with browser.chromium(width, height, flags) as driver:
        yield driver
