"""Lineage and barriers (docs/topology.md): the pure graph and arithmetic, then the core's
registration of writers and readers, its refusals, and durability across a restart."""

from __future__ import annotations

import pytest

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.oracle import LOGICAL_BITS as ORACLE_LOGICAL_BITS
from coordinator.store.base import ReadEdge, TableWriter
from coordinator.store.memory import MemoryStore
from coordinator.store.sqlite import SqliteStore
from percolake.barriers import (
    LOGICAL_BITS,
    barrier_at_or_below,
    barrier_ts,
    root_completed_barrier,
    wall_ms_of_barrier,
)
from percolake.errors import FailedPrecondition
from percolake.lineage import Lineage, describe_cycle

# ---------------------------------------------------------------- the pure graph


def bank_and_ledger() -> Lineage:
    """bank writes debits and credits; ledger reads both and writes the ledger."""
    return Lineage.of([("/lake/debits", "bank"), ("/lake/credits", "bank"),
                       ("/lake/ledger", "ledger")],
                      [("ledger", "/lake/debits"), ("ledger", "/lake/credits")])


def test_a_read_closing_a_cycle_is_named_from_the_reading_pipeline():
    lineage = bank_and_ledger()
    cycle = lineage.cycle_if_reads("bank", ["/lake/ledger"])
    assert describe_cycle(cycle) == "bank -> /lake/credits -> ledger -> /lake/ledger -> bank"
    assert lineage.reads_of("bank") == []  # checking changed nothing


def test_a_write_closing_a_cycle_is_named_from_the_writing_pipeline():
    lineage = bank_and_ledger()
    lineage.reads["bank"] = {"/lake/fx"}
    cycle = lineage.cycle_if_writes("ledger", ["/lake/fx"])
    assert describe_cycle(cycle) == "ledger -> /lake/fx -> bank -> /lake/credits -> ledger"
    assert "/lake/fx" not in lineage.writers


def test_reading_its_own_table_is_a_cycle_of_one_pipeline():
    lineage = bank_and_ledger()
    assert lineage.cycle_if_reads("ledger", ["/lake/ledger"]) == [
        "ledger", "/lake/ledger", "ledger"]
    lineage.reads["ledger"].add("/lake/fx")  # read, owned by nobody yet
    assert lineage.cycle_if_writes("ledger", ["/lake/fx"]) == ["ledger", "/lake/fx", "ledger"]


def test_a_pipeline_named_like_a_table_is_not_a_cycle_with_that_table():
    lineage = Lineage.of([], [])
    assert lineage.cycle_if_reads("file:///lake/t", ["file:///lake/t"]) is None
    lineage.reads["file:///lake/t"] = {"file:///src"}
    assert lineage.cycle_if_writes("file:///lake/t", ["file:///lake/t"]) is None


def test_edges_that_keep_the_graph_acyclic_pass():
    lineage = bank_and_ledger()
    assert lineage.cycle_if_reads("audit", ["/lake/ledger", "/lake/debits"]) is None
    assert lineage.cycle_if_writes("audit", ["/lake/report"]) is None
    assert lineage.cycle_if_writes("ledger", ["/lake/ledger"]) is None  # owned already


def test_a_cycle_closed_by_a_later_table_of_the_same_request_is_found():
    lineage = Lineage.of([("/lake/a", "p")], [])
    # q reads /lake/a, then q writing /lake/b and p reading it close p -> a -> q -> b -> p
    lineage.reads["q"] = {"/lake/a"}
    assert lineage.cycle_if_writes("q", ["/lake/b"]) is None
    lineage.writers["/lake/b"] = "q"
    assert describe_cycle(lineage.cycle_if_reads("p", ["/lake/c", "/lake/b"])) == (
        "p -> /lake/a -> q -> /lake/b -> p")


def test_foreign_owners_names_each_table_of_another_pipeline():
    lineage = bank_and_ledger()
    assert lineage.foreign_owners("ledger", ["/lake/debits", "/lake/ledger", "/lake/new"]) == {
        "/lake/debits": "bank"}


