"""The barrier rules of docs/topology.md: a downstream table's completed barrier, the plan of a
downstream pipeline's next micro-batch (PlanBarrier), the input barrier check T1, topology-
consistent snapshots (T2), a table's changes in a barrier range, and the delays with their
bottleneck. Pure rules first, then the core on an oracle driven by a test clock (every
timestamp is known), then PlanBarrier and GetTableChanges through a daemon."""

from __future__ import annotations

import grpc
import pytest

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.core.snapshots import Consistency
from coordinator.metrics import CoreCollector
from coordinator.oracle import TimestampOracle
from coordinator.store.memory import MemoryStore
from coordinator.store.sqlite import SqliteStore
from percolake.barriers import (
    LOGICAL_BITS,
    downstream_completed_barrier,
    first_barrier_at_or_above,
    is_global_barrier,
    next_barrier,
)
from percolake.errors import FailedPrecondition, InvalidArgument, NotFound
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import apply_all, canonical, expect_status, table_write, unique, wait_for

INTERVAL_MS = 1000


def ts(ms: int, logical: int = 0) -> int:
    return (ms << LOGICAL_BITS) + logical


def g(seconds: int) -> int:
    """Global barrier at ``seconds`` (barriers every second in these tests)."""
    return ts(seconds * 1000)


# ---------------------------------------------------------------- pure rules


def test_the_first_barrier_at_or_above_a_timestamp():
    assert first_barrier_at_or_above(g(12), INTERVAL_MS) == g(12)
    assert first_barrier_at_or_above(g(12) + 1, INTERVAL_MS) == g(13)
    assert first_barrier_at_or_above(ts(12_999, 5), INTERVAL_MS) == g(13)
    assert first_barrier_at_or_above(0, INTERVAL_MS) == 0
    assert is_global_barrier(g(7), INTERVAL_MS) and not is_global_barrier(g(7) + 1, INTERVAL_MS)


def test_a_downstream_table_of_idle_sources_completes_what_they_completed():
    assert downstream_completed_barrier(g(11), [g(20), g(25)], None, None, INTERVAL_MS) == g(20)


def test_a_source_change_not_yet_read_holds_the_downstream_table_below_it():
    change = ts(12_200)
    assert downstream_completed_barrier(g(11), [g(20)], change, None, INTERVAL_MS) == g(12)
    # a change exactly at a barrier: that barrier holds it, so the one before is the last
    assert downstream_completed_barrier(g(11), [g(20)], g(13), None, INTERVAL_MS) == g(12)
    # what it consumed stays completed even when its sources' barrier is older
    assert downstream_completed_barrier(g(15), [g(14)], None, None, INTERVAL_MS) == g(15)


def test_an_unapplied_downstream_commit_holds_the_table_below_its_input_barrier():
    assert downstream_completed_barrier(g(14), [g(20)], None, g(14), INTERVAL_MS) == g(13)


def test_a_downstream_table_with_an_unknown_source_is_known_only_up_to_what_it_read():
    assert downstream_completed_barrier(0, [g(20), None], None, None, INTERVAL_MS) is None
    assert downstream_completed_barrier(g(9), [g(20), None], ts(9_500), None,
                                        INTERVAL_MS) == g(9)


def test_the_first_non_empty_interval_is_its_own_batch_however_far_behind():
    # sources completed 30, changes since 10.2: the batch ends at 11, not 30
    assert next_barrier(0, [g(30), g(40)], ts(10_200), INTERVAL_MS) == (g(11), True)
    assert next_barrier(g(11), [g(30)], g(14), INTERVAL_MS) == (g(14), True)


def test_without_a_completed_change_the_step_is_empty_up_to_the_completed_barrier():
    assert next_barrier(g(11), [g(30), g(25)], None, INTERVAL_MS) == (g(25), False)
    # a change the sources have not completed yet: an empty step stops below it
    assert next_barrier(g(11), [g(20)], ts(20_300), INTERVAL_MS) == (g(20), False)


def test_nothing_to_plan_while_the_sources_completed_nothing_new_or_are_not_known():
    assert next_barrier(g(20), [g(20)], None, INTERVAL_MS) == (g(20), False)
    assert next_barrier(g(20), [g(30), None], ts(21_000), INTERVAL_MS) == (g(20), False)
    assert next_barrier(g(20), [], None, INTERVAL_MS) == (g(20), False)


