"""The transaction protocol against a real daemon subprocess on a free port (issue 3).

One daemon serves the module (each test uses its own pipeline ids and tables); the timeout
tests get a second one started with ``--txn-timeout 1``. ``--roll-forward-after 3600`` keeps the
resolver from applying committed writes itself: these tests apply with delta-rs and report the
Delta versions themselves, as a participant does (the coordinator checks them against the log).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import (
    apply_all,
    canonical,
    expect_status,
    report_applied,
    table_write,
    unique,
    wait_for,
)

FP = grpc.StatusCode.FAILED_PRECONDITION
ABORTED = grpc.StatusCode.ABORTED


@pytest.fixture(scope="module")
def shared(daemon_factory):
    # Pipelines of their own race for one table here (--shared-table-writers): write-write
    # conflicts between transactions stay part of the protocol whoever owns the table.
    daemon = daemon_factory.start(
        ["--conflict-wait", "1", "--roll-forward-after", "3600", "--txn-timeout", "30",
         "--shared-table-writers"], name="protocol")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def short_timeout(daemon_factory):
    daemon = daemon_factory.start(
        ["--txn-timeout", "1", "--roll-forward-after", "3600"], name="timeouts")
    yield daemon
    daemon.stop()


@pytest.fixture
def stub(shared):
    return shared.stub


def tables_in(daemon, n: int = 3) -> list[str]:
    """``n`` table paths nobody else uses, under the daemon's warehouse."""
    return [str(daemon.warehouse / unique(f"t{i}")) for i in range(n)]


def open_txn(stub, pipeline: str, batch: int = 0, **fields) -> pb.OpenTransactionResponse:
    return stub.OpenTransaction(
        pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=batch, **fields), timeout=30)


def get(stub, txn_id: str, include_writes: bool = False) -> pb.Transaction:
    return stub.GetTransaction(
        pb.GetTransactionRequest(txn_id=txn_id, include_writes=include_writes), timeout=30)


def by_table(txn: pb.Transaction) -> dict[str, pb.TableParticipant]:
    return {p.table: p for p in txn.participants}


def list_all(stub, page_size: int = 1000, **filters) -> list[pb.Transaction]:
    """Every transaction matching ``filters``, walking the pages; checks each page's size."""
    out: list[pb.Transaction] = []
    token = ""
    for _ in range(10_000):
        reply = stub.ListTransactions(pb.ListTransactionsRequest(
            page_size=page_size, page_token=token, **filters), timeout=30)
        assert len(reply.transactions) <= page_size
        out.extend(reply.transactions)
        token = reply.next_page_token
        if not token:
            return out
        assert reply.transactions, "a page with a next_page_token must not be empty"
    raise AssertionError("paging did not end")


def prewritten_txn(stub, daemon, pipeline: str, batch: int = 0, n_tables: int = 1):
    """An attempt with ``n_tables`` prewritten tables; returns (txn, tables)."""
    tables = tables_in(daemon, n_tables)
    txn = open_txn(stub, pipeline, batch).transaction
    reply = stub.Prewrite(pb.PrewriteRequest(
        txn_id=txn.txn_id, writes=[table_write(t, txn.txn_id) for t in tables]), timeout=30)
    return reply.transaction, tables


def make_attempt_files(write_location: str) -> Path:
    """Writes a data file where the attempt's executors would, and returns its folder."""
    folder = Path(write_location.removeprefix("file://"))
    folder.mkdir(parents=True)
    (folder / "part-00000.parquet").write_bytes(b"PAR1 not really PAR1")
    return folder


# ---------------------------------------------------------------------------- happy path


