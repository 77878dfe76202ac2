"""The participant end to end on S3 tables (moto), with the local session's executors: each
batch's files are written once under its attempt prefix, committed exactly once, and read back
at one snapshot through delta-spark and delta-rs alike."""

from __future__ import annotations

import json

import pyarrow
import pytest
from deltalake import DeltaTable

from percolake.lake import storage
from percolake.lake.arrow_read import read_delta_table
from percolake.v1 import coordinator_pb2 as pb
from sparkside import ConsistentReader, Participant
from tests.spark.helpers import committed_batches, transactions

pytestmark = pytest.mark.spark


@pytest.fixture
def s3_daemon(daemon_factory, moto_server, s3_bucket, tmp_path):  # noqa: ANN001, ANN201
    root = f"s3://{s3_bucket}/wh"
    running = daemon_factory.start(["--roll-forward-after", "2"], warehouse=root,
                                   data_dir=tmp_path / "data", env=moto_server.env(),
                                   name="s3")
    yield running, root
    running.stop()


def referenced_paths(table: str) -> set[str]:
    options = storage.delta_storage_options(table)
    latest = DeltaTable(table, storage_options=options).version()
    paths: set[str] = set()
    for version in range(latest + 1):
        actions = DeltaTable(table, version=version, storage_options=options) \
            .get_add_actions(flatten=False)
        paths.update(pyarrow.table(actions).column("path").to_pylist())
    return paths


def test_batches_over_three_s3_tables_commit_once_and_read_back_consistently(
        spark_s3, s3_daemon):
    daemon, root = s3_daemon
    tables = {name: f"{root}/{name}" for name in ("orders", "items", "totals")}
    participant = Participant(daemon.target, pipeline_id="s3-batches")

    def batch(df, batch_id, txn):  # noqa: ANN001, ANN202
        rows = spark_s3.range(batch_id * 10, batch_id * 10 + 10) \
            .selectExpr("id", "cast(id % 2 as string) as part")
        txn.write(rows, tables["orders"], partition_by=["part"])
        txn.write(rows.selectExpr("id", "id * 2 as qty"), tables["items"])
        txn.write(rows.selectExpr("max(id) as last"), tables["totals"], mode="overwrite")

    for batch_id in range(3):
        participant.run_batch(spark_s3.range(1), batch_id, batch)
    participant.run_batch(spark_s3.range(1), 1, batch)  # a replay: nothing new
    assert participant.wait_for_reports()  # applied reports go off the batch's path
    committed = committed_batches(daemon.stub, participant.pipeline_id)
    assert sorted(committed) == [0, 1, 2]
    assert len(transactions(daemon.stub, participant.pipeline_id)) == 3
    assert all(t.state == pb.APPLIED for t in committed.values())

    snapshot = ConsistentReader(spark_s3, daemon.target).snapshot(list(tables.values()))
    assert snapshot.versions == {t: 2 for t in tables.values()}
    through_spark = {name: sorted(r[0] for r in snapshot.table(t).collect())
                     for name, t in tables.items()}
    through_rs = {name: sorted(read_delta_table(t).column(0).to_pylist())
                  for name, t in tables.items()}
    assert through_spark == through_rs == {"orders": list(range(30)), "items": list(range(30)),
                                           "totals": [29]}
    # every object under the tables is a log entry or a file some version references
    for t in tables.values():
        objects = set(storage.list_files(t))
        data = {p for p in objects if not p.startswith("_delta_log/")}
        assert data == referenced_paths(t)
    participant.close()


