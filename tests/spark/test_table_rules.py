"""Tables delta-spark made, written by ``txn.write``, read back by delta-spark and compared with
delta-spark's own write of the same rows: NOT NULL, CHECK constraints and generated columns
(the same refusal, nothing committed in any table of the batch), schema evolution with
``merge_schema``, a column named in another case, a column the batch lacks, and catalog names.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from coordinator.views import txn_json
from percolake.lake.warehouse import canonical_table_uri
from percolake.v1 import coordinator_pb2 as pb
from sparkside import ConsistentReader, Participant, register
from sparkside.errors import (
    ConstraintViolation,
    RowLevelWriteRefused,
    SchemaMismatch,
    TableNotWritten,
    UnknownTable,
)
from tests.spark.helpers import transactions

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ("id BIGINT NOT NULL, amount INT, s STRUCT<x: INT NOT NULL, y: INT>, ts TIMESTAMP, "
           "note STRING, day DATE GENERATED ALWAYS AS (CAST(ts AS DATE))")
BATCH = "id BIGINT, amount INT, s STRUCT<x: INT, y: INT>, ts TIMESTAMP"
TS = datetime.datetime(2024, 1, 2, 3, 4, 5)


def create_ruled_table(spark: SparkSession, location: Path) -> None:
    """A table with NOT NULL (top level and nested), a CHECK constraint and a generated
    column, made by delta-spark."""
    spark.sql(f"CREATE TABLE delta.`{location}` ({COLUMNS}) USING DELTA")
    spark.sql(f"ALTER TABLE delta.`{location}` ADD CONSTRAINT positive CHECK (amount > 0)")


def delta_spark_error(spark: SparkSession, location: Path, rows: list, schema: str) -> str:
    """delta-spark's refusal of the same rows (its message from the error class on)."""
    with pytest.raises(Exception) as refused:  # noqa: PT011 - delta-spark's own class
        spark.createDataFrame(rows, schema).write.format("delta").mode("append") \
            .save(str(location))
    text = str(refused.value)
    return text[text.index("[DELTA_"):].split("\n\tat ")[0].strip()


def versions(*tables: Path) -> list[int]:
    return [DeltaTable(str(t)).version() for t in tables]


@pytest.mark.parametrize(("rows", "schema", "same_values"), [
    ([(2, -5, (1, 2), TS)], BATCH, True),                                  # CHECK
    ([(2, None, (1, 2), TS)], BATCH, True),                                # CHECK on null
    ([(None, 5, (1, 2), TS)], BATCH, True),                                # NOT NULL
    ([(3, 5, (None, 2), TS)], BATCH, True),                                # nested NOT NULL
    ([(4, 5, (1, 2), TS, datetime.date(2020, 1, 1))], f"{BATCH}, day DATE", False),  # generated
], ids=["check", "check-null", "not-null", "nested-not-null", "generated"])
def test_a_row_breaking_a_rule_fails_the_batch_as_delta_spark_does_and_commits_nothing(
        spark, lake_daemon, lake, rows, schema, same_values):
    ruled, other, copy = lake / "ruled", lake / "other", lake / "copy"
    create_ruled_table(spark, ruled)
    create_ruled_table(spark, copy)
    spark.range(1).write.format("delta").save(str(other))
    participant = Participant(lake_daemon.target, pipeline_id=f"rules-{uuid.uuid4().hex[:6]}")
    bad = spark.createDataFrame(rows, schema)

    def batch(df, batch_id, txn):  # noqa: ANN001, ANN202
        txn.write(spark.range(5), str(other))
        txn.write(bad, str(ruled))

    with pytest.raises(ConstraintViolation) as refused:
        participant.run_batch(spark.range(1), 0, batch)
    expected = delta_spark_error(spark, copy, rows, schema)
    ours = str(refused.value)
    if same_values:
        assert expected in ours, (expected, ours)
    else:  # delta-spark shows a date and a timestamp as their internal numbers
        assert expected.splitlines()[0] in ours, (expected, ours)
        assert " - day : 2020-01-01\n - ts : 2024-01-02 03:04:05" in ours
    assert "Nothing was committed" in ours
    assert versions(ruled, other) == [1, 0]  # the CREATE, the ADD CONSTRAINT; the first write
    states = [t.state for t in transactions(lake_daemon.stub, participant.pipeline_id)]
    assert states == [pb.ABORTED]
    assert not list((ruled / "_percolake").glob("*/*.parquet"))
    participant.close()