@pytest.mark.parametrize("prewrite_calls", ["one_call_three_tables", "one_call_per_table"])
def test_three_table_transaction_open_prewrite_commit_apply(shared, stub, prewrite_calls):
    pipeline = unique("orders")
    tables = tables_in(shared, 3)
    canon = [canonical(t) for t in tables]

    opened = open_txn(stub, pipeline, 7)
    txn = opened.transaction
    assert not opened.already_committed
    assert (txn.state, txn.pipeline_id, txn.batch_id, txn.attempt) == (pb.OPEN, pipeline, 7, 1)
    assert txn.start_ts > 0 and txn.commit_ts == 0 and txn.generation == 0 and txn.epoch == 0

    declared = stub.DeclareTables(pb.DeclareTablesRequest(txn_id=txn.txn_id, tables=tables),
                                  timeout=30)
    expected_locations = {c: f"{c}/_percolake/{txn.txn_id}" for c in canon}
    assert {loc.table: loc.write_location for loc in declared.locations} == expected_locations
    assert declared.transaction.state == pb.OPEN
    assert {p.table: p.prewritten for p in declared.transaction.participants} == dict.fromkeys(
        canon, False)

    writes = [table_write(t, txn.txn_id, files=i + 1, rows=10) for i, t in enumerate(tables)]
    if prewrite_calls == "one_call_three_tables":
        prewritten = stub.Prewrite(pb.PrewriteRequest(txn_id=txn.txn_id, writes=writes),
                                   timeout=30).transaction
    else:
        first = stub.Prewrite(pb.PrewriteRequest(txn_id=txn.txn_id, writes=writes[:1]),
                              timeout=30).transaction
        assert first.state == pb.PREWRITTEN
        assert [p.prewritten for p in first.participants].count(True) == 1
        # The commit names every table: each must have its prewrite first.
        expect_status(stub.CommitTransaction,
                      pb.CommitTransactionRequest(txn_id=txn.txn_id, tables=tables),
                      FP, "no prewrite", canon[1], canon[2])
        assert get(stub, txn.txn_id).state == pb.PREWRITTEN
        for write in writes[1:]:
            prewritten = stub.Prewrite(pb.PrewriteRequest(txn_id=txn.txn_id, writes=[write]),
                                       timeout=30).transaction
    assert prewritten.state == pb.PREWRITTEN
    participants = by_table(prewritten)
    assert set(participants) == set(canon)
    for i, c in enumerate(canon):
        p = participants[c]
        assert p.prewritten and not p.applied
        assert (p.mode, p.file_count, p.row_count) == (pb.APPEND, i + 1, 10 * (i + 1))
        assert p.write_location == expected_locations[c]

    # The coordinator's record alone is enough to finish the commit: the full intent is kept.
    stored = by_table(get(stub, txn.txn_id, include_writes=True))
    for c, sent in zip(canon, writes, strict=True):
        kept = stored[c].write
        assert kept.table == c and kept.schema_json == sent.schema_json
        assert list(kept.add_files) == list(sent.add_files)

    committed = stub.CommitTransaction(
        pb.CommitTransactionRequest(txn_id=txn.txn_id, tables=tables), timeout=30).transaction
    assert committed.state == pb.COMMITTED
    assert committed.commit_ts > committed.start_ts == txn.start_ts

    delta = apply_all(stub, txn.txn_id)
    partial = stub.ReportApplied(pb.ReportAppliedRequest(
        txn_id=txn.txn_id, tables=[pb.AppliedTable(table=tables[0], delta_version=0)]),
        timeout=30).transaction
    assert partial.state == pb.COMMITTED, "APPLIED only once every table is reported"
    expect_status(stub.ReportApplied, pb.ReportAppliedRequest(txn_id=txn.txn_id, tables=[
        pb.AppliedTable(table=tables[1], delta_version=4)]), FP, "not transaction")
    applied = stub.ReportApplied(pb.ReportAppliedRequest(txn_id=txn.txn_id, tables=[
        pb.AppliedTable(table=tables[1], delta_version=delta[canon[1]]),
        pb.AppliedTable(table=tables[2], delta_version=delta[canon[2]])]),
        timeout=30).transaction
    assert applied.state == pb.APPLIED

    final = get(stub, txn.txn_id)
    assert final.state == pb.APPLIED and final.commit_ts == committed.commit_ts
    versions = {p.table: (p.applied, p.delta_version) for p in final.participants}
    assert versions == {c: (True, 0) for c in canon}


