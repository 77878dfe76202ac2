"""Model-based test of the appliers of committed writes (``apply_table_write``) over any
interleaving with each other and with outside writers.

Two Delta tables, partitioned by ``p``, on the local disk. One pipeline commits batches, one at a
time (the coordinator holds a table until its secondary is applied, I7); each batch writes one or
both tables: an append, an overwrite, an overwrite of one partition, a ``merge_schema`` append (a
new column) or a row-level write (a MERGE that rewrites one file of the partition it read). The
batch's writes are COMMITTED from the start: what is tested is the secondary.

Appliers: the driver and the coordinator's roll-forward, each a process-like instance with its
own kept tables (``TableCache``), and a one-off applier with none (every try loads the table).
Each runs ``apply_table_write`` in its own thread, which the test stops at one step and lets go
of later, so a step of one applier can fall between any two steps of another:

- ``checked``: just after the applied-check (the app transaction version), before anything else;
- ``before``: just before the commit (``before-log-entry``, ``before-row-level-entry``, delta-rs's
  ``create_write_transaction``);
- ``after``: just after it (``after-log-entry``, ``after-row-level-entry``, delta-rs's commit).

A stopped applier may be let go, possibly to stop at a later step, or crashed there (the failpoint
raises; the process's kept tables are lost). An applier may stay stopped while later batches
commit and apply: a stale applier. Outside writers meanwhile: delta-rs appends, an OPTIMIZE-like
rewrite (``dataChange=false``), a schema change, runs of empty commits that put kept tables far
behind (``MAX_REPLAY`` is lowered, so the reload path runs), checkpoints, log cleanup (that keeps
what leases read) and leases.

The model keeps each table's files and their rows, applying a batch's write when its commit
lands, and decides on its own whether a row-level write can still be applied as read (Delta's
WriteSerializable rules: an append to the partition it read, a metadata change, or a rewrite of a
file it removes, since its read version; or the log after its read version cleaned up, so nobody
can tell). After every step:

- each batch's write is in at most one Delta version per table, and exactly one once applied;
- the table's rows (read with deltalake in this process) are the model's;
- the log's versions are contiguous, and the pipeline's app transaction version never goes down;
- an applier that returns names the version holding the write; one that refuses it as
  unappliable (quarantine) does so only when the model says so and the write is not in the table;
  a write the model says cannot be applied is never applied;
- every leased version still reads as it did.

``PERCOLAKE_MODEL_EXAMPLES`` raises the example count for a soak (the default keeps the test to a
few seconds in the suite).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema, write_deltalake
from deltalake.exceptions import DeltaError
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from percolake.errors import FailedPrecondition
from percolake.failpoints import FailpointError
from percolake.lake import delta_commit, kept_table
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.checkpoints import write_checkpoint
from percolake.lake.delta_commit import CannotApplyAsRead, apply_table_write
from percolake.lake.log_cleanup import clean_log
from percolake.lake.log_entry import put_entry
from percolake.lake.read_set import WRITE_SERIALIZABLE, ReadSet
from percolake.lake.table_cache import TableCache
from percolake.lake.warehouse import canonical_table_uri
from percolake.records import (
    AddFileRecord,
    RemoveFileRecord,
    TableWriteRecord,
    WriteMode,
    delta_app_id,
)

PARTITIONS = ("a", "b")
TABLES = (0, 1)
APP_ID = delta_app_id("model", 0)
APPLIERS = ("driver", "roll-forward", "one-off")
STOPS = ("checked", "before", "after")
KINDS = ("append", "overwrite", "overwrite-partition", "merge-schema", "row-level")
WAIT_S = 60.0
MAX_REPLAY = 3  # lowered from 100: a kept table this far behind is loaded anew


def delta_schema(note: bool) -> str:
    fields = [("id", pa.int64()), ("p", pa.string())] + ([("note", pa.string())] if note else [])
    return Schema.from_arrow(pa.schema(fields)).to_json()


class Stopped(Exception):
    """The applier thread did not stop or finish in time (a hang)."""


@dataclass
class Run:
    """One apply in its thread, stopped at a step or finished."""

    applier: str
    txn: str
    table: int
    stop_at: str | None
    go: threading.Event = field(default_factory=threading.Event)
    reached: threading.Event = field(default_factory=threading.Event)
    stopped_at: str | None = None
    crash: bool = False
    finished: bool = False
    version: int | None = None
    error: BaseException | None = None


_current = threading.local()  # the Run of an applier thread


def _step(point: str) -> None:
    """Where an applier thread may stop: waits there if its run says so, then goes on or
    crashes."""
    run: Run | None = getattr(_current, "run", None)
    if run is None or run.stop_at != point:
        return
    run.stopped_at = point
    run.reached.set()
    run.go.wait()
    run.go.clear()
    if run.crash:
        raise FailpointError(f"failpoint at {point}: crashed by the model")


@dataclass
class Write:
    """A batch's committed write of one table, as the model sees it."""

    record: TableWriteRecord
    kind: str
    adds: dict[str, tuple[str, tuple[int, ...]]]  # file -> (partition, row ids)
    removes: tuple[str, ...] = ()  # row-level: the files it replaces
    read_partition: str | None = None  # row-level: what it read
    conflict: str = ""  # why it can no longer be applied as read (the model's view)
    landed: int | None = None  # the version holding it
    quarantined: bool = False


class ApplyModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="apply-model-"))
        self.ids = itertools.count(100)
        self.saved = (kept_table.MAX_REPLAY, delta_commit._layout_of, delta_commit.fail_point,
                      DeltaTable.create_write_transaction, delta_commit._lost_race_pause)
        self._patch()
        self.caches: dict[str, TableCache | None] = {
            "driver": TableCache(), "roll-forward": TableCache(), "one-off": None}
        self.runs: dict[str, Run] = {}
        self.batch = 0
        self.writes: dict[str, dict[int, Write]] = {}  # txn -> table -> write
        self.current: str | None = None
        self.quarantined: set[int] = set()
        self.files: list[dict[str, tuple[str, tuple[int, ...]]]] = []
        self.note = [False, False]  # has the table a note column
        self.scanned = [0, 0]  # newest version scanned per table
        self.oldest = [0, 0]  # oldest version whose entry is still in the log
        self.app_version = [-1, -1]
        self.landed_at: list[dict[int, str]] = [{}, {}]  # version -> txn of ours
        self.leases: list[tuple[int, int, list[tuple[int, str]]]] = []
        self.uris = []
        for table in TABLES:
            path = self.root / f"t{table}"
            rows = [next(self.ids) for _ in PARTITIONS]
            write_deltalake(str(path), pa.table({"id": pa.array(rows, pa.int64()),
                                                 "p": list(PARTITIONS)}), partition_by=["p"])
            self.uris.append(canonical_table_uri(str(path)))
            self.files.append({})
            for add in pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist():
                partition = add["partition.p"]
                self.files[table][add["path"]] = (partition, (rows[PARTITIONS.index(partition)],))

    # ------------------------------------------------------------------ set-up, tear-down

    def _patch(self) -> None:
        real_layout, real_commit = delta_commit._layout_of, DeltaTable.create_write_transaction

        def layout_of(table):  # noqa: ANN001, ANN202  (called right after the applied-check)
            _step("checked")
            return real_layout(table)

        def fail_point(name: str, batch: int | None = None) -> None:
            _step(name.split("-", 1)[0])

        def create_write_transaction(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            _step("before")
            real_commit(self, *args, **kwargs)
            _step("after")

        kept_table.MAX_REPLAY = MAX_REPLAY
        delta_commit._layout_of = layout_of
        delta_commit.fail_point = fail_point
        DeltaTable.create_write_transaction = create_write_transaction
        delta_commit._lost_race_pause = lambda *args, **kwargs: None

    def teardown(self) -> None:
        try:
            stopped = [run for run in self.runs.values() if not run.finished]
            for run in stopped:  # never leave a thread waiting
                run.crash = True
                run.go.set()
            for run in stopped:
                run.reached.wait(WAIT_S)
        finally:
            (kept_table.MAX_REPLAY, delta_commit._layout_of, delta_commit.fail_point,
             DeltaTable.create_write_transaction, delta_commit._lost_race_pause) = self.saved
            shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ helpers

    def _path(self, table: int) -> Path:
        return self.root / f"t{table}"

    def _latest(self, table: int) -> int:
        names = [n for n in os.listdir(self._path(table) / "_delta_log")
                 if n.endswith(".json") and not n.startswith(".")]
        return max(int(n[:20]) for n in names)

    def _data_file(self, table: int, folder: str, partition: str, rows: tuple[int, ...],
                   note: bool) -> AddFileRecord:
        """A Parquet file as Spark writes it for the table (no partition column)."""
        directory = self._path(table) / folder / f"p={partition}"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"part-{len(os.listdir(directory))}.parquet"
        columns = {"id": pa.array(rows, pa.int64())}
        if note:
            columns["note"] = pa.array(["n"] * len(rows), pa.string())
        pq.write_table(pa.table(columns), path)
        return AddFileRecord(path.relative_to(self._path(table)).as_posix(), path.stat().st_size,
                             {"p": partition}, 0, json.dumps({"numRecords": len(rows)}))

    def _make_write(self, table: int, txn: str, kind: str, partition: str) -> Write:
        note = self.note[table] or kind == "merge-schema"
        uri = self.uris[table]
        if kind == "row-level":
            return self._row_level(table, txn, partition, note)
        targets = PARTITIONS if kind in ("overwrite", "append") else (partition,)
        adds: dict[str, tuple[str, tuple[int, ...]]] = {}
        files = []
        for target in targets:
            rows = (next(self.ids),)
            file = self._data_file(table, f"_percolake/{txn}", target, rows, note)
            files.append(file)
            adds[file.path] = (target, rows)
        mode = {"append": WriteMode.APPEND, "merge-schema": WriteMode.APPEND,
                "overwrite": WriteMode.OVERWRITE,
                "overwrite-partition": WriteMode.OVERWRITE_PARTITIONS}[kind]
        record = TableWriteRecord(
            uri, mode, tuple(files), delta_schema(note), ("p",),
            ({"p": partition},) if kind == "overwrite-partition" else (),
            merge_schema=kind == "merge-schema")
        return Write(record, kind, adds)

    def _row_level(self, table: int, txn: str, partition: str, note: bool) -> Write:
        """A MERGE that read ``partition`` at the table's newest version: it rewrites the
        partition's first file (one row updated: a new id) or, with none, inserts a row."""
        held = sorted(f for f, (p, _) in self.files[table].items() if p == partition)
        removes: tuple[str, ...] = ()
        rows: tuple[int, ...] = (next(self.ids),)
        remove_records: tuple[RemoveFileRecord, ...] = ()
        if held:
            removes = (held[0],)
            kept = self.files[table][held[0]][1]
            rows = (*kept[1:], next(self.ids))
            size = (self._path(table) / held[0]).stat().st_size
            remove_records = (RemoveFileRecord(held[0], size, {"p": partition}),)
        file = self._data_file(table, f"_percolake/{txn}", partition, rows, note)
        record = TableWriteRecord(
            self.uris[table], WriteMode.ROW_LEVEL, (file,), delta_schema(note), ("p",),
            remove_files=remove_records, read_version=self._latest(table), operation="MERGE",
            operation_metrics="{}", operation_parameters="{}",
            read_set=ReadSet(WRITE_SERIALIZABLE,
                             {"column": "p", "op": "=", "value": partition}).to_json())
        return Write(record, "row-level", {file.path: (partition, rows)}, removes, partition)

    def _pending(self) -> list[tuple[str, int, Write]]:
        return [(txn, table, write) for txn, by_table in self.writes.items()
                for table, write in by_table.items()
                if write.landed is None and not write.quarantined]

    def _outside(self, table: int, partition: str | None, removed: tuple[str, ...] = (),
                 metadata: bool = False, data_change: bool = True) -> None:
        """What an outside commit means to each unapplied row-level write of ``table``."""
        for _, at, write in self._pending():
            if at != table or write.kind != "row-level" or write.conflict:
                continue
            if metadata:
                write.conflict = "an outside metadata change"
            elif any(f in write.removes for f in removed):
                write.conflict = "an outside commit removed a file the write removes"
            elif data_change and partition == write.read_partition:
                write.conflict = "an outside append to the partition the write read"

    # ------------------------------------------------------------------ batches

    @precondition(lambda self: not self._pending() and len(self.quarantined) < len(TABLES))
    @rule(kinds=st.lists(st.sampled_from(KINDS), min_size=2, max_size=2),
          partitions=st.lists(st.sampled_from(PARTITIONS), min_size=2, max_size=2),
          both=st.booleans(), first=st.sampled_from(TABLES))
    def commit_batch(self, kinds: list[str], partitions: list[str], both: bool,
                     first: int) -> None:
        """The next batch commits: its writes' secondaries are now due."""
        self.batch += 1
        txn = f"txn-{self.batch}"
        tables = [t for t in (TABLES if both else (first,)) if t not in self.quarantined]
        self.writes[txn] = {t: self._make_write(t, txn, kinds[t], partitions[t])
                            for t in tables}
        self.current = txn

    # ------------------------------------------------------------------ appliers

    def _start(self, applier: str, txn: str, table: int, stop_at: str | None) -> Run:
        run = Run(applier, txn, table, stop_at)
        cache = self.caches[applier]
        write = self.writes[txn][table]
        batch = int(txn.split("-")[1])

        def apply() -> None:
            _current.run = run
            try:
                run.version = apply_table_write(
                    write.record, app_id=APP_ID, app_version=batch, txn_id=txn,
                    commit_ts=batch, tables=None if cache is None else cache.tables)
            except BaseException as exc:  # noqa: BLE001  (judged by the model)
                run.error = exc
            finally:
                run.finished = True
                run.reached.set()

        self.runs[applier] = run
        threading.Thread(target=apply, name=f"applier-{applier}", daemon=True).start()
        self._wait(run)
        return run

    def _wait(self, run: Run) -> None:
        if not run.reached.wait(WAIT_S):
            raise Stopped(f"{run.applier} neither stopped nor finished in {WAIT_S} s")
        run.reached.clear()
        if run.finished:
            self._finished(run)

    def _finished(self, run: Run) -> None:
        self._scan()  # what it committed lands in the model first
        write = self.writes[run.txn][run.table]
        if isinstance(run.error, DeltaError) and "invalid table version" in \
                str(run.error).lower():
            # delta-rs's commit from a table loaded before log cleanup deleted its version's
            # entry fails (not a lost race): the caller retries later with the table loaded anew
            assert self.oldest[run.table] > 0, run.error
            self.caches[run.applier] = None if run.applier == "one-off" else TableCache()
            return
        if isinstance(run.error, FailpointError):
            self.caches[run.applier] = None if run.applier == "one-off" else TableCache()
            return
        if isinstance(run.error, CannotApplyAsRead):
            assert write.landed is None, (
                f"{run.applier} quarantined {run.txn} on table {run.table}, whose write is "
                f"applied at version {write.landed}: {run.error}")
            assert write.conflict, (f"{run.applier} quarantined {run.txn} on table {run.table}, "
                                    f"which the model can apply: {run.error}")
            write.quarantined = True
            self.quarantined.add(run.table)
            return
        cleaned = write.landed is not None and write.landed < self.oldest[run.table]
        batch = int(run.txn.split("-")[1])
        if isinstance(run.error, FailedPrecondition) and "cleaned up" in str(run.error):
            assert cleaned and self.app_version[run.table] > batch, run.error
            return
        if run.error is not None:
            raise run.error
        # its entry cleaned up, the oldest version still in the log holds it
        expected = self.oldest[run.table] if cleaned else write.landed
        assert run.version == expected, (
            f"{run.applier} reports {run.txn} on table {run.table} at version {run.version}, "
            f"the log holds it at {write.landed} (oldest entry left: {self.oldest[run.table]})")

    def _idle(self, applier: str) -> bool:
        run = self.runs.get(applier)
        return run is None or run.finished

    @precondition(lambda self: self.current is not None)
    @rule(applier=st.sampled_from(APPLIERS), table=st.sampled_from(TABLES),
          stop_at=st.sampled_from((*STOPS, None)))
    def start_apply(self, applier: str, table: int, stop_at: str | None) -> None:
        """An applier starts on the newest batch's write of a table (maybe applied already:
        a roll-forward after the driver, a replay)."""
        if not self._idle(applier) or table not in self.writes[self.current]:
            return
        self._start(applier, self.current, table, stop_at)

    @rule(applier=st.sampled_from(APPLIERS), stop_at=st.sampled_from((*STOPS, None)),
          crash=st.booleans())
    def go_on(self, applier: str, stop_at: str | None, crash: bool) -> None:
        """A stopped applier goes on (maybe to stop again later), or crashes where it is."""
        run = self.runs.get(applier)
        if run is None or run.finished:
            return
        run.stop_at, run.crash = stop_at, crash
        run.go.set()
        self._wait(run)

    @precondition(lambda self: bool(self._pending()))
    @rule()
    def finish_batch(self) -> None:
        """Whatever is stopped goes on to the end, then a roll-forward applies what is left:
        every write of the newest batch ends applied or quarantined."""
        for run in list(self.runs.values()):
            if not run.finished:
                run.stop_at, run.crash = None, False
                run.go.set()
                self._wait(run)
        for txn, table, _ in self._pending():
            self._start("roll-forward", txn, table, None)
        assert not self._pending()

    # ------------------------------------------------------------------ outside writers

    @rule(table=st.sampled_from(TABLES), partition=st.sampled_from(PARTITIONS))
    def outside_append(self, table: int, partition: str) -> None:
        """delta-rs appends a row (as any other Delta writer would)."""
        path = self._path(table)
        before = {a["path"] for a in pa.table(DeltaTable(str(path)).get_add_actions()).to_pylist()}
        row = next(self.ids)
        columns = {"id": pa.array([row], pa.int64()), "p": [partition]}
        if self.note[table]:
            columns["note"] = pa.array([None], pa.string())
        write_deltalake(str(path), pa.table(columns), mode="append")
        self._scan()
        added = [a["path"] for a in pa.table(DeltaTable(str(path)).get_add_actions()).to_pylist()
                 if a["path"] not in before]
        assert len(added) == 1, added
        self.files[table][added[0]] = (partition, (row,))
        self._outside(table, partition)

    @rule(table=st.sampled_from(TABLES), partition=st.sampled_from(PARTITIONS))
    def outside_optimize(self, table: int, partition: str) -> None:
        """An OPTIMIZE of one partition: its files' rows in one new file, ``dataChange=false``."""
        chosen = sorted(f for f, (p, _) in self.files[table].items() if p == partition)
        if len(chosen) < 2:
            return
        rows = tuple(r for f in chosen for r in self.files[table][f][1])
        file = self._data_file(table, "optimized", partition, rows, self.note[table])
        now = int(time.time() * 1000)
        actions = [{"commitInfo": {"timestamp": now, "operation": "OPTIMIZE",
                                   "engineInfo": "outside"}},
                   *({"remove": {"path": f, "dataChange": False, "deletionTimestamp": now,
                                 "partitionValues": {"p": partition},
                                 "size": (self._path(table) / f).stat().st_size}}
                     for f in chosen),
                   {"add": {"path": file.path, "partitionValues": {"p": partition},
                            "size": file.size, "modificationTime": now, "dataChange": False,
                            "stats": file.stats}}]
        self._commit_outside(table, actions)
        for f in chosen:
            del self.files[table][f]
        self.files[table][file.path] = (partition, rows)
        self._outside(table, partition, removed=tuple(chosen), data_change=False)

    @rule(table=st.sampled_from(TABLES))
    def outside_schema_change(self, table: int) -> None:
        """Another writer adds the note column (a metaData action)."""
        if self.note[table]:
            return
        delta = DeltaTable(str(self._path(table)))
        self._commit_outside(table, [
            {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "ADD COLUMNS",
                            "engineInfo": "outside"}},
            delta_commit.metadata_action(delta.metadata(), delta_schema(True))])
        self.note[table] = True
        self._outside(table, None, metadata=True)

    @rule(table=st.sampled_from(TABLES), count=st.integers(1, MAX_REPLAY + 2))
    def outside_empty_commits(self, table: int, count: int) -> None:
        """Commits of no file (puts kept tables behind, far behind past MAX_REPLAY)."""
        for _ in range(count):
            self._commit_outside(table, [{"commitInfo": {
                "timestamp": int(time.time() * 1000), "operation": "SET TBLPROPERTIES",
                "engineInfo": "outside"}}])

    def _commit_outside(self, table: int, actions: list[dict]) -> None:
        assert put_entry(self.uris[table], self._latest(table) + 1, actions)
        self._scan()

    @rule(table=st.sampled_from(TABLES))
    def checkpoint(self, table: int) -> None:
        write_checkpoint(self.uris[table], self._latest(table))

    @rule(table=st.sampled_from(TABLES))
    def take_lease(self, table: int) -> None:
        """A reader pins the newest version (a lease): it must stay readable as it is."""
        version = self._latest(table)
        self.leases.append((table, version, self._rows(table, version)))

    @rule(table=st.sampled_from(TABLES))
    def clean_log(self, table: int) -> None:
        """Log cleanup with every entry expired, keeping what the leases read."""
        keep_from = min([v for t, v, _ in self.leases if t == table] + [self._latest(table)])
        deleted = clean_log(self.uris[table], keep_from,
                            {"delta.logRetentionDuration": "interval 1 millisecond"},
                            now_ms=int(time.time() * 1000) + 60_000)
        versions = {int(name[:20]) for name in deleted if name.endswith(".json")}
        if versions:
            self.oldest[table] = max(versions) + 1
        for _, at, write in self._pending():  # the log after its read version is gone
            if at == table and write.kind == "row-level" and not write.conflict and \
                    write.record.read_version + 1 < self.oldest[table]:
                write.conflict = "the log after the read version is cleaned up"
        for leased, version, rows in self.leases:
            if leased == table:
                assert self._rows(table, version) == rows, f"leased version {version} changed"

    # ------------------------------------------------------------------ the log and the rows

    def _scan(self) -> None:
        """Reads the log entries written since the last scan: contiguous versions, each batch
        in at most one, the app transaction never lower; a write of ours lands in the model."""
        for table in TABLES:
            latest = self._latest(table)
            for version in range(self.scanned[table] + 1, latest + 1):
                entry = delta_commit.commit_file(self.uris[table], version)
                assert entry.is_file(), f"table {table}: version {version} missing below {latest}"
                actions = [json.loads(line) for line in entry.read_text().splitlines()]
                info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
                txn = info.get(delta_commit.TXN_ID_KEY)
                for action in actions:
                    if "txn" in action and action["txn"]["appId"] == APP_ID:
                        assert action["txn"]["version"] > self.app_version[table], (
                            f"table {table}: app transaction {action['txn']['version']} at "
                            f"version {version} after {self.app_version[table]}")
                        self.app_version[table] = action["txn"]["version"]
                if txn is not None:
                    self._landed(table, version, txn)
            self.scanned[table] = latest

    def _landed(self, table: int, version: int, txn: str) -> None:
        write = self.writes[txn][table]
        assert write.landed is None, (
            f"{txn} is in table {table} twice: versions {write.landed} and {version}")
        assert not write.quarantined, f"{txn} applied to table {table} after its quarantine"
        assert not write.conflict, (
            f"{txn} applied to table {table} at version {version} although it cannot be "
            f"applied as read: {write.conflict}")
        write.landed = version
        files = self.files[table]
        if write.kind == "overwrite":
            files.clear()
        elif write.kind == "overwrite-partition":
            replaced = write.record.replace_partitions[0]["p"]
            for name in [f for f, (p, _) in files.items() if p == replaced]:
                del files[name]
        for name in write.removes:
            del files[name]
        files.update(write.adds)
        if write.kind == "merge-schema":
            self.note[table] = True

    def _rows(self, table: int, version: int | None = None) -> list[tuple[int, str]]:
        read = read_delta_table(str(self._path(table)), version, ["id", "p"]).to_pylist()
        return sorted((r["id"], r["p"]) for r in read)

    @invariant()
    def tables_hold_the_model_s_rows(self) -> None:
        self._scan()
        for table in TABLES:
            expected = sorted((r, p) for p, rows in self.files[table].values() for r in rows)
            assert self._rows(table) == expected, f"table {table}"


ApplyModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("PERCOLAKE_MODEL_EXAMPLES", "12")), stateful_step_count=25,
    deadline=None, derandomize="PERCOLAKE_MODEL_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_apply_model = ApplyModel.TestCase
