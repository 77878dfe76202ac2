"""The PostgreSQL store beyond the conformance suite: fencing of a stale leader, a takeover that
waits for the old leader's write in flight, schema versions, a cut connection, a restarted
server, and the timestamp oracle across takeovers."""

from __future__ import annotations

import threading
import time
import urllib.parse

import psycopg
import pytest

from coordinator.oracle import TimestampOracle
from coordinator.store import PostgresStore, StoreSchemaError
from coordinator.store.schema import POSTGRES_MIGRATIONS, Migration, migrate_postgres
from percolake.errors import NotLeader, StoreConflict, StoreUnavailable
from percolake.records import TxnRecord
from percolake.states import TxnState
from tests.pg_support import PostgresServer

LEASE_S = 0.3


def txn(txn_id: str, start_ts: int) -> TxnRecord:
    return TxnRecord(txn_id=txn_id, pipeline_id="p", generation=0, batch_id=start_ts, attempt=1,
                     epoch=1, query_id="", state=TxnState.OPEN, start_ts=start_ts,
                     created_ms=1000, updated_ms=1000)


def dbname(dsn: str) -> str:
    return urllib.parse.urlsplit(dsn).path.lstrip("/")


@pytest.fixture
def stores(pg_dsn):
    """Two coordinators' stores on one database; ``made(**options)`` opens more."""
    opened: list[PostgresStore] = []

    def made(**options) -> PostgresStore:
        opened.append(PostgresStore(pg_dsn, **options))
        return opened[-1]

    yield made
    for store in opened:
        store.close()


def expire(store: PostgresStore) -> None:
    while store.read_lease().remaining_s > 0:
        time.sleep(0.02)


def test_a_stale_leader_writes_nothing_after_a_takeover(stores):
    old, new, bystander = stores(), stores(), stores()
    with pytest.raises(NotLeader, match="holds no leader lease"):
        bystander.insert_txn(txn("t0", 5))
    epoch = old.try_acquire_lease("old", "127.0.0.1:1", LEASE_S)
    old.insert_txn(txn("t1", 10))
    expire(new)
    assert new.try_acquire_lease("new", "127.0.0.1:2", LEASE_S) == epoch + 1
    assert old.fencing_epoch == epoch  # it does not know yet: the store tells it
    with pytest.raises(NotLeader, match=f"epoch {epoch + 1}.*coordinator's is {epoch}"):
        old.insert_txn(txn("t2", 20))
    with pytest.raises(NotLeader), old.batch():
        old.write_timestamp_high_water(1 << 40)
    record = old.get_txn("t1")
    record.state = TxnState.ABORTED
    with pytest.raises(NotLeader):
        old.update_txn(record)
    assert record.row_version == 0
    assert new.get_txn("t1").state == TxnState.OPEN  # what it committed before stays
    assert new.get_txn("t2") is None and new.read_timestamp_high_water() == 0
    new.insert_txn(txn("t3", 30))  # the new leader writes


def test_a_batch_sees_its_own_writes_and_others_see_them_at_its_end(stores):
    store, other = stores(), stores()
    store.try_acquire_lease("a", "127.0.0.1:1", 600.0)
    paused, resume = threading.Event(), threading.Event()

    def batch() -> None:
        with store.batch():
            store.insert_txn(txn("t1", 10))
            assert store.get_txn("t1") is not None
            paused.set()
            resume.wait(10)

    writer = threading.Thread(target=batch)
    writer.start()
    assert paused.wait(10)
    store.insert_txn(txn("t2", 20))  # another thread: a transaction of its own, at once
    assert other.get_txn("t2") is not None and other.get_txn("t1") is None
    resume.set()
    writer.join(10)
    assert other.get_txn("t1") is not None


def test_a_batch_with_a_failed_statement_never_commits_the_rest(stores):
    store = stores()
    store.try_acquire_lease("a", "127.0.0.1:1", 600.0)
    with pytest.raises(StoreConflict, match="rolled back"), store.batch():
        store.insert_txn(txn("t1", 10))
        with pytest.raises(psycopg.errors.DivisionByZero):
            store._write("SELECT 1 / 0", ())  # swallowed by the caller
    assert store.get_txn("t1") is None
    store.insert_txn(txn("t1", 10))


def test_a_takeover_waits_for_the_old_leaders_write_in_flight(stores):
    old = stores(lease_lock_timeout_s=0.3)
    new = stores(lease_lock_timeout_s=0.3)
    epoch = old.try_acquire_lease("old", "127.0.0.1:1", LEASE_S)
    inside, finish = threading.Event(), threading.Event()

    def write_in_flight() -> None:
        with old.batch():
            old.insert_txn(txn("t1", 10))  # passed the fence: holds the lease row's share lock
            inside.set()
            finish.wait(10)

    writer = threading.Thread(target=write_in_flight)
    writer.start()
    assert inside.wait(10)
    expire(new)
    started = time.monotonic()
    assert new.try_acquire_lease("new", "127.0.0.1:2", LEASE_S) is None  # lock_timeout
    assert time.monotonic() - started >= 0.25
    finish.set()
    writer.join(10)
    assert new.try_acquire_lease("new", "127.0.0.1:2", LEASE_S) == epoch + 1
    assert new.get_txn("t1") is not None  # committed before the takeover: seen by the new one
    with pytest.raises(NotLeader):
        old.insert_txn(txn("t2", 20))


