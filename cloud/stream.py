"""Spark Structured Streaming job: landing batches -> a Parquet table holding every observation once.

Run it any of these ways (URIs are any Hadoop filesystem: ``file://``, ``hdfs://``, ``s3a://``, or a
plain path)::

    spark-submit --master local[2] cloud/stream.py --landing URI --table URI --checkpoint URI
    python -m cloud.stream --landing URI --table URI --checkpoint URI
    sepa-cloud stream --landing URI --table URI --checkpoint URI [--available-now]

What it does, and why:

* Reads the landing directory as a file stream of JSON lines (``*.json.gz``; hidden temp files are
  skipped by Spark) with an EXPLICIT schema, :data:`RECORD_SCHEMA`, mirroring
  :data:`gateway.shipper.contract.FIELDS`: no inference pass over the files, and a stray file with other keys
  cannot change the table's columns.
* ``ignoreCorruptFiles``: a landing file that does not inflate (a gzip cut short, an empty file: a copy
  interrupted, a disk's damage; the endpoint writes neither) is read up to its damage and the rest
  skipped, with Spark's WARN "Skipped the rest of the content in the corrupted file" naming it.
  Without it, one such file failed the query at every start (FAILED_READ_FILE), and no gateway's
  observations reached the table again until someone removed the file by hand.
* Times are read as strings and parsed with ``try_to_timestamp`` on the one pattern the endpoint
  accepts (:data:`TIME_FORMAT`, microseconds kept); ``try_`` because Spark 4's ANSI mode would
  otherwise fail the whole query on one bad time. The endpoint already refused such records, so
  rows that still break the contract can only come from files put there by hand: they are dropped
  and counted (``rejected`` in the per-batch log line), not guessed at.
* ``withWatermark(_landed).dropDuplicatesWithinWatermark(["id"])`` drops a second copy of an
  observation (a shipper re-upload under another batch id) landing within the watermark delay of the
  first. The watermark is on the time the batch LANDED (its file's modification time, Spark's
  ``_metadata.file_modification_time``), not on result_time: a gateway's backlog after an outage of
  any length holds old result times, and a watermark on them would drop it as late. Landing times
  only grow, so nothing is late unless files are placed by hand with old times (counted: ``late``).
* Writes Parquet partitioned by ``date`` (UTC date of result_time) and ``property`` (the IRI; Spark
  escapes it in the directory name), in append mode with a checkpoint: the file sink's
  ``_spark_metadata`` log plus the checkpoint make the output exactly-once across restarts.
* ``--available-now`` processes what is there and stops (tests, backfills); otherwise it runs every
  ``--trigger-seconds`` until SIGTERM/SIGINT.

This file imports nothing from this package, so ``spark-submit cloud/stream.py`` works whether or not
the package is installed where the driver runs; executors run no Python code of ours.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.listener import StreamingQueryProgress

RECORD_SCHEMA = (
    "id STRING, sensor STRING, property STRING, feature STRING, value DOUBLE, literal STRING, unit STRING, "
    "result_time STRING, source_time STRING, sequence BIGINT, gateway STRING, source STRING, "
    "_corrupt_record STRING"
)
"""The record of :mod:`gateway.shipper.contract` as Spark DDL, plus the column where unparsable lines go."""

TIME_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSX"
COLUMNS = (
    *("id", "sensor", "property", "feature", "value", "literal", "unit"),
    *("result_time", "source_time", "sequence", "gateway", "source"),
)
"""The table's data columns, in the contract's order (``property`` ends up a partition column)."""
REQUIRED = ("id", "sensor", "property", "feature", "sequence", "gateway", "source")
_PARSED = {"result_time": "_result_ts", "source_time": "_source_ts"}
PARTITIONS = ("date", "property")

log = logging.getLogger("cloud.stream")


@dataclass(frozen=True)
class StreamOptions:
    """Where to read, write and keep state, and how often."""

    landing: str
    table: str
    checkpoint: str
    watermark: str = "2 hours"
    trigger_seconds: float = 10.0
    available_now: bool = False
    max_files_per_trigger: int = 64
    state_partitions: int = 4


def observations(spark: SparkSession, options: StreamOptions) -> DataFrame:
    """The streaming DataFrame of valid, de-duplicated observations with their partition columns."""
    raw = (
        spark.readStream.schema(RECORD_SCHEMA)
        .option("pathGlobFilter", "*.json.gz")
        .option("maxFilesPerTrigger", options.max_files_per_trigger)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .option("ignoreCorruptFiles", "true")
        .json(options.landing)
    )
    parsed = raw.withColumns({parsed: _timestamp(name) for name, parsed in _PARSED.items()})
    checked = parsed.withColumn("_valid", _is_valid()).observe(
        "landing", F.count(F.lit(1)).alias("rows"), F.count_if(~F.col("_valid")).alias("rejected")
    )
    landed = F.col("_metadata.file_modification_time").alias("_landed")
    return (
        checked.where("_valid")
        .select(*(F.col(_PARSED.get(name, name)).alias(name) for name in COLUMNS), landed)
        .withWatermark("_landed", options.watermark)
        .dropDuplicatesWithinWatermark(["id"])
        .drop("_landed")
        .withColumn("date", F.to_date("result_time"))
    )


def _timestamp(name: str) -> Column:
    return F.try_to_timestamp(F.col(name), F.lit(TIME_FORMAT))


def _is_valid() -> Column:
    """The contract's rules that the schema alone does not enforce; never null (null would not be counted)."""
    condition = F.col("_corrupt_record").isNull() & F.col("_result_ts").isNotNull() & (F.col("sequence") >= 1)
    for name in REQUIRED:
        condition &= F.col(name).isNotNull()
    condition &= F.col("source_time").isNull() | F.col("_source_ts").isNotNull()
    condition &= F.col("value").isNull() != F.col("literal").isNull()
    return F.coalesce(condition, F.lit(False))


