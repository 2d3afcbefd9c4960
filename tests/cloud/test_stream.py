"""The Spark jobs on a real local session: batches go through the HTTPS endpoint, the streaming job
(available-now) turns them into the Parquet table, the statistics job summarises it.

The tests of this module share one pipeline (one landing directory, table and checkpoint); the last
one adds batches and runs the stream again, so it stays last."""

from __future__ import annotations

import datetime
import gzip
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from cloud import cli, stream
from cloud.settings import LandingSettings
from gateway.shipper import contract
from tests.cloud.cloud_support import TOKEN, LandingServer, batch, ndjson, parse_time, record

DOOR = "http://example.org/property/door"
REPOSITORY = Path(__file__).resolve().parents[2]


@dataclass
class Pipeline:
    landing: LandingServer
    table: str
    checkpoint: str
    out: str
    stored: dict[str, dict[str, Any]] = field(default_factory=dict)
    summaries: list[dict[str, int]] = field(default_factory=list)

    def upload(self, batch_id: str, records: list[dict[str, Any]], body: bytes | None = None) -> None:
        reply = self.landing.client().put(batch_id, body if body is not None else batch(records))
        assert reply.status == 201, reply.body
        for item in records:
            self.stored.setdefault(item["id"], item)

    def run(self, spark: Any) -> list[dict[str, int]]:
        options = stream.StreamOptions(
            landing=self.landing.settings.landing_dir.as_uri(),
            table=self.table,
            checkpoint=self.checkpoint,
            available_now=True,
            state_partitions=2,
        )
        summaries = stream.run(stream.start(spark, options), poll_seconds=1.0)
        self.summaries += summaries
        return summaries

    def rows(self, spark: Any) -> list[dict[str, Any]]:
        from pyspark.sql import functions as F

        table = spark.read.parquet(self.table)
        micros = table.withColumns({"rt_us": F.unix_micros("result_time"), "st_us": F.unix_micros("source_time")})
        return [row.asDict() for row in micros.collect()]


