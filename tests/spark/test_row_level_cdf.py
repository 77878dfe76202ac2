"""MERGE, UPDATE and DELETE through ``txn.delta_table`` on a table with the change data feed,
side by side with delta-spark on a copy: the change feed (rows and ``_change_type``) and the
latest table read by delta-spark are the same, each commit carries change files exactly where
delta-spark's does, counted in the operation metrics as delta-spark counts them, and vacuum
takes them once they are old enough (docs/row-level-writes.md, Change data feed)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq
import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from percolake.lake.vacuum import TableVacuum
from sparkside import Participant
from sparkside.delta_table import _on_partitions_only
from tests.spark.helpers import run_on_both

pytestmark = pytest.mark.spark

SCHEMA = "id long, value long, region string"


def change_feed(spark: SparkSession, path: Path) -> Counter:
    """The table's change feed since version 1, without the commit columns."""
    feed = (spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", 1).load(str(path))
            .drop("_commit_version", "_commit_timestamp"))
    return Counter(tuple(r) for r in feed.collect())


def cdc_actions(path: Path, version: int) -> list[dict]:
    text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line)["cdc"] for line in text.splitlines() if '"cdc"' in line]


def change_file_metrics(spark: SparkSession, path: Path) -> dict[int, dict[str, int]]:
    """Each version's change-file metrics in ``DESCRIBE HISTORY`` (delta-spark's names:
    MERGE's ``numTargetChangeFilesAdded``, UPDATE's and DELETE's ``numAddedChangeFiles``)."""
    return {r["version"]: {k: int(v) for k, v in (r["operationMetrics"] or {}).items()
                           if "ChangeFiles" in k}
            for r in DeltaTable.forPath(spark, str(path)).history().collect()}


def assert_change_files_counted_as_delta_spark_counts(
        ours_metrics: dict[str, int], theirs: Path,
        their_metrics: list[tuple[int, dict[str, int]]]) -> None:
    """Our commit's change-file metrics carry delta-spark's names for the same operations
    (theirs: one commit each), count the change files the operations wrote (what delta-spark
    counts: the ``cdc`` actions of its commit) and are 0 exactly where delta-spark's are."""
    assert set(ours_metrics) == {k for _, m in their_metrics for k in m}
    for version, metrics in their_metrics:
        assert sum(metrics.values()) == len(cdc_actions(theirs, version)), f"theirs {version}"
    assert (sum(ours_metrics.values()) > 0) == any(sum(m.values()) for _, m in their_metrics)


def merge(dt, source: DataFrame) -> None:  # noqa: ANN001
    (dt.alias("t").merge(source.alias("s"), "t.id = s.id")
     .whenMatchedDelete("s.value < 0")
     .whenMatchedUpdate(set={"value": "s.value"})
     .whenNotMatchedInsert(values={"id": "s.id", "value": "s.value", "region": "s.region"})
     .execute())


def insert_only(dt, source: DataFrame) -> None:  # noqa: ANN001
    (dt.alias("t").merge(source.alias("s"), "t.id = s.id")
     .whenNotMatchedInsertAll().execute())


# batches of operations; delta-spark runs the same operations one commit each
BATCHES = [
    [merge],
    # beside the UPDATE's change files, the append's and the whole-file delete's changes
    # are written as change files too
    [lambda dt, s: dt.update("id % 3 = 0", {"value": "value * 10"}), "append",
     lambda dt, s: dt.delete("region = 'ap'")],
    [lambda dt, s: insert_only(dt, s.selectExpr("id + 1000 as id", "value", "region"))],
    [lambda dt, s: dt.delete("value > 150")],
]


