"""Row-level write intents (no Spark): their codec and validation, the conflict rules checked
before the commit point, and the apply of removes beside adds (I12)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from coordinator import validation
from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.store import MemoryStore
from percolake import codec, failpoints
from percolake.errors import FailedPrecondition, InvalidArgument, TableQuarantined
from percolake.lake import delta_commit
from percolake.lake import log_entry as log_entry_module
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.checkpoints import Checkpointer
from percolake.lake.conflicts import RowLevelConflict, check_row_level_write
from percolake.lake.deletion_vectors import deletion_vectors
from percolake.lake.delta_commit import CannotApplyAsRead, apply_table_write, files_of_version
from percolake.lake.read_set import WRITE_SERIALIZABLE, ReadSet
from percolake.lake.warehouse import canonical_table_uri
from percolake.lake.write_check import WriteChecker
from percolake.records import AddFileRecord, RemoveFileRecord, TableWriteRecord, WriteMode
from percolake.states import TxnState

APP, TXN = "percolake:p:g0", "a" * 32


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3], "value": [10, 20, 30]}))
    return path


def rewrite(table: Path, ids: list[int], values: list[int], txn_id: str = TXN
            ) -> TableWriteRecord:
    """A row-level write of version 0: its one file replaced by one holding ``ids``."""
    folder = table / "_percolake" / txn_id / "op0"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "part-0.parquet"
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                             "value": pa.array(values, pa.int64())}), path)
    add = AddFileRecord(path.relative_to(table).as_posix(), path.stat().st_size, {}, 0,
                        json.dumps({"numRecords": len(ids)}))
    files = files_of_version(f"file://{table}", 0)
    removes = tuple(RemoveFileRecord(f.path, f.size, {}) for f in files.files)
    return TableWriteRecord(f"file://{table}", WriteMode.ROW_LEVEL, (add,), files.schema_json,
                            (), remove_files=removes, read_version=0, operation="MERGE",
                            operation_metrics=json.dumps({"numTargetRowsDeleted": "1"}))


def rows(table: Path) -> list[tuple]:
    return sorted((r["id"], r["value"]) for r in read_delta_table(str(table)).to_pylist())


def test_a_row_level_intent_survives_the_codec_and_the_record_json(table):
    write = dataclasses.replace(rewrite(table, [1, 2], [10, 25]), read_set=ReadSet(
        WRITE_SERIALIZABLE, {"column": "id", "op": "in", "values": ["1", None]}).to_json())
    assert codec.table_write_from_pb(codec.table_write_to_pb(write)) == write
    assert TableWriteRecord.from_json(json.loads(write.json_text)) == write
    append = TableWriteRecord("file:///x", WriteMode.APPEND, (), write.schema_json)
    assert "remove_files" not in append.to_json(), "other modes keep their stored form"


def test_validation_refuses_removes_that_cannot_be_meant(table):
    write = rewrite(table, [1], [1])
    validation.check_table_write(write, TXN, 10**6)
    # an append of the batch beside its row-level operations, in call order
    validation.check_table_write(dataclasses.replace(write, operation="MERGE,WRITE,DELETE"),
                                 TXN, 10**6)
    own = RemoveFileRecord(f"_percolake/{TXN}/op1/part-9.parquet", 1, {})
    cases = {
        "needs the ROW_LEVEL mode": dataclasses.replace(write, mode=WriteMode.APPEND),
        "read_version": dataclasses.replace(write, read_version=-1),
        "operation": dataclasses.replace(write, operation="OPTIMIZE"),
        "removed twice": dataclasses.replace(write, remove_files=write.remove_files * 2),
        "relative path of a data file": dataclasses.replace(write, remove_files=(own,)),
        "read_set is not JSON": dataclasses.replace(write, read_set="{"),
        "read_set: isolation_level": dataclasses.replace(
            write, read_set='{"isolation_level": "Snapshot", "predicate": true}'),
    }
    for message, bad in cases.items():
        with pytest.raises(InvalidArgument, match=message):
            validation.check_table_write(bad, TXN, 10**6)


def test_the_apply_commits_removes_beside_adds_once_with_the_operation_metrics(table):
    write = rewrite(table, [1, 2], [10, 25])
    check_row_level_write(write)
    version = apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5)
    assert version == 1 and rows(table) == [(1, 10), (2, 25)]
    assert apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5) == 1
    assert DeltaTable(str(table)).version() == 1, "a replay never applies it twice"
    info = DeltaTable(str(table)).history(1)[0]
    assert info["operation"] == "MERGE" and info["percolake.operation"] == "MERGE"
    assert info["operationMetrics"] == {"numTargetRowsDeleted": "1"}


def test_an_outside_append_since_the_read_conflicts_before_the_commit_point(table):
    write = rewrite(table, [1], [10])
    write_deltalake(str(table), pa.table({"id": [9], "value": [90]}), mode="append")
    with pytest.raises(RowLevelConflict, match=r"version 1 \(WRITE.*added 1 file"):
        check_row_level_write(write)


def test_an_outside_commit_without_data_does_not_conflict(table):
    write = rewrite(table, [1], [10])
    dt = DeltaTable(str(table))
    dt.create_write_transaction([], "append", dt.schema())  # commitInfo only
    check_row_level_write(write)


def test_a_removed_file_not_in_the_table_is_refused(table):
    write = rewrite(table, [1], [10])
    ghost = dataclasses.replace(write, remove_files=(RemoveFileRecord("ghost.parquet", 1, {}),))
    with pytest.raises(FailedPrecondition, match="ghost.parquet"):
        check_row_level_write(ghost)


def test_after_commit_an_outside_rewrite_stops_the_apply_instead_of_applying_it_elsewhere(
        table):
    write = rewrite(table, [1], [10])
    DeltaTable(str(table)).optimize.compact()  # nothing to compact: adds no version
    DeltaTable(str(table)).delete("id = 3")  # an outside DELETE rewrites the file read
    before = rows(table)
    with pytest.raises(CannotApplyAsRead, match="removed 1 file"):
        apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5)
    assert rows(table) == before


def real_core(root: Path) -> TransactionCoordinator:
    """A coordinator core with the real pre-commit check and Delta applier (no daemon)."""
    return TransactionCoordinator(
        MemoryStore(), CoordinatorConfig([str(root)], txn_timeout_s=60, conflict_wait_s=0.2),
        applier=apply_table_write, remove_files=lambda location: None,
        write_check=WriteChecker(roots=[str(root)]).check)


def test_the_coordinator_refuses_the_commit_of_a_write_an_outside_commit_conflicts_with(
        tmp_path, table):
    core = real_core(tmp_path)
    uri = canonical_table_uri(str(table))
    txn, _ = core.open_transaction("p", 0)
    core.declare_tables(txn.txn_id, None, [uri])
    write_deltalake(str(table), pa.table({"id": [9], "value": [90]}), mode="append")
    with pytest.raises(RowLevelConflict, match="conflicts with its row-level write"):
        core.commit(txn.txn_id, None, [uri], writes=[rewrite(table, [1], [1], txn.txn_id)])
    assert core.get_transaction(txn.txn_id).state != TxnState.COMMITTED
    assert rows(table) == [(1, 10), (2, 20), (3, 30), (9, 90)]


def test_a_committed_write_an_outside_writer_broke_is_never_applied_and_keeps_its_table(
        tmp_path, table):
    """The window between COMMITTED and the Delta commit: the coordinator's roll-forward finds
    the outside DELETE, applies nothing, and the table refuses the next writer naming why."""
    core = real_core(tmp_path)
    uri = canonical_table_uri(str(table))
    txn, _ = core.open_transaction("p", 0)
    core.declare_tables(txn.txn_id, None, [uri])
    committed = core.commit(txn.txn_id, None, [uri],
                            writes=[rewrite(table, [1, 2], [10, 25], txn.txn_id)])
    assert committed.state == TxnState.COMMITTED
    DeltaTable(str(table)).delete("id = 3")  # the driver died; an outside writer commits
    before = rows(table)
    other, _ = core.open_transaction("p", 1)  # its next batch
    with pytest.raises(TableQuarantined, match="cannot be applied as it read the table"):
        core.declare_tables(other.txn_id, None, [uri])
    assert rows(table) == before == [(1, 10), (2, 20)]
    assert core.get_transaction(txn.txn_id).state == TxnState.COMMITTED


def log_actions(table: Path, version: int) -> list[dict]:
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_the_commit_is_delta_sparks_operation_with_its_parameters_and_the_percolake_tags(table):
    parameters = {"predicate": '["(t.id = s.id)"]',
                  "matchedPredicates": '[{"actionType":"update"}]',
                  "notMatchedPredicates": "[]", "notMatchedBySourcePredicates": "[]"}
    write = dataclasses.replace(rewrite(table, [1, 2], [10, 25]),
                                operation_parameters=json.dumps(parameters))
    apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5)
    actions = log_actions(table, 1)
    info = actions[0]["commitInfo"]
    assert info["operation"] == "MERGE" and info["operationParameters"] == parameters
    assert info["readVersion"] == 0 and info["isBlindAppend"] is False
    assert info["percolake.txn_id"] == TXN and info["percolake.commit_ts"] == "5"
    assert json.loads(info["userMetadata"]) == {"percolake.txn_id": TXN,
                                                 "percolake.commit_ts": "5"}
    assert {"txn": {"appId": APP, "version": 0, "lastUpdated": actions[1]["txn"]["lastUpdated"]}} \
        == actions[1]
    assert DeltaTable(str(table)).transaction_version(APP) == 0
    assert delta_commit.is_commit_of(f"file://{table}", 1, TXN, APP, 0)
    changes = [a for a in actions if "add" in a or "remove" in a]
    assert len(changes) == 2 and all(
        (a.get("add") or a.get("remove"))["dataChange"] is True for a in changes)


def test_a_write_that_only_rearranges_rows_is_an_optimize_with_data_change_false(table):
    write = dataclasses.replace(rewrite(table, [1, 2, 3], [10, 20, 30]), operation="OPTIMIZE",
                                data_change=False, operation_metrics="")
    assert apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5) == 1
    actions = log_actions(table, 1)
    assert actions[0]["commitInfo"]["operation"] == "OPTIMIZE"
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert len(changes) == 2 and not any(c["dataChange"] for c in changes)
    assert rows(table) == [(1, 10), (2, 20), (3, 30)]


def test_a_lost_put_if_absent_race_re_checks_and_finds_the_write_applied_once(table,
                                                                             monkeypatch):
    """Two appliers of one write (the participant and the roll-forward): the other puts the
    entry first; ours loses the put-if-absent, re-reads and answers the other's version."""
    write = rewrite(table, [1, 2], [10, 25])
    real_put = log_entry_module.put_entry
    raced = []

    def the_other_applier_wins(table_uri: str, version: int, actions: list[dict]) -> bool:
        if not raced:
            raced.append(version)
            monkeypatch.setattr(delta_commit, "put_entry", real_put)
            assert apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN,
                                     commit_ts=5) == version
            monkeypatch.setattr(delta_commit, "put_entry", the_other_applier_wins)
        return real_put(table_uri, version, actions)

    monkeypatch.setattr(delta_commit, "put_entry", the_other_applier_wins)
    assert apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5) == 1
    assert raced == [1] and DeltaTable(str(table)).version() == 1
    assert rows(table) == [(1, 10), (2, 25)]


