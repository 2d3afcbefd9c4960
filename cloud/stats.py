"""Batch job: daily statistics per sensor and property from the observations table, with Spark SQL.

    sepa-cloud stats --table URI --out URI [--date YYYY-MM-DD] [--master local[2]]

Writes Parquet partitioned by ``date`` with columns ``sensor, property, unit, count, min, max, mean``
(and prints the first rows). Only numeric results count: a literal result (``"open"``) has no min or
mean. ``unit`` is part of the key so that a sensor switching units never averages degC with degF.

Why dynamic partition overwrite: re-running a day (``--date``) replaces that day's statistics and
leaves the other days alone; a run without ``--date`` recomputes every day the table holds. Why
reading with ``spark.read.parquet``: it honours the stream's ``_spark_metadata`` log, so files of a
micro-batch that did not commit are never counted.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Sequence

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from cloud.stream import session, setup_logging

VIEW = "observations"
STATS_SQL = f"""
SELECT date, sensor, property, unit,
       count(value) AS count, min(value) AS min, max(value) AS max, avg(value) AS mean
FROM {VIEW}
WHERE value IS NOT NULL {{day_filter}}
GROUP BY date, sensor, property, unit
"""


def daily_stats(spark: SparkSession, table: str, day: datetime.date | None = None) -> DataFrame:
    """Per (date, sensor, property, unit): count, min, max, mean of the numeric values."""
    spark.read.parquet(table).createOrReplaceTempView(VIEW)
    if day is None:
        return spark.sql(STATS_SQL.format(day_filter=""))
    return spark.sql(STATS_SQL.format(day_filter="AND date = :day"), args={"day": day})


def write_stats(stats: DataFrame, out: str) -> None:
    """Replace the statistics of the days in ``stats`` under ``out``; other days stay."""
    stats.write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy("date").parquet(out)


def _date(text: str) -> datetime.date:
    try:
        return datetime.date.fromisoformat(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD, got {text!r}") from error


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Arguments of ``sepa-cloud stats``."""
    parser = argparse.ArgumentParser(prog=prog, description="Daily per-sensor statistics of the observations.")
    parser.add_argument("--table", required=True, metavar="URI", help="the observations table the stream writes")
    parser.add_argument("--out", required=True, metavar="URI", help="where to write the statistics (Parquet)")
    parser.add_argument("--date", type=_date, metavar="YYYY-MM-DD", help="only this UTC day (default: every day)")
    parser.add_argument("--master", help="Spark master when not run by spark-submit (e.g. local[2])")
    parser.add_argument("--show", type=int, default=20, metavar="N", help="rows to print (default 20)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point; 0 on success, 2 when the table cannot be read or the output written."""
    args = build_parser(prog).parse_args(argv)
    setup_logging(args.log_level)
    spark, owned = session("sepa-cloud-stats", args.master)
    try:
        stats = daily_stats(spark, args.table, args.date).persist()
        write_stats(stats, args.out)
        print(f"{stats.count()} rows written to {args.out}")
        if args.show > 0:
            stats.orderBy("date", "sensor", "property", "unit").show(args.show, truncate=False)
        stats.unpersist()
        return 0
    except PySparkException as error:
        print(f"sepa-cloud stats: {(str(error).strip().splitlines() or [type(error).__name__])[0]}", file=sys.stderr)
        return 2
    finally:
        if owned:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