# ---------------------------------------------------------------- the core, on a test clock


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


class FakeDelta:
    def __call__(self, write, commit_ts, txn_id, *rest):
        return 0


def _append(txn_id: str, table: str) -> TableWriteRecord:
    return TableWriteRecord(table, WriteMode.APPEND, (AddFileRecord(
        f"_percolake/{txn_id}/part-0.parquet", 100, {}, 0, '{"numRecords":1}'),),
        '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}')


class Lake:
    """A core whose oracle reads ``clock`` (ms): bank appends debits, ledger reads them."""

    def __init__(self, tmp_path, store=None) -> None:
        self.tmp_path = tmp_path
        self.store = store or MemoryStore()
        self.clock = Clock(10_000)
        self.core = self._core()
        self.versions: dict[str, int] = {}
        self.batches: dict[str, int] = {}
        self.debits, self.ledger = self.table("debits"), self.table("ledger")

    def _core(self) -> TransactionCoordinator:
        core = TransactionCoordinator(self.store, CoordinatorConfig(
            [str(self.tmp_path)], conflict_wait_s=0.1, barrier_interval_s=INTERVAL_MS / 1000),
            applier=FakeDelta())
        core.oracle = TimestampOracle(self.store, wall_ms=self.clock)
        return core

    def restart(self) -> None:
        self.core.close()
        self.core = self._core()

    def table(self, name: str) -> str:
        return f"file://{self.tmp_path}/{name}"

    def at(self, ms: int) -> None:
        assert ms >= self.clock.ms
        self.clock.ms = ms

    def _next_batch(self, pipeline: str) -> int:
        self.batches[pipeline] = self.batches.get(pipeline, -1) + 1
        return self.batches[pipeline]

    def commit(self, pipeline: str, tables: list[str], apply: bool = True):
        txn, _ = self.core.open_transaction(pipeline, self._next_batch(pipeline), tables=tables)
        committed = self.core.commit(txn.txn_id, None, tables,
                                     [_append(txn.txn_id, t) for t in tables])
        if apply and tables:
            self.apply(txn.txn_id, tables)
        return committed

    def apply(self, txn_id: str, tables: list[str]) -> None:
        versions = {}
        for table in tables:
            versions[table] = self.versions[table] = self.versions.get(table, -1) + 1
        self.core.report_applied(txn_id, None, versions)

    def root_commit(self, at_ms: int, apply: bool = True) -> int:
        self.at(at_ms)
        return self.commit("bank", [self.debits], apply).commit_ts

    def downstream_batch(self, after: int | None, apply: bool = True,
                         pipeline: str = "ledger", table: str = ""):
        """A downstream pipeline's next batch (ledger's by default): planned, opened (recording
        the plan's input barrier) and committed, writing its table only if its sources
        changed."""
        table = table or self.ledger
        plan = self.core.plan_barrier(pipeline, self.generation(pipeline), after)
        assert plan.barrier > plan.after_barrier, plan
        self.last_txn = self.commit(pipeline, [table] if plan.has_changes else [], apply)
        assert self.last_txn.input_barrier == plan.barrier
        return plan

    def generation(self, pipeline: str) -> int:
        try:
            return self.core.get_pipeline(pipeline).generation
        except NotFound:  # it only registered its reads yet
            return 0

    def completed(self, table: str) -> int | None:
        return {t.table: t for t in self.core.get_topology([table]).tables}[table]\
            .completed_barrier


@pytest.fixture
def lake(tmp_path):
    lake = Lake(tmp_path)
    lake.root_commit(10_200)
    lake.core.register_reads("ledger", [lake.debits], None)
    yield lake
    lake.core.close()