def test_commit_with_writes_in_one_call(shared, stub):
    pipeline = unique("one-trip")
    tables = tables_in(shared, 3)
    txn = open_txn(stub, pipeline).transaction
    request = pb.CommitTransactionRequest(
        txn_id=txn.txn_id, tables=tables, writes=[table_write(t, txn.txn_id) for t in tables])
    committed = stub.CommitTransaction(request, timeout=30).transaction
    assert committed.state == pb.COMMITTED and committed.commit_ts > txn.start_ts
    assert {p.table for p in committed.participants if p.prewritten} == {
        canonical(t) for t in tables}
    assert stub.CommitTransaction(request, timeout=30).transaction == committed


# ---------------------------------------------------------------------------- idempotency


def test_retries_of_each_call_are_idempotent(shared, stub):
    pipeline = unique("retry")
    tables = tables_in(shared, 3)
    txn = open_txn(stub, pipeline).transaction

    declare = pb.DeclareTablesRequest(txn_id=txn.txn_id, tables=tables)
    first = stub.DeclareTables(declare, timeout=30)
    assert stub.DeclareTables(declare, timeout=30) == first

    prewrite = pb.PrewriteRequest(txn_id=txn.txn_id,
                                  writes=[table_write(t, txn.txn_id) for t in tables])
    first = stub.Prewrite(prewrite, timeout=30)
    assert stub.Prewrite(prewrite, timeout=30) == first
    assert get(stub, txn.txn_id) == first.transaction

    commit = pb.CommitTransactionRequest(txn_id=txn.txn_id, tables=tables)
    committed = stub.CommitTransaction(commit, timeout=30)
    again = stub.CommitTransaction(commit, timeout=30)
    assert again == committed
    assert again.transaction.commit_ts == committed.transaction.commit_ts
    assert get(stub, txn.txn_id) == committed.transaction

    # A retried prewrite after the commit (its reply was lost) answers the committed record.
    assert stub.Prewrite(prewrite, timeout=30).transaction == committed.transaction

    delta = apply_all(stub, txn.txn_id)
    report = pb.ReportAppliedRequest(txn_id=txn.txn_id, tables=[
        pb.AppliedTable(table=t, delta_version=delta[canonical(t)]) for t in tables])
    applied = stub.ReportApplied(report, timeout=30)
    assert applied.transaction.state == pb.APPLIED
    assert stub.ReportApplied(report, timeout=30) == applied
    assert get(stub, txn.txn_id) == applied.transaction

    beat = stub.Heartbeat(pb.HeartbeatRequest(txn_id=txn.txn_id), timeout=30)
    assert (beat.state, beat.expires_in_ms) == (pb.APPLIED, 0)
    assert get(stub, txn.txn_id) == applied.transaction


def test_retried_abort_answers_the_same_aborted_transaction(shared, stub):
    txn = open_txn(stub, unique("abort-retry")).transaction
    abort = pb.AbortTransactionRequest(txn_id=txn.txn_id, reason="user function failed")
    first = stub.AbortTransaction(abort, timeout=30)
    assert first.transaction.state == pb.ABORTED
    assert first.transaction.abort_reason == "user function failed"
    assert stub.AbortTransaction(abort, timeout=30) == first
    assert get(stub, txn.txn_id) == first.transaction


def test_changed_retries_are_refused_not_merged(shared, stub):
    """A "retry" that differs from what was recorded is refused and changes nothing."""
    txn, (table,) = prewritten_txn(stub, shared, unique("differ"))
    expect_status(stub.Prewrite, pb.PrewriteRequest(
        txn_id=txn.txn_id, writes=[table_write(table, txn.txn_id, files=2)]),
        FP, "different prewrite")
    assert get(stub, txn.txn_id) == txn
    stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn.txn_id), timeout=30)
    report_applied(stub, txn.txn_id)
    applied = get(stub, txn.txn_id)
    expect_status(stub.ReportApplied, pb.ReportAppliedRequest(
        txn_id=txn.txn_id, tables=[pb.AppliedTable(table=table, delta_version=4)]),
        FP, "version 0")
    assert get(stub, txn.txn_id) == applied


def test_refused_prewrite_declares_nothing(shared, stub):
    """A prewrite refused as a whole leaves no trace: a new table riding along is not held."""
    txn, (table,) = prewritten_txn(stub, shared, unique("partial"))
    (extra,) = tables_in(shared, 1)
    expect_status(stub.Prewrite, pb.PrewriteRequest(txn_id=txn.txn_id, writes=[
        table_write(table, txn.txn_id, files=2), table_write(extra, txn.txn_id)]),
        FP, "different prewrite")
    assert get(stub, txn.txn_id) == txn


