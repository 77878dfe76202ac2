"""The PostgreSQL store: several coordinator processes on one database, one of them the leader.

Same semantics as :class:`~coordinator.store.sqlite.SqliteStore`: compare-and-set on
``row_version`` checked by row count. Every write of a thread's outermost ``batch()`` is one
PostgreSQL transaction, committed when the batch ends (``synchronous_commit=on``: durable then);
a write outside a batch is a transaction of its own; ``flush()`` has nothing to do. A batch's
connection belongs to its thread and its reads run on it (they see the batch's writes); reads
outside a batch borrow a pool connection.

Fencing: a write transaction begins ``SELECT epoch FROM leader_lease ... FOR KEY SHARE`` and
is refused (:class:`~percolake.errors.NotLeader`, rolled back) unless the epoch is the one this
store acquired. An acquisition locks the row ``FOR UPDATE``, which conflicts with those share
locks: it waits until every write transaction that passed the check has ended, and every later
one sees its new epoch. (A renewal's UPDATE takes ``FOR NO KEY UPDATE``, which does not conflict
with ``FOR KEY SHARE``: the leader's own writes never hold its renewals up.) Every connection
has ``idle_in_transaction_session_timeout``, so a paused process cannot hold its share lock, and
so block a takeover, for longer than that; an acquisition waits at most ``lock_timeout``.
Lease times are the database's ``clock_timestamp()``: the coordinators' clocks never matter.

Errors: a connection refused, cut or timed out raises
:class:`~percolake.errors.StoreUnavailable` naming the store's host (never its password); the
broken connection leaves the pool, and a statement that had not yet done anything (the first of
a transaction) is tried once more on a fresh connection.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from coordinator.auth_records import AclRecord, TokenRecord
from coordinator.store.base import (
    UNFINISHED_STATES,
    IndexView,
    Lease,
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
    TABLE_COMMIT_COLUMNS,
    TXN_COLUMNS,
    TXN_IDENTITY_COLUMNS,
    key_column,
    live_clauses,
    migrate_postgres,
    quarantine_from_row,
    quarantine_values,
)
from percolake.errors import NotLeader, StoreConflict, StoreUnavailable
from percolake.records import PipelineRecord, QuarantineRecord, TxnRecord

T = TypeVar("T")

_UNFINISHED = ", ".join(f"'{s.value}'" for s in UNFINISHED_STATES)
_BEGIN_FENCED = "BEGIN; SELECT epoch FROM leader_lease WHERE id = 1 FOR KEY SHARE"
_READ_LEASE = ("SELECT holder, epoch, address, "
               "EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8 "
               "FROM leader_lease WHERE id = 1")
_INDEX_VIEW = """
SELECT (SELECT value FROM meta WHERE key = 'retention_floor_ts'),
       c.table_uri, c.commit_ts, c.txn_id, c.delta_version, c.input_barrier, c.superseded_ts,
       c.restore
FROM unnest(%s::text[]) WITH ORDINALITY AS u(uri, ord)
LEFT JOIN LATERAL (
    SELECT table_uri, commit_ts, txn_id, delta_version, input_barrier, superseded_ts, restore
    FROM table_commits
    WHERE table_uri = u.uri AND commit_ts <= %s ORDER BY commit_ts DESC LIMIT 1) AS c ON true
ORDER BY u.ord"""
_TABLES_INDEXED = """
WITH RECURSIVE uris(uri) AS (
    (SELECT table_uri FROM table_commits ORDER BY table_uri LIMIT 1)
    UNION ALL
    SELECT (SELECT table_uri FROM table_commits WHERE table_uri > uris.uri
            ORDER BY table_uri LIMIT 1)
    FROM uris WHERE uris.uri IS NOT NULL)
SELECT uri FROM uris WHERE uri IS NOT NULL"""


def describe(dsn: str) -> str:
    """``host:port/dbname`` of a DSN, for messages (never the password)."""
    params = conninfo_to_dict(dsn)
    return (f"{params.get('host') or params.get('hostaddr') or 'localhost'}:"
            f"{params.get('port') or 5432}/{params.get('dbname') or params.get('user') or '?'}")


@dataclass
class _Txn:
    """This thread's batch: its depth, its connection, whether its write transaction began."""

    depth: int = 0
    conn: psycopg.Connection | None = None
    writing: bool = False


