"""Durability of a real daemon: SIGKILL right after replies, graceful SIGTERM, data dir set-up.

I6 (timestamps strictly increase across restarts) and I8 (every acknowledged state change is
on stable storage before the reply), seen from outside the process.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import grpc
import pytest

from percolake.lake.arrow_read import read_delta_table
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import apply_all, canonical, table_write, unique, wait_for

NO_ROLL_FORWARD = ["--roll-forward-after", "3600"]


def _get(stub, txn_id: str, include_writes: bool = False) -> pb.Transaction:
    return stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn_id,
                                                        include_writes=include_writes),
                               timeout=30)


def _snapshot_ts(daemon) -> int:
    """A snapshot of a table nobody wrote: needs no roll-forward, only a fresh timestamp."""
    return daemon.stub.GetSnapshot(pb.GetSnapshotRequest(
        tables=[str(daemon.warehouse / "never-written")]), timeout=30).snapshot_ts


def test_sigkill_after_commit_reply_keeps_the_commit_and_timestamps_grow(daemon_factory):
    daemon = daemon_factory.start(NO_ROLL_FORWARD, name="sigkill")
    newest = 0
    decided: dict[str, pb.Transaction] = {}
    for round_ in range(3):
        stub = daemon.stub
        pipeline = unique(f"kill{round_}")
        tables = [str(daemon.warehouse / unique("t")) for _ in range(2)]
        txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=0),
                                   timeout=30).transaction
        assert txn.start_ts > newest, "a start_ts after a restart is not above every earlier ts"
        writes = [table_write(t, txn.txn_id, files=2) for t in tables]
        committed = stub.CommitTransaction(pb.CommitTransactionRequest(
            txn_id=txn.txn_id, tables=tables, writes=writes), timeout=30).transaction
        assert committed.state == pb.COMMITTED
        newest = committed.commit_ts
        decided[committed.txn_id] = committed

        daemon.kill()  # SIGKILL right after the reply: no shutdown path runs
        daemon.start()

        for txn_id, before in decided.items():
            after = _get(daemon.stub, txn_id)
            assert after.state in (pb.COMMITTED, pb.APPLIED), txn_id
            assert after.commit_ts == before.commit_ts
        kept = {p.table: p.write for p in _get(daemon.stub, txn.txn_id, True).participants}
        assert set(kept) == {canonical(t) for t in tables}
        for table, write in zip(tables, writes, strict=True):
            assert list(kept[canonical(table)].add_files) == list(write.add_files)
        # The batch stays done: a replay after the crash is told so, nothing new is opened.
        replay = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=0), timeout=30)
        assert replay.already_committed and replay.transaction.txn_id == txn.txn_id

        snapshot_ts = _snapshot_ts(daemon)
        assert snapshot_ts > newest
        newest = snapshot_ts


def test_sigkill_keeps_every_acknowledged_state_and_epoch(daemon_factory):
    daemon = daemon_factory.start(NO_ROLL_FORWARD, name="sigkill-states")
    stub = daemon.stub
    pipeline = unique("states")
    e1 = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)
    table = str(daemon.warehouse / "t")

    def open_(batch: int) -> pb.Transaction:
        return stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=batch, epoch=e1.epoch), timeout=30).transaction

    empty = stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=open_(0).txn_id, epoch=e1.epoch), timeout=30).transaction
    applied = open_(1)
    stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=applied.txn_id, epoch=e1.epoch, writes=[table_write(table, applied.txn_id)]),
        timeout=30)
    (version,) = apply_all(stub, applied.txn_id).values()
    applied = stub.ReportApplied(pb.ReportAppliedRequest(
        txn_id=applied.txn_id, epoch=e1.epoch,
        tables=[pb.AppliedTable(table=table, delta_version=version)]), timeout=30).transaction
    aborted = stub.AbortTransaction(pb.AbortTransactionRequest(
        txn_id=open_(2).txn_id, epoch=e1.epoch, reason="test"), timeout=30).transaction
    prewritten = open_(3)
    prewritten = stub.Prewrite(pb.PrewriteRequest(
        txn_id=prewritten.txn_id, epoch=e1.epoch,
        writes=[table_write(table, prewritten.txn_id)]), timeout=30).transaction
    e2 = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)
    prewritten = _get(stub, prewritten.txn_id)  # fenced by e2: aborted
    assert prewritten.state == pb.ABORTED

    daemon.kill()
    daemon.start()
    stub = daemon.stub

    for before in (empty, applied, aborted, prewritten):
        assert _get(stub, before.txn_id) == before
    pipeline_after = stub.GetPipeline(pb.GetPipelineRequest(pipeline_id=pipeline), timeout=30)
    assert pipeline_after.epoch == e2.epoch
    try:
        stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=4,
                                                       epoch=e1.epoch), timeout=30)
        raise AssertionError("the old epoch was accepted after a restart")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "fenced" in exc.details()
    e3 = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)
    assert e3.epoch > e2.epoch


def test_sigterm_shuts_down_gracefully_and_the_store_reopens(daemon_factory):
    daemon = daemon_factory.start(NO_ROLL_FORWARD, name="sigterm")
    txn = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=unique("term")),
                                      timeout=30).transaction
    committed = daemon.stub.CommitTransaction(
        pb.CommitTransactionRequest(txn_id=txn.txn_id), timeout=30).transaction

    assert daemon.stop() == 0
    messages = [json.loads(line).get("msg") for line in
                daemon.log_path.read_text().splitlines() if line.startswith("{")]
    assert "shutting down" in messages and messages[-1] == "stopped", messages[-5:]

    daemon.start()
    assert _get(daemon.stub, txn.txn_id) == committed
    assert _snapshot_ts(daemon) > committed.commit_ts
    assert daemon.stop() == 0


def test_sigterm_right_after_serving_always_shuts_down(daemon_factory):
    """Repeated: SIGTERM soon after start must never be lost (it may reach any thread)."""
    for round_ in range(10):
        daemon = daemon_factory.start(NO_ROLL_FORWARD, name=f"sigterm-{round_}")
        txn = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="p"),
                                          timeout=30).transaction
        daemon.stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn.txn_id),
                                      timeout=30)
        code = daemon.stop(timeout_s=10)  # SIGKILL (-9) if it did not exit by then
        assert code == 0, f"round {round_}: SIGTERM ignored, exit {code}:\n{daemon.log_tail()}"


def test_sigterm_lets_an_in_flight_rpc_finish(daemon_factory):
    daemon = daemon_factory.start(NO_ROLL_FORWARD, name="in-flight",
                                  env={"PERCOLAKE_FAILPOINTS": "after-open=sleep(2)"})
    pipeline = unique("inflight")
    outcome: dict[str, object] = {}

    def open_slowly() -> None:
        try:
            outcome["reply"] = daemon.stub.OpenTransaction(
                pb.OpenTransactionRequest(pipeline_id=pipeline), timeout=30)
        except grpc.RpcError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=open_slowly)
    thread.start()
    # The open is durable before the failpoint sleeps: once it is listed, the RPC is in flight.
    wait_for(lambda: daemon.stub.ListTransactions(pb.ListTransactionsRequest(
        pipeline_id=pipeline), timeout=30).transactions, 10, "the open to be recorded")
    process = daemon.process
    process.terminate()
    thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["reply"].transaction.state == pb.OPEN
    try:
        code = process.wait(15)
    except subprocess.TimeoutExpired:
        daemon.kill()
        code = "none: still running 15 s after SIGTERM"
    assert code == 0, f"exit code {code}:\n{daemon.log_tail()}"


def test_serve_creates_a_missing_data_dir(daemon_factory, tmp_path):
    data_dir = tmp_path / "not" / "there" / "yet"
    assert not data_dir.exists()
    daemon = daemon_factory.start(data_dir=data_dir, name="fresh")
    assert data_dir.is_dir() and any(data_dir.iterdir())
    txn = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="p"),
                                      timeout=30).transaction
    assert txn.state == pb.OPEN
    assert daemon.stop() == 0


def test_table_holds_and_deadlines_survive_a_restart(daemon_factory):
    daemon = daemon_factory.start(["--conflict-wait", "1", "--shared-table-writers",
                                   *NO_ROLL_FORWARD], name="holds")
    table = str(daemon.warehouse / "t")
    holder = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=unique("holder"), tables=[table]), timeout=30).transaction
    holder = daemon.stub.Prewrite(pb.PrewriteRequest(
        txn_id=holder.txn_id, writes=[table_write(table, holder.txn_id)]), timeout=30).transaction

    daemon.kill()
    daemon.start()

    other = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=unique("other")),
                                        timeout=30).transaction
    try:
        daemon.stub.DeclareTables(pb.DeclareTablesRequest(txn_id=other.txn_id, tables=[table]),
                                  timeout=30)
        raise AssertionError("the table's hold was lost in the restart")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.ABORTED and holder.txn_id in exc.details()
    beat = daemon.stub.Heartbeat(pb.HeartbeatRequest(txn_id=holder.txn_id), timeout=30)
    assert beat.state == pb.PREWRITTEN and beat.expires_in_ms > 0
    committed = daemon.stub.CommitTransaction(
        pb.CommitTransactionRequest(txn_id=holder.txn_id), timeout=30).transaction
    assert committed.state == pb.COMMITTED and committed.commit_ts > holder.start_ts


def test_attempt_open_at_a_crash_expires_after_restart_and_its_files_go(daemon_factory):
    daemon = daemon_factory.start(NO_ROLL_FORWARD, name="orphan")
    opened = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=unique("orphan"), tables=[str(daemon.warehouse / "t")]), timeout=30)
    folder = Path(opened.locations[0].write_location.removeprefix("file://"))
    folder.mkdir(parents=True)
    (folder / "part-00000.parquet").write_bytes(b"data written before the crash")

    daemon.kill()
    daemon.extra_args += ["--txn-timeout", "1"]  # the last flag wins
    daemon.start()

    txn_id = opened.transaction.txn_id
    wait_for(lambda: _get(daemon.stub, txn_id).state == pb.ABORTED, 15,
             "the orphaned attempt to expire after the restart")
    wait_for(lambda: not folder.exists(), 10, "the orphaned attempt's files to be deleted")


def _write_parquet(table: str, txn_id: str, ids: list[int]) -> pb.TableWrite:
    """A real Parquet file in the attempt's folder and its write intent (what executors do)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    write = table_write(table, txn_id)  # its placeholder file is replaced by real Parquet
    path = Path(table) / write.add_files[0].path
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                             "day": pa.array(["d1"] * len(ids), pa.string())}), path)
    write.add_files[0].size = path.stat().st_size
    write.add_files[0].stats = json.dumps({"numRecords": len(ids)})
    return write