# ---------------------------------------------------------------------------- batches


def test_empty_transaction_commits_and_marks_its_batch_done(shared, stub):
    pipeline = unique("empty")
    txn = open_txn(stub, pipeline, 4).transaction
    committed = stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn.txn_id),
                                       timeout=30).transaction
    assert committed.state in (pb.COMMITTED, pb.APPLIED)
    assert committed.commit_ts > txn.start_ts and not committed.participants

    again = open_txn(stub, pipeline, 4)
    assert again.already_committed
    assert again.transaction.txn_id == txn.txn_id
    assert again.transaction.commit_ts == committed.commit_ts
    assert [t.txn_id for t in list_all(stub, pipeline_id=pipeline)] == [txn.txn_id]


def test_reopen_of_committed_batch_answers_already_committed(shared, stub):
    pipeline = unique("reopen")
    txn, tables = prewritten_txn(stub, shared, pipeline, batch=9, n_tables=2)
    committed = stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn.txn_id),
                                       timeout=30).transaction

    for state in (pb.COMMITTED, pb.APPLIED):
        reply = open_txn(stub, pipeline, 9)
        assert reply.already_committed
        assert reply.transaction.state == state
        assert reply.transaction.txn_id == txn.txn_id
        assert reply.transaction.commit_ts == committed.commit_ts
        # The locations tell the participant which secondaries it may still have to finish.
        assert {loc.table for loc in reply.locations} == {canonical(t) for t in tables}
        report_applied(stub, txn.txn_id)
    assert [t.txn_id for t in list_all(stub, pipeline_id=pipeline)] == [txn.txn_id]


def test_reopen_of_live_batch_aborts_the_old_attempt(shared, stub):
    pipeline = unique("replay")
    (table,) = tables_in(shared, 1)
    old = open_txn(stub, pipeline, 3, tables=[table])
    folder = make_attempt_files(old.locations[0].write_location)

    new = open_txn(stub, pipeline, 3, tables=[table])  # no conflict with the old attempt
    assert not new.already_committed
    assert new.transaction.attempt == 2 and new.transaction.state == pb.OPEN
    assert new.transaction.txn_id != old.transaction.txn_id
    assert [p.table for p in new.transaction.participants] == [canonical(table)]

    stale = get(stub, old.transaction.txn_id)
    assert stale.state == pb.ABORTED and "superseded" in stale.abort_reason
    wait_for(lambda: not folder.exists(), 10, "the old attempt's files to be deleted")
    expect_status(stub.CommitTransaction,
                  pb.CommitTransactionRequest(txn_id=old.transaction.txn_id), ABORTED, "aborted")


# ---------------------------------------------------------------------------- fencing


def test_stale_epoch_is_fenced_and_changes_nothing(shared, stub):
    pipeline = unique("fenced")
    (table,) = tables_in(shared, 1)
    e1 = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)
    zombie = open_txn(stub, pipeline, 0, epoch=e1.epoch).transaction
    e2 = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)
    assert e2.epoch > e1.epoch
    assert get(stub, zombie.txn_id).state == pb.ABORTED  # the new driver fenced its attempt

    live = open_txn(stub, pipeline, 0, epoch=e2.epoch, tables=[table]).transaction
    txn_id = live.txn_id
    old = e1.epoch
    refused = [
        (stub.OpenTransaction, pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=0,
                                                         epoch=old)),
        (stub.OpenTransaction, pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=1,
                                                         epoch=old)),
        (stub.DeclareTables, pb.DeclareTablesRequest(txn_id=txn_id, epoch=old, tables=[table])),
        (stub.Prewrite, pb.PrewriteRequest(txn_id=txn_id, epoch=old,
                                           writes=[table_write(table, txn_id)])),
        (stub.CommitTransaction, pb.CommitTransactionRequest(txn_id=txn_id, epoch=old)),
        (stub.AbortTransaction, pb.AbortTransactionRequest(txn_id=txn_id, epoch=old)),
        (stub.Heartbeat, pb.HeartbeatRequest(txn_id=txn_id, epoch=old)),
    ]
    for call, request in refused:
        expect_status(call, request, FP, "fenced", f"epoch {old}")
    assert get(stub, txn_id) == live
    assert [t.txn_id for t in list_all(stub, pipeline_id=pipeline)] == [zombie.txn_id, txn_id]

    stub.Prewrite(pb.PrewriteRequest(txn_id=txn_id, epoch=e2.epoch,
                                     writes=[table_write(table, txn_id)]), timeout=30)
    committed = stub.CommitTransaction(
        pb.CommitTransactionRequest(txn_id=txn_id, epoch=e2.epoch), timeout=30).transaction
    expect_status(stub.ReportApplied, pb.ReportAppliedRequest(
        txn_id=txn_id, epoch=old, tables=[pb.AppliedTable(table=table, delta_version=0)]),
        FP, "fenced")
    assert get(stub, txn_id) == committed
    # An epoch that was never issued is refused too.
    expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=1, epoch=e2.epoch + 5), FP, "never issued")


