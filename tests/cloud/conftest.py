"""Fixtures of the cloud tests: a certificate, the landing endpoint over HTTPS, one real local Spark session.

Spark needs Java: without it the Spark tests FAIL with the fix, they are never skipped."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud.settings import LandingSettings
from tests.cloud.cloud_support import TOKEN, LandingServer, make_certificate

MAX_BATCH_BYTES = 64 * 1024
NO_JAVA = (
    "Java 17+ is needed by the Spark tests and was not found (JAVA_HOME / PATH): "
    "apt-get install openjdk-17-jre-headless (tests/run.sh installs it)"
)


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def landing_settings(tmp_path: Path, certificate: tuple[Path, Path]) -> LandingSettings:
    cert, key = certificate
    return LandingSettings(
        landing_dir=tmp_path / "landing",
        tokens=(TOKEN, "second-token"),
        host="127.0.0.1",
        port=0,
        cert=cert,
        key=key,
        max_batch_bytes=MAX_BATCH_BYTES,
    )


@pytest.fixture
def landing(landing_settings: LandingSettings) -> Iterator[LandingServer]:
    with LandingServer(landing_settings) as server:
        yield server


def java_problem() -> str | None:
    """Why Spark cannot start here, or None."""
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if java is None or not Path(java).exists():
        return NO_JAVA
    version = subprocess.run([str(java), "-version"], capture_output=True, text=True, check=False).stderr
    return None if version else NO_JAVA


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One local Spark session for every cloud test (its start is the big fixed cost)."""
    problem = java_problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    from pyspark.sql import SparkSession

    scratch = tmp_path_factory.mktemp("spark")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("sepa-cloud-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", str(scratch / "local"))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.driver.memory", "1g")
        .config("spark.log.level", "ERROR")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    yield session
    session.stop()
    # py4j logs its connection closing at INFO from __del__, at interpreter exit, after pytest has
    # closed the stream its log capture wrote to: a "Logging error" traceback at the end of every run
    logging.getLogger("py4j").setLevel(logging.WARNING)