def test_roots_views_and_readers():
    lineage = bank_and_ledger()
    assert lineage.is_root("bank") and not lineage.is_root("ledger")
    assert lineage.pipelines() == ["bank", "ledger"]
    assert lineage.tables() == ["/lake/credits", "/lake/debits", "/lake/ledger"]
    assert lineage.readers_of("/lake/debits") == ["ledger"]
    assert lineage.writes_of("bank") == ["/lake/credits", "/lake/debits"]


# ---------------------------------------------------------------- barrier arithmetic

def ts(wall_ms: int, logical: int = 0) -> int:
    return (wall_ms << LOGICAL_BITS) + logical


def test_the_barrier_timestamps_match_the_oracle_encoding():
    assert LOGICAL_BITS == ORACLE_LOGICAL_BITS
    assert barrier_ts(3, 5000) == ts(15_000)
    assert wall_ms_of_barrier(barrier_ts(3, 5000)) == 15_000


def test_the_barrier_at_or_below_a_timestamp():
    assert barrier_at_or_below(ts(15_000), 5000) == ts(15_000)
    assert barrier_at_or_below(ts(14_999, 7), 5000) == ts(10_000)
    assert barrier_at_or_below(ts(15_000, 1), 5000) == ts(15_000)
    assert barrier_at_or_below(ts(4_999), 5000) == 0
    with pytest.raises(ValueError):
        barrier_at_or_below(ts(1), 0)


def test_a_root_table_completes_the_barriers_the_oracle_passed():
    # nothing unapplied: every barrier strictly below now is closed
    assert root_completed_barrier(ts(17_000), None, 5000) == ts(15_000)
    # the oracle is exactly at a barrier: a commit could still take it? no (now was issued),
    # but a commit at now itself would be at the barrier: the answer stays below it
    assert root_completed_barrier(ts(15_000), None, 5000) == ts(10_000)


def test_an_unapplied_commit_holds_the_root_table_below_it():
    assert root_completed_barrier(ts(27_000), ts(16_000, 3), 5000) == ts(15_000)
    assert root_completed_barrier(ts(27_000), ts(15_000), 5000) == ts(10_000)


# ---------------------------------------------------------------- the core

class FakeDelta:
    def __call__(self, write, commit_ts, txn_id, *rest):
        return 0


def make_core(store, tmp_path, **config):
    return TransactionCoordinator(store, CoordinatorConfig([str(tmp_path)], conflict_wait_s=0.1,
                                                           **config), applier=FakeDelta())


def uri(tmp_path, name):
    return f"file://{tmp_path}/{name}"


def test_a_table_declared_by_a_second_pipeline_is_refused_naming_its_owner(tmp_path):
    core = make_core(MemoryStore(), tmp_path)
    core.open_transaction("bank", 0, tables=[uri(tmp_path, "debits")])
    other, _ = core.open_transaction("ledger", 0)
    with pytest.raises(FailedPrecondition, match=r"debits is written by pipeline 'bank'"):
        core.declare_tables(other.txn_id, None, [uri(tmp_path, "debits")])
    with pytest.raises(FailedPrecondition, match=r"debits is written by pipeline 'bank'"):
        core.open_transaction("ledger", 1, tables=[uri(tmp_path, "x"), uri(tmp_path, "debits")])
    # the refused Open recorded nothing: x has no owner, ledger opened nothing for batch 1
    assert [t.table for t in core.get_topology().tables] == [uri(tmp_path, "debits")]
    assert core.store.attempts_of("ledger", 0, 1) == []


def test_shared_table_writers_lets_a_second_pipeline_write_and_keeps_the_first_owner(tmp_path):
    core = make_core(MemoryStore(), tmp_path, shared_table_writers=True)
    first, _ = core.open_transaction("bank", 0, tables=[uri(tmp_path, "debits")])
    core.abort(first.txn_id, None, "done")
    second, _ = core.open_transaction("ledger", 0, tables=[uri(tmp_path, "debits")])
    assert list(second.tables) == [uri(tmp_path, "debits")]
    assert [w.pipeline_id for w in core.store.load_table_writers()] == ["bank"]