def test_delta_spark_skips_files_by_the_executors_stats_and_reads_every_version_on_s3(
        spark_s3, s3_daemon):
    """What executors computed as they wrote is what delta-spark skips files by; DESCRIBE
    HISTORY has one entry per batch and ``versionAsOf`` reads what delta-rs reads."""
    from pyspark.sql import functions as F

    from tests.spark.test_delta_spark import EVENTS_SCHEMA, events_rows

    daemon, root = s3_daemon
    events = f"{root}/events"
    participant = Participant(daemon.target, pipeline_id="s3-stats")
    for batch in range(4):
        participant.run_batch(spark_s3.range(1), batch, lambda df, b, txn: txn.write(
            spark_s3.createDataFrame(events_rows(b), EVENTS_SCHEMA).coalesce(1), events,
            partition_by=["day"]))
    location = events.replace("s3://", "s3a://")
    frame = spark_s3.read.format("delta").load(location)
    adds = pyarrow.table(DeltaTable(events, storage_options=storage.delta_storage_options(
        events)).get_add_actions(flatten=True))
    file_of_batch = {min_id // 10: path.rsplit("/", 1)[1] for path, min_id in zip(
        adds.column("path").to_pylist(), adds.column("min.id").to_pylist(), strict=True)}
    assert sorted(file_of_batch) == [0, 1, 2, 3]

    def files_read(condition) -> set[str]:  # noqa: ANN001
        return {f.rsplit("/", 1)[1] for f in frame.where(condition).inputFiles()}

    for batch, file in file_of_batch.items():
        first = events_rows(batch)[0]
        for column, value in zip(("id", "name", "day", "at", "wall", "amount"), first[:6],
                                 strict=True):
            assert files_read(F.col(column) == F.lit(value)) == {file}, (column, batch)
    assert files_read(F.col("score") == 1.0) == set(file_of_batch.values())
    history = spark_s3.sql(f"DESCRIBE HISTORY delta.`{location}`").collect()
    assert sorted(h.version for h in history) == [0, 1, 2, 3]
    for version in range(4):
        through_spark = sorted(r.id for r in
                               spark_s3.read.format("delta").option("versionAsOf", version)
                               .load(location).collect())
        assert through_spark == sorted(read_delta_table(events, version).column("id")
                                       .to_pylist())
    participant.close()


def test_a_merge_on_an_s3_table_commits_with_the_batch_and_delta_spark_reads_it(
        spark_s3, s3_daemon, tmp_path):
    """The MERGE's files are written once under the attempt's prefix and committed with the
    batch's append; delta-spark reads the table, and its change data feed (the table has it:
    change files written by the executors to S3), as its own MERGE leaves a local copy."""
    from delta.tables import DeltaTable as SparkTable

    from tests.spark.test_row_level import SCHEMA, cdc_merge, table_rows

    daemon, root = s3_daemon
    accounts, credits = f"{root}/accounts", f"{root}/credits"
    location, reference = accounts.replace("s3://", "s3a://"), tmp_path / "reference"
    rows = [(k, k * 10, "eu" if k % 2 else "us") for k in range(8)]
    changes = spark_s3.createDataFrame(
        [(1, 5, "eu", "U"), (2, 0, "us", "D"), (9, 90, "ap", "U")], f"{SCHEMA}, op string")
    for path in (location, str(reference)):
        spark_s3.createDataFrame(rows, SCHEMA).repartition(2).write.format("delta") \
            .partitionBy("region").option("delta.enableChangeDataFeed", "true").save(path)
    participant = Participant(daemon.target, pipeline_id="s3-merge")

    def batch(df, batch_id, txn):  # noqa: ANN001, ANN202
        txn.write(changes.drop("op"), credits)
        cdc_merge(txn.delta_table(accounts), changes)

    participant.run_batch(spark_s3.range(1), 0, batch)
    participant.run_batch(spark_s3.range(1), 0, batch)  # a replay: the MERGE is not repeated
    cdc_merge(SparkTable.forPath(spark_s3, str(reference)), changes)
    assert table_rows(spark_s3, location) == table_rows(spark_s3, reference)
    feeds = [sorted(tuple(r) for r in spark_s3.read.format("delta")
                    .option("readChangeFeed", "true").option("startingVersion", 1).load(path)
                    .drop("_commit_version", "_commit_timestamp").collect())
             for path in (location, str(reference))]
    assert feeds[0] == feeds[1] and {r[-1] for r in feeds[0]} >= {"update_preimage", "delete"}
    assert sorted(read_delta_table(credits).column("id").to_pylist()) == [1, 2, 9]
    history = spark_s3.sql(f"DESCRIBE HISTORY delta.`{location}`").collect()
    assert sorted(h.version for h in history) == [0, 1]
    objects = {p for p in storage.list_files(accounts) if not p.startswith("_delta_log/")}
    entry = storage.read_object(f"{accounts}/_delta_log/{1:020d}.json").decode()
    changes = {json.loads(line)["cdc"]["path"] for line in entry.splitlines() if '"cdc"' in line}
    assert changes and all(p.startswith("_percolake/") for p in changes)
    assert objects == referenced_paths(accounts) | changes, \
        "no file of the attempt is left unreferenced"
    participant.close()


