"""Tables delta-spark made with its table features on, written by ``txn.write``, read back by
delta-spark and compared with delta-spark's own write of the same rows to a copy of the table
(docs/delta-features.md). The refusal logic itself is tested without Spark in
``tests/test_table_features.py``.
"""

from __future__ import annotations

import datetime
import json
import shutil
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkside import Participant, UnsupportedTableFeature

pytestmark = pytest.mark.spark

# feature -> (columns, table properties or clause): delta-spark turns the feature on
REFUSED = {
    "identityColumns": ("id BIGINT GENERATED ALWAYS AS IDENTITY, name STRING", ""),
    "clustering": ("id BIGINT, name STRING", "CLUSTER BY (id)"),
    "rowTracking": ("id BIGINT, name STRING", "'delta.enableRowTracking'='true'"),
    "domainMetadata": ("id BIGINT, name STRING", "'delta.feature.domainMetadata'='supported'"),
    "v2Checkpoint": ("id BIGINT, name STRING", "'delta.checkpointPolicy'='v2'"),
    "allowColumnDefaults": ("id BIGINT, name STRING",
                            "'delta.feature.allowColumnDefaults'='supported'"),
    "icebergCompatV2": ("id BIGINT, name STRING", "'delta.columnMapping.mode'='name', "
                        "'delta.enableIcebergCompatV2'='true'"),
    "variantType": ("id BIGINT, name STRING, v VARIANT", ""),
    # delta-spark 4.4.0 still creates tables with these older features when asked by name
    "icebergCompatV1": ("id BIGINT, name STRING", "'delta.columnMapping.mode'='name', "
                        "'delta.enableIcebergCompatV1'='true'"),
    "typeWidening-preview": ("id BIGINT, name STRING",
                             "'delta.feature.typeWidening-preview'='supported'"),
    "variantType-preview": ("id BIGINT, name STRING",
                            "'delta.feature.variantType-preview'='supported'"),
}


def create(spark: SparkSession, path: Path, columns: str, properties: str = "",
           partitioned_by: str = "") -> None:
    clause = properties if properties.startswith("CLUSTER") else \
        (f"TBLPROPERTIES({properties})" if properties else "")
    partitions = f"PARTITIONED BY ({partitioned_by})" if partitioned_by else ""
    spark.sql(f"CREATE TABLE delta.`{path}` ({columns}) USING DELTA {partitions} {clause}")


def versions(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "_delta_log").glob("*.json"))


def rows(spark: SparkSession, path: Path) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).collect())


def batches(lake_daemon, name: str) -> Callable[[int, Callable], None]:  # noqa: ANN001
    """Runs batch after batch of a fresh pipeline, each through ``fn(txn)``."""
    participant = Participant(lake_daemon.target, pipeline_id=f"{name}-{uuid.uuid4().hex[:6]}")
    counter = iter(range(1000))

    def run(spark: SparkSession, fn: Callable) -> None:
        participant.run_batch(spark.range(1), next(counter), lambda df, b, txn: fn(txn))

    return run


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_a_table_with_a_feature_percolake_cannot_write_is_refused_with_nothing_written(
        spark, lake_daemon, lake, feature):
    """The batch also writes a plain table first: neither table shows anything, nothing is
    left in the refused table's folder, and the refusal names the feature."""
    columns, properties = REFUSED[feature]
    refused, plain = lake / "refused", lake / "plain"
    create(spark, refused, columns, properties)
    before = versions(refused)
    run = batches(lake_daemon, "refused")
    values = spark.createDataFrame([(1, "a")], "id long, name string")

    def write(txn) -> None:  # noqa: ANN001
        txn.write(values, str(plain))
        txn.write(values, str(refused))

    with pytest.raises(UnsupportedTableFeature, match=f"'{feature}'.*To write it"):
        run(spark, write)
    assert versions(refused) == before
    assert not (refused / "_percolake").exists()
    assert not (plain / "_delta_log").exists()


def table_features(spark: SparkSession, path: Path) -> list[str]:
    return sorted(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0].tableFeatures)


# feature -> the table properties that turn it on (checkpointProtection: see the test)
OWN_ENTRY_TABLES = {
    "vacuumProtocolCheck": "'delta.feature.vacuumProtocolCheck'='supported'",
    "checkpointProtection": "'delta.feature.vacuumProtocolCheck'='supported'",
    "inCommitTimestamp": "'delta.enableInCommitTimestamps'='true'",
}


