"""Real Chromium (Debian `chromium` + `chromium-driver`, driven by selenium), for the tests and the
dashboard benchmark: a page is what a user sees, and a page is also what an attacker gets the
user's browser to run."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def missing() -> str | None:
    """Why no browser can run here, or None."""
    return None if shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER) else MISSING


@contextlib.contextmanager
def chromium(
    width: int = 1280,
    height: int = 900,
    flags: tuple[str, ...] = (),
    nice: int = 0,
    idle: bool = False,
    cpus: str = "",
) -> Iterator[Any]:
    """A headless Chromium (a selenium WebDriver) with a fresh profile and these extra `flags`;
    quit on the way out. RuntimeError when it is not installed. `nice`: run the browser (and every
    process it starts) at that niceness, so that on a shared machine it yields the cores to what
    is measured beside it; `idle`: under SCHED_IDLE, so that it runs only on time nothing else wants;
    `cpus`: only on these CPUs (a `taskset -c` list)."""
    problem = missing()
    if problem:
        raise RuntimeError(problem)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="sepa-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        if nice or idle or cpus:
            wrapper = Path(profile) / "chromium-wrapper"
            prefix = "chrt --idle 0" if idle else f"nice -n {int(nice)}"
            if cpus:
                if not all(part.isdigit() for part in cpus.replace("-", ",").split(",")):
                    raise ValueError(f"not a CPU list: {cpus!r}")
                prefix = f"taskset -c {cpus} {prefix}"
            wrapper.write_text(f'#!/bin/sh\nexec {prefix} "{CHROMIUM}" "$@"\n')
            wrapper.chmod(0o700)
            options.binary_location = str(wrapper)
        for flag in (*FLAGS, *flags, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.set_page_load_timeout(30)
            yield driver
        finally:
            driver.quit()


def trusting(certificate: Path) -> tuple[str, ...]:
    """Flags that make Chromium trust this certificate's key and no other: what an operator does by
    importing the gateway's tls-cert.pem (compared by its fingerprint), without touching the system
    store. The key is pinned by the SHA-256 of its SubjectPublicKeyInfo."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    cert = x509.load_pem_x509_certificate(certificate.read_bytes())
    spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return (f"--ignore-certificate-errors-spki-list={base64.b64encode(hashlib.sha256(spki).digest()).decode()}",)


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """The browser console's entries at level SEVERE since the last call (a failed load, an exception)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
