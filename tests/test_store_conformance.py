"""One conformance suite for every store implementation (memory, SQLite, PostgreSQL), and the
leader lease's for the stores that keep one."""

import dataclasses
import time

import pytest

from coordinator.store import (
    IndexView,
    MemoryStore,
    PostgresStore,
    SqliteStore,
    StoreSchemaError,
    TableCommit,
    TxnQuery,
    open_store,
)
from percolake.errors import StoreConflict
from percolake.records import (
    AddFileRecord,
    PipelineRecord,
    QuarantineChoice,
    QuarantineRecord,
    ResetRecord,
    TableEntry,
    TableWriteRecord,
    TxnRecord,
    WriteMode,
)
from percolake.states import TxnState


def make_store(kind, request, tmp_path):
    if kind == "sqlite":
        return SqliteStore(tmp_path)
    if kind == "memory":
        return MemoryStore()
    return PostgresStore(request.getfixturevalue("pg_dsn"))


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def store(request, tmp_path):
    made = make_store(request.param, request, tmp_path)
    if made.supports_leases:  # a store shared by processes writes only while it leads
        assert made.try_acquire_lease("conformance", "127.0.0.1:1", 600.0) is not None
    yield made
    made.close()


def txn(txn_id="t1", start_ts=10, state=TxnState.OPEN, pipeline="p", batch=0, created=1000):
    record = TxnRecord(txn_id=txn_id, pipeline_id=pipeline, generation=0, batch_id=batch,
                       attempt=1, epoch=1, query_id="", state=state, start_ts=start_ts,
                       created_ms=created, updated_ms=created)
    write = TableWriteRecord(
        "file:///w/a", WriteMode.OVERWRITE_PARTITIONS,
        (AddFileRecord(f"_percolake/{txn_id}/d=1/f.parquet", 12, {"d": "1"}, 5,
                       '{"numRecords":3}'),
         AddFileRecord(f"_percolake/{txn_id}/d=null/g.parquet", 7, {"d": None}, 5, "")),
        '{"type":"struct","fields":[]}', ("d",), ({"d": "1"}, {"d": None}))
    record.tables["file:///w/a"] = TableEntry("file:///w/a", "file:///w/a/_percolake/x", write)
    record.tables["file:///w/b"] = TableEntry("file:///w/b", "file:///w/b/_percolake/x")
    return record


def test_transaction_round_trips_with_all_fields(store):
    record = txn()
    store.insert_txn(record)
    assert store.get_txn("t1") == record
    assert store.get_txn("missing") is None


def test_insert_of_an_existing_transaction_conflicts(store):
    store.insert_txn(txn())
    with pytest.raises(StoreConflict):
        store.insert_txn(txn())


def test_update_is_compare_and_set_on_row_version(store):
    store.insert_txn(txn())
    first = store.get_txn("t1")
    second = store.get_txn("t1")
    first.state = TxnState.PREWRITTEN
    store.update_txn(first)
    assert first.row_version == 1
    second.state = TxnState.ABORTED
    with pytest.raises(StoreConflict):
        store.update_txn(second)
    assert store.get_txn("t1").state == TxnState.PREWRITTEN


@pytest.mark.parametrize("column, value", [("pipeline_id", "q"), ("batch_id", 7),
                                           ("start_ts", 11), ("epoch", 2), ("principal", "x")])
def test_an_update_never_changes_a_transactions_identity(store, column, value):
    """An update writes what a transition changes; the identity fixed at insert is checked
    equal, never rewritten: a record that differs there is refused and nothing is written."""
    store.insert_txn(txn())
    record = store.get_txn("t1")
    record.state = TxnState.PREWRITTEN
    setattr(record, column, value)
    with pytest.raises(StoreConflict):
        store.update_txn(record)
    assert store.get_txn("t1") == txn()
    record = store.get_txn("t1")
    record.state, record.commit_ts, record.input_barrier = TxnState.COMMITTED, 30, 25
    record.source_offsets, record.updated_ms = '{"0": 1}', 2000
    record.tables["file:///w/b"].delta_version = 4
    store.update_txn(record)
    assert store.get_txn("t1") == record


def test_failed_batch_leaves_nothing_behind(store):
    store.insert_txn(txn())
    with pytest.raises(RuntimeError), store.batch():
        record = store.get_txn("t1")
        record.state = TxnState.COMMITTED
        store.update_txn(record)
        store.add_table_commit(TableCommit("file:///w/a", 20, "t1", None))
        raise RuntimeError("crash inside the batch")
    assert store.get_txn("t1").state == TxnState.OPEN
    assert store.table_commit_at("file:///w/a", 100) is None


