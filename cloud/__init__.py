"""The cloud side of the gateway: the HTTPS landing endpoint the shipper uploads observation batches
to (:mod:`cloud.landing`), and the PySpark jobs that turn them into a Parquet table
(:mod:`cloud.stream`) and daily statistics (:mod:`cloud.stats`). Only the Spark jobs need pyspark."""
