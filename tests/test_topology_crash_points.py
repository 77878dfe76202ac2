"""Crash points of the topology's durable steps (docs/topology.md), in the style of
tests/test_crash_points.py: the coordinator runs as its own process with one failpoint
(PERCOLAKE_FAILPOINTS) that exits it right after the step's durable write and before its reply;
it is restarted on the same data dir and port; the test reads what survived in the store (the
daemon down) and checks that the step's retry converges. Protocol-level pipelines, no Spark.
"""

from __future__ import annotations

import grpc
import pytest

from percolake.barriers import barrier_at_or_below
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import wait_for
from tests.topology_support import (
    LightPipeline,
    TopologyLake,
    changed_rows,
    crashed_call,
    finish,
    ledger_rows,
    table_totals,
    transfers,
    version_rows,
    versions_of,
    wait_completed,
    write_intent,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
INTERVAL_S = 0.2
INTERVAL_MS = 200


@pytest.fixture
def lake(tmp_path):
    lake = TopologyLake(tmp_path, interval_s=INTERVAL_S)
    yield lake
    lake.close()


def bank_commits(lake: TopologyLake, client, batches: range) -> list[pb.Transaction]:  # noqa: ANN001
    """The root pipeline ``bank`` appends each batch to debits, applied."""
    bank = LightPipeline(client, "bank").register()
    return [bank.batch(b, {lake.table("debits"): transfers(b)}) for b in batches]


def ledger_batch(client, ledger: LightPipeline, lake: TopologyLake, batch_id: int,  # noqa: ANN001
                 after: int) -> tuple[pb.PlanBarrierResponse, pb.Transaction | None]:
    """One downstream batch of ``ledger`` over debits: PlanBarrier, Open (carrying the planned
    input barrier), the changes in (after, barrier] as ledger rows, Commit, apply."""
    plan = client.call("PlanBarrier", pb.PlanBarrierRequest(
        pipeline_id="ledger", generation=ledger.generation, after_barrier=after))
    if plan.barrier == plan.after_barrier:
        return plan, None
    opened = ledger.open(batch_id, [lake.table("ledger")])
    assert opened.input_barrier == plan.barrier, (opened, plan)
    debits = changed_rows(client, lake.table("debits"), plan.after_barrier, plan.barrier)
    rows = ledger_rows(debits, debits.schema.empty_table(), plan.barrier)
    ledger.commit(opened, {lake.table("ledger"): rows})
    return plan, finish(client, opened.transaction.txn_id, ledger.epoch)


def test_after_read_edges_durable_the_edge_survives_and_the_retry_adds_nothing(lake):
    """RegisterReads: the coordinator dies after the read edge is durable, before the reply.
    After the restart the edge is in the store and the topology; the retried registration
    finds it (added 0) instead of failing or adding it twice."""
    lake.start("after-read-edges-durable=exit")
    debits = lake.table("debits")
    with lake.client() as client:
        bank_commits(lake, client, range(1))
        crashed_call(client, "RegisterReads", pb.RegisterReadsRequest(
            pipeline_id="ledger", tables=[debits]))
    lake.wait_crashed_at("after-read-edges-durable")
    with lake.store() as store:
        edges = {(e.pipeline_id, e.table) for e in store.load_read_edges()}
    assert ("ledger", debits) in edges, edges
    lake.restart()
    with lake.client() as client:
        retried = client.call("RegisterReads", pb.RegisterReadsRequest(
            pipeline_id="ledger", tables=[debits]))
        assert retried.added == 0 and list(retried.tables) == [debits], retried
        topology = client.call("GetTopology", pb.GetTopologyRequest())
    reads = {(e.pipeline_id, e.table) for e in topology.edges if e.kind == pb.EDGE_READS}
    assert reads == {("ledger", debits)}, topology
    ledger = next(p for p in topology.pipelines if p.pipeline_id == "ledger")
    assert not ledger.root and list(ledger.reads) == [debits], ledger


def test_after_plan_barrier_durable_the_restarted_coordinator_answers_the_same_barrier(lake):
    """PlanBarrier: the coordinator dies after remembering its answer, before the reply. The
    plan is in the store; after the restart the same request gets the same barrier although
    later barriers have completed meanwhile (a fresh computation would answer a later one), so
    every source of the query and every retry end the batch on one barrier; the batch then
    opens and commits with that input barrier."""
    lake.start("after-plan-barrier-durable=exit")
    debits = lake.table("debits")
    with lake.client() as client:
        bank = LightPipeline(client, "bank").register()
        opened = bank.open(0, [debits])  # bank owns debits, no change yet: an idle root table
        client.call("AbortTransaction", pb.AbortTransactionRequest(
            txn_id=opened.transaction.txn_id, epoch=bank.epoch))
        ledger = LightPipeline(client, "ledger").register()
        ledger.register_reads([debits])
        wait_completed(client, debits, 1)
        crashed_call(client, "PlanBarrier", pb.PlanBarrierRequest(
            pipeline_id="ledger", generation=0, after_barrier=0))
    lake.wait_crashed_at("after-plan-barrier-durable")
    with lake.store() as store:
        record = next(p for p in store.load_pipelines() if p.pipeline_id == "ledger")
    assert (record.plan_generation, record.plan_after) == (0, 0), record
    planned = record.plan_barrier
    assert planned > 0 and planned == barrier_at_or_below(planned, INTERVAL_MS), record
    lake.restart()
    with lake.client() as client:
        wait_completed(client, debits, planned + 3 * (INTERVAL_MS << 18))
        again = client.call("PlanBarrier", pb.PlanBarrierRequest(
            pipeline_id="ledger", generation=0, after_barrier=0))
        assert (again.generation, again.after_barrier, again.barrier, again.has_changes) \
            == (0, 0, planned, False), again
        ledger.client = client  # the restarted coordinator's connection
        ledger.register()
        opened = ledger.open(0, [lake.table("ledger")])
        assert (opened.input_barrier, opened.input_after_barrier) == (planned, 0), opened
        ledger.commit(opened, {lake.table("ledger"): ledger_rows(
            transfers(0, 0), transfers(0, 0), planned)})
        txn = finish(client, opened.transaction.txn_id, ledger.epoch)
        assert txn.state == pb.APPLIED and txn.input_barrier == planned, txn
        following = client.call("PlanBarrier", pb.PlanBarrierRequest(
            pipeline_id="ledger", generation=0, after_barrier=planned))
        assert following.after_barrier == planned and following.barrier > planned, following


def test_after_input_barrier_commit_the_commit_survives_and_the_replay_is_already_committed(
        lake):
    """Commit of a downstream batch: the coordinator dies right after the durable commit of a
    transaction carrying its input barrier. The record survives with that barrier (and the
    table commit with it); the replay of the batch is answered already committed, finishing
    the secondaries applies it, and the next plan starts after that barrier (T1)."""
    lake.start("after-input-barrier-commit=exit")
    debits, ledger_table = lake.table("debits"), lake.table("ledger")
    with lake.client() as client:
        [first] = bank_commits(lake, client, range(1))
        ledger = LightPipeline(client, "ledger").register()
        ledger.register_reads([debits])
        wait_completed(client, debits, first.commit_ts)
        plan = client.call("PlanBarrier", pb.PlanBarrierRequest(
            pipeline_id="ledger", generation=0, after_barrier=0))
        assert plan.has_changes and plan.barrier >= first.commit_ts, plan
        opened = ledger.open(0, [ledger_table])
        assert opened.input_barrier == plan.barrier, opened
        rows = ledger_rows(changed_rows(client, debits, 0, plan.barrier), transfers(0, 0),
                           plan.barrier)
        assert rows.num_rows == 3, rows
        request = pb.CommitTransactionRequest(
            txn_id=opened.transaction.txn_id, epoch=ledger.epoch, tables=[ledger_table])
        request.writes.append(write_intent(opened, ledger_table, rows))
        crashed_call(client, "CommitTransaction", request)
    lake.wait_crashed_at("after-input-barrier-commit")
    txn_id = opened.transaction.txn_id
    with lake.store() as store:
        record = store.get_txn(txn_id)
        commits = store.table_commits_in_range(ledger_table, 0, plan.barrier, True)
    assert record is not None and record.state.name in ("COMMITTED", "APPLIED"), record
    assert record.input_barrier == plan.barrier, record
    assert [(c.commit_ts, c.input_barrier) for c in commits] \
        == [(record.commit_ts, plan.barrier)], commits
    lake.restart()
    with lake.client() as client:
        ledger.client = client  # the restarted coordinator's connection
        ledger.register()
        replay = ledger.open(0, [ledger_table])
        assert replay.already_committed and replay.transaction.txn_id == txn_id, replay
        txn = finish(client, txn_id, ledger.epoch)
        assert txn.state == pb.APPLIED and txn.input_barrier == plan.barrier, txn
        assert version_rows(ledger_table, 0).num_rows == 3
        following = client.call("PlanBarrier", pb.PlanBarrierRequest(
            pipeline_id="ledger", generation=0, after_barrier=plan.barrier))
        assert following.after_barrier == plan.barrier and not following.has_changes, \
            following


def test_after_lease_durable_the_lease_exists_after_the_restart(lake):
    """GetSnapshot with lease_ms: the coordinator dies after the lease is durable, before the
    reply. The lease is in the store and ListLeases after the restart (it keeps its versions
    until it expires or is released); the retried snapshot gets its own lease."""
    lake.start("after-lease-durable=exit")
    debits = lake.table("debits")
    with lake.client() as client:
        bank_commits(lake, client, range(2))
        crashed_call(client, "GetSnapshot", pb.GetSnapshotRequest(
            tables=[debits], lease_ms=600_000, lease_holder="crash-test"))
    lake.wait_crashed_at("after-lease-durable")
    with lake.store() as store:
        leases = store.load_leases()
    assert [(lease.holder, lease.tables) for lease in leases] == [("crash-test", ((debits, 1),))], \
        leases
    lost = leases[0].lease_id
    lake.restart()
    with lake.client() as client:
        listed = client.call("ListLeases", pb.ListLeasesRequest(tables=[debits])).leases
        assert [(lease.lease_id, lease.holder) for lease in listed] == [(lost, "crash-test")], \
            listed
        assert [(t.canonical_table or t.table, t.delta_version) for t in listed[0].tables] \
            == [(debits, 1)], listed
        retried = client.call("GetSnapshot", pb.GetSnapshotRequest(
            tables=[debits], lease_ms=600_000, lease_holder="crash-test"))
        assert retried.lease.lease_id and retried.lease.lease_id != lost, retried
        for lease_id in (lost, retried.lease.lease_id):
            assert client.call("ReleaseLease", pb.ReleaseLeaseRequest(
                lease_id=lease_id)).released
        assert not client.call("ListLeases", pb.ListLeasesRequest()).leases


@pytest.mark.parametrize("failpoint", ["after-revise-commit", "after-revise-reset"])
def test_a_rerun_of_a_revise_killed_midway_finishes(lake, failpoint):
    """Revise: the coordinator dies after the restore commit is durable (before it is applied),
    or after the downstream pipelines' reset. After the restart a rerun of the same revise
    finishes: debits and the ledger show their state at the barrier, the ledger pipeline runs
    a new generation starting at the revision, and its next batch reads from there."""
    lake.start(f"{failpoint}=exit")
    debits, ledger_table = lake.table("debits"), lake.table("ledger")
    with lake.client() as client:
        [first] = bank_commits(lake, client, range(1))
        ledger = LightPipeline(client, "ledger").register()
        ledger.register_reads([debits])
        barrier = wait_completed(client, debits, first.commit_ts)
        plan, _ = ledger_batch(client, ledger, lake, 0, 0)
        assert plan.barrier <= barrier, (plan, barrier)  # batch 0 covers exactly bank's batch 0
        bank = LightPipeline(client, "bank").register()
        second = bank.batch(1, {debits: transfers(1)})
        wait_completed(client, debits, second.commit_ts)
        plan, _ = ledger_batch(client, ledger, lake, 1, plan.barrier)
        assert plan.has_changes and plan.barrier >= second.commit_ts, plan
        wait_completed(client, ledger_table, plan.barrier)
        crashed_call(client, "Revise", pb.ReviseRequest(table=debits, to_barrier=barrier,
                                                        reason=f"crash test {failpoint}"))
    lake.wait_crashed_at(failpoint)
    lake.restart()
    with lake.client() as client:
        revised = client.call("Revise", pb.ReviseRequest(table=debits, to_barrier=barrier,
                                                         reason="rerun"))
        restored = {t.table: t for t in revised.tables}
        assert set(restored) == {debits, ledger_table}, revised
        new_generations = {p.pipeline_id: p.generation for p in revised.pipelines}
        assert "ledger" in new_generations and min(new_generations.values()) > 0, revised
        snap = client.call("GetSnapshot", pb.GetSnapshotRequest(
            tables=[debits, ledger_table], consistency=pb.CONSISTENCY_READ_COMMITTED))
        versions = versions_of(snap)
        assert table_totals(debits, versions[debits]) == table_totals(
            debits, restored[debits].restored_version), (snap, revised)
        assert table_totals(debits, versions[debits]).rows == 3, snap
        assert table_totals(ledger_table, versions[ledger_table]).rows == 3, snap
        pipeline = client.call("GetPipeline", pb.GetPipelineRequest(pipeline_id="ledger"))
        new = next(p for p in revised.pipelines if p.pipeline_id == "ledger")
        assert pipeline.generation == new.generation, (pipeline, revised)
        assert new.start_barrier == revised.revision_ts, revised
        start = client.call("PlanBarrier", pb.PlanBarrierRequest(pipeline_id="ledger"))
        assert (start.generation, start.start_barrier) == (new.generation, new.start_barrier), \
            start


def test_a_downstream_pipeline_joining_after_the_first_retention_pass_reads_from_the_start(lake):
    """Found by this suite: the coordinator's first retention pass (right after a start)
    raises the floor to now - retention; a downstream pipeline registering after it starts at
    barrier 0, far below the floor. Its first range must still be answered (no index row of
    the table was ever below the floor, so nothing was pruned), not refused as pruned."""
    lake.start()
    debits = lake.table("debits")
    with lake.client() as client:
        [first] = bank_commits(lake, client, range(1))

        def floor_raised() -> bool:
            try:
                client.call("GetSnapshot", pb.GetSnapshotRequest(tables=[debits], as_of_ts=1))
            except grpc.RpcError as exc:
                return "retention floor" in (exc.details() or "")
            return False

        wait_for(floor_raised, 30, "the first retention pass")
        ledger = LightPipeline(client, "ledger").register()
        ledger.register_reads([debits])
        wait_completed(client, debits, first.commit_ts)
        plan, txn = ledger_batch(client, ledger, lake, 0, 0)
        assert plan.after_barrier == 0 and plan.has_changes, plan
        assert txn is not None and txn.input_barrier == plan.barrier, txn
        assert version_rows(lake.table("ledger"), 0).num_rows == 3