def test_writers_of_every_declaring_path_are_recorded_durably(tmp_path):
    store = MemoryStore()
    core = make_core(store, tmp_path)
    txn, _ = core.open_transaction("bank", 0, tables=[uri(tmp_path, "a")])  # at Open
    core.declare_tables(txn.txn_id, None, [uri(tmp_path, "b"), uri(tmp_path, "c")])  # several
    core.declare_tables(txn.txn_id, None, [uri(tmp_path, "d")])  # one at a time
    assert [(w.table, w.pipeline_id) for w in store.load_table_writers()] == [
        (uri(tmp_path, n), "bank") for n in "abcd"]


def test_a_read_closing_a_cycle_is_refused_naming_it(tmp_path):
    core = make_core(MemoryStore(), tmp_path)
    core.open_transaction("bank", 0, tables=[uri(tmp_path, "debits")])
    core.register_reads("ledger", [uri(tmp_path, "debits")], None)
    core.open_transaction("ledger", 0, tables=[uri(tmp_path, "x")])
    with pytest.raises(FailedPrecondition) as refused:
        core.register_reads("bank", [uri(tmp_path, "x")], None)
    assert (f"bank -> {uri(tmp_path, 'debits')} -> ledger -> {uri(tmp_path, 'x')} -> bank"
            in str(refused.value))
    assert core.store.load_read_edges() == [ReadEdge("ledger", uri(tmp_path, "debits"),
                                                     core.store.load_read_edges()[0]
                                                     .registered_ms)]


def test_a_write_closing_a_cycle_is_refused_naming_it(tmp_path):
    core = make_core(MemoryStore(), tmp_path)
    core.open_transaction("bank", 0, tables=[uri(tmp_path, "debits")])
    core.register_reads("ledger", [uri(tmp_path, "debits")], None)
    core.register_reads("bank", [uri(tmp_path, "fx")], None)
    with pytest.raises(FailedPrecondition) as refused:
        core.open_transaction("ledger", 0, tables=[uri(tmp_path, "fx")])
    assert (f"ledger -> {uri(tmp_path, 'fx')} -> bank -> {uri(tmp_path, 'debits')} -> ledger"
            in str(refused.value))
    assert uri(tmp_path, "fx") not in {w.table for w in core.store.load_table_writers()}


def test_register_reads_is_idempotent(tmp_path):
    core = make_core(MemoryStore(), tmp_path)
    tables = [uri(tmp_path, "debits"), uri(tmp_path, "credits")]
    assert core.register_reads("ledger", tables, None) == (tables, 2)
    assert core.register_reads("ledger", tables[::-1], None) == (tables[::-1], 0)
    assert len(core.store.load_read_edges()) == 2


def test_register_reads_is_fenced_like_open(tmp_path):
    core = make_core(MemoryStore(), tmp_path)
    epoch = core.register_pipeline("ledger", None).epoch
    core.register_pipeline("ledger", None)
    with pytest.raises(FailedPrecondition, match="fenced"):
        core.register_reads("ledger", [uri(tmp_path, "debits")], epoch)
    with pytest.raises(FailedPrecondition, match="without an epoch"):
        core.register_reads("ledger", [uri(tmp_path, "debits")], None)
    assert core.store.load_read_edges() == []


