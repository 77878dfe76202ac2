"""Tables written by percolake, checked by delta-spark, the reference Delta implementation.

One pipeline writes five batches through the Participant into two tables:

- ``events``, partitioned by ``day``: batches 0-3 append one file each (a day of their own),
  batch 4 replaces batch 0's day (``overwrite_partitions``). Columns of the types percolake
  writes stats for, and a double (never bounded).
- ``balances``: overwritten by batches 0, 2, 3 (with no rows) and 4; batch 1 leaves it alone.
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
import uuid
from pathlib import Path
from urllib.parse import unquote

import pyarrow
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from percolake.lake.arrow_read import read_delta_table
from percolake.lake.log_entry import ENGINE
from percolake.lake.warehouse import canonical_table_uri, local_path
from percolake.records import delta_app_id
from sparkside import ConsistentReader, Participant
from sparkside.reader import read_table_version
from tests.spark.helpers import committed_batches

pytestmark = pytest.mark.spark

UTC = datetime.timezone.utc
BATCHES = 5
EVENTS_SCHEMA = ("id long, name string, day date, at timestamp, wall timestamp_ntz, "
                 "amount decimal(10,2), score double")


def events_rows(batch: int) -> list[tuple]:
    """Three rows whose values (but ``score``) lie in ranges no other batch's rows touch."""
    day = datetime.date(2026, 1, 1 + (0 if batch == 4 else batch))
    return [(batch * 10 + k, f"n{batch}{k}", day,
             datetime.datetime(2026, 3, 1 + batch, k, tzinfo=UTC),
             datetime.datetime(2026, 4, 1 + batch, k),
             decimal.Decimal(batch * 10 + k) + decimal.Decimal("0.50"),
             float(k)) for k in range(3)]


class Lake:
    def __init__(self, root: Path, pipeline: str, daemon) -> None:  # noqa: ANN001
        self.events, self.balances = root / "events", root / "balances"
        self.pipeline, self.target, self.stub = pipeline, daemon.target, daemon.stub


@pytest.fixture(scope="module")
def written(spark: SparkSession, lake_daemon) -> Lake:  # noqa: ANN001
    root = lake_daemon.warehouse / f"delta-spark-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    lake = Lake(root, f"ds-{root.name}", lake_daemon)
    participant = Participant(lake_daemon.target, pipeline_id=lake.pipeline)

    def write(df: DataFrame, batch: int, txn) -> None:  # noqa: ANN001
        events = spark.createDataFrame(events_rows(batch), EVENTS_SCHEMA).coalesce(1)
        txn.write(events, str(lake.events), partition_by=["day"],
                  mode="overwrite_partitions" if batch == 4 else "append")
        if batch != 1:
            balances = spark.createDataFrame([(a, 100 * batch + a) for a in range(4)],
                                             "account long, balance long")
            txn.write(balances.limit(0) if batch == 3 else balances, str(lake.balances),
                      mode="overwrite")

    for batch in range(BATCHES):
        participant.run_batch(spark.range(1), batch, lambda df, b, txn: write(df, b, txn))
    return lake


def delta_log_snapshot(spark: SparkSession, table: Path, version: int):  # noqa: ANN201
    """delta-spark's own view of ``table`` at ``version`` (its Scala ``DeltaLog`` snapshot)."""
    jvm = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(table))
    none = jvm.scala.Option.empty()
    return log.getSnapshotAt(version, none, none, False)


def app_transactions(spark: SparkSession, table: Path, version: int) -> dict[str, int]:
    """The Delta app transactions (``txn`` actions) delta-spark sees at ``version``."""
    transactions = delta_log_snapshot(spark, table, version).transactions()
    java = spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(transactions)
    return {str(k): int(v) for k, v in java.items()}


