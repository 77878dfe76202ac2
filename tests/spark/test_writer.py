"""Spark writes a table's files; the driver describes them as Delta adds (no coordinator here)."""

from __future__ import annotations

import datetime
import decimal
import json
from pathlib import Path

import pyarrow
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import apply_table_write
from percolake.records import TableWriteRecord, WriteMode
from sparkside.reader import read_table_version
from sparkside.writer import delta_schema_json, write_files

pytestmark = pytest.mark.spark


def commit(table: Path | str, df, txn: str, version: int,  # noqa: ANN001
           partition_by: list[str], mode: WriteMode = WriteMode.APPEND) -> TableWriteRecord:
    """Writes ``df`` into the attempt folder ``txn`` and applies it as Delta version ``version``
    (``table``: a local folder, or an object-store URI)."""
    uri = table if isinstance(table, str) else f"file://{table}"
    adds = write_files(df, uri, f"{uri}/_percolake/{txn}", partition_by)
    replace = ()
    if mode == WriteMode.OVERWRITE_PARTITIONS:
        replace = tuple(dict(p) for p in {tuple(sorted(a.partition_values.items()))
                                          for a in adds})
    write = TableWriteRecord(uri, mode, tuple(adds), delta_schema_json(df), tuple(partition_by),
                             replace)
    assert apply_table_write(write, app_id="app", app_version=version, txn_id=txn,
                             commit_ts=version + 1) == version
    return write


STATS_ROWS = [
    (1, "b", datetime.date(2026, 1, 2), datetime.datetime(2026, 1, 1, 12, 0, 0, 250),
     decimal.Decimal("1.50"), float("nan"), None, datetime.datetime(2026, 1, 1, 8)),
    (7, "a", datetime.date(2026, 1, 1), datetime.datetime(2026, 1, 3),
     decimal.Decimal("0.10"), 2.0, None, datetime.datetime(2026, 1, 1, 9)),
    (4, None, datetime.date(2026, 1, 5), datetime.datetime(2026, 1, 2),
     decimal.Decimal("2.25"), -1.0, None, datetime.datetime(2026, 1, 1, 7))]
STATS_SCHEMA = ("id long, name string, day date, at timestamp, amount decimal(10,2), "
                "score double, nothing string, wall timestamp_ntz")


def stats_frame(spark):  # noqa: ANN001, ANN201
    """Three rows of every type percolake writes stats for (and a NaN, nulls, a double)."""
    return spark.createDataFrame(STATS_ROWS, STATS_SCHEMA)


def assert_exact_stats(stats: dict) -> None:
    """The Delta stats of ``stats_frame`` in one file, whichever writer wrote it."""
    assert stats["numRecords"] == 3
    assert stats["minValues"] == {"id": 1, "name": "a", "day": "2026-01-01",
                                  "at": "2026-01-01T12:00:00.000250Z",
                                  "wall": "2026-01-01T07:00:00.000000"}
    assert stats["maxValues"] == {"id": 7, "name": "b", "day": "2026-01-05",
                                  "at": "2026-01-03T00:00:00.000000Z",
                                  "wall": "2026-01-01T09:00:00.000000"}
    assert stats["nullCount"] == {"id": 0, "name": 1, "day": 0, "at": 0, "amount": 0,
                                  "score": 0, "nothing": 3, "wall": 0}
    # 0.10 has no exact float: no bound rather than a rounded one; doubles never get bounds
    assert "amount" not in stats["minValues"] and "score" not in stats["maxValues"]


def test_stats_describe_each_file_exactly(spark, tmp_path):
    df = stats_frame(spark)
    uri = f"file://{tmp_path / 't'}"
    adds = write_files(df.coalesce(1), uri, f"{uri}/_percolake/x", [])
    assert len(adds) == 1
    stats = json.loads(adds[0].stats)  # json.loads rejects nothing; NaN must not appear at all
    assert "NaN" not in adds[0].stats
    assert_exact_stats(stats)
    path = tmp_path / "t" / adds[0].path
    assert adds[0].size == path.stat().st_size
    column = pq.read_metadata(path).schema.column(3)
    assert column.physical_type == "INT64" and "microseconds" in column.logical_type.to_json()
    # delta-rs (any Delta reader) parses them: one unparsable value would void the file's stats
    apply_table_write(TableWriteRecord(uri, WriteMode.APPEND, tuple(adds), delta_schema_json(df)),
                      app_id="app", app_version=0, txn_id="x", commit_ts=1)
    parsed = pyarrow.table(DeltaTable(str(tmp_path / "t")).get_add_actions(flatten=True))
    assert parsed.column("min.id").to_pylist() == [1]
    assert parsed.column("max.wall").to_pylist() == [datetime.datetime(2026, 1, 1, 9)]
    assert parsed.column("null_count.name").to_pylist() == [1]