def _micros(text: str | None) -> int | None:
    if text is None:
        return None
    moment = parse_time(text)
    return (moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(microseconds=1)


def _hand_placed_files(directory: Path) -> None:
    """Files the endpoint never wrote: one with junk keys and bad lines, and names Spark must skip."""
    junk_lines = [
        json.dumps(record(30) | {"extra": 1, "nested": {"a": [1, 2]}}).encode(),
        b"this is not json",
        json.dumps(record(31, result_time="2026-11-22 18:30:00")).encode(),
        json.dumps(record(32, literal="open")).encode(),
    ]
    (directory / "junk.json.gz").write_bytes(gzip.compress(b"\n".join(junk_lines) + b"\n"))
    (directory / ".hidden.tmp").write_bytes(batch([record(40)]))
    (directory / ".in-flight.json.gz").write_bytes(batch([record(41)]))
    (directory / "_underscore.json.gz").write_bytes(batch([record(42)]))
    (directory / "notes.txt").write_bytes(ndjson([record(43)]))


@pytest.fixture(scope="module")
def pipeline(
    spark: Any, certificate: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    base = tmp_path_factory.mktemp("pipeline")
    cert, key = certificate
    settings = LandingSettings(base / "landing", (TOKEN,), "127.0.0.1", 0, cert, key)
    with LandingServer(settings) as server:
        uris = {name: (base / name).as_uri() for name in ("table", "checkpoint", "stats")}
        pipeline = Pipeline(server, uris["table"], uris["checkpoint"], uris["stats"])
        pipeline.upload("gw-1.0001", [record(n) for n in range(10)])
        pipeline.upload("gw-1.0002", [record(n) for n in range(10, 15)] + [record(3), record(4), record(12)])
        door = [
            record(n, property=DOOR, value=None, unit=None, literal="open", source_time=f"2026-11-22T18:29:{n}.500000Z")
            for n in range(15, 17)
        ]
        yesterday = [record(n, result_time=f"2026-11-21T23:59:59.99999{n - 17}Z") for n in range(17, 19)]
        members = batch(door[:1]) + batch(door[1:] + yesterday)
        pipeline.upload("gw-1.0003", door + yesterday, body=members)
        _hand_placed_files(settings.landing_dir)
        pipeline.stored[record(30)["id"]] = record(30)
        pipeline.run(spark)
        yield pipeline


def test_table_holds_every_observation_exactly_once(pipeline: Pipeline, spark: Any) -> None:
    rows = pipeline.rows(spark)
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(pipeline.stored)
    (first,) = pipeline.summaries
    assert first["duplicates"] == 3


def test_rows_keep_every_field_exactly(pipeline: Pipeline, spark: Any) -> None:
    """Values, microseconds of both times, IRIs with their special characters (partition columns)."""
    for row in pipeline.rows(spark):
        sent = pipeline.stored[row["id"]]
        for name in ("sensor", "property", "feature", "value", "literal", "unit", "sequence", "gateway", "source"):
            assert row[name] == sent.get(name), (name, row, sent)
        assert row["rt_us"] == _micros(sent["result_time"])
        assert row["st_us"] == _micros(sent.get("source_time"))
        assert row["date"] == datetime.date.fromisoformat(sent["result_time"][:10])


def test_table_is_partitioned_by_date_and_property(pipeline: Pipeline) -> None:
    table = Path(pipeline.table.removeprefix("file://"))
    partitions = {str(path.parent.relative_to(table)) for path in table.rglob("*.parquet")}
    temperature = quote(record(0)["property"], safe="")
    assert partitions == {
        f"date=2026-11-22/property={temperature}",
        f"date=2026-11-21/property={temperature}",
        f"date=2026-11-22/property={quote(DOOR, safe='')}",
    }


def test_schema_is_the_contract_whatever_the_files_hold(pipeline: Pipeline, spark: Any) -> None:
    """A file with extra keys cannot add columns; bad lines in it are dropped and counted; hidden,
    underscore and non-.json.gz files are never read."""
    schema = {f.name: f.dataType.simpleString() for f in spark.read.parquet(pipeline.table).schema.fields}
    expected = {name: "string" for name in contract.FIELDS} | {"value": "double", "sequence": "bigint"}
    expected |= {"result_time": "timestamp", "source_time": "timestamp", "date": "date"}
    assert schema == expected
    assert list(contract.FIELDS) == list(stream.COLUMNS)
    ids = {row["id"] for row in pipeline.rows(spark)}
    assert record(30)["id"] in ids
    assert not ids & {record(n)["id"] for n in (31, 32, 40, 41, 42, 43)}
    assert pipeline.summaries[0]["rejected"] == 3


def _expected_stats(records: list[dict[str, Any]], day: str | None = None) -> dict[tuple[str, ...], tuple]:
    groups: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for item in records:
        if item.get("value") is not None and (day is None or item["result_time"].startswith(day)):
            key = (item["result_time"][:10], item["sensor"], item["property"], item["unit"])
            groups[key].append(item["value"])
    return {key: (len(v), min(v), max(v), statistics.fmean(v)) for key, v in groups.items()}


def _stats_rows(spark: Any, out: str) -> dict[tuple[str, ...], tuple]:
    rows = spark.read.parquet(out).collect()
    return {
        (row["date"].isoformat(), row["sensor"], row["property"], row["unit"]): (
            row["count"],
            row["min"],
            row["max"],
            pytest.approx(row["mean"], rel=1e-12),
        )
        for row in rows
    }


def test_stats_job_matches_python(pipeline: Pipeline, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["stats", "--table", pipeline.table, "--out", pipeline.out, "--show", "3"]) == 0
    expected = _expected_stats(list(pipeline.stored.values()))
    assert len(expected) == 5
    assert _stats_rows(spark, pipeline.out) == expected
    assert f"{len(expected)} rows written" in capsys.readouterr().out


def test_stats_for_one_day_leave_the_other_days(pipeline: Pipeline, spark: Any) -> None:
    assert cli.main(["stats", "--table", pipeline.table, "--out", pipeline.out]) == 0
    assert cli.main(["stats", "--table", pipeline.table, "--out", pipeline.out, "--date", "2026-11-21"]) == 0
    assert _stats_rows(spark, pipeline.out) == _expected_stats(list(pipeline.stored.values()))
    out = Path(pipeline.out.removeprefix("file://"))
    assert sorted(p.name for p in out.glob("date=*")) == ["date=2026-11-21", "date=2026-11-22"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--landing", "file:///nonexistent/landing"], "Path does not exist"),
        (["--watermark", "2 hourz"], "2 hourz"),
    ],
    ids=["missing-landing", "bad-watermark"],
)
def test_stream_refuses_bad_arguments_in_one_line(
    pipeline: Pipeline, tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--landing", pipeline.landing.settings.landing_dir.as_uri(), "--table", (tmp_path / "t").as_uri()]
    base += ["--checkpoint", (tmp_path / "c").as_uri(), "--available-now"]
    assert cli.main(["stream", *base, *args]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("sepa-cloud stream: ") and message in error
    assert not (tmp_path / "t").exists()


def test_stats_refuses_a_missing_table(tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["stats", "--table", (tmp_path / "none").as_uri(), "--out", (tmp_path / "o").as_uri()]) == 2
    assert "Path does not exist" in capsys.readouterr().err


def test_a_damaged_file_in_the_landing_directory_does_not_stop_the_stream(
    landing: LandingServer, spark: Any, tmp_path: Path
) -> None:
    """A gzip cut short and an empty file (a copy interrupted, a disk's damage: the endpoint never
    writes either) beside the endpoint's batches: the stream goes on, then and at its next run."""
    landing.client().put("gw-1.0001", batch([record(n) for n in range(3)]))
    directory = landing.settings.landing_dir
    (directory / "copied.json.gz").write_bytes(batch([record(n) for n in range(10, 400)])[:200])
    (directory / "empty.json.gz").write_bytes(b"")
    uris = {name: (tmp_path / name).as_uri() for name in ("table", "checkpoint")}
    pipeline = Pipeline(landing, uris["table"], uris["checkpoint"], (tmp_path / "stats").as_uri())
    pipeline.run(spark)
    assert {record(n)["id"] for n in range(3)} <= {row["id"] for row in pipeline.rows(spark)}
    pipeline.upload("gw-1.0002", [record(n) for n in range(3, 6)])
    pipeline.run(spark)
    assert {record(n)["id"] for n in range(6)} <= {row["id"] for row in pipeline.rows(spark)}


def test_sigterm_to_the_process_group_stops_the_stream_cleanly(
    landing: LandingServer, spark: Any, tmp_path: Path
) -> None:
    """systemd's stop (KillMode=control-group), `kill -- -PGID`, a container's stop signal the whole
    process group: the JVM shuts its SparkContext down by itself while the job asks the query to
    stop. Both are the stop asked for: exit 0 and the stop logged, no traceback."""
    landing.client().put("a", batch([record(n) for n in range(4)]))
    table, checkpoint = (tmp_path / "table").as_uri(), (tmp_path / "checkpoint").as_uri()
    command = [sys.executable, "-m", "cloud.stream", "--master", "local[1]", "--trigger-seconds", "1"]
    command += ["--landing", landing.settings.landing_dir.as_uri(), "--table", table, "--checkpoint", checkpoint]
    command += ["--state-partitions", "1"]
    environ = os.environ | {"SPARK_LOCAL_IP": "127.0.0.1"}
    log = tmp_path / "stream.log"
    with open(log, "wb") as output:
        job = subprocess.Popen(command, env=environ, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while "msg=micro-batch" not in log.read_text(errors="replace") and job.poll() is None:
                assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
                time.sleep(0.5)
            os.killpg(job.pid, signal.SIGTERM)
            code = job.wait(120)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    # a traceback of this process starts its line; the JVM's own ERROR lines, which stopping it mid
    # micro-batch writes (in every run), may quote one of the batch's Python callback after an
    # exception's name. py4j's "Exception while sending command." tracebacks, once the JVM is gone
    # (CI, stop 73), are the next test's
    own_tracebacks = [line for line in text.splitlines() if line.startswith("Traceback")]
    assert not own_tracebacks and 'msg="stream stopped"' in text, text[-3000:]
    assert sorted(row["sequence"] for row in spark.read.parquet(table).collect()) == [1, 2, 3, 4]


def test_after_a_stop_signal_py4j_s_tracebacks_of_its_lost_jvm_are_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    """py4j logs a send that fails with ``logging.exception`` on the root logger, traceback and all,
    before raising: after the stop signal, the JVM stopping by itself made two of them at the job's
    stop (CI, stop 73). Here from py4j's own file name; the job's and others' records still pass."""
    flag = stream._StopFlag()
    py4j_send = compile(
        "import logging\ntry:\n    raise ConnectionResetError(104, 'reset')\n"
        "except OSError:\n    logging.exception('Exception while sending command.')\n",
        os.path.join(os.sep, "venv", "site-packages", "py4j", "java_gateway.py"),
        "exec",
    )
    try:
        flag._handle(signal.SIGTERM, None)
        exec(py4j_send, {})
        logging.getLogger("other").warning("still shown")
    finally:
        logging.getLogger().removeFilter(stream._not_from_py4j)
        logging.getLogger("py4j").setLevel(logging.NOTSET)
    assert [record.getMessage() for record in caplog.records] == ["still shown"]


def test_readme_spark_submit_command(landing: LandingServer, spark: Any, tmp_path: Path) -> None:
    """The README's command, run as written (spark-submit of the pyspark wheel, the file path)."""
    landing.client().put("a", batch([record(n) for n in range(4)]))
    landing.client().put("b", batch([record(n) for n in range(2, 6)]))
    spark_submit = Path(sys.executable).parent / "spark-submit"
    assert spark_submit.exists(), f"{spark_submit} missing: pip install '.[cloud]' installs it"
    table, checkpoint = (tmp_path / "table").as_uri(), (tmp_path / "checkpoint").as_uri()
    command = [str(spark_submit), "--master", "local[1]", str(REPOSITORY / "cloud" / "stream.py")]
    command += ["--landing", landing.settings.landing_dir.as_uri(), "--table", table, "--checkpoint", checkpoint]
    command += ["--available-now", "--state-partitions", "1"]
    environ = os.environ | {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    output = done.stdout + done.stderr  # spark-submit passes the Python driver's stderr on to its stdout
    assert done.returncode == 0, output[-3000:]
    assert "msg=micro-batch batch=0 rows=8 rejected=0 duplicates=2 late=0" in output
    assert sorted(row["sequence"] for row in spark.read.parquet(table).collect()) == [1, 2, 3, 4, 5, 6]


def test_second_run_appends_only_new_observations(pipeline: Pipeline, spark: Any) -> None:
    """Runs last: the checkpoint resumes after the files already read, the de-duplication state still
    knows the first run's ids, and an observation with an old result_time (a gateway's backlog after
    a long outage) is kept: the watermark is on landing time, so it is not late."""
    before = {row["id"] for row in pipeline.rows(spark)}
    backlog = record(53, result_time="2026-11-22T15:00:00.000000Z")
    pipeline.upload("gw-1.0004", [record(n) for n in range(50, 53)] + [record(5)])
    pipeline.landing.client().put("gw-1.0005", batch([backlog]))
    (summary,) = pipeline.run(spark)
    after = [row["id"] for row in pipeline.rows(spark)]
    assert len(after) == len(set(after))
    assert set(after) - before == {record(n)["id"] for n in range(50, 54)}
    assert (summary["rows"], summary["duplicates"], summary["late"]) == (5, 1, 0)
