"""Interleavings of appliers, outside writers and log cleanup that the apply model
(``tests/test_apply_model.py``) found, each as a plain case.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from percolake.errors import FailedPrecondition
from percolake.lake import delta_commit
from percolake.lake.delta_commit import CannotApplyAsRead, apply_table_write, commit_file
from percolake.lake.log_cleanup import clean_log
from percolake.lake.table_cache import TableCache
from tests.test_row_level_commit import APP, TXN, rewrite, rows
from tests.test_write_check import data_file, intent, longs, make_table

EVERY_ENTRY_EXPIRED = {"delta.logRetentionDuration": "interval 1 millisecond"}


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3], "value": [10, 20, 30]}))
    return path


def outside_append(table: Path, row: int) -> None:
    write_deltalake(str(table), pa.table({"id": [row], "value": [row * 10]}), mode="append")


def clean_up_to_newest(table: Path) -> list[str]:
    """An outside writer's checkpoint of the newest version, then its log cleanup."""
    newest = DeltaTable(str(table))
    newest.create_checkpoint()
    return clean_log(f"file://{table}", newest.version(), EVERY_ENTRY_EXPIRED,
                     now_ms=int(time.time() * 1000) + 60_000)


def test_an_applier_that_checked_before_another_applied_never_quarantines_the_applied_write(
        table, monkeypatch):
    """The driver checks (not applied yet at version 0); the roll-forward applies the MERGE
    (version 1); an outside append follows (version 2), after the write. The driver's
    conflict walk must end at the write's own commit: the append came after it, and the
    write is applied exactly once, not quarantined (an operator's abandon would then record
    an applied write as never applied)."""
    write = rewrite(table, [1, 2], [10, 25])
    real_layout = delta_commit._layout_of
    raced: list[int] = []

    def roll_forward_and_append_first(delta):  # noqa: ANN001, ANN202
        if not raced:
            raced.append(-1)  # the roll-forward's own check passes through here
            raced[0] = apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN,
                                         commit_ts=5)
            outside_append(table, 7)
        return real_layout(delta)

    monkeypatch.setattr(delta_commit, "_layout_of", roll_forward_and_append_first)
    version = apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5,
                                tables=TableCache().tables)
    assert version == raced[0] == 1
    assert rows(table) == [(1, 10), (2, 25), (7, 70)]


def test_a_committed_merge_whose_read_log_is_cleaned_up_is_quarantined_not_applied(table):
    """An outside append conflicts with the MERGE (version 1), then an outside checkpoint and
    log cleanup delete the entries after the read version: what was committed since can no
    longer be checked, so the write is not applied against it."""
    write = rewrite(table, [1, 2], [10, 25])
    outside_append(table, 7)
    outside_append(table, 8)
    assert "00000000000000000001.json" in clean_up_to_newest(table)
    before = rows(table)
    with pytest.raises(CannotApplyAsRead, match="cleaned up"):
        apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5)
    assert rows(table) == before


def test_an_applied_write_whose_entry_is_cleaned_up_is_found_at_the_oldest_version_left(
        tmp_path):
    """The driver applied the append (version 1) and died before reporting it; outside
    commits, a checkpoint and log cleanup delete its entry before the roll-forward comes. The
    roll-forward finds it applied and reports the oldest version still in the log (it holds
    the write and no later commit of the pipeline), instead of failing for ever."""
    root = tmp_path / "t"
    make_table(root)
    write = intent(root, [data_file(root, "t1", longs(5))])
    assert apply_table_write(write, app_id="app", app_version=1, txn_id="t1", commit_ts=1) == 1
    write_deltalake(str(root), longs(6), mode="append")
    write_deltalake(str(root), longs(7), mode="append")
    assert "00000000000000000001.json" in clean_up_to_newest(root)
    assert not commit_file(f"file://{root}", 1).exists()
    for tables in (None, TableCache().tables):
        assert apply_table_write(write, app_id="app", app_version=1, txn_id="t1",
                                 commit_ts=1, tables=tables) == 3
    # a stale applier of it after the pipeline's next batch: its version cannot be told
    later = intent(root, [data_file(root, "t2", longs(8))])
    assert apply_table_write(later, app_id="app", app_version=2, txn_id="t2", commit_ts=2) == 4
    with pytest.raises(FailedPrecondition, match="log entry is cleaned up"):
        apply_table_write(write, app_id="app", app_version=1, txn_id="t1", commit_ts=1)
