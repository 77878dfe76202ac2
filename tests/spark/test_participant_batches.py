"""The participant on plain DataFrames: modes, partitions, schemas, time travel."""

from __future__ import annotations

import datetime
import time

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from percolake.lake.arrow_read import read_delta_table
from percolake.v1 import coordinator_pb2 as pb
from sparkside import ConsistentReader, Participant, SchemaMismatch, TableNotWritten
from tests.spark.helpers import committed_batches, transactions

pytestmark = pytest.mark.spark


def frame(spark, values, day=None):  # noqa: ANN001, ANN201
    data = [(v, f"name-{v}", datetime.date(2026, 1, 1 + (day if day is not None else v % 3)))
            for v in values]
    return spark.createDataFrame(data, "id long, name string, day date")


def test_partitioned_overwrite_partitions_reads_back_with_partition_columns(
        spark, lake_daemon, lake):
    participant = Participant(lake_daemon.target, pipeline_id=f"parts-{lake.name}")
    table = str(lake / "daily")

    def write(values, mode="append"):  # noqa: ANN001, ANN202
        return lambda df, batch_id, txn: txn.write(frame(spark, values), table, mode=mode,
                                                   partition_by=["day"])

    participant.run_batch(spark.range(1), 0, write(range(9)))
    participant.run_batch(spark.range(1), 1, write([100, 103], mode="overwrite_partitions"))
    snap = ConsistentReader(spark, lake_daemon.target).snapshot([table])
    got = sorted((r.id, r.day.day) for r in snap.table(table).collect())
    # day 2 (v % 3 == 1) was replaced by 100 and 103; days 1 and 3 are untouched
    assert got == sorted([(v, 1 + v % 3) for v in range(9) if v % 3 != 1] + [(100, 2), (103, 2)])
    assert snap.table(table).schema.fieldNames() == ["id", "name", "day"]
    assert DeltaTable(table).metadata().partition_columns == ["day"]
    stats = DeltaTable(table).get_add_actions(flatten=True)
    assert "num_records" in stats.schema.names and "min.id" in stats.schema.names


def test_schema_mismatch_is_refused_before_anything_is_written(spark, lake_daemon, lake):
    participant = Participant(lake_daemon.target, pipeline_id=f"schema-{lake.name}")
    table = str(lake / "people")
    participant.run_batch(spark.range(1), 0,
                          lambda df, b, txn: txn.write(frame(spark, [1, 2]), table))
    wrong = spark.createDataFrame([(1, 2.5)], "id string, score double")
    with pytest.raises(SchemaMismatch, match="score") as refused:
        participant.run_batch(spark.range(1), 1, lambda df, b, txn: txn.write(wrong, table))
    # the column it lacks (name) would be null, as in delta-spark's append; the new column and
    # the other type are refused, naming the option that adds columns
    assert "'id'" in str(refused.value) and "merge_schema=True" in str(refused.value)
    assert DeltaTable(table).version() == 0
    attempt = [t for t in transactions(lake_daemon.stub, participant.pipeline_id)
               if t.batch_id == 1][0]
    assert not (lake / "people" / "_percolake" / attempt.txn_id).exists()


def test_time_travel_by_commit_ts_and_by_batch_is_the_state_after_that_batch(
        spark, lake_daemon, lake):
    pipeline = f"travel-{lake.name}"
    participant = Participant(lake_daemon.target, pipeline_id=pipeline)
    a, b = str(lake / "a"), str(lake / "b")
    for batch in range(4):
        def write(df, batch_id, txn, batch=batch):  # noqa: ANN001, ANN202
            txn.write(frame(spark, [batch]), a)
            if batch % 2 == 0:
                txn.write(frame(spark, [batch]), b, mode="overwrite")
        participant.run_batch(spark.range(1), batch, write)
    commits = committed_batches(lake_daemon.stub, pipeline)
    reader = ConsistentReader(spark, lake_daemon.target)
    for batch in range(4):
        # the three ways of naming the batch travel to the same snapshot, whose rows are read
        # once (each read of a new version rebuilds that version's state in delta-spark)
        by_ts, by_batch, by_generation = (
            reader.snapshot([a, b], as_of=as_of)
            for as_of in (commits[batch].commit_ts, (pipeline, batch), (pipeline, 0, batch)))
        for snap in (by_batch, by_generation):
            assert (snap.snapshot_ts, snap.versions) == (by_ts.snapshot_ts, by_ts.versions)
        assert sorted(r.id for r in by_ts.table(a).collect()) == list(range(batch + 1))
        assert [r.id for r in by_ts.table(b).collect()] == [batch - batch % 2]
    with pytest.raises(TableNotWritten):
        reader.snapshot([str(lake / "never")]).table(str(lake / "never"))


