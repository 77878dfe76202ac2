"""Concurrent table writes in one batch, and the tables' Delta commits side by side (issue 18)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import COMMIT_TS_KEY
from percolake.v1 import coordinator_pb2 as pb
from sparkside import Participant
from sparkside.concurrent_writes import ConcurrentWrites
from sparkside.writer import TIMESTAMP_TYPE_KEY
from tests.spark.helpers import committed_batches, transactions

pytestmark = pytest.mark.spark


def stamped(spark, stamps: Path, name: str, rows: int, sleep_s: float,  # noqa: ANN001, ANN201
            fail: bool = False):
    """``rows`` ids in one partition that pass a Python function which notes its start, sleeps
    ``sleep_s`` (or raises) and notes its end, in ``stamps/<name>``."""
    log = str(stamps / name)

    def through(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time as clock

        with open(log, "a") as out:
            out.write(f"start {clock.time()}\n")
        if fail:
            raise RuntimeError(f"boom-{name}")
        clock.sleep(sleep_s)
        yield from batches
        with open(log, "a") as out:
            out.write(f"end {clock.time()}\n")

    frame = spark.range(0, rows, numPartitions=1).selectExpr("id", "CAST(id AS STRING) AS name")
    return frame.mapInArrow(through, frame.schema)


def marks(stamps: Path, name: str) -> dict[str, float]:
    path = stamps / name
    if not path.exists():
        return {}
    return {kind: float(at) for kind, at in (line.split() for line in path.read_text().split("\n")
                                             if line)}


def test_the_writes_of_one_batch_run_at_once_and_commit_together(spark, lake_daemon, lake,
                                                                 tmp_path):
    """Three tables written through a function that sleeps 1 s per table: their write jobs'
    intervals overlap (as many at once as the session has cores), the batch commits all three,
    and the session's own Parquet timestamp setting is back after the writes."""
    participant = Participant(lake_daemon.target, pipeline_id=f"overlap-{lake.name}")
    names = ["a", "b", "c"]
    spark.conf.set(TIMESTAMP_TYPE_KEY, "INT96")  # the user's own setting
    try:
        participant.run_batch(spark.range(1), 0, lambda df, b, txn: [
            txn.write(stamped(spark, tmp_path, name, 5, 1.0), str(lake / name))
            for name in names])
        assert spark.conf.get(TIMESTAMP_TYPE_KEY) == "INT96"
    finally:
        spark.conf.unset(TIMESTAMP_TYPE_KEY)
    spans = [(marks(tmp_path, n)["start"], marks(tmp_path, n)["end"]) for n in names]
    # the most intervals that hold one common moment
    at_once = max(sum(start <= moment < end for start, end in spans) for moment, _ in spans)
    assert at_once >= min(3, spark.sparkContext.defaultParallelism) >= 2, spans
    (committed,) = committed_batches(lake_daemon.stub, participant.pipeline_id).values()
    assert sorted(p.table for p in committed.participants) == \
        sorted(f"file://{lake / n}" for n in names)
    for name in names:
        assert DeltaTable(str(lake / name)).version() == 0
        assert sorted(r["id"] for r in read_delta_table(str(lake / name)).to_pylist()) == \
            list(range(5))


def test_results_come_back_in_submission_order_whatever_order_the_writes_finish_in(spark):
    """The first write finishes last; the records still follow the calls (a replay commits the
    same records in the same order)."""
    running: ConcurrentWrites[str] = ConcurrentWrites("percolake-order-test")
    finished: list[str] = []

    def job(name: str, delay_s: float):  # noqa: ANN202
        def run() -> str:
            time.sleep(delay_s)
            finished.append(name)
            return name
        return run

    for name, delay in (("first", 0.6), ("second", 0.3), ("third", 0.0)):
        running.submit(spark, name, job(name, delay))
    assert running.results() == ["first", "second", "third"]
    assert finished == ["third", "second", "first"]