def test_a_downstream_tables_completed_barrier_follows_its_input_barriers(lake):
    lake.at(12_300)
    assert lake.completed(lake.debits) == g(12)
    assert lake.completed(lake.ledger) is None  # nobody writes it yet
    plan = lake.core.plan_barrier("ledger", None, None)
    assert (plan.generation, plan.start_barrier, plan.after_barrier) == (0, 0, 0)
    assert (plan.barrier, plan.has_changes) == (g(11), True)
    txn = lake.commit("ledger", [lake.ledger], apply=False)
    assert txn.input_barrier == g(11)
    # committed, not applied: the ledger holds below its input barrier
    assert lake.completed(lake.ledger) == g(10)
    lake.apply(txn.txn_id, [lake.ledger])
    assert lake.completed(lake.ledger) == g(12)  # debits is idle since: nothing to wait for
    lake.at(20_500)
    assert lake.completed(lake.ledger) == g(20)
    lake.root_commit(20_700)
    lake.at(25_100)
    assert lake.completed(lake.debits) == g(25)
    assert lake.completed(lake.ledger) == g(20)  # the change at 20.7 is not read yet


def test_an_empty_step_records_progress_and_changes_no_table(lake):
    lake.at(12_300)
    lake.downstream_batch(None)
    lake.core.register_reads("audit", [lake.ledger], None)
    audit = lake.table("audit")
    assert lake.downstream_batch(None, pipeline="audit", table=audit).barrier == g(11)
    lake.at(30_500)
    assert lake.completed(audit) == g(30)  # the ledger reads debits, idle since 10.2
    plan = lake.downstream_batch(g(11))
    assert (plan.barrier, plan.has_changes) == (g(30), False)
    assert lake.core.get_table_changes(lake.ledger, g(11), g(30)).changes == ()
    view = {t.table: t for t in lake.core.get_topology().tables}
    assert view[lake.ledger].completed_barrier == g(30)
    # the empty step is no change of the ledger: audit completes along, nothing to read
    assert view[audit].completed_barrier == g(30)
    assert {p.pipeline_id: p for p in lake.core.get_topology().pipelines}[
        "ledger"].last_input_barrier == g(30)


def test_a_lagging_pipeline_reads_each_non_empty_interval_as_its_own_batch(lake):
    for ms in (11_500, 13_500, 13_700):
        lake.root_commit(ms)
    lake.at(30_500)
    ends = [lake.downstream_batch(after) for after in (None, g(11), g(12), g(14))]
    assert [(p.after_barrier, p.barrier, p.has_changes) for p in ends] == [
        (0, g(11), True), (g(11), g(12), True), (g(12), g(14), True), (g(14), g(30), False)]
    changes = lake.core.get_table_changes(lake.ledger, 0, g(30))
    assert [c.barrier for c in changes.changes] == [g(11), g(12), g(14)]
    assert lake.core.plan_barrier("ledger", 0, g(30)).barrier == g(30)  # nothing new yet


def test_every_source_and_retry_gets_the_remembered_answer_and_it_survives_a_restart(tmp_path):
    lake = Lake(tmp_path, SqliteStore(tmp_path / "data"))
    try:
        lake.root_commit(10_200)
        lake.core.register_reads("ledger", [lake.debits], None)
        lake.at(14_500)
        first = lake.core.plan_barrier("ledger", 0, 0)
        assert (first.barrier, first.has_changes) == (g(11), True)
        lake.root_commit(14_600)
        lake.at(20_500)
        lake.restart()
        # a second source of the query (or a retry after a crash) asks for the same offset
        again = lake.core.plan_barrier("ledger", 0, 0)
        assert again == first
        durable = {p.pipeline_id: p for p in lake.store.load_pipelines()}["ledger"]
        assert (durable.plan_generation, durable.plan_after, durable.plan_barrier) == (
            0, 0, g(11))
        lake.downstream_batch(0)
        assert lake.core.plan_barrier("ledger", 0, g(11)).barrier == g(15)
    finally:
        lake.core.close()
        lake.store.close()


def test_a_stale_offset_is_moved_to_the_input_start_and_gets_the_remembered_plan(lake):
    lake.at(12_300)
    lake.downstream_batch(None)  # committed input barrier 11
    assert lake.core.plan_barrier("ledger", 0, g(11)).barrier == g(12)  # an empty step
    stale = lake.core.plan_barrier("ledger", 0, 0)  # a range the generation already read
    assert (stale.after_barrier, stale.barrier, stale.has_changes) == (g(11), g(12), False)
    record = lake.core.get_pipeline("ledger")
    assert (record.plan_generation, record.plan_after, record.plan_barrier) == (0, g(11), g(12))
    txn, _ = lake.core.open_transaction("ledger", 1)
    assert txn.input_barrier == g(12)