@pytest.mark.parametrize("point", ["before-row-level-entry", "after-row-level-entry"])
def test_an_apply_stopped_at_a_row_level_failpoint_applies_once_when_run_again(table, point):
    write = rewrite(table, [1, 2], [10, 25])
    failpoints.enable(point, "raise")
    try:
        with pytest.raises(failpoints.FailpointError):
            apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5)
    finally:
        failpoints.disable()
    assert DeltaTable(str(table)).version() == (0 if point.startswith("before") else 1)
    assert apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5) == 1
    assert DeltaTable(str(table)).version() == 1 and rows(table) == [(1, 10), (2, 25)]


def test_a_row_level_commit_at_the_checkpoint_interval_gets_the_checkpoint(tmp_path):
    """A log entry of ours at a multiple of delta.checkpointInterval gets its checkpoint from
    the applier's Checkpointer (off the batch's path, docs/checkpoints.md), which delta-rs then
    reads the table from."""
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3], "value": [10, 20, 30]}),
                    configuration={"delta.checkpointInterval": "2"})
    write_deltalake(str(path), pa.table({"id": [4], "value": [40]}), mode="append")
    version = DeltaTable(str(path)).version()
    files = files_of_version(f"file://{path}", version)
    folder = path / "_percolake" / TXN / "op0"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()),
                             "value": pa.array([10, 20, 30, 41], pa.int64())}),
                   folder / "p.parquet")
    write = TableWriteRecord(
        f"file://{path}", WriteMode.ROW_LEVEL,
        (AddFileRecord(f"_percolake/{TXN}/op0/p.parquet", (folder / "p.parquet").stat().st_size,
                       {}, 0, '{"numRecords":4}'),), files.schema_json,
        remove_files=tuple(RemoveFileRecord(f.path, f.size, {}) for f in files.files),
        read_version=version, operation="UPDATE")
    assert apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5) == 2
    checkpointer = Checkpointer()
    checkpointer.applied(f"file://{path}", 2)
    assert checkpointer.close()
    assert (path / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()
    assert rows(path) == [(1, 10), (2, 20), (3, 30), (4, 41)]


def test_deletion_vectors_are_read_from_the_log_as_delta_spark_writes_them(table):
    """delta-spark's DELETE writes the file's add with its new vector before the remove of
    the file without one, in one entry: the add decides (a logical file is path + vector)."""
    path = files_of_version(f"file://{table}", 0).files[0].path
    vector = {"storageType": "u", "pathOrInlineDv": "N4=5IZpc(2U7(J$wwwxo", "offset": 1,
              "sizeInBytes": 34, "cardinality": 1}
    entry = [{"commitInfo": {"operation": "DELETE"}},
             {"add": {"path": path, "partitionValues": {}, "size": 1, "modificationTime": 0,
                      "dataChange": True, "deletionVector": vector}},
             {"remove": {"path": path, "dataChange": True, "deletionTimestamp": 0}}]
    (table / "_delta_log" / f"{1:020d}.json").write_text(
        "".join(json.dumps(a) + "\n" for a in entry))
    uri = f"file://{table}"
    assert deletion_vectors(uri, 1) == {path: vector}
    assert deletion_vectors(uri, 1, [path, "other.parquet"]) == {path: vector}
    assert deletion_vectors(uri, 0) == {}