def test_good_rows_are_shaped_as_delta_spark_shapes_them(spark, lake_daemon, lake):
    """Generated column computed, a column named in another case written as the table's,
    a column the batch lacks null: the same rows as delta-spark's own append."""
    ours, theirs = lake / "ours", lake / "theirs"
    create_ruled_table(spark, ours)
    create_ruled_table(spark, theirs)
    rows = [(1, 5, (1, None), TS), (2, 7, (3, 4), None)]
    schema = "ID BIGINT, Amount INT, s STRUCT<x: INT, y: INT>, ts TIMESTAMP"
    participant = Participant(lake_daemon.target, pipeline_id=f"shape-{uuid.uuid4().hex[:6]}")
    participant.run_batch(spark.range(1), 0, lambda df, batch_id, txn: txn.write(
        spark.createDataFrame(rows, schema), str(ours)))
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(str(theirs))

    def read(table: Path) -> list:
        return sorted(spark.read.format("delta").load(str(table)).collect())

    assert read(ours) == read(theirs)
    assert read(ours)[0]["day"] == datetime.date(2024, 1, 2)
    assert spark.read.format("delta").load(str(ours)).schema == \
        spark.read.format("delta").load(str(theirs)).schema
    participant.close()


def test_merge_schema_adds_columns_in_the_batch_commit_as_delta_spark_merges(
        spark, lake_daemon, lake):
    ours, theirs, other = lake / "ours", lake / "theirs", lake / "other"
    for table in (ours, theirs):
        spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT NOT NULL, amount INT) USING DELTA")
    spark.range(1).write.format("delta").save(str(other))
    wider = spark.createDataFrame([(1, 5, "EUR", (1, "a"))],
                                  "id BIGINT, amount INT, currency STRING, "
                                  "extra STRUCT<k: INT, v: STRING>")
    participant = Participant(lake_daemon.target, pipeline_id=f"merge-{uuid.uuid4().hex[:6]}")
    with pytest.raises(SchemaMismatch, match=r"unknown columns \['currency', 'extra'\].*"
                                             r"merge_schema=True"):
        participant.run_batch(spark.range(1), 0,
                              lambda df, batch_id, txn: txn.write(wider, str(ours)))

    def batch(df, batch_id, txn):  # noqa: ANN001, ANN202
        txn.write(wider, str(ours), merge_schema=True)
        txn.write(spark.range(3), str(other))

    participant.run_batch(spark.range(1), 1, batch)
    wider.write.format("delta").mode("append").option("mergeSchema", "true").save(str(theirs))
    assert versions(ours, other) == [1, 1]  # the data and the new columns in one version
    entry = (ours / "_delta_log" / f"{1:020d}.json").read_text()
    assert '"metaData"' in entry and '"add"' in entry
    read_ours = spark.read.format("delta").load(str(ours))
    read_theirs = spark.read.format("delta").load(str(theirs))
    assert read_ours.schema == read_theirs.schema
    assert read_ours.collect() == read_theirs.collect()
    snap = ConsistentReader(spark, lake_daemon.target).snapshot([str(ours), str(other)])
    assert snap.table(str(ours)).count() == 1 and snap.table(str(other)).count() == 4
    schema = json.loads(DeltaTable(str(ours)).schema().to_json())
    assert schema["fields"][0]["nullable"] is False  # the table's NOT NULL is kept
    participant.close()


ROW_LEVEL_COLUMNS = "id BIGINT NOT NULL, v INT, g INT GENERATED ALWAYS AS (v * 2)"


def refusal_text(text: str, error_class: str = "[DELTA_") -> str:
    """A refusal's message from its error class on, as far as the rule's values go."""
    return text[text.index(error_class):].split("\n\tat ")[0].split(" SQLSTATE")[0].strip()


def refused_alike(spark: SparkSession, participant: Participant, batch_id: int,
                  operation: object, ours: Path, theirs: Path,
                  ours_error: type[BaseException] = Exception) -> tuple[str, str]:
    """Runs ``operation`` (``op(delta_table)``) with delta-spark on ``theirs``, then in batch
    ``batch_id`` through percolake on ``ours``: both must fail; delta-spark's message and ours."""
    from delta.tables import DeltaTable as SparkDeltaTable

    with pytest.raises(Exception) as theirs_refused:  # noqa: PT011 - delta-spark's class
        operation(SparkDeltaTable.forPath(spark, str(theirs)))
    with pytest.raises(ours_error) as ours_refused:
        participant.run_batch(spark.range(1), batch_id,
                              lambda df, b, txn: operation(txn.delta_table(str(ours))))
    return str(theirs_refused.value), str(ours_refused.value)