def test_a_new_generation_starts_at_its_start_barrier(lake):
    lake.at(12_300)
    lake.downstream_batch(None)
    lake.root_commit(12_400)
    lake.at(14_100)
    lake.downstream_batch(g(11))  # up to 13
    lake.core.reset_pipeline("ledger", "new checkpoint", None)
    record = lake.core.get_pipeline("ledger")
    assert (record.generation, record.start_barrier) == (1, g(13))  # where its input stood
    # a source still at generation 0's offset, and one without any, start at the new start
    for generation, after in ((0, g(13)), (None, None)):
        plan = lake.core.plan_barrier("ledger", generation, after)
        assert (plan.generation, plan.start_barrier, plan.after_barrier) == (
            1, record.start_barrier, record.start_barrier)


def test_an_input_barrier_not_above_the_last_committed_one_is_refused(lake):
    lake.at(12_300)
    lake.core.plan_barrier("ledger", None, None)
    first, _ = lake.core.open_transaction("ledger", 0)
    second, _ = lake.core.open_transaction("ledger", 1)
    assert first.input_barrier == second.input_barrier == g(11)
    lake.core.commit(first.txn_id, None)
    with pytest.raises(FailedPrecondition) as refused:
        lake.core.commit(second.txn_id, None)
    assert str(g(11)) in str(refused.value) and "T1" in str(refused.value)


def test_a_topology_snapshot_reads_every_table_at_the_slowest_barrier_never_going_back(lake):
    seen = []

    def read() -> int:
        snapshot = lake.core.get_snapshot([lake.debits, lake.ledger],
                                          consistency=Consistency.TOPOLOGY)
        view = {t.table: t.completed_barrier for t in lake.core.get_topology().tables}
        assert snapshot.snapshot_ts <= min(view[lake.debits], view[lake.ledger])
        assert is_global_barrier(snapshot.snapshot_ts, INTERVAL_MS)
        assert not seen or snapshot.snapshot_ts >= seen[-1]
        seen.append(snapshot.snapshot_ts)
        return snapshot

    lake.at(11_300)
    lake.downstream_batch(None, apply=False)
    lake.at(12_500)
    assert read().snapshot_ts == g(10)  # the ledger's unapplied batch holds it
    lake.apply(lake.last_txn.txn_id, [lake.ledger])
    snapshot = read()
    assert snapshot.snapshot_ts == g(12)
    assert snapshot.versions == {lake.debits: 0, lake.ledger: 0}
    lake.root_commit(12_600)
    lake.at(16_200)
    snapshot = read()  # the ledger has not read the change at 12.6: both at 12
    assert snapshot.snapshot_ts == g(12)
    assert snapshot.versions == {lake.debits: 0, lake.ledger: 0}
    lake.downstream_batch(g(11))
    snapshot = read()
    assert snapshot.snapshot_ts == g(16)
    assert snapshot.versions == {lake.debits: 1, lake.ledger: 1}


def test_a_barrier_not_completed_yet_is_refused_and_a_completed_one_is_read(lake):
    lake.at(12_300)
    lake.downstream_batch(None)
    lake.root_commit(12_400)
    lake.at(16_200)
    tables = [lake.debits, lake.ledger]
    with pytest.raises(FailedPrecondition, match="not completed yet"):
        lake.core.get_snapshot(tables, consistency=Consistency.TOPOLOGY, as_of_barrier=g(13))
    with pytest.raises(InvalidArgument, match="not a global barrier"):
        lake.core.get_snapshot(tables, consistency=Consistency.TOPOLOGY,
                               as_of_barrier=g(11) + 1)
    with pytest.raises(InvalidArgument):
        lake.core.get_snapshot(tables, as_of_barrier=g(11))
    old = lake.core.get_snapshot(tables, consistency=Consistency.TOPOLOGY, as_of_barrier=g(12))
    assert (old.snapshot_ts, old.versions) == (g(12), {lake.debits: 0, lake.ledger: 0})
    first = lake.core.get_snapshot(tables, consistency=Consistency.TOPOLOGY, as_of_barrier=g(10))
    assert first.versions == {lake.debits: None, lake.ledger: None}  # debits began at 10.2
    # read committed: each table's newest applied version, whatever barrier
    latest = lake.core.get_snapshot(tables, consistency=Consistency.READ_COMMITTED)
    assert latest.versions == {lake.debits: 1, lake.ledger: 0}


