"""The coordinator core with the in-memory store, a fake Delta applier and a fake clock."""

import uuid

import pytest

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.store import MemoryStore
from percolake.errors import (
    Conflict,
    FailedPrecondition,
    Fenced,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QueryIdMismatch,
    ResourceExhausted,
    TransactionAborted,
)
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from percolake.states import TxnState

SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeDelta:
    """Counts Delta versions per table; repeated applies of a txn return its first version."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}
        self.applied: dict[tuple[str, str], int] = {}
        self.order: list[tuple[str, int]] = []

    def __call__(self, write, *, app_id, app_version, txn_id, commit_ts):
        key = (write.table, txn_id)
        if key not in self.applied:
            self.versions[write.table] = self.versions.get(write.table, -1) + 1
            self.applied[key] = self.versions[write.table]
            self.order.append((write.table, commit_ts))
        return self.applied[key]


def make_env(tmp_path, **config):
    clock, delta, removed = FakeClock(), FakeDelta(), []
    core = TransactionCoordinator(
        MemoryStore(),
        CoordinatorConfig([str(tmp_path)], txn_timeout_s=60, conflict_wait_s=0.2, **config),
        applier=delta, remove_files=removed.append, monotonic=clock)
    return core, clock, delta, removed, tmp_path


@pytest.fixture
def env(tmp_path):
    return make_env(tmp_path)


@pytest.fixture
def shared_env(tmp_path):
    """Two pipelines racing for one table (--shared-table-writers): write-write conflicts
    between transactions stay part of the protocol whoever owns the table."""
    return make_env(tmp_path, shared_table_writers=True)


def table(tmp_path, name):
    return f"file://{tmp_path}/{name}"


def write(txn_id, tbl, rows=3):
    return TableWriteRecord(tbl, WriteMode.APPEND, (AddFileRecord(
        f"_percolake/{txn_id}/part-0.parquet", 100, {}, 0, f'{{"numRecords":{rows}}}'),), SCHEMA)


def run_batch(core, tmp_path, pipeline, batch, tables, epoch=None, query_id=None):
    txn, committed = core.open_transaction(pipeline, batch, epoch, query_id)
    assert not committed
    paths = [table(tmp_path, t) for t in tables]
    core.prewrite(txn.txn_id, epoch, [write(txn.txn_id, p) for p in paths])
    return core.commit(txn.txn_id, epoch, paths)


def test_full_protocol_reaches_applied(env):
    core, _, _, _, tmp = env
    txn = run_batch(core, tmp, "p", 0, ["a", "b", "c"])
    assert txn.state == TxnState.COMMITTED and txn.commit_ts > txn.start_ts
    done = core.report_applied(txn.txn_id, None, {table(tmp, t): 0 for t in "abc"})
    assert done.state == TxnState.APPLIED
    assert {e.delta_version for e in done.tables.values()} == {0}


def test_commit_and_abort_are_idempotent_and_never_cross(env):
    core, _, _, removed, tmp = env
    committed = run_batch(core, tmp, "p", 0, ["a"])
    assert core.commit(committed.txn_id, None).commit_ts == committed.commit_ts
    with pytest.raises(FailedPrecondition, match="never aborted"):
        core.abort(committed.txn_id, None)
    opened, _ = core.open_transaction("p", 1)
    core.declare_tables(opened.txn_id, None, [table(tmp, "b")])
    assert core.abort(opened.txn_id, None, "user error").state == TxnState.ABORTED
    assert core.abort(opened.txn_id, None).abort_reason == "user error"
    assert removed == [f"{table(tmp, 'b')}/_percolake/{opened.txn_id}"]
    with pytest.raises(TransactionAborted):
        core.commit(opened.txn_id, None)


def test_empty_transaction_commits_and_marks_the_batch_done(env):
    core, *_ = env
    txn, _ = core.open_transaction("p", 7)
    done = core.commit(txn.txn_id, None)
    assert done.state == TxnState.APPLIED and done.commit_ts > 0
    again, committed = core.open_transaction("p", 7)
    assert committed and again.txn_id == txn.txn_id


def test_reopen_of_a_committed_batch_answers_the_committed_attempt(env):
    core, _, _, _, tmp = env
    first = run_batch(core, tmp, "p", 3, ["a"])
    again, committed = core.open_transaction("p", 3)
    assert committed and again.txn_id == first.txn_id and again.commit_ts == first.commit_ts


def test_reopen_of_a_live_batch_aborts_the_older_attempt(env):
    core, _, _, removed, tmp = env
    old, _ = core.open_transaction("p", 3)
    core.declare_tables(old.txn_id, None, [table(tmp, "a")])
    new, committed = core.open_transaction("p", 3)
    assert not committed and new.attempt == 2
    assert core.get_transaction(old.txn_id).state == TxnState.ABORTED
    assert removed == [f"{table(tmp, 'a')}/_percolake/{old.txn_id}"]
    core.declare_tables(new.txn_id, None, [table(tmp, "a")])  # the hold was released


def test_older_epoch_is_fenced_and_changes_nothing(env):
    core, _, _, _, tmp = env
    first = core.register_pipeline("p", None).epoch
    txn, _ = core.open_transaction("p", 0, first)
    second = core.register_pipeline("p", None).epoch
    assert second == first + 1
    # registration aborted the old driver's live attempt
    assert core.get_transaction(txn.txn_id).state == TxnState.ABORTED
    with pytest.raises(Fenced, match="fenced"):
        core.open_transaction("p", 1, first)
    new, _ = core.open_transaction("p", 1, second)
    before = core.get_transaction(new.txn_id)
    with pytest.raises(Fenced):
        core.prewrite(new.txn_id, first, [write(new.txn_id, table(tmp, "a"))])
    with pytest.raises(Fenced):
        core.abort(new.txn_id, first)
    assert core.get_transaction(new.txn_id) == before


def test_requests_without_epoch_are_refused_on_a_registered_pipeline(env):
    core, *_ = env
    core.register_pipeline("p", None)
    with pytest.raises(FailedPrecondition, match="without an epoch"):
        core.open_transaction("p", 0)
    with pytest.raises(FailedPrecondition, match="never issued"):
        core.open_transaction("p", 0, 9)


def test_query_id_binds_on_first_use_and_refuses_another(env):
    core, *_ = env
    q1, q2 = str(uuid.uuid4()), str(uuid.uuid4())
    epoch = core.register_pipeline("p", q1).epoch
    core.open_transaction("p", 0, epoch, q1)
    with pytest.raises(QueryIdMismatch) as refused:
        core.register_pipeline("p", q2)
    message = str(refused.value)
    assert q1 in message and q2 in message and "reset-pipeline" in message
    with pytest.raises(FailedPrecondition, match="without a query id"):
        core.open_transaction("p", 1, epoch)
    with pytest.raises(InvalidArgument, match="not a Spark query id"):
        core.open_transaction("p", 1, epoch, "not-a-uuid")


def test_table_held_by_a_live_transaction_is_a_conflict_naming_the_holder(shared_env):
    core, *_ , tmp = shared_env
    holder, _ = core.open_transaction("p", 0)
    core.declare_tables(holder.txn_id, None, [table(tmp, "a")])
    other, _ = core.open_transaction("q", 0)
    with pytest.raises(Conflict, match=holder.txn_id):
        core.declare_tables(other.txn_id, None, [table(tmp, "a")])


def test_committed_holder_is_rolled_forward_before_the_next_write(shared_env):
    core, _, delta, _, tmp = shared_env
    first = run_batch(core, tmp, "p", 0, ["a"])
    second, _ = core.open_transaction("q", 0)
    core.declare_tables(second.txn_id, None, [table(tmp, "a")])
    assert core.get_transaction(first.txn_id).state == TxnState.APPLIED
    assert delta.order == [(table(tmp, "a"), first.commit_ts)]


def test_expired_holder_is_aborted_and_its_table_taken(shared_env):
    core, clock, _, removed, tmp = shared_env
    stale, _ = core.open_transaction("p", 0)
    core.declare_tables(stale.txn_id, None, [table(tmp, "a")])
    clock.now += 61
    fresh, _ = core.open_transaction("q", 0)
    core.declare_tables(fresh.txn_id, None, [table(tmp, "a")])
    assert core.get_transaction(stale.txn_id).state == TxnState.ABORTED
    assert f"{table(tmp, 'a')}/_percolake/{stale.txn_id}" in removed


def test_heartbeats_extend_and_silence_expires(env):
    core, clock, *_ = env
    txn, _ = core.open_transaction("p", 0, timeout_ms=10_000)
    for _ in range(5):
        clock.now += 8
        assert core.heartbeat(txn.txn_id, None) == (TxnState.OPEN, 10_000)
    clock.now += 11
    core.resolve_once()
    assert core.get_transaction(txn.txn_id).state == TxnState.ABORTED
    assert "expired" in core.get_transaction(txn.txn_id).abort_reason
    with pytest.raises(TransactionAborted):
        core.commit(txn.txn_id, None)


def test_commit_needs_every_named_and_declared_table_prewritten(env):
    core, *_ , tmp = env
    txn, _ = core.open_transaction("p", 0)
    core.declare_tables(txn.txn_id, None, [table(tmp, "a"), table(tmp, "b")])
    core.prewrite(txn.txn_id, None, [write(txn.txn_id, table(tmp, "a"))])
    with pytest.raises(FailedPrecondition, match="no prewrite"):
        core.commit(txn.txn_id, None, [table(tmp, "a")])
    assert core.get_transaction(txn.txn_id).state == TxnState.PREWRITTEN


def test_release_unwritten_drops_declared_tables_frees_them_and_deletes_their_folders(shared_env):
    core, _, delta, removed, tmp = shared_env
    a, b = table(tmp, "a"), table(tmp, "b")
    txn, _ = core.open_transaction("p", 0, tables=[a, b])
    b_folder = txn.tables[b].write_location
    done = core.commit(txn.txn_id, None, [a], [write(txn.txn_id, a)], release_unwritten=True)
    assert done.state == TxnState.COMMITTED and list(done.tables) == [a]
    assert removed == [b_folder]
    assert list(core.store.get_txn(txn.txn_id).tables) == [a]  # durable, not only in memory
    other, _ = core.open_transaction("q", 0, tables=[b])  # b is free at once
    assert list(other.tables) == [b]
    core.report_applied(txn.txn_id, None, {a: 0})
    assert core.get_transaction(txn.txn_id).state == TxnState.APPLIED
    assert delta.order == []


def test_release_unwritten_still_refuses_a_named_table_without_a_write(env):
    core, _, _, removed, tmp = env
    a, b = table(tmp, "a"), table(tmp, "b")
    txn, _ = core.open_transaction("p", 0, tables=[a, b])
    with pytest.raises(FailedPrecondition, match="no prewrite"):
        core.commit(txn.txn_id, None, [a, b], [write(txn.txn_id, a)], release_unwritten=True)
    assert core.get_transaction(txn.txn_id).state == TxnState.PREWRITTEN and removed == []


def test_commit_with_writes_is_one_round_trip_and_retries_cleanly(env):
    core, *_ , tmp = env
    txn, _ = core.open_transaction("p", 0)
    writes = [write(txn.txn_id, table(tmp, "a")), write(txn.txn_id, table(tmp, "b"))]
    done = core.commit(txn.txn_id, None, writes=writes)
    assert done.state == TxnState.COMMITTED and len(done.tables) == 2
    assert core.commit(txn.txn_id, None, writes=writes).commit_ts == done.commit_ts


def test_prewrite_refuses_files_outside_the_attempt_and_oversized_intents(env):
    core, *_ , tmp = env
    txn, _ = core.open_transaction("p", 0)
    outside = TableWriteRecord(table(tmp, "a"), WriteMode.APPEND,
                               (AddFileRecord("part-0.parquet", 1),), SCHEMA)
    with pytest.raises(InvalidArgument, match="_percolake"):
        core.prewrite(txn.txn_id, None, [outside])
    core.config.max_intent_bytes = 50_000
    huge = TableWriteRecord(table(tmp, "a"), WriteMode.APPEND, tuple(
        AddFileRecord(f"_percolake/{txn.txn_id}/{i:08d}.parquet", 1, {}, 0, "{}")
        for i in range(1000)), SCHEMA)
    with pytest.raises(ResourceExhausted, match="never truncated"):
        core.prewrite(txn.txn_id, None, [huge])
    with pytest.raises(PermissionDenied):
        core.declare_tables(txn.txn_id, None, ["/etc/passwd-table"])


def test_snapshot_rolls_forward_and_is_exactly_the_commits_below_it(env):
    core, _, delta, _, tmp = env
    t0 = run_batch(core, tmp, "p", 0, ["a", "b"])
    snap0 = core.get_snapshot([table(tmp, "a"), table(tmp, "b")])
    assert snap0.snapshot_ts > t0.commit_ts
    assert snap0.versions == {table(tmp, "a"): 0, table(tmp, "b"): 0}
    t1 = run_batch(core, tmp, "p", 1, ["a"])
    snap1 = core.get_snapshot([table(tmp, "a"), table(tmp, "b"), table(tmp, "never")])
    assert snap1.versions == {table(tmp, "a"): 1, table(tmp, "b"): 0, table(tmp, "never"): None}
    assert core.get_transaction(t1.txn_id).state == TxnState.APPLIED
    back = core.get_snapshot([table(tmp, "a")], as_of_ts=t0.commit_ts)
    assert back.versions[table(tmp, "a")] == 0
    by_batch = core.get_snapshot([table(tmp, "a")], as_of_batch=("p", None, 1))
    assert by_batch.snapshot_ts == t1.commit_ts and by_batch.versions[table(tmp, "a")] == 1
    assert snap1.snapshot_ts > snap0.snapshot_ts
    with pytest.raises(InvalidArgument, match="future"):
        core.get_snapshot([table(tmp, "a")], as_of_ts=snap1.snapshot_ts + 10**9)
    with pytest.raises(NotFound):
        core.get_snapshot([table(tmp, "a")], as_of_batch=("p", None, 99))


def test_resolver_rolls_forward_a_commit_whose_participant_died(env):
    core, *_ , tmp = env
    core.config.roll_forward_after_s = 0
    txn = run_batch(core, tmp, "p", 0, ["a", "b"])
    core.resolve_once()
    assert core.get_transaction(txn.txn_id).state == TxnState.APPLIED


def test_restart_reloads_live_transactions_and_holds(tmp_path):
    store = MemoryStore()
    config = CoordinatorConfig([str(tmp_path)], conflict_wait_s=0.1, shared_table_writers=True)
    first = TransactionCoordinator(store, config, applier=FakeDelta())
    txn, _ = first.open_transaction("p", 0)
    first.declare_tables(txn.txn_id, None, [table(tmp_path, "a")])
    second = TransactionCoordinator(store, config, applier=FakeDelta())
    other, _ = second.open_transaction("q", 0)
    with pytest.raises(Conflict):
        second.declare_tables(other.txn_id, None, [table(tmp_path, "a")])
    assert second.oracle.next() > txn.start_ts


def test_closing_the_core_wakes_a_request_waiting_for_a_table_hold(tmp_path):
    import threading
    import time

    from percolake.errors import NotLeader

    core = TransactionCoordinator(
        MemoryStore(), CoordinatorConfig([str(tmp_path)], conflict_wait_s=30,
                                         shared_table_writers=True),
        applier=FakeDelta())
    holder, _ = core.open_transaction("p", 0)
    core.declare_tables(holder.txn_id, None, [table(tmp_path, "a")])
    waiter, _ = core.open_transaction("q", 0)
    outcome: list[BaseException] = []

    def wait_for_hold() -> None:
        try:
            core.declare_tables(waiter.txn_id, None, [table(tmp_path, "a")])
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    thread = threading.Thread(target=wait_for_hold)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # waiting: the hold is live for 30 s
    started = time.monotonic()
    core.close()
    thread.join(timeout=5)
    assert not thread.is_alive() and time.monotonic() - started < 1.0
    assert len(outcome) == 1 and isinstance(outcome[0], NotLeader)


def test_reset_starts_a_generation_keeps_history_and_is_idempotent(env):
    core, _, _, _, tmp = env
    q1, q2 = str(uuid.uuid4()), str(uuid.uuid4())
    epoch = core.register_pipeline("p", q1).epoch
    done = run_batch(core, tmp, "p", 0, ["a"], epoch, q1)
    live, _ = core.open_transaction("p", 1, epoch, q1)
    core.declare_tables(live.txn_id, epoch, [table(tmp, "b")])
    pipeline, changed, aborted = core.reset_pipeline("p", "checkpoint deleted", 0)
    assert changed and pipeline.generation == 1 and pipeline.epoch == epoch + 1
    assert aborted == [live.txn_id]
    assert core.get_transaction(done.txn_id).state == TxnState.COMMITTED  # untouched
    again, changed_again, _ = core.reset_pipeline("p", "checkpoint deleted", 0)
    assert not changed_again and again.generation == 1
    with pytest.raises(FailedPrecondition, match="generation 1"):
        core.reset_pipeline("p", "other reason", 0)
    with pytest.raises(Fenced):
        core.open_transaction("p", 2, epoch, q1)
    epoch2 = core.register_pipeline("p", q2).epoch
    reused = run_batch(core, tmp, "p", 0, ["a"], epoch2, q2)  # batch 0 again, new generation
    assert reused.generation == 1 and reused.txn_id != done.txn_id
    with pytest.raises(NotFound):
        core.reset_pipeline("nope", "x", None)


def test_sweep_deletes_leftover_files_of_recent_aborts(env):
    core, _, _, removed, tmp = env
    txn, _ = core.open_transaction("p", 0)
    core.declare_tables(txn.txn_id, None, [table(tmp, "a")])
    core.abort(txn.txn_id, None)
    removed.clear()
    assert core.sweep_recent_aborts() == 1
    assert removed == [f"{table(tmp, 'a')}/_percolake/{txn.txn_id}"]


def test_reset_requiring_idle_refuses_while_the_old_driver_is_active(env):
    core, clock, _, _, tmp = env
    query = str(uuid.uuid4())
    epoch = core.register_pipeline("p", query).epoch
    run_batch(core, tmp, "p", 0, ["a"], epoch, query)
    with pytest.raises(FailedPrecondition, match="on_checkpoint_reset"):
        core.reset_pipeline("p", "auto", None, require_idle=True)
    clock.now += 61  # the last commit is now older than the transaction timeout
    pipeline, changed, _ = core.reset_pipeline("p", "auto", None, require_idle=True)
    assert changed and pipeline.generation == 1


def test_a_refused_late_request_of_an_aborted_attempt_cleans_its_folder_again(env):
    core, _, _, removed, tmp = env
    txn, _ = core.open_transaction("p", 0)
    core.declare_tables(txn.txn_id, None, [table(tmp, "a")])
    core.abort(txn.txn_id, None)
    removed.clear()  # a late executor writes into the folder after the cleanup
    with pytest.raises(TransactionAborted):
        core.prewrite(txn.txn_id, None, [write(txn.txn_id, table(tmp, "a"))])
    core.resolve_once()
    assert removed == [f"{table(tmp, 'a')}/_percolake/{txn.txn_id}"]


def test_committed_but_unapplied_write_of_the_old_generation_is_applied_after_a_reset(env):
    core, _, delta, _, tmp = env
    query = str(uuid.uuid4())
    epoch = core.register_pipeline("p", query).epoch
    old = run_batch(core, tmp, "p", 4, ["a"], epoch, query)  # its driver dies before applying
    core.reset_pipeline("p", "checkpoint lost", 0)
    snap = core.get_snapshot([table(tmp, "a")])
    assert snap.versions[table(tmp, "a")] == 0
    assert core.get_transaction(old.txn_id).state == TxnState.APPLIED
    assert delta.order == [(table(tmp, "a"), old.commit_ts)]
