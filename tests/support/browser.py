"""Real Chromium for the tests (Debian `chromium` + `chromium-driver`, driven by selenium).

Shared by every test that needs a browser: a page is what a user sees, and a page is also what an
attacker gets the user's browser to run. A missing browser fails the test with what to install,
never skips it.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
MISSING = "Chromium is not installed: apt-get install chromium chromium-driver (tests/run.sh installs them)"
# what this machine needs: no sandbox as root, no GPU, and none of the background traffic to hosts
# that a closed network refuses
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[object]:
    """A headless Chromium (a selenium WebDriver) with a fresh profile; quit on the way out."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail(MISSING, pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="sepa-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.set_page_load_timeout(30)
            yield driver
        finally:
            driver.quit()
