"""Executors write a table's files straight to S3 (moto) and describe them; delta-spark and
delta-rs read what was committed (no coordinator here)."""

from __future__ import annotations

import datetime
import json

import pyarrow
import pytest
from deltalake import DeltaTable

from percolake.lake import storage
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import apply_table_write
from percolake.records import TableWriteRecord, WriteMode
from sparkside.reader import read_table_version
from sparkside.writer import delta_schema_json, write_files
from tests.spark.test_writer import STATS_ROWS, assert_exact_stats, commit, stats_frame

pytestmark = pytest.mark.spark


def keys_below(bucket: str, prefix: str) -> dict[str, int]:
    return {path: size for path, (size, _) in storage.list_files(f"s3://{bucket}/{prefix}").items()}


def test_each_file_is_written_once_where_its_add_says_with_exact_stats(spark_s3, s3_bucket):
    df = stats_frame(spark_s3)
    uri = f"s3://{s3_bucket}/wh/t"
    adds = write_files(df.coalesce(1), uri, f"{uri}/_percolake/x", [])
    assert len(adds) == 1
    # exactly the described objects exist, at their sizes: no _temporary, _SUCCESS or markers
    assert keys_below(s3_bucket, "wh/t") == {adds[0].path: adds[0].size}
    assert adds[0].path.startswith("_percolake/x/")
    stats = json.loads(adds[0].stats)
    assert "NaN" not in adds[0].stats
    assert_exact_stats(stats)
    commit_write = TableWriteRecord(uri, WriteMode.APPEND, tuple(adds), delta_schema_json(df))
    apply_table_write(commit_write, app_id="app", app_version=0, txn_id="x", commit_ts=1)
    table = DeltaTable(uri, storage_options=storage.delta_storage_options(uri))
    parsed = pyarrow.table(table.get_add_actions(flatten=True))
    assert parsed.column("min.id").to_pylist() == [1]
    assert parsed.column("max.wall").to_pylist() == [datetime.datetime(2026, 1, 1, 9)]
    read_back = read_table_version(spark_s3, uri, 0).orderBy("id").collect()
    assert [(r.id, r.name, r.amount, r.wall) for r in read_back] == [
        (r[0], r[1], r[4], r[7]) for r in sorted(STATS_ROWS)]


def test_an_empty_batch_writes_nothing_on_s3(spark_s3, s3_bucket):
    uri = f"s3://{s3_bucket}/wh/t"
    assert write_files(spark_s3.range(0), uri, f"{uri}/_percolake/x", []) == []
    assert keys_below(s3_bucket, "wh") == {}


def test_awkward_partition_values_on_s3_read_back_through_delta_spark_and_delta_rs(
        spark_s3, s3_bucket):
    """Values that need escaping in a key, nulls, empty strings and timestamps (a non-UTC
    session): Delta gets canonical UTC partition values; both readers agree."""
    uri = f"s3://{s3_bucket}/wh/t"
    schema = "id long, s string, at timestamp"
    utc = datetime.timezone.utc
    noon, next_day = (datetime.datetime(2026, 1, 1, 12, tzinfo=utc),
                      datetime.datetime(2026, 1, 2, 5, tzinfo=utc))
    zone = spark_s3.conf.get("spark.sql.session.timeZone")
    spark_s3.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        first = spark_s3.createDataFrame(
            [(1, "a/b c:d%", noon), (2, "..", noon), (3, None, noon), (4, "a/b c:d%", next_day),
             (5, "", noon)], schema)
        write = commit(uri, first, "x0", 0, ["s", "at"])
        assert {a.partition_values["at"] for a in write.add_files} \
            == {"2026-01-01T12:00:00.000000Z", "2026-01-02T05:00:00.000000Z"}
        assert all("/../" not in f"/{a.path}/" and "a/b" not in a.path for a in write.add_files)
        second = spark_s3.createDataFrame([(10, "a/b c:d%", noon), (11, None, noon)], schema)
        commit(uri, second, "x1", 1, ["s", "at"], WriteMode.OVERWRITE_PARTITIONS)
    finally:
        spark_s3.conf.set("spark.sql.session.timeZone", zone)
    # Spark writes an empty string partition value as null: row 5 joins the null partition,
    # which the second write replaced
    expected = [(2, "..", noon), (4, "a/b c:d%", next_day), (10, "a/b c:d%", noon),
                (11, None, noon)]
    delta_rows = read_delta_table(uri).to_pylist()
    assert sorted((r["id"], r["s"], r["at"]) for r in delta_rows) == expected
    frame = read_table_version(spark_s3, uri, 1)
    assert frame.schema.fieldNames() == ["id", "s", "at"]
    spark_rows = frame.toArrow().to_pylist()
    assert sorted((r["id"], r["s"], r["at"].astimezone(utc)) for r in spark_rows) == expected
    first_version = read_table_version(spark_s3, uri, 0).toArrow()
    assert sorted(first_version.column("id").to_pylist()) == [1, 2, 3, 4, 5]


def test_files_left_by_failed_task_attempts_are_removed_and_named_ones_kept(
        spark_s3, s3_bucket, moto_server):
    from sparkside import object_writer

    uri = f"s3://{s3_bucket}/wh/t"
    location = f"{uri}/_percolake/x"
    adds = write_files(spark_s3.range(10).selectExpr("id", "id % 2 as p"), uri, location, ["p"])
    # what a task attempt that failed after writing would leave beside the reported files
    moto_server.client.put_object(Bucket=s3_bucket, Key="wh/t/_percolake/x/p=0/part-late.parquet",
                                  Body=b"PAR1")
    target = object_writer._Target(s3_bucket, "wh/t", "wh/t/_percolake/x", ("p",),
                                   storage.s3_settings(), storage.limits(), "part")
    object_writer._remove_unreferenced(location, target, adds)
    assert keys_below(s3_bucket, "wh/t") == {a.path: a.size for a in adds}
