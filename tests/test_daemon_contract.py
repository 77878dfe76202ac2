"""Contract gaps seen through a real daemon (issue 13): each test failed before its fix.

- item 2 (I10): the daemon dies between the durable abort of an expired attempt and the
  deletion of its files; after a restart the attempt is ABORTED, its commit is refused and the
  files go: before the fix the abort was not yet durable, so the attempt came back OPEN and its
  driver could commit files that were deleted;
- item 3 (I10): a write whose apply could fail is refused before the commit point;
- item 9: the participant's automatic reset is a compare-and-set on the generation it saw, so
  a retried ResetPipeline (its first reply lost) resets once.
"""

from __future__ import annotations

import itertools
import json
import uuid
from pathlib import Path

import grpc
import pytest

from percolake.v1 import coordinator_pb2 as pb
from sparkside import Participant
from sparkside.errors import BatchRefused
from tests.daemon_support import (
    canonical,
    expect_status,
    report_applied,
    table_write,
    unique,
    wait_for,
)

pytestmark = pytest.mark.slow


def test_a_crash_between_the_durable_abort_and_the_cleanup_keeps_the_abort(daemon_factory):
    daemon = daemon_factory.start(
        ["--roll-forward-after", "3600"], name="abort-then-crash",
        env={"PERCOLAKE_FAILPOINTS": "after-abort-durable-before-cleanup=exit"})
    table = daemon.warehouse / "t"
    txn = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=unique("expiring"), tables=[str(table)], timeout_ms=300),
        timeout=30).transaction
    attempt = table / "_percolake" / txn.txn_id
    attempt.mkdir(parents=True)
    (attempt / "part-00000.parquet").write_bytes(b"x" * 100)
    # the resolver expires the attempt, makes the abort durable, and dies before deleting
    wait_for(lambda: not daemon.is_running(), 30, "the failpoint to stop the daemon")
    assert daemon.process.returncode == 137, daemon.log_tail()
    assert attempt.exists()
    daemon.env.pop("PERCOLAKE_FAILPOINTS")
    daemon.start()
    got = daemon.stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id), timeout=30)
    assert got.state == pb.ABORTED
    expect_status(daemon.stub.CommitTransaction,
                  pb.CommitTransactionRequest(txn_id=txn.txn_id), grpc.StatusCode.ABORTED)
    wait_for(lambda: not attempt.exists(), 30, "the restarted daemon to delete the files")
    assert daemon.stop() == 0


def test_the_automatic_reset_is_sent_as_a_compare_and_set(daemon):
    pipeline = unique("auto-reset")
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    daemon.stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline, query_id=old),
                                 timeout=30)
    participant = Participant(daemon.target, pipeline, on_checkpoint_reset="new_generation")
    call = participant.client.call

    def reply_lost_once(method, request, retry_s=None):
        if method == "ResetPipeline":
            call(method, request, retry_s)  # the first reply never reaches the participant
        return call(method, request, retry_s)

    participant.client.call = reply_lost_once
    try:
        participant._register(new)
    finally:
        participant.close()
    state = daemon.stub.GetPipeline(pb.GetPipelineRequest(pipeline_id=pipeline), timeout=30)
    assert state.generation == 1 and len(state.resets) == 1, state
    assert state.query_id == new and state.resets[0].bound_query_id == new


def test_commit_refuses_writes_that_could_never_be_applied(daemon):
    """Item 3 (I10): everything that could make the apply fail is refused before the commit
    point, and nothing is committed; before the fix each of these was COMMITTED."""
    table = str(daemon.warehouse / "typed")
    pipeline, batches = unique("typed"), itertools.count(1)  # the table's one writer
    first = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline), timeout=30).transaction
    daemon.stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=first.txn_id, writes=[table_write(table, first.txn_id)]), timeout=30)
    report_applied(daemon.stub, first.txn_id)  # the table exists: id long, day string

    def refused(code, *words, change=lambda write: None):
        txn = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=next(batches)), timeout=30).transaction
        write = table_write(table, txn.txn_id)
        change(write)
        expect_status(daemon.stub.CommitTransaction, pb.CommitTransactionRequest(
            txn_id=txn.txn_id, writes=[write]), code, table, *words)
        got = daemon.stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id),
                                         timeout=30)
        assert got.state == pb.OPEN, got
        daemon.stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=txn.txn_id), timeout=30)

    def schema(fields):
        return lambda write: setattr(write, "schema_json", json.dumps(
            {"type": "struct", "fields": fields}))

    string_y = [{"name": "y", "type": "string", "nullable": True, "metadata": {}}]
    refused(grpc.StatusCode.FAILED_PRECONDITION, "y", change=schema(string_y))
    refused(grpc.StatusCode.INVALID_ARGUMENT, change=lambda w: setattr(w, "schema_json", "{"))
    refused(grpc.StatusCode.INVALID_ARGUMENT, change=schema(
        [{"name": "id", "type": "no-such-type", "nullable": True, "metadata": {}}]))
    refused(grpc.StatusCode.FAILED_PRECONDITION, "part-00000.parquet",
            change=lambda w: (Path(canonical(table)[7:]) / w.add_files[0].path).unlink())
    refused(grpc.StatusCode.FAILED_PRECONDITION, "part-00000.parquet",
            change=lambda w: setattr(w.add_files[0], "size", 99))


def test_the_automatic_reset_does_not_run_for_an_earlier_generation_s_query_id(daemon):
    """I9: an old checkpoint restarted under on_checkpoint_reset='new_generation' is refused,
    not taken as a new checkpoint (that would write its replays again)."""
    pipeline = unique("old-checkpoint")
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    daemon.stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline, query_id=old),
                                 timeout=30)
    daemon.stub.ResetPipeline(pb.ResetPipelineRequest(
        pipeline_id=pipeline, reason="new checkpoint", query_id=new), timeout=30)
    participant = Participant(daemon.target, pipeline, on_checkpoint_reset="new_generation")
    try:
        with pytest.raises(BatchRefused, match="drove generation 0"):
            participant._register(old)
    finally:
        participant.close()
    state = daemon.stub.GetPipeline(pb.GetPipelineRequest(pipeline_id=pipeline), timeout=30)
    assert state.generation == 1 and state.query_id == new


def test_a_table_whose_log_is_a_symlink_is_refused_before_the_commit(daemon):
    """The apply refuses a ``_delta_log`` reached through a symlink, so the write check must
    refuse it too: otherwise the batch would be COMMITTED and never applied (I4, I10)."""
    table = daemon.warehouse / "linked"
    (daemon.warehouse / "elsewhere").mkdir()
    table.mkdir()
    (table / "_delta_log").symlink_to(daemon.warehouse / "elsewhere")
    txn = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=unique("linked")), timeout=30).transaction
    expect_status(daemon.stub.CommitTransaction, pb.CommitTransactionRequest(
        txn_id=txn.txn_id, writes=[table_write(str(table), txn.txn_id)]),
        grpc.StatusCode.PERMISSION_DENIED, "symlink")
    got = daemon.stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id), timeout=30)
    assert got.state == pb.OPEN