def _delta_ids(table: str, version: int) -> list[int]:

    return sorted(read_delta_table(table, version)["id"].to_pylist())


@pytest.mark.parametrize("resolver", ["snapshot_reader", "background_resolver"])
def test_commit_acknowledged_before_sigkill_is_applied_without_its_participant(
        daemon_factory, resolver):
    """I4: after the commit reply the participant and the daemon die; the restarted daemon
    applies every table exactly once, by a reader's GetSnapshot or on its own."""
    after = "1" if resolver == "background_resolver" else "3600"
    daemon = daemon_factory.start(["--roll-forward-after", after], name=f"i4-{resolver}")
    tables = [str(daemon.warehouse / name) for name in ("debits", "credits")]
    txn = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="bank"),
                                      timeout=30).transaction
    writes = [_write_parquet(t, txn.txn_id, [10 * i + 1, 10 * i + 2])
              for i, t in enumerate(tables)]
    committed = daemon.stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=txn.txn_id, tables=tables, writes=writes), timeout=30).transaction
    assert committed.state == pb.COMMITTED

    daemon.kill()
    daemon.start()

    if resolver == "snapshot_reader":
        snapshot = daemon.stub.GetSnapshot(pb.GetSnapshotRequest(tables=tables), timeout=60)
        assert snapshot.snapshot_ts > committed.commit_ts
        versions = {v.table: v.delta_version for v in snapshot.tables if v.exists}
    applied = wait_for(lambda: (t := _get(daemon.stub, txn.txn_id)).state == pb.APPLIED and t,
                       30, "the committed transaction to be applied")
    reported = {p.table: p.delta_version for p in applied.participants}
    if resolver == "snapshot_reader":
        assert versions == {t: reported[canonical(t)] for t in tables}
    from deltalake import DeltaTable

    for i, table in enumerate(tables):
        assert _delta_ids(table, reported[canonical(table)]) == [10 * i + 1, 10 * i + 2]
        assert DeltaTable(table).version() == reported[canonical(table)], "applied twice"
    assert applied.commit_ts == committed.commit_ts