def test_table_changes_need_a_completed_upper_barrier_and_give_the_start_version(lake):
    commits = [lake.root_commit(11_400), lake.root_commit(12_100)]
    lake.at(13_500)
    changes = lake.core.get_table_changes(lake.debits, g(11), g(13))
    assert [(c.delta_version, c.barrier) for c in changes.changes] == [
        (1, commits[0]), (2, commits[1])]
    assert all(c.commit_ts == c.barrier for c in changes.changes)
    assert changes.version_at_after == 0
    assert lake.core.get_table_changes(lake.debits, 0, g(10)).version_at_after is None
    with pytest.raises(FailedPrecondition, match="not completed yet"):
        lake.core.get_table_changes(lake.debits, g(11), g(14))
    with pytest.raises(InvalidArgument):
        lake.core.get_table_changes(lake.debits, g(13), g(11))


def test_a_paused_downstream_pipeline_is_the_bottleneck_and_only_its_own_delay_grows(lake):
    lake.at(11_500)
    lake.downstream_batch(None)  # reads up to 11
    for second in range(12, 20):
        lake.root_commit(second * 1000 + 200)
    lake.at(20_500)

    def delays():
        view = lake.core.get_topology()
        pipelines = {p.pipeline_id: p for p in view.pipelines}
        tables = {t.table: t for t in view.tables}
        return pipelines, tables

    pipelines, tables = delays()
    assert tables[lake.debits].delay_ms == 500
    assert tables[lake.ledger].delay_ms == 8500  # completed 12: the change at 12.2 is unread
    assert (pipelines["bank"].own_delay_ms, pipelines["bank"].end_to_end_delay_ms) == (500, 500)
    assert (pipelines["ledger"].own_delay_ms,
            pipelines["ledger"].end_to_end_delay_ms) == (8000, 8500)
    assert pipelines["ledger"].last_input_barrier == g(11)
    assert pipelines["bank"].last_input_barrier is None
    assert (tables[lake.ledger].bottleneck_pipeline,
            tables[lake.ledger].bottleneck_delay_ms) == ("ledger", 8000)
    assert (tables[lake.debits].bottleneck_pipeline,
            tables[lake.debits].bottleneck_delay_ms) == ("bank", 500)
    lake.at(30_500)
    pipelines, tables = delays()
    assert pipelines["bank"].own_delay_ms == 500
    assert pipelines["ledger"].own_delay_ms == 18_000
    gauges = {(s.name, tuple(s.labels.values())): s.value
              for family in CoreCollector(lambda: lake.core).collect() for s in family.samples}
    assert gauges[("percolake_table_delay_seconds", (lake.ledger,))] == 18.5
    assert gauges[("percolake_pipeline_own_delay_seconds", ("ledger",))] == 18.0
    assert gauges[("percolake_pipeline_own_delay_seconds", ("bank",))] == 0.5
    assert gauges[("percolake_pipeline_end_to_end_delay_seconds", ("ledger",))] == 18.5


# ---------------------------------------------------------------- through a daemon

INTERVAL_S = 0.2


@pytest.fixture(scope="module")
def barrier_daemon(daemon_factory):
    daemon = daemon_factory.start(["--barrier-interval", str(INTERVAL_S)], name="barriers")
    yield daemon
    daemon.stop()


