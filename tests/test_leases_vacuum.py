"""Leases and vacuum (docs/topology.md safe expiry, invariant T3): no file that a live lease, a
downstream pipeline's range still to read or the time-travel floor needs is vacuumed; the
refusal names the blocker; retention pruning never moves the floor past a live lease or a
downstream reader's last input barrier. Real Delta tables, written through the coordinator's
own apply path (roll-forward); the CLI against a real daemon."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.core.state import wall_ms
from coordinator.oracle import wall_ms_of
from coordinator.store import SqliteStore
from percolake.errors import FailedPrecondition
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import apply_table_write
from percolake.lake.table_features import FEATURES
from percolake.lake.vacuum import TableVacuum
from percolake.lake.warehouse import UnsafeLocation, local_path
from percolake.records import AddFileRecord, TableWriteRecord, TxnRecord, WriteMode
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import apply_all, canonical, table_write, unique, wait_for
from tests.lake_support import make_core
from tests.test_table_features import upgrade

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'
HOUR_MS = 3600 * 1000




def write_batch(core: TransactionCoordinator, pipeline: str, batch: int, table: Path,
                ids: list[int], mode: WriteMode = WriteMode.APPEND) -> tuple[TxnRecord, str]:
    """Commits one batch writing a real Parquet file to ``table`` and rolls it forward (the
    coordinator applies it to the Delta table). Returns the txn and the file's relative path."""
    name = core.resolve_table(str(table))
    txn, _ = core.open_transaction(pipeline, batch, tables=[name])
    relative = f"_percolake/{txn.txn_id}/part-0.parquet"
    path = Path(local_path(name)) / relative
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
    add = AddFileRecord(relative, path.stat().st_size, {}, 0, json.dumps({"numRecords": len(ids)}))
    core.commit(txn.txn_id, None, [name], [TableWriteRecord(name, mode, (add,), SCHEMA)])
    core.get_snapshot([name])  # rolls the commit forward
    return core.get_transaction(txn.txn_id), relative


def rows(table: Path) -> list[int]:
    return sorted(read_delta_table(str(table)).column("id").to_pylist())


def prune_far_ahead(core: TransactionCoordinator) -> int:
    """Prunes as if a day and more had passed; returns the floor it left."""
    core.prune_history(now_ms=wall_ms() + 25 * HOUR_MS)
    return core.store.retention_floor_ts()


def overwritten_table(core, warehouse: Path) -> tuple[Path, TxnRecord, str, str]:
    """A table whose version 0 file was replaced by an overwrite (version 1)."""
    table = warehouse / "src"
    first, old = write_batch(core, "bank", 0, table, [1, 2])
    _, new = write_batch(core, "bank", 1, table, [3], WriteMode.OVERWRITE)
    return table, first, old, new


def test_vacuum_refused_while_a_lease_holds_allowed_after_release(core, warehouse):
    table, first, old, new = overwritten_table(core, warehouse)
    name = core.resolve_table(str(table))
    snapshot = core.get_snapshot([name], as_of_ts=first.commit_ts)
    assert snapshot.versions == {name: 0}
    lease = core.take_lease(snapshot, 48 * HOUR_MS, "nightly-report")
    assert lease.tables == ((name, 0),)

    with pytest.raises(FailedPrecondition) as refused:
        core.vacuum(name, retention_hours=0)
    message = str(refused.value)
    assert lease.lease_id in message and "'nightly-report'" in message and "until" in message
    assert old in message
    assert (Path(local_path(name)) / old).exists()

    # Retention pruning stops at the lease: its snapshot still answers.
    assert prune_far_ahead(core) == lease.barrier_ts
    assert core.get_snapshot([name], as_of_ts=lease.barrier_ts).versions == {name: 0}
    assert [x.lease_id for x in core.list_leases([name])] == [lease.lease_id]

    assert core.release_lease(lease.lease_id) is True
    assert core.release_lease(lease.lease_id) is False
    assert core.list_leases() == []
    # Time travel still reaches version 0 until the floor moves on.
    with pytest.raises(FailedPrecondition, match="time-travel floor"):
        core.vacuum(name, retention_hours=0)
    prune_far_ahead(core)
    result = core.vacuum(name, retention_hours=0)
    assert result.removed_files == [old]
    assert not (Path(local_path(name)) / old).exists()
    assert (Path(local_path(name)) / new).exists()
    assert rows(table) == [3]


