"""MERGE, UPDATE and DELETE through ``txn.delta_table``, side by side with delta-spark.

Each reference test runs one operation (the same Python function) on percolake's table inside a
batch and with delta-spark's own ``DeltaTable`` on a copy, then compares the two tables as
delta-spark reads them. Inputs are generated change streams: inserts, updates, deletes, null
keys, a partitioned target.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow
import pyarrow.parquet as pq
import pytest
from delta.tables import DeltaTable
from deltalake import DeltaTable as RustTable
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from percolake.lake.arrow_read import read_delta_table
from percolake.lake.deleted_rows import deleted_rows
from percolake.lake.deletion_vectors import deletion_vectors
from percolake.lake.delta_commit import files_of_version
from sparkside import Participant
from sparkside.errors import MultipleSourceRowsMatch, RowLevelWriteRefused
from sparkside.merge_source import needs_materializing
from tests.spark.helpers import committed_batches, run_on_both, transactions
from tests.spark.test_version_checksum import checksum, validated

pytestmark = pytest.mark.spark

SCHEMA = "id long, value long, region string"
REGIONS = ["eu", "us", "ap"]


def target_rows(rng: random.Random, keys: int) -> list[tuple]:
    rows = [(k, rng.randrange(100), rng.choice(REGIONS)) for k in range(keys)]
    return rows + [(None, rng.randrange(100), rng.choice(REGIONS)) for _ in range(3)]


def change_rows(rng: random.Random, keys: int) -> list[tuple]:
    """One change per key (updates, deletes, inserts of new keys) plus null-key rows."""
    changes = []
    for key in rng.sample(range(keys * 2), keys):
        op = "D" if key < keys and rng.random() < 0.3 else "U"
        changes.append((key, rng.randrange(200), rng.choice(REGIONS), op))
    changes += [(None, rng.randrange(200), rng.choice(REGIONS), "U") for _ in range(2)]
    return changes


def make_table(spark: SparkSession, path: Path, rows: list[tuple], partitioned: bool) -> None:
    writer = spark.createDataFrame(rows, SCHEMA).write.format("delta")
    (writer.partitionBy("region") if partitioned else writer).save(str(path))


def table_rows(spark: SparkSession, path: Path) -> list[tuple]:
    """The table as delta-spark reads it, in a total order (nulls first)."""
    got = [tuple(r) for r in spark.read.format("delta").load(str(path)).collect()]
    return sorted(got, key=lambda r: tuple((v is not None, v) for v in r))


Operation = Callable[[object, DataFrame], object]


def side_by_side(spark: SparkSession, participant: Participant, lake: Path, name: str,
                 rows: list[tuple], partitioned: bool, operations: list[Operation],
                 source: DataFrame) -> tuple[Path, Path]:
    """Runs ``operations`` in order in one batch on ``lake/name`` and with delta-spark on a copy;
    asserts delta-spark reads both the same; returns both paths."""
    ours, theirs = lake / name, lake / f"{name}-reference"
    make_table(spark, ours, rows, partitioned)
    shutil.copytree(ours, theirs)

    run_on_both(spark, participant, 0, operations, source, ours, theirs)
    assert table_rows(spark, ours) == table_rows(spark, theirs)
    return ours, theirs


def cdc_merge(dt, source: DataFrame) -> object:  # noqa: ANN001
    return (dt.alias("t").merge(source.alias("s"), "t.id = s.id")
            .whenMatchedDelete("s.op = 'D'")
            .whenMatchedUpdate(set={"value": "s.value", "region": "s.region"})
            .whenNotMatchedInsert("s.op <> 'D'",
                                  values={"id": "s.id", "value": "s.value",
                                          "region": "s.region"})
            .execute())


@pytest.mark.parametrize("partitioned", [False, True])
def test_cdc_merge_equals_delta_spark(spark, lake_daemon, lake, partitioned) -> None:  # noqa: ANN001
    rng = random.Random(7 + partitioned)
    participant = Participant(lake_daemon.target, pipeline_id=f"cdc-{lake.name}")
    source = spark.createDataFrame(change_rows(rng, 40), f"{SCHEMA}, op string")
    ours, _ = side_by_side(spark, participant, lake, "accounts", target_rows(rng, 40),
                           partitioned, [cdc_merge], source)
    info = RustTable(str(ours)).history(1)[0]
    assert info["percolake.operation"] == "MERGE"
    metrics = info["operationMetrics"]
    deleted = source.where("op = 'D'").count()
    assert int(metrics["numTargetRowsDeleted"]) == deleted
    assert int(metrics["numTargetRowsInserted"]) + int(metrics["numTargetRowsUpdated"]) \
        == source.count() - deleted


def test_merge_into_an_empty_table_equals_delta_spark(spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """A table just created (no data file yet, as after CREATE TABLE ... USING DELTA): Spark
    drops the join with the empty target, and the source's row count is observed on the
    insert pass instead."""
    rng = random.Random(5)
    participant = Participant(lake_daemon.target, pipeline_id=f"empty-{lake.name}")
    source = spark.createDataFrame(change_rows(rng, 20), f"{SCHEMA}, op string")
    ours, _ = side_by_side(spark, participant, lake, "fresh", [], False, [cdc_merge], source)
    metrics = RustTable(str(ours)).history(1)[0]["operationMetrics"]
    assert int(metrics["numSourceRows"]) == source.count()
    assert int(metrics["numTargetRowsInserted"]) == source.where("op <> 'D'").count()


@pytest.mark.parametrize("partitioned", [False, True])
def test_insert_only_merge_inserts_only_unmatched_rows_as_delta_spark_does(  # noqa: ANN001
        spark, lake_daemon, lake, partitioned) -> None:
    """A MERGE whose only clause is ``whenNotMatchedInsert``: source rows whose key the table
    holds are not inserted again, no target file is rewritten (delta-spark's insert-only
    MERGE: one pass, new files only)."""
    rng = random.Random(13 + partitioned)
    participant = Participant(lake_daemon.target, pipeline_id=f"ins-{lake.name}")
    source = spark.createDataFrame(change_rows(rng, 30), f"{SCHEMA}, op string")

    def insert_only(dt, src: DataFrame) -> object:  # noqa: ANN001
        return (dt.alias("t").merge(src.alias("s"), "t.id = s.id AND t.region = s.region")
                .whenNotMatchedInsert("s.op <> 'D'", values={"id": "s.id", "value": "s.value",
                                                             "region": "s.region"})
                .execute())

    ours, theirs = side_by_side(spark, participant, lake, "facts", target_rows(rng, 30),
                                partitioned, [insert_only], source)
    ours_metrics = RustTable(str(ours)).history(1)[0]["operationMetrics"]
    theirs_metrics = RustTable(str(theirs)).history(1)[0]["operationMetrics"]
    for name in ("numSourceRows", "numTargetRowsInserted", "numTargetFilesRemoved",
                 "numTargetRowsCopied"):
        assert int(ours_metrics[name]) == int(theirs_metrics[name]), name


def test_every_clause_and_several_operations_in_one_batch(spark, lake_daemon, lake) -> None:  # noqa: ANN001
    rng = random.Random(11)
    participant = Participant(lake_daemon.target, pipeline_id=f"all-{lake.name}")
    source = spark.createDataFrame(change_rows(rng, 30), f"{SCHEMA}, op string")

    def full_merge(dt, src: DataFrame) -> object:  # noqa: ANN001
        return (dt.alias("t").merge(src.alias("s"), "t.id = s.id AND s.op = 'U'")
                .whenMatchedUpdate("s.value > 100", set={"value": "t.value + s.value"})
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll("s.value % 2 = 0")
                .whenNotMatchedBySourceUpdate("t.value < 20", set={"value": "-t.value"})
                .whenNotMatchedBySourceDelete("t.value >= 90")
                .execute())

    def update(dt, src: DataFrame) -> None:  # noqa: ANN001
        dt.update("region = 'eu'", {"value": "value * 10"})

    def delete(dt, src: DataFrame) -> None:  # noqa: ANN001
        dt.delete(F.col("value") > 500)

    ours, _ = side_by_side(spark, participant, lake, "dim", target_rows(rng, 30), True,
                           [full_merge, update, delete], source)
    history = RustTable(str(ours)).history()
    assert len(history) == 2, "the batch's three operations are one Delta commit"
    assert history[0]["percolake.operation"] == "MERGE,UPDATE,DELETE"


@pytest.mark.parametrize("mode", ["name", "id"])
def test_update_merge_and_delete_of_a_column_mapped_table_equal_delta_spark(  # noqa: ANN001
        spark, lake_daemon, lake, mode) -> None:
    """A table delta-spark created with column mapping (``id`` partitioned): the rewrite reads
    logical rows and writes physical names with the mapping ids as Parquet field ids."""
    rng = random.Random(13)
    participant = Participant(lake_daemon.target, pipeline_id=f"cm-{mode}-{lake.name}")
    source = spark.createDataFrame(change_rows(rng, 30), f"{SCHEMA}, op string")
    ours, theirs = lake / f"mapped-{mode}", lake / f"mapped-{mode}-reference"
    partitioned = "PARTITIONED BY (region)" if mode == "id" else ""
    spark.sql(f"CREATE TABLE delta.`{ours}` ({SCHEMA}) USING DELTA {partitioned} "
              f"TBLPROPERTIES ('delta.columnMapping.mode'='{mode}')")
    spark.createDataFrame(target_rows(rng, 30), SCHEMA).write.format("delta") \
        .mode("append").save(str(ours))
    shutil.copytree(ours, theirs)

    def update(dt, src: DataFrame) -> None:  # noqa: ANN001
        dt.update("region = 'eu'", {"value": "value * 10"})

    def delete(dt, src: DataFrame) -> None:  # noqa: ANN001
        dt.delete(F.col("value") > 500)

    run_on_both(spark, participant, 0, (update, cdc_merge, delete), source, ours, theirs)
    assert table_rows(spark, ours) == table_rows(spark, theirs)
    assert RustTable(str(ours)).history(1)[0]["percolake.operation"] == "UPDATE,MERGE,DELETE"

    fields = json.loads(RustTable(str(ours)).schema().to_json())["fields"]
    mapping = {f["metadata"]["delta.columnMapping.physicalName"]:
               f["metadata"]["delta.columnMapping.id"] for f in fields}
    data = [c for c in mapping if not (mode == "id" and c == next(
        f["metadata"]["delta.columnMapping.physicalName"] for f in fields
        if f["name"] == "region"))]
    entry = max((ours / "_delta_log").glob("*.json"))
    adds = [json.loads(line)["add"] for line in entry.read_text().splitlines()
            if '"add"' in line]
    assert adds, "the batch wrote new files"
    for add in adds:
        schema = pq.read_schema(ours / add["path"])
        assert sorted(schema.names) == sorted(data), "files hold the physical names"
        assert {n: int(schema.field(n).metadata[b"PARQUET:field_id"]) for n in schema.names} \
            == {n: mapping[n] for n in data}
        assert set(json.loads(add["stats"])["minValues"]) <= set(data), \
            "statistics keyed by physical names"
        assert set(add["partitionValues"]) <= set(mapping), "partitions by physical name"

    # withSchemaEvolution adds the source's new columns (op, weight) with ids above
    # maxColumnId and physical names in the commit of the data, as delta-spark's MERGE does;
    # the UPDATE after it in the batch reads the new column from the MERGE's files
    evolving = source.withColumn("weight", F.lit(1.5))

    def evolve(table: Callable[[], object], src: DataFrame) -> None:
        (table().alias("t").merge(src.alias("s"), "t.id = s.id").withSchemaEvolution()
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        table().update("op = 'D'", {"value": "value + 1000"})  # a fresh one: the new schema

    participant.run_batch(spark.range(1), 1, lambda df, b, txn: evolve(
        lambda: txn.delta_table(str(ours)), evolving))
    evolve(lambda: DeltaTable.forPath(spark, str(theirs)), evolving)
    assert table_rows(spark, ours) == table_rows(spark, theirs)
    assert spark.read.format("delta").load(str(ours)).schema == \
        spark.read.format("delta").load(str(theirs)).schema
    entry = [json.loads(line) for line in
             max((ours / "_delta_log").glob("*.json")).read_text().splitlines()]
    (metadata,) = [a["metaData"] for a in entry if "metaData" in a]  # with the data
    reference = next(json.loads(line)["metaData"] for path in sorted(  # its MERGE's
        (theirs / "_delta_log").glob("*.json"), reverse=True)
        for line in path.read_text().splitlines() if '"metaData"' in line)
    assert metadata["configuration"] == reference["configuration"]
    assert metadata["configuration"]["delta.columnMapping.maxColumnId"] == "5"

    def ids(schema_string: str) -> dict[str, int]:
        return {f["name"]: f["metadata"]["delta.columnMapping.id"]
                for f in json.loads(schema_string)["fields"]}

    assert ids(metadata["schemaString"]) == ids(reference["schemaString"])
    physical = {f["metadata"]["delta.columnMapping.physicalName"]:
                f["metadata"]["delta.columnMapping.id"]
                for f in json.loads(metadata["schemaString"])["fields"]
                if f["name"] in ("op", "weight")}
    assert len(physical) == 2 and all(n.startswith("col-") for n in physical)
    adds = [a["add"] for a in entry if "add" in a]
    assert adds
    for add in adds:
        schema = pq.read_schema(ours / add["path"])
        assert {n: int(schema.field(n).metadata[b"PARQUET:field_id"])
                for n in schema.names if n in physical} == physical


def test_columns_of_to_df_resolve_in_the_tables_operations_as_in_delta_spark(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """Column objects of a table object's ``toDF()`` (taken before or after its earlier
    operations, of it or of its alias) in a MERGE's condition, clause conditions and
    assignments, an UPDATE and a DELETE, as delta-spark's ``DeltaTable`` takes them on a copy;
    Columns of another table object are refused with delta-spark's error classes (and the
    batch goes on, as delta-spark's table stays unchanged)."""
    participant = Participant(lake_daemon.target, pipeline_id=f"cols-{lake.name}")
    ours, theirs = lake / "cols", lake / "cols-reference"
    make_table(spark, ours, [(1, 10, "eu"), (2, 20, "us"), (3, 30, "ap")], False)
    shutil.copytree(ours, theirs)
    source = spark.createDataFrame([(2, 5, "eu"), (4, 40, "us")], SCHEMA)
    s = source.alias("s")

    def operations(dt, other) -> list[str | None]:  # noqa: ANN001
        before = dt.toDF()["id"]  # taken before the operations change the table
        t = dt.alias("t")
        (t.merge(s, dt.toDF()["id"] == source["id"])
         .whenMatchedUpdate(condition=t.toDF()["value"] > 0,
                            set={"value": dt.toDF()["value"] + source["value"]})
         .whenNotMatchedInsert(values={"id": source["id"], "value": source["value"] * 2,
                                       "region": F.lit("new")}).execute())
        dt.update(condition=before == 1, set={"value": dt.toDF().value + 1})
        t.delete(t.toDF()["id"] == 3)
        (t.merge(s, t.toDF().id == F.col("s.id"))
         .whenNotMatchedBySourceUpdate(condition=dt.toDF()["id"] == 1,
                                       set={"value": before * 100}).execute())
        # a source made from toDF(): its columns are the source's (delta-spark renews the
        # target's)
        mine = dt.toDF().where("id = 1").withColumn("value", F.col("value") + 7)
        t.merge(mine.alias("m"), "t.id = m.id").whenMatchedUpdateAll().execute()
        # such a source with the condition and assignments in Columns of toDF() and of it:
        # delta-spark resolves the attributes both sides hold by their names (qualified by
        # the alias: the target's; bare: ambiguous, refused below)
        twin = dt.toDF().where("id = 2")
        (t.merge(twin.alias("w"), t.toDF()["id"] == F.col("w.id"))
         .whenMatchedUpdate(set={"value": F.col("w.value") + t.toDF()["value"]}).execute())
        refused = []
        for operation in (
                lambda: t.merge(twin.alias("w"), dt.toDF()["id"] == twin["id"])
                .whenMatchedUpdate(set={"value": twin["value"] + dt.toDF()["value"]})
                .execute(),
                lambda: t.merge(s, other.toDF()["id"] == source["id"])
                .whenMatchedDelete().execute(),
                lambda: t.merge(s, "t.id = s.id")
                .whenMatchedUpdate(set={"value": other.toDF()["value"]}).execute(),
                lambda: dt.update(other.toDF()["id"] == 1, {"value": F.lit(0)}),
                lambda: dt.delete(other.toDF()["id"] == 2)):
            try:
                operation()
                refused.append(None)
            except Exception as error:  # noqa: BLE001 - its class is compared below
                refused.append(error.getCondition())
        return refused

    ours_refused = []
    participant.run_batch(spark.range(1), 0, lambda df, b, txn: ours_refused.extend(
        operations(txn.delta_table(str(ours)), txn.delta_table(str(ours)))))
    theirs_refused = operations(DeltaTable.forPath(spark, str(theirs)),
                                DeltaTable.forPath(spark, str(theirs)))
    assert table_rows(spark, ours) == table_rows(spark, theirs)
    assert ours_refused == theirs_refused
    assert all(theirs_refused), theirs_refused
    assert RustTable(str(ours)).version() == 1, "the batch's operations are one commit"