def test_plan_barrier_and_table_changes_through_the_service(barrier_daemon):
    stub = barrier_daemon.stub
    bank, ledger = unique("bank"), unique("ledger")
    debits = canonical(barrier_daemon.warehouse / unique("debits"))
    out = canonical(barrier_daemon.warehouse / unique("ledger"))
    txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=bank, batch_id=0,
                                                         tables=[debits]), timeout=30).transaction
    stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=txn.txn_id, tables=[debits], writes=[table_write(debits, txn.txn_id)]), timeout=30)
    version = apply_all(stub, txn.txn_id)[debits]
    stub.ReportApplied(pb.ReportAppliedRequest(txn_id=txn.txn_id, tables=[
        pb.AppliedTable(table=debits, delta_version=version)]), timeout=30)
    commit_ts = stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id)).commit_ts
    stub.RegisterReads(pb.RegisterReadsRequest(pipeline_id=ledger, tables=[debits]), timeout=30)
    start = stub.PlanBarrier(pb.PlanBarrierRequest(pipeline_id=ledger), timeout=30)
    assert (start.generation, start.start_barrier, start.after_barrier) == (0, 0, 0)

    def planned(after: int) -> pb.PlanBarrierResponse:
        return stub.PlanBarrier(pb.PlanBarrierRequest(pipeline_id=ledger, generation=0,
                                                      after_barrier=after), timeout=30)

    after, batch = 0, 0
    while True:  # empty steps while debits has not completed the barrier after its commit
        plan = wait_for(lambda: (reply := planned(after)).barrier > after and reply,  # noqa: B023
                        30, "debits to complete a barrier")
        assert planned(after) == plan  # remembered: every source and retry gets the same
        if plan.has_changes:
            break
        assert plan.barrier < commit_ts
        empty = stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=ledger, batch_id=batch), timeout=30)
        assert empty.input_barrier == plan.barrier
        stub.CommitTransaction(pb.CommitTransactionRequest(
            txn_id=empty.transaction.txn_id), timeout=30)
        after, batch = plan.barrier, batch + 1
    assert plan.barrier == first_barrier_at_or_above(commit_ts, int(INTERVAL_S * 1000))
    changes = stub.GetTableChanges(pb.GetTableChangesRequest(
        table=debits, after_barrier=after, upto_barrier=plan.barrier), timeout=30)
    assert changes.canonical_table == debits and not changes.HasField("version_at_after")
    assert [(c.delta_version, c.commit_ts, c.barrier, c.txn_id) for c in changes.changes] == [
        (version, commit_ts, commit_ts, txn.txn_id)]
    expect_status(stub.GetTableChanges, pb.GetTableChangesRequest(
        table=debits, after_barrier=0, upto_barrier=plan.barrier << 4),
        grpc.StatusCode.FAILED_PRECONDITION, "not completed yet")
    opened = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=ledger, batch_id=batch, tables=[out]), timeout=30)
    assert (opened.input_after_barrier, opened.input_barrier) == (after, plan.barrier)
    stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=opened.transaction.txn_id, tables=[out],
        writes=[table_write(out, opened.transaction.txn_id)]), timeout=30)
    versions = apply_all(stub, opened.transaction.txn_id)
    stub.ReportApplied(pb.ReportAppliedRequest(txn_id=opened.transaction.txn_id, tables=[
        pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()]), timeout=30)
    topology = stub.GetTopology(pb.GetTopologyRequest(tables=[out]), timeout=30)
    (reader,) = [p for p in topology.pipelines if p.pipeline_id == ledger]
    assert reader.last_input_barrier_ts == plan.barrier
    assert reader.HasField("own_delay_ms") and reader.HasField("end_to_end_delay_ms")
    snapshot = stub.GetSnapshot(pb.GetSnapshotRequest(
        tables=[debits, out], consistency=pb.CONSISTENCY_TOPOLOGY), timeout=30)
    assert snapshot.consistency == pb.CONSISTENCY_TOPOLOGY
    assert snapshot.barrier_ts == snapshot.snapshot_ts >= plan.barrier
    assert [t.delta_version for t in snapshot.tables] == [version, versions[out]]
    expect_status(stub.GetSnapshot, pb.GetSnapshotRequest(
        tables=[debits, out], consistency=pb.CONSISTENCY_TOPOLOGY,
        as_of_barrier=snapshot.barrier_ts << 2), grpc.StatusCode.FAILED_PRECONDITION,
        "not completed yet")


def _empty_append(table: str) -> TableWriteRecord:
    return TableWriteRecord(table, WriteMode.APPEND, (), _append("t", table).schema_json)