def test_replay_of_a_committed_batch_skips_the_user_function(spark, lake_daemon, lake):
    participant = Participant(lake_daemon.target, pipeline_id=f"skip-{lake.name}")
    calls: list[int] = []

    def write(df, batch_id, txn):  # noqa: ANN001, ANN202
        calls.append(batch_id)
        txn.write(df.withColumn("batch", F.lit(batch_id)), str(lake / "t"))

    participant.run_batch(spark.range(3), 0, write)
    participant.run_batch(spark.range(3), 0, write)
    assert calls == [0]
    assert read_delta_table(str(lake / "t")).num_rows == 3


def test_heartbeats_keep_a_batch_longer_than_the_timeout_alive(spark, lake_daemon, lake):
    """The attempt may go 1.5 s without a heartbeat; the user's function takes twice that."""
    participant = Participant(lake_daemon.target, pipeline_id=f"slow-{lake.name}",
                              txn_timeout_s=1.5)
    assert participant.heartbeat_s <= 0.5
    table = str(lake / "slow")
    started = time.monotonic()

    def slow(df, batch_id, txn):  # noqa: ANN001, ANN202
        time.sleep(3.0)  # the work itself: nothing to poll for
        txn.write(frame(spark, [1]), table)

    participant.run_batch(spark.range(1), 0, slow)
    assert time.monotonic() - started > 3.0
    (committed,) = committed_batches(lake_daemon.stub, participant.pipeline_id).values()
    assert committed.attempt == 1 and read_delta_table(table).num_rows == 1


def test_a_table_declared_at_open_but_not_written_is_released_at_commit(
        spark, lake_daemon, lake):
    """Batch 1 declares both tables of batch 0 at Open; its function catches a schema refusal
    for one of them and writes the other: the commit holds only the written table, and the
    other one is free again with no folder of batch 1 left in it."""
    participant = Participant(lake_daemon.target, pipeline_id=f"release-{lake.name}")
    people, other = str(lake / "people"), str(lake / "other")

    def batch0(df, batch_id, txn):  # noqa: ANN001, ANN202
        txn.write(frame(spark, [1]), people)
        txn.write(frame(spark, [1]), other)

    def batch1(df, batch_id, txn):  # noqa: ANN001, ANN202
        with pytest.raises(SchemaMismatch):
            txn.write(spark.createDataFrame([(1.5,)], "score double"), people)
        txn.write(frame(spark, [2]), other)

    participant.run_batch(spark.range(1), 0, batch0)
    participant.run_batch(spark.range(1), 1, batch1)
    committed = committed_batches(lake_daemon.stub, participant.pipeline_id)[1]
    assert [p.table for p in committed.participants] == [f"file://{other}"]
    assert not (lake / "people" / "_percolake" / committed.txn_id).exists()
    assert DeltaTable(people).version() == 0 and DeltaTable(other).version() == 1
    third = Participant(lake_daemon.target, pipeline_id=f"release-next-{lake.name}")
    third.run_batch(spark.range(1), 0, lambda df, b, txn: txn.write(frame(spark, [3]), people))
    assert sorted(r["id"] for r in read_delta_table(people).to_pylist()) == [1, 3]


def test_an_expected_table_held_elsewhere_does_not_fail_a_batch_that_skips_it(
        spark, lake_daemon, lake):
    """Batch 1 would declare both tables of batch 0 at Open, but another pipeline holds one of
    them; batch 1 writes only the other table and commits all the same."""
    participant = Participant(lake_daemon.target, pipeline_id=f"held-{lake.name}")
    mine, shared = str(lake / "mine"), str(lake / "shared")

    def batch0(df, batch_id, txn):  # noqa: ANN001, ANN202
        txn.write(frame(spark, [1]), mine)
        txn.write(frame(spark, [1]), shared)

    participant.run_batch(spark.range(1), 0, batch0)
    holder = lake_daemon.stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=f"holder-{lake.name}", batch_id=0, tables=[shared]), timeout=30).transaction
    try:
        participant.run_batch(spark.range(1), 1,
                              lambda df, b, txn: txn.write(frame(spark, [2]), mine))
    finally:
        lake_daemon.stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=holder.txn_id),
                                          timeout=30)
    assert participant.wait_for_reports()  # the applied report is sent off the batch's path
    attempts = sorted((t.attempt, t.state) for t in
                      transactions(lake_daemon.stub, participant.pipeline_id) if t.batch_id == 1)
    assert attempts == [(1, pb.ABORTED), (2, pb.APPLIED)]
    assert DeltaTable(mine).version() == 1 and DeltaTable(shared).version() == 0
