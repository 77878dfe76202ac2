"""Quarantine (I12, docs/row-level-writes.md): a committed row-level write an outside writer
made unappliable is never applied against other data; the table refuses new commits naming the
recovery command until an operator chooses reapply (only when safe) or abandon, and the choice
is kept. On the real Delta applier and pre-commit check, without a daemon."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.store import SqliteStore
from percolake.errors import FailedPrecondition, NotFound, TableQuarantined
from percolake.lake.delta_commit import apply_table_write
from percolake.lake.warehouse import canonical_table_uri
from percolake.lake.write_check import WriteChecker
from percolake.records import QuarantineChoice
from percolake.states import TxnState
from tests.quarantine_support import (
    BEFORE,
    UPDATED,
    partitioned_table,
    table_rows,
    update_partition_a,
)
from tests.test_row_level_commit import rewrite, rows


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "lake" / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3], "value": [10, 20, 30]}))
    return path


def core_on(tmp_path: Path) -> TransactionCoordinator:
    """A coordinator core on a SQLite store in ``tmp_path/data`` (a new one reloads it)."""
    root = tmp_path / "lake"
    return TransactionCoordinator(
        SqliteStore(tmp_path / "data"),
        CoordinatorConfig([str(root)], txn_timeout_s=60, conflict_wait_s=0.2,
                          roll_forward_after_s=0),
        applier=apply_table_write, remove_files=lambda location: None,
        write_check=WriteChecker(roots=[str(root)]).check)


def commit_rewrite(core: TransactionCoordinator, table: Path, ids: list[int],
                   values: list[int], batch: int = 0) -> str:
    """Commits a MERGE-like rewrite of version 0's file and leaves it unapplied (the driver
    died right after the commit point)."""
    uri = canonical_table_uri(str(table))
    txn, _ = core.open_transaction("p", batch)
    core.declare_tables(txn.txn_id, None, [uri])
    committed = core.commit(txn.txn_id, None, [uri],
                            writes=[rewrite(table, ids, values, txn.txn_id)])
    assert committed.state == TxnState.COMMITTED
    return txn.txn_id


def next_batch_refused(core: TransactionCoordinator, table: Path, batch: int) -> str:
    other, _ = core.open_transaction("p", batch)
    with pytest.raises(TableQuarantined) as refused:
        core.declare_tables(other.txn_id, None, [canonical_table_uri(str(table))])
    core.abort(other.txn_id, None, "test: refused")
    return str(refused.value)


def test_an_unappliable_write_quarantines_its_table_durably_and_refuses_new_commits(
        tmp_path, table):
    core = core_on(tmp_path)
    uri = canonical_table_uri(str(table))
    txn_id = commit_rewrite(core, table, [1, 2], [10, 25])
    DeltaTable(str(table)).delete("id = 3")  # an outside DELETE rewrites the file it read
    before = rows(table)
    message = next_batch_refused(core, table, 1)
    assert f"table {uri} is quarantined: transaction {txn_id}" in message
    assert "version 1 (DELETE" in message
    assert (f"percolake-coordinator tables release-quarantine --table {uri} --txn {txn_id}"
            in message)
    assert [(q.table, q.txn_id, q.choice) for q in core.list_quarantines()] == [
        (uri, txn_id, None)]
    assert core.quarantined_count() == 1
    core.close()
    core.store.close()
    restarted = core_on(tmp_path)  # the quarantine is in the store, not only in memory
    assert [q.txn_id for q in restarted.list_quarantines()] == [txn_id]
    assert "is quarantined" in next_batch_refused(restarted, table, 2)
    assert rows(table) == before == [(1, 10), (2, 20)]  # nothing applied, nothing lost
    assert restarted.get_transaction(txn_id).state == TxnState.COMMITTED


def test_the_resolver_leaves_a_quarantined_table_alone_until_an_operator_chooses(
        tmp_path, table, caplog):
    core = core_on(tmp_path)
    applies: list[str] = []
    real = core._applier

    def counting(write, **kwargs):  # noqa: ANN001, ANN003, ANN202
        applies.append(write.table)
        return real(write, **kwargs)

    core._applier = counting
    txn_id = commit_rewrite(core, table, [1, 2], [10, 25])
    DeltaTable(str(table)).delete("id = 3")
    core.resolve_once()  # finds it unappliable: quarantined
    assert core.quarantined_count() == 1 and len(applies) == 1
    caplog.clear()
    core.resolve_once()
    core.resolve_once()
    assert len(applies) == 1  # no new attempt on every pass, and no error logged for it
    assert not [r for r in caplog.records if r.getMessage() == "roll-forward failed"]
    core.release_quarantine(str(table), txn_id, QuarantineChoice.ABANDON, "by hand")
    core.resolve_once()
    assert len(applies) == 1 and core.get_transaction(txn_id).state == TxnState.APPLIED


def test_abandon_frees_the_table_without_applying_and_keeps_the_choice(tmp_path, table):
    core = core_on(tmp_path)
    uri = canonical_table_uri(str(table))
    txn_id = commit_rewrite(core, table, [1, 2], [10, 25])
    DeltaTable(str(table)).delete("id = 3")
    next_batch_refused(core, table, 1)
    released = core.release_quarantine(str(table), txn_id, QuarantineChoice.ABANDON,
                                       "rows re-entered by hand")
    assert (released.choice, released.choice_reason, released.as_of_version) == (
        QuarantineChoice.ABANDON, "rows re-entered by hand", 1)
    assert not released.active and core.quarantined_count() == 0
    txn = core.get_transaction(txn_id)
    assert txn.state == TxnState.APPLIED
    assert (txn.tables[uri].abandoned, txn.tables[uri].delta_version) == (True, 1)
    assert rows(table) == [(1, 10), (2, 20)]  # the table keeps none of the abandoned write
    assert DeltaTable(str(table)).version() == 1
    nxt, _ = core.open_transaction("p", 1)
    core.declare_tables(nxt.txn_id, None, [uri])  # the table takes new commits again
    assert core.list_quarantines() == []
    assert [q.choice for q in core.list_quarantines(include_released=True)] == [
        QuarantineChoice.ABANDON]
    assert core.get_snapshot([uri]).versions == {uri: 1}


def test_reapply_is_refused_when_a_file_the_write_removes_is_gone(tmp_path, table):
    core = core_on(tmp_path)
    txn_id = commit_rewrite(core, table, [1, 2], [10, 25])
    DeltaTable(str(table)).delete("id = 3")  # removed the very file the write replaces
    next_batch_refused(core, table, 1)
    with pytest.raises(FailedPrecondition, match="cannot be reapplied onto version 1 without "
                                                 "losing or duplicating rows"):
        core.release_quarantine(str(table), txn_id, QuarantineChoice.REAPPLY, "try")
    assert core.quarantined_count() == 1 and rows(table) == [(1, 10), (2, 20)]
    assert core.list_quarantines()[0].choice is None  # a refused choice is not recorded


def test_reapply_after_an_outside_append_applies_the_write_once_and_records_it(
        tmp_path, table):
    core = core_on(tmp_path)
    uri = canonical_table_uri(str(table))
    txn_id = commit_rewrite(core, table, [1, 2], [10, 25])  # deletes 3, sets 2 to 25
    write_deltalake(str(table), pa.table({"id": [9], "value": [90]}), mode="append")
    next_batch_refused(core, table, 1)
    released = core.release_quarantine(uri, txn_id, QuarantineChoice.REAPPLY,
                                       "the appended row is unrelated")
    assert (released.choice, released.as_of_version, released.delta_version) == (
        QuarantineChoice.REAPPLY, 1, 2)
    assert sorted(rows(table)) == [(1, 10), (2, 25), (9, 90)]
    assert core.get_transaction(txn_id).state == TxnState.APPLIED
    with pytest.raises(NotFound, match="is not quarantined"):  # done: once only
        core.release_quarantine(uri, txn_id, QuarantineChoice.REAPPLY, "again")
    assert sorted(rows(table)) == [(1, 10), (2, 25), (9, 90)]


def test_a_recorded_choice_cannot_be_changed_and_a_wrong_transaction_is_named(
        tmp_path, table):
    core = core_on(tmp_path)
    uri = canonical_table_uri(str(table))
    txn_id = commit_rewrite(core, table, [1, 2], [10, 25])
    write_deltalake(str(table), pa.table({"id": [9], "value": [90]}), mode="append")
    next_batch_refused(core, table, 1)
    with pytest.raises(NotFound, match=f"it is by transaction {txn_id}"):
        core.release_quarantine(uri, "b" * 32, QuarantineChoice.ABANDON, "wrong id")
    record = core.list_quarantines()[0]
    # a reapply chosen and recorded, cut short before its Delta commit (a crash)
    chosen = record.__class__(**{**record.__dict__, "choice": QuarantineChoice.REAPPLY,
                                 "as_of_version": 1, "chosen_ms": 1})
    core.store.put_quarantine(chosen)
    core.close()
    core.store.close()
    restarted = core_on(tmp_path)
    with pytest.raises(FailedPrecondition, match="reapply was already chosen"):
        restarted.release_quarantine(uri, txn_id, QuarantineChoice.ABANDON, "changed my mind")
    snapshot = restarted.get_snapshot([uri])  # the roll-forward finishes the recorded choice
    assert snapshot.versions == {uri: 2} and restarted.quarantined_count() == 0
    assert sorted(rows(table)) == [(1, 10), (2, 25), (9, 90)]


def commit_write(core: TransactionCoordinator, write_for) -> str:  # noqa: ANN001
    txn, _ = core.open_transaction("p", 0)
    write = write_for(txn.txn_id)
    core.declare_tables(txn.txn_id, None, [write.table])
    assert core.commit(txn.txn_id, None, [write.table],
                       writes=[write]).state == TxnState.COMMITTED
    return txn.txn_id


def test_an_outside_compaction_of_other_files_leaves_the_write_exact_and_applied(tmp_path):
    """After COMMITTED an OPTIMIZE that removes none of the write's files (dataChange=false)
    keeps every row the write did not touch: the write is applied, no quarantine."""
    table = tmp_path / "lake" / "t"
    partitioned_table(table)
    core = core_on(tmp_path)
    uri = canonical_table_uri(str(table))
    txn_id = commit_write(core, lambda txn_id: update_partition_a(table, txn_id))
    DeltaTable(str(table)).optimize.compact(partition_filters=[("part", "=", "b")])
    assert DeltaTable(str(table)).history(1)[0]["operation"] == "OPTIMIZE"
    core.get_snapshot([uri])  # rolls the committed write forward
    assert core.get_transaction(txn_id).state == TxnState.APPLIED
    assert core.quarantined_count() == 0
    assert table_rows(table) == UPDATED


def test_an_outside_compaction_of_the_files_the_write_replaces_quarantines_it(tmp_path):
    table = tmp_path / "lake" / "t"
    partitioned_table(table)
    write_deltalake(str(table), pa.table({"id": pa.array([5], pa.int64()),
                                          "value": pa.array([50], pa.int64()),
                                          "part": ["a"]}), partition_by=["part"], mode="append")
    core = core_on(tmp_path)
    uri = canonical_table_uri(str(table))
    txn_id = commit_write(core, lambda txn_id: update_partition_a(table, txn_id))
    DeltaTable(str(table)).optimize.compact(partition_filters=[("part", "=", "a")])
    with pytest.raises(TableQuarantined, match="OPTIMIZE"):
        core.get_snapshot([uri])  # a snapshot must include the write: refused, named
    assert core.quarantined_count() == 1
    assert table_rows(table) == sorted([*BEFORE, (5, 50, "a")])  # nothing lost or doubled
    with pytest.raises(FailedPrecondition, match="Choose abandon"):
        core.release_quarantine(uri, txn_id, QuarantineChoice.REAPPLY, "try")