def test_an_empty_step_writing_an_empty_dataframe_changes_no_table(lake):
    lake.at(12_300)
    lake.downstream_batch(None)  # ledger read the change at 10.2: input barrier 11
    lake.at(20_500)
    assert lake.completed(lake.ledger) == g(20)
    plan = lake.core.plan_barrier("ledger", 0, g(11))
    assert (plan.barrier, plan.has_changes) == (g(20), False)
    txn, _ = lake.core.open_transaction("ledger", 1, tables=[lake.ledger])
    # the user's function wrote an empty DataFrame: an APPEND of no file, at barrier 20
    done = lake.core.commit(txn.txn_id, None, [lake.ledger], [_empty_append(lake.ledger)])
    assert (done.state.value, done.input_barrier, list(done.tables)) == ("APPLIED", g(20), [])
    assert lake.store.table_commit_at(lake.ledger, done.commit_ts).txn_id != txn.txn_id
    assert lake.completed(lake.ledger) == g(20)  # never below its previous answer (T2)
    assert lake.core.get_table_changes(lake.ledger, g(11), g(20)).changes == ()
    again = lake.core.commit(txn.txn_id, None, [lake.ledger], [_empty_append(lake.ledger)])
    assert again.commit_ts == done.commit_ts  # a retried commit answers the same
    # a root pipeline's empty append is committed as ever
    root, _ = lake.core.open_transaction("bank", lake._next_batch("bank"), tables=[lake.debits])
    kept = lake.core.commit(root.txn_id, None, [lake.debits], [_empty_append(lake.debits)])
    assert list(kept.tables) == [lake.debits]


def test_an_empty_append_prewritten_first_is_left_out_too(lake):
    lake.at(12_300)
    lake.downstream_batch(None)
    lake.at(20_500)
    lake.core.plan_barrier("ledger", 0, g(11))
    txn, _ = lake.core.open_transaction("ledger", 1)
    lake.core.prewrite(txn.txn_id, None, [_empty_append(lake.ledger)])
    done = lake.core.commit(txn.txn_id, None, [lake.ledger])
    assert list(done.tables) == [] and done.input_barrier == g(20)
    assert lake.completed(lake.ledger) == g(20)


def test_a_stale_plan_request_racing_a_commit_never_replaces_the_next_batchs_plan(lake):
    lake.at(12_300)
    assert lake.core.plan_barrier("ledger", None, None).barrier == g(11)
    real_completion = lake.core.completion
    interleaved = []

    def completion_then_commit():
        view = real_completion()
        view.start_barrier("ledger")  # what the racing request reads before the lock: 0
        if not interleaved:  # meanwhile batch 0 commits (11) and batch 1 is planned (12)
            interleaved.append(True)
            txn, _ = lake.core.open_transaction("ledger", lake._next_batch("ledger"))
            assert lake.core.commit(txn.txn_id, None).input_barrier == g(11)
            assert lake.core.plan_barrier("ledger", 0, g(11)).barrier == g(12)
        return view

    lake.core.completion = completion_then_commit
    stale = lake.core.plan_barrier("ledger", 0, 0)  # a retry of batch 0's plan
    # batch 0 committed while it was computed: planned again from the new input start
    assert (stale.after_barrier, stale.barrier) == (g(11), g(12))
    record = lake.core.get_pipeline("ledger")
    assert (record.plan_generation, record.plan_after, record.plan_barrier) == (0, g(11), g(12))
    txn, _ = lake.core.open_transaction("ledger", lake._next_batch("ledger"))
    assert txn.input_barrier == g(12)


def test_completion_reads_the_cores_last_input_barrier_not_the_store(lake):
    lake.at(12_300)
    lake.downstream_batch(None)
    lake.at(14_500)
    lake.completion_queries = 0
    real = lake.store.last_input_barrier

    def counted(pipeline_id, generation):
        lake.completion_queries += 1
        return real(pipeline_id, generation)

    lake.store.last_input_barrier = counted
    for _ in range(3):  # a scrape, a topology read, a plan: no per-answer store query
        assert lake.completed(lake.ledger) == g(14)
        assert lake.core.plan_barrier("ledger", 0, g(11)).barrier == g(14)
        assert lake.core.completion().last_input("ledger") == g(11)
    assert lake.completion_queries == 0
    lake.downstream_batch(g(11))  # the commit keeps the cache: still no query
    assert lake.core.completion().last_input("ledger") == g(14)
    assert lake.completion_queries == 0


# ---------------------------------------------------------------- planning rounds


def _two_sources_one_empty_step(lake: Lake) -> str:
    """ledger reads debits (bank, 10.2) and credits (card, 10.3) and has read up to 10 in an
    empty step: its next batch holds both changes once the sources complete 11."""
    credits = lake.table("credits")
    lake.at(10_300)
    lake.commit("card", [credits])
    lake.core.register_reads("ledger", [credits], None)
    lake.at(10_500)
    assert (lake.downstream_batch(None).barrier, lake.last_txn.input_barrier) == (g(10), g(10))
    return credits


