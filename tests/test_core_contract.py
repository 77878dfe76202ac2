"""Contract gaps of the core (issue 13): each test failed before its fix.

- I10: attempt files are deleted only once the abort that orphans them is on disk (item 2);
- I9: a query id of an earlier generation, or of the one a reset replaces, never binds a later
  one, whoever resets (7);
- calls without an epoch are refused on a bound pipeline (8);
- cleanup failures never escape, one bad transaction never stops the resolver (10);
- the resolver's roll-forward delay and ``require_idle`` use the monotonic clock (11);
- reported Delta versions are checked against the table's log (12).
"""

from __future__ import annotations

import sqlite3
import time
import uuid

import pytest

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.store import MemoryStore, SqliteStore
from percolake.errors import FailedPrecondition, QueryIdMismatch
from percolake.records import PipelineRecord, TxnRecord
from percolake.states import TxnState
from tests.test_core import FakeClock, FakeDelta, run_batch, table, write


class DurableStateProbe:
    """``remove_files`` that records the abort state another connection sees on disk."""

    def __init__(self, db) -> None:
        self.db = db
        self.seen: list[tuple[str, str]] = []

    def __call__(self, location: str) -> None:
        txn_id = location.rsplit("/", 1)[1]
        with sqlite3.connect(self.db) as conn:
            row = conn.execute("SELECT state FROM transactions WHERE txn_id = ?",
                               (txn_id,)).fetchone()
        self.seen.append((txn_id, row[0] if row else "missing"))


@pytest.fixture
def durable(tmp_path):
    """A core over a group-committing SQLite store, as the daemon runs it."""
    data = tmp_path / "data"
    data.mkdir()
    store = SqliteStore(data, group_commit=True)
    probe, clock = DurableStateProbe(store.path), FakeClock()
    core = TransactionCoordinator(
        store, CoordinatorConfig([str(tmp_path)], txn_timeout_s=60, conflict_wait_s=0.2),
        applier=FakeDelta(), remove_files=probe, monotonic=clock)
    yield core, probe, clock, tmp_path
    store.close()


def test_files_are_deleted_only_after_the_abort_is_durable(durable):
    core, probe, clock, tmp = durable
    expired, _ = core.open_transaction("expiring", 0, tables=[table(tmp, "a")])
    core.store.flush()
    clock.now += 61
    core.resolve_once()  # expiry by the resolver, no RPC reply to flush for it
    aborted, _ = core.open_transaction("aborted", 0, tables=[table(tmp, "b")])
    core.abort(aborted.txn_id, None)
    old, _ = core.open_transaction("replayed", 0, tables=[table(tmp, "c")])
    core.open_transaction("replayed", 0)  # supersedes the first attempt
    fenced, _ = core.open_transaction("fenced", 0, tables=[table(tmp, "d")])
    core.register_pipeline("fenced", None)
    deleted = dict(probe.seen)
    for txn in (expired, aborted, old, fenced):
        assert deleted.get(txn.txn_id) == "ABORTED", probe.seen


def test_query_id_of_an_earlier_generation_never_binds_a_later_one(tmp_path):
    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)]),
                                  applier=FakeDelta())
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    epoch = core.register_pipeline("p", old).epoch
    run_batch(core, tmp_path, "p", 5, ["a"], epoch, old)
    core.reset_pipeline("p", "checkpoint replaced", 0)
    with pytest.raises(FailedPrecondition, match="reset") as refused:
        core.register_pipeline("p", old)  # the old checkpoint's driver comes back
    assert "generation 0" in str(refused.value) and "new checkpoint" in str(refused.value)
    with pytest.raises(FailedPrecondition, match="checkpoint replaced"):
        core.open_transaction("p", 5, core.get_pipeline("p").epoch, old)
    # named in a reset, by an operator too: its batch 5 would be written a second time
    with pytest.raises(FailedPrecondition, match="drove generation 0"):
        core.reset_pipeline("p", "restart old checkpoint", 1, query_id=old)
    assert core.get_pipeline("p").query_id == ""  # nothing bound by the refusals
    pipeline, changed, _ = core.reset_pipeline("p", "new checkpoint", 1, query_id=new)
    assert changed and pipeline.generation == 2 and pipeline.query_id == new
    epoch = core.register_pipeline("p", new).epoch
    assert run_batch(core, tmp_path, "p", 5, ["a"], epoch, new).generation == 2
    with pytest.raises(QueryIdMismatch):
        core.register_pipeline("p", old)