def test_update_and_merge_keep_the_tables_rules_and_compute_its_generated_columns_as_delta_spark(
        spark, lake_daemon, lake):
    """``txn.delta_table``'s UPDATE and MERGE on a delta-spark-made table with NOT NULL, a
    CHECK constraint, a generated column and the change data feed: the generated column is
    computed from each updated or inserted row (in the table and in its change rows) as
    delta-spark's own operations compute it on a copy; a row breaking a rule (CHECK, NOT NULL, a
    generated column given a wrong value) fails the batch with delta-spark's refusal, and
    nothing is committed."""

    from tests.spark.helpers import run_on_both

    ours, theirs = lake / "ruled-rows", lake / "ruled-rows-reference"
    for table in (ours, theirs):
        spark.sql(f"CREATE TABLE delta.`{table}` ({ROW_LEVEL_COLUMNS}) USING DELTA "
                  "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
        spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT positive CHECK (v > 0)")
        spark.sql(f"INSERT INTO delta.`{table}` (id, v) VALUES (1, 5), (2, 6)")
    participant = Participant(lake_daemon.target, pipeline_id=f"rows-{uuid.uuid4().hex[:6]}")
    source = spark.createDataFrame([(2, 8), (3, 9)], "id BIGINT, v INT")

    def merge(dt, s):  # noqa: ANN001, ANN202
        (dt.alias("t").merge(s.alias("s"), "t.id = s.id")
         .whenMatchedUpdate(set={"v": "s.v"})
         .whenNotMatchedInsert(values={"id": "s.id", "v": "s.v"}).execute())

    def read(table: Path) -> list:
        return sorted(tuple(r) for r in spark.read.format("delta").load(str(table)).collect())

    def changes(table: Path, version: int) -> list:
        return sorted(tuple(r) for r in spark.read.format("delta")
                      .option("readChangeFeed", "true").option("startingVersion", version)
                      .option("endingVersion", version).load(str(table))
                      .select("id", "v", "g", "_change_type").collect())

    operations = [lambda dt, s: dt.update("id = 1", {"v": "7"}), merge]
    for batch_id, operation in enumerate(operations):
        run_on_both(spark, participant, batch_id, [operation], source, ours, theirs)
        assert read(ours) == read(theirs), batch_id
        version = versions(ours)[0]
        assert changes(ours, version) == changes(theirs, version), batch_id
    assert read(ours) == [(1, 7, 14), (2, 8, 16), (3, 9, 18)]

    refused = [  # each breaks one rule in one row
        lambda dt: dt.update("id = 1", {"v": "-1"}),
        lambda dt: (dt.alias("t").merge(spark.createDataFrame([(4, 4)], "id BIGINT, v INT")
                                        .alias("s"), "t.id = s.id")
                    .whenNotMatchedInsert(values={"v": "s.v"}).execute()),
        lambda dt: dt.update("id = 2", {"v": "10", "g": "0"}),
    ]
    for n, operation in enumerate(refused, start=len(operations)):
        theirs_text, ours_text = refused_alike(spark, participant, n, operation, ours, theirs,
                                               ConstraintViolation)
        assert refusal_text(theirs_text) in ours_text, n
        assert "Nothing was committed" in ours_text
    assert read(ours) == read(theirs) and versions(ours) == [4]
    states = [t.state for t in transactions(lake_daemon.stub, participant.pipeline_id)]
    assert states.count(pb.ABORTED) == len(refused)
    participant.close()


def test_assigned_values_are_cast_by_the_store_assignment_policy_as_delta_spark_casts_them(
        spark, lake_daemon, lake):
    """In a session with ``spark.sql.ansi.enabled=false``, an UPDATE or a MERGE assigning a
    value its column's type cannot hold fails as delta-spark's does (the store assignment
    policy, ANSI by default: an overflow, a malformed string), nothing committed, where a plain
    cast would have written a wrapped number or null; one that fits is written alike; under
    the LEGACY policy both wrap it alike."""

    from tests.spark.helpers import run_on_both

    ours, theirs = lake / "assigned", lake / "assigned-reference"
    for table in (ours, theirs):
        spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, v INT, s STRING) USING DELTA")
        spark.sql(f"INSERT INTO delta.`{table}` VALUES (1, 1, 'abc'), (2, 2, '7')")
    participant = Participant(lake_daemon.target, pipeline_id=f"cast-{uuid.uuid4().hex[:6]}")
    source = spark.createDataFrame([(2, 3000000000)], "id BIGINT, big BIGINT")

    def read(table: Path) -> list:
        return sorted(tuple(r) for r in spark.read.format("delta").load(str(table)).collect())

    refused = [  # (what delta-spark raises, the operation)
        ("[DELTA_CAST_OVERFLOW_IN_TABLE_WRITE]",
         lambda dt: dt.update("id = 1", {"v": "3000000000L"})),
        ("[DELTA_CAST_OVERFLOW_IN_TABLE_WRITE]",
         lambda dt: (dt.alias("t").merge(source.alias("x"), "t.id = x.id")
                     .whenMatchedUpdate(set={"v": "x.big"}).execute())),
        ("[CAST_INVALID_INPUT]", lambda dt: dt.update("id = 1", {"v": "s"})),
    ]
    ansi = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        for n, (error_class, operation) in enumerate(refused):
            theirs_text, ours_text = refused_alike(spark, participant, n, operation, ours,
                                                   theirs)  # the write job's error
            assert refusal_text(theirs_text, error_class) in ours_text, n
        assert read(ours) == read(theirs) == [(1, 1, "abc"), (2, 2, "7")]
        fits = [lambda dt, s: dt.update("id = 2", {"v": "s"})]  # '7' and 7L fit an int
        run_on_both(spark, participant, len(refused), fits, source, ours, theirs)
        spark.conf.set("spark.sql.storeAssignmentPolicy", "LEGACY")
        wraps = [lambda dt, s: dt.update("id = 1", {"v": "3000000000L"})]
        run_on_both(spark, participant, len(refused) + 1, wraps, source, ours, theirs)
    finally:
        spark.conf.set("spark.sql.ansi.enabled", ansi)
        spark.conf.unset("spark.sql.storeAssignmentPolicy")
    assert read(ours) == read(theirs) == [(1, -1294967296, "abc"), (2, 7, "7")]
    states = [t.state for t in transactions(lake_daemon.stub, participant.pipeline_id)]
    assert states.count(pb.ABORTED) == len(refused)
    participant.close()