def test_one_failed_write_of_three_aborts_the_attempt_and_leaves_no_file(
        spark, lake_daemon, lake, tmp_path):
    """Batch 1 writes three tables; the second one's function raises while the third one's
    is still asleep. The batch fails naming the failure and its table, the third write is
    cancelled (it never ends), the attempt is ABORTED, none of the tables has a file of it or
    a new Delta version; the batch's replay commits it once."""
    participant = Participant(lake_daemon.target, pipeline_id=f"fail-{lake.name}")
    names = ["a", "b", "c"]
    tables = {n: str(lake / n) for n in names}
    participant.run_batch(spark.range(1), 0, lambda df, b, txn: [
        txn.write(stamped(spark, tmp_path, f"0{n}", 2, 0.0), tables[n]) for n in names])

    def failing(df, batch_id, txn):  # noqa: ANN001, ANN202
        txn.write(stamped(spark, tmp_path, "1a", 2, 0.0), tables["a"])
        txn.write(stamped(spark, tmp_path, "1b", 2, 0.5, fail=True), tables["b"])
        txn.write(stamped(spark, tmp_path, "1c", 2, 120.0), tables["c"])

    with pytest.raises(Exception, match="boom-1b") as failed:
        participant.run_batch(spark.range(1), 1, failing)
    assert any(tables["b"] in note for note in getattr(failed.value, "__notes__", [])), \
        failed.value
    assert "end" not in marks(tmp_path, "1c")  # cancelled, not waited out
    (attempt,) = [t for t in transactions(lake_daemon.stub, participant.pipeline_id)
                  if t.batch_id == 1]
    assert attempt.state == pb.ABORTED
    for name in names:
        folder = lake / name / "_percolake" / attempt.txn_id
        assert not folder.exists() or not any(p.is_file() for p in folder.rglob("*")), name
        assert DeltaTable(tables[name]).version() == 0

    participant.run_batch(spark.range(1), 1, lambda df, b, txn: [
        txn.write(stamped(spark, tmp_path, f"2{n}", 3, 0.0), tables[n]) for n in names])
    committed = committed_batches(lake_daemon.stub, participant.pipeline_id)
    assert sorted(committed) == [0, 1]
    for name in names:
        assert DeltaTable(tables[name]).version() == 1
        assert sorted(r["id"] for r in read_delta_table(tables[name]).to_pylist()) == \
            [0, 0, 1, 1, 2]


def delta_log(table: Path) -> list[dict]:
    """Per Delta version: the commit_ts its commitInfo carries and its app transactions."""
    versions = []
    for path in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        versions.append({"commit_ts": int(info[COMMIT_TS_KEY]),
                         "app_versions": [a["txn"]["version"] for a in actions if "txn" in a]})
    return versions


def test_parallel_secondaries_keep_each_tables_delta_order(spark, lake_daemon, lake):
    """Four batches of three tables: each table's Delta log has one commit per batch, in
    commit_ts order, carrying the batch id as its app transaction version, in batch order."""
    pipeline = f"order-{lake.name}"
    participant = Participant(lake_daemon.target, pipeline_id=pipeline)
    names = ["a", "b", "c"]
    for batch in range(4):
        participant.run_batch(spark.range(1), batch, lambda df, b, txn: [
            txn.write(df.selectExpr(f"{b} AS batch"), str(lake / n)) for n in names])
    commits = committed_batches(lake_daemon.stub, pipeline)
    expected = [commits[b].commit_ts for b in range(4)]
    assert expected == sorted(expected)
    for name in names:
        versions = delta_log(lake / name)
        assert [v["commit_ts"] for v in versions] == expected, name
        assert [v["app_versions"] for v in versions] == [[b] for b in range(4)], name


def test_unpersist_in_the_function_waits_so_the_batch_is_computed_once(spark, lake_daemon, lake):
    """Spark's advice for one batch into several tables, persist → write each → unpersist,
    with a column that differs on every computation: both tables hold the same values, because
    the unpersist waits for the running writes instead of making them compute it again."""
    from pyspark.sql import functions as F

    participant = Participant(lake_daemon.target, pipeline_id=f"persist-{lake.name}")
    names = ["first", "second"]
    fresh = F.udf(lambda _: time.time_ns(), "long").asNondeterministic()

    def batch(df, batch_id, txn):  # noqa: ANN001, ANN202
        rows = spark.range(0, 200, numPartitions=2).withColumn("stamp", fresh("id")).persist()
        for name in names:
            txn.write(rows, str(lake / name))
        rows.unpersist()

    participant.run_batch(spark.range(1), 0, batch)
    first, second = ({r["id"]: r["stamp"] for r in read_delta_table(str(lake / n)).to_pylist()}
                     for n in names)
    assert len(first) == 200 and first == second
    assert unpersist_is_plain(spark)  # outside a batch, unpersist is Spark's own


def unpersist_is_plain(spark) -> bool:  # noqa: ANN001
    frame = spark.range(3).persist()
    frame.unpersist(blocking=True)
    return not frame.is_cached