def start(spark: SparkSession, options: StreamOptions) -> StreamingQuery:
    """Start the query, setting three session options it depends on: the time zone to UTC (``date`` is
    the UTC date), Parquet timestamps to INT64 microseconds (exact, and readable by any Parquet reader,
    unlike INT96), and the shuffle partitions, which for this stateful query are the de-duplication
    state's partitions: Spark's default of 200 costs 200 tasks per micro-batch, and the first run's
    number is kept in the checkpoint for good."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    spark.conf.set("spark.sql.shuffle.partitions", str(options.state_partitions))
    writer = (
        observations(spark, options)
        .writeStream.format("parquet")
        .partitionBy(*PARTITIONS)
        .option("checkpointLocation", options.checkpoint)
        .outputMode("append")
        .queryName("sepa_observations")
    )
    if options.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{options.trigger_seconds} seconds")
    return writer.start(options.table)


def batch_summary(progress: StreamingQueryProgress) -> dict[str, int]:
    """The numbers worth a log line from one micro-batch's progress report."""
    observed = (progress.observedMetrics or {}).get("landing")
    operators = progress.stateOperators or []
    return {
        "batch": progress.batchId,
        "rows": int(observed["rows"]) if observed else 0,
        "rejected": int(observed["rejected"]) if observed else 0,
        "duplicates": sum(int(op.customMetrics.get("numDroppedDuplicateRows", 0)) for op in operators),
        "late": sum(int(op.numRowsDroppedByWatermark) for op in operators),
    }


def run(
    query: StreamingQuery, poll_seconds: float, stop_requested: Callable[[], bool] = lambda: False
) -> list[dict[str, int]]:
    """Wait for the query (logging each micro-batch) until it ends or ``stop_requested()``; stop it then."""
    seen = -1
    summaries: list[dict[str, int]] = []
    while True:
        finished = query.awaitTermination(poll_seconds)
        for progress in query.recentProgress:
            summary = batch_summary(progress)
            if summary["batch"] > seen and summary["rows"]:
                seen = summary["batch"]
                summaries.append(summary)
                level = logging.WARNING if summary["rejected"] or summary["late"] else logging.INFO
                log.log(level, "micro-batch", extra=summary)
        if finished:
            return summaries
        if stop_requested():
            query.stop()
            return summaries


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Arguments shared by ``spark-submit cloud/stream.py`` and ``sepa-cloud stream``."""
    parser = argparse.ArgumentParser(prog=prog, description="Landing batches -> Parquet observations table.")
    parser.add_argument("--landing", required=True, metavar="URI", help="landing directory the endpoint writes")
    parser.add_argument("--table", required=True, metavar="URI", help="Parquet table (partitioned by date, property)")
    parser.add_argument("--checkpoint", required=True, metavar="URI", help="checkpoint directory (one per table)")
    parser.add_argument("--watermark", default="2 hours", help="de-duplication window, landing time")
    parser.add_argument("--trigger-seconds", type=_positive, default=10.0, help="micro-batch interval (default 10)")
    parser.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    parser.add_argument("--max-files-per-trigger", type=_count, default=64, help="landing files per micro-batch")
    parser.add_argument(
        "--state-partitions", type=_count, default=4, help="de-duplication state partitions (first run only; default 4)"
    )
    parser.add_argument("--master", help="Spark master when not run by spark-submit (e.g. local[2])")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def session(app_name: str, master: str | None) -> tuple[SparkSession, bool]:
    """The active session (when called in-process, e.g. by tests) or a new one; True if new."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    builder = SparkSession.builder.appName(app_name).config("spark.log.level", "WARN")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
    return builder.getOrCreate(), True


