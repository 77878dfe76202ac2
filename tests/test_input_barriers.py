"""Input barriers on the commit path (docs/topology.md): an attempt of a downstream pipeline
records its planned input barrier when opened, its commit records it in the transaction and in
every snapshot-index row, T1 refuses a barrier that is not above the last committed one, a root
batch's source offsets are kept, and a reset starts the new generation where the input stands.
Core-level, over the in-memory store and SQLite."""

import pytest

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.store import MemoryStore, SqliteStore
from percolake import codec, failpoints
from percolake.barriers import barrier_ts
from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from percolake.states import TxnState

SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'
G1, G2, G3 = (barrier_ts(k, 5000) for k in (1, 2, 3))


class FakeDelta:
    def __init__(self) -> None:
        self.versions: dict[str, int] = {}

    def __call__(self, write, *, app_id, app_version, txn_id, commit_ts):
        self.versions[write.table] = self.versions.get(write.table, -1) + 1
        return self.versions[write.table]


def make_core(store, tmp_path):
    return TransactionCoordinator(store, CoordinatorConfig([str(tmp_path)], conflict_wait_s=0.2),
                                  applier=FakeDelta(), remove_files=lambda path: None)


@pytest.fixture(params=["memory", "sqlite"])
def env(request, tmp_path):
    """(core, a function opening a new core over the same store, tmp_path)."""
    store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "data")
    core = make_core(store, tmp_path)
    core.register_reads("ledger", [uri(tmp_path, "debits")], None)
    yield core, lambda: make_core(store, tmp_path), tmp_path
    core.close()
    store.close()


def uri(tmp_path, name):
    return f"file://{tmp_path}/{name}"


def write(txn_id, table):
    return TableWriteRecord(table, WriteMode.APPEND, (AddFileRecord(
        f"_percolake/{txn_id}/part-0.parquet", 100, {}, 0, '{"numRecords":3}'),), SCHEMA)


def remember_plan(core, pipeline_id, after, barrier):
    """What PlanBarrier leaves behind: the pipeline's remembered answer, durable."""
    with core._lock:
        current = core._pipelines.get(pipeline_id)
        updated = current.copy() if current else core._new_pipeline(pipeline_id)
        updated.plan_generation = updated.generation
        updated.plan_after, updated.plan_barrier = after, barrier
        core._persist_pipeline(updated, current)
        core._pipelines[pipeline_id] = updated


def commit_batch(core, tmp_path, pipeline, batch, tables, **options):
    txn, committed = core.open_transaction(pipeline, batch)
    assert not committed
    paths = [uri(tmp_path, t) for t in tables]
    return core.commit(txn.txn_id, None, paths, [write(txn.txn_id, p) for p in paths], **options)


def test_open_with_a_plan_records_the_input_barrier_in_the_open_record(env):
    core, _, _ = env
    remember_plan(core, "ledger", 0, G1)
    txn, _ = core.open_transaction("ledger", 0)
    assert txn.input_barrier == G1 and txn.state == TxnState.OPEN
    assert core.store.get_txn(txn.txn_id).input_barrier == G1  # durable with the attempt
    assert core.input_after_barrier(txn) == 0
    assert codec.txn_to_pb(txn).input_barrier == G1


def test_open_without_a_matching_plan_records_no_input_barrier(env):
    core, _, _ = env
    first, _ = core.open_transaction("ledger", 0)  # no plan yet
    assert first.input_barrier == 0 and core.input_after_barrier(first) == 0
    remember_plan(core, "ledger", G1, G2)  # a plan after a barrier not committed
    second, _ = core.open_transaction("ledger", 1)
    assert second.input_barrier == 0
    remember_plan(core, "bank", 0, G1)  # a root pipeline never records one
    root, _ = core.open_transaction("bank", 0)
    assert root.input_barrier == 0


def test_commit_records_the_input_barrier_in_the_txn_and_every_table_commit(env):
    core, _, tmp = env
    remember_plan(core, "ledger", 0, G1)
    done = commit_batch(core, tmp, "ledger", 0, ["ledger", "audit"])
    assert done.input_barrier == G1
    assert core.store.get_txn(done.txn_id).input_barrier == G1
    for name in ("ledger", "audit"):
        row = core.store.table_commit_at(uri(tmp, name), done.commit_ts)
        assert (row.txn_id, row.input_barrier) == (done.txn_id, G1)
    assert core.store.last_input_barrier("ledger", 0) == G1
    remember_plan(core, "ledger", G1, G2)  # the next batch reads (G1, G2]
    following, _ = core.open_transaction("ledger", 1)
    assert following.input_barrier == G2 and core.input_after_barrier(following) == G1


def test_a_root_commit_records_no_input_barrier(env):
    core, _, tmp = env
    done = commit_batch(core, tmp, "bank", 0, ["debits"])
    assert done.input_barrier == 0
    assert core.store.table_commit_at(uri(tmp, "debits"), done.commit_ts).input_barrier == 0


