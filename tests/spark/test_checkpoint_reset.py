"""I9 / C11: a deleted checkpoint is refused until an explicit reset; nothing is skipped.

The one test of C11 with a real query (the crash suite's soak, ``scripts/crash_soak.py``, mixes
it with driver and coordinator kills)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from collections import Counter

import pytest
from pyspark.sql import functions as F

from percolake.v1 import coordinator_pb2 as pb
from sparkside import Participant
from tests.spark.conftest import run_until
from tests.spark.helpers import rows, transactions

ROWS = 5
pytestmark = pytest.mark.spark


def two_tables(lake, calls, participant):  # noqa: ANN001, ANN201
    """Rows are (generation, batch, value): a new checkpoint restarts batch ids and values."""

    def write_batch(df, batch_id, txn):  # noqa: ANN001, ANN202
        calls.append(batch_id)
        tagged = df.select(F.lit(participant.generation).alias("generation"),
                           F.lit(batch_id).alias("batch"), "value")
        txn.write(tagged, str(lake / "left"))
        txn.write(tagged, str(lake / "right"))

    return write_batch


def run_with(spark, participant, lake, calls, checkpoint, done, **kwargs):  # noqa: ANN001, ANN201
    return run_until(spark, participant, two_tables(lake, calls, participant), checkpoint, done,
                     **kwargs)


def committed(stub, pipeline, generation):  # noqa: ANN001, ANN201
    return sorted(t.batch_id for t in transactions(stub, pipeline)
                  if t.generation == generation and t.state in (pb.COMMITTED, pb.APPLIED))


def test_deleted_checkpoint_is_refused_until_reset_then_every_batch_lands(
        spark, lake_daemon, lake, tmp_path):
    pipeline, stub = f"c11-{lake.name}", lake_daemon.stub
    calls: list[int] = []
    run_with(spark, Participant(lake_daemon.target, pipeline_id=pipeline), lake, calls,
              tmp_path / "ck", lambda: len(committed(stub, pipeline, 0)) >= 5,
              rows_per_batch=ROWS)
    before = {t: sorted(map(str, rows(lake / t))) for t in ("left", "right")}
    shutil.rmtree(tmp_path / "ck")

    refused = run_with(spark, Participant(lake_daemon.target, pipeline_id=pipeline), lake, calls,
                        tmp_path / "ck", lambda: False)
    message = str(refused.exception())
    assert "FAILED_PRECONDITION" in message or "query id" in message
    assert "reset-pipeline" in message and "--generation 0" in message
    assert {t: sorted(map(str, rows(lake / t))) for t in ("left", "right")} == before
    # the refused query left no live attempt behind
    assert all(t.state == pb.ABORTED for t in transactions(stub, pipeline)
               if t.state not in (pb.COMMITTED, pb.APPLIED))

    def reset_pipeline() -> dict:
        reset = subprocess.run(
            [sys.executable, "-m", "coordinator", "reset-pipeline", "--target",
             lake_daemon.target, "--pipeline", pipeline, "--generation", "0", "--reason",
             "checkpoint deleted in test"], capture_output=True, text=True, timeout=60)
        assert reset.returncode == 0, reset.stderr
        return json.loads(reset.stdout)

    # the reset makes generation 1; the same reset repeated (a lost answer) changes nothing
    first, again = reset_pipeline(), reset_pipeline()
    assert (first["generation"], first["changed"]) == (1, True), first
    assert (again["generation"], again["changed"]) == (1, False), again
    shutil.rmtree(tmp_path / "ck", ignore_errors=True)
    run_with(spark, Participant(lake_daemon.target, pipeline_id=pipeline), lake, calls,
              tmp_path / "ck",
              lambda: len(committed(stub, pipeline, 1)) >= 5, rows_per_batch=ROWS)
    new_batches = committed(stub, pipeline, 1)
    assert new_batches[:5] == [0, 1, 2, 3, 4]  # the same batch ids, not taken for replays
    for table in ("left", "right"):
        counts = Counter((r["generation"], r["batch"], r["value"]) for r in rows(lake / table))
        assert set(counts.values()) == {1}, f"{table}: a row landed twice"
        generation_1 = len(rows(lake / table)) - len(before[table])
        assert generation_1 == len(new_batches) * ROWS
    assert committed(stub, pipeline, 0)[:5] == [0, 1, 2, 3, 4]  # old history stays listed
    pipeline_info = stub.GetPipeline(pb.GetPipelineRequest(pipeline_id=pipeline), timeout=30)
    assert pipeline_info.generation == 1
    assert pipeline_info.resets[0].reason == "checkpoint deleted in test"


def test_opt_in_new_generation_resets_automatically_and_warns(
        spark, lake_daemon, lake, tmp_path, caplog):
    pipeline, stub = f"auto-{lake.name}", lake_daemon.stub
    calls: list[int] = []
    run_with(spark, Participant(lake_daemon.target, pipeline_id=pipeline), lake, calls,
              tmp_path / "ck1", lambda: len(committed(stub, pipeline, 0)) >= 2,
              rows_per_batch=ROWS)
    # a reset refuses while the old generation committed within the transaction timeout
    refused = run_with(
        spark, Participant(lake_daemon.target, pipeline_id=pipeline,
                           on_checkpoint_reset="new_generation"),
        lake, calls, tmp_path / "ck2", lambda: False)
    assert "on_checkpoint_reset" in str(refused.exception())
    # an idle generation (never committed, no live attempt) is reset automatically
    stub.ResetPipeline(pb.ResetPipelineRequest(pipeline_id=pipeline, reason="simulated idle",
                                               expected_generation=0), timeout=30)
    stub.RegisterPipeline(pb.RegisterPipelineRequest(
        pipeline_id=pipeline, query_id="00000000-0000-4000-8000-000000000001"), timeout=30)
    with caplog.at_level(logging.WARNING, logger="percolake.participant"):
        run_with(spark, Participant(lake_daemon.target, pipeline_id=pipeline,
                                     on_checkpoint_reset="new_generation"), lake, calls,
                  tmp_path / "ck3",
                  lambda: len(committed(stub, pipeline, 2)) >= 3, rows_per_batch=ROWS)
    assert any("new generation" in r.getMessage() for r in caplog.records)
    assert committed(stub, pipeline, 2)[:3] == [0, 1, 2]