@pytest.mark.parametrize("feature", sorted(OWN_ENTRY_TABLES))
def test_a_table_whose_feature_our_log_entries_honour_is_written_as_delta_spark_writes_it(
        spark, lake_daemon, lake, feature):
    """delta-rs commits nothing to these tables; percolake's own log entries do, an append
    then an overwrite, each equal to delta-spark's own write to a copy. The
    checkpointProtection table is as delta-spark 4.4.0's DROP FEATURE vacuumProtocolCheck
    leaves it (protected checkpoints, delta.requireCheckpointProtectionBeforeVersion). With
    in-commit timestamps, every commit's commitInfo comes first with one, increasing, and is
    the version's time for delta-spark, which commits on top of ours."""
    path = lake / feature
    create(spark, path, "id BIGINT, name STRING", OWN_ENTRY_TABLES[feature])
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    if feature == "checkpointProtection":
        spark.sql(f"ALTER TABLE delta.`{path}` DROP FEATURE vacuumProtocolCheck")
    assert feature in table_features(spark, path)
    copy = copy_of(path)
    run = batches(lake_daemon, feature)
    more = spark.createDataFrame([(2, "b"), (3, None)], "id long, name string")
    run(spark, lambda txn: txn.write(more, str(path)))
    more.write.format("delta").mode("append").save(str(copy))
    assert rows(spark, path) == rows(spark, copy) == [(1, "a"), (2, "b"), (3, None)]
    again = spark.createDataFrame([(4, "d")], "id long, name string")
    run(spark, lambda txn: txn.write(again, str(path), mode="overwrite"))
    again.write.format("delta").mode("overwrite").save(str(copy))
    assert rows(spark, path) == rows(spark, copy) == [(4, "d")]

    def last_operation(table: Path) -> tuple:
        entry = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0]
        return entry.operation, entry.operationParameters["mode"]

    assert last_operation(path) == last_operation(copy) == ("WRITE", "Overwrite")
    assert table_features(spark, path) == table_features(spark, copy)
    if feature == "inCommitTimestamp":
        spark.sql(f"INSERT INTO delta.`{path}` VALUES (5, 'e')")  # delta-spark after ours
        assert rows(spark, path) == [(4, "d"), (5, "e")]
        stamps = [json.loads((path / "_delta_log" / name).read_text().splitlines()[0])
                  ["commitInfo"]["inCommitTimestamp"] for name in versions(path)]
        assert stamps == sorted(set(stamps)) and len(stamps) == 5  # strictly increasing
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`") \
            .selectExpr("version", "unix_millis(timestamp) AS ms").collect()
        assert sorted((r.version, r.ms) for r in history) == list(enumerate(stamps))


def copy_of(path: Path) -> Path:
    copy = path.with_name(path.name + "-copy")
    shutil.copytree(path, copy)
    return copy


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapped_table_written_as_delta_spark_writes_it(spark, lake_daemon, lake, mode):
    """Append then overwrite_partitions, beside delta-spark's own writes of the same rows to a
    copy: delta-spark reads the same rows from both; percolake's files carry the physical names
    and field ids."""
    path = lake / "mapped"
    schema = "id BIGINT, s STRUCT<a: INT, b: STRING>, day DATE"
    create(spark, path, schema, f"'delta.columnMapping.mode'='{mode}'", "day")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, named_struct('a', 1, 'b', 'x'), "
              "DATE'2026-01-01')")
    copy = copy_of(path)
    run = batches(lake_daemon, f"mapped-{mode}")
    day2 = spark.sql("SELECT 2L id, named_struct('a', 2, 'b', 'y') s, DATE'2026-01-02' day "
                     "UNION ALL SELECT 3L, named_struct('a', 3, 'b', null), DATE'2026-01-01'")
    run(spark, lambda txn: txn.write(day2, str(path)))
    day2.write.format("delta").mode("append").save(str(copy))
    assert rows(spark, path) == rows(spark, copy)
    replaced = spark.sql("SELECT 4L id, named_struct('a', 4, 'b', 'z') s, DATE'2026-01-01' day")
    run(spark, lambda txn: txn.write(replaced, str(path), mode="overwrite_partitions"))
    replaced.write.format("delta").mode("overwrite") \
        .option("partitionOverwriteMode", "dynamic").save(str(copy))
    assert rows(spark, path) == rows(spark, copy)
    assert [r[0] for r in rows(spark, path)] == [2, 4]

    fields = json.loads(json.loads(next(
        line for line in (path / "_delta_log" / versions(path)[0]).read_text().splitlines()
        if '"metaData"' in line))["metaData"]["schemaString"])["fields"]
    ids = {f["metadata"]["delta.columnMapping.physicalName"]: f["metadata"]
           ["delta.columnMapping.id"] for f in fields}
    ours = sorted((path / "_percolake").rglob("*.parquet"))
    assert ours
    for file in ours:
        arrow = pq.read_schema(file)
        assert set(arrow.names) == set(ids) - {ids_name(fields, "day")}
        for field in arrow:
            assert int(field.metadata[b"PARQUET:field_id"]) == ids[field.name]


def last_metadata(path: Path) -> dict:
    """The ``metaData`` action of the table's latest version that has one."""
    for name in reversed(versions(path)):
        for line in (path / "_delta_log" / name).read_text().splitlines():
            if '"metaData"' in line:
                return json.loads(line)["metaData"]
    raise AssertionError(f"no metaData in {path}")


def column_ids(data_type: dict, prefix: str = "") -> dict[str, tuple[int, str]]:
    """Each field's path -> (column mapping id, physical name), nested fields too."""
    found: dict[str, tuple[int, str]] = {}
    for field in data_type.get("fields", []):
        path = f"{prefix}{field['name']}"
        found[path] = (field["metadata"]["delta.columnMapping.id"],
                       field["metadata"]["delta.columnMapping.physicalName"])
        if isinstance(field["type"], dict):
            found.update(column_ids(field["type"], f"{path}."))
    return found


@pytest.mark.parametrize("mode", ["name", "id"])
def test_merge_schema_adds_columns_to_a_column_mapped_table_as_delta_spark_does(
        spark, lake_daemon, lake, mode):
    """merge_schema adding a top-level column, a struct column and a field of an existing
    struct (its fields given in another order) to a column-mapped table, beside delta-spark's own
    mergeSchema append of the same rows to a copy: the same rows, the same ids for the same
    columns, the same maxColumnId; new physical names; files under physical names and ids."""
    path = lake / f"mapped-evolve-{mode}"
    create(spark, path, "id BIGINT, s STRUCT<a: INT, b: STRING>, day DATE",
           f"'delta.columnMapping.mode'='{mode}'", "day")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, named_struct('a', 1, 'b', 'x'), "
              "DATE'2026-01-01')")
    copy = copy_of(path)
    before = column_ids(json.loads(last_metadata(path)["schemaString"]))
    run = batches(lake_daemon, f"mapped-evolve-{mode}")
    wider = spark.sql(
        "SELECT 2L id, named_struct('a', 2, 'b', 'y', 'c', 2.5D) s, DATE'2026-01-02' day, "
        "'eur' currency, named_struct('q', 7, 'r', named_struct('z', 'k')) n "
        "UNION ALL SELECT 3L, null, DATE'2026-01-01', null, null")
    # ours gives the struct's fields in another order: written by name, under the ids
    reordered = wider.select("id", F.when(F.col("s").isNotNull(), F.struct(
        "s.c", "s.b", "s.a")).alias("s"), "day", "currency", "n")
    run(spark, lambda txn: txn.write(reordered, str(path), merge_schema=True))
    wider.write.format("delta").mode("append").option("mergeSchema", "true").save(str(copy))
    assert rows(spark, path) == rows(spark, copy)
    assert spark.read.format("delta").load(str(path)).schema == \
        spark.read.format("delta").load(str(copy)).schema

    ours, theirs = last_metadata(path), last_metadata(copy)
    assert ours["configuration"]["delta.columnMapping.maxColumnId"] == \
        theirs["configuration"]["delta.columnMapping.maxColumnId"] == "11"
    ours_ids = column_ids(json.loads(ours["schemaString"]))
    theirs_ids = column_ids(json.loads(theirs["schemaString"]))
    assert {p: i for p, (i, _) in ours_ids.items()} == {p: i for p, (i, _) in theirs_ids.items()}
    assert {p: v for p, v in ours_ids.items() if p in before} == before
    new_names = [n for p, (_, n) in ours_ids.items() if p not in before]
    assert len(new_names) == 6 and all(n.startswith("col-") for n in new_names)
    assert len(set(new_names)) == 6

    # the next batch, without merge_schema, writes the new columns
    again = spark.sql("SELECT 4L id, named_struct('c', 4.5D, 'a', 4, 'b', 'w') s, "
                      "DATE'2026-01-02' day, 'usd' currency, "
                      "named_struct('q', 8, 'r', named_struct('z', 'm')) n")
    run(spark, lambda txn: txn.write(again.select("id", F.struct("s.a", "s.b", "s.c").alias("s"),
                                                  "day", "currency", "n"), str(path)))
    again.write.format("delta").mode("append").option("mergeSchema", "true").save(str(copy))
    assert rows(spark, path) == rows(spark, copy)
    assert (4, (4, "w", 4.5), datetime.date(2026, 1, 2), "usd", (8, ("m",))) in rows(spark, path)

    physical = {n: i for i, n in ours_ids.values()}
    files = sorted((path / "_percolake").rglob("*.parquet"))
    assert files
    for file in files:
        arrow = pq.read_schema(file)
        assert set(arrow.names) == {ours_ids[c][1] for c in ("id", "s", "currency", "n")}
        for field in arrow:
            assert int(field.metadata[b"PARQUET:field_id"]) == physical[field.name]


def ids_name(fields: list[dict], column: str) -> str:
    return next(f["metadata"]["delta.columnMapping.physicalName"] for f in fields
                if f["name"] == column)


def with_deleted_rows(spark: SparkSession, path: Path) -> None:
    """A partitioned table with deletion vectors whose files have rows deleted by delta-spark."""
    create(spark, path, "id BIGINT, day STRING", "'delta.enableDeletionVectors'='true'", "day")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1,'a'),(2,'a'),(3,'b'),(4,'b'),(5,'c')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id IN (2, 4)")


def removes_with_vectors(path: Path) -> int:
    last = (path / "_delta_log" / versions(path)[-1]).read_text().splitlines()
    return sum(1 for line in last if '"remove"' in line
               and json.loads(line)["remove"].get("deletionVector"))


def test_overwrites_of_files_with_deletion_vectors_remove_exactly_the_visible_rows(
        spark, lake_daemon, lake):
    """overwrite_partitions, then overwrite, of files with rows deleted by delta-spark: the
    removes carry the files' deletion vectors, as delta-spark's own overwrites of a copy."""
    path = lake / "dv"
    with_deleted_rows(spark, path)
    copy = copy_of(path)
    run = batches(lake_daemon, "dv")
    partitions = spark.createDataFrame([(6, "a"), (7, "b"), (9, "a")],
                                       "id long, day string").coalesce(1)
    run(spark, lambda txn: txn.write(partitions, str(path), mode="overwrite_partitions"))
    partitions.write.format("delta").mode("overwrite") \
        .option("partitionOverwriteMode", "dynamic").save(str(copy))
    assert rows(spark, path) == rows(spark, copy) == [(5, "c"), (6, "a"), (7, "b"), (9, "a")]
    assert removes_with_vectors(path) == 2  # the files of a and b, which had deleted rows

    for table in (path, copy):  # a deletion vector on the file of a
        spark.sql(f"DELETE FROM delta.`{table}` WHERE id = 6")
    whole = spark.createDataFrame([(8, "d")], "id long, day string")
    run(spark, lambda txn: txn.write(whole, str(path), mode="overwrite"))
    whole.write.format("delta").mode("overwrite").save(str(copy))
    assert rows(spark, path) == rows(spark, copy) == [(8, "d")]
    assert removes_with_vectors(path) == 1


def test_change_data_feed_and_timestamp_ntz_table_written_and_fed_as_by_delta_spark(
        spark, lake_daemon, lake):
    path = lake / "cdf"
    create(spark, path, "id BIGINT, at TIMESTAMP_NTZ", "'delta.enableChangeDataFeed'='true'")
    copy = copy_of(path)
    run = batches(lake_daemon, "cdf")
    first = spark.sql("SELECT 1L id, TIMESTAMP_NTZ'2026-01-01 10:00:00' at")
    second = spark.sql("SELECT 2L id, TIMESTAMP_NTZ'2026-01-02 11:00:00' at")
    for df, mode in ((first, "append"), (second, "overwrite")):
        run(spark, lambda txn, df=df, mode=mode: txn.write(df, str(path), mode=mode))
        df.write.format("delta").mode(mode).save(str(copy))
        assert rows(spark, path) == rows(spark, copy)

    def changes(table: Path) -> list[tuple]:
        feed = spark.read.format("delta").option("readChangeFeed", "true") \
            .option("startingVersion", 1).load(str(table))
        return sorted((r.id, r._change_type, r._commit_version) for r in feed.collect())

    assert changes(path) == changes(copy) == [(1, "delete", 2), (1, "insert", 1),
                                              (2, "insert", 2)]


def test_merge_schema_widens_types_as_delta_spark_does(spark, lake_daemon, lake):
    """A table delta-spark made with delta.enableTypeWidening=true and widened itself (ALTER
    TABLE ... CHANGE COLUMN): merge_schema widens a column, a struct field, a decimal and the
    partition column in a batch that also writes another table, beside delta-spark's own
    mergeSchema append of the same rows to a copy: the same schema (delta.typeChanges
    included), rows and history operation; the new files carry the wider types. Then a plain
    overwrite, committed as percolake's own log entry too (delta-rs commits nothing there)."""
    path, other = lake / "widen", lake / "other"
    create(spark, path, "id INT, f FLOAT, s STRUCT<a: SHORT, b: STRING>, amount DECIMAL(5,2), "
                        "p INT", "'delta.enableTypeWidening'='true'", "p")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 1.5, named_struct('a', 1, 'b', 'x'), "
              "1.25, 1)")
    spark.sql(f"ALTER TABLE delta.`{path}` CHANGE COLUMN id TYPE BIGINT")
    copy = copy_of(path)
    run = batches(lake_daemon, "widen")
    wider = spark.sql("SELECT 2L id, 2.5D f, named_struct('a', 2, 'b', 'y') s, "
                      "CAST(12345.5 AS DECIMAL(10,2)) amount, 2L p")

    def write(txn) -> None:  # noqa: ANN001
        txn.write(wider, str(other))
        txn.write(wider, str(path), merge_schema=True)

    run(spark, write)
    wider.write.format("delta").mode("append").option("mergeSchema", "true").save(str(copy))
    assert rows(spark, path) == rows(spark, copy) == [
        (1, 1.5, (1, "x"), Decimal("1.25"), 1), (2, 2.5, (2, "y"), Decimal("12345.50"), 2)]
    assert rows(spark, other) == [(2, 2.5, (2, "y"), Decimal("12345.50"), 2)]
    ours, theirs = last_metadata(path), last_metadata(copy)
    assert json.loads(ours["schemaString"]) == json.loads(theirs["schemaString"])
    assert json.loads(ours["schemaString"])["fields"][0]["metadata"] == {"delta.typeChanges": [
        {"toType": "long", "fromType": "integer"}]}  # ALTER TABLE's, kept
    assert spark.read.format("delta").load(str(path)).schema == \
        spark.read.format("delta").load(str(copy)).schema

    def last_operation(table: Path) -> tuple:
        entry = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0]
        parameters = entry.operationParameters
        return entry.operation, parameters["mode"], parameters.get("canMergeSchema")

    assert last_operation(path) == last_operation(copy) == ("WRITE", "Append", "true")
    files = sorted((path / "_percolake").rglob("*.parquet"))
    assert files
    for file in files:
        arrow = pq.read_schema(file)
        assert str(arrow.field("id").type) == "int64" and str(arrow.field("f").type) == "double"
        assert str(arrow.field("s").type.field("a").type) == "int32"
        assert str(arrow.field("amount").type) == "decimal128(10, 2)"

    again = spark.sql("SELECT 3L id, 3.5D f, named_struct('a', 3, 'b', 'z') s, "
                      "CAST(7 AS DECIMAL(10,2)) amount, 1L p")
    run(spark, lambda txn: txn.write(again, str(path), mode="overwrite"))
    again.write.format("delta").mode("overwrite").save(str(copy))
    assert rows(spark, path) == rows(spark, copy) == [(3, 3.5, (3, "z"), Decimal("7.00"), 1)]
    assert last_operation(path)[:2] == last_operation(copy)[:2] == ("WRITE", "Overwrite")


def test_an_append_only_table_takes_appends_as_delta_spark_and_refuses_an_overwrite(
        spark, lake_daemon, lake):
    """``delta.appendOnly``: an append equal to delta-spark's own append to a copy; an overwrite
    refused before the commit point, naming the property, as delta-spark refuses its own."""
    path = lake / "append-only"
    create(spark, path, "id BIGINT, name STRING", "'delta.appendOnly'='true'")
    copy = copy_of(path)
    run = batches(lake_daemon, "append-only")
    values = spark.createDataFrame([(1, "a"), (2, None)], "id long, name string")
    run(spark, lambda txn: txn.write(values, str(path)))
    values.write.format("delta").mode("append").save(str(copy))
    assert rows(spark, path) == rows(spark, copy)
    with pytest.raises(Exception, match="DELTA_CANNOT_MODIFY_APPEND_ONLY"):  # noqa: PT011
        values.write.format("delta").mode("overwrite").save(str(copy))
    before, files = versions(path), set(path.glob("_percolake/*/*.parquet"))
    with pytest.raises(Exception, match=r"delta.appendOnly=true: a overwrite write cannot "  # noqa: PT011
                                        "remove its files"):
        run(spark, lambda txn: txn.write(values, str(path), mode="overwrite"))
    assert versions(path) == before
    assert rows(spark, path) == rows(spark, copy)
    assert set(path.glob("_percolake/*/*.parquet")) == files  # the attempt's were deleted