def test_pipeline_insert_update_and_reload(store):
    pipeline = PipelineRecord("p", created_ms=5)
    store.insert_pipeline(pipeline)
    with pytest.raises(StoreConflict):
        store.insert_pipeline(PipelineRecord("p"))
    pipeline.epoch = 3
    pipeline.resets.append(ResetRecord(0, 1, "why", 7, "q", 0))
    store.update_pipeline(pipeline)
    stale = PipelineRecord("p", row_version=0)
    with pytest.raises(StoreConflict):
        store.update_pipeline(stale)
    assert store.load_pipelines() == [pipeline]


def test_attempts_and_unfinished_and_listing(store):
    store.insert_txn(txn("a", 10, TxnState.ABORTED, batch=1, created=100))
    store.insert_txn(txn("b", 20, TxnState.COMMITTED, batch=1, created=200))
    store.insert_txn(txn("c", 30, TxnState.OPEN, batch=2, created=300))
    store.insert_txn(txn("d", 40, TxnState.APPLIED, pipeline="q", created=400))
    assert [t.txn_id for t in store.attempts_of("p", 0, 1)] == ["a", "b"]
    assert [t.txn_id for t in store.unfinished_txns()] == ["b", "c"]
    assert [t.txn_id for t in store.list_txns(TxnQuery(pipeline_id="p"))] == ["a", "b", "c"]
    assert [t.txn_id for t in store.list_txns(TxnQuery(states=(TxnState.APPLIED,)))] == ["d"]
    assert [t.txn_id for t in store.list_txns(TxnQuery(batch_id=1, after_start_ts=10))] == ["b"]
    window = TxnQuery(created_after_ms=200, created_before_ms=400, limit=1)
    assert [t.txn_id for t in store.list_txns(window)] == ["b"]


def test_newest_committed_batch_counts_only_committed_attempts(store):
    assert store.newest_committed_batch("p", 0) is None
    store.insert_txn(txn("a", 10, TxnState.APPLIED, batch=3))
    store.insert_txn(txn("b", 20, TxnState.COMMITTED, batch=5))
    store.insert_txn(txn("c", 30, TxnState.ABORTED, batch=9))
    store.insert_txn(txn("d", 40, TxnState.OPEN, batch=8))
    store.insert_txn(txn("e", 50, TxnState.APPLIED, pipeline="q", batch=12))
    assert store.newest_committed_batch("p", 0) == 5
    assert store.newest_committed_batch("p", 1) is None
    assert store.newest_committed_batch("q", 0) == 12


def test_snapshot_index_finds_the_newest_commit_at_or_below_a_timestamp(store):
    store.add_table_commit(TableCommit("file:///w/a", 10, "t1", None))
    store.add_table_commit(TableCommit("file:///w/a", 20, "t2", None))
    store.set_table_commit_version("file:///w/a", 10, 0)
    assert store.table_commit_at("file:///w/a", 15) == TableCommit("file:///w/a", 10, "t1", 0)
    assert store.table_commit_at("file:///w/a", 9) is None
    assert [c.txn_id for c in store.unapplied_table_commits("file:///w/a", 25)] == ["t2"]
    assert store.unapplied_table_commits("file:///w/a", 19) == []
    with pytest.raises(StoreConflict):
        store.set_table_commit_version("file:///w/a", 11, 1)