def test_an_append_only_table_takes_a_merge_that_only_inserts_and_refuses_removals_as_delta_spark(
        spark, lake_daemon, lake):
    """On a delta-spark-made table with ``delta.appendOnly=true``: a MERGE that only inserts
    (by its clauses, or because no target row matched) commits as delta-spark's does; an UPDATE
    or a DELETE (even matching nothing) and a MERGE changing a row fail with delta-spark's
    refusal, nothing committed."""

    from tests.spark.helpers import run_on_both

    ours, theirs = lake / "append-only", lake / "append-only-reference"
    for table in (ours, theirs):
        spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, v INT) USING DELTA "
                  "TBLPROPERTIES ('delta.appendOnly' = 'true')")
        spark.sql(f"INSERT INTO delta.`{table}` VALUES (1, 1)")
    participant = Participant(lake_daemon.target, pipeline_id=f"ao-{uuid.uuid4().hex[:6]}")
    source = spark.createDataFrame([(1, 5), (2, 6)], "id BIGINT, v INT")

    def read(table: Path) -> list:
        return sorted(tuple(r) for r in spark.read.format("delta").load(str(table)).collect())

    taken = [
        lambda dt, s: (dt.alias("t").merge(s.alias("s"), "t.id = s.id")
                       .whenNotMatchedInsertAll().execute()),
        lambda dt, s: (dt.alias("t").merge(s.alias("s"), "t.id = s.id + 100")
                       .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()),
    ]
    for batch_id, operation in enumerate(taken):
        run_on_both(spark, participant, batch_id, [operation], source, ours, theirs)
        assert read(ours) == read(theirs), batch_id
    refused = [
        lambda dt: dt.update("id = 999", {"v": "0"}),
        lambda dt: dt.delete("id = 999"),
        lambda dt: (dt.alias("t").merge(source.alias("s"), "t.id = s.id")
                    .whenMatchedUpdateAll().execute()),
    ]
    for n, operation in enumerate(refused, start=len(taken)):
        theirs_text, ours_text = refused_alike(spark, participant, n, operation, ours, theirs,
                                               RowLevelWriteRefused)
        assert refusal_text(theirs_text).split(" use 'ALTER TABLE")[0] in ours_text, n
    assert read(ours) == read(theirs) and versions(ours) == [1 + len(taken)]
    participant.close()