def test_the_sources_of_one_round_get_the_same_answer_across_a_completion_change(lake):
    _two_sources_one_empty_step(lake)
    lake.at(10_900)
    debits = lake.core.plan_barrier("ledger", 0, g(10), 1)
    assert debits.barrier == g(10)  # nothing to read yet: the debits source keeps its offset
    lake.at(11_100)  # the sources complete 11: the change at 10.2 is readable now
    assert lake.completed(lake.debits) == g(11)
    credits = lake.core.plan_barrier("ledger", 0, g(10), 1)
    assert credits == debits  # same round: not 11, which the debits source never saw
    # the next round plans the batch, for every source alike
    following = [lake.core.plan_barrier("ledger", 0, g(10), 2) for _ in range(2)]
    assert [(p.barrier, p.has_changes) for p in following] == [(g(11), True)] * 2
    txn, _ = lake.core.open_transaction("ledger", lake._next_batch("ledger"))
    assert txn.input_barrier == g(11)


def test_a_round_answer_survives_a_coordinator_restart_between_two_sources(tmp_path):
    lake = Lake(tmp_path, SqliteStore(tmp_path / "data"))
    try:
        lake.root_commit(10_200)
        lake.core.register_reads("ledger", [lake.debits], None)
        _two_sources_one_empty_step(lake)
        lake.at(10_900)
        assert lake.core.plan_barrier("ledger", 0, g(10), 7).barrier == g(10)
        lake.restart()
        lake.at(11_100)  # (the restarted oracle starts above its last reserved range)
        assert lake.completed(lake.debits) >= g(11)
        assert lake.core.plan_barrier("ledger", 0, g(10), 7).barrier == g(10)
        assert lake.core.plan_barrier("ledger", 0, g(10), 8).barrier == g(11)
        assert lake.core.plan_barrier("ledger", 0, g(10), 8).barrier == g(11)
    finally:
        lake.core.close()
        lake.store.close()


def test_an_old_generations_offset_starts_where_the_new_generations_input_stands(lake):
    lake.at(12_300)
    lake.downstream_batch(None)  # up to 11
    lake.core.reset_pipeline("ledger", "new checkpoint", None)
    assert lake.core.get_pipeline("ledger").start_barrier == g(11)
    lake.root_commit(12_400)
    lake.at(13_500)
    epoch = lake.core.get_pipeline("ledger").epoch
    assert lake.core.plan_barrier("ledger", 1, g(11)).barrier == g(13)
    txn, _ = lake.core.open_transaction("ledger", 0, epoch, tables=[lake.ledger])
    lake.core.commit(txn.txn_id, epoch, [lake.ledger], [_append(txn.txn_id, lake.ledger)])
    assert lake.core.get_transaction(txn.txn_id).input_barrier == g(13)  # generation 1 read
    for generation, after in ((0, g(11)), (0, g(20)), (1, g(11)), (1, 0), (None, None)):
        plan = lake.core.plan_barrier("ledger", generation, after, 3)
        assert (plan.generation, plan.start_barrier, plan.after_barrier) == (1, g(11), g(13))


def test_a_reset_keeps_the_plan_of_the_batch_the_new_generation_starts_with(lake):
    lake.at(12_300)
    lake.downstream_batch(None)  # up to 11
    lake.root_commit(12_400)
    lake.at(13_500)
    planned = lake.core.plan_barrier("ledger", 0, g(11), 4)
    assert (planned.barrier, planned.has_changes) == (g(13), True)
    # the query restarts on a new checkpoint before it ran the batch: an automatic reset
    lake.core.reset_pipeline("ledger", "checkpoint changed", None)
    record = lake.core.get_pipeline("ledger")
    assert (record.generation, record.start_barrier) == (1, g(11))
    assert (record.plan_generation, record.plan_after, record.plan_barrier) == (1, g(11), g(13))
    again = lake.core.plan_barrier("ledger", 0, g(11), 1)
    assert (again.generation, again.after_barrier, again.barrier) == (1, g(11), g(13))
    txn, _ = lake.core.open_transaction("ledger", 0, record.epoch)
    assert txn.input_barrier == g(13)