def sorted_rows(table: pyarrow.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def test_schema_and_partition_columns_as_delta_spark_reads_them(spark, written):
    frame = spark.read.format("delta").load(str(written.events))
    expected = spark.createDataFrame([], EVENTS_SCHEMA).schema
    # the participant declares every column nullable, as Spark's own Parquet files are
    assert [(f.name, f.dataType, f.nullable) for f in frame.schema] == \
        [(f.name, f.dataType, True) for f in expected]
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{written.events}`").first()
    assert detail.format == "delta" and detail.partitionColumns == ["day"]
    assert detail.numFiles == 4  # batches 1-4; batch 0's day was replaced
    assert detail.numFiles == len(DeltaTable(str(written.events)).file_uris())
    balances = spark.sql(f"DESCRIBE DETAIL delta.`{written.balances}`").first()
    assert balances.partitionColumns == [] and balances.numFiles >= 1
    assert [f.name for f in spark.read.format("delta").load(str(written.balances)).schema] \
        == ["account", "balance"]


def test_stats_let_delta_spark_skip_files(spark, written):
    """A filter on one batch's value reads only that batch's file, for every stats type; the
    double column (percolake writes no bounds for doubles) reads every file."""
    adds = pyarrow.table(DeltaTable(str(written.events)).get_add_actions(flatten=True))
    file_of_batch = {min_id // 10: os.path.basename(unquote(path)) for path, min_id in zip(
        adds.column("path").to_pylist(), adds.column("min.id").to_pylist(), strict=True)}
    assert sorted(file_of_batch) == [1, 2, 3, 4]
    frame = spark.read.format("delta").load(str(written.events))

    def files_read(condition) -> set[str]:  # noqa: ANN001
        return {os.path.basename(unquote(f)) for f in frame.where(condition).inputFiles()}

    for batch, file in file_of_batch.items():
        first = events_rows(batch)[0]
        for column, value in zip(("id", "name", "day", "at", "wall", "amount"), first[:6],
                                 strict=True):
            assert files_read(F.col(column) == F.lit(value)) == {file}, (column, batch)
        assert files_read(F.col("id") > batch * 10 + 5) == \
            {f for b, f in file_of_batch.items() if b > batch}
    assert files_read(F.col("id") > 1000) == set()
    assert files_read(F.col("score") == 1.0) == set(file_of_batch.values())


def test_describe_history_shows_each_commit_and_delta_spark_sees_the_app_transaction(
        spark, written):
    """Every Delta version is one percolake commit: DESCRIBE HISTORY lists it (an append as a
    log entry of percolake's own, the table's creation and overwrites made by delta-rs), and
    delta-spark's snapshot at that version holds the pipeline's app transaction (``txn``
    action: app id ``percolake:<pipeline>:g<generation>``, version = batch id), and its
    ``userMetadata`` names the percolake transaction and commit_ts."""
    commits = committed_batches(written.stub, written.pipeline)
    app_id = delta_app_id(written.pipeline, 0)
    for table, batches in ((written.events, range(BATCHES)), (written.balances, (0, 2, 3, 4))):
        version_of_batch = {b: p.delta_version for b in batches for p in commits[b].participants
                            if p.table == canonical_table_uri(str(table))}
        assert all(p.applied for b in batches for p in commits[b].participants)
        assert sorted(version_of_batch.values()) == list(range(len(batches)))
        history = {r.version: r for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()}
        assert sorted(history) == sorted(version_of_batch.values()), table
        txn_ids = {c["version"]: c["percolake.txn_id"] for c in DeltaTable(str(table)).history()}
        for batch, version in version_of_batch.items():
            row = history[version]
            appended = table == written.events and batch in (1, 2, 3)  # percolake's entry
            assert row.engineInfo == ENGINE if appended else \
                row.engineInfo.startswith("delta-rs"), row
            assert row.operation == ("CREATE TABLE" if version == 0 else "WRITE"), row
            assert app_transactions(spark, table, version) == {app_id: batch}, (table, version)
            assert txn_ids[version] == commits[batch].txn_id  # as deltalake reads the log
            assert json.loads(row.userMetadata) == {
                "percolake.txn_id": commits[batch].txn_id,
                "percolake.commit_ts": str(commits[batch].commit_ts)}, row


def test_version_as_of_every_version_is_what_deltalake_reads(spark, written):
    for table in (written.events, written.balances):
        latest = DeltaTable(str(table)).version()
        for version in range(latest + 1):
            spark_rows = read_table_version(spark, f"file://{table}", version).toArrow()
            delta_rows = read_delta_table(str(table), version)
            assert spark_rows.schema.names == delta_rows.schema.names, (table, version)
            assert sorted_rows(spark_rows) == sorted_rows(delta_rows), (table, version)
    assert read_table_version(spark, str(written.balances), 2).count() == 0  # batch 3: empty


def test_snapshots_read_each_batch_through_delta_spark(spark, written):
    """``ConsistentReader`` after each batch: the versions it names, read with delta-spark,
    hold exactly what deltalake reads there."""
    reader = ConsistentReader(spark, written.target)
    try:
        tables = [str(written.events), str(written.balances)]
        for batch in range(BATCHES):
            snap = reader.snapshot(tables, as_of=(written.pipeline, batch))
            assert snap.versions[tables[0]] == batch
            for table in tables:
                got = snap.table(table).toArrow()
                assert sorted_rows(got) == sorted_rows(
                    read_delta_table(table, snap.versions[table])), (table, batch)
            ids = sorted(r.id for r in snap.table(tables[0]).select("id").collect())
            assert ids == sorted(row[0] for b in range(batch + 1) for row in events_rows(b)
                                 if not (batch == 4 and b == 0))
    finally:
        reader.close()


def test_delta_spark_reads_tables_in_awkward_folders(spark, tmp_path):
    """Folder names and partition values that need escaping in URIs or are glob characters to
    Hadoop: delta-spark reads each version as deltalake does. (A ``[`` in a local path makes
    delta-rs 1.6 panic on write, so no such table can exist.)"""
    names = ["a b", "a#b", "a+b", "a?b", "a{x,y}", "a*b", "a:b", "é ü", "a%b", "a,b;c", "a=b"]
    for name in names:
        uri = canonical_table_uri(str(tmp_path / name / "t"))
        for values, parts in (([1, 2], ["x y", "z+w"]), ([3], ["a/b%c"])):
            write_deltalake(local_path(uri), pyarrow.table({
                "id": pyarrow.array(values, pyarrow.int64()), "p": parts}),
                partition_by=["p"], mode="append")
        got = read_table_version(spark, uri, 1).toArrow()
        assert sorted_rows(got) == sorted_rows(read_delta_table(uri, 1)), name
        assert got.num_rows == 3, name