@pytest.mark.parametrize("require_idle", [False, True], ids=["plain", "require_idle"])
def test_a_reset_never_binds_the_query_id_of_the_generation_it_replaces(tmp_path, require_idle):
    """I9 and I2: bound again, the same query's replay of batch 0 would land a second time."""
    clock = FakeClock()
    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)],
                                                                   txn_timeout_s=60),
                                  applier=FakeDelta(), monotonic=clock)
    query = str(uuid.uuid4())
    epoch = core.register_pipeline("p", query).epoch
    run_batch(core, tmp_path, "p", 0, ["a"], epoch, query)
    clock.now += 61  # idle
    with pytest.raises(FailedPrecondition, match="drives generation 0") as refused:
        core.reset_pipeline("p", "same checkpoint", 0, require_idle=require_idle,
                            query_id=query)
    assert "new checkpoint" in str(refused.value)
    pipeline = core.get_pipeline("p")
    assert (pipeline.generation, pipeline.epoch, pipeline.query_id) == (0, epoch, query)
    assert core.open_transaction("p", 0, epoch, query)[1]  # still a replay, not a new batch


def test_a_plain_reset_lets_a_new_query_id_bind(tmp_path):
    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)]),
                                  applier=FakeDelta())
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    core.register_pipeline("p", old)
    core.reset_pipeline("p", "checkpoint replaced", 0)
    assert core.register_pipeline("p", new).query_id == new


def test_calls_without_an_epoch_are_refused_on_a_bound_pipeline(tmp_path):
    store = MemoryStore()
    query = str(uuid.uuid4())
    # a pipeline bound to a query id but never registered (as an Open with a query id and no
    # epoch used to leave it)
    store.insert_pipeline(PipelineRecord("p", query_id=query, created_ms=1))
    txn = TxnRecord(txn_id=uuid.uuid4().hex, pipeline_id="p", generation=0, batch_id=0,
                    attempt=1, epoch=0, query_id=query, state=TxnState.OPEN, start_ts=1,
                    created_ms=1, updated_ms=1)
    store.insert_txn(txn)
    core = TransactionCoordinator(store, CoordinatorConfig([str(tmp_path)]),
                                  applier=FakeDelta())
    for call in (lambda: core.abort(txn.txn_id, None),
                 lambda: core.heartbeat(txn.txn_id, None),
                 lambda: core.commit(txn.txn_id, None)):
        with pytest.raises(FailedPrecondition, match="without an epoch"):
            call()
    assert core.get_transaction(txn.txn_id).state == TxnState.OPEN
    with pytest.raises(FailedPrecondition, match="register first"):
        core.open_transaction("q", 0, None, str(uuid.uuid4()))


def test_cleanup_failures_never_escape_and_never_stop_the_resolver(tmp_path):
    clock, delta = FakeClock(), FakeDelta()
    failing: set[str] = set()

    def remove(location: str) -> None:
        if any(t in location for t in failing):
            raise ValueError("not an OSError")

    core = TransactionCoordinator(
        MemoryStore(), CoordinatorConfig([str(tmp_path)], txn_timeout_s=60,
                                         roll_forward_after_s=5),
        applier=delta, remove_files=remove, monotonic=clock)
    bad, _ = core.open_transaction("bad", 0, tables=[table(tmp_path, "x")])
    failing.add(bad.txn_id)
    core.abort(bad.txn_id, None)  # cleanup fails: the abort still answers
    committed, _ = core.open_transaction("good", 0, tables=[table(tmp_path, "y")])
    core.commit(committed.txn_id, None, writes=[write(committed.txn_id, table(tmp_path, "y"))],
                tables=[table(tmp_path, "y")])
    clock.now += 6
    core.resolve_once()  # the bad cleanup is retried and fails again; the roll-forward runs
    assert core.get_transaction(committed.txn_id).state == TxnState.APPLIED
    failing.clear()
    core.resolve_once()
    assert bad.txn_id not in core._pending_cleanup


def test_roll_forward_delay_and_require_idle_ignore_wall_clock_steps(tmp_path, monkeypatch):
    clock, delta = FakeClock(), FakeDelta()
    core = TransactionCoordinator(
        MemoryStore(), CoordinatorConfig([str(tmp_path)], txn_timeout_s=60,
                                         roll_forward_after_s=10),
        applier=delta, monotonic=clock)
    query = str(uuid.uuid4())
    epoch = core.register_pipeline("p", query).epoch
    txn = run_batch(core, tmp_path, "p", 0, ["a"], epoch, query)
    real = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: real + 3600 * 10**9)  # the wall clock jumps
    monkeypatch.setattr(time, "time", lambda: real / 1e9 + 3600)
    core.resolve_once()
    assert core.get_transaction(txn.txn_id).state == TxnState.COMMITTED  # not yet due
    with pytest.raises(FailedPrecondition, match="on_checkpoint_reset"):
        core.reset_pipeline("p", "auto", None, require_idle=True)
    clock.now += 10
    core.resolve_once()
    assert core.get_transaction(txn.txn_id).state == TxnState.APPLIED
    clock.now += 60
    assert core.reset_pipeline("p", "auto", None, require_idle=True)[1]