def test_catalog_names_resolve_to_their_locations_and_an_unknown_one_is_refused(
        spark, lake_daemon, lake):
    database = f"percolake_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE DATABASE {database}")
    spark.sql(f"CREATE TABLE {database}.orders (id BIGINT) USING DELTA LOCATION '{lake}/orders'")
    participant = Participant(lake_daemon.target, pipeline_id=f"names-{uuid.uuid4().hex[:6]}")
    participant.run_batch(spark.range(1), 0, lambda df, batch_id, txn: txn.write(
        spark.range(4), f"spark_catalog.{database}.orders"))
    txn = transactions(lake_daemon.stub, participant.pipeline_id)[0]
    assert [p.table for p in txn.participants] == [canonical_table_uri(str(lake / "orders"))]
    shown = txn_json(txn)["tables"][0]  # what the CLI and the web view show
    assert shown["name"] == f"spark_catalog.{database}.orders"
    snap = ConsistentReader(spark, lake_daemon.target).snapshot([f"{database}.orders"])
    assert snap.table(f"{database}.orders").count() == 4
    assert sorted(r.id for r in spark.table(f"{database}.orders").collect()) == [0, 1, 2, 3]
    with pytest.raises(UnknownTable, match=f"{database}.missing"):
        participant.run_batch(spark.range(1), 1, lambda df, batch_id, txn: txn.write(
            spark.range(1), f"{database}.missing"))
    with pytest.raises(UnknownTable, match=f"{database}.missing"):
        ConsistentReader(spark, lake_daemon.target).snapshot([f"{database}.missing"])

    # the row-level interface: both spellings name the one table (one commit of both)
    def row_level(df, batch_id, txn):  # noqa: ANN001, ANN202
        txn.delta_table(f"{database}.orders").delete("id = 0")
        txn.delta_table(f"spark_catalog.{database}.orders").update("id = 3", {"id": "30"})
        with pytest.raises(UnknownTable, match=f"{database}.missing"):
            txn.delta_table(f"{database}.missing").delete("id = 1")

    participant.run_batch(spark.range(1), 1, row_level)
    assert sorted(r.id for r in spark.table(f"{database}.orders").collect()) == [1, 2, 30]
    assert DeltaTable(str(lake / "orders")).version() == 2  # CREATE, batch 0, this batch
    participant.close()

    # txn.read by name, in another pipeline (reading its own table would be a cycle); such a
    # pipeline commits only batches its percolake source planned, so this one stops after reading
    counted: list[int] = []

    class ReadDone(Exception):
        pass

    def read_batch(df, batch_id, txn):  # noqa: ANN001, ANN202
        counted.append(txn.read(f"spark_catalog.{database}.orders").count())
        with pytest.raises(UnknownTable, match=f"{database}.missing"):
            txn.read(f"{database}.missing")
        raise ReadDone

    reader = Participant(lake_daemon.target, pipeline_id=f"names-read-{uuid.uuid4().hex[:6]}")
    deadline = time.monotonic() + 30
    while True:  # until a barrier has completed since batch 0's commit
        try:
            with pytest.raises(ReadDone):
                reader.run_batch(spark.range(1), 0, read_batch)
            break
        except TableNotWritten:
            assert time.monotonic() < deadline, "no input barrier completed in 30 s"
            time.sleep(1)
    assert counted in ([4], [3])  # the table at the latest completed barrier: before or after
    # the row-level batch (barriers are 5 s apart)
    reader.close()

    # the streaming source's load: the name is resolved on the driver, as txn.write's (the
    # source's planner reads the schema from the location it is given: a name fails there)
    spark.sql(f"CREATE TABLE {database}.notes (id BIGINT, note STRING) USING DELTA "
              f"LOCATION '{lake}/notes'")
    register(spark)

    def reader():  # noqa: ANN202
        return spark.readStream.format("percolake").option("coordinator", lake_daemon.target) \
            .option("pipeline", f"names-reader-{uuid.uuid4().hex[:6]}")

    for stream, columns in ((reader().load(f"{database}.orders"), ["id"]),
                            (reader().option("path", f"spark_catalog.{database}.notes").load(),
                             ["id", "note"])):
        assert stream.isStreaming and stream.schema.names == columns
    with pytest.raises(UnknownTable, match=f"{database}.missing"):
        spark.readStream.format("percolake").option("coordinator", lake_daemon.target) \
            .option("pipeline", "names-reader").load(f"{database}.missing")