def test_index_view_reads_the_floor_with_the_rows(store):
    for ts in (10, 20, 30):
        store.add_table_commit(TableCommit("file:///w/a", ts, f"t{ts}", ts // 10))
    view = store.table_commits_at(["file:///w/a", "file:///w/b"], 25)
    assert view == IndexView(0, {"file:///w/a": TableCommit("file:///w/a", 20, "t20", 2),
                                 "file:///w/b": None})
    assert store.prune(cutoff_ms=0, floor_ts=30, limit=10) == (0, 2)
    # The row a reader at 25 needs is gone: the view says so with the floor it returns.
    assert store.table_commits_at(["file:///w/a"], 25) == IndexView(30, {"file:///w/a": None})
    with store.batch():  # inside an open transaction the view is that transaction's
        assert store.table_commits_at(["file:///w/a"], 30).floor_ts == 30


def test_timestamp_high_water_round_trips(store):
    assert store.read_timestamp_high_water() == 0
    store.write_timestamp_high_water(99)
    assert store.read_timestamp_high_water() == 99
    store.write_timestamp_high_water(42)  # an older mark finishing late never lowers it
    assert store.read_timestamp_high_water() == 99


def test_sqlite_store_survives_reopen(tmp_path):
    store = SqliteStore(tmp_path)
    store.insert_txn(txn())
    store.close()
    assert SqliteStore(tmp_path).get_txn("t1") == txn()


def test_sqlite_store_refuses_a_newer_schema(tmp_path):
    store = SqliteStore(tmp_path)
    store._conn.execute("UPDATE meta SET value = 9 WHERE key = 'schema_version'")
    store.close()
    with pytest.raises(StoreSchemaError, match="has schema 9; this coordinator knows up to 8: "
                                               "upgrade the coordinator"):
        SqliteStore(tmp_path)


def test_open_store_picks_the_store_by_its_url(tmp_path, pg_dsn):
    sqlite = open_store("", tmp_path)
    assert isinstance(sqlite, SqliteStore)
    sqlite.close()
    for url in (pg_dsn, pg_dsn.replace("postgresql://", "postgres://")):
        postgres = open_store(url, None)
        assert isinstance(postgres, PostgresStore) and postgres.supports_leases
        postgres.close()
    with pytest.raises(ValueError, match="unknown store 'mysql'"):
        open_store("mysql://x/y", tmp_path)


def test_sqlite_store_runs_wal_with_full_sync(tmp_path):
    store = SqliteStore(tmp_path)
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_prune_is_not_starved_by_kept_rows_that_come_first(store):
    limit = 10
    kept = limit + 64 + 50  # more kept rows than the candidates SQLite used to look at
    with store.batch():
        for i in range(kept):  # each pipeline's only, so newest, committed batch: kept
            store.insert_txn(txn(f"kept{i}", 10 + i, TxnState.APPLIED, pipeline=f"p{i}"))
        for batch in range(limit + 5):  # a pipeline's older batches: prunable
            store.insert_txn(txn(f"old{batch}", 10_000 + batch, TxnState.APPLIED,
                                 pipeline="z", batch=batch))
    store.flush()
    assert store.prune(cutoff_ms=5000, floor_ts=0, limit=limit) == (limit, 0)
    assert store.prune(cutoff_ms=5000, floor_ts=0, limit=limit) == (4, 0)
    assert store.get_txn(f"old{limit + 4}") is not None  # z's newest committed batch stays
    assert all(store.get_txn(f"kept{i}") is not None for i in range(kept))


def test_prune_skips_the_keep_set_without_starving(store):
    limit = 5
    with store.batch():
        for i in range(limit + 64 + 20):
            store.insert_txn(txn(f"held{i}", 10 + i, TxnState.ABORTED))
        for i in range(limit):
            store.insert_txn(txn(f"gone{i}", 10_000 + i, TxnState.ABORTED))
    held = frozenset(f"held{i}" for i in range(limit + 64 + 20))
    assert store.prune(cutoff_ms=5000, floor_ts=0, limit=limit, keep=held) == (limit, 0)
    assert all(store.get_txn(t) is not None for t in held)
    assert all(store.get_txn(f"gone{i}") is None for i in range(limit))


# ---------------------------------------------------------------- security records

def test_a_transaction_keeps_the_principal_that_opened_it(store):
    record = txn()
    record.principal = "alice"
    store.insert_txn(record)
    assert store.get_txn("t1").principal == "alice"
    assert store.unfinished_txns()[0].principal == "alice"


def test_tokens_round_trip_and_revoke_once(store):
    from coordinator.auth_records import TokenRecord

    live = TokenRecord("00000000000000aa", "ab" * 32, "alice", 5, description="spark job")
    other = TokenRecord("00000000000000bb", "cd" * 32, "bob", 6)
    store.insert_token(other)
    store.insert_token(live)
    with pytest.raises(StoreConflict):
        store.insert_token(live)
    assert store.load_tokens() == [live, other]
    revoked = store.revoke_token(live.token_id, 99)
    assert revoked == TokenRecord(live.token_id, live.secret_hash, "alice", 5, 99, "spark job")
    assert store.revoke_token(live.token_id, 123).revoked_ms == 99  # already revoked: kept
    assert store.revoke_token("00000000000000cc", 99) is None
    assert [t.live for t in store.load_tokens()] == [False, True]


def test_acl_entries_are_added_once_and_removed(store):
    from coordinator.auth_records import AclRecord, Permission, Resource

    write = AclRecord("alice", Resource.PIPELINE, "p*", Permission.WRITE, 7)
    read = AclRecord("*", Resource.TABLE, "file:///w", Permission.READ, 8)
    assert store.insert_acl(write) and store.insert_acl(read)
    assert not store.insert_acl(AclRecord("alice", Resource.PIPELINE, "p*", Permission.WRITE, 9))
    assert store.load_acl() == [read, write]
    assert store.delete_acl(write) and not store.delete_acl(write)
    assert store.load_acl() == [read]


def test_a_failed_batch_leaves_no_token_or_acl_entry(store):
    from coordinator.auth_records import AclRecord, Permission, Resource, TokenRecord

    with pytest.raises(RuntimeError), store.batch():
        store.insert_token(TokenRecord("00000000000000aa", "ab" * 32, "alice", 5))
        store.insert_acl(AclRecord("alice", Resource.PIPELINE, "*", Permission.ADMIN, 5))
        raise RuntimeError("crash inside the batch")
    assert store.load_tokens() == [] and store.load_acl() == []


def test_sqlite_schema_1_is_migrated_to_the_newest_keeping_its_records(tmp_path):
    import sqlite3

    from coordinator.store.sqlite import _SCHEMA

    conn = sqlite3.connect(tmp_path / "coordinator.db")
    conn.executescript(_SCHEMA)
    conn.execute("INSERT INTO meta VALUES ('schema_version', 1)")
    row = txn().to_row()
    for column in ("principal", "input_barrier", "source_offsets"):
        del row[column]
    conn.execute(f"INSERT INTO transactions ({', '.join(row)}) "
                 f"VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
    conn.commit()
    conn.close()
    store = SqliteStore(tmp_path)
    try:
        assert store._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                                   ).fetchone()[0] == 8
        assert store.get_txn("t1") == txn()  # principal "": opened without authentication
        assert store.load_tokens() == [] and store.load_acl() == []
        assert store.load_table_writers() == [] and store.load_read_edges() == []
        assert store.load_quarantines() == []
    finally:
        store.close()


# ---------------------------------------------------------------- the leader lease

LEASE_S = 0.3


@pytest.fixture(params=["memory", "postgres"])
def lease_stores(request, tmp_path):
    """Two coordinators' views of one store: two store objects on one PostgreSQL database,
    or the one MemoryStore both would share in a process."""
    first = make_store(request.param, request, tmp_path)
    second = PostgresStore(request.getfixturevalue("pg_dsn")) \
        if request.param == "postgres" else first
    yield first, second
    for made in {id(first): first, id(second): second}.values():
        made.close()


def test_a_free_lease_is_acquired_with_a_new_epoch(lease_stores):
    first, _ = lease_stores
    assert first.read_lease().remaining_s <= 0  # never held
    assert first.fencing_epoch is None
    epoch = first.try_acquire_lease("a", "127.0.0.1:5001", LEASE_S)
    assert epoch == 1 and first.fencing_epoch == epoch
    lease = first.read_lease()
    assert (lease.holder, lease.epoch, lease.address) == ("a", epoch, "127.0.0.1:5001")
    assert 0 < lease.remaining_s <= LEASE_S


def test_a_held_lease_is_refused_to_others_until_it_expires(lease_stores):
    first, second = lease_stores
    epoch = first.try_acquire_lease("a", "127.0.0.1:5001", LEASE_S)
    assert second.try_acquire_lease("b", "127.0.0.1:5002", LEASE_S) is None
    assert first.renew_lease(epoch, LEASE_S)
    assert second.read_lease().holder == "a"
    time.sleep(LEASE_S * 1.3)
    assert second.read_lease().remaining_s <= 0
    taken = second.try_acquire_lease("b", "127.0.0.1:5002", LEASE_S)
    assert taken == epoch + 1 and second.fencing_epoch == taken
    assert (second.read_lease().holder, second.read_lease().address) == ("b", "127.0.0.1:5002")
    assert not first.renew_lease(epoch, LEASE_S)  # taken over: its epoch is gone
    assert first.try_acquire_lease("a", "127.0.0.1:5001", LEASE_S) is None


def test_an_expired_lease_renews_while_nobody_took_over(lease_stores):
    first, _ = lease_stores
    epoch = first.try_acquire_lease("a", "127.0.0.1:5001", LEASE_S)
    time.sleep(LEASE_S * 1.3)
    assert first.renew_lease(epoch, LEASE_S)
    assert first.read_lease().remaining_s > 0 and first.read_lease().epoch == epoch


def test_the_holder_reacquires_at_once_with_a_new_epoch(lease_stores):
    first, second = lease_stores
    epoch = first.try_acquire_lease("a", "127.0.0.1:5001", 600.0)
    assert second.try_acquire_lease("a", "127.0.0.1:5003", 600.0) == epoch + 1
    assert second.read_lease().address == "127.0.0.1:5003"
    assert not first.renew_lease(epoch, 600.0)


def test_a_released_lease_is_free_at_once(lease_stores):
    first, second = lease_stores
    epoch = first.try_acquire_lease("a", "127.0.0.1:5001", 600.0)
    first.release_lease(epoch)
    assert first.fencing_epoch is None
    assert first.read_lease().remaining_s <= 0
    assert second.try_acquire_lease("b", "127.0.0.1:5002", 600.0) == epoch + 1
    first.release_lease(epoch)  # a stale release changes nothing
    assert second.read_lease().remaining_s > 0


# ---------------------------------------------------------------- lineage (docs/topology.md)

def test_a_table_has_one_owner_and_a_second_is_a_conflict(store):
    from coordinator.store.base import TableWriter

    store.insert_table_writer(TableWriter("file:///w/b", "bank", 5))
    store.insert_table_writer(TableWriter("file:///w/a", "bank", 6))
    with pytest.raises(StoreConflict):
        store.insert_table_writer(TableWriter("file:///w/a", "ledger", 7))
    assert store.load_table_writers() == [TableWriter("file:///w/a", "bank", 6),
                                          TableWriter("file:///w/b", "bank", 5)]


def test_read_edges_are_recorded_once_each(store):
    from coordinator.store.base import ReadEdge

    assert store.insert_read_edge(ReadEdge("ledger", "file:///w/b", 5))
    assert store.insert_read_edge(ReadEdge("ledger", "file:///w/a", 6))
    assert store.insert_read_edge(ReadEdge("audit", "file:///w/b", 7))
    assert not store.insert_read_edge(ReadEdge("ledger", "file:///w/b", 8))
    assert store.insert_read_edge(ReadEdge("ledger", "file:///w/c", 9, since_ts=77 << 18))
    assert store.load_read_edges() == [ReadEdge("audit", "file:///w/b", 7),
                                       ReadEdge("ledger", "file:///w/a", 6),
                                       ReadEdge("ledger", "file:///w/b", 5),
                                       ReadEdge("ledger", "file:///w/c", 9, 77 << 18)]


def test_lineage_written_in_a_failed_batch_is_undone(store):
    from coordinator.store.base import ReadEdge, TableWriter

    with pytest.raises(RuntimeError), store.batch():
        store.insert_table_writer(TableWriter("file:///w/a", "bank", 5))
        store.insert_read_edge(ReadEdge("ledger", "file:///w/a", 5))
        raise RuntimeError("crash inside the batch")
    assert store.load_table_writers() == [] and store.load_read_edges() == []


# ---------------------------------------------------------------- input barriers and leases

def test_input_barriers_and_source_offsets_round_trip(store):
    record = txn()
    record.input_barrier, record.source_offsets = 5 << 18, '{"kafka":{"t":{"0":42}}}'
    store.insert_txn(record)
    assert store.get_txn("t1") == record
    pipeline = PipelineRecord("p", start_barrier=7, plan_generation=2, plan_after=7,
                              plan_barrier=9)
    store.insert_pipeline(pipeline)
    pipeline.plan_after, pipeline.plan_barrier = 9, 11
    store.update_pipeline(pipeline)
    assert store.load_pipelines() == [pipeline]
    store.add_table_commit(TableCommit("file:///w/a", 20, "t1", None, 5 << 18))
    assert store.table_commit_at("file:///w/a", 20) == TableCommit("file:///w/a", 20, "t1",
                                                                   None, 5 << 18)
    store.set_table_commit_version("file:///w/a", 20, 4)
    assert store.table_commits_at(["file:///w/a"], 20).commits["file:///w/a"] == TableCommit(
        "file:///w/a", 20, "t1", 4, 5 << 18)
    assert store.unapplied_table_commits("file:///w/a", 20) == []


def index_with_input_barriers(store):
    """Commits to a: (commit_ts, input barrier) (10, 0) (20, 100) (30, 200) (40, 250) (50, 300)
    (the first made before its writer read a percolake table: keyed by its commit_ts),
    the one at 50 unapplied."""
    for version, (ts, barrier) in enumerate(((10, 0), (20, 100), (30, 200), (40, 250),
                                             (50, 300))):
        store.add_table_commit(TableCommit("file:///w/a", ts, f"t{ts}", None, barrier))
        if ts < 50:
            store.set_table_commit_version("file:///w/a", ts, version)
    store.add_table_commit(TableCommit("file:///w/b", 25, "t25", None, 150))


def test_table_commits_in_a_range_by_commit_ts_or_by_input_barrier(store):
    index_with_input_barriers(store)
    by_ts = store.table_commits_in_range("file:///w/a", 10, 40, by_input_barrier=False)
    assert [c.commit_ts for c in by_ts] == [20, 30, 40]
    by_barrier = store.table_commits_in_range("file:///w/a", 0, 300, by_input_barrier=True)
    assert [c.commit_ts for c in by_barrier] == [10, 20, 30, 40, 50]  # 10: at its commit_ts
    assert [c.commit_ts for c in store.table_commits_in_range(
        "file:///w/a", 100, 299, by_input_barrier=True)] == [30, 40]
    assert [c.commit_ts for c in store.table_commits_in_range(
        "file:///w/a", 9, 99, by_input_barrier=True)] == [10]
    assert store.table_commits_in_range("file:///w/a", 300, 999, by_input_barrier=True) == []


def test_a_tables_version_at_a_barrier_by_commit_ts_or_by_input_barrier(store):
    index_with_input_barriers(store)
    assert store.table_commit_at_barrier("file:///w/a", 45, False).commit_ts == 40
    assert store.table_commit_at_barrier("file:///w/a", 9, False) is None
    at = store.table_commit_at_barrier("file:///w/a", 249, True)
    assert (at.commit_ts, at.input_barrier, at.delta_version) == (30, 200, 2)
    assert store.table_commit_at_barrier("file:///w/a", 99, True).commit_ts == 10  # its ts
    assert store.table_commit_at_barrier("file:///w/a", 9, True) is None
    assert store.table_commit_at_barrier("file:///w/a", 300, True).commit_ts == 50


def test_the_first_commit_after_a_barrier(store):
    index_with_input_barriers(store)
    assert store.first_table_commit_after("file:///w/a", 20, False).commit_ts == 30
    assert store.first_table_commit_after("file:///w/a", 50, False) is None
    assert store.first_table_commit_after("file:///w/a", 0, True).commit_ts == 10
    assert store.first_table_commit_after("file:///w/a", 10, True).commit_ts == 20
    assert store.first_table_commit_after("file:///w/a", 200, True).commit_ts == 40
    assert store.first_table_commit_after("file:///w/a", 300, True) is None
    assert store.first_table_commit_after("file:///w/c", 0, True) is None


def test_the_first_unapplied_input_barrier_of_a_table(store):
    assert store.first_unapplied_input_barrier("file:///w/a") is None
    index_with_input_barriers(store)
    assert store.first_unapplied_input_barrier("file:///w/a") == 300
    assert store.first_unapplied_input_barrier("file:///w/b") == 150
    store.set_table_commit_version("file:///w/a", 50, 4)
    assert store.first_unapplied_input_barrier("file:///w/a") is None
    store.add_table_commit(TableCommit("file:///w/a", 60, "t60", None, 0))  # no input barrier
    assert store.first_unapplied_input_barrier("file:///w/a") == 60  # keyed by its commit_ts


def test_commits_a_revision_supersedes_are_no_change_and_no_version_by_input_barrier(store):
    index_with_input_barriers(store)
    store.set_table_commit_version("file:///w/a", 50, 4)
    # a revision at 60 back to barrier 100: its restore row carries input barrier 100
    store.add_table_commit(TableCommit("file:///w/a", 60, "rev", None, 100, restore=True))
    assert store.supersede_table_commits("file:///w/a", 60, 100) == 3  # 30, 40, 50
    assert store.supersede_table_commits("file:///w/a", 60, 100) == 0  # once
    assert store.newest_restore("file:///w/a") == 60
    assert store.newest_restore("file:///w/a", as_of_ts=59) == 0
    assert store.newest_restore("file:///w/b") == 0
    assert store.table_commit_at("file:///w/a", 30).superseded_ts == 60
    assert store.table_commit_at("file:///w/a", 60).restore is True
    assert store.table_commit_at("file:///w/a", 20).superseded_ts == 0
    assert store.table_commit_at("file:///w/b", 25).superseded_ts == 0  # another table
    # changes: neither superseded rows nor the restore; versions: the restore
    assert [c.commit_ts for c in store.table_commits_in_range(
        "file:///w/a", 0, 999, by_input_barrier=True)] == [10, 20]
    assert store.first_table_commit_after("file:///w/a", 100, True) is None
    assert store.table_commit_at_barrier("file:///w/a", 250, True).commit_ts == 60
    assert store.table_commit_at_barrier("file:///w/a", 99, True).commit_ts == 10
    assert store.first_unapplied_input_barrier("file:///w/a") == 100  # the restore's own
    # as the index stood before the revision (one answer's view while it commits)
    assert [c.commit_ts for c in store.table_commits_in_range(
        "file:///w/a", 0, 999, by_input_barrier=True, as_of_ts=55)] == [10, 20, 30, 40, 50]
    assert store.table_commit_at_barrier("file:///w/a", 250, True, as_of_ts=55).commit_ts == 40
    assert store.first_table_commit_after("file:///w/a", 200, True, as_of_ts=55).commit_ts == 40
    assert store.first_unapplied_input_barrier("file:///w/a", as_of_ts=55) is None
    assert store.first_unapplied_input_barrier("file:///w/a", as_of_ts=60) == 100
    # re-processed after the revision: input barriers from 100 up again, all live
    store.add_table_commit(TableCommit("file:///w/a", 70, "t70", 5, 200))
    assert [c.commit_ts for c in store.table_commits_in_range(
        "file:///w/a", 100, 999, by_input_barrier=True)] == [70]
    assert store.table_commit_at_barrier("file:///w/a", 250, True).commit_ts == 70
    assert store.table_commit_at_barrier("file:///w/a", 250, True, as_of_ts=65).commit_ts == 60
    # snapshots (by commit_ts) keep every row: time travel before the revision is unchanged
    assert store.table_commit_at("file:///w/a", 55).commit_ts == 50
    assert store.table_commit_at_barrier("file:///w/a", 55, False).commit_ts == 20  # live


def test_last_input_barrier_counts_committed_attempts_of_the_generation(store):
    assert store.last_input_barrier("p", 0) == 0
    for txn_id, ts, state, barrier, generation in (
            ("a", 10, TxnState.APPLIED, 100, 0), ("b", 20, TxnState.COMMITTED, 200, 0),
            ("c", 30, TxnState.ABORTED, 300, 0), ("d", 40, TxnState.OPEN, 400, 0),
            ("e", 50, TxnState.APPLIED, 500, 1)):
        record = txn(txn_id, ts, state, batch=ts)
        record.generation, record.input_barrier = generation, barrier
        store.insert_txn(record)
    assert store.last_input_barrier("p", 0) == 200
    assert store.last_input_barrier("p", 1) == 500
    assert store.last_input_barrier("q", 0) == 0


def test_the_newest_commit_at_or_before_a_timestamp_of_any_batch_or_generation(store):
    for txn_id, ts, state, commit_ts, generation in (
            ("a", 10, TxnState.APPLIED, 15, 0), ("b", 20, TxnState.APPLIED, 25, 0),
            ("c", 30, TxnState.COMMITTED, 35, 1), ("d", 40, TxnState.ABORTED, 0, 1),
            ("e", 50, TxnState.PREWRITTEN, 0, 1)):
        record = txn(txn_id, ts, state, batch=ts)
        record.generation, record.commit_ts = generation, commit_ts
        store.insert_txn(record)
    other = txn("z", 33, TxnState.APPLIED, pipeline="q")
    other.commit_ts = 34
    store.insert_txn(other)
    assert store.newest_commit_at_or_before("p", 14) is None
    assert store.newest_commit_at_or_before("p", 15).txn_id == "a"
    assert store.newest_commit_at_or_before("p", 34).txn_id == "b"
    assert store.newest_commit_at_or_before("p", 10**12).txn_id == "c"
    assert store.newest_commit_at_or_before("q", 10**12).txn_id == "z"
    assert store.newest_commit_at_or_before("r", 10**12) is None


def test_leases_are_inserted_once_listed_released_and_expired(store):
    from coordinator.store import LeaseRecord

    first = LeaseRecord("l1", "report", (("file:///w/a", 3), ("file:///w/b", 0)), 7 << 18,
                        1000, 5000)
    second = LeaseRecord("l0", "audit", (("file:///w/a", 2),), 6 << 18, 1100, 9000,
                         principal="reporter")
    store.insert_lease(first)
    store.insert_lease(second)
    with pytest.raises(StoreConflict):
        store.insert_lease(first)
    assert store.load_leases() == [second, first]
    assert [x.principal for x in store.load_leases()] == ["reporter", ""]  # who took each
    assert store.delete_expired_leases(4999) == 0
    assert store.delete_expired_leases(5000) == 1
    assert store.load_leases() == [second]
    assert store.delete_lease("l0") and not store.delete_lease("l0")
    assert store.load_leases() == []


def test_a_lease_written_in_a_failed_batch_is_undone(store):
    from coordinator.store import LeaseRecord

    with pytest.raises(RuntimeError), store.batch():
        store.insert_lease(LeaseRecord("l1", "report", (), 0, 1, 2))
        raise RuntimeError("crash inside the batch")
    assert store.load_leases() == []


def test_sqlite_schema_4_is_migrated_to_the_newest_keeping_its_records(tmp_path):
    import sqlite3

    from coordinator.store.schema import SQLITE_MIGRATIONS
    from coordinator.store.sqlite import _SCHEMA

    conn = sqlite3.connect(tmp_path / "coordinator.db")
    conn.executescript(_SCHEMA)
    for migration in SQLITE_MIGRATIONS:
        if migration.version <= 4:
            for statement in migration.statements:
                conn.execute(statement)
    conn.execute("INSERT INTO meta VALUES ('schema_version', 4)")
    row = txn().to_row()
    for column in ("input_barrier", "source_offsets"):
        del row[column]
    conn.execute(f"INSERT INTO transactions ({', '.join(row)}) "
                 f"VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
    conn.execute("INSERT INTO pipelines VALUES ('p', 2, 1, '', 5, 6, '[]', 0)")
    conn.execute("INSERT INTO table_commits VALUES ('file:///w/a', 20, 't1', 3)")
    conn.commit()
    conn.close()
    store = SqliteStore(tmp_path)
    try:
        assert store._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                                   ).fetchone()[0] == 8
        assert store.get_txn("t1") == txn()  # no input barrier, no source offsets
        pipeline = store.load_pipelines()[0]
        assert (pipeline.generation, pipeline.start_barrier, pipeline.plan_generation,
                pipeline.plan_after, pipeline.plan_barrier) == (2, 0, -1, 0, 0)
        assert store.table_commit_at("file:///w/a", 20) == TableCommit("file:///w/a", 20, "t1",
                                                                       3, 0, 0)
        assert store.load_leases() == []
    finally:
        store.close()


def test_prune_keeps_the_newest_committed_batch_with_an_input_barrier(store):
    for txn_id, ts, batch, barrier in (("a", 10, 1, 100), ("b", 20, 2, 200), ("c", 30, 3, 0),
                                       ("d", 40, 4, 0)):
        record = txn(txn_id, ts, TxnState.APPLIED, batch=batch)
        record.input_barrier = barrier
        store.insert_txn(record)
    assert store.prune(cutoff_ms=5000, floor_ts=0, limit=10) == (2, 0)
    assert [store.get_txn(t) is not None for t in "abcd"] == [False, True, False, True]
    assert store.last_input_barrier("p", 0) == 200


def test_the_input_barrier_lookups_read_an_index_never_sorting_a_range(tmp_path):
    """SQLite (the plans of PostgreSQL depend on its statistics): a generation's last input
    barrier and a downstream table's version at a barrier stop at their first row."""
    store = SqliteStore(tmp_path / "data")
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        store.last_input_barrier("p", 0)
        store.table_commit_at_barrier("file:///w/a", 500, True)
        store._conn.set_trace_callback(None)
        selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        assert len(selects) == 2
        plans = [" | ".join(row[3] for row in store._conn.execute(
            f"EXPLAIN QUERY PLAN {statement}")) for statement in selects]
        # the top of the generation's input barriers, not a scan of all its attempts
        assert "USING INDEX transactions_by_input_barrier" in plans[0], plans[0]
        assert "input_barrier>?" in plans[0] and "TEMP B-TREE" not in plans[0], plans[0]
        # the newest commit first (primary key, backwards), not every row <= barrier sorted
        assert "USING INDEX" in plans[1] and "TEMP B-TREE" not in plans[1], plans[1]
    finally:
        store.close()


def test_the_attempts_of_a_batch_are_read_by_the_batch_index_not_the_pipeline_history(
        tmp_path):
    """SQLite: every Open reads the attempts of its batch; seeking the pipeline's
    (pipeline_id, start_ts) index for the order would visit every transaction the pipeline
    ever ran, a cost growing with its history."""
    store = SqliteStore(tmp_path / "data")
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        store.attempts_of("p", 0, 7)
        store._conn.set_trace_callback(None)
        (select,) = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        plan = " | ".join(row[3] for row in store._conn.execute(f"EXPLAIN QUERY PLAN {select}"))
        assert "USING INDEX transactions_by_batch" in plan, plan
        assert "batch_id=?" in plan, plan
    finally:
        store.close()


def test_quarantine_records_are_kept_replaced_by_table_and_transaction_and_ordered(store):
    first = QuarantineRecord("file:///w/b", "t1", "version 3 (OPTIMIZE) removed 1 file", 100)
    other = QuarantineRecord("file:///w/a", "t9", "version 5 changed the metadata", 300)
    later = QuarantineRecord("file:///w/b", "t2", "version 8 removed 2 files", 200)
    for record in (first, other, later):
        store.put_quarantine(record)
    assert store.load_quarantines() == [other, first, later]
    chosen = dataclasses.replace(first, choice=QuarantineChoice.ABANDON, chosen_by="ops",
                                 chosen_ms=150, choice_reason="rows re-entered by hand",
                                 as_of_version=3, released_ms=160)
    store.put_quarantine(chosen)  # the operator's choice replaces the record, never adds one
    assert store.load_quarantines() == [other, chosen, later]
    assert [q.active for q in store.load_quarantines()] == [True, False, True]
