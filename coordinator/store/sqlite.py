"""The embedded default store: one SQLite file in the data dir, WAL, synchronous=FULL.

Every batch is one SQLite transaction, so it reaches stable storage (the WAL is fsynced at
COMMIT under synchronous=FULL) before the coordinator replies (I8).

With ``group_commit=True`` (what the daemon uses) concurrent batches share one SQLite
transaction and so one COMMIT/fsync, as a database's group commit does: a batch becomes a
SAVEPOINT of the open group transaction (its own rollback undoes only its writes), and
``flush()`` makes every batch ended so far durable, one caller committing for all who wait.
The caller (the gRPC layer) calls ``flush()`` before every reply, so nothing is acknowledged
before its fsync (I8). A failed group COMMIT stops the process: the coordinator's memory may
already show writes that did not reach the disk, and a restart reloads the durable truth.

The fsync leaves the connection's lock: a group-committing store runs synchronous=NORMAL (the
COMMIT only writes the WAL) and ``flush()`` fsyncs the WAL file itself after the COMMIT, outside
the lock, before any caller it covers returns; so other requests' batches go on while the disk
syncs, instead of queueing behind it (and behind them the coordinator's lock). A checkpoint
syncs the WAL before it copies it (SQLite's rule under NORMAL), so what a flush covered is
never lost to a WAL restart. Under group commit SQLite never checkpoints inside a COMMIT:
``wal_checkpoints.WalCheckpointer`` does from its own thread and connection, and the serving
connection only once the WAL passes its bound. A single statement outside a batch is its own
atomic step (SQLite rolls back a failed statement alone), so it needs no savepoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from coordinator.auth_records import AclRecord, TokenRecord
from coordinator.store.base import (
    UNFINISHED_STATES,
    IndexView,
    LeaseRecord,
    ReadEdge,
    Store,
    TableCommit,
    TableWriter,
    TxnQuery,
)
from coordinator.store.schema import (
    PIPELINE_COLUMNS,
    QUARANTINE_COLUMNS,
    SELECT_TXN,
    SQLITE_MIGRATIONS,
    TABLE_COMMIT_COLUMNS,
    TXN_COLUMNS,
    TXN_IDENTITY_COLUMNS,
    TXN_UPDATED_COLUMNS,
    key_column,
    live_clauses,
    quarantine_from_row,
    quarantine_values,
    refuse_newer,
)
from coordinator.store.wal_checkpoints import WalCheckpointer
from percolake.errors import StoreConflict
from percolake.records import PipelineRecord, QuarantineRecord, TxnRecord

SCHEMA_VERSION = SQLITE_MIGRATIONS[-1].version
log = logging.getLogger("percolake.store")


# Only the columns a transition changes are set: SQLite rewrites the entries of every index
# whose columns an UPDATE names, so naming the identity columns (fixed at insert) would
# rewrite three indexes' entries per transition, for nothing (each is checked equal instead).
# The statements every transaction runs (its insert and updates, its pipeline's update) take
# positional parameters: Python 3.11's sqlite3 lets go of the GIL and takes it back around
# the lookup of each named parameter (a 17-parameter UPDATE alone: 2.5 µs named, 1.2 µs
# positional; docs/benchmarks.md).
_UPDATE_TXN = (
    f"UPDATE transactions SET {', '.join(f'{c} = ?' for c in TXN_UPDATED_COLUMNS)} "
    f"WHERE row_version = ? AND {' AND '.join(f'{c} = ?' for c in TXN_IDENTITY_COLUMNS)}")
_INSERT_TXN = (f"INSERT INTO transactions ({', '.join(TXN_COLUMNS)}) "
               f"VALUES ({', '.join('?' * len(TXN_COLUMNS))})")
_PIPELINE_UPDATED_COLUMNS = tuple(c for c in PIPELINE_COLUMNS if c != "pipeline_id")
_UPDATE_PIPELINE = (
    f"UPDATE pipelines SET {', '.join(f'{c} = ?' for c in _PIPELINE_UPDATED_COLUMNS)} "
    "WHERE pipeline_id = ? AND row_version = ?")

# the data of a file and its size (where the platform has no fdatasync, fsync)
_sync_data = getattr(os, "fdatasync", os.fsync)


def _fail_stop(path: Path, exc: BaseException) -> None:
    """A group COMMIT failed: never reply, never go on with memory ahead of the disk."""
    log.critical("group commit to %s failed (%s); stopping so a restart reloads the durable "
                 "state", path, exc)
    logging.shutdown()
    os._exit(70)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS pipelines (
    pipeline_id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    query_id TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    last_commit_ms INTEGER NOT NULL,
    resets TEXT NOT NULL,
    row_version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS transactions (
    txn_id TEXT PRIMARY KEY,
    pipeline_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    batch_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    query_id TEXT NOT NULL,
    state TEXT NOT NULL,
    start_ts INTEGER NOT NULL UNIQUE,
    commit_ts INTEGER NOT NULL,
    tables TEXT NOT NULL,
    abort_reason TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    row_version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS transactions_by_batch
    ON transactions (pipeline_id, generation, batch_id);
CREATE INDEX IF NOT EXISTS transactions_unfinished
    ON transactions (state) WHERE state IN ('OPEN', 'PREWRITTEN', 'COMMITTED');
CREATE INDEX IF NOT EXISTS transactions_by_pipeline_ts ON transactions (pipeline_id, start_ts);
CREATE INDEX IF NOT EXISTS transactions_by_state_created ON transactions (state, created_ms);
CREATE TABLE IF NOT EXISTS table_commits (
    table_uri TEXT NOT NULL,
    commit_ts INTEGER NOT NULL,
    txn_id TEXT NOT NULL,
    delta_version INTEGER,
    PRIMARY KEY (table_uri, commit_ts)
);
CREATE INDEX IF NOT EXISTS table_commits_unapplied
    ON table_commits (table_uri, commit_ts) WHERE delta_version IS NULL;
"""