# A session whose catalog is a Hive metastore (embedded Derby, in the test's folder): its own
# process, since a JVM's catalog implementation is fixed when its first session starts and the
# shared session's is Spark's built-in one.
HIVE_CATALOG_JOB = """
import sys
import time
from pathlib import Path
from sparkside import ConsistentReader, Participant, local_spark
from sparkside.errors import TableNotWritten, UnknownTable
from tests.spark_settings import suite_conf

target, root, pipeline = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
spark = local_spark("hive-catalog", cores=1, conf={
    **suite_conf(),  # the suite's jars on the class path: no Ivy resolve
    "spark.sql.catalogImplementation": "hive",  # what enableHiveSupport() sets
    "spark.sql.warehouse.dir": str(root / "warehouse"),
    "spark.hadoop.javax.jdo.option.ConnectionURL":
        f"jdbc:derby:;databaseName={root}/metastore;create=true"})
spark.sparkContext.setLogLevel("ERROR")
print("catalog", spark.conf.get("spark.sql.catalogImplementation"))
spark.sql("CREATE DATABASE sales")
spark.sql("CREATE TABLE sales.orders (id BIGINT, note STRING) USING DELTA")  # managed
participant = Participant(target, pipeline_id=pipeline)
participant.run_batch(spark.range(1), 0, lambda df, batch_id, txn: txn.write(
    spark.sql("SELECT id, CAST(id AS STRING) note FROM range(4)"), "sales.orders"))
try:
    participant.run_batch(spark.range(1), 1, lambda df, batch_id, txn: txn.write(
        spark.range(1), "sales.missing"))
except UnknownTable as refused:
    print("refused write", refused)
participant.close()
print("delta-spark reads", sorted(r.id for r in spark.table("sales.orders").collect()))
print("snapshot reads", ConsistentReader(spark, target).snapshot(["sales.orders"])
      .table("sales.orders").count())


class ReadDone(Exception):
    pass


def read_batch(df, batch_id, txn):
    print("txn.read reads", txn.read("spark_catalog.sales.orders").count())
    try:
        txn.read("sales.missing")
    except UnknownTable as refused:
        print("refused read", refused)
    raise ReadDone


reader = Participant(target, pipeline_id=pipeline + "-reader")
deadline = time.monotonic() + 30
while True:  # until an input barrier has completed since batch 0's commit
    try:
        reader.run_batch(spark.range(1), 0, read_batch)
    except ReadDone:
        break
    except TableNotWritten:
        assert time.monotonic() < deadline, "no input barrier completed in 30 s"
        time.sleep(1)
reader.close()
spark.stop()
"""


def test_names_of_a_hive_metastore_resolve_to_their_locations(lake_daemon, lake):
    """A managed Delta table that delta-spark created in a Hive metastore, written by
    ``txn.write`` and read by ``txn.read`` and ``ConsistentReader.snapshot`` by its name; the
    coordinator keys it by its location; an unknown name is refused naming it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pipeline = f"hive-{uuid.uuid4().hex[:6]}"
    done = subprocess.run([sys.executable, "-c", HIVE_CATALOG_JOB, lake_daemon.target,
                           str(lake), pipeline], env=env, cwd=lake, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert "catalog hive" in out
    assert (lake / "metastore").is_dir()  # the Derby metastore held the table
    assert "delta-spark reads [0, 1, 2, 3]" in out
    assert "snapshot reads 4" in out
    assert "txn.read reads 4" in out
    refusals = [line for line in out if line.startswith("refused ")]
    assert [r.split()[1] for r in refusals] == ["write", "read"]
    assert all("'sales.missing' is not in the session's catalog" in r for r in refusals)
    location = lake / "warehouse" / "sales.db" / "orders"
    assert DeltaTable(str(location)).version() == 1  # CREATE TABLE, batch 0
    txn = transactions(lake_daemon.stub, pipeline)[0]
    assert [p.table for p in txn.participants] == [canonical_table_uri(str(location))]
    assert txn_json(txn)["tables"][0]["name"] == "sales.orders"