def test_reported_versions_are_checked_against_the_delta_log(tmp_path):
    delta = FakeDelta()
    logged: dict[tuple[str, int], tuple[str, str, int]] = {}

    def applied_check(tbl, version, txn_id, app_id, app_version) -> bool:
        return logged.get((tbl, version)) == (txn_id, app_id, app_version)

    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)]),
                                  applier=delta, applied_check=applied_check)
    txn = run_batch(core, tmp_path, "p", 7, ["a"])
    a = table(tmp_path, "a")
    with pytest.raises(FailedPrecondition, match="not transaction"):
        core.report_applied(txn.txn_id, None, {a: 3})
    assert core.get_transaction(txn.txn_id).state == TxnState.COMMITTED
    logged[(a, 3)] = (txn.txn_id, "percolake:p:g0", 7)
    assert core.report_applied(txn.txn_id, None, {a: 3}).state == TxnState.APPLIED


def test_an_automatic_reset_never_brings_back_an_earlier_generation_s_query_id(tmp_path):
    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)]),
                                  applier=FakeDelta())
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    core.register_pipeline("p", old)
    core.reset_pipeline("p", "checkpoint replaced", 0, query_id=new)
    with pytest.raises(FailedPrecondition, match="drove generation 0"):
        core.reset_pipeline("p", "automatic", 1, require_idle=True, query_id=old)
    assert core.get_pipeline("p").generation == 1


def test_heartbeats_of_finished_transactions_are_fenced_too(tmp_path):
    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)]),
                                  applier=FakeDelta())
    epoch = core.register_pipeline("p", None).epoch
    opened, _ = core.open_transaction("p", 0, epoch)
    txn = core.commit(opened.txn_id, epoch)  # an empty batch: APPLIED at once
    assert core.heartbeat(txn.txn_id, epoch) == (TxnState.APPLIED, 0)
    core.register_pipeline("p", None)
    with pytest.raises(FailedPrecondition, match="fenced"):
        core.heartbeat(txn.txn_id, epoch)


def test_a_batch_below_the_generation_s_newest_committed_batch_cannot_commit(tmp_path):
    """Its apply would be skipped (the table's app transaction version is the higher batch)
    and fail for ever: refused before the commit point, it stays live."""
    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)]),
                                  applier=FakeDelta())
    run_batch(core, tmp_path, "p", 5, ["a"])
    late, _ = core.open_transaction("p", 3)
    with pytest.raises(FailedPrecondition, match="cannot commit after batch 5"):
        core.commit(late.txn_id, None, [table(tmp_path, "a")],
                    writes=[write(late.txn_id, table(tmp_path, "a"))])
    assert core.get_transaction(late.txn_id).state in (TxnState.OPEN, TxnState.PREWRITTEN)
    # a restart loads the newest batch from the store
    again = TransactionCoordinator(core.store, core.config, applier=FakeDelta())
    with pytest.raises(FailedPrecondition, match="cannot commit after batch 5"):
        again.commit(late.txn_id, None, [table(tmp_path, "a")])


def test_a_report_racing_the_commit_is_still_checked_against_the_log(tmp_path):
    """A ReportApplied read while the transaction is still PREWRITTEN must not record versions
    that no one checked once the commit lands in between (item 12)."""
    def applied_check(tbl, version, txn_id, app_id, app_version) -> bool:
        return False

    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)]),
                                  applier=FakeDelta(), applied_check=applied_check)
    a = table(tmp_path, "a")
    txn, _ = core.open_transaction("p", 0, tables=[a])
    core.prewrite(txn.txn_id, None, [write(txn.txn_id, a)])
    get, calls = core._get, []

    def commit_between_reads(txn_id):  # the commit lands after the report's first read
        calls.append(txn_id)
        if len(calls) == 2:
            core._lock.release()
            try:
                core._get = get
                core.commit(txn.txn_id, None, [a])
            finally:
                core._lock.acquire()
        return get(txn_id)

    core._get = commit_between_reads
    with pytest.raises(FailedPrecondition):
        core.report_applied(txn.txn_id, None, {a: 42})
    core._get = get
    after = core.get_transaction(txn.txn_id)
    assert after.state != TxnState.APPLIED and not after.tables[a].applied  # nothing recorded


def test_a_failing_cleanup_of_released_tables_never_fails_the_commit(tmp_path):
    """Item 10 on the committed path: the folder of a table released at commit cannot be
    deleted, yet the commit answers COMMITTED (the failure is only logged)."""
    def remove(location: str) -> None:
        raise RuntimeError(f"cannot delete {location}")

    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)]),
                                  applier=FakeDelta(), remove_files=remove)
    a, b = table(tmp_path, "a"), table(tmp_path, "b")
    txn, _ = core.open_transaction("p", 0, tables=[a, b])
    committed = core.commit(txn.txn_id, None, [a], writes=[write(txn.txn_id, a)],
                            release_unwritten=True)
    assert committed.state == TxnState.COMMITTED and set(committed.tables) == {a}
