"""An append is a log entry of percolake's own, applied to a kept table without rebuilding
delta-rs's state of the table's files (``percolake.lake.kept_table``): what makes a batch's apply
cost the same at version 10 and at version 10,000 (issue 33.3). The entry carries what
delta-rs's own commit of the same append carried, and outside commits are still seen.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.transaction import AddAction

from percolake.lake import delta_commit, kept_table
from percolake.lake.delta_commit import apply_table_write, commit_file, open_table
from percolake.lake.table_cache import TableCache
from percolake.records import WriteMode
from tests.test_write_check import data_file, intent, longs, make_table, rows

REBUILDS = ("update_incremental", "create_write_transaction", "get_add_actions")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "t"


@pytest.fixture
def rebuilds(monkeypatch) -> list[str]:
    """The calls into delta-rs that rebuild (or need) the state of every file of a table."""
    calls: list[str] = []
    for name in REBUILDS:
        real = getattr(DeltaTable, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):  # noqa: ANN001, ANN202
            calls.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(DeltaTable, name, spy)
    return calls


def apply(root: Path, cache: TableCache, batch: int, mode: WriteMode = WriteMode.APPEND) -> int:
    write = intent(root, [data_file(root, f"t{batch}", longs(batch))], mode=mode)
    return apply_table_write(write, app_id="app", app_version=batch, txn_id=f"t{batch}",
                             commit_ts=batch, tables=cache.tables)


def entry(root: Path, version: int) -> list[dict]:
    return [json.loads(line) for line in
            commit_file(f"file://{root}", version).read_text().splitlines()]


def test_appends_to_a_kept_table_do_not_rebuild_the_state_of_its_files(root, rebuilds):
    make_table(root)
    cache = TableCache()
    assert apply(root, cache, 1) == 1  # loads the table once
    rebuilds.clear()
    assert [apply(root, cache, batch) for batch in (2, 3, 4)] == [2, 3, 4]
    assert apply(root, cache, 3) == 3  # applied already: found from the kept app transactions
    assert rebuilds == []
    assert cache.tables.loads == 1
    assert [r["x"] for r in rows(root)] == [1, 1, 2, 3, 4]
    assert DeltaTable(str(root)).transaction_version("app") == 4


def test_an_overwrite_brings_the_kept_table_to_every_file_first(root, rebuilds):
    make_table(root)
    cache = TableCache()
    apply(root, cache, 1)
    write_deltalake(str(root), longs(7), mode="append")  # an outside append: version 2
    assert apply(root, cache, 2, WriteMode.OVERWRITE) == 3
    assert "get_add_actions" in rebuilds  # the removes name every live file
    assert [r["x"] for r in rows(root)] == [2]
    assert apply(root, cache, 3) == 4
    assert [r["x"] for r in rows(root)] == [2, 3]


def test_a_kept_table_sees_outside_commits_and_their_layout(root):
    make_table(root)
    cache = TableCache()
    table = f"file://{root}"
    apply(root, cache, 1)
    kept = cache.tables.take(table, open_table)
    write_deltalake(str(root), longs(7), mode="append")  # no layout change
    kept.update_incremental()
    assert kept.version() == 2 and kept.transaction_version("app") == 1
    write_deltalake(str(root), pa.table({"x": pa.array([8], pa.int64()), "y": ["n"]}),
                    mode="append", schema_mode="merge")  # a metaData action
    kept.update_incremental()
    assert kept.version() == 3
    assert [f["name"] for f in json.loads(kept.schema().to_json())["fields"]] == ["x", "y"]


def test_an_append_entry_carries_what_delta_rs_committed_for_it(tmp_path):
    """The same append, committed by delta-rs to one table and by percolake to its copy: the
    same commitInfo (operation, parameters, percolake's tags), app transaction and add."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for root in (ours, theirs):
        make_table(root, pa.schema([("x", pa.int64()), ("p", pa.string())]), ["p"])
    file = data_file(ours, "t1", longs(5), "p=a", {"p": "a"})
    write = intent(ours, [file], pa.schema([("x", pa.int64()), ("p", pa.string())]),
                   partition_by=("p",))
    apply_table_write(write, app_id="app", app_version=1, txn_id="t1", commit_ts=9)
    (theirs / file.path).parent.mkdir(parents=True)
    shutil.copy(ours / file.path, theirs / file.path)
    tags = {"percolake.txn_id": "t1", "percolake.commit_ts": "9",
            "userMetadata": json.dumps({"percolake.txn_id": "t1", "percolake.commit_ts": "9"})}
    now = int(time.time() * 1000)
    DeltaTable(str(theirs)).create_write_transaction(
        [AddAction(file.path, file.size, {"p": "a"}, file.modification_time, True, file.stats)],
        "append", DeltaTable(str(theirs)).schema(), partition_by=["p"],
        commit_properties=CommitProperties(custom_metadata=tags,
                                           app_transactions=[Transaction("app", 1, now)]))

    def shape(actions: list[dict]) -> dict:
        kinds = {next(iter(a)): a[next(iter(a))] for a in actions}
        info = kinds["commitInfo"]
        add = {k: v for k, v in kinds["add"].items() if v is not None}
        return {"kinds": sorted(kinds), "operation": info["operation"],
                "parameters": info["operationParameters"],
                "tags": {k: info[k] for k in tags},
                "txn": {k: kinds["txn"][k] for k in ("appId", "version")}, "add": add}

    assert shape(entry(ours, 1)) == shape(entry(theirs, 1))
    assert sorted(DeltaTable(str(ours)).to_pyarrow_table().to_pylist(), key=str) == \
        sorted(DeltaTable(str(theirs)).to_pyarrow_table().to_pylist(), key=str)


def test_an_overwrite_after_log_cleanup_still_reads_every_file(root):
    """Appends leave delta-rs's state at the version first loaded; the entries after it
    cleaned up since (a checkpoint covers them), an overwrite still removes every file."""
    make_table(root)
    cache = TableCache()
    apply(root, cache, 1)  # delta-rs's state: version 1
    assert [apply(root, cache, batch) for batch in (2, 3, 4)] == [2, 3, 4]
    DeltaTable(str(root)).create_checkpoint()
    for version in range(4):  # what log cleanup leaves: the checkpoint and what follows it
        commit_file(f"file://{root}", version).unlink()
    assert apply(root, cache, 5, WriteMode.OVERWRITE) == 5
    assert [r["x"] for r in rows(root)] == [5]
    assert apply(root, cache, 6) == 6
    assert [r["x"] for r in rows(root)] == [5, 6]


def test_a_kept_table_far_behind_is_loaded_anew_not_replayed(root, monkeypatch):
    make_table(root)
    cache = TableCache()
    loads: list[str] = []
    monkeypatch.setattr(delta_commit, "open_table", lambda uri: loads.append(uri) or
                        open_table(uri))
    monkeypatch.setattr(kept_table, "MAX_REPLAY", 3)
    assert [apply(root, cache, batch) for batch in (1, 2, 3)] == [1, 2, 3]  # delta-rs at 0
    assert loads == [f"file://{root}"]
    loads.clear()
    assert apply(root, cache, 4, WriteMode.OVERWRITE) == 4  # 3 behind: replayed
    assert loads == []
    assert [apply(root, cache, batch) for batch in (5, 6, 7, 8)] == [5, 6, 7, 8]
    assert apply(root, cache, 9, WriteMode.OVERWRITE) == 9  # 4 or more behind: loaded anew
    assert loads == [f"file://{root}"]
    assert [r["x"] for r in rows(root)] == [9]


def test_an_overwrite_applied_by_another_applier_after_the_check_is_not_applied_twice(
        root, monkeypatch):
    """The kept table's check (is this batch applied?) is made at the version it holds; the
    overwrite's delta-rs commit must be made against that version too, so that another
    applier's commit of the same batch in between is a lost race, not a second commit."""
    make_table(root)
    cache = TableCache()
    apply(root, cache, 1)
    write = intent(root, [data_file(root, "t2", longs(2))], mode=WriteMode.OVERWRITE)
    real = kept_table.KeptTable.get_add_actions
    raced: list[int] = []

    def other_applier_first(self, *args, **kwargs):  # noqa: ANN001, ANN202
        if not raced:  # the same batch applied elsewhere (no kept table) after the check
            raced.append(apply_table_write(write, app_id="app", app_version=2, txn_id="t2",
                                           commit_ts=2))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(kept_table.KeptTable, "get_add_actions", other_applier_first)
    version = apply_table_write(write, app_id="app", app_version=2, txn_id="t2", commit_ts=2,
                                tables=cache.tables)
    assert version == raced[0]
    latest = DeltaTable(str(root)).version()
    naming = [v for v in range(latest + 1)
              if any(a.get("commitInfo", {}).get(delta_commit.TXN_ID_KEY) == "t2"
                     for a in entry(root, v))]
    assert naming == [version]