def test_stale_epoch_on_the_fenced_attempt_itself_is_fenced(shared, stub):
    """The zombie's own attempt: every call with the old epoch answers "fenced"."""
    pipeline = unique("zombie")
    (table,) = tables_in(shared, 1)
    e1 = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)
    zombie = open_txn(stub, pipeline, 0, epoch=e1.epoch).transaction
    stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)
    fenced = get(stub, zombie.txn_id)
    for call, request in [
        (stub.Prewrite, pb.PrewriteRequest(txn_id=zombie.txn_id, epoch=e1.epoch,
                                           writes=[table_write(table, zombie.txn_id)])),
        (stub.CommitTransaction, pb.CommitTransactionRequest(txn_id=zombie.txn_id,
                                                             epoch=e1.epoch)),
    ]:
        expect_status(call, request, FP, "fenced")
    assert get(stub, zombie.txn_id) == fenced


def test_stale_epoch_retry_of_a_committed_commit_is_fenced(shared, stub):
    pipeline = unique("late-zombie")
    e1 = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)
    txn = open_txn(stub, pipeline, 0, epoch=e1.epoch).transaction
    commit = pb.CommitTransactionRequest(txn_id=txn.txn_id, epoch=e1.epoch)
    committed = stub.CommitTransaction(commit, timeout=30).transaction
    stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)
    expect_status(stub.CommitTransaction, commit, FP, "fenced")
    assert get(stub, txn.txn_id) == committed


def test_requests_without_epoch_are_refused_on_a_registered_pipeline(shared, stub):
    pipeline = unique("registered")
    (table,) = tables_in(shared, 1)
    reg = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)
    expect_status(stub.OpenTransaction,
                  pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=0), FP, "epoch")
    txn = open_txn(stub, pipeline, 0, epoch=reg.epoch, tables=[table]).transaction
    txn_id = txn.txn_id
    for call, request in [
        (stub.DeclareTables, pb.DeclareTablesRequest(txn_id=txn_id, tables=[table])),
        (stub.Prewrite, pb.PrewriteRequest(txn_id=txn_id, writes=[table_write(table, txn_id)])),
        (stub.CommitTransaction, pb.CommitTransactionRequest(txn_id=txn_id)),
        (stub.AbortTransaction, pb.AbortTransactionRequest(txn_id=txn_id)),
        (stub.Heartbeat, pb.HeartbeatRequest(txn_id=txn_id)),
    ]:
        expect_status(call, request, FP, "without an epoch")
    assert get(stub, txn_id) == txn
    assert [t.txn_id for t in list_all(stub, pipeline_id=pipeline)] == [txn_id]


# ---------------------------------------------------------------------------- conflicts


