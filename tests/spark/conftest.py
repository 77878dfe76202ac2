"""Spark fixtures: one local SparkSession (with delta-spark) for the whole run, one coordinator per
module."""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from percolake import failpoints
from percolake.lake.storage import hadoop_s3a_options
from sparkside import Participant, local_spark
from sparkside.session import first_fetch_notice
from tests.spark_settings import s3_connector_packages, suite_conf

# The shared session carries Hadoop's S3 connector from its start (jars cannot be added later);
# the S3 tests give it the moto server's settings when they run (``spark_s3``).
S3_JARS = s3_connector_packages()


@pytest.fixture(scope="session")
def spark(pytestconfig: pytest.Config) -> Iterator[SparkSession]:
    """The one SparkSession of the run, with delta-spark (``sparkside.configure_spark``)."""
    notice = first_fetch_notice(S3_JARS)
    if notice:  # the first run downloads delta-spark's jars: say so past pytest's capture
        capture = pytestconfig.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\n{notice}", file=sys.stderr, flush=True)
    session = local_spark("percolake-tests", conf=suite_conf(s3_connector=True))
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def spark_s3(spark: SparkSession, s3_env: dict[str, str]) -> SparkSession:
    """The shared session reading ``s3a://`` from the moto server of ``s3_env`` (Hadoop caches
    a filesystem per bucket: each test's new bucket gets these settings)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in hadoop_s3a_options().items():  # this test's server, over an earlier one
        hadoop.set(key.removeprefix("spark.hadoop."), value)
    return spark


@pytest.fixture(scope="module")
def lake_daemon(daemon_factory):  # noqa: ANN001, ANN201 - tests/conftest.py's factory
    """A coordinator for a module's Spark tests; each test uses tables of its own."""
    # --shared-table-writers: a few tests make another pipeline hold or write a table
    running = daemon_factory.start(["--roll-forward-after", "2", "--conflict-wait", "5",
                                    "--shared-table-writers"], name="lake")
    yield running
    running.stop()


@pytest.fixture
def lake(lake_daemon, tmp_path: Path) -> Path:  # noqa: ANN001
    """A folder of tables for one test, under the module daemon's warehouse."""
    folder = lake_daemon.warehouse / uuid.uuid4().hex[:10]
    folder.mkdir()
    return folder


@pytest.fixture(autouse=True)
def no_failpoints() -> Iterator[None]:
    yield
    failpoints.disable()


def rate_stream(spark: SparkSession, rows_per_batch: int) -> DataFrame:
    """``value`` runs 0, 1, 2, ...: batch b holds values [b * rows, (b + 1) * rows)."""
    return (spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", rows_per_batch).option("numPartitions", 2).load())


def run_until(spark: SparkSession, participant: Participant, fn: Callable, checkpoint: Path,
              done: Callable[[], bool], rows_per_batch: int = 10,
              timeout_s: float = 120) -> StreamingQuery:
    """Runs a rate-micro-batch query through the participant until ``done()``; then stops it.

    Returns the stopped query (its ``exception()`` says whether it failed by itself).
    """
    query = (rate_stream(spark, rows_per_batch).writeStream
             .foreachBatch(participant.wrap(fn))
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="0 seconds").start())
    deadline = time.monotonic() + timeout_s
    try:
        while not done() and query.isActive:
            if time.monotonic() > deadline:
                raise TimeoutError("streaming query did not reach its goal in time")
            time.sleep(0.1)
    finally:
        query.stop()
    return query