def test_several_source_rows_matching_one_target_row_fail_naming_it(spark, lake_daemon,
                                                                    lake) -> None:  # noqa: ANN001
    participant = Participant(lake_daemon.target, pipeline_id=f"dup-{lake.name}")
    table = lake / "dup"
    make_table(spark, table, [(1, 10, "eu"), (2, 20, "us")], False)
    source = spark.createDataFrame([(2, 1, "eu", "U"), (2, 2, "us", "U")],
                                   f"{SCHEMA}, op string")
    with pytest.raises(MultipleSourceRowsMatch,
                       match="DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE") as failed:
        participant.run_batch(spark.range(1), 0,
                              lambda df, b, txn: cdc_merge(txn.delta_table(str(table)), source))
    assert "'id': 2" in str(failed.value)
    with pytest.raises(Exception, match="MULTIPLE_SOURCE_ROW"):  # delta-spark fails the same
        cdc_merge(DeltaTable.forPath(spark, str(table)), source)
    with pytest.raises(MultipleSourceRowsMatch):  # also beside a not-matched-by-source clause
        participant.run_batch(spark.range(1), 0, lambda df, b, txn: (
            txn.delta_table(str(table)).alias("t").merge(source.alias("s"), "t.id = s.id")
            .whenMatchedUpdateAll().whenNotMatchedBySourceDelete().execute()))
    assert RustTable(str(table)).version() == 0
    attempt = transactions(lake_daemon.stub, participant.pipeline_id)[0]
    assert "MULTIPLE_SOURCE_ROW" in attempt.abort_reason
    assert not any((table / "_percolake").glob("*/*")), "the aborted attempt's files are gone"


