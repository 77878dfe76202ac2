"""Checkpoints on the table's schedule and log cleanup that keeps what is still read
(docs/checkpoints.md). Real Delta tables through percolake's apply path (delta-rs only); the
delta-spark side is in tests/spark/test_checkpoint_reads.py."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import random
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.core.state import wall_ms
from coordinator.store import SqliteStore
from percolake.lake.checkpoints import Checkpointer, checkpointing, last_checkpoint_version
from percolake.lake.delta_commit import apply_table_write
from percolake.lake.log_cleanup import expired_entries, log_retention_ms
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from tests.test_leases_vacuum import HOUR_MS, SCHEMA, prune_far_ahead, write_batch

APP = "percolake:p:g0"
DAY_MS = 24 * HOUR_MS


def append(table: Path, batch: int, checkpointer: Checkpointer | None = None) -> int:
    """Applies one committed append of one row (id = batch) as the participant does."""
    relative = f"_percolake/t{batch}/part-0.parquet"
    path = table / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array([batch], pa.int64())}), path)
    write = TableWriteRecord(f"file://{table}", WriteMode.APPEND, (AddFileRecord(
        relative, path.stat().st_size, {}, 0, json.dumps({"numRecords": 1})),), SCHEMA)
    version = apply_table_write(write, app_id=APP, app_version=batch, txn_id=f"t{batch}",
                                commit_ts=batch + 1)
    if checkpointer is not None:
        checkpointer.applied(write.table, version)
    return version


def checkpoint_versions(table: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (table / "_delta_log").iterdir()
                  if ".checkpoint." in p.name)


def created_with(table: Path, configuration: dict[str, str]) -> None:
    """Version 0 made by delta-rs with the table properties (one row, id -1)."""
    write_deltalake(str(table), pa.table({"id": pa.array([-1], pa.int64())}),
                    configuration=configuration)


def test_the_apply_itself_writes_no_checkpoint_and_deletes_no_log_entry(tmp_path):
    # delta-rs's post-commit hook would checkpoint every 2nd version here, then clean the log
    table = tmp_path / "t"
    created_with(table, {"delta.checkpointInterval": "2",
                         "delta.logRetentionDuration": "interval 0 seconds"})
    for batch in range(5):
        append(table, batch)
    assert checkpoint_versions(table) == []
    assert sorted(p.name for p in (table / "_delta_log").glob("*.json"))[0] == f"{0:020d}.json"


def test_an_apply_reads_the_newest_log_entries_only_never_a_listing_of_the_log(
        tmp_path, monkeypatch):
    table = tmp_path / "t"
    for batch in range(12):
        append(table, batch)
    listed: list[str] = []
    real_glob = Path.glob
    monkeypatch.setattr(Path, "glob", lambda self, pattern: listed.append(str(self))
                        or real_glob(self, pattern))
    assert append(table, 12) == 12
    assert append(table, 12) == 12  # already applied: found among the newest entries
    assert [p for p in listed if p.endswith("_delta_log")] == []


def test_checkpoints_at_every_tenth_version_by_default(tmp_path):
    table = tmp_path / "t"
    checkpointer = Checkpointer()
    versions = [append(table, batch, checkpointer) for batch in range(25)]
    assert versions == list(range(25))
    assert checkpointer.flush()
    assert checkpoint_versions(table) == [10, 20]
    last = json.loads((table / "_delta_log" / "_last_checkpoint").read_text())
    assert last["version"] == 20 and last["numOfAddFiles"] == 21
    assert DeltaTable(str(table), version=20).to_pyarrow_table().num_rows == 21
    checkpointer.close()


def test_checkpoints_follow_the_tables_own_interval(tmp_path):
    table = tmp_path / "t"
    created_with(table, {"delta.checkpointInterval": "4"})
    checkpointer = Checkpointer()
    for batch in range(13):  # versions 1..13
        append(table, batch, checkpointer)
        assert checkpointer.flush()  # one at a time: each due version gets its own
    assert checkpoint_versions(table) == [4, 8, 12]
    assert last_checkpoint_version(f"file://{table}") == 12
    checkpointer.close()


def test_a_missed_checkpoint_is_written_at_the_next_apply(tmp_path):
    table = tmp_path / "t"
    for batch in range(12):  # versions 0..11; nobody checkpointed 10 (a crashed applier)
        append(table, batch)
    checkpointer = Checkpointer()
    append(table, 12, checkpointer)
    assert checkpointer.flush()
    assert checkpoint_versions(table) == [10]
    checkpointer.close()


def _checkpoint_forever(table: str, version: int, ready) -> None:  # noqa: ANN001
    """The child killed mid-checkpoint: rewrites the checkpoint of ``version`` in a loop."""
    log = Path(table) / "_delta_log"
    dt = DeltaTable(table, version=version)
    ready.set()
    while True:
        # the hint goes first: a kill between the two never leaves a hint naming a deleted
        # checkpoint, a state no checkpoint writer makes (writers only add files)
        (log / "_last_checkpoint").unlink(missing_ok=True)
        for path in log.glob(f"{version:020d}.checkpoint*"):
            path.unlink()
        dt.create_checkpoint()


def checkpoint_writers_killed(table: Path, version: int, times: int, seed: int):  # noqa: ANN201
    """Kills a writer of ``version``'s checkpoint at a random moment, ``times`` times; yields
    after each kill (the caller checks what the kill left)."""
    context = multiprocessing.get_context("spawn")  # deltalake's runtime must not be forked
    rng = random.Random(seed)
    for _ in range(times):
        ready = context.Event()
        child = context.Process(target=_checkpoint_forever, args=(str(table), version, ready))
        child.start()
        assert ready.wait(60)
        time.sleep(rng.uniform(0.0, 0.05))
        child.kill()
        child.join()
        yield


def test_a_crash_while_writing_a_checkpoint_leaves_the_table_readable(tmp_path):
    table = tmp_path / "t"
    for batch in range(13):
        append(table, batch)
    for _ in checkpoint_writers_killed(table, 10, times=4, seed=33):
        assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 13
        for version in (10, 11, 12):
            assert DeltaTable(str(table), version=version).to_pyarrow_table().num_rows \
                == version + 1
    # the next scheduled checkpoint is written over whatever the crash left
    checkpointer = Checkpointer()
    checkpointer.applied(f"file://{table}", 12)
    assert checkpointer.flush()
    assert last_checkpoint_version(f"file://{table}") == 10
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 13
    checkpointer.close()


def test_a_checkpoint_whose_writer_died_before_its_hint_gets_the_hint(tmp_path):
    table = tmp_path / "t"
    for batch in range(12):
        append(table, batch)
    DeltaTable(str(table), version=10).create_checkpoint()
    written = json.loads((table / "_delta_log" / "_last_checkpoint").read_text())
    (table / "_delta_log" / "_last_checkpoint").unlink()  # the writer died here
    checkpointer = Checkpointer()
    checkpointer.applied(f"file://{table}", 11)
    assert checkpointer.flush()
    assert json.loads((table / "_delta_log" / "_last_checkpoint").read_text()) == written
    checkpointer.close()


def test_log_retention_durations_as_delta_writes_them():
    assert log_retention_ms({}) == 30 * DAY_MS
    assert log_retention_ms({"delta.logRetentionDuration": "interval 2 weeks"}) == 14 * DAY_MS
    assert log_retention_ms({"delta.logRetentionDuration": "interval 1 hour"}) == HOUR_MS
    with pytest.raises(ValueError, match="delta.logRetentionDuration"):
        log_retention_ms({"delta.logRetentionDuration": "a while"})


def log_files(versions: range) -> list[str]:
    """The log entries of ``versions`` and their checksums, as log cleanup deletes them."""
    return [f"{v:020d}.{kind}" for v in versions for kind in ("crc", "json")]


def test_only_expired_entries_below_a_checkpoint_at_or_under_keep_from_go(tmp_path):
    table = tmp_path / "t"
    checkpointer = Checkpointer()
    for batch in range(25):
        append(table, batch, checkpointer)
    assert checkpointer.flush()
    uri = f"file://{table}"
    later = wall_ms() + 31 * DAY_MS
    assert expired_entries(uri, 24, 30 * DAY_MS) == []  # nothing is 30 days old yet
    assert expired_entries(uri, 9, 30 * DAY_MS, later) == []  # no checkpoint at or below 9
    assert expired_entries(uri, 15, 30 * DAY_MS, later) == log_files(range(10))
    gone = expired_entries(uri, 24, 30 * DAY_MS, later)
    assert gone == sorted(log_files(range(20)) + [f"{10:020d}.checkpoint.parquet"])
    # a recent entry stops the cleanup there: the log never gets a hole
    os.utime(table / "_delta_log" / f"{5:020d}.json", (later / 1000, later / 1000))
    assert expired_entries(uri, 24, 30 * DAY_MS, later) == log_files(range(5))
    checkpointer.close()


@pytest.fixture
def core(tmp_path: Path):
    lake = tmp_path / "warehouse"
    lake.mkdir()
    checkpointer = Checkpointer()
    made = TransactionCoordinator(
        SqliteStore(tmp_path / "data", group_commit=True),
        CoordinatorConfig([str(lake)], retention_hours=24, barrier_interval_s=0.05),
        applier=checkpointing(functools.partial(apply_table_write, roots=[str(lake)]),
                              checkpointer))
    made.lake = lake
    made.checkpointer = checkpointer
    yield made
    checkpointer.close()
    made.close()
    made.store.close()


def test_log_cleanup_keeps_what_a_lease_and_the_time_travel_floor_read(core):
    table = core.lake / "t"
    txns = [write_batch(core, "p", batch, table, [batch])[0] for batch in range(25)]
    assert core.checkpointer.flush()
    name = core.resolve_table(str(table))
    log_dir = table / "_delta_log"
    later = wall_ms() + 31 * DAY_MS

    # Before the time-travel floor moves, every version is readable by a snapshot: all stays.
    assert core.clean_log(name, now_ms=later) == []

    snapshot = core.get_snapshot([name], as_of_ts=txns[12].commit_ts)
    assert snapshot.versions == {name: 12}
    lease = core.take_lease(snapshot, 48 * HOUR_MS, "report")
    prune_far_ahead(core)  # the floor stops at the lease
    assert core.log_keep_from(name) == 12
    deleted = core.clean_log(name, now_ms=later)
    assert deleted == log_files(range(10))
    assert not (log_dir / f"{9:020d}.json").exists()
    assert DeltaTable(str(table), version=12).to_pyarrow_table().num_rows == 13
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 25

    assert core.clean_log(name) == []  # not 30 days old: entries stay
    core.release_lease(lease.lease_id)
    prune_far_ahead(core)
    assert core.log_keep_from(name) == 24
    assert core.clean_log(name, now_ms=later) == sorted(
        log_files(range(10, 20)) + [f"{10:020d}.checkpoint.parquet"])
    assert DeltaTable(str(table), version=20).to_pyarrow_table().num_rows == 21
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 25
    assert core.get_snapshot([name]).versions == {name: 24}