def test_a_dry_run_lists_the_files_and_removes_nothing(core, warehouse):
    table, _, old, _ = overwritten_table(core, warehouse)
    name = core.resolve_table(str(table))
    prune_far_ahead(core)
    result = core.vacuum(name, retention_hours=0, dry_run=True)
    assert result.removed_files == [old] and result.dry_run
    assert (Path(local_path(name)) / old).exists()
    # The retention window counts: nothing was removed from the log that long ago.
    assert core.vacuum(name, retention_hours=1).removed_files == []
    assert (Path(local_path(name)) / old).exists()


def test_an_expired_lease_stops_blocking_and_maintenance_drops_it(core, warehouse):
    table, first, old, _ = overwritten_table(core, warehouse)
    name = core.resolve_table(str(table))
    lease = core.take_lease(core.get_snapshot([name], as_of_ts=first.commit_ts), 1, "brief")
    wait_for(lambda: not core.list_leases([name]), 30, "the lease to expire")
    assert [x.lease_id for x in core.store.load_leases()] == [lease.lease_id]
    assert core.drop_expired_leases() == 1
    assert core.store.load_leases() == []
    assert prune_far_ahead(core) > lease.barrier_ts
    assert core.vacuum(name, retention_hours=0).removed_files == [old]


def test_a_lease_is_durable_across_a_restart(warehouse, tmp_path):
    first = make_core(warehouse, tmp_path / "data")
    _, batch, _, _ = overwritten_table(first, warehouse)
    name = first.resolve_table(str(warehouse / "src"))
    lease = first.take_lease(first.get_snapshot([name], as_of_ts=batch.commit_ts), HOUR_MS, "h")
    first.close()
    first.store.close()
    again = make_core(warehouse, tmp_path / "data")
    try:
        assert again.list_leases() == [lease]
        with pytest.raises(FailedPrecondition, match=lease.lease_id):
            again.vacuum(name, retention_hours=0, dry_run=True)
    finally:
        again.close()
        again.store.close()


def plan_with_changes(core, pipeline: str, source: str, change: TxnRecord,
                      generation: int | None, after: int | None):
    """The reader's next batch, planned once the source completed the barrier of ``change``
    (asked earlier, the plan would be an empty step, remembered for that offset)."""
    wait_for(lambda: (done := core.completion().completed(source)) is not None
             and done >= change.commit_ts, 30, "the source to complete the change's barrier")
    plan = core.plan_barrier(pipeline, generation, after)
    assert plan.has_changes and plan.barrier >= change.commit_ts
    return plan


def test_files_of_a_downstream_pipelines_range_are_kept(core, warehouse):
    source, derived = warehouse / "src", warehouse / "derived"
    appended, _ = write_batch(core, "bank", 0, source, [1, 2])
    name = core.resolve_table(str(source))
    core.register_reads("ledger", [name], None)
    first_plan = plan_with_changes(core, "ledger", name, appended, None, None)
    txn, _ = write_batch(core, "ledger", 0, derived, [1, 2])
    assert txn.input_barrier == first_plan.barrier
    # The source is overwritten after the barrier the reader last read up to.
    overwrite, replaced = write_batch(core, "bank", 1, source, [3], WriteMode.OVERWRITE)
    with pytest.raises(FailedPrecondition) as refused:
        core.vacuum(name, retention_hours=0, dry_run=True)
    assert "pipeline 'ledger'" in str(refused.value)
    assert f"barrier {first_plan.barrier}" in str(refused.value)
    # Retention pruning stops at the reader's last input barrier.
    assert prune_far_ahead(core) == first_plan.barrier

    # The reader moves past the overwrite: its range no longer needs the old file, but time
    # travel to the floor (the reader's old barrier) still does, until pruning moves on.
    second_plan = plan_with_changes(core, "ledger", name, overwrite, 0, first_plan.barrier)
    txn, _ = write_batch(core, "ledger", 1, derived, [3])
    assert txn.input_barrier == second_plan.barrier
    with pytest.raises(FailedPrecondition, match="time-travel floor"):
        core.vacuum(name, retention_hours=0, dry_run=True)
    assert prune_far_ahead(core) == second_plan.barrier
    removed = core.vacuum(name, retention_hours=0).removed_files
    assert len(removed) == 1 and removed[0] != replaced
    assert rows(source) == [3]