def test_a_failure_later_in_the_batch_hides_the_merge_and_the_replay_applies_it_once(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    participant = Participant(lake_daemon.target, pipeline_id=f"replay-{lake.name}")
    balances, log = lake / "balances", str(lake / "log")
    make_table(spark, balances, [(1, 100, "eu")], False)
    credit = spark.createDataFrame([(1, 10, "eu", "U")], f"{SCHEMA}, op string")

    def batch(fail: bool):  # noqa: ANN202
        def run(df: DataFrame, batch_id: int, txn) -> None:  # noqa: ANN001
            (txn.delta_table(str(balances)).alias("t").merge(credit.alias("s"), "t.id = s.id")
             .whenMatchedUpdate(set={"value": "t.value + s.value"}).execute())
            txn.write(credit, log)
            if fail:
                raise RuntimeError("a later write of the batch failed")
        return run

    with pytest.raises(RuntimeError, match="later write"):
        participant.run_batch(spark.range(1), 0, batch(fail=True))
    assert table_rows(spark, balances) == [(1, 100, "eu")]
    assert not any((balances / "_percolake").glob("*/*"))
    participant.run_batch(spark.range(1), 0, batch(fail=False))
    participant.run_batch(spark.range(1), 0, batch(fail=False))  # a replay: already committed
    assert table_rows(spark, balances) == [(1, 110, "eu")]
    assert len(read_delta_table(log).to_pylist()) == 1
    assert len(committed_batches(lake_daemon.stub, participant.pipeline_id)) == 1


def test_an_outside_commit_after_the_read_aborts_the_attempt_and_the_batch_retries(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    participant = Participant(lake_daemon.target, pipeline_id=f"outside-{lake.name}",
                              row_level_retries=2)
    table = lake / "dim"
    make_table(spark, table, [(1, 1, "eu"), (2, 2, "us")], False)
    source = spark.createDataFrame([(1, 50, "eu", "U"), (3, 30, "ap", "U")],
                                   f"{SCHEMA}, op string")
    attempts = []

    def batch(df: DataFrame, batch_id: int, txn) -> None:  # noqa: ANN001
        cdc_merge(txn.delta_table(str(table)), source)
        attempts.append(txn.txn_id)
        if len(attempts) == 1:  # another writer appends after this attempt read the table
            write_deltalake(str(table), pyarrow.table(
                {"id": [3], "value": [7], "region": ["ap"]}), mode="append")

    participant.run_batch(spark.range(1), 0, batch)
    assert len(attempts) == 2
    states = {t.txn_id: t for t in transactions(lake_daemon.stub, participant.pipeline_id)}
    assert "conflicts with its row-level write" in states[attempts[0]].abort_reason
    assert not (table / "_percolake" / attempts[0]).exists()
    # the retry read the outside row: id 3 matched it (updated), not inserted twice
    assert table_rows(spark, table) == [(1, 50, "eu"), (2, 2, "us"), (3, 30, "ap")]


def test_a_merge_reading_one_partition_is_not_retried_for_a_blind_append_and_a_delete_elsewhere(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """WriteSerializable (docs/row-level-writes.md, Concurrency): while the batch holds its
    MERGE of partition eu, delta-spark blind-appends to eu and deletes a row of us; neither
    conflicts, so the batch commits on its first attempt, after both, with every row."""
    participant = Participant(lake_daemon.target, pipeline_id=f"ws-{lake.name}",
                              row_level_retries=0)
    table = lake / "dim"
    make_table(spark, table, [(1, 1, "eu"), (2, 2, "us"), (3, 3, "us")], True)
    source = spark.createDataFrame([(1, 50, "eu", "U"), (4, 40, "eu", "U")],
                                   f"{SCHEMA}, op string")

    def batch(df: DataFrame, batch_id: int, txn) -> None:  # noqa: ANN001
        (txn.delta_table(str(table)).alias("t")
         .merge(source.alias("s"), "t.region = 'eu' AND t.id = s.id")
         .whenMatchedUpdate(set={"value": "s.value"})
         .whenNotMatchedInsert(values={"id": "s.id", "value": "s.value",
                                       "region": "s.region"}).execute())
        outside = df.sparkSession.newSession()  # another job: its commits are not the batch's
        outside.createDataFrame([(5, 5, "eu")], SCHEMA).write.format("delta") \
            .mode("append").save(str(table))
        DeltaTable.forPath(outside, str(table)).delete("region = 'us' AND id = 2")

    participant.run_batch(spark.range(1), 0, batch)
    assert table_rows(spark, table) == [(1, 50, "eu"), (3, 3, "us"), (4, 40, "eu"),
                                        (5, 5, "eu")]
    merged = history(spark, table)
    assert merged["operation"] == "MERGE" and merged["isBlindAppend"] is False
    assert merged["readVersion"] == merged["version"] - 3, "it landed after both"
    assert merged["isolationLevel"] == "WriteSerializable"


def test_a_delta_spark_write_inside_the_batch_fails_it_naming_txn_delta_table(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    participant = Participant(lake_daemon.target, pipeline_id=f"inside-{lake.name}")
    table = lake / "dim"
    make_table(spark, table, [(1, 1, "eu")], False)
    source = spark.createDataFrame([(1, 5, "eu", "U")], f"{SCHEMA}, op string")

    def batch(df: DataFrame, batch_id: int, txn) -> None:  # noqa: ANN001
        txn.delta_table(str(table)).delete("id = 99")  # the batch writes the table
        cdc_merge(DeltaTable.forPath(df.sparkSession, str(table)), source)  # delta-spark's own

    with pytest.raises(RowLevelWriteRefused, match=r"txn\.delta_table"):
        participant.run_batch(spark.range(1), 0, batch)
    history = [json.dumps(h) for h in RustTable(str(table)).history()]
    assert not any("percolake.txn_id" in h for h in history), "nothing of the batch committed"


def history(spark: SparkSession, path: Path) -> dict:
    """The newest commit as delta-spark's DESCRIBE HISTORY shows it."""
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0].asDict()


def without_ids(parameters: dict) -> dict:
    """operationParameters with Spark's expression ids (``id#207L``) left out."""
    return {k: re.sub(r"#\d+", "#", v) for k, v in parameters.items()}


def test_describe_history_shows_delta_sparks_operation_parameters_and_metric_names(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """Each operation's commit, read by delta-spark, names what delta-spark's own operation on
    a copy names: the operation, its parameters' keys and its metrics' keys."""
    rng = random.Random(5)
    source = spark.createDataFrame(change_rows(rng, 20), f"{SCHEMA}, op string")
    operations: dict[str, Operation] = {
        "MERGE": cdc_merge,
        "UPDATE": lambda dt, src: dt.update("region = 'eu'", {"value": "value + 1"}),
        "DELETE": lambda dt, src: dt.delete(F.col("value") > 50),
    }
    for name, operation in operations.items():
        participant = Participant(lake_daemon.target, pipeline_id=f"hist-{name}-{lake.name}")
        ours, theirs = side_by_side(spark, participant, lake, name.lower(),
                                    target_rows(rng, 20), False, [operation], source)
        got, expected = history(spark, ours), history(spark, theirs)
        assert got["operation"] == expected["operation"] == name
        assert set(got["operationParameters"]) == set(expected["operationParameters"]), name
        # the conditions as delta-spark renders them: resolved, with expression ids (which
        # differ from run to run: left out of the comparison)
        assert without_ids(got["operationParameters"]) == \
            without_ids(expected["operationParameters"]), name
        assert set(got["operationMetrics"]) == set(expected["operationMetrics"]), name
        assert got["readVersion"] == expected["readVersion"] == 0
        assert got["isBlindAppend"] is False
        assert got["userMetadata"] and "percolake.txn_id" in got["userMetadata"]
        rows_metric = {"MERGE": "numTargetRowsDeleted", "UPDATE": "numUpdatedRows",
                       "DELETE": "numDeletedRows"}[name]
        assert got["operationMetrics"][rows_metric] == expected["operationMetrics"][rows_metric]


def test_a_rewrite_of_files_with_deletion_vectors_removes_them_with_their_vectors(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """A delta-spark table with deletion vectors (rows deleted by delta-spark, one vector
    found only in a checkpoint) that no longer enables them (copy-on-write, as delta-spark):
    percolake's UPDATE and MERGE rewrite the files' visible rows and remove each file with its
    vector; delta-spark reads what its own operations make."""
    participant = Participant(lake_daemon.target, pipeline_id=f"dv-{lake.name}")
    ours, theirs = lake / "dv", lake / "dv-reference"
    (spark.createDataFrame([(1, 1, "eu"), (2, 2, "eu"), (5, 5, "eu")], SCHEMA).coalesce(1)
     .write.format("delta").option("delta.enableDeletionVectors", "true")
     .option("delta.checkpointInterval", "2").save(str(ours)))
    spark.createDataFrame([(3, 3, "us"), (4, 4, "us")], SCHEMA).coalesce(1).write \
        .format("delta").mode("append").save(str(ours))
    spark.sql(f"DELETE FROM delta.`{ours}` WHERE id = 1")  # a vector on eu's file: version 2
    spark.sql(f"DELETE FROM delta.`{ours}` WHERE id = 4")  # and on us's file: version 3
    assert (ours / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()
    (ours / "_delta_log" / f"{2:020d}.json").unlink()  # eu's vector now only in the checkpoint
    spark.sql(f"ALTER TABLE delta.`{ours}` SET TBLPROPERTIES "  # version 4
              "('delta.enableDeletionVectors' = 'false')")
    shutil.copytree(ours, theirs)
    source = spark.createDataFrame([(2, 20, "eu", "U"), (3, 0, "us", "D"), (9, 9, "ap", "U")],
                                   f"{SCHEMA}, op string")

    def update(dt, src: DataFrame) -> None:  # noqa: ANN001
        dt.update("id = 5", {"value": "50"})

    def batch(df: DataFrame, batch_id: int, txn) -> None:  # noqa: ANN001
        update(txn.delta_table(str(ours)), source)
        cdc_merge(txn.delta_table(str(ours)), source)

    participant.run_batch(spark.range(1), 0, batch)
    update(DeltaTable.forPath(spark, str(theirs)), source)
    cdc_merge(DeltaTable.forPath(spark, str(theirs)), source)
    assert table_rows(spark, ours) == table_rows(spark, theirs) == [
        (2, 20, "eu"), (5, 50, "eu"), (9, 9, "ap")]
    entry = [json.loads(line) for line in
             (ours / "_delta_log" / f"{5:020d}.json").read_text().splitlines()]
    removes = [a["remove"] for a in entry if "remove" in a]
    assert len(removes) == 2 and all(r.get("deletionVector") for r in removes), removes
    assert not any(a["add"].get("deletionVector") for a in entry if "add" in a)
    info = entry[0]["commitInfo"]
    assert info["operation"] == "UPDATE,MERGE"
    metrics = info["operationMetrics"]
    assert int(metrics["numDeletionVectorsRemoved"]) \
        + int(metrics["numTargetDeletionVectorsRemoved"]) == 2
    assert [p["operation"] for p in json.loads(info["operationParameters"]["operations"])] \
        == ["UPDATE", "MERGE"]


def records_read(spark: SparkSession, run: Callable[[], object]) -> int:
    """Rows (and log lines) read from storage by the Spark stages ``run`` starts."""
    context = spark.sparkContext
    store, jvm = context._jsc.sc().statusStore(), context._jvm

    def per_stage() -> dict[tuple[int, int], int]:
        context._jsc.sc().listenerBus().waitUntilEmpty()
        stages = store.stageList(None, False, False, context._gateway.new_array(jvm.double, 0),
                                 jvm.java.util.ArrayList()).iterator()
        counts = {}
        while stages.hasNext():
            stage = stages.next()
            counts[(stage.stageId(), stage.attemptId())] = stage.inputRecords()
        return counts

    before = per_stage()
    run()
    return sum(n for stage, n in per_stage().items() if stage not in before)


def test_the_rewrite_reads_only_the_touched_files(spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """20 files of 500 rows; an UPDATE and a MERGE that touch one file each read that file
    (the find job, pruned by statistics, and the rewrite), as delta-spark's own do on a copy,
    not the table."""
    participant = Participant(lake_daemon.target, pipeline_id=f"scale-{lake.name}")
    ours, theirs = lake / "wide", lake / "wide-reference"
    (spark.range(0, 10_000, 1, 20).selectExpr("id", "id % 7 AS value", "'eu' AS region")
     .write.format("delta").save(str(ours)))
    shutil.copytree(ours, theirs)
    source = spark.createDataFrame([(1234, 5, "us", "U")], f"{SCHEMA}, op string")

    def update(dt) -> None:  # noqa: ANN001
        dt.update("id = 4321", {"value": "-1"})

    def merge(dt) -> None:  # noqa: ANN001
        (dt.alias("t").merge(source.alias("s"), "t.id = s.id AND t.id BETWEEN 1000 AND 1400")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    read = {}
    for name, operation in (("update", update), ("merge", merge)):
        read[name] = records_read(spark, lambda op=operation: participant.run_batch(
            spark.range(1), len(read), lambda df, b, txn: op(txn.delta_table(str(ours)))))
        read[f"delta-spark {name}"] = records_read(
            spark, lambda op=operation: op(DeltaTable.forPath(spark, str(theirs))))
    assert table_rows(spark, ours) == table_rows(spark, theirs)
    log_lines = 200  # the Delta log's own lines, read when snapshots are built
    for name in ("update", "merge"):
        assert read[name] <= 2 * 500 + log_lines, read  # one file, twice; not 10,000 rows
        assert read[name] <= read[f"delta-spark {name}"] + log_lines, read
    removed = [json.loads(line)["remove"]["path"] for v in (1, 2) for line in
               (ours / "_delta_log" / f"{v:020d}.json").read_text().splitlines()
               if '"remove"' in line]
    assert len(removed) == 2


def delta_scan_plannings(spark: SparkSession, run: Callable[[], object]) -> int:
    """Spark jobs of delta-spark's scan planning (listing a version's files, pruning them by
    statistics: "Filtering files for query") that ``run`` starts."""
    context = spark.sparkContext
    group = f"scan-plannings-{id(run)}"
    context.setJobGroup(group, group)
    try:
        run()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    store = context._jsc.sc().statusStore()
    descriptions = [store.job(j).description() for j in
                    context.statusTracker().getJobIdsForGroup(group)]
    return sum(1 for d in descriptions if d.isDefined() and "Filtering files" in d.get())


def test_a_merge_by_join_keys_alone_takes_the_files_its_versions_checksum_lists(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """A MERGE whose condition reads no target column alone reads every file of the version,
    as delta-spark's does; where the version's checksum lists its files (``allFiles``) the
    find pass reads them from that listing, so delta-spark's scan planning runs no job (its
    own MERGE runs none either); the rows equal delta-spark's MERGE on a copy, twice (the
    second on a version percolake wrote, with the listing percolake derived)."""
    participant = Participant(lake_daemon.target, pipeline_id=f"keys-{lake.name}")
    ours, theirs = lake / "keyed", lake / "keyed-reference"
    make_table(spark, ours, [(i, i, "eu" if i % 2 else "us") for i in range(40)], True)
    shutil.copytree(ours, theirs)
    plannings = {}
    for batch, ids in enumerate(((3, 4, 41), (4, 5, 42))):
        source = spark.createDataFrame([(i, -i, "eu", "U") for i in ids], f"{SCHEMA}, op string")

        def merge(dt, source=source) -> None:  # noqa: ANN001
            (dt.alias("t").merge(source.alias("s"), "t.id = s.id")
             .whenMatchedUpdate(set={"value": "s.value"}).whenNotMatchedInsertAll().execute())

        plannings[batch] = delta_scan_plannings(spark, lambda b=batch, m=merge: (
            participant.run_batch(spark.range(1), b,
                                  lambda df, i, txn: m(txn.delta_table(str(ours))))))
        plannings[f"delta-spark {batch}"] = delta_scan_plannings(
            spark, lambda m=merge: m(DeltaTable.forPath(spark, str(theirs))))
        assert table_rows(spark, ours) == table_rows(spark, theirs)
    assert plannings == {0: 0, 1: 0, "delta-spark 0": 0, "delta-spark 1": 0}, plannings
    listed = json.loads((ours / "_delta_log" / f"{2:020d}.crc").read_text())["allFiles"]
    assert len(listed) == json.loads((ours / "_delta_log" / f"{2:020d}.crc").read_text())[
        "numFiles"]


def test_txn_write_and_delta_table_on_one_table_run_in_call_order_as_one_commit(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    participant = Participant(lake_daemon.target, pipeline_id=f"mixed-{lake.name}")
    rows = [(1, 1, "eu"), (2, 20, "us"), (3, 3, "ap")]
    appended = spark.createDataFrame([(4, 4, "eu"), (5, 50, "us")], SCHEMA)
    ours, theirs = lake / "mixed", lake / "mixed-reference"
    make_table(spark, ours, rows, True)
    shutil.copytree(ours, theirs)

    def append_then_update(df: DataFrame, batch_id: int, txn) -> None:  # noqa: ANN001
        txn.write(appended, str(ours))
        txn.delta_table(str(ours)).update("value < 10", {"value": "value + 1000"})

    def delete_then_append(df: DataFrame, batch_id: int, txn) -> None:  # noqa: ANN001
        txn.delta_table(str(ours)).delete("id IN (1, 5)")
        txn.write(appended.where("id = 4"), str(ours))
        txn.delta_table(str(ours)).update("id = 4 AND value = 4", {"value": "-4"})

    participant.run_batch(spark.range(1), 0, append_then_update)
    appended.write.format("delta").mode("append").save(str(theirs))
    DeltaTable.forPath(spark, str(theirs)).update("value < 10", {"value": "value + 1000"})
    assert table_rows(spark, ours) == table_rows(spark, theirs)
    participant.run_batch(spark.range(1), 1, delete_then_append)
    reference = DeltaTable.forPath(spark, str(theirs))
    reference.delete("id IN (1, 5)")
    appended.where("id = 4").write.format("delta").mode("append").save(str(theirs))
    reference.update("id = 4 AND value = 4", {"value": "-4"})
    assert table_rows(spark, ours) == table_rows(spark, theirs)
    history = RustTable(str(ours)).history()
    assert len(history) == 3, "each batch is one Delta commit"
    assert [h["percolake.operation"] for h in history[:2]] == ["DELETE,WRITE,UPDATE",
                                                              "WRITE,UPDATE"]


def upsert(dt, source: DataFrame) -> object:  # noqa: ANN001
    return (dt.alias("t").merge(source.alias("s"), "t.id = s.id")
            .whenMatchedUpdate(set={"value": "s.value"}).whenNotMatchedInsertAll().execute())


def test_overwrites_and_merge_schema_beside_delta_table_equal_delta_spark_in_call_order(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """Each batch runs ``txn.write`` overwrites or ``merge_schema`` appends and
    ``txn.delta_table`` operations on one table; delta-spark runs the same operations in the
    same order on a copy: the same rows and schema after each batch, one commit per batch."""
    participant = Participant(lake_daemon.target, pipeline_id=f"mixops-{lake.name}")
    ours, theirs = lake / "mixops", lake / "mixops-reference"
    make_table(spark, ours, [(1, 1, "eu"), (2, 2, "us"), (3, 3, "ap")], True)
    shutil.copytree(ours, theirs)
    frame = spark.createDataFrame
    fresh = frame([(1, 10, "eu"), (4, 40, "us")], SCHEMA)
    changes = frame([(1, 100, "eu"), (2, 200, "us"), (5, 500, "ap")], SCHEMA)
    in_eu = frame([(1, 10, "eu"), (6, 60, "eu")], SCHEMA)
    noted = frame([(7, 7, "us", "n7")], SCHEMA + ", note string")
    scored = frame([(8, 8, "ap", "n8", 0.5)], SCHEMA + ", note string, score double")

    def write_with(rows: DataFrame, mode: str = "append", merge_schema: bool = False):  # noqa: ANN202
        def ours_(txn) -> None:  # noqa: ANN001
            txn.write(rows, str(ours), mode=mode, merge_schema=merge_schema)

        def theirs_(_txn) -> None:  # noqa: ANN001
            writer = rows.write.format("delta").mode("append" if mode == "append"
                                                     else "overwrite")
            if mode == "overwrite_partitions":
                writer = writer.option("partitionOverwriteMode", "dynamic")
            writer.option("mergeSchema", str(merge_schema).lower()).save(str(theirs))
        return ours_, theirs_

    def table_op(operation: Callable[[object], object]):  # noqa: ANN202
        return (lambda txn: operation(txn.delta_table(str(ours))),
                lambda _txn: operation(DeltaTable.forPath(spark, str(theirs))))

    batches = {
        "WRITE,MERGE": [write_with(in_eu, "overwrite_partitions"),
                        table_op(lambda t: upsert(t, changes))],
        "MERGE,WRITE,DELETE": [table_op(lambda t: upsert(t, changes)),
                               write_with(fresh, "overwrite"),
                               table_op(lambda t: t.delete("id = 4"))],
        "WRITE,UPDATE": [write_with(noted, merge_schema=True),
                         table_op(lambda t: t.update("id < 5", {"note": "'old'"}))],
        "MERGE,WRITE": [table_op(lambda t: upsert(t, noted)),
                        write_with(scored, merge_schema=True)],
    }
    for batch_id, steps in enumerate(batches.values()):
        participant.run_batch(spark.range(1), batch_id, lambda df, b, txn, steps=steps: [
            ours_(txn) for ours_, _ in steps])
        for _, theirs_ in steps:
            theirs_(None)
        assert table_rows(spark, ours) == table_rows(spark, theirs), batch_id
        assert spark.read.format("delta").load(str(ours)).schema.simpleString() == \
            spark.read.format("delta").load(str(theirs)).schema.simpleString(), batch_id
    history = RustTable(str(ours)).history()
    assert len(history) == len(batches) + 1, "each batch is one Delta commit"
    assert [h["percolake.operation"] for h in reversed(history[:-1])] == list(batches)


@pytest.mark.parametrize("before_txn_write", [True, False])
def test_a_delta_spark_write_to_a_table_of_txn_write_fails_the_batch(
        spark, lake_daemon, lake, before_txn_write) -> None:  # noqa: ANN001
    participant = Participant(lake_daemon.target, pipeline_id=f"own-{lake.name}")
    table = lake / "log"
    make_table(spark, table, [(1, 1, "eu")], False)
    rows = spark.createDataFrame([(2, 2, "us")], SCHEMA)

    def batch(df: DataFrame, batch_id: int, txn) -> None:  # noqa: ANN001
        if before_txn_write:
            rows.write.format("delta").mode("append").save(str(table))  # delta-spark's own
        txn.write(rows, str(table))
        if not before_txn_write:
            rows.write.format("delta").mode("append").save(str(table))

    with pytest.raises(RowLevelWriteRefused, match=r"txn\.delta_table"):
        participant.run_batch(spark.range(1), 0, batch)
    history = [json.dumps(h) for h in RustTable(str(table)).history()]
    assert not any("percolake.txn_id" in h for h in history), "nothing of the batch committed"


def test_with_schema_evolution_adds_the_source_columns_as_delta_spark_does(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """A source with a new column (``note``) and without ``region``: the MERGE adds ``note``;
    UpdateAll keeps ``region``, InsertAll leaves it null, as delta-spark's own MERGE does."""
    participant = Participant(lake_daemon.target, pipeline_id=f"evolve-{lake.name}")
    source = spark.createDataFrame([(1, 100, "first"), (7, 700, "new")],
                                   "id long, value long, note string")

    def evolving_merge(dt, src: DataFrame) -> object:  # noqa: ANN001
        return (dt.alias("t").merge(src.alias("s"), "t.id = s.id").withSchemaEvolution()
                .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    ours, _ = side_by_side(spark, participant, lake, "evolving", [(1, 1, "eu"), (2, 2, "us")],
                           False, [evolving_merge], source)
    assert spark.read.format("delta").load(str(ours)).columns == ["id", "value", "region",
                                                                  "note"]


def test_a_merge_computes_a_non_delta_source_once_and_reads_a_delta_source_as_it_is(  # noqa: ANN001
        spark, lake_daemon, lake) -> None:
    """delta-spark's rule (``sparkside.merge_source``): a source that is not a deterministic
    read of Delta tables is materialized before the MERGE's two passes, so it is computed
    once (counted here by a UDF over its rows); a Delta table's read is used as it is."""
    participant = Participant(lake_daemon.target, pipeline_id=f"once-{lake.name}")
    rows = target_rows(random.Random(17), 20)
    ours = lake / "once"
    make_table(spark, ours, rows, False)
    computed = spark.sparkContext.accumulator(0)

    def counted(value: int) -> int:
        computed.add(1)
        return value

    count = F.udf(counted, "long", useArrow=False)  # a plain Python UDF, as by default
    source = spark.range(10, 30).select(count(F.col("id")).alias("id"),
                                        F.lit(7).cast("long").alias("value"))

    def batch(df: DataFrame, batch_id: int, txn) -> None:  # noqa: ANN001
        (txn.delta_table(str(ours)).alias("t").merge(source.alias("s"), "t.id = s.id")
         .whenMatchedUpdate(set={"value": "s.value"})
         .whenNotMatchedInsert(values={"id": "s.id", "value": "s.value", "region": "'eu'"})
         .execute())

    participant.run_batch(spark.range(1), 0, batch)
    assert computed.value == 20, "each source row computed once, not once per pass"
    assert needs_materializing(source, insert_only=False)
    assert not needs_materializing(source, insert_only=True)
    delta_source = spark.read.format("delta").load(str(ours)).where("id < 5")
    assert not needs_materializing(delta_source, insert_only=False)
    assert needs_materializing(delta_source.withColumn("r", F.rand()), insert_only=False)
    assert sorted(r.value for r in spark.read.format("delta").load(str(ours))
                  .where("id >= 10").collect()) == [7] * 20


def vector_cardinalities(table: Path, files: set[str]) -> dict[str, int]:
    """The deletion vector cardinality of each of ``files`` at the table's latest version."""
    version = RustTable(str(table)).version()
    return {path: int(vector["cardinality"])
            for path, vector in deletion_vectors(str(table), version, files).items()}


def newest_entry(table: Path) -> list[dict]:
    version = RustTable(str(table)).version()
    return [json.loads(line) for line in
            (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]


def test_deletion_vectors_on_a_table_that_enables_them_as_delta_spark(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """A delta-spark table with ``delta.enableDeletionVectors=true`` (one file per region, a
    vector on eu's already): percolake's DELETE, UPDATE and MERGE keep the files with deletion
    vectors as delta-spark's own operations do on a copy: the same rows, the same vectors on the
    same files, the same history metrics, checksums delta-spark validates; delta-spark's
    OPTIMIZE and DELETE work on top. percolake decodes delta-spark's vector to the rows it
    deleted, and an aborted attempt's vector files are deleted."""
    participant = Participant(lake_daemon.target, pipeline_id=f"mor-{lake.name}")
    ours, theirs = lake / "mor", lake / "mor-reference"
    for n, region in enumerate(REGIONS):
        rows = [(i, i * 7 % 100, region) for i in range(n * 20, n * 20 + 20)]
        writer = spark.createDataFrame(rows, SCHEMA).coalesce(1).write.format("delta")
        (writer.option("delta.enableDeletionVectors", "true") if n == 0
         else writer.mode("append")).save(str(ours))
    condition = "region = 'eu' AND id % 5 = 0"
    expected = sorted(r[0] for r in spark.read.format("delta").load(str(ours))
                      .where(condition).select("_metadata.row_index").collect())
    spark.sql(f"DELETE FROM delta.`{ours}` WHERE {condition}")  # version 3: a vector on eu's
    (eu_file, vector), = deletion_vectors(str(ours), 3).items()
    assert deleted_rows(str(ours), vector).tolist() == expected  # delta-spark's own vector
    shutil.copytree(ours, theirs)
    originals = {f.path for f in files_of_version(str(ours), 3).files}
    us_file, = {f.path for f in files_of_version(str(ours), 1).files} - {eu_file}

    def delete_high(dt, src) -> None:  # noqa: ANN001
        dt.delete("value > 70")

    def update_us(dt, src) -> None:  # noqa: ANN001
        dt.update("region = 'us' AND value < 30", {"value": "value + 1000"})

    source = spark.createDataFrame(
        [(1, 500, "eu", "U"), (2, 0, "eu", "D"), (3, 300, "eu", "U"), (99, 9, "ap", "U"),
         (29, 0, "us", "D"), (33, 333, "us", "U")],  # 29: a row update_us moved
        f"{SCHEMA}, op string")
    dv_metrics = ("DeletionVectorsAdded", "DeletionVectorsUpdated", "DeletionVectorsRemoved")
    compared = {  # the history metrics compared with delta-spark's, by operation
        "DELETE": ["numDeletedRows", "numCopiedRows", "numRemovedFiles", "numAddedFiles",
                   *[f"num{m}" for m in dv_metrics]],
        "UPDATE": ["numUpdatedRows", "numCopiedRows", "numRemovedFiles",
                   *[f"num{m}" for m in dv_metrics]],
        "MERGE": ["numTargetRowsUpdated", "numTargetRowsDeleted", "numTargetRowsInserted",
                  "numTargetRowsCopied", "numTargetFilesRemoved",
                  *[f"numTarget{m}" for m in dv_metrics]]}
    batches: list[list[Operation]] = [
        [delete_high],  # every file: eu's vector updated, the others' added
        [update_us],
        [cdc_merge],  # 29: a row the UPDATE moved into a new file, which gets a vector
        # one commit here, two there: the DELETE sees the UPDATE's vector on us's file, and
        # rewrites the UPDATE's new file (in no version yet); the same vectors on the files
        [lambda dt, src: dt.update("region = 'us' AND value < 60", {"value": "value + 2000"}),
         lambda dt, src: dt.delete("region = 'us' AND id % 2 = 0")],
        [lambda dt, src: dt.delete("region = 'ap' AND id < 99")],  # ap's file goes whole
    ]
    for batch_id, operations in enumerate(batches):
        run_on_both(spark, participant, batch_id, operations, source, ours, theirs)
        assert table_rows(spark, ours) == table_rows(spark, theirs), batch_id
        assert vector_cardinalities(ours, originals) == vector_cardinalities(theirs, originals)
        version = RustTable(str(ours)).version()
        crc = checksum(ours, version)
        validated(spark, ours, version)
        cardinalities = vector_cardinalities(ours, {f.path for f in files_of_version(
            str(ours), version).files})
        assert (crc["numDeletionVectorsOpt"], crc["numDeletedRecordsOpt"]) \
            == (len(cardinalities), sum(cardinalities.values()))
        entry = newest_entry(ours)
        vectors = [a["add"]["deletionVector"] for a in entry
                   if "add" in a and a["add"].get("deletionVector")]
        assert all(v["storageType"] == "u" and v["pathOrInlineDv"].startswith("_percolake/")
                   for v in vectors)
        if len(operations) == 1:  # one commit on each side: delta-spark's metrics
            reference = checksum(theirs, RustTable(str(theirs)).version())
            if batch_id < 3:  # later, theirs has a vector on its UPDATE's new file
                assert (crc["numDeletionVectorsOpt"], crc["numDeletedRecordsOpt"]) == (
                    reference["numDeletionVectorsOpt"], reference["numDeletedRecordsOpt"])
            got, wanted = history(spark, ours), history(spark, theirs)
            names = compared[got["operation"]]
            assert {n: got["operationMetrics"][n] for n in names} \
                == {n: wanted["operationMetrics"][n] for n in names}, batch_id
    assert set(vector_cardinalities(ours, originals)) == {eu_file, us_file}  # ap's file gone
    assert history(spark, ours)["operationMetrics"]["numDeletionVectorsRemoved"] == "1"

    # an aborted attempt's vector files go with its folder (I10)
    def vector_files() -> set[Path]:
        return set((ours / "_percolake").rglob("deletion_vector_*.bin"))

    before = vector_files()

    def failing(df: DataFrame, b: int, txn) -> None:  # noqa: ANN001
        txn.delta_table(str(ours)).delete("id = 4")
        assert vector_files() - before, "the DELETE stored a vector in the attempt's folder"
        raise RuntimeError("a later write of the batch failed")

    with pytest.raises(RuntimeError, match="later write"):
        participant.run_batch(spark.range(1), len(batches), failing)
    assert vector_files() == before

    for table in (ours, theirs):  # delta-spark's own operations on top
        spark.sql(f"DELETE FROM delta.`{table}` WHERE id = 3")
        spark.sql(f"OPTIMIZE delta.`{table}`")
    assert table_rows(spark, ours) == table_rows(spark, theirs)
