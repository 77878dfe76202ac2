"""A local SparkSession configured the way percolake's tests and demo need it."""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession


def local_spark(app_name: str = "percolake", cores: int = 2,
                conf: dict[str, str] | None = None) -> SparkSession:
    """A local SparkSession; executors use this interpreter (``spark.pyspark.python``)."""
    builder = (SparkSession.builder.master(f"local[{cores}]").appName(app_name)
               .config("spark.sql.shuffle.partitions", str(cores))
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
               .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC")
               .config("spark.pyspark.python", sys.executable))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
