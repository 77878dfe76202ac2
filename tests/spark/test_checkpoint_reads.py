"""delta-spark reads what percolake's checkpoints and log cleanup leave (docs/checkpoints.md):
a table whose checkpoints percolake wrote, with the log before the checkpoint gone, and a table
whose checkpoint writer was killed mid-write."""

from __future__ import annotations

import json
import time

import pyarrow.parquet as pq

from percolake.lake.checkpoints import Checkpointer
from percolake.lake.log_cleanup import clean_log
from tests.test_checkpoints import append, checkpoint_writers_killed


def count(spark, table, version=None) -> int:  # noqa: ANN001
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(str(table)).count()


def test_delta_spark_reads_percolakes_checkpoint_without_the_log_before_it(spark, tmp_path):
    table = tmp_path / "t"
    checkpointer = Checkpointer()
    for batch in range(23):
        append(table, batch, checkpointer)
    assert checkpointer.flush()
    checkpointer.close()
    log = table / "_delta_log"
    last = json.loads((log / "_last_checkpoint").read_text())
    checkpoint = pq.read_table(log / f"{20:020d}.checkpoint.parquet")
    assert last["version"] == 20 and last["size"] == checkpoint.num_rows
    assert last["numOfAddFiles"] == 21 == checkpoint.column("add").drop_null().length()

    # cleanup as the coordinator runs it once 30 days passed: versions 0..19 go
    later = int(time.time() * 1000) + 31 * 24 * 3600 * 1000
    deleted = clean_log(f"file://{table}", 22, {}, later)
    assert f"{19:020d}.json" in deleted and not (log / f"{0:020d}.json").exists()
    assert count(spark, table) == 23
    assert count(spark, table, 20) == 21
    assert count(spark, table, 22) == 23


def test_delta_spark_reads_a_table_whose_checkpoint_writer_was_killed(spark, tmp_path):
    table = tmp_path / "t"
    for batch in range(14):
        append(table, batch)
    for _ in checkpoint_writers_killed(table, 10, times=3, seed=5):
        assert count(spark, table) == 14
        assert count(spark, table, 11) == 12
    # a torn staged upload beside the checkpoint (what a kill mid-write can leave)
    (table / "_delta_log" / f"{10:020d}.checkpoint.parquet#1").write_bytes(b"PAR1 torn")
    assert count(spark, table, 13) == 14
