"""Retention: old APPLIED/ABORTED history is pruned; snapshots, replays and recent time travel
answer exactly as before; time travel to before the floor is refused, never answered wrong."""

import pytest

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.oracle import LOGICAL_BITS
from coordinator.store import MemoryStore, SqliteStore
from percolake.errors import FailedPrecondition, NotFound
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from percolake.states import TxnState

SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'
HOUR_MS = 3600 * 1000


class FakeDelta:
    def __init__(self) -> None:
        self.versions: dict[str, int] = {}

    def __call__(self, write, *, app_id, app_version, txn_id, commit_ts):
        self.versions[write.table] = self.versions.get(write.table, -1) + 1
        return self.versions[write.table]


@pytest.fixture(params=["sqlite", "memory"])
def core(request, tmp_path):
    store = SqliteStore(tmp_path / "data", group_commit=True) if request.param == "sqlite" \
        else MemoryStore()
    made = TransactionCoordinator(
        store, CoordinatorConfig([str(tmp_path)], retention_hours=24), applier=FakeDelta(),
        remove_files=lambda _: None)
    yield made
    store.close()


def run_batch(core, tmp_path, pipeline, batch, tables, abort=False, apply=True):
    txn, _ = core.open_transaction(pipeline, batch)
    names = [str(tmp_path / t) for t in tables]
    writes = [TableWriteRecord(
        n, WriteMode.APPEND,
        (AddFileRecord(f"_percolake/{txn.txn_id}/f.parquet", 10, {}, 0, '{"numRecords":1}'),),
        SCHEMA) for n in names]
    core.prewrite(txn.txn_id, None, writes)
    if abort:
        return core.abort(txn.txn_id, None, "test")
    done = core.commit(txn.txn_id, None, names)
    if apply:
        versions = {n: batch for n in names}
        done = core.report_applied(txn.txn_id, None, versions)
    return done