def test_the_leaders_own_writes_never_hold_its_renewals_up(stores):
    store = stores()
    epoch = store.try_acquire_lease("a", "127.0.0.1:1", 600.0)
    stop = threading.Event()
    give_up = time.monotonic() + 4  # a renewal starved by share locks would wait until here

    def write(worker: int) -> None:  # overlapping write transactions: one always running
        i = 0
        while not stop.is_set() and time.monotonic() < give_up:
            with store.batch():
                store.insert_txn(txn(f"w{worker}-{i}", worker * 100_000 + i + 1))
                time.sleep(0.05)
            i += 1

    writers = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for writer in writers:
        writer.start()
    try:
        time.sleep(0.1)
        slowest = 0.0
        for _ in range(8):
            started = time.monotonic()
            assert store.renew_lease(epoch, 600.0)
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.03)
    finally:
        stop.set()
        for writer in writers:
            writer.join(10)
    assert slowest < 1.0, f"a renewal waited {slowest:.3f} s for the leader's own writes"


def test_a_paused_leaders_share_lock_ends_with_its_idle_session(stores):
    old = stores(idle_in_txn_timeout_s=0.5)
    new = stores(lease_lock_timeout_s=0.2)
    epoch = old.try_acquire_lease("old", "127.0.0.1:1", LEASE_S)
    outcome: list[BaseException] = []
    inside, finish = threading.Event(), threading.Event()

    def paused_in_a_batch() -> None:
        try:
            with old.batch():
                old.insert_txn(txn("t1", 10))
                inside.set()
                finish.wait(10)  # as if SIGSTOPped: idle in its transaction
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    writer = threading.Thread(target=paused_in_a_batch)
    writer.start()
    assert inside.wait(10)
    expire(new)
    deadline = time.monotonic() + 5
    while (taken := new.try_acquire_lease("new", "127.0.0.1:2", LEASE_S)) is None:
        assert time.monotonic() < deadline, "the takeover never got the lease row"
    assert taken == epoch + 1
    finish.set()
    writer.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailable), outcome
    assert new.get_txn("t1") is None  # its session was ended: the batch never committed


def test_first_creation_by_two_processes_at_once(pg_dsn):
    barrier = threading.Barrier(2)
    results: list[object] = []

    def create() -> None:
        barrier.wait()
        try:
            results.append(PostgresStore(pg_dsn))
        except Exception as exc:  # noqa: BLE001 - asserted below
            results.append(exc)

    threads = [threading.Thread(target=create) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(isinstance(r, PostgresStore) for r in results) and len(results) == 2, results
    for store in results:
        store.close()


def test_schema_1_is_migrated_to_the_newest_in_one_transaction(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert migrate_postgres(conn, "test", POSTGRES_MIGRATIONS[:1]) == 1
        conn.execute("INSERT INTO meta VALUES ('ts_high_water', 77)")
        broken = (*POSTGRES_MIGRATIONS, Migration(6, (
            "CREATE TABLE extra (a INTEGER)", "SELECT no_such_function()")))
        with pytest.raises(psycopg.errors.UndefinedFunction):
            migrate_postgres(conn, "test", broken)
        # all of 2 to 6 rolled back together: still at 1, no lease table, no extra table
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                            ).fetchone()[0] == 1
        assert conn.execute("SELECT to_regclass('leader_lease'), to_regclass('extra'), "
                            "to_regclass('tokens'), to_regclass('table_writers')"
                            ).fetchone() == (None, None, None, None)
    store = PostgresStore(pg_dsn)
    try:
        assert store.read_timestamp_high_water() == 77
        assert store.read_lease().epoch == 0
        assert store.try_acquire_lease("a", "127.0.0.1:1", 60.0) == 1
        store.write_timestamp_high_water(78)
    finally:
        store.close()
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                            ).fetchone()[0] == 8


