"""Applied reports carried by OpenTransaction (issue 18, point 2) and the coordinator's parallel
roll-forward of one transaction's tables (point 3).

The core runs with the in-memory store and a fake Delta applier whose versions are the only ones
the applied check accepts, so a carried report is verified exactly as ReportApplied's; the last
tests drive the same rules through a real daemon.
"""

from __future__ import annotations

import threading

import grpc
import pytest

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.store import MemoryStore
from percolake.errors import FailedPrecondition, Fenced, InvalidArgument, ResourceExhausted
from percolake.records import TxnRecord
from percolake.states import TxnState
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import apply_all, canonical, expect_status, table_write, unique
from tests.test_core import FakeDelta, table, write

INVALID = grpc.StatusCode.INVALID_ARGUMENT
FP = grpc.StatusCode.FAILED_PRECONDITION


class CountingDelta(FakeDelta):
    """FakeDelta that counts its calls (each call is an apply: participant's or roll-forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __call__(self, write, **kwargs):  # noqa: ANN001, ANN003, ANN204
        self.calls += 1
        return super().__call__(write, **kwargs)


@pytest.fixture
def env(tmp_path):  # noqa: ANN001, ANN201
    delta = CountingDelta()

    def applied_check(tbl: str, version: int, txn_id: str, app_id: str, batch: int) -> bool:
        return delta.applied.get((tbl, txn_id)) == version

    core = TransactionCoordinator(
        MemoryStore(), CoordinatorConfig([str(tmp_path)], txn_timeout_s=60, conflict_wait_s=0.2),
        applier=delta, remove_files=lambda _: None, applied_check=applied_check)
    return core, delta, tmp_path


def committed(core: TransactionCoordinator, tmp, pipeline: str, batch: int,  # noqa: ANN001
              names: list[str], epoch: int | None = None) -> TxnRecord:
    txn, _ = core.open_transaction(pipeline, batch, epoch)
    paths = [table(tmp, n) for n in names]
    return core.commit(txn.txn_id, epoch, paths, [write(txn.txn_id, p) for p in paths])


def applied_by_participant(delta: FakeDelta, txn: TxnRecord) -> list[tuple[str, int]]:
    """The participant's own secondaries: each table's Delta commit, its (table, version)."""
    return [(t, delta(e.write, app_id="a", app_version=txn.batch_id, txn_id=txn.txn_id,
                      commit_ts=txn.commit_ts)) for t, e in txn.tables.items()]


def test_open_carrying_a_report_records_the_tables_applied_before_opening(env):
    core, delta, tmp = env
    first = committed(core, tmp, "p", 0, ["a", "b"])
    report = applied_by_participant(delta, first)
    calls = delta.calls
    opened, done = core.open_transaction("p", 1, tables=[table(tmp, "a"), table(tmp, "b")],
                                         applied_reports=[(first.txn_id, report)])
    assert not done
    after = core.get_transaction(first.txn_id)
    assert after.state == TxnState.APPLIED
    assert {t: e.delta_version for t, e in after.tables.items()} == dict(report)
    # The tables were free for the new attempt: declared in its Open, no roll-forward needed.
    assert set(opened.tables) == {table(tmp, "a"), table(tmp, "b")}
    assert delta.calls == calls


def test_carried_report_of_another_pipelines_transaction_is_refused(env):
    core, delta, tmp = env
    foreign = committed(core, tmp, "q", 0, ["a"])
    report = applied_by_participant(delta, foreign)
    with pytest.raises(InvalidArgument, match="belongs to pipeline 'q'"):
        core.open_transaction("p", 0, applied_reports=[(foreign.txn_id, report)])
    assert core.get_transaction(foreign.txn_id).state == TxnState.COMMITTED
    assert core.store.attempts_of("p", 0, 0) == []


def test_stale_epoch_open_with_a_report_changes_nothing(env):
    core, delta, tmp = env
    old_epoch = core.register_pipeline("p", None).epoch
    first = committed(core, tmp, "p", 0, ["a"], epoch=old_epoch)
    report = applied_by_participant(delta, first)
    core.register_pipeline("p", None)  # a new driver takes over
    with pytest.raises(Fenced):
        core.open_transaction("p", 1, old_epoch, applied_reports=[(first.txn_id, report)])
    kept = core.get_transaction(first.txn_id)
    assert kept.state == TxnState.COMMITTED and not any(e.applied for e in kept.tables.values())
    assert core.store.attempts_of("p", 0, 1) == []


def test_report_sent_by_both_paths_is_recorded_once_and_harmless(env):
    core, delta, tmp = env
    first = committed(core, tmp, "p", 0, ["a", "b"])
    report = applied_by_participant(delta, first)
    core.report_applied(first.txn_id, None, dict(report))  # the background send got through
    before = core.get_transaction(first.txn_id)
    opened, _ = core.open_transaction("p", 1, applied_reports=[(first.txn_id, report)])
    assert core.get_transaction(first.txn_id) == before
    assert opened.state == TxnState.OPEN
    core.open_transaction("p", 1, applied_reports=[(first.txn_id, report)])  # and again


def test_carried_report_is_verified_like_report_applied_and_refusal_records_nothing(env):
    core, delta, tmp = env
    first = committed(core, tmp, "p", 0, ["a", "b"])
    report = applied_by_participant(delta, first)
    wrong = [(report[0][0], report[0][1]), (report[1][0], report[1][1] + 5)]
    with pytest.raises(FailedPrecondition, match="is not transaction"):
        core.open_transaction("p", 1, applied_reports=[(first.txn_id, wrong)])
    kept = core.get_transaction(first.txn_id)
    assert kept.state == TxnState.COMMITTED and not any(e.applied for e in kept.tables.values())
    assert core.store.attempts_of("p", 0, 1) == []
    with pytest.raises(InvalidArgument, match="reported twice"):
        core.open_transaction("p", 1, applied_reports=[(first.txn_id, report)] * 2)


def test_open_refuses_more_carried_reports_than_the_bound(env):
    core, _, _ = env
    too_many = [(f"{n:032x}", [("file:///x", 0)]) for n in range(65)]
    with pytest.raises(ResourceExhausted, match="applied_reports"):
        core.open_transaction("p", 0, applied_reports=too_many)


def test_resolver_rolls_the_tables_of_one_transaction_forward_concurrently(env):
    """Each table's apply waits at a barrier for the other two: done one after another, the
    barrier would break and the roll-forward fail. Each table still gets exactly one commit."""
    core, delta, tmp = env
    core.config.roll_forward_after_s = 0
    txn = committed(core, tmp, "p", 0, ["a", "b", "c"])
    barrier = threading.Barrier(3, timeout=20)

    def concurrent_apply(write, **kwargs):  # noqa: ANN001, ANN003, ANN202
        barrier.wait()
        return delta(write, **kwargs)

    core._applier = concurrent_apply
    core.resolve_once()
    done = core.get_transaction(txn.txn_id)
    assert done.state == TxnState.APPLIED
    assert sorted(t for t, _ in delta.order) == sorted(done.tables)


def test_a_failing_table_does_not_stop_the_others_rolling_forward(env):
    core, delta, tmp = env
    core.config.roll_forward_after_s = 0
    txn = committed(core, tmp, "p", 0, ["a", "b", "c"])
    broken = table(tmp, "b")

    def apply_but_b(write, **kwargs):  # noqa: ANN001, ANN003, ANN202
        if write.table == broken:
            raise OSError("disk trouble")
        return delta(write, **kwargs)

    core._applier = apply_but_b
    core.resolve_once()
    partly = core.get_transaction(txn.txn_id)
    assert partly.state == TxnState.COMMITTED
    assert {t for t, e in partly.tables.items() if e.applied} == {table(tmp, "a"),
                                                                     table(tmp, "c")}
    core._applier = delta
    core.resolve_once()  # the next pass finishes it
    assert core.get_transaction(txn.txn_id).state == TxnState.APPLIED


# ---------------------------------------------------------------- through a real daemon


@pytest.fixture(scope="module")
def shared(daemon_factory):  # noqa: ANN001, ANN201
    daemon = daemon_factory.start(["--roll-forward-after", "3600"], name="carried")
    yield daemon
    daemon.stop()


def _committed_via_rpc(stub, daemon, pipeline: str, batch: int, epoch: int | None = None):  # noqa: ANN001, ANN202
    tables = [str(daemon.warehouse / unique("t")) for _ in range(2)]
    request = pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=batch)
    if epoch is not None:
        request.epoch = epoch
    txn = stub.OpenTransaction(request, timeout=30).transaction
    commit = pb.CommitTransactionRequest(
        txn_id=txn.txn_id, tables=tables, writes=[table_write(t, txn.txn_id) for t in tables])
    if epoch is not None:
        commit.epoch = epoch
    stub.CommitTransaction(commit, timeout=30)
    versions = apply_all(stub, txn.txn_id)
    return txn.txn_id, tables, pb.AppliedReport(txn_id=txn.txn_id, tables=[
        pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()])


def _state(stub, txn_id: str) -> int:  # noqa: ANN001
    return stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn_id), timeout=30).state


def test_daemon_open_records_a_carried_report_then_opens_declaring_its_tables(shared):
    stub, pipeline = shared.stub, unique("carry")
    txn_id, tables, report = _committed_via_rpc(stub, shared, pipeline, 0)
    assert _state(stub, txn_id) == pb.COMMITTED
    opened = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=1, tables=tables, applied_reports=[report]), timeout=30)
    assert _state(stub, txn_id) == pb.APPLIED
    assert {loc.table for loc in opened.locations} == {canonical(t) for t in tables}


def test_daemon_refuses_a_carried_report_of_another_pipeline_and_a_stale_epoch(shared):
    stub = shared.stub
    other = unique("other")
    txn_id, _, report = _committed_via_rpc(stub, shared, other, 0)
    mine = unique("mine")
    expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=mine, batch_id=0, applied_reports=[report]), INVALID, "belongs to pipeline")
    assert _state(stub, txn_id) == pb.COMMITTED

    epoch = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=mine), timeout=30).epoch
    own_id, _, own = _committed_via_rpc(stub, shared, mine, 0, epoch)
    stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=mine), timeout=30)
    expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=mine, batch_id=1, epoch=epoch, applied_reports=[own]), FP, "fenced")
    assert _state(stub, own_id) == pb.COMMITTED
    expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=mine, batch_id=1, epoch=epoch,
        applied_reports=[own] * 65), grpc.StatusCode.RESOURCE_EXHAUSTED, "applied_reports")


def test_open_rolls_a_dead_drivers_committed_tables_forward_concurrently(env):
    """The next Open finds its three tables held by a COMMITTED transaction nobody reported
    (the driver died before its report): they are rolled forward side by side (the barrier
    breaks if they go one after another), then declared by the new attempt."""
    core, delta, tmp = env
    names = ["a", "b", "c"]
    first = committed(core, tmp, "p", 0, names)
    barrier = threading.Barrier(3, timeout=20)

    def concurrent_apply(write, **kwargs):  # noqa: ANN001, ANN003, ANN202
        barrier.wait()
        return delta(write, **kwargs)

    core._applier = concurrent_apply
    opened, _ = core.open_transaction("p", 1, tables=[table(tmp, n) for n in names])
    assert core.get_transaction(first.txn_id).state == TxnState.APPLIED
    assert set(opened.tables) == {table(tmp, n) for n in names}