def test_write_write_conflict_is_aborted_naming_the_holder(shared, stub):
    (table,) = tables_in(shared, 1)
    holder = open_txn(stub, unique("holder"), 0, tables=[table]).transaction
    other = open_txn(stub, unique("other"), 0).transaction

    started = time.monotonic()
    expect_status(stub.DeclareTables,
                  pb.DeclareTablesRequest(txn_id=other.txn_id, tables=[table]),
                  ABORTED, holder.txn_id, "held by")
    waited = time.monotonic() - started
    assert 0.8 <= waited < 10, f"--conflict-wait 1 but the conflict took {waited:.1f} s"
    expect_status(stub.Prewrite, pb.PrewriteRequest(
        txn_id=other.txn_id, writes=[table_write(table, other.txn_id)]), ABORTED, holder.txn_id)
    expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=unique("third"), batch_id=0, tables=[table]), ABORTED, holder.txn_id)
    after = get(stub, other.txn_id)
    assert after.state == pb.OPEN and not after.participants

    stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=holder.txn_id), timeout=30)
    declared = stub.DeclareTables(
        pb.DeclareTablesRequest(txn_id=other.txn_id, tables=[table]), timeout=30)
    assert [p.table for p in declared.transaction.participants] == [canonical(table)]


def test_conflict_waiter_gets_the_table_when_the_holder_aborts(shared, stub):
    holder, _ = prewritten_txn(stub, shared, unique("slow-holder"))
    holder_table = holder.participants[0].table
    waiter = open_txn(stub, unique("waiter"), 0).transaction
    result: dict[str, object] = {}

    def declare() -> None:
        try:
            result["reply"] = stub.DeclareTables(pb.DeclareTablesRequest(
                txn_id=waiter.txn_id, tables=[holder_table]), timeout=30)
        except grpc.RpcError as exc:
            result["error"] = exc

    thread = threading.Thread(target=declare)
    thread.start()
    time.sleep(0.2)  # let the waiter start waiting (--conflict-wait is 1 s)
    stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=holder.txn_id), timeout=30)
    thread.join(30)
    assert "error" not in result, result.get("error")
    assert [p.table for p in result["reply"].transaction.participants] == [holder_table]


# ---------------------------------------------------------------------------- timeouts


def test_heartbeats_extend_then_timeout_aborts_and_deletes_files(short_timeout):
    stub = short_timeout.stub
    (table,) = tables_in(short_timeout, 1)
    opened = open_txn(stub, unique("beat"), 0, tables=[table])
    txn_id = opened.transaction.txn_id
    folder = make_attempt_files(opened.locations[0].write_location)

    until = time.monotonic() + 3.0  # three timeouts long, alive thanks to heartbeats
    while time.monotonic() < until:
        beat = stub.Heartbeat(pb.HeartbeatRequest(txn_id=txn_id), timeout=30)
        assert (beat.state, beat.expires_in_ms) == (pb.OPEN, 1000)
        time.sleep(0.2)
    assert get(stub, txn_id).state == pb.OPEN and folder.exists()

    aborted = wait_for(lambda: (t := get(stub, txn_id)).state == pb.ABORTED and t, 10,
                       "the transaction to expire without heartbeats")
    assert "expired" in aborted.abort_reason
    wait_for(lambda: not folder.exists(), 10, "the expired attempt's files to be deleted")
    assert folder.parent.exists(), "only the attempt's own folder is deleted"
    beat = stub.Heartbeat(pb.HeartbeatRequest(txn_id=txn_id), timeout=30)
    assert (beat.state, beat.expires_in_ms) == (pb.ABORTED, 0)
    expect_status(stub.CommitTransaction, pb.CommitTransactionRequest(txn_id=txn_id),
                  ABORTED, "aborted")


def test_timeout_aborts_open_and_prewritten_but_never_committed(short_timeout):
    stub = short_timeout.stub
    pipeline = unique("expiry")
    open_one = open_txn(stub, pipeline, 0, tables=tables_in(short_timeout, 1))
    folder = make_attempt_files(open_one.locations[0].write_location)
    prewritten, _ = prewritten_txn(stub, short_timeout, pipeline, batch=1)
    committed, _ = prewritten_txn(stub, short_timeout, pipeline, batch=2)
    committed = stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=committed.txn_id),
                                       timeout=30).transaction

    for txn_id in (open_one.transaction.txn_id, prewritten.txn_id):
        wait_for(lambda t=txn_id: get(stub, t).state == pb.ABORTED, 10, f"{txn_id} to expire")
    wait_for(lambda: not folder.exists(), 10, "the expired attempt's files to be deleted")
    assert get(stub, committed.txn_id) == committed