def test_schema_4_is_migrated_to_the_newest_keeping_its_records(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert migrate_postgres(conn, "test", POSTGRES_MIGRATIONS[:4]) == 4
        row = txn("t1", 10).to_row()
        for column in ("input_barrier", "source_offsets"):
            del row[column]
        conn.execute(f"INSERT INTO transactions ({', '.join(row)}) "
                     f"VALUES ({', '.join(['%s'] * len(row))})", tuple(row.values()))
        conn.execute("INSERT INTO pipelines VALUES ('p', 2, 1, '', 5, 6, '[]', 0)")
        conn.execute("INSERT INTO table_commits VALUES ('file:///w/a', 20, 't1', 3)")
        conn.execute("INSERT INTO read_edges VALUES ('q', 'file:///w/a', 9)")
    store = PostgresStore(pg_dsn)
    try:
        assert store.get_txn("t1") == txn("t1", 10)  # no input barrier, no offsets
        pipeline = store.load_pipelines()[0]
        assert (pipeline.generation, pipeline.start_barrier, pipeline.plan_generation,
                pipeline.plan_after, pipeline.plan_barrier) == (2, 0, -1, 0, 0)
        commit = store.table_commit_at("file:///w/a", 20)
        assert (commit.input_barrier, commit.superseded_ts) == (0, 0)
        assert store.load_leases() == []
        from coordinator.store.base import ReadEdge
        assert store.load_read_edges() == [ReadEdge("q", "file:///w/a", 9, 0)]  # from the start
    finally:
        store.close()
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                            ).fetchone()[0] == 8


def test_a_newer_schema_is_refused(pg_dsn):
    PostgresStore(pg_dsn).close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE meta SET value = 9 WHERE key = 'schema_version'")
    with pytest.raises(StoreSchemaError) as refused:
        PostgresStore(pg_dsn)
    assert str(refused.value) == (
        f"the store at 127.0.0.1:{urllib.parse.urlsplit(pg_dsn).port}/{dbname(pg_dsn)} has "
        "schema 9; this coordinator knows up to 8: upgrade the coordinator")


def test_a_connection_cut_mid_batch_is_unavailable_then_reconnects(postgres_server, pg_dsn):
    parts = urllib.parse.urlsplit(pg_dsn)
    secret_dsn = parts._replace(netloc=f"postgres:s3cret-pw@{parts.hostname}:{parts.port}"
                                ).geturl()
    store = PostgresStore(secret_dsn)
    try:
        store.try_acquire_lease("a", "127.0.0.1:1", 600.0)
        with pytest.raises(StoreUnavailable) as cut, store.batch():
            store.insert_txn(txn("t1", 10))
            assert postgres_server.kill_connections(dbname(pg_dsn)) >= 1
            store.insert_txn(txn("t2", 20))
        message = str(cut.value)
        assert f"127.0.0.1:{parts.port}/{dbname(pg_dsn)}" in message
        assert "s3cret-pw" not in message
        assert store.get_txn("t1") is None  # the batch never committed
        store.insert_txn(txn("t3", 30))  # the next calls get fresh connections
        postgres_server.kill_connections(dbname(pg_dsn))  # idle pool connections cut
        assert store.get_txn("t3") is not None
        store.insert_txn(txn("t4", 40))
    finally:
        store.close()


def test_a_restarted_server_is_unavailable_while_down_then_serves(tmp_path):
    server = PostgresServer(tmp_path / "postgres").start()
    try:
        dsn = server.create_database("restarts")
        store = PostgresStore(dsn, connect_timeout_s=0.5)
        epoch = store.try_acquire_lease("a", "127.0.0.1:1", 600.0)
        store.insert_txn(txn("t1", 10))
        server.stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="restarts"):
            store.ping()
        with pytest.raises(StoreUnavailable):
            store.insert_txn(txn("t2", 20))
        with pytest.raises(StoreUnavailable):
            store.get_txn("t1")
        assert time.monotonic() - started < 10  # fails fast while down
        with pytest.raises(StoreUnavailable):
            PostgresStore(dsn, connect_timeout_s=0.5)
        server.start()
        deadline = time.monotonic() + 10
        while True:
            try:
                store.ping()
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "no reconnection after the restart"
                time.sleep(0.1)
        assert store.get_txn("t1") is not None and store.fencing_epoch == epoch
        store.insert_txn(txn("t2", 20))
        store.close()
    finally:
        server.stop()


def test_the_oracle_stays_monotonic_across_three_takeovers(stores):
    # Each coordinator's wall clock is its own; b's runs 10 s behind a's.
    clocks = {"a": 1_700_000_000_000, "b": 1_699_999_990_000}
    nodes = {"a": stores(), "b": stores()}
    handed: list[int] = []
    old: tuple[str, TimestampOracle] | None = None
    for term, name in enumerate("abab"):
        store = nodes[name]
        expire(store)
        assert store.try_acquire_lease(name, "", LEASE_S) == term + 1
        oracle = TimestampOracle(store, wall_ms=lambda name=name: clocks[name], window_ms=5)
        assert not handed or oracle.last > max(handed)
        for _ in range(12):  # crosses the 5 ms window: the mark is written, fenced
            handed.append(oracle.next())
            clocks[name] += 1
        if old is not None:  # the previous leader cannot extend its window any more
            clocks[old[0]] += 20_000  # its clock leaps past its window: a mark must be written
            with pytest.raises(NotLeader):
                old[1].next()
        old = (name, oracle)
    assert len(handed) == 48 and handed == sorted(set(handed))