def test_merge_update_and_delete_write_the_change_feed_delta_spark_writes(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    ours, theirs = lake / "accounts", lake / "accounts-reference"
    rows = [(k, k * 7 % 100, ["eu", "us", "ap"][k % 3]) for k in range(30)]
    (spark.createDataFrame(rows, SCHEMA).repartition(2).write.format("delta")
     .partitionBy("region").option("delta.enableChangeDataFeed", "true").save(str(ours)))
    shutil.copytree(ours, theirs)
    source = spark.createDataFrame(
        [(2, -1, "ap"), (4, 400, "us"), (5, 55, "ap"), (40, 140, "eu"), (41, 190, "us")],
        SCHEMA)
    appended = spark.createDataFrame([(60, 3, "us"), (61, 4, "ap")], SCHEMA)
    participant = Participant(lake_daemon.target, pipeline_id=f"cdf-{lake.name}")
    their_versions = []
    for batch_id, operations in enumerate(BATCHES):
        def batch(df: DataFrame, batch_id: int, txn, operations=operations) -> None:  # noqa: ANN001
            for operation in operations:
                if operation == "append":
                    txn.write(appended, str(ours), partition_by=["region"])
                else:
                    operation(txn.delta_table(str(ours)), source)

        participant.run_batch(spark.range(1), batch_id, batch)
        for operation in operations:
            if operation == "append":
                appended.write.format("delta").mode("append").save(str(theirs))
            else:
                operation(DeltaTable.forPath(spark, str(theirs)), source)
        their_versions.append(DeltaTable.forPath(spark, str(theirs)).history(1)
                              .collect()[0]["version"])

    assert change_feed(spark, ours) == change_feed(spark, theirs)
    latest = spark.read.format("delta").load
    assert sorted(latest(str(ours)).collect()) == sorted(latest(str(theirs)).collect())
    for version, theirs_version in zip((1, 3, 4), (their_versions[0], *their_versions[2:]),
                                       strict=True):  # batches of one operation
        ours_cdc, their_cdc = cdc_actions(ours, version), cdc_actions(theirs, theirs_version)
        assert bool(ours_cdc) == bool(their_cdc), f"version {version}"
        assert all(a["dataChange"] is False and a["path"].startswith("_percolake/")
                   and set(a["partitionValues"]) == {"region"} for a in ours_cdc)
    assert cdc_actions(ours, 2), "the whole-file delete's rows are change files beside the update's"

    ours_metrics = change_file_metrics(spark, ours)
    their_metrics = change_file_metrics(spark, theirs)
    # the first MERGE ran on the same files on both sides: the same count
    assert ours_metrics[1] == their_metrics[1] == {"numTargetChangeFilesAdded": 3}
    their_first = [1] + [v + 1 for v in their_versions[:-1]]  # each batch's first commit
    for batch_id, version in enumerate((1, 2, 3, 4)):
        their_batch = [(v, their_metrics[v]) for v in range(their_first[batch_id],
                                                             their_versions[batch_id] + 1)]
        assert_change_files_counted_as_delta_spark_counts(ours_metrics[version], theirs,
                                                          their_batch)
        # the operations' own change files; those written for the append and the whole-file
        # delete (which delta-spark's own commits of them do not have) are not counted
        own = [a for a in cdc_actions(ours, version) if "/op" in a["path"]]
        assert sum(ours_metrics[version].values()) == len(own), f"version {version}"

    # percolake's vacuum (lake side) takes every change file, ours under _percolake/ as
    # delta-spark's, once its commit is older than the retention, and none before
    for path, newest in ((ours, 4), (theirs, their_versions[-1])):
        changes = {unquote(a["path"]) for v in range(1, newest + 1) for a in cdc_actions(path, v)}
        vacuum = TableVacuum(f"file://{path}")
        assert changes and changes <= set(vacuum.candidates(0))
        assert not changes & set(vacuum.candidates(1))


def test_a_delete_on_partition_columns_only_is_told_apart_as_delta_spark_does(spark) -> None:  # noqa: ANN001
    frame = spark.createDataFrame([(1, 2, "eu")], SCHEMA).alias("t")
    for condition, whole_files in [(None, True), ("region = 'eu'", True),
                                   (F.col("t.region").isin("eu", "us"), True),
                                   ("region = 'eu' and value > 1", False), ("id = 1", False)]:
        assert _on_partitions_only(frame, condition, ["region"]) is whole_files, condition


@pytest.mark.parametrize("mode", ["name", "id"])
def test_a_column_mapped_table_gets_the_change_feed_delta_spark_writes(
        spark, lake_daemon, lake, mode) -> None:  # noqa: ANN001
    """Change files of a column-mapped table (``name`` or ``id``): physical column names,
    field ids and partition values keyed by physical name, ``_change_type`` as it is;
    delta-spark's change feed and latest table read the same as after its own operations."""
    ours, theirs = lake / "mapped", lake / "mapped-reference"
    spark.sql(f"CREATE TABLE delta.`{ours}` ({SCHEMA}) USING DELTA PARTITIONED BY (region) "
              "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true', "
              f"'delta.columnMapping.mode' = '{mode}')")
    rows = [(k, k * 7 % 100, ["eu", "us", "ap"][k % 3]) for k in range(20)]
    spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append").save(str(ours))
    shutil.copytree(ours, theirs)
    source = spark.createDataFrame([(2, -1, "ap"), (4, 400, "us"), (40, 140, "eu")], SCHEMA)
    operations = [[merge], [lambda dt, s: dt.update("id % 3 = 0", {"value": "value * 10"}),
                            lambda dt, s: dt.delete("value > 150")]]
    participant = Participant(lake_daemon.target, pipeline_id=f"cdf-{mode}-{lake.name}")
    for batch_id, batch_operations in enumerate(operations):
        run_on_both(spark, participant, batch_id, batch_operations, source, ours, theirs)

    ours_metrics = change_file_metrics(spark, ours)
    their_metrics = change_file_metrics(spark, theirs)
    assert ours_metrics[2] == their_metrics[2] == {"numTargetChangeFilesAdded": 3}
    for version, their_batch in ((2, [2]), (3, [3, 4])):
        assert_change_files_counted_as_delta_spark_counts(
            ours_metrics[version], theirs, [(v, their_metrics[v]) for v in their_batch])
        assert sum(ours_metrics[version].values()) == len(cdc_actions(ours, version))
    assert change_feed(spark, ours) == change_feed(spark, theirs)
    latest = spark.read.format("delta").load
    assert sorted(latest(str(ours)).collect()) == sorted(latest(str(theirs)).collect())
    physical_keys = {k for a in cdc_actions(theirs, 2) for k in a["partitionValues"]}
    assert physical_keys and "region" not in physical_keys
    for version in (2, 3):
        ours_cdc = cdc_actions(ours, version)
        assert ours_cdc and all(set(a["partitionValues"]) == physical_keys for a in ours_cdc)
    their_file = pq.read_schema(theirs / cdc_actions(theirs, 2)[0]["path"])
    ids = {f.name: (f.metadata or {}).get(b"PARQUET:field_id") for f in their_file}
    ours_file = pq.read_schema(ours / cdc_actions(ours, 2)[0]["path"])
    assert {f.name: (f.metadata or {}).get(b"PARQUET:field_id") for f in ours_file} \
        == {n: i for n, i in ids.items() if n not in physical_keys | {"__is_cdc"}}
