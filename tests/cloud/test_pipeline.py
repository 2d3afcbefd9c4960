"""Issue 7 end to end: readings published over MQTT become Parquet rows in the Spark table, each
observation exactly once, through outages of the landing endpoint and a kill -9 of the gateway.

Real parts only: our own Mosquitto, `sepa-gateway run` as a process with an on-disk store, the
landing endpoint over HTTPS (self-signed certificate, a bearer token bound to the gateway), a local
Spark session running the streaming job. Exactly once is checked on the table: rows = distinct observation IRIs = the
readings published, with the published values all there.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from cloud.settings import LandingSettings
from tests.cloud.cloud_support import TOKEN
from tests.cloud.pipeline_support import GATEWAY_ID, Mosquitto, Pipeline, wait_for
from tools.launcher import free_port


@pytest.fixture
def pipeline(tmp_path: Path, certificate: tuple[Path, Path]) -> Iterator[Pipeline]:
    from tools.mosquitto import missing_tools

    problem = missing_tools()
    if problem:
        pytest.fail(problem, pytrace=False)
    broker = Mosquitto(tmp_path)
    broker.start()
    cert, key = certificate
    settings = LandingSettings(
        landing_dir=tmp_path / "landing", tokens=(f"{GATEWAY_ID}:{TOKEN}",), host="127.0.0.1", port=free_port(),
        cert=cert, key=key,
    )  # fmt: skip
    run = Pipeline(tmp_path, broker, settings)
    try:
        yield run
    finally:
        run.close()
        broker.stop()


def exactly_once(table, observations: set[str], published: set[float]) -> None:  # type: ignore[no-untyped-def]
    """The table holds every observation of the store once, and every published value is among them.

    Compared with the store rather than with the readings: MQTT QoS 1 is at-least-once, and a reading
    without its own timestamp that the broker delivers twice is two observations at the edge too."""
    counts = table.agg(F.count("*").alias("rows"), F.countDistinct("id").alias("ids")).first()
    assert counts["rows"] == counts["ids"], "duplicate observations in the table"
    ids = {row["id"] for row in table.select("id").collect()}
    assert ids == observations, f"missing {sorted(observations - ids)[:3]}, extra {sorted(ids - observations)[:3]}"
    values = {row["value"] for row in table.select("value").distinct().collect()}
    assert values == published, f"values missing: {sorted(published - values)[:5]}"


def test_100000_readings_end_as_parquet_rows_exactly_once(pipeline: Pipeline, spark) -> None:  # type: ignore[no-untyped-def]
    total = 100_000
    pipeline.start_landing()
    pipeline.start_gateway()
    publishers = pipeline.publish_generic(0, total, processes=2)
    for publisher in publishers:
        assert publisher.wait(600) == 0
    wait_for(lambda: pipeline.drained(total), 600, "100,000 observations to land")
    observations = pipeline.observation_ids()
    assert len(observations) >= total
    assert pipeline.landed_records() == len(observations)  # the landing directory holds each one once already
    metrics = pipeline.metrics()
    assert metrics["sepa_shipper_uploaded_observations"] == len(observations)
    assert metrics["sepa_shipper_upload_failures"] == 0
    assert metrics["sepa_shipper_digest_observations"] > total // 2  # most lines came from batch digests
    table = pipeline.spark_table(spark)
    exactly_once(table, observations, {float(k) for k in range(total)})
    assert {row["property"] for row in table.select("property").distinct().collect()} == {
        "http://w3id.org/sepa-gateway/ns#temperature"
    }


def test_an_outage_of_the_landing_endpoint_loses_and_duplicates_nothing(pipeline: Pipeline, spark) -> None:  # type: ignore[no-untyped-def]
    pipeline.start_gateway()  # the landing endpoint is down
    (publisher,) = pipeline.publish_generic(0, 3000)
    assert publisher.wait(120) == 0
    wait_for(lambda: pipeline.metrics().get("sepa_shipper_backlog_observations") == 3000, 60, "the spool to fill")
    wait_for(lambda: pipeline.metrics().get("sepa_shipper_upload_failures_network", 0) >= 2, 30, "failed uploads")
    assert pipeline.metrics()["sepa_shipper_uploaded_observations"] == 0
    pipeline.start_landing()  # back, on the same port
    (publisher,) = pipeline.publish_generic(3000, 2000)  # and ingestion goes on
    assert publisher.wait(120) == 0
    wait_for(lambda: pipeline.drained(5000), 120, "the backlog to drain")
    observations = pipeline.observation_ids()
    assert pipeline.landed_records() == len(observations)
    exactly_once(pipeline.spark_table(spark), observations, {float(k) for k in range(5000)})


def test_a_gateway_killed_mid_upload_resumes_without_loss_or_duplicate(pipeline: Pipeline, spark) -> None:  # type: ignore[no-untyped-def]
    total = 10_000
    pipeline.start_landing()
    gateway = pipeline.start_gateway()
    publisher = pipeline.publish_senml(0, total)
    wait_for(lambda: pipeline.metrics().get("sepa_shipper_uploaded_segments", 0) >= 2, 120, "uploads under way")
    gateway.stop(signal.SIGKILL)
    killed_at = pipeline.landed_records()
    assert killed_at < total  # the kill came mid-stream
    assert publisher.wait(120) == 0
    pipeline.start_gateway()  # same data directory: store, spool and cursor
    wait_for(lambda: pipeline.stored_observations() == total, 300, "every reading stored")
    wait_for(lambda: pipeline.drained(0) and pipeline.landed_records() >= total, 300, "the rest to land")
    observations = pipeline.observation_ids()
    assert len(observations) == total  # timestamped readings: a redelivery is the same observation
    assert pipeline.landed_records() == total  # not one observation spooled twice
    exactly_once(pipeline.spark_table(spark), observations, {float(k) for k in range(total)})