def test_prune_keeps_what_snapshots_replays_and_recent_time_travel_need(core, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    old = [run_batch(core, tmp_path, "p", i, ["a", "b"] if i % 2 == 0 else ["a"])
           for i in range(6)]
    aborted = run_batch(core, tmp_path, "p", 6, ["a"], abort=True)
    newest_old = run_batch(core, tmp_path, "p", 6, ["a"])  # batch 6, second attempt
    latest_before = core.get_snapshot([a, b])
    # Everything so far is "old": prune as if 25 hours later, with one recent commit after it.
    later_ms = max(t.updated_ms for t in old + [newest_old]) + 25 * HOUR_MS
    floor_ts = (later_ms - 24 * HOUR_MS) << LOGICAL_BITS

    txns, rows = core.prune_history(now_ms=later_ms)

    assert txns == 7  # batches 0-5 and the aborted attempt; the newest committed batch stays
    assert rows > 0
    assert core.store.get_txn(old[0].txn_id) is None
    assert core.store.get_txn(aborted.txn_id) is None
    kept = core.store.get_txn(newest_old.txn_id)
    assert kept is not None and kept.state == TxnState.APPLIED
    # A replay of the newest committed batch is still answered "already committed" (I2).
    replay, committed = core.open_transaction("p", 6)
    assert committed and replay.txn_id == newest_old.txn_id
    # Latest snapshots answer the same versions as before the prune.
    assert core.get_snapshot([a, b]).versions == latest_before.versions
    # Each table's newest index row at or below the floor is kept: time travel to the floor
    # answers exactly what it did before.
    ca, cb = core.resolve_table(a), core.resolve_table(b)
    assert core.store.table_commit_at(ca, floor_ts).delta_version == 6
    assert core.store.table_commit_at(cb, floor_ts).delta_version == 4
    # Time travel to before the floor is refused, never answered from a thinned index.
    with pytest.raises(FailedPrecondition, match="retention"):
        core.get_snapshot([a], as_of_ts=old[1].commit_ts)
    with pytest.raises(NotFound, match="retention"):
        core.get_snapshot([a], as_of_batch=("p", None, 1))
    with pytest.raises(FailedPrecondition, match="retention"):
        core.get_snapshot([a], as_of_batch=("p", None, 6))
    # A second pass finds nothing more to delete.
    assert core.prune_history(now_ms=later_ms) == (0, 0)


def test_prune_never_touches_unfinished_or_recent_transactions(core, tmp_path):
    applied = run_batch(core, tmp_path, "q", 0, ["c"])
    unapplied = run_batch(core, tmp_path, "q", 1, ["d"], apply=False)
    live, _ = core.open_transaction("q", 2)
    # A horizon that has not passed yet: nothing is old enough.
    assert core.prune_history() == (0, 0)
    later_ms = max(applied.updated_ms, unapplied.updated_ms) + 48 * HOUR_MS
    core.prune_history(now_ms=later_ms)
    assert core.store.get_txn(unapplied.txn_id).state == TxnState.COMMITTED
    assert core.store.get_txn(live.txn_id).state == TxnState.OPEN
    # The unapplied commit stays in the index, so a snapshot still rolls it forward (I4).
    d = str(tmp_path / "d")
    assert [c.txn_id for c in core.store.unapplied_table_commits(
        core.resolve_table(d), core.oracle.last)] == [unapplied.txn_id]
    assert core.get_snapshot([d]).versions[core.resolve_table(d)] == 0


def test_retention_zero_keeps_everything(tmp_path):
    store = MemoryStore()
    core = TransactionCoordinator(store, CoordinatorConfig([str(tmp_path)], retention_hours=0),
                                  applier=FakeDelta(), remove_files=lambda _: None)
    done = run_batch(core, tmp_path, "r", 0, ["e"])
    assert core.prune_history(now_ms=done.updated_ms + 10_000 * HOUR_MS) == (0, 0)
    assert store.get_txn(done.txn_id) is not None


def test_prune_survives_a_restart(tmp_path):
    data = tmp_path / "data"
    core = TransactionCoordinator(SqliteStore(data, group_commit=True),
                                  CoordinatorConfig([str(tmp_path)], retention_hours=24),
                                  applier=FakeDelta(), remove_files=lambda _: None)
    first = run_batch(core, tmp_path, "s", 0, ["f"])
    second = run_batch(core, tmp_path, "s", 1, ["f"])
    later_ms = second.updated_ms + 25 * HOUR_MS
    assert core.prune_history(now_ms=later_ms) == (1, 1)
    core.store.close()
    reopened = SqliteStore(data)
    assert reopened.get_txn(first.txn_id) is None
    assert reopened.get_txn(second.txn_id) is not None
    assert reopened.retention_floor_ts() == (later_ms - 24 * HOUR_MS) << LOGICAL_BITS
    reopened.close()


@pytest.mark.parametrize("pinned", ["as_of_ts", "as_of_batch"])
def test_prune_between_floor_check_and_index_read_refuses_time_travel(core, tmp_path, pinned):
    a = str(tmp_path / "a")
    done = [run_batch(core, tmp_path, "p", i, ["a"]) for i in range(4)]
    later_ms = done[-1].updated_ms + 25 * HOUR_MS
    read_floor = core.store.retention_floor_ts
    pruned: list[tuple[int, int]] = []

    def floor_then_prune() -> int:
        """The floor is read, then a prune pass lands before the snapshot reads the index."""
        floor = read_floor()
        if not pruned:
            pruned.append(core.prune_history(now_ms=later_ms))
        return floor

    core.store.retention_floor_ts = floor_then_prune
    as_of = {"as_of_ts": {"as_of_ts": done[1].commit_ts},
             "as_of_batch": {"as_of_batch": ("p", None, 1)}}[pinned]
    with pytest.raises(FailedPrecondition, match="retention floor"):
        core.get_snapshot([a], **as_of)
    assert pruned and pruned[0][1] > 0  # the prune did delete the index row batch 1 needs


def test_a_reader_below_the_floor_neither_pins_it_nor_is_served_silently(core, tmp_path):
    a = str(tmp_path / "a")
    done = run_batch(core, tmp_path, "p", 0, ["a"])
    later_ms = done.updated_ms + 25 * HOUR_MS
    core.prune_history(now_ms=later_ms)
    floor = core.store.retention_floor_ts()
    assert floor == (later_ms - 24 * HOUR_MS) << LOGICAL_BITS
    core.register_reads("late", [a], None)  # a new downstream pipeline: its input starts at 0
    assert core.retention_guard_ts(later_ms) is None  # below the floor: it holds nothing
    core.prune_history(now_ms=later_ms + HOUR_MS)
    assert core.store.retention_floor_ts() == floor + (HOUR_MS << LOGICAL_BITS)  # still rises
    with pytest.raises(FailedPrecondition) as refused:
        core.get_table_changes(a, 0, core.get_topology([a]).tables[0].completed_barrier)
    assert "below the retention floor" in str(refused.value)
    assert "reset-pipeline --pipeline P" in str(refused.value)
    assert "--start-barrier" in str(refused.value)
    # a reader at or above the floor still holds it where its range starts
    core.open_transaction("late", 0)
    start = core.store.retention_floor_ts() + (HOUR_MS << LOGICAL_BITS)
    core.reset_pipeline("late", "history pruned", None, start_barrier=start)
    assert core.retention_guard_ts(later_ms + HOUR_MS) == start