class PostgresStore(Store):
    """See the module docstring. ``dsn`` is a libpq URL or key=value string."""

    supports_leases = True

    def __init__(self, dsn: str, *, pool_max: int = 8, lease_lock_timeout_s: float = 1.0,
                 idle_in_txn_timeout_s: float = 2.0, connect_timeout_s: float = 3.0) -> None:
        params = conninfo_to_dict(dsn)
        self.where = describe(dsn)
        self._password = str(params.get("password") or "")
        self._lock_timeout_ms = max(1, round(lease_lock_timeout_s * 1000))
        self._fencing_epoch: int | None = None
        self._local = threading.local()
        settings = (f"-c idle_in_transaction_session_timeout="
                    f"{max(1, round(idle_in_txn_timeout_s * 1000))} -c synchronous_commit=on")
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(2, math.ceil(connect_timeout_s)),
            "options": f"{params.get('options', '')} {settings}".strip(),
        }
        # A vanished store host must not hang a call for the kernel's TCP timeouts.
        for name, value in (("keepalives", 1), ("keepalives_idle", 5),
                            ("keepalives_interval", 2), ("keepalives_count", 3),
                            ("tcp_user_timeout", 10_000)):
            if name not in params:
                kwargs[name] = value
        with self._unavailable("connecting"), psycopg.connect(dsn, **kwargs) as conn:
            migrate_postgres(conn, self.where)
        # reconnect_timeout: while the server is down the pool gives up on a replacement after
        # this long, and the next call asks again at once (no backoff growing to minutes).
        self._pool: ConnectionPool = ConnectionPool(
            dsn, kwargs=kwargs, min_size=1, max_size=pool_max, timeout=connect_timeout_s,
            reconnect_timeout=connect_timeout_s, name=f"percolake-store {self.where}", open=True)

    def __repr__(self) -> str:
        return f"PostgresStore({self.where}, epoch={self._fencing_epoch})"

    def close(self) -> None:
        self._pool.close()

    # ------------------------------------------------------------------ transactions

    def _state(self) -> _Txn:
        state = getattr(self._local, "txn", None)
        if state is None:
            state = self._local.txn = _Txn()
        return state

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        state = self._state()
        state.depth += 1
        if state.depth > 1:
            try:
                yield
            finally:
                state.depth -= 1
            return
        try:
            yield
        except BaseException:
            self._end(state, commit=False)
            raise
        else:
            self._end(state, commit=True)
        finally:
            state.depth = 0

    def _end(self, state: _Txn, commit: bool) -> None:
        """Commits (or rolls back) the batch's transaction and returns its connection."""
        conn, writing = state.conn, state.writing
        state.conn, state.writing = None, False
        if conn is None:
            return
        try:
            status = conn.info.transaction_status
            if commit and writing:
                with self._unavailable("committing", conn):
                    # COMMIT of a failed transaction would answer ROLLBACK, not an error
                    if status == TransactionStatus.INERROR:
                        conn.execute("ROLLBACK")
                        raise StoreConflict("a statement of the batch failed, so the batch "
                                            "was rolled back: re-read and retry")
                    conn.execute("COMMIT")
            elif status != TransactionStatus.IDLE and not conn.broken:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
        finally:
            self._give_back(conn)

    def _give_back(self, conn: psycopg.Connection) -> None:
        """Returns a connection to the pool, which drops it if it is broken."""
        with contextlib.suppress(psycopg.Error):
            self._pool.putconn(conn)

    @contextlib.contextmanager
    def _unavailable(self, doing: str, conn: psycopg.Connection | None = None) -> Iterator[None]:
        """Turns a lost or refused connection into StoreUnavailable (never naming secrets)."""
        try:
            yield
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError) or (conn is not None and conn.broken):
                raise self._unavailable_error(doing, exc) from exc
            raise

    def _unavailable_error(self, doing: str, exc: BaseException) -> StoreUnavailable:
        message = " ".join(str(exc).split()) or type(exc).__name__
        if self._password:
            message = message.replace(self._password, "***")
        return StoreUnavailable(f"PostgreSQL store at {self.where} unavailable ({doing}): "
                                f"{message}")

    def _first(self, state: _Txn, doing: str, run: Callable[[psycopg.Connection], T]) -> T:
        """``run(conn)``, the first statement on ``state``'s connection (borrowed if it has
        none) with no transaction open: nothing was done if it fails, so a connection found
        broken (e.g. cut while idle in the pool) is replaced and ``run`` tried once more."""
        for again in (True, False):
            if state.conn is None:
                with self._unavailable(f"{doing}: connecting"):
                    state.conn = self._pool.getconn()
            conn = state.conn
            try:
                return run(conn)
            except psycopg.Error as exc:
                if not (isinstance(exc, psycopg.OperationalError) or conn.broken):
                    raise
                if not (again and conn.broken):
                    raise self._unavailable_error(doing, exc) from exc
                state.conn = None
                self._give_back(conn)
                self._pool.check()  # drop the pool's other dead connections too
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _own_connection(self) -> Iterator[_Txn]:
        """A connection of a call's own (not the thread's batch), returned afterwards."""
        state = _Txn(depth=1)
        try:
            yield state
        finally:
            self._end(state, commit=False)

    def _read(self, sql: str, params: Sequence | dict = (), *,
              dicts: bool = False) -> list[Any]:
        def run(conn: psycopg.Connection) -> list[Any]:
            cursor = conn.cursor(row_factory=dict_row) if dicts else conn.cursor()
            return cursor.execute(sql, params).fetchall()

        state = self._state()
        if state.writing:
            with self._unavailable("reading", state.conn):
                return run(state.conn)
        if state.depth:
            return self._first(state, "reading", run)
        with self._own_connection() as own:
            return self._first(own, "reading", run)

    def _write(self, sql: str, params: Sequence | dict) -> int:
        """Runs one write in this thread's batch (a batch of its own if none is open);
        returns its row count."""
        with self.batch():
            state = self._state()
            self._begin_writing(state)
            with self._unavailable("writing", state.conn):
                return state.conn.execute(sql, params).rowcount

    def _begin_writing(self, state: _Txn) -> None:
        """Begins the batch's write transaction with the fencing check (once per batch)."""
        if state.writing:
            return
        epoch = self._fencing_epoch
        if epoch is None:
            raise NotLeader(f"this coordinator holds no leader lease of the store at "
                            f"{self.where}: it writes nothing")

        def begin(conn: psycopg.Connection) -> tuple | None:
            cursor = conn.execute(_BEGIN_FENCED)
            cursor.nextset()
            return cursor.fetchone()

        row = self._first(state, "beginning a write", begin)
        state.writing = True
        if row is None or row[0] != epoch:
            raise NotLeader(f"the leader lease of the store at {self.where} is at epoch "
                            f"{row[0] if row else None}, this coordinator's is {epoch}: "
                            "another coordinator took over")

    # ------------------------------------------------------------------ leader lease

    def ping(self) -> None:
        self._read("SELECT 1")

    @property
    def fencing_epoch(self) -> int | None:
        return self._fencing_epoch

    def read_lease(self) -> Lease:
        with self._own_connection() as own:
            row = self._first(own, "reading the lease",
                              lambda conn: conn.execute(_READ_LEASE).fetchone())
        return Lease(holder=row[0], epoch=row[1], address=row[2], remaining_s=row[3])

    def try_acquire_lease(self, holder: str, address: str, lease_s: float) -> int | None:
        lease = self.read_lease()  # unlocked: a standby's polls never wait on the leader
        if lease.remaining_s > 0 and lease.holder != holder:
            return None
        lock = (f"BEGIN; SET LOCAL lock_timeout = {int(self._lock_timeout_ms)}; SELECT holder, "
                "expires_at > clock_timestamp() FROM leader_lease WHERE id = 1 FOR UPDATE")

        def locked(conn: psycopg.Connection) -> tuple | None:
            try:
                cursor = conn.execute(lock)
            except psycopg.errors.LockNotAvailable:  # a write of the old leader is running
                return None
            cursor.nextset()
            cursor.nextset()
            return cursor.fetchone()

        with self._own_connection() as own:
            row = self._first(own, "acquiring the lease", locked)
            if row is None or (row[1] and row[0] != holder):
                return None
            with self._unavailable("acquiring the lease", own.conn):
                epoch = own.conn.execute(
                    "UPDATE leader_lease SET holder = %s, address = %s, epoch = epoch + 1, "
                    "expires_at = clock_timestamp() + make_interval(secs => %s) "
                    "WHERE id = 1 RETURNING epoch", (holder, address, float(lease_s))
                ).fetchone()[0]
                own.conn.execute("COMMIT")
        self._fencing_epoch = epoch
        return epoch

    def renew_lease(self, epoch: int, lease_s: float) -> bool:
        with self._own_connection() as own:
            return self._first(own, "renewing the lease", lambda conn: conn.execute(
                "UPDATE leader_lease SET expires_at = clock_timestamp() + "
                "make_interval(secs => %s) WHERE id = 1 AND epoch = %s",
                (float(lease_s), epoch)).rowcount) == 1

    def release_lease(self, epoch: int) -> None:
        if self._fencing_epoch == epoch:
            self._fencing_epoch = None
        with self._own_connection() as own:
            self._first(own, "releasing the lease", lambda conn: conn.execute(
                "UPDATE leader_lease SET expires_at = clock_timestamp() "
                "WHERE id = 1 AND epoch = %s", (epoch,)))

    # ------------------------------------------------------------------ timestamp oracle

    def read_timestamp_high_water(self) -> int:
        rows = self._read("SELECT value FROM meta WHERE key = 'ts_high_water'")
        return rows[0][0] if rows else 0

    def write_timestamp_high_water(self, value: int) -> None:
        self._write("INSERT INTO meta VALUES ('ts_high_water', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = GREATEST(meta.value, excluded.value)",
                    (value,))

    # ------------------------------------------------------------------ pipelines

    def load_pipelines(self) -> list[PipelineRecord]:
        rows = self._read(f"SELECT {', '.join(PIPELINE_COLUMNS)} FROM pipelines "
                          "ORDER BY pipeline_id", dicts=True)
        return [PipelineRecord.from_row(r) for r in rows]

    def insert_pipeline(self, record: PipelineRecord) -> None:
        count = self._write(
            f"INSERT INTO pipelines ({', '.join(PIPELINE_COLUMNS)}) "
            f"VALUES ({', '.join(f'%({c})s' for c in PIPELINE_COLUMNS)}) "
            "ON CONFLICT DO NOTHING", record.to_row())
        if count != 1:
            raise StoreConflict(f"pipeline {record.pipeline_id} exists")

    def update_pipeline(self, record: PipelineRecord) -> None:
        self._compare_and_set("pipelines", "pipeline_id", PIPELINE_COLUMNS, record,
                              f"pipeline {record.pipeline_id}")

    def _compare_and_set(self, table: str, key: str, columns: Sequence[str],
                         record: PipelineRecord | TxnRecord, what: str,
                         fixed: Sequence[str] = ()) -> None:
        """Writes every column of ``record`` but the ``fixed`` ones if its row_version is
        still the one read and the fixed columns hold its values, and bumps it; StoreConflict
        (re-read, retry) when another write came first."""
        row = record.to_row()
        sets = ", ".join(f"{c} = %({c})s" for c in columns if c != key and c not in fixed)
        same = "".join(f" AND {c} = %({c})s" for c in fixed if c != key)
        row["row_version"] = record.row_version + 1
        row["expected"] = record.row_version
        count = self._write(f"UPDATE {table} SET {sets} WHERE {key} = %({key})s "
                            f"AND row_version = %(expected)s{same}", row)
        if count != 1:
            raise StoreConflict(f"{what} changed underneath" + (
                f" (or its identity differs: {', '.join(fixed)})" if fixed else ""))
        record.row_version += 1

    # ------------------------------------------------------------------ transactions

    def insert_txn(self, record: TxnRecord) -> None:
        count = self._write(
            f"INSERT INTO transactions ({', '.join(TXN_COLUMNS)}) "
            f"VALUES ({', '.join(f'%({c})s' for c in TXN_COLUMNS)}) ON CONFLICT DO NOTHING",
            record.to_row())
        if count != 1:
            raise StoreConflict(f"transaction {record.txn_id} exists (or its start_ts "
                                f"{record.start_ts} is taken)")

    def update_txn(self, record: TxnRecord) -> None:
        self._compare_and_set("transactions", "txn_id", TXN_COLUMNS, record,
                              f"transaction {record.txn_id}", fixed=TXN_IDENTITY_COLUMNS)

    def _txns(self, where: str, params: Sequence = (), tail: str = "") -> list[TxnRecord]:
        rows = self._read(f"{SELECT_TXN} WHERE {where} {tail}", params, dicts=True)
        return [TxnRecord.from_row(r) for r in rows]

    def get_txn(self, txn_id: str) -> TxnRecord | None:
        found = self._txns("txn_id = %s", (txn_id,))
        return found[0] if found else None

    def attempts_of(self, pipeline_id: str, generation: int, batch_id: int) -> list[TxnRecord]:
        return self._txns("pipeline_id = %s AND generation = %s AND batch_id = %s",
                          (pipeline_id, generation, batch_id), "ORDER BY start_ts")

    def newest_committed_batch(self, pipeline_id: str, generation: int) -> int | None:
        rows = self._read(
            "SELECT batch_id FROM transactions WHERE pipeline_id = %s AND generation = %s "
            "AND state IN ('COMMITTED', 'APPLIED') ORDER BY batch_id DESC LIMIT 1",
            (pipeline_id, generation))
        return rows[0][0] if rows else None

    def unfinished_txns(self) -> list[TxnRecord]:
        return self._txns(f"state IN ({_UNFINISHED})", (), "ORDER BY start_ts")

    def list_txns(self, query: TxnQuery) -> list[TxnRecord]:
        clauses = ["start_ts > %s", "created_ms >= %s"]
        params: list[object] = [query.after_start_ts, query.created_after_ms]
        for clause, value, wanted in (
                ("pipeline_id = %s", query.pipeline_id, bool(query.pipeline_id)),
                ("generation = %s", query.generation, query.generation is not None),
                ("batch_id = %s", query.batch_id, query.batch_id is not None),
                ("created_ms < %s", query.created_before_ms, bool(query.created_before_ms)),
                ("state = ANY(%s)", [s.value for s in query.states], bool(query.states))):
            if wanted:
                clauses.append(clause)
                params.append(value)
        return self._txns(" AND ".join(clauses), params,
                          f"ORDER BY start_ts LIMIT {int(query.limit)}")

    # ------------------------------------------------------------------ snapshot index

    def add_table_commit(self, commit: TableCommit) -> None:
        count = self._write(
            f"INSERT INTO table_commits ({TABLE_COMMIT_COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (commit.table, commit.commit_ts, commit.txn_id, commit.delta_version,
             commit.input_barrier, commit.superseded_ts, commit.restore))
        if count != 1:
            raise StoreConflict(f"table commit {commit} exists")

    def set_table_commit_version(self, table: str, commit_ts: int, delta_version: int) -> None:
        count = self._write("UPDATE table_commits SET delta_version = %s "
                            "WHERE table_uri = %s AND commit_ts = %s",
                            (delta_version, table, commit_ts))
        if count != 1:
            raise StoreConflict(f"no table commit ({table}, {commit_ts})")

    def table_commit_at(self, table: str, max_commit_ts: int) -> TableCommit | None:
        rows = self._read(
            f"SELECT {TABLE_COMMIT_COLUMNS} FROM table_commits "
            "WHERE table_uri = %s AND commit_ts <= %s ORDER BY commit_ts DESC LIMIT 1",
            (table, max_commit_ts))
        return TableCommit(*rows[0]) if rows else None

    def table_commits_at(self, tables: Sequence[str], max_commit_ts: int) -> IndexView:
        # One statement reads one snapshot: the floor and the rows are of the same moment
        # (inside a write transaction, that transaction's, its own writes included).
        if not tables:
            return IndexView(self.retention_floor_ts(), {})
        rows = self._read(_INDEX_VIEW, (list(tables), max_commit_ts))
        commits = {t: TableCommit(*row[1:]) if row[1] is not None else None
                   for t, row in zip(tables, rows, strict=True)}
        return IndexView(rows[0][0] or 0, commits)

    def unapplied_table_commits(self, table: str, max_commit_ts: int) -> list[TableCommit]:
        rows = self._read(
            f"SELECT {TABLE_COMMIT_COLUMNS} FROM table_commits "
            "WHERE table_uri = %s AND commit_ts <= %s AND delta_version IS NULL "
            "ORDER BY commit_ts", (table, max_commit_ts))
        return [TableCommit(*r) for r in rows]

    # ------------------------------------------------------------------ input barriers

    def _commits_where(self, table: str, condition: str, params: tuple,
                       by_input_barrier: bool, tail: str, as_of_ts: int | None,
                       changes: bool) -> list[TableCommit]:
        """Live commits to ``table`` meeting ``condition`` on the key ``k`` (see ``Store``)."""
        clauses = [condition.format(k=key_column(by_input_barrier)),
                   *live_clauses(as_of_ts, changes, "%s")]
        if as_of_ts is not None:
            params = (*params, as_of_ts, as_of_ts)
        rows = self._read(
            f"SELECT {TABLE_COMMIT_COLUMNS} FROM table_commits WHERE table_uri = %s "
            f"AND {' AND '.join(clauses)} {tail}", (table, *params))
        return [TableCommit(*r) for r in rows]

    def table_commits_in_range(self, table: str, after: int, upto: int,
                               by_input_barrier: bool,
                               as_of_ts: int | None = None) -> list[TableCommit]:
        return self._commits_where(table, "{k} > %s AND {k} <= %s", (after, upto),
                                   by_input_barrier, "ORDER BY commit_ts", as_of_ts, True)

    def table_commit_at_barrier(self, table: str, barrier: int, by_input_barrier: bool,
                                as_of_ts: int | None = None) -> TableCommit | None:
        found = self._commits_where(table, "{k} <= %s", (barrier,), by_input_barrier,
                                    "ORDER BY commit_ts DESC LIMIT 1", as_of_ts, False)
        return found[0] if found else None

    def first_table_commit_after(self, table: str, after: int, by_input_barrier: bool,
                                 as_of_ts: int | None = None) -> TableCommit | None:
        found = self._commits_where(table, "{k} > %s", (after,), by_input_barrier,
                                    "ORDER BY commit_ts LIMIT 1", as_of_ts, True)
        return found[0] if found else None

    def last_input_barrier(self, pipeline_id: str, generation: int) -> int:
        # from the top of the generation's input barriers down (transactions_by_input_barrier):
        # only the attempts of its next batch can lie above its newest committed one
        rows = self._read(
            "SELECT input_barrier FROM transactions WHERE pipeline_id = %s "
            "AND generation = %s AND input_barrier > 0 AND state IN ('COMMITTED', 'APPLIED') "
            "ORDER BY input_barrier DESC LIMIT 1", (pipeline_id, generation))
        return rows[0][0] if rows else 0

    def newest_commit_at_or_before(self, pipeline_id: str, max_commit_ts: int) -> TxnRecord | None:
        found = self._txns("pipeline_id = %s AND commit_ts > 0 AND commit_ts <= %s "
                           "AND state IN ('COMMITTED', 'APPLIED')", (pipeline_id, max_commit_ts),
                           "ORDER BY commit_ts DESC LIMIT 1")
        return found[0] if found else None

    def first_unapplied_input_barrier(self, table: str,
                                      as_of_ts: int | None = None) -> int | None:
        clauses = " AND ".join(live_clauses(as_of_ts, False, "%s"))
        rows = self._read(
            f"SELECT MIN({key_column(True)}) FROM table_commits WHERE table_uri = %s "
            f"AND delta_version IS NULL AND {clauses}",
            (table,) if as_of_ts is None else (table, as_of_ts, as_of_ts))
        return rows[0][0]

    def newest_restore(self, table: str, as_of_ts: int | None = None) -> int:
        rows = self._read(
            "SELECT MAX(commit_ts) FROM table_commits WHERE table_uri = %s "
            "AND restore AND commit_ts <= %s",
            (table, (1 << 63) - 1 if as_of_ts is None else as_of_ts))
        return rows[0][0] or 0

    def supersede_table_commits(self, table: str, revision_ts: int,
                                above_input_barrier: int) -> int:
        return self._write(
            "UPDATE table_commits SET superseded_ts = %s WHERE table_uri = %s "
            "AND commit_ts < %s AND input_barrier > 0 AND input_barrier > %s AND superseded_ts = 0",
            (revision_ts, table, revision_ts, above_input_barrier))

    # ------------------------------------------------------------------ snapshot leases

    def insert_lease(self, lease: LeaseRecord) -> None:
        count = self._write(
            "INSERT INTO leases (lease_id, holder, tables, barrier_ts, created_ms, expires_ms, "
            "principal) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (lease.lease_id, lease.holder, lease.tables_json(), lease.barrier_ts,
             lease.created_ms, lease.expires_ms, lease.principal))
        if count != 1:
            raise StoreConflict(f"lease {lease.lease_id} exists")

    def delete_lease(self, lease_id: str) -> bool:
        return self._write("DELETE FROM leases WHERE lease_id = %s", (lease_id,)) == 1

    def load_leases(self) -> list[LeaseRecord]:
        rows = self._read("SELECT lease_id, holder, tables, barrier_ts, created_ms, expires_ms, "
                          "principal FROM leases ORDER BY lease_id")
        return [LeaseRecord(r[0], r[1], LeaseRecord.tables_from_json(r[2]), *r[3:])
                for r in rows]

    def delete_expired_leases(self, now_ms: int) -> int:
        return self._write("DELETE FROM leases WHERE expires_ms <= %s", (now_ms,))

    # ------------------------------------------------------------------ retention

    def retention_floor_ts(self) -> int:
        rows = self._read("SELECT value FROM meta WHERE key = 'retention_floor_ts'")
        return rows[0][0] if rows else 0

    def prune(self, cutoff_ms: int, floor_ts: int, limit: int,
              keep: frozenset[str] = frozenset()) -> tuple[int, int]:
        with self.batch():
            self._begin_writing(self._state())  # the candidates are read in the transaction
            doomed = self._prunable_txns(cutoff_ms, limit, keep)
            if doomed:
                self._write("DELETE FROM transactions WHERE txn_id = ANY(%s)", (doomed,))
            index_rows = 0
            for (table,) in self._read(_TABLES_INDEXED):
                if index_rows >= limit:
                    break
                index_rows += self._write(
                    "DELETE FROM table_commits WHERE table_uri = %(t)s AND commit_ts IN ("
                    "SELECT commit_ts FROM table_commits WHERE table_uri = %(t)s "
                    "AND delta_version IS NOT NULL AND commit_ts < (SELECT MAX(commit_ts) "
                    "FROM table_commits WHERE table_uri = %(t)s AND commit_ts <= %(floor)s) "
                    "ORDER BY commit_ts LIMIT %(n)s)",
                    {"t": table, "floor": floor_ts, "n": limit - index_rows})
            self._write("INSERT INTO meta VALUES ('retention_floor_ts', %s) ON CONFLICT (key) "
                        "DO UPDATE SET value = GREATEST(meta.value, excluded.value)",
                        (floor_ts,))
            return len(doomed), index_rows

    def _prunable_txns(self, cutoff_ms: int, limit: int, keep: frozenset[str]) -> list[str]:
        """The oldest ``limit`` prunable transactions (see ``Store.prune`` and SqliteStore's
        twin): each (pipeline, generation)'s newest committed batch is left out by the query,
        the ``keep`` set here, with ``len(keep)`` extra candidates to cover it."""
        rows = self._read(
            "SELECT txn_id FROM transactions AS t WHERE start_ts < %s "
            "AND state IN ('APPLIED', 'ABORTED') AND updated_ms < %s AND created_ms < %s "
            "AND (state = 'ABORTED' OR EXISTS (SELECT 1 FROM transactions AS n "
            "WHERE n.pipeline_id = t.pipeline_id AND n.generation = t.generation "
            "AND n.batch_id > t.batch_id AND n.state IN ('APPLIED', 'COMMITTED')) "
            "AND (t.input_barrier = 0 OR EXISTS (SELECT 1 FROM transactions AS m "
            "WHERE m.pipeline_id = t.pipeline_id AND m.generation = t.generation "
            "AND m.batch_id > t.batch_id AND m.state IN ('APPLIED', 'COMMITTED') "
            "AND m.input_barrier > 0))) "
            "ORDER BY start_ts LIMIT %s",
            ((cutoff_ms << 18) + 1, cutoff_ms, cutoff_ms, limit + len(keep)))
        return [txn_id for (txn_id,) in rows if txn_id not in keep][:limit]

    # ------------------------------------------------------------------ security records

    def load_tokens(self) -> list[TokenRecord]:
        rows = self._read("SELECT token_id, secret_hash, principal, created_ms, revoked_ms, "
                          "description FROM tokens ORDER BY token_id", dicts=True)
        return [TokenRecord(**r) for r in rows]

    def insert_token(self, record: TokenRecord) -> None:
        count = self._write(
            "INSERT INTO tokens (token_id, secret_hash, principal, description, created_ms, "
            "revoked_ms) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (record.token_id, record.secret_hash, record.principal, record.description,
             record.created_ms, record.revoked_ms))
        if count != 1:
            raise StoreConflict(f"token {record.token_id} exists")

    def revoke_token(self, token_id: str, revoked_ms: int) -> TokenRecord | None:
        with self.batch():
            self._write("UPDATE tokens SET revoked_ms = %s WHERE token_id = %s "
                        "AND revoked_ms = 0", (revoked_ms, token_id))
            rows = self._read("SELECT token_id, secret_hash, principal, created_ms, revoked_ms, "
                              "description FROM tokens WHERE token_id = %s", (token_id,),
                              dicts=True)
        return TokenRecord(**rows[0]) if rows else None

    def load_acl(self) -> list[AclRecord]:
        rows = self._read("SELECT principal, resource, pattern, permission, created_ms "
                          "FROM acl_entries ORDER BY principal, resource, pattern, permission",
                          dicts=True)
        return [AclRecord.from_row(r) for r in rows]

    def insert_acl(self, entry: AclRecord) -> bool:
        return self._write(
            "INSERT INTO acl_entries (principal, resource, pattern, permission, created_ms) "
            "VALUES (%(principal)s, %(resource)s, %(pattern)s, %(permission)s, "
            "%(created_ms)s) ON CONFLICT DO NOTHING", entry.to_row()) == 1

    def delete_acl(self, entry: AclRecord) -> bool:
        return self._write(
            "DELETE FROM acl_entries WHERE principal = %s AND resource = %s AND pattern = %s "
            "AND permission = %s", entry.key) == 1

    # ------------------------------------------------------------------ lineage

    def load_table_writers(self) -> list[TableWriter]:
        rows = self._read("SELECT table_uri, pipeline_id, registered_ms FROM table_writers "
                          "ORDER BY table_uri")
        return [TableWriter(*r) for r in rows]

    def insert_table_writer(self, writer: TableWriter) -> None:
        count = self._write(
            "INSERT INTO table_writers (table_uri, pipeline_id, registered_ms) "
            "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (writer.table, writer.pipeline_id, writer.registered_ms))
        if count != 1:
            raise StoreConflict(f"table {writer.table} has an owner")

    def load_read_edges(self) -> list[ReadEdge]:
        rows = self._read("SELECT pipeline_id, table_uri, registered_ms, since_ts "
                          "FROM read_edges ORDER BY pipeline_id, table_uri")
        return [ReadEdge(*r) for r in rows]

    def insert_read_edge(self, edge: ReadEdge) -> bool:
        return self._write(
            "INSERT INTO read_edges (pipeline_id, table_uri, registered_ms, since_ts) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (edge.pipeline_id, edge.table, edge.registered_ms, edge.since_ts)) == 1

    # ------------------------------------------------------------------ quarantines

    def load_quarantines(self) -> list[QuarantineRecord]:
        rows = self._read(f"SELECT {QUARANTINE_COLUMNS} FROM quarantines "
                          "ORDER BY table_uri, quarantined_ms, txn_id", dicts=True)
        return [quarantine_from_row(r) for r in rows]

    def put_quarantine(self, record: QuarantineRecord) -> None:
        self._write(f"INSERT INTO quarantines ({QUARANTINE_COLUMNS}) VALUES "
                    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (table_uri, txn_id) DO UPDATE SET "
                    "reason = excluded.reason, quarantined_ms = excluded.quarantined_ms, "
                    "choice = excluded.choice, chosen_by = excluded.chosen_by, "
                    "chosen_ms = excluded.chosen_ms, choice_reason = excluded.choice_reason, "
                    "as_of_version = excluded.as_of_version, "
                    "released_ms = excluded.released_ms, delta_version = excluded.delta_version",
                    quarantine_values(record))