def test_t1_refuses_an_input_barrier_not_above_the_last_committed_one(env):
    core, _, tmp = env
    remember_plan(core, "ledger", 0, G1)
    first, _ = core.open_transaction("ledger", 0)
    second, _ = core.open_transaction("ledger", 1)  # planned on the same range
    assert first.input_barrier == second.input_barrier == G1
    core.commit(first.txn_id, None)
    with pytest.raises(FailedPrecondition) as refused:
        core.commit(second.txn_id, None)
    assert f"input barrier {G1}, not above the last input barrier its generation " \
           f"committed, {G1}" in str(refused.value)
    assert core.get_transaction(second.txn_id).state == TxnState.OPEN  # nothing recorded
    assert core.store.last_input_barrier("ledger", 0) == G1


def test_t1_holds_after_a_restart_from_the_store(env):
    core, reopen, tmp = env
    remember_plan(core, "ledger", 0, G2)
    first, _ = core.open_transaction("ledger", 0)
    second, _ = core.open_transaction("ledger", 1)
    core.commit(first.txn_id, None)
    restarted = reopen()  # loads the last committed input barrier from the store
    try:
        with pytest.raises(FailedPrecondition, match=f"input barrier {G2}, not above"):
            restarted.commit(second.txn_id, None)
    finally:
        restarted.close()


def test_t1_refuses_a_first_barrier_not_above_the_generations_start(env):
    core, _, tmp = env
    core.open_transaction("ledger", 0)
    epoch = core.reset_pipeline("ledger", "revised", None, start_barrier=G2)[0].epoch
    remember_plan(core, "ledger", G2, G3)
    opened, _ = core.open_transaction("ledger", 0, epoch)
    assert opened.input_barrier == G3 and core.input_after_barrier(opened) == G2
    with core._lock:  # a broken plan: a barrier at the start of the generation
        core._unfinished[opened.txn_id].input_barrier = G2
    with pytest.raises(FailedPrecondition, match=f"start barrier of its generation, {G2}"):
        core.commit(opened.txn_id, epoch)


def test_source_offsets_are_stored_with_the_commit_and_shown(env):
    core, _, tmp = env
    offsets = '{"kafka":{"debits":{"0":42}}}\n{"rate":7}'
    done = commit_batch(core, tmp, "bank", 0, ["debits"], source_offsets=offsets)
    assert core.store.get_txn(done.txn_id).source_offsets == offsets
    shown = core.get_transaction(done.txn_id)
    assert codec.txn_to_pb(shown).source_offsets == offsets
    empty, _ = core.open_transaction("bank", 1)
    assert core.commit(empty.txn_id, None).source_offsets == ""


def test_source_offsets_over_the_limit_are_refused(env):
    core, _, _ = env
    opened, _ = core.open_transaction("bank", 0)
    with pytest.raises(InvalidArgument, match="source_offsets is"):
        core.commit(opened.txn_id, None, source_offsets="x" * (1024 * 1024 + 1))


def test_a_reset_starts_the_new_generation_at_the_last_committed_input_barrier(env):
    core, _, tmp = env
    remember_plan(core, "ledger", 0, G1)
    commit_batch(core, tmp, "ledger", 0, ["ledger"])
    reset, changed, _ = core.reset_pipeline("ledger", "new checkpoint", None)
    assert changed and (reset.generation, reset.start_barrier) == (1, G1)
    again, _, _ = core.reset_pipeline("ledger", "again", None)  # nothing committed in 1
    assert (again.generation, again.start_barrier) == (2, G1)
    revised, _, _ = core.reset_pipeline("ledger", "revision", None, start_barrier=G3)
    assert revised.start_barrier == G3
    assert [(p.generation, p.start_barrier) for p in core.store.load_pipelines()
            if p.pipeline_id == "ledger"] == [(3, G3)]
    with pytest.raises(InvalidArgument, match="start_barrier must be >= 0"):
        core.reset_pipeline("ledger", "bad", None, start_barrier=-1)


def test_the_failpoint_fires_after_the_durable_commit_of_an_input_barrier(env):
    core, _, tmp = env
    failpoints.enable("after-input-barrier-commit", "raise")
    try:
        commit_batch(core, tmp, "bank", 0, ["debits"])  # no input barrier: passes
        remember_plan(core, "ledger", 0, G1)
        opened, _ = core.open_transaction("ledger", 0)
        with pytest.raises(failpoints.FailpointError):
            core.commit(opened.txn_id, None)
    finally:
        failpoints.disable("after-input-barrier-commit")
    committed = core.store.get_txn(opened.txn_id)
    assert committed.state == TxnState.APPLIED and committed.input_barrier == G1