class SqliteStore(Store):
    """SQLite in ``<data_dir>/coordinator.db``; one connection guarded by a lock."""

    def __init__(self, data_dir: str | Path, group_commit: bool = False) -> None:
        self.path = Path(data_dir) / "coordinator.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._depth = 0
        self._group_commit = False  # schema set-up below is committed at once
        self._in_group = False  # a group transaction is open on the connection
        self._ended = 0  # batches ended so far (sequence numbers)
        self._durable = 0  # batches durable so far
        self._flushing = False
        self._flushed = threading.Condition(threading.Lock())
        self._wal_fd: int | None = None  # the WAL file, fsynced by flush() (group commit)
        self._db_fd: int | None = None  # the database file, while there is no WAL file
        self._folder_synced = False
        self.group_commits = 0  # COMMITs that made batches durable (for benchmarks)
        self._checkpointer: WalCheckpointer | None = None  # group commit's, off the lock
        mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise RuntimeError(f"SQLite refused WAL mode (got {mode}) for {self.path}")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        with self.batch():
            for statement in filter(str.strip, _SCHEMA.split(";")):
                self._conn.execute(statement)
            row = self._conn.execute(
                "SELECT value FROM meta WHERE key='schema_version'").fetchone()
            found = 1 if row is None else row[0]  # none yet: the tables above are version 1
            refuse_newer(str(self.path), found, SCHEMA_VERSION)
            for migration in SQLITE_MIGRATIONS:  # an older schema: in this one transaction
                if migration.version > found:
                    for statement in migration.statements:
                        self._conn.execute(statement)
            self._conn.execute("INSERT INTO meta VALUES ('schema_version', ?) "
                               "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                               (max(found, SCHEMA_VERSION),))
        self._group_commit = group_commit
        if group_commit:  # flush() fsyncs the WAL itself, outside the lock
            self._conn.execute("PRAGMA synchronous=NORMAL")
            # checkpoints leave the COMMIT (and the lock): wal_checkpoints.py
            self._conn.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = WalCheckpointer(self.path)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            if self._group_commit:
                if not self._in_group:
                    self._conn.execute("BEGIN IMMEDIATE")
                    self._in_group = True
                # One batch is a savepoint of the open group transaction.
                yield from self._statement_batch(["SAVEPOINT batch"],
                                                 ["ROLLBACK TO batch", "RELEASE batch"],
                                                 ["RELEASE batch"])
                self._ended += 1
                return
            yield from self._statement_batch(["BEGIN IMMEDIATE"], ["ROLLBACK"], ["COMMIT"])

    def _statement_batch(self, begin: list[str], undo: list[str],
                         done: list[str]) -> Iterator[None]:
        """Runs ``begin``, yields, then ``done`` or (on any error) ``undo``; under the lock."""
        for sql in begin:
            self._conn.execute(sql)
        self._depth = 1
        try:
            yield
        except BaseException:
            for sql in undo:
                self._conn.execute(sql)
            raise
        else:
            for sql in done:
                self._conn.execute(sql)
        finally:
            self._depth = 0

    def flush(self) -> None:
        """Returns once every batch ended before the call is durable (group commit)."""
        if not self._group_commit:
            return
        target = self._ended
        with self._flushed:
            while self._durable < target:
                if not self._flushing:
                    self._flushing = True
                    break
                self._flushed.wait()
            else:
                return
        try:
            with self._lock:
                upto = self._ended
                self._commit_group_or_stop()
            self._sync_wal_or_stop()  # outside the lock: new batches go on meanwhile
        except BaseException:
            with self._flushed:
                self._flushing = False
                self._flushed.notify_all()
            raise
        # The waiters are woken once, with what this flush covered already durable: a waiter
        # woken before (the flush marked over, its batches not yet counted durable) would
        # take over as the flusher and sync again for nothing.
        with self._flushed:
            self._durable = max(self._durable, upto)
            self._flushing = False
            self._flushed.notify_all()

    def _commit_group_or_stop(self) -> None:
        """COMMITs the open group transaction; if the disk refuses, the process stops."""
        try:
            self._commit_group()
        except BaseException as exc:  # memory may be ahead of the disk: never go on
            _fail_stop(self.path, exc)
            raise

    def _commit_group(self) -> None:
        """COMMITs the open group transaction (under the lock): the WAL is written, and
        durable once ``_sync_wal`` returns."""
        if self._in_group:
            self._conn.execute("COMMIT")
            self._in_group = False
            self.group_commits += 1
            if self._checkpointer is not None:
                self._checkpointer.committed()
                if self._checkpointer.restart_due:
                    self._restart_wal()

    def _restart_wal(self) -> None:
        """A checkpoint on the serving connection right after its COMMIT (under the lock, so
        nothing is appended meanwhile): it copies what the background passes left, and the
        next transaction writes the WAL from its start (wal_checkpoints.py)."""
        try:
            busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:  # committed data is safe; the WAL grows until the next
            log.warning("WAL checkpoint after a commit failed: %s", exc)
            busy = False
        self._checkpointer.restarted(bool(busy))

    def _sync_wal_or_stop(self) -> None:
        """Syncs the WAL file: every COMMIT made before is on stable storage after it.

        fdatasync, as SQLite's own WAL syncs on Linux: the data and what reading it back
        needs (the file's size), without the timestamps fsync would also journal."""
        try:
            fd = self._wal()
            if not self._folder_synced:  # once: the WAL file's own name is durable too
                folder = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
                self._folder_synced = True
            _sync_data(fd)
        except BaseException as exc:  # what was committed may not be durable: never go on
            _fail_stop(self.path, exc)
            raise

    def _wal(self) -> int:
        """The WAL file's descriptor, opened on first use; the database file's while there is
        no WAL file."""
        if self._wal_fd is not None:
            return self._wal_fd
        with self._lock:  # opened once, whoever syncs first
            if self._wal_fd is None:
                try:
                    self._wal_fd = os.open(f"{self.path}-wal", os.O_RDONLY)
                except FileNotFoundError:  # everything is in the database file
                    if self._db_fd is None:
                        self._db_fd = os.open(self.path, os.O_RDONLY)
                    return self._db_fd
            return self._wal_fd

    def close(self) -> None:
        with self._lock:
            if self._group_commit:
                self._commit_group()
                _sync_data(self._wal())
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
            self._conn.close()
            for fd in (self._wal_fd, self._db_fd):
                if fd is not None:
                    os.close(fd)
            self._wal_fd = self._db_fd = None

    def _write(self, sql: str, params: tuple | dict) -> int:
        with self._lock:
            if self._group_commit and not self._depth:  # one statement: atomic by itself
                if not self._in_group:
                    self._conn.execute("BEGIN IMMEDIATE")
                    self._in_group = True
                count = self._conn.execute(sql, params).rowcount
                self._ended += 1
                return count
        with self.batch():
            return self._conn.execute(sql, params).rowcount

    def _write_many(self, sql: str, rows: list[tuple]) -> int:
        """One statement run for each row, in one step; the rows changed."""
        with self.batch():
            return self._conn.executemany(sql, rows).rowcount

    def _read(self, sql: str, params: tuple | dict = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def read_timestamp_high_water(self) -> int:
        rows = self._read("SELECT value FROM meta WHERE key='ts_high_water'")
        return rows[0][0] if rows else 0

    def write_timestamp_high_water(self, value: int) -> None:
        with self._lock:
            self._write(
                "INSERT INTO meta VALUES ('ts_high_water', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=max(value, excluded.value)",
                (value,),
            )
            in_batch = self._depth > 0
        if self._group_commit and not in_batch:
            # The mark is durable before any timestamp under it is handed out, whatever the
            # group holds (committing other pending batches early is harmless); the fsync is
            # made outside the lock, as every flush's.
            self.flush()

    def load_pipelines(self) -> list[PipelineRecord]:
        rows = self._read(f"SELECT {', '.join(PIPELINE_COLUMNS)} FROM pipelines")
        return [PipelineRecord.from_row(dict(r)) for r in rows]

    def insert_pipeline(self, record: PipelineRecord) -> None:
        row = record.to_row()
        try:
            self._write(
                f"INSERT INTO pipelines ({', '.join(PIPELINE_COLUMNS)}) "
                f"VALUES ({', '.join(':' + c for c in PIPELINE_COLUMNS)})",
                row,
            )
        except sqlite3.IntegrityError as exc:
            raise StoreConflict(f"pipeline {record.pipeline_id} exists") from exc

    def update_pipeline(self, record: PipelineRecord) -> None:
        row = record.to_row()
        row["row_version"] = record.row_version + 1
        count = self._write(_UPDATE_PIPELINE, (*[row[c] for c in _PIPELINE_UPDATED_COLUMNS],
                                               record.pipeline_id, record.row_version))
        if count != 1:
            raise StoreConflict(f"pipeline {record.pipeline_id} changed underneath")
        record.row_version += 1

    def insert_txn(self, record: TxnRecord) -> None:
        try:
            row = record.to_row()
            self._write(_INSERT_TXN, tuple(row[c] for c in TXN_COLUMNS))
        except sqlite3.IntegrityError as exc:
            raise StoreConflict(f"transaction {record.txn_id} exists: {exc}") from exc

    def update_txn(self, record: TxnRecord) -> None:
        row = record.to_row()
        row["row_version"] = record.row_version + 1
        count = self._write(_UPDATE_TXN, (*[row[c] for c in TXN_UPDATED_COLUMNS],
                                          record.row_version,
                                          *[row[c] for c in TXN_IDENTITY_COLUMNS]))
        if count != 1:
            raise StoreConflict(f"transaction {record.txn_id} changed underneath (or its "
                                f"identity differs: {', '.join(TXN_IDENTITY_COLUMNS)})")
        record.row_version += 1

    def _txns(self, where: str, params: tuple | dict = (), tail: str = "") -> list[TxnRecord]:
        rows = self._read(f"{SELECT_TXN} WHERE {where} {tail}", params)
        return [TxnRecord.from_row(dict(r)) for r in rows]

    def get_txn(self, txn_id: str) -> TxnRecord | None:
        found = self._txns("txn_id = ?", (txn_id,))
        return found[0] if found else None

    def attempts_of(self, pipeline_id: str, generation: int, batch_id: int) -> list[TxnRecord]:
        # The unary + keeps the planner on the batch's index: ordered by the (pipeline_id,
        # start_ts) index it would walk every transaction of the pipeline on each Open, a cost
        # growing with its history (the few attempts of one batch are sorted instead).
        return self._txns(
            "pipeline_id = ? AND generation = ? AND batch_id = ?",
            (pipeline_id, generation, batch_id),
            "ORDER BY +start_ts",
        )

    def newest_committed_batch(self, pipeline_id: str, generation: int) -> int | None:
        rows = self._read(
            "SELECT batch_id FROM transactions WHERE pipeline_id = ? AND generation = ? "
            "AND state IN ('COMMITTED', 'APPLIED') ORDER BY batch_id DESC LIMIT 1",
            (pipeline_id, generation))
        return rows[0]["batch_id"] if rows else None

    def unfinished_txns(self) -> list[TxnRecord]:
        states = tuple(s.value for s in UNFINISHED_STATES)
        return self._txns(f"state IN ({', '.join('?' * len(states))})", states, "ORDER BY start_ts")

    def list_txns(self, query: TxnQuery) -> list[TxnRecord]:
        clauses = ["start_ts > ?", "created_ms >= ?"]
        params: list[object] = [query.after_start_ts, query.created_after_ms]
        if query.pipeline_id:
            clauses.append("pipeline_id = ?")
            params.append(query.pipeline_id)
        if query.generation is not None:
            clauses.append("generation = ?")
            params.append(query.generation)
        if query.batch_id is not None:
            clauses.append("batch_id = ?")
            params.append(query.batch_id)
        if query.created_before_ms:
            clauses.append("created_ms < ?")
            params.append(query.created_before_ms)
        if query.states:
            clauses.append(f"state IN ({', '.join('?' * len(query.states))})")
            params.extend(s.value for s in query.states)
        return self._txns(" AND ".join(clauses), tuple(params),
                          f"ORDER BY start_ts LIMIT {int(query.limit)}")

    def add_table_commit(self, commit: TableCommit) -> None:
        try:
            self._write(
                f"INSERT INTO table_commits ({TABLE_COMMIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (commit.table, commit.commit_ts, commit.txn_id, commit.delta_version,
                 commit.input_barrier, commit.superseded_ts, int(commit.restore)),
            )
        except sqlite3.IntegrityError as exc:
            raise StoreConflict(f"table commit {commit} exists") from exc

    def add_table_commits(self, commits: Sequence[TableCommit]) -> None:
        try:
            self._write_many(
                f"INSERT INTO table_commits ({TABLE_COMMIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(c.table, c.commit_ts, c.txn_id, c.delta_version, c.input_barrier,
                  c.superseded_ts, int(c.restore)) for c in commits])
        except sqlite3.IntegrityError as exc:
            raise StoreConflict(f"a table commit of {commits} exists") from exc

    def set_table_commit_versions(self, versions: Sequence[tuple[str, int, int]]) -> None:
        count = self._write_many(
            "UPDATE table_commits SET delta_version = ? WHERE table_uri = ? AND commit_ts = ?",
            [(version, table, commit_ts) for table, commit_ts, version in versions])
        if count != len(versions):
            raise StoreConflict(f"no table commit for some of {versions}")

    def set_table_commit_version(self, table: str, commit_ts: int, delta_version: int) -> None:
        count = self._write(
            "UPDATE table_commits SET delta_version = ? WHERE table_uri = ? AND commit_ts = ?",
            (delta_version, table, commit_ts),
        )
        if count != 1:
            raise StoreConflict(f"no table commit ({table}, {commit_ts})")

    def table_commit_at(self, table: str, max_commit_ts: int) -> TableCommit | None:
        rows = self._read(
            f"SELECT {TABLE_COMMIT_COLUMNS} FROM table_commits "
            "WHERE table_uri = ? AND commit_ts <= ? ORDER BY commit_ts DESC LIMIT 1",
            (table, max_commit_ts),
        )
        return TableCommit(*rows[0]) if rows else None

    def table_commits_at(self, tables: Sequence[str], max_commit_ts: int) -> IndexView:
        with self._lock, self._read_view():
            return IndexView(self.retention_floor_ts(),
                             {t: self.table_commit_at(t, max_commit_ts) for t in tables})

    @contextlib.contextmanager
    def _read_view(self) -> Iterator[None]:
        """One read transaction, under the lock; inside an open transaction, that one (its
        own pending writes included, as every read of this connection sees them)."""
        if self._conn.in_transaction:
            yield
            return
        self._conn.execute("BEGIN")
        try:
            yield
        finally:
            self._conn.execute("ROLLBACK")

    def unapplied_table_commits(self, table: str, max_commit_ts: int) -> list[TableCommit]:
        rows = self._read(
            f"SELECT {TABLE_COMMIT_COLUMNS} FROM table_commits "
            "WHERE table_uri = ? AND commit_ts <= ? AND delta_version IS NULL ORDER BY commit_ts",
            (table, max_commit_ts),
        )
        return [TableCommit(*r) for r in rows]

    def _commits_where(self, table: str, condition: str, params: tuple, tail: str,
                       as_of_ts: int | None, changes: bool) -> list[TableCommit]:
        clauses = [condition, *live_clauses(as_of_ts, changes, "?")]
        if as_of_ts is not None:
            params = (*params, as_of_ts, as_of_ts)
        rows = self._read(
            f"SELECT {TABLE_COMMIT_COLUMNS} FROM table_commits WHERE table_uri = ? "
            f"AND {' AND '.join(clauses)} {tail}", (table, *params))
        return [TableCommit(*r) for r in rows]

    def table_commits_in_range(self, table: str, after: int, upto: int,
                               by_input_barrier: bool,
                               as_of_ts: int | None = None) -> list[TableCommit]:
        key = key_column(by_input_barrier)
        return self._commits_where(table, f"{key} > ? AND {key} <= ?", (after, upto),
                                   "ORDER BY commit_ts", as_of_ts, True)

    def table_commit_at_barrier(self, table: str, barrier: int, by_input_barrier: bool,
                                as_of_ts: int | None = None) -> TableCommit | None:
        # keyed by input barrier: not an index of it (every row <= barrier, then sorted) but
        # the primary key from the newest commit down, stopping at the first match (a barrier
        # is nearly always recent; a table's keys rise with commit_ts)
        found = self._commits_where(table, f"{key_column(by_input_barrier)} <= ?", (barrier,),
                                    "ORDER BY commit_ts DESC LIMIT 1", as_of_ts, False)
        return found[0] if found else None

    def first_table_commit_after(self, table: str, after: int, by_input_barrier: bool,
                                 as_of_ts: int | None = None) -> TableCommit | None:
        found = self._commits_where(table, f"{key_column(by_input_barrier)} > ?", (after,),
                                    "ORDER BY commit_ts LIMIT 1", as_of_ts, True)
        return found[0] if found else None

    def last_input_barrier(self, pipeline_id: str, generation: int) -> int:
        # from the top of the generation's input barriers down (an index, not every attempt):
        # only the attempts of its next batch can lie above its newest committed one
        rows = self._read(
            "SELECT input_barrier FROM transactions WHERE pipeline_id = ? AND generation = ? "
            "AND input_barrier > 0 AND state IN ('COMMITTED', 'APPLIED') "
            "ORDER BY input_barrier DESC LIMIT 1", (pipeline_id, generation))
        return rows[0][0] if rows else 0

    def newest_commit_at_or_before(self, pipeline_id: str, max_commit_ts: int) -> TxnRecord | None:
        found = self._txns("pipeline_id = ? AND commit_ts > 0 AND commit_ts <= ? "
                           "AND state IN ('COMMITTED', 'APPLIED')", (pipeline_id, max_commit_ts),
                           "ORDER BY commit_ts DESC LIMIT 1")
        return found[0] if found else None

    def first_unapplied_input_barrier(self, table: str,
                                      as_of_ts: int | None = None) -> int | None:
        clauses = " AND ".join(live_clauses(as_of_ts, False, "?"))
        rows = self._read(
            f"SELECT MIN({key_column(True)}) FROM table_commits WHERE table_uri = ? "
            f"AND delta_version IS NULL AND {clauses}",
            (table,) if as_of_ts is None else (table, as_of_ts, as_of_ts))
        return rows[0][0]

    def newest_restore(self, table: str, as_of_ts: int | None = None) -> int:
        rows = self._read(
            "SELECT MAX(commit_ts) FROM table_commits WHERE table_uri = ? "
            "AND restore AND commit_ts <= ?",
            (table, (1 << 63) - 1 if as_of_ts is None else as_of_ts))
        return rows[0][0] or 0

    def supersede_table_commits(self, table: str, revision_ts: int,
                                above_input_barrier: int) -> int:
        return self._write(
            "UPDATE table_commits SET superseded_ts = ? WHERE table_uri = ? AND commit_ts < ? "
            "AND input_barrier > 0 AND input_barrier > ? AND superseded_ts = 0",
            (revision_ts, table, revision_ts, above_input_barrier))

    def insert_lease(self, lease: LeaseRecord) -> None:
        try:
            self._write("INSERT INTO leases (lease_id, holder, tables, barrier_ts, created_ms, "
                        "expires_ms, principal) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (lease.lease_id, lease.holder, lease.tables_json(), lease.barrier_ts,
                         lease.created_ms, lease.expires_ms, lease.principal))
        except sqlite3.IntegrityError as exc:
            raise StoreConflict(f"lease {lease.lease_id} exists") from exc

    def delete_lease(self, lease_id: str) -> bool:
        return self._write("DELETE FROM leases WHERE lease_id = ?", (lease_id,)) == 1

    def load_leases(self) -> list[LeaseRecord]:
        rows = self._read("SELECT lease_id, holder, tables, barrier_ts, created_ms, expires_ms, "
                          "principal FROM leases ORDER BY lease_id")
        return [LeaseRecord(r[0], r[1], LeaseRecord.tables_from_json(r[2]), *r[3:])
                for r in rows]

    def delete_expired_leases(self, now_ms: int) -> int:
        return self._write("DELETE FROM leases WHERE expires_ms <= ?", (now_ms,))

    def retention_floor_ts(self) -> int:
        rows = self._read("SELECT value FROM meta WHERE key='retention_floor_ts'")
        return rows[0][0] if rows else 0

    def prune(self, cutoff_ms: int, floor_ts: int, limit: int,
              keep: frozenset[str] = frozenset()) -> tuple[int, int]:
        with self._lock, self.batch():
            doomed = self._prunable_txns(cutoff_ms, limit, keep)
            self._conn.executemany("DELETE FROM transactions WHERE txn_id = ?",
                                   [(t,) for t in doomed])
            index_rows = 0
            for table in self._tables_indexed():
                if index_rows >= limit:
                    break
                index_rows += self._conn.execute(
                    "DELETE FROM table_commits WHERE rowid IN (SELECT rowid FROM table_commits "
                    "WHERE table_uri = ?1 AND delta_version IS NOT NULL AND commit_ts < ("
                    "SELECT MAX(commit_ts) FROM table_commits WHERE table_uri = ?1 "
                    "AND commit_ts <= ?2) LIMIT ?3)", (table, floor_ts, limit - index_rows)
                ).rowcount
            self._conn.execute(
                "INSERT INTO meta VALUES ('retention_floor_ts', ?) ON CONFLICT(key) DO UPDATE "
                "SET value = max(value, excluded.value)", (floor_ts,))
            return len(doomed), index_rows

    def _prunable_txns(self, cutoff_ms: int, limit: int, keep: frozenset[str]) -> list[str]:
        """The oldest ``limit`` prunable transactions (see ``Store.prune``), under the lock.

        The query itself leaves out each (pipeline, generation)'s newest committed batch, so
        kept rows never fill the candidates however many precede the prunable ones; only the
        ``keep`` set is filtered here, and ``len(keep)`` extra rows cover it. Candidates come
        from the start_ts index, oldest first: a transaction is created before it is updated,
        so every candidate has start_ts below the cutoff's timestamp. The unary ``+`` keeps
        the planner off the (state, created_ms) index, which would read and sort every old row.
        """
        rows = self._conn.execute(
            "SELECT txn_id FROM transactions AS t WHERE start_ts < ? "
            "AND +state IN ('APPLIED', 'ABORTED') AND updated_ms < ? AND +created_ms < ? "
            "AND (state = 'ABORTED' OR EXISTS (SELECT 1 FROM transactions AS n "
            "WHERE n.pipeline_id = t.pipeline_id AND n.generation = t.generation "
            "AND n.batch_id > t.batch_id AND n.state IN ('APPLIED', 'COMMITTED')) "
            "AND (t.input_barrier = 0 OR EXISTS (SELECT 1 FROM transactions AS m "
            "WHERE m.pipeline_id = t.pipeline_id AND m.generation = t.generation "
            "AND m.batch_id > t.batch_id AND m.state IN ('APPLIED', 'COMMITTED') "
            "AND m.input_barrier > 0))) "
            "ORDER BY start_ts LIMIT ?",
            ((cutoff_ms << 18) + 1, cutoff_ms, cutoff_ms, limit + len(keep))).fetchall()
        return [txn_id for (txn_id,) in rows if txn_id not in keep][:limit]

    def _tables_indexed(self) -> Iterator[str]:
        """Every table of the snapshot index, one index seek each (a skip-scan)."""
        table = ""
        while True:
            row = self._conn.execute(
                "SELECT table_uri FROM table_commits WHERE table_uri > ? ORDER BY table_uri "
                "LIMIT 1", (table,)).fetchone()
            if row is None:
                return
            table = row[0]
            yield table

    def load_tokens(self) -> list[TokenRecord]:
        rows = self._read("SELECT token_id, secret_hash, principal, created_ms, revoked_ms, "
                          "description FROM tokens ORDER BY token_id")
        return [TokenRecord(**dict(r)) for r in rows]

    def insert_token(self, record: TokenRecord) -> None:
        try:
            self._write("INSERT INTO tokens (token_id, secret_hash, principal, description, "
                        "created_ms, revoked_ms) VALUES (?, ?, ?, ?, ?, ?)",
                        (record.token_id, record.secret_hash, record.principal,
                         record.description, record.created_ms, record.revoked_ms))
        except sqlite3.IntegrityError as exc:
            raise StoreConflict(f"token {record.token_id} exists") from exc

    def revoke_token(self, token_id: str, revoked_ms: int) -> TokenRecord | None:
        with self._lock, self.batch():
            self._write("UPDATE tokens SET revoked_ms = ? WHERE token_id = ? AND revoked_ms = 0",
                        (revoked_ms, token_id))
            found = [t for t in self.load_tokens() if t.token_id == token_id]
            return found[0] if found else None

    def load_acl(self) -> list[AclRecord]:
        rows = self._read("SELECT principal, resource, pattern, permission, created_ms "
                          "FROM acl_entries ORDER BY principal, resource, pattern, permission")
        return [AclRecord.from_row(dict(r)) for r in rows]

    def insert_acl(self, entry: AclRecord) -> bool:
        return self._write(
            "INSERT INTO acl_entries (principal, resource, pattern, permission, created_ms) "
            "VALUES (:principal, :resource, :pattern, :permission, :created_ms) "
            "ON CONFLICT DO NOTHING", entry.to_row()) == 1

    def delete_acl(self, entry: AclRecord) -> bool:
        return self._write(
            "DELETE FROM acl_entries WHERE principal = ? AND resource = ? AND pattern = ? "
            "AND permission = ?", entry.key) == 1

    def load_table_writers(self) -> list[TableWriter]:
        rows = self._read("SELECT table_uri, pipeline_id, registered_ms FROM table_writers "
                          "ORDER BY table_uri")
        return [TableWriter(*r) for r in rows]

    def insert_table_writer(self, writer: TableWriter) -> None:
        try:
            self._write("INSERT INTO table_writers (table_uri, pipeline_id, registered_ms) "
                        "VALUES (?, ?, ?)", (writer.table, writer.pipeline_id,
                                             writer.registered_ms))
        except sqlite3.IntegrityError as exc:
            raise StoreConflict(f"table {writer.table} has an owner") from exc

    def load_read_edges(self) -> list[ReadEdge]:
        rows = self._read("SELECT pipeline_id, table_uri, registered_ms, since_ts "
                          "FROM read_edges ORDER BY pipeline_id, table_uri")
        return [ReadEdge(*r) for r in rows]

    def insert_read_edge(self, edge: ReadEdge) -> bool:
        return self._write(
            "INSERT INTO read_edges (pipeline_id, table_uri, registered_ms, since_ts) "
            "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (edge.pipeline_id, edge.table, edge.registered_ms, edge.since_ts)) == 1

    def load_quarantines(self) -> list[QuarantineRecord]:
        rows = self._read(f"SELECT {QUARANTINE_COLUMNS} FROM quarantines "
                          "ORDER BY table_uri, quarantined_ms, txn_id")
        return [quarantine_from_row(dict(r)) for r in rows]

    def put_quarantine(self, record: QuarantineRecord) -> None:
        self._write(f"INSERT OR REPLACE INTO quarantines ({QUARANTINE_COLUMNS}) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", quarantine_values(record))
