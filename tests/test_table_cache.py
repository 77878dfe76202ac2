"""The coordinator's kept table state (``percolake.lake.table_cache``): what it keeps is never
taken for a log that changed since, and every commit made by anyone is seen.

Real Delta tables (delta-rs) in tmp_path; the outside writer is ``write_deltalake``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from percolake.errors import FailedPrecondition
from percolake.lake import delta_commit
from percolake.lake.delta_commit import apply_table_write, open_table
from percolake.lake.table_cache import LogEntries, TableCache, entry_path
from percolake.lake.write_check import LayoutCache, WriteChecker
from tests.test_write_check import data_file, intent, longs, make_table


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "t"


def checker_on(cache: TableCache) -> WriteChecker:
    return WriteChecker(LayoutCache(cache.entries))


def apply(root: Path, cache: TableCache | None, batch: int) -> int:
    write = intent(root, [data_file(root, f"t{batch}", longs(batch))])
    return apply_table_write(write, app_id="app", app_version=batch, txn_id=f"t{batch}",
                             commit_ts=batch, tables=cache.tables if cache else None)


def test_an_outside_commit_between_two_checks_is_seen(root):
    make_table(root)
    cache = TableCache()
    checker = checker_on(cache)
    table = f"file://{root}"
    checker.check(intent(root, [data_file(root, "t1", longs(1))]))
    assert checker.layouts.get(table).version == 0
    write_deltalake(str(root), longs(7), mode="append")  # an outside append: layout kept
    checker.check(intent(root, [data_file(root, "t2", longs(2))]))
    assert checker.layouts.get(table).version == 1
    write_deltalake(str(root), pa.table({"y": ["s"]}), mode="overwrite", schema_mode="overwrite")
    with pytest.raises(FailedPrecondition, match=r"at version 2: missing columns \['y'\]"):
        checker.check(intent(root, [data_file(root, "t3", longs(3))]))


def test_a_report_checked_against_a_rewritten_entry_reads_it_again(root):
    make_table(root)
    entries = LogEntries()
    version = apply(root, None, 1)
    table = f"file://{root}"
    assert entries.is_commit_of(table, version, "t1", "app", 1)
    assert entries.reads == 1
    assert entries.is_commit_of(table, version, "t1", "app", 1)
    assert entries.reads == 1  # unchanged file: its summary is reused
    shutil.rmtree(root)  # the table re-created: version 1 is now another commit
    make_table(root)
    other = apply(root, None, 2)
    assert other == version
    assert not entries.is_commit_of(table, version, "t1", "app", 1)
    assert entries.is_commit_of(table, version, "t2", "app", 2)
    assert entries.reads == 2


@pytest.mark.parametrize("txn_id, app_id, app_version, expected", [
    ("t1", "app", 1, True), ("t9", "app", 1, False), ("t1", "other", 1, False),
    ("t1", "app", 2, False)])
def test_is_commit_of_answers_as_the_uncached_check(root, txn_id, app_id, app_version, expected):
    make_table(root)
    version = apply(root, None, 1)
    table = f"file://{root}"
    assert delta_commit.is_commit_of(table, version, txn_id, app_id, app_version) is expected
    assert LogEntries().is_commit_of(table, version, txn_id, app_id, app_version) is expected
    assert not LogEntries().is_commit_of(table, version + 1, "t1", "app", 1)  # no such entry


def test_an_entry_that_is_not_delta_json_is_no_commit(root):
    make_table(root)
    version = apply(root, None, 1)
    path = Path(entry_path(f"file://{root}", version))
    path.write_text(path.read_text() + "not json\n")
    assert not LogEntries().is_commit_of(f"file://{root}", version, "t1", "app", 1)


def test_kept_tables_advance_and_see_outside_commits(root):
    make_table(root)
    cache = TableCache()
    assert apply(root, cache, 1) == 1
    write_deltalake(str(root), longs(7), mode="append")  # version 2, by someone else
    assert apply(root, cache, 2) == 3
    assert apply(root, cache, 2) == 3  # applied already: found, not written twice
    assert cache.tables.loads == 1 and cache.tables.advances == 2
    assert DeltaTable(str(root)).version() == 3
    assert sorted(r["x"] for r in DeltaTable(str(root)).to_pyarrow_table().to_pylist()) == \
        [1, 1, 2, 7]


def test_a_kept_table_whose_log_was_replaced_is_loaded_again(root):
    make_table(root)
    cache = TableCache()
    apply(root, cache, 1)
    shutil.rmtree(root)
    make_table(root)
    write_deltalake(str(root), longs(5), mode="append")  # version 1 again, another commit
    assert apply(root, cache, 2) == 2
    assert cache.tables.loads == 2
    assert sorted(r["x"] for r in DeltaTable(str(root)).to_pyarrow_table().to_pylist()) == \
        [1, 2, 5]


def test_a_table_that_raised_is_not_kept(root, monkeypatch):
    make_table(root)
    cache = TableCache()
    assert apply(root, cache, 1) == 1
    assert cache.tables.loads == 1

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("boom")

    monkeypatch.setattr(delta_commit, "_write_actions", broken)
    with pytest.raises(RuntimeError, match="boom"):
        apply(root, cache, 2)
    assert cache.tables.take(f"file://{root}", open_table) is not None
    assert cache.tables.loads == 2  # loaded again: the one that raised was dropped


def test_the_apply_finds_its_commit_without_listing_the_log(root, monkeypatch):
    """The version of a commit already made is found reading entries backwards from the
    newest: the cost does not grow with the number of entries in ``_delta_log``."""
    make_table(root)
    apply(root, None, 1)
    for value in range(5):
        write_deltalake(str(root), longs(value), mode="append")
    listed: list[str] = []
    monkeypatch.setattr(Path, "glob", lambda *a, **k: listed.append("glob") or iter(()))
    assert apply(root, None, 1) == 1  # already applied: its version, found again
    assert not listed