def test_optimize_of_an_s3_table_with_deletion_vectors_drops_the_deleted_rows(
        spark_s3, s3_daemon, tmp_path):  # noqa: ANN001
    """A table delta-spark made with deletion vectors (its DELETE wrote them), on S3:
    ``percolake-coordinator optimize`` rewrites each file with a vector without the rows it
    deletes (also a file alone in its partition), removes the files with their vectors, and
    delta-spark reads the same rows as before and as after its own OPTIMIZE of a copy."""
    import json
    import shutil

    import pyarrow.fs as pafs

    from percolake.lake.delta_commit import commit_uri
    from percolake.lake.warehouse import spark_uri
    from tests.test_ops_cli import cli

    daemon, root = s3_daemon
    local, reference = tmp_path / "dv", tmp_path / "dv-reference"
    spark_s3.sql(f"CREATE TABLE delta.`{local}` (id BIGINT, part STRING) USING DELTA "
                 "PARTITIONED BY (part) TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
    for first, part in ((0, "a"), (10, "a"), (20, "b")):
        spark_s3.range(first, first + 10, numPartitions=1).selectExpr("id", f"'{part}' AS part") \
            .write.format("delta").mode("append").save(str(local))
    spark_s3.sql(f"DELETE FROM delta.`{local}` WHERE id % 3 = 0")
    shutil.copytree(local, reference)
    table = f"{root}/dv"
    pafs.copy_files(str(local), storage.arrow_path(table),
                    destination_filesystem=storage.s3_filesystem())
    visible = sorted(tuple(r) for r in spark_s3.read.format("delta").load(str(local)).collect())
    version = DeltaTable(table, storage_options=storage.delta_storage_options(table)).version()

    done = cli("optimize", "--table", table, "--json", "--target", daemon.target)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["files_removed"] == 2  # a's; b's one file is left alone
    after = sorted(tuple(r) for r in spark_s3.read.format("delta").load(
        spark_uri(table)).collect())
    assert after == visible and len(visible) == 20
    entry = [json.loads(line) for line in
             storage.read_object(commit_uri(table, version + 1)).decode().splitlines()]
    removes = [a["remove"] for a in entry if "remove" in a]
    (add,) = [a["add"] for a in entry if "add" in a]
    assert len(removes) == 2 and all(r.get("deletionVector") for r in removes)
    assert "deletionVector" not in add
    assert json.loads(add["stats"])["numRecords"] == 13  # a's 20 rows less the 7 deleted

    spark_s3.sql(f"OPTIMIZE delta.`{reference}`").collect()  # delta-spark's, on the copy
    assert sorted(tuple(r) for r in spark_s3.read.format("delta").load(
        str(reference)).collect()) == after
    ours, theirs = (spark_s3.sql(f"DESCRIBE HISTORY delta.`{t}` LIMIT 1").collect()[0]
                    for t in (spark_uri(table), reference))
    assert ours.operation == theirs.operation == "OPTIMIZE"
    assert set(ours.operationParameters) == set(theirs.operationParameters)
    for name in ("numAddedFiles", "numRemovedFiles", "numDeletionVectorsRemoved"):
        assert ours.operationMetrics[name] == theirs.operationMetrics[name], name
    assert set(theirs.operationMetrics) <= set(ours.operationMetrics)