def test_lineage_survives_a_core_restart_from_the_same_store(tmp_path):
    store = SqliteStore(tmp_path / "store")
    first = make_core(store, tmp_path)
    first.open_transaction("bank", 0, tables=[uri(tmp_path, "debits")])
    first.register_reads("ledger", [uri(tmp_path, "debits")], None)
    first.close()
    store.close()
    store = SqliteStore(tmp_path / "store")
    second = make_core(store, tmp_path)
    try:
        view = second.get_topology()
        assert [(p.pipeline_id, p.root, p.reads, p.writes) for p in view.pipelines] == [
            ("bank", True, (), (uri(tmp_path, "debits"),)),
            ("ledger", False, (uri(tmp_path, "debits"),), ())]
        other, _ = second.open_transaction("ledger", 0)
        with pytest.raises(FailedPrecondition, match="written by pipeline 'bank'"):
            second.declare_tables(other.txn_id, None, [uri(tmp_path, "debits")])
        with pytest.raises(FailedPrecondition, match="cycle"):
            second.register_reads("bank", [uri(tmp_path, "debits")], None)
        assert store.load_table_writers()[0] == TableWriter(
            uri(tmp_path, "debits"), "bank", store.load_table_writers()[0].registered_ms)
    finally:
        second.close()
        store.close()


def test_a_root_tables_completed_barrier_waits_for_its_unapplied_commit(tmp_path):
    core = make_core(MemoryStore(), tmp_path, barrier_interval_s=0.001)
    debits = uri(tmp_path, "debits")
    txn, _ = core.open_transaction("bank", 0, tables=[debits])
    core.commit(txn.txn_id, None, [debits], [_append(txn.txn_id, debits)])
    committed = core.get_transaction(txn.txn_id)
    view = core.get_topology()
    (table,) = view.tables
    # unapplied: the newest completed barrier is the last millisecond boundary below the commit
    assert table.completed_barrier == barrier_at_or_below(committed.commit_ts - 1, 1)
    assert view.delay_ms(table) >= 0
    core.report_applied(txn.txn_id, None, {debits: 0})
    after = core.get_topology()
    # completed barriers lie below now: wait until now - 1 has left the commit's millisecond
    while wall_ms_of_barrier(after.now_ts - 1) <= wall_ms_of_barrier(committed.commit_ts):
        after = core.get_topology()
    assert after.tables[0].completed_barrier == barrier_at_or_below(after.now_ts - 1, 1)
    assert after.tables[0].completed_barrier >= committed.commit_ts


def test_a_downstream_table_of_unchanged_sources_completes_what_they_completed(tmp_path):
    core = make_core(MemoryStore(), tmp_path)
    core.open_transaction("bank", 0, tables=[uri(tmp_path, "debits")])
    core.register_reads("ledger", [uri(tmp_path, "debits")], None)
    core.open_transaction("ledger", 0, tables=[uri(tmp_path, "ledger")])
    view = core.get_topology()
    by_table = {t.table: t for t in view.tables}
    assert by_table[uri(tmp_path, "debits")].completed_barrier is not None
    assert by_table[uri(tmp_path, "debits")].readers == ("ledger",)
    # no change in debits yet: the ledger has nothing to wait for (tests/test_topology_barriers)
    assert (by_table[uri(tmp_path, "ledger")].completed_barrier
            == by_table[uri(tmp_path, "debits")].completed_barrier)
    assert view.delay_ms(by_table[uri(tmp_path, "ledger")]) is not None


def _append(txn_id, table):
    from percolake.records import AddFileRecord, TableWriteRecord, WriteMode

    return TableWriteRecord(table, WriteMode.APPEND, (AddFileRecord(
        f"_percolake/{txn_id}/part-0.parquet", 100, {}, 0, '{"numRecords":1}'),),
        '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}')


def test_get_topology_of_some_tables_shows_them_and_their_pipelines_only(tmp_path):
    core = make_core(MemoryStore(), tmp_path)
    core.open_transaction("bank", 0, tables=[uri(tmp_path, "debits")])
    core.open_transaction("fx", 0, tables=[uri(tmp_path, "rates")])
    core.register_reads("ledger", [uri(tmp_path, "debits")], None)
    view = core.get_topology([uri(tmp_path, "debits"), uri(tmp_path, "unknown")])
    assert [t.table for t in view.tables] == [uri(tmp_path, "debits"), uri(tmp_path, "unknown")]
    assert [p.pipeline_id for p in view.pipelines] == ["bank", "ledger"]
    unknown = view.tables[1]
    assert (unknown.writer, unknown.readers, unknown.completed_barrier) == ("", (), None)