def test_open_timeout_ms_overrides_the_default_timeout(shared, stub):
    txn = open_txn(stub, unique("own-timeout"), 0, timeout_ms=700).transaction
    beat = stub.Heartbeat(pb.HeartbeatRequest(txn_id=txn.txn_id), timeout=30)
    assert (beat.state, beat.expires_in_ms) == (pb.OPEN, 700)
    wait_for(lambda: get(stub, txn.txn_id).state == pb.ABORTED, 10,
             "a 700 ms transaction to expire on a daemon whose default is 30 s")


# ---------------------------------------------------------------------------- final states


def test_commit_after_abort_is_refused(shared, stub):
    txn, tables = prewritten_txn(stub, shared, unique("abort-then-commit"))
    aborted = stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=txn.txn_id),
                                    timeout=30).transaction
    expect_status(stub.CommitTransaction, pb.CommitTransactionRequest(txn_id=txn.txn_id),
                  ABORTED, txn.txn_id, "aborted")
    expect_status(stub.CommitTransaction, pb.CommitTransactionRequest(
        txn_id=txn.txn_id, writes=[table_write(tables[0], txn.txn_id)]), ABORTED, "aborted")
    assert get(stub, txn.txn_id) == aborted


def test_abort_after_commit_is_refused(shared, stub):
    txn, _ = prewritten_txn(stub, shared, unique("commit-then-abort"))
    committed = stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn.txn_id),
                                       timeout=30).transaction
    expect_status(stub.AbortTransaction, pb.AbortTransactionRequest(txn_id=txn.txn_id),
                  FP, "committed")
    assert get(stub, txn.txn_id) == committed


# ---------------------------------------------------------------------------- listing


def test_list_transactions_filters_and_pages(shared, stub):
    pipeline = unique("listed")
    before_ms = int(time.time() * 1000)
    done = open_txn(stub, pipeline, 0).transaction
    stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=done.txn_id), timeout=30)
    aborted = open_txn(stub, pipeline, 1).transaction
    stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=aborted.txn_id), timeout=30)
    superseded = open_txn(stub, pipeline, 2).transaction
    retry = open_txn(stub, pipeline, 2).transaction
    prewritten, _ = prewritten_txn(stub, shared, pipeline, batch=3)
    live = open_txn(stub, pipeline, 4).transaction
    stranger = open_txn(stub, unique("other-pipeline"), 2).transaction
    ids = [t.txn_id for t in (done, aborted, superseded, retry, prewritten, live)]

    def listed(**filters) -> list[str]:
        return [t.txn_id for t in list_all(stub, **filters)]

    assert listed(pipeline_id=pipeline) == ids  # ordered by start_ts
    assert listed(pipeline_id=pipeline, states=[pb.ABORTED]) == [aborted.txn_id,
                                                                  superseded.txn_id]
    assert listed(pipeline_id=pipeline, states=[pb.OPEN, pb.PREWRITTEN]) == [
        retry.txn_id, prewritten.txn_id, live.txn_id]
    assert listed(pipeline_id=pipeline, states=[pb.COMMITTED, pb.APPLIED]) == [done.txn_id]
    assert listed(pipeline_id=pipeline, batch_id=2) == [superseded.txn_id, retry.txn_id]
    assert listed(pipeline_id=pipeline, batch_id=2, states=[pb.OPEN]) == [retry.txn_id]
    assert listed(pipeline_id=pipeline, generation=0) == ids
    assert listed(pipeline_id=pipeline, generation=1) == []
    assert listed(pipeline_id=pipeline, created_after_unix_ms=before_ms) == ids
    assert listed(pipeline_id=pipeline, created_before_unix_ms=before_ms) == []
    assert listed(pipeline_id=pipeline,
                  created_after_unix_ms=int(time.time() * 1000) + 60_000) == []
    assert stranger.txn_id in listed(batch_id=2)
    assert stranger.txn_id not in listed(pipeline_id=pipeline)

    for size in (1, 2, 4, 6, 7):
        assert listed(pipeline_id=pipeline, page_size=size) == ids, f"page_size {size}"
    first = stub.ListTransactions(pb.ListTransactionsRequest(pipeline_id=pipeline, page_size=6),
                                  timeout=30)
    assert len(first.transactions) == 6  # a full last page needs no further page ...
    if first.next_page_token:  # ... and if one is offered it is empty and ends the walk
        rest = stub.ListTransactions(pb.ListTransactionsRequest(
            pipeline_id=pipeline, page_size=6, page_token=first.next_page_token), timeout=30)
        assert not rest.transactions and not rest.next_page_token

    everything = listed()
    assert len(everything) == len(set(everything))
    assert set(ids) | {stranger.txn_id} <= set(everything)
    assert listed(page_size=3) == everything