def setup_logging(level: str) -> None:
    """``key=value`` lines on stderr, like the gateway (kept here so this file stands alone)."""
    handler = _StderrHandler()
    handler.setFormatter(_KeyValueFormatter())
    logger = logging.getLogger("cloud")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (a job run in-process, e.g. by pytest, may see it replaced)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


class _KeyValueFormatter(logging.Formatter):
    _STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        fields = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname.lower()}
        fields |= {"logger": record.name, "msg": record.getMessage()}
        fields |= {key: value for key, value in vars(record).items() if key not in self._STANDARD}
        return " ".join(f"{key}={_quote(value)}" for key, value in fields.items())


def _quote(value: object) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or "=" in text or not text) else text


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point; returns 0, 1 if the query failed while running, 2 if it could not start."""
    args = build_parser(prog).parse_args(argv)
    setup_logging(args.log_level)
    options = StreamOptions(
        landing=args.landing,
        table=args.table,
        checkpoint=args.checkpoint,
        watermark=args.watermark,
        trigger_seconds=args.trigger_seconds,
        available_now=args.available_now,
        max_files_per_trigger=args.max_files_per_trigger,
        state_partitions=args.state_partitions,
    )
    spark, owned = session("sepa-cloud-stream", args.master)
    stop = _StopFlag()
    try:
        try:
            query = start(spark, options)
        except PySparkException as error:
            print(f"sepa-cloud stream: {_first_line(error)}", file=sys.stderr)
            return 2
        log.info("stream started", extra={"landing": options.landing, "table": options.table})
        stop.install()
        try:
            run(query, min(options.trigger_seconds, 5.0), stop)
        except (PySparkException, Py4JError, OSError) as error:
            if not stop.requested:
                print(f"sepa-cloud stream: the query failed: {_first_line(error)}", file=sys.stderr)
                return 1
            log.debug("the JVM stopped first", extra={"error": _first_line(error)})
        log.info("stream stopped", extra={"table": options.table})
        return 0
    finally:
        stop.uninstall()
        if owned:
            _stop_session(spark, stop.requested)


def _stop_session(spark: SparkSession, stop_requested: bool) -> None:
    """Stop the session this job made. Why a stop signal's errors are let go: systemd's stop (its
    KillMode=control-group), ``kill -- -PGID`` or a container's stop signal the JVM as well as this
    process, and the JVM's shutdown hook stops the SparkContext itself meanwhile. Every call into it
    then fails: the query "failed" (exit 1, "Cannot invoke ... dagScheduler() is null"), then a
    traceback from this stop (Py4JNetworkError, or ConnectionRefusedError once the JVM is gone).
    The checkpoint makes a micro-batch cut short run again at the next start, so it is the stop
    asked for, and exits 0."""
    try:
        spark.stop()
    except (Py4JError, OSError):
        if not stop_requested:
            raise


class _StopFlag:
    """SIGTERM/SIGINT ask the poll loop to stop the query between micro-batches."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __call__(self) -> bool:
        return self.requested

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, _signum: int, _frame: Any) -> None:
        self.requested = True
        # the JVM may be stopping too (see _stop_session): py4j's own tracebacks of its lost connection
        # would be logged to stderr meanwhile, some on its loggers, "Exception while sending command."
        # on the root logger (py4j calls logging.exception), once per call that fails (CI, stop 73)
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        logging.getLogger().addFilter(_not_from_py4j)


def _not_from_py4j(record: logging.LogRecord) -> bool:
    """False for a record py4j's own code logged (a logging filter: the record is dropped)."""
    return f"{os.sep}py4j{os.sep}" not in record.pathname


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


if __name__ == "__main__":
    sys.exit(main())
