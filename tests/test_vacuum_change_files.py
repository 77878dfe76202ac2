"""Vacuum of change data files (no Spark; docs/row-level-writes.md, Change data feed): the
change files a row-level write adds under ``_percolake/<txn_id>/op<N>/_change_data/`` expire
once their commit is older than the retention, as delta-spark's do, and never while a
downstream pipeline's unread range, the time-travel floor or the retention still needs them.
Real Delta tables, written through the coordinator's own commit and apply path."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from coordinator.core import TransactionCoordinator
from percolake.errors import FailedPrecondition
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import commit_file, files_of_version
from percolake.lake.vacuum import TableVacuum
from percolake.records import (
    AddFileRecord,
    ChangeFileRecord,
    RemoveFileRecord,
    TableWriteRecord,
    TxnRecord,
    WriteMode,
)
from tests.test_leases_vacuum import HOUR_MS, plan_with_changes, prune_far_ahead
from tests.test_leases_vacuum import write_batch as write_derived


@pytest.fixture
def table(warehouse: Path) -> Path:
    """Version 0, made outside percolake: one data file at the root, the change data feed on."""
    path = warehouse / "accounts"
    write_deltalake(str(path), pa.table({"id": pa.array([1, 2], pa.int64()),
                                         "value": pa.array([10, 20], pa.int64())}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    return path


def _parquet(path: Path, columns: dict[str, list]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path.stat().st_size


def commit(core: TransactionCoordinator, pipeline: str, batch: int, table: Path,
           write_of) -> TxnRecord:
    """Commits one batch of ``pipeline`` on ``table`` (``write_of(txn_id)`` makes its files
    and intent) and rolls it forward."""
    name = core.resolve_table(str(table))
    txn, _ = core.open_transaction(pipeline, batch, tables=[name])
    core.commit(txn.txn_id, None, [name], [write_of(txn.txn_id)])
    core.get_snapshot([name])  # rolls the commit forward
    return core.get_transaction(txn.txn_id)


def append(table: Path, ids: list[int], values: list[int]):
    def write_of(txn_id: str) -> TableWriteRecord:
        relative = f"_percolake/{txn_id}/part-0.parquet"
        size = _parquet(table / relative, {"id": pa.array(ids, pa.int64()),
                                           "value": pa.array(values, pa.int64())})
        files = files_of_version(f"file://{table}", 0)
        return TableWriteRecord(f"file://{table}", WriteMode.APPEND, (AddFileRecord(
            relative, size, {}, 0, json.dumps({"numRecords": len(ids)})),), files.schema_json)
    return write_of


def update_root_file(table: Path, version: int):
    """An UPDATE adding 1 to the value of every row of version 0's root file (what delta-spark's
    UPDATE on a table with the change data feed commits: the file replaced, one change file of
    pre- and post-images)."""
    def write_of(txn_id: str) -> TableWriteRecord:
        uri = f"file://{table}"
        files = files_of_version(uri, version)
        [root_file] = [f for f in files.files if not f.path.startswith("_percolake/")]
        before = pq.read_table(table / root_file.path)
        ids, values = before.column("id").to_pylist(), before.column("value").to_pylist()
        folder = f"_percolake/{txn_id}/op0"
        data = f"{folder}/part-0.parquet"
        change = f"{folder}/_change_data/part-0.parquet"
        data_size = _parquet(table / data, {"id": pa.array(ids, pa.int64()),
                                            "value": pa.array([v + 1 for v in values],
                                                              pa.int64())})
        change_size = _parquet(table / change, {
            "id": pa.array(ids * 2, pa.int64()),
            "value": pa.array(values + [v + 1 for v in values], pa.int64()),
            "_change_type": ["update_preimage"] * len(ids) + ["update_postimage"] * len(ids)})
        return TableWriteRecord(
            uri, WriteMode.ROW_LEVEL,
            (AddFileRecord(data, data_size, {}, 0, json.dumps({"numRecords": len(ids)})),),
            files.schema_json, (), remove_files=(RemoveFileRecord(root_file.path,
                                                                  root_file.size, {}),),
            read_version=version, operation="UPDATE",
            operation_metrics=json.dumps({"numUpdatedRows": str(len(ids)),
                                          "numAddedChangeFiles": "1"}),
            change_files=(ChangeFileRecord(change, change_size, {}),))
    return write_of


def change_file_of(txn: TxnRecord) -> str:
    return f"_percolake/{txn.txn_id}/op0/_change_data/part-0.parquet"


def rows(table: Path) -> list[tuple[int, int]]:
    return sorted((r["id"], r["value"]) for r in read_delta_table(str(table)).to_pylist())


def age_commit(table: Path, version: int, hours: int) -> None:
    """Makes ``version``'s log entry ``hours`` old (its modification time: the commit's time
    for a table without in-commit timestamps)."""
    when = time.time() - hours * 3600
    os.utime(commit_file(f"file://{table}", version), (when, when))


def test_a_change_file_expires_through_vacuum_once_its_commit_is_older_than_the_retention(
        core, table):
    commit(core, "bank", 0, table, append(table, [3], [30]))
    update = commit(core, "bank", 1, table, update_root_file(table, 1))
    name = core.resolve_table(str(table))
    change = change_file_of(update)
    assert (table / change).exists()
    prune_far_ahead(core)  # no snapshot reads the versions before any more

    # Within the retention: kept, as delta-spark keeps its change files.
    assert core.vacuum(name, retention_hours=1).removed_files == []
    # The commit older than the retention: the change file goes; the data file its commit
    # removed just now (deletionTimestamp) stays until the retention has passed for it too.
    age_commit(table, 2, hours=2)
    assert core.vacuum(name, retention_hours=1, dry_run=True).removed_files == [change]
    assert (table / change).exists()
    assert core.vacuum(name, retention_hours=1).removed_files == [change]
    assert not (table / change).exists()
    assert rows(table) == [(1, 11), (2, 21), (3, 30)]
    removed = core.vacuum(name, retention_hours=0).removed_files
    assert len(removed) == 1 and not removed[0].startswith("_percolake/")


def test_a_downstream_pipelines_unread_range_keeps_the_change_files_of_its_commits(
        core, table, warehouse):
    """The reader read the table up to version 1; the UPDATE's change data (version 2) is in
    its range still to read, so vacuum refuses naming the change file, until the reader moves
    past it."""
    appended = commit(core, "bank", 0, table, append(table, [3], [30]))
    name = core.resolve_table(str(table))
    derived = warehouse / "derived"
    core.register_reads("ledger", [name], None)
    first_plan = plan_with_changes(core, "ledger", name, appended, None, None)
    write_derived(core, "ledger", 0, derived, [1, 2, 3])
    update = commit(core, "bank", 1, table, update_root_file(table, 1))
    change = change_file_of(update)

    with pytest.raises(FailedPrecondition) as refused:
        core.vacuum(name, retention_hours=0)
    message = str(refused.value)
    assert "pipeline 'ledger'" in message and f"barrier {first_plan.barrier}" in message
    assert f"(first: {change})" in message  # it sorts before the root file the UPDATE removed
    assert (table / change).exists()

    plan_with_changes(core, "ledger", name, update, 0, first_plan.barrier)
    write_derived(core, "ledger", 1, derived, [4])
    prune_far_ahead(core)
    removed = core.vacuum(name, retention_hours=0).removed_files
    assert removed[0] == change and len(removed) == 2
    assert not (table / change).exists()
    assert rows(table) == [(1, 11), (2, 21), (3, 30)]


def test_a_change_file_belongs_to_its_commits_version_and_time(table):
    """At the lake level: a change file is read by no version's snapshot, counts as removed at
    the version that wrote it, and is as old as that commit: its in-commit timestamp where the
    entry has one, else the entry's modification time."""
    from percolake.lake.delta_commit import apply_table_write

    write = update_root_file(table, 0)("c" * 32)
    assert apply_table_write(write, app_id="percolake:p:g0", app_version=0, txn_id="c" * 32,
                             commit_ts=5) == 1
    change = write.change_files[0].path
    uri = f"file://{table}"
    lake = TableVacuum(uri)
    assert change not in lake.files_of_version(1)
    assert lake.read_after(0, [change]) == [change] and lake.read_after(1, [change]) == []
    assert change in lake.candidates(0) and change not in lake.candidates(1)
    two_hours_on = int(time.time() * 1000) + 2 * HOUR_MS
    assert change in TableVacuum(uri).candidates(1, now_ms=two_hours_on)

    # An in-commit timestamp two hours back: the commit is that old, whatever the file says.
    entry = commit_file(uri, 1)
    actions = [json.loads(line) for line in entry.read_text().splitlines()]
    for action in actions:
        if "commitInfo" in action:
            action["commitInfo"]["inCommitTimestamp"] = int(time.time() * 1000) - 2 * HOUR_MS
    entry.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    assert TableVacuum(uri).candidates(1) == [change]