# ---------------------------------------------------------------------------- query ids, races


def test_other_query_id_is_refused_not_taken_for_a_replay(shared, stub):
    pipeline = unique("query")
    q1, q2 = "c0ffee00-1234-4abc-8def-0123456789ab", "deadbeef-1234-4abc-8def-0123456789ab"
    reg = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline, query_id=q1),
                                timeout=30)
    txn = open_txn(stub, pipeline, 0, epoch=reg.epoch, query_id=q1).transaction
    stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn.txn_id, epoch=reg.epoch),
                           timeout=30)
    # Batch 0 of a replaced checkpoint is a new batch, not a replay of the committed one.
    expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=0, epoch=reg.epoch, query_id=q2),
        FP, q1, q2, "reset-pipeline")
    expect_status(stub.RegisterPipeline,
                  pb.RegisterPipelineRequest(pipeline_id=pipeline, query_id=q2), FP, q1, q2)
    expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=0, epoch=reg.epoch), FP, "query id")
    assert [t.txn_id for t in list_all(stub, pipeline_id=pipeline)] == [txn.txn_id]
    assert open_txn(stub, pipeline, 0, epoch=reg.epoch, query_id=q1).already_committed


def _commit_into(stub, txn_id: str, outcome: dict[str, object]) -> None:
    try:
        outcome["commit"] = stub.CommitTransaction(
            pb.CommitTransactionRequest(txn_id=txn_id), timeout=30).transaction
    except grpc.RpcError as exc:
        outcome["commit_error"] = exc


def test_at_most_one_attempt_of_a_batch_commits_under_races(shared, stub):
    pipeline = unique("race")
    for batch in range(15):
        first = open_txn(stub, pipeline, batch).transaction
        outcome: dict[str, object] = {}
        thread = threading.Thread(target=_commit_into, args=(stub, first.txn_id, outcome))
        thread.start()
        reopened = open_txn(stub, pipeline, batch)
        thread.join(30)
        attempts = list_all(stub, pipeline_id=pipeline, batch_id=batch)
        decided = [t for t in attempts if t.state in (pb.COMMITTED, pb.APPLIED)]
        if "commit" in outcome:
            assert reopened.already_committed
            assert reopened.transaction.txn_id == first.txn_id
            assert [t.txn_id for t in decided] == [first.txn_id]
        else:
            assert outcome["commit_error"].code() == ABORTED
            assert not reopened.already_committed
            assert decided == [] and get(stub, first.txn_id).state == pb.ABORTED


def test_report_applied_checks_its_tables(shared, stub):
    txn, (table,) = prewritten_txn(stub, shared, unique("report"))
    stranger = tables_in(shared, 1)[0]
    expect_status(stub.ReportApplied, pb.ReportAppliedRequest(
        txn_id=txn.txn_id, tables=[pb.AppliedTable(table=table, delta_version=0)]),
        FP, "committed")
    committed = stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn.txn_id),
                                       timeout=30).transaction
    expect_status(stub.ReportApplied, pb.ReportAppliedRequest(
        txn_id=txn.txn_id, tables=[pb.AppliedTable(table=stranger, delta_version=0)]),
        grpc.StatusCode.INVALID_ARGUMENT, "did not write")
    assert get(stub, txn.txn_id) == committed
    # Another spelling of the same table is the same table.
    (version,) = apply_all(stub, txn.txn_id).values()
    applied = stub.ReportApplied(pb.ReportAppliedRequest(txn_id=txn.txn_id, tables=[
        pb.AppliedTable(table=f"file://{table}/", delta_version=version)]),
        timeout=30).transaction
    assert applied.state == pb.APPLIED