# ------------------------------------------------------------------ gRPC and the CLI

def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "coordinator", *args], capture_output=True,
                          text=True, timeout=90, cwd=ROOT, env=env)


def daemon_batch(stub, pipeline: str, batch: int, table: str, mode: int) -> pb.Transaction:
    txn = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=batch, tables=[table]), timeout=30).transaction
    committed = stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=txn.txn_id, tables=[table], writes=[table_write(table, txn.txn_id, mode=mode)]),
        timeout=30).transaction
    versions = apply_all(stub, txn.txn_id)
    stub.ReportApplied(pb.ReportAppliedRequest(txn_id=txn.txn_id, tables=[
        pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()]), timeout=30)
    return committed


def test_leases_over_grpc_and_the_vacuum_cli(daemon):
    stub = daemon.stub
    pipeline = unique("bank")
    table = canonical(daemon.warehouse / unique("t"))
    first = daemon_batch(stub, pipeline, 0, table, pb.APPEND)
    daemon_batch(stub, pipeline, 1, table, pb.OVERWRITE)
    reply = stub.GetSnapshot(pb.GetSnapshotRequest(
        tables=[table], as_of_ts=first.commit_ts, lease_ms=HOUR_MS,
        lease_holder="nightly-report"), timeout=30)
    lease = reply.lease
    assert lease.lease_id and lease.holder == "nightly-report"
    assert [(t.canonical_table, t.delta_version) for t in lease.tables] == [(table, 0)]
    assert lease.expires_unix_ms - lease.created_unix_ms == HOUR_MS
    listed = stub.ListLeases(pb.ListLeasesRequest(tables=[table]), timeout=30).leases
    assert [x.lease_id for x in listed] == [lease.lease_id]

    refused = cli("vacuum", "--table", table, "--retention-hours", "0", "--target",
                  daemon.target)
    assert refused.returncode == 1, refused.stderr
    assert "FAILED_PRECONDITION" in refused.stderr
    assert lease.lease_id in refused.stderr and "nightly-report" in refused.stderr

    assert stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease.lease_id),
                             timeout=30).released
    assert not stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease.lease_id),
                                 timeout=30).released
    assert not stub.ListLeases(pb.ListLeasesRequest(tables=[table]), timeout=30).leases
    # Time travel (retention 168 h) still reaches the overwritten version: the floor blocks.
    floor = cli("vacuum", "--table", table, "--retention-hours", "0", "--dry-run",
                "--target", daemon.target)
    assert floor.returncode == 1 and "time-travel floor" in floor.stderr, floor.stderr

    appended = canonical(daemon.warehouse / unique("appended"))
    daemon_batch(stub, pipeline, 2, appended, pb.APPEND)
    done = cli("vacuum", "--table", appended, "--target", daemon.target, "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["table"] == appended and shown["removed_files"] == []
    assert "the time-travel floor" in shown["kept_for"] and shown["oldest_needed_version"] == 0
    text = cli("vacuum", "--table", appended, "--dry-run", "--target", daemon.target)
    assert text.returncode == 0 and "would remove 0 file(s)" in text.stdout, text.stderr

    assert cli("vacuum", "--table", table, "--target", "not-a-target").returncode == 2
    assert cli("vacuum", "--table", table, "--retention-hours", "-1").returncode == 2


def test_lease_fields_are_checked_before_a_snapshot(daemon):
    table = canonical(daemon.warehouse / unique("t"))
    for request in (pb.GetSnapshotRequest(tables=[table], lease_ms=-1),
                    pb.GetSnapshotRequest(tables=[table], lease_holder="h")):
        with pytest.raises(grpc.RpcError) as refused:
            daemon.stub.GetSnapshot(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_lake_side_finds_checks_and_removes_files_on_s3(moto_server, s3_env, s3_bucket):
    from tests.test_s3_lake import apply, upload, write_of

    table = f"s3://{s3_bucket}/wh/t"
    old = upload(moto_server, table, "t1", [1])
    apply(write_of(table, [old]), "t1", 0)
    new = upload(moto_server, table, "t2", [2])
    apply(write_of(table, [new], WriteMode.OVERWRITE), "t2", 1)
    lake = TableVacuum(table)
    candidates = lake.candidates(0)
    assert candidates == [old.path]
    assert lake.files_of_version(0) == {old.path}
    assert lake.read_after(0, candidates) == [old.path] and lake.read_after(1, candidates) == []
    assert lake.candidates(1) == []  # removed just now, not an hour ago
    assert lake.remove(candidates) == [old.path]
    keys = moto_server.keys(s3_bucket, "wh/t/")
    assert f"wh/t/{old.path}" not in keys and f"wh/t/{new.path}" in keys
    assert read_delta_table(table).column("x").to_pylist() == [2]


def test_the_lake_side_refuses_paths_outside_the_table(tmp_path):
    lake = TableVacuum(f"file://{tmp_path}/none")
    for path in ("../x.parquet", "/etc/passwd", "_delta_log/00000000000000000000.json", "a//b"):
        with pytest.raises(UnsafeLocation):
            lake.remove([path])


# ------------------------------------------------------------------ unapplied write intents


def test_vacuum_keeps_the_files_a_committed_unapplied_revision_adds_back(core, warehouse):
    """A revision committed but not applied (its coordinator died) re-adds the version-0 file
    the overwrite removed: vacuum must keep it until the revision is applied."""
    from percolake import failpoints

    table = warehouse / "src"
    first, old = write_batch(core, "bank", 0, table, [1, 2])
    name = core.resolve_table(str(table))
    barrier = wait_for(lambda: (done := core.completion().completed(name)) is not None
                       and done >= first.commit_ts and done, 30, "the first batch's barrier")
    overwrite, _ = write_batch(core, "bank", 1, table, [3], WriteMode.OVERWRITE)
    wait_for(lambda: wall_ms() > wall_ms_of(overwrite.commit_ts) + 1, 30, "a millisecond later")
    failpoints.enable("after-revise-commit", "raise")
    try:
        with pytest.raises(failpoints.FailpointError):
            core.revise(name, barrier)
    finally:
        failpoints.disable("after-revise-commit")
    [revision] = [t for t in core.store.unfinished_txns() if t.pipeline_id == "percolake.revise"]
    assert revision.state.value == "COMMITTED"
    # The floor passes the overwrite (long ago) but not the revision: no snapshot at or
    # after it reads version 0, only the revision, once applied, does.
    core.prune_history(now_ms=wall_ms_of(revision.commit_ts) - 1 + 24 * HOUR_MS)
    assert overwrite.commit_ts < core.store.retention_floor_ts() < revision.commit_ts

    with pytest.raises(FailedPrecondition) as refused:
        core.vacuum(name, retention_hours=0)
    assert revision.txn_id in str(refused.value) and old in str(refused.value)
    assert (Path(local_path(name)) / old).exists()
    assert core.revise(name, barrier).txn_id == revision.txn_id  # finished: applied
    assert rows(table) == [1, 2]


# ------------------------------------------------------------------ who may release, how many


class _Credentials:
    """What the access rules read of the daemon's credentials: the policy."""

    def __init__(self, *entries) -> None:
        from coordinator.auth.acl import Policy

        self.policy = Policy(entries)


def _secured_call(guard, principal: str, name: str, core, request, call):
    from coordinator.principal import acting_as

    with acting_as(principal):
        return guard.run(name, core, request, call)


def test_only_the_taker_or_an_admin_releases_a_lease_and_others_see_no_id(core, warehouse):
    from coordinator.auth.access import AccessDenied, Guard
    from coordinator.auth_records import AclRecord, Permission, Resource
    from coordinator.principal import acting_as
    from coordinator.servicer import _lease_to_pb

    table, first, _, _ = overwritten_table(core, warehouse)
    name = core.resolve_table(str(table))
    guard = Guard(_Credentials(
        AclRecord("carol", Resource.TABLE, "*", Permission.READ),
        AclRecord("mallory", Resource.TABLE, "*", Permission.READ),
        AclRecord("root", Resource.TABLE, "*", Permission.READ),
        AclRecord("root", Resource.PIPELINE, "*", Permission.ADMIN)))
    with acting_as("carol"):
        lease = core.take_lease(core.get_snapshot([name], as_of_ts=first.commit_ts),
                                HOUR_MS, "carol's report")
    assert lease.principal == "carol"
    assert core.store.load_leases()[0].principal == "carol"  # durable with it

    def listed(principal: str) -> list[str]:
        reply = _secured_call(guard, principal, "ListLeases", core,
                              pb.ListLeasesRequest(tables=[name]),
                              lambda: pb.ListLeasesResponse(
                                  leases=[_lease_to_pb(x) for x in core.list_leases([name])]))
        return [(x.lease_id, x.holder) for x in reply.leases]

    def release(principal: str, lease_id: str) -> bool:
        request = pb.ReleaseLeaseRequest(lease_id=lease_id)
        return _secured_call(guard, principal, "ReleaseLease", core, request,
                             lambda: core.release_lease(lease_id))

    assert listed("carol") == [(lease.lease_id, "carol's report")]
    assert listed("mallory") == [("", "carol's report")]  # shown, without its id
    assert listed("root") == [(lease.lease_id, "carol's report")]
    with pytest.raises(AccessDenied, match="ADMIN"):
        release("mallory", lease.lease_id)
    assert [x.lease_id for x in core.list_leases()] == [lease.lease_id]
    assert release("carol", lease.lease_id) is True

    with acting_as("carol"):
        again = core.take_lease(core.get_snapshot([name]), HOUR_MS, "h")
    assert release("root", again.lease_id) is True  # an ADMIN on '*' may
    assert core.list_leases() == []


def test_live_leases_per_principal_are_capped(warehouse, tmp_path):
    from coordinator.principal import acting_as
    from percolake.errors import ResourceExhausted

    capped = TransactionCoordinator(
        SqliteStore(tmp_path / "capped"),
        CoordinatorConfig([str(warehouse)], barrier_interval_s=0.05,
                          max_live_leases_per_principal=2),
        applier=functools.partial(apply_table_write, roots=[str(warehouse)]))
    try:
        write_batch(capped, "bank", 0, warehouse / "t", [1])
        name = capped.resolve_table(str(warehouse / "t"))
        with acting_as("carol"):
            held = [capped.take_lease(capped.get_snapshot([name]), HOUR_MS, "h")
                    for _ in range(2)]
            with pytest.raises(ResourceExhausted) as refused:
                capped.take_lease(capped.get_snapshot([name]), HOUR_MS, "h")
            assert "--max-live-leases-per-principal 2" in str(refused.value)
            assert "'carol'" in str(refused.value)
        with acting_as("dave"):  # another principal's count is its own
            capped.take_lease(capped.get_snapshot([name]), HOUR_MS, "h")
        assert len(capped.store.load_leases()) == 3
        with acting_as("carol"):
            capped.release_lease(held[0].lease_id)
            capped.take_lease(capped.get_snapshot([name]), HOUR_MS, "h")
    finally:
        capped.close()
        capped.store.close()


def test_vacuum_refuses_a_table_with_a_feature_percolake_cannot_write(core, warehouse):
    """A vacuum deletes files only of tables whose every feature percolake implements (what
    ``vacuumProtocolCheck`` requires of a vacuum); a table with that feature is vacuumed."""
    table, _, old, _ = overwritten_table(core, warehouse)
    name = core.resolve_table(str(table))
    prune_far_ahead(core)
    upgrade(table, "v2Checkpoint")  # by an outside writer: sidecars percolake cannot see
    with pytest.raises(FailedPrecondition, match="vacuum of .* refused, nothing was removed.*"
                       "VACUUM it with delta-spark.*'v2Checkpoint'") as refused:
        core.vacuum(name, retention_hours=0)
    assert FEATURES["v2Checkpoint"].how in str(refused.value)
    assert (Path(local_path(name)) / old).exists()
    upgrade(table, "vacuumProtocolCheck")  # its protocol now: that feature alone
    assert core.vacuum(name, retention_hours=0).removed_files == [old]