def test_timestamps_are_micros_even_when_the_session_asks_for_int96(spark, tmp_path):
    key = "spark.sql.parquet.outputTimestampType"
    spark.conf.set(key, "INT96")
    try:
        df = spark.createDataFrame([(datetime.datetime(2026, 1, 1, 0, 0, 0, 7),)], "at timestamp")
        uri = f"file://{tmp_path / 't'}"
        adds = write_files(df, uri, f"{uri}/_percolake/x", [])
        assert spark.conf.get(key) == "INT96", "the user's setting is restored"
    finally:
        spark.conf.unset(key)
    column = pq.read_metadata(tmp_path / "t" / adds[0].path).schema.column(0)
    assert column.physical_type == "INT64" and "micro" in column.logical_type.to_json()


def test_schema_is_nullable_like_sparks_files(spark):
    df = spark.range(3).selectExpr("id", "array(id) as ids", "named_struct('x', id) as s")
    assert df.schema["id"].nullable is False
    schema = json.loads(delta_schema_json(df))
    assert [f["nullable"] for f in schema["fields"]] == [True, True, True]
    assert schema["fields"][1]["type"]["containsNull"] is True
    assert schema["fields"][2]["type"]["fields"][0]["nullable"] is True


def test_empty_batch_adds_no_file(spark, tmp_path):
    uri = f"file://{tmp_path / 't'}"
    assert write_files(spark.range(0), uri, f"{uri}/_percolake/x", []) == []


def test_awkward_partition_values_survive_overwrite_partitions_and_read_back(spark, tmp_path):
    """Values Spark escapes in folder names, nulls, and timestamps (a non-UTC session)."""
    table = tmp_path / "t"
    schema = "id long, s string, at timestamp"
    utc = datetime.timezone.utc
    noon, next_day = (datetime.datetime(2026, 1, 1, 12, tzinfo=utc),
                      datetime.datetime(2026, 1, 2, 5, tzinfo=utc))
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        first = spark.createDataFrame([(1, "a/b c:d%", noon), (2, "x=y", noon), (3, None, noon),
                                       (4, "a/b c:d%", next_day)], schema)
        write = commit(table, first, "x0", 0, ["s", "at"])
        # Spark names the folders in New York time; Delta gets UTC
        assert any("at=2026-01-01 07%3A00%3A00" in a.path for a in write.add_files)
        assert {a.partition_values["at"] for a in write.add_files} \
            == {"2026-01-01T12:00:00.000000Z", "2026-01-02T05:00:00.000000Z"}
        second = spark.createDataFrame([(10, "a/b c:d%", noon), (11, None, noon)], schema)
        commit(table, second, "x1", 1, ["s", "at"], WriteMode.OVERWRITE_PARTITIONS)
        # delta-spark reads the values as the same instants in a session outside UTC (a
        # zoneless value it would read in New York time, five hours off)
        read_in_new_york = spark.read.format("delta").load(str(table)).toArrow().to_pylist()
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    expected = [(2, "x=y", noon), (4, "a/b c:d%", next_day), (10, "a/b c:d%", noon),
                (11, None, noon)]
    assert sorted((r["id"], r["s"], r["at"].astimezone(utc)) for r in read_in_new_york) \
        == expected
    delta_rows = read_delta_table(str(table)).to_pylist()
    assert sorted((r["id"], r["s"], r["at"]) for r in delta_rows) == expected
    frame = read_table_version(spark, f"file://{table}", 1)
    assert frame.schema.fieldNames() == ["id", "s", "at"]
    spark_rows = frame.toArrow().to_pylist()
    assert sorted((r["id"], r["s"], r["at"].astimezone(utc)) for r in spark_rows) == expected
    first_version = read_table_version(spark, f"file://{table}", 0).toArrow()
    assert sorted(first_version.column("id").to_pylist()) == [1, 2, 3, 4]


def test_reading_an_empty_version_gives_the_schema_and_no_rows(spark, tmp_path):
    table = tmp_path / "t"
    commit(table, spark.range(2), "x0", 0, [])
    commit(table, spark.range(0), "x1", 1, [], WriteMode.OVERWRITE)
    frame = read_table_version(spark, f"file://{table}", 1)
    assert frame.count() == 0 and frame.schema.fieldNames() == ["id"]
    assert pyarrow.table(DeltaTable(str(table)).get_add_actions(flatten=False)).num_rows == 0
