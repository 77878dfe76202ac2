"""Revision (docs/topology.md, invariant T4): a root table and every table downstream of it
back to their versions at a global barrier in one restore commit, the downstream pipelines in
new generations starting at it, the root's source offsets, the refusals, and crashes at its
two durable steps (the same command run again finishes the same revision).

Real Delta tables (delta-rs) and a real coordinator daemon; protocol-level pipelines, no Spark.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Schema

from coordinator import cli
from coordinator.store.base import TxnQuery
from percolake.barriers import barrier_at_or_below
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import apply_table_write, files_of_version
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from percolake.states import TxnState
from percolake.v1 import coordinator_pb2 as pb
from sparkside.reader import ConsistentReader
from tests.crash.rpc import Client
from tests.daemon_support import wait_for
from tests.topology_support import (
    LEDGER_SCHEMA,
    LightPipeline,
    TopologyLake,
    changed_rows,
    completed_barrier,
    crashed_call,
    finish,
    ledger_rows,
    table_totals,
    transfers,
)

INTERVAL_S = 0.2
INTERVAL_MS = 200
SCHEMA = Schema.from_arrow(pa.schema([("id", pa.int64())])).to_json()


# ---------------------------------------------------------------- the restore commit (delta-rs)


def _file(table: Path, txn: str, ids: list[int]) -> AddFileRecord:
    folder = table / "_percolake" / txn
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "part-0.parquet"
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
    stats = {"numRecords": len(ids), "minValues": {"id": min(ids)},
             "maxValues": {"id": max(ids)}, "nullCount": {"id": 0}}
    return AddFileRecord(path.relative_to(table).as_posix(), path.stat().st_size, {}, 1,
                         json.dumps(stats))


def _apply(table: Path, mode: WriteMode, files: tuple[AddFileRecord, ...], batch: int) -> int:
    return apply_table_write(TableWriteRecord(f"file://{table}", mode, files, SCHEMA),
                             app_id="percolake:p:g0", app_version=batch, txn_id=f"t{batch}",
                             commit_ts=batch + 1)


def _actions(table: Path, version: int) -> tuple[set[str], set[str]]:
    """(added paths, removed paths) of one Delta version."""
    added, removed = set(), set()
    for line in (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines():
        action = json.loads(line)
        if "add" in action:
            added.add(action["add"]["path"])
        if "remove" in action:
            removed.add(action["remove"]["path"])
    return added, removed


def _ids(table: Path, version: int | None = None) -> list[int]:
    return sorted(read_delta_table(str(table), version).column("id").to_pylist())


def test_a_restore_overwrite_removes_only_what_is_not_restored_and_re_adds_with_stats(tmp_path):
    table = tmp_path / "t"
    a, b, c = _file(table, "a", [1, 2]), _file(table, "b", [3]), _file(table, "c", [9])
    _apply(table, WriteMode.APPEND, (a,), 0)
    _apply(table, WriteMode.APPEND, (b,), 1)
    _apply(table, WriteMode.OVERWRITE, (c,), 2)
    at_1 = files_of_version(f"file://{table}", 1)
    assert {f.path for f in at_1.files} == {a.path, b.path}
    assert {f.path: f.row_count() for f in at_1.files} == {a.path: 2, b.path: 1}

    restored = _apply(table, WriteMode.OVERWRITE, at_1.files, 3)
    assert _ids(table, restored) == [1, 2, 3] == _ids(table, 1)
    assert _actions(table, restored) == ({a.path, b.path}, {c.path})
    stats = {add["path"]: add["num_records"] for add in pa.table(
        DeltaTable(str(table)).get_add_actions(flatten=True)).to_pylist()}
    assert stats == {a.path: 2, b.path: 1}  # re-added with their stats

    # back to version 0: b goes, a stays untouched (neither removed nor added again)
    again = _apply(table, WriteMode.OVERWRITE, files_of_version(f"file://{table}", 0).files, 4)
    assert _ids(table, again) == [1, 2]
    assert _actions(table, again) == (set(), {b.path})


def test_a_restore_to_the_state_the_table_holds_commits_no_file_action(tmp_path):
    table = tmp_path / "t"
    _apply(table, WriteMode.APPEND, (_file(table, "a", [1]),), 0)
    same = _apply(table, WriteMode.OVERWRITE, files_of_version(f"file://{table}", 0).files, 1)
    assert same == 1 and _actions(table, 1) == (set(), set())
    assert DeltaTable(str(table)).transaction_version("percolake:p:g0") == 1
    assert _ids(table) == [1]


# ---------------------------------------------------------------- a bank and its ledger


@dataclass
class Bank:
    """The root pipeline ``bank`` (debits, credits) and the downstream ``ledger`` reading
    both, driven over gRPC; each bank batch records source offsets {"batch": b}."""

    lake: TopologyLake
    client: Client
    bank: LightPipeline
    ledger: LightPipeline
    ledger_batch: int = 0
    ledger_after: int = 0

    @property
    def tables(self) -> tuple[str, str, str]:
        return self.lake.table("debits"), self.lake.table("credits"), self.lake.table("ledger")

    def bank_batch(self, batch: int, rows_of: int | None = None) -> pb.Transaction:
        """Batch ``batch`` of the bank, with the rows of batch ``rows_of`` (default: its own)."""
        debits, credits, _ = self.tables
        rows = batch if rows_of is None else rows_of
        return self.bank.batch(batch, {debits: transfers(rows), credits: transfers(rows + 50)},
                               source_offsets=json.dumps({"batch": rows}))

    def catch_up(self, upto_ts: int, make_rows: Callable[..., pa.Table] = ledger_rows) -> int:
        """Runs ledger batches until its input barrier covers commit_ts ``upto_ts``; returns
        that input barrier."""
        self.ledger_after, self.ledger_batch = catch_up(
            self.client, self.ledger, self.tables[:2], self.tables[2], make_rows,
            self.ledger_after, self.ledger_batch, upto_ts)
        return self.ledger_after

    def latest_versions(self) -> dict[str, int | None]:
        reply = self.client.call("GetSnapshot", pb.GetSnapshotRequest(tables=list(self.tables)))
        return {t.table: t.delta_version if t.exists else None for t in reply.tables}


def catch_up(client: Client, pipeline: LightPipeline, sources: tuple[str, ...], target: str,
             make_rows: Callable[..., pa.Table], after: int, batch: int,
             upto_ts: int) -> tuple[int, int]:
    """Runs the downstream pipeline's batches from ``after`` (batch id ``batch``) until its
    input barrier covers ``upto_ts``, writing ``make_rows(*source changes, barrier)`` each;
    returns (its input barrier, its next batch id)."""

    def step() -> bool:
        nonlocal after, batch
        plan = client.call("PlanBarrier", pb.PlanBarrierRequest(
            pipeline_id=pipeline.pipeline_id, generation=pipeline.generation,
            after_barrier=after))
        if plan.barrier == plan.after_barrier:
            return False
        opened = pipeline.open(batch, [target])
        assert opened.input_barrier == plan.barrier, (opened, plan)
        rows = make_rows(*(changed_rows(client, s, plan.after_barrier, plan.barrier)
                           for s in sources), plan.barrier)
        pipeline.commit(opened, {target: rows})
        finish(client, opened.transaction.txn_id, pipeline.epoch)
        batch += 1
        after = plan.barrier
        return after >= upto_ts

    wait_for(step, 30, f"{pipeline.pipeline_id} to read up to {upto_ts}", interval_s=0.05)
    return after, batch


def start_bank(lake: TopologyLake, client: Client) -> Bank:
    bank = Bank(lake, client, LightPipeline(client, "bank").register(),
                LightPipeline(client, "ledger").register())
    bank.ledger.register_reads(list(bank.tables[:2]))
    return bank


def bank_to_revise(lake: TopologyLake, client: Client) -> tuple[Bank, int, dict[str, int]]:
    """Two bank batches read by the ledger up to barrier B, then two more read too: returns
    the bank, B and each table's version at B."""
    bank = start_bank(lake, client)
    bank.bank_batch(0)
    last = bank.bank_batch(1)
    barrier = bank.catch_up(last.commit_ts)
    at_barrier = bank.latest_versions()
    bank.bank_batch(2)
    bank.catch_up(bank.bank_batch(3).commit_ts)
    return bank, barrier, at_barrier


def revise(client: Client, table: str, barrier: int, reason: str = "") -> pb.ReviseResponse:
    return client.call("Revise", pb.ReviseRequest(table=table, to_barrier=barrier,
                                                  reason=reason))


def totals(tables: tuple[str, str, str], versions: dict[str, int | None]) -> tuple:
    debits, credits, ledger = tables
    return (table_totals(debits, versions[debits]), table_totals(credits, versions[credits]),
            table_totals(ledger, versions[ledger], absolute=True))


@pytest.fixture
def lake(tmp_path):
    lake = TopologyLake(tmp_path, interval_s=INTERVAL_S)
    yield lake
    lake.close()


class SnapshotWatcher:
    """Reads (debits, credits, ledger) with consistency snapshot and topology until stopped,
    keeping every answer's versions (T4 is checked on them afterwards)."""

    def __init__(self, target: str, tables: tuple[str, str, str]) -> None:
        self.target = target
        self.tables = tables
        self.reads: list[tuple[str, dict[str, int | None]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> SnapshotWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        with Client(self.target, retry_s=10) as client:
            while not self._stop.is_set():
                for name, kind in (("snapshot", pb.CONSISTENCY_SNAPSHOT),
                                   ("topology", pb.CONSISTENCY_TOPOLOGY)):
                    try:
                        reply = client.call("GetSnapshot", pb.GetSnapshotRequest(
                            tables=list(self.tables), consistency=kind))
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                            self.errors.append(f"{name}: {exc.code().name} {exc.details()}")
                        continue
                    self.reads.append((name, {t.table: t.delta_version if t.exists else None
                                              for t in reply.tables}))

    def restored_in(self, restore: dict[str, int]) -> dict[str, list[bool]]:
        """Per consistency, for each read: whether it showed the restore."""
        shown: dict[str, list[bool]] = {"snapshot": [], "topology": []}
        for name, versions in self.reads:
            flags = {t: v is not None and v >= restore[t] for t, v in versions.items()}
            assert len(set(flags.values())) == 1, (
                f"T4 broken: a {name} read shows the restore in some tables only: {versions} "
                f"(restore commits {restore})")
            shown[name].append(next(iter(flags.values())))
        return shown


def test_a_revision_restores_every_affected_table_in_one_commit_and_starts_new_generations(
        lake):
    lake.start()
    with lake.client() as client:
        bank, barrier, at_barrier = bank_to_revise(lake, client)
        debits, credits, ledger = tables = bank.tables
        before = bank.latest_versions()
        assert totals(tables, before) != totals(tables, at_barrier)
        with SnapshotWatcher(lake.target, tables) as watcher:
            wait_for(lambda: len(watcher.reads) >= 4, 30, "reads before the revision")
            reply = revise(client, debits, barrier, "bad batches 2 and 3")
            restore = {t.table: t.delta_version for t in reply.tables}
            wait_for(lambda: any(v[ledger] is not None and v[ledger] >= restore[ledger]
                                 for name, v in list(watcher.reads) if name == "topology"),
                     30, "a topology read showing the restore")
        assert not watcher.errors, watcher.errors
        shown = watcher.restored_in(restore)
        assert False in shown["snapshot"] and True in shown["snapshot"], shown
        assert False in shown["topology"] and True in shown["topology"], shown

        # every table of the bank and the ledger downstream, restored in one commit_ts
        assert {t.table: (t.restored_version, t.existed) for t in reply.tables} == {
            t: (at_barrier[t], True) for t in tables}
        txn = client.transaction(reply.txn_id)
        assert txn.pipeline_id == "percolake.revise" and txn.commit_ts == reply.revision_ts
        assert txn.state == pb.APPLIED
        after = bank.latest_versions()
        assert after == restore
        assert totals(tables, after) == totals(tables, at_barrier)
        older = client.call("GetSnapshot", pb.GetSnapshotRequest(
            tables=list(tables), as_of_ts=reply.revision_ts - 1))
        assert {t.table: t.delta_version for t in older.tables} == before
        # a reader whose range holds the restore (a new pipeline from 0) is told to start after
        wait_for(lambda: (completed_barrier(client, debits) or 0) > reply.revision_ts, 30,
                 "debits completing a barrier above the revision")
        with pytest.raises(grpc.RpcError) as crossing:
            client.call("GetTableChanges", pb.GetTableChangesRequest(
                table=debits, after_barrier=0,
                upto_barrier=completed_barrier(client, debits)))
        assert crossing.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"restored by revision {reply.txn_id}" in crossing.value.details()
        assert f"--start-barrier {reply.revision_ts}" in crossing.value.details()

        # bank and ledger start new generations at the revision; the root's offsets of batch 1
        assert [(p.pipeline_id, p.generation, p.start_barrier) for p in reply.pipelines] == [
            ("bank", 1, reply.revision_ts), ("ledger", 1, reply.revision_ts)]
        assert reply.root_pipeline_id == "bank" and reply.root_batch_id == 1
        assert json.loads(reply.root_source_offsets) == {"batch": 1}
        with pytest.raises(grpc.RpcError) as fenced:  # the old generation's driver is done
            bank.ledger.open(bank.ledger_batch, [ledger])
        assert fenced.value.code() == grpc.StatusCode.FAILED_PRECONDITION, fenced.value

        # the bank restarts after batch 1 (a new checkpoint: batch ids from 0); the ledger's
        # new generation reads only what follows the revision
        bank.bank.register()
        bank.ledger.register()
        assert bank.bank.generation == bank.ledger.generation == 1
        bank.ledger_after, bank.ledger_batch = reply.revision_ts, 0
        bank.bank_batch(0, rows_of=2)
        bank.catch_up(bank.bank_batch(1, rows_of=3).commit_ts)
        assert totals(tables, bank.latest_versions()) == totals(tables, before)
        check = client.call("GetSnapshot", pb.GetSnapshotRequest(
            tables=list(tables), consistency=pb.CONSISTENCY_TOPOLOGY))
        d, c, led = totals(tables, {t.table: t.delta_version if t.exists else None
                                    for t in check.tables})
        assert led.rows == d.rows + c.rows and led.amount == d.amount + c.amount

        # a barrier before the first batch: every table emptied (existed false), one more reset
        first = client.list_transactions("bank")[0].commit_ts
        empty = revise(client, debits, barrier_at_or_below(first - 1, INTERVAL_MS))
        # (the ledger's is its empty first step if that came before the first bank batch)
        assert [(t.table, t.existed) for t in empty.tables][:2] == [
            (debits, False), (credits, False)]
        assert all(table_totals(t, v).rows == 0 for t, v in bank.latest_versions().items())
        assert [(p.pipeline_id, p.generation) for p in empty.pipelines] == [
            ("bank", 2), ("ledger", 2)]
        assert empty.root_batch_id == -1 and empty.root_source_offsets == ""


def doubled_ledger_rows(debits: pa.Table, credits: pa.Table, barrier: int) -> pa.Table:
    """A broken ledger: every amount twice."""
    rows = ledger_rows(debits, credits, barrier)
    return rows.set_column(1, "amount", pc.multiply(rows.column("amount"), 2))


def audit_rows(ledger: pa.Table, barrier: int) -> pa.Table:
    """``audit`` copies the ledger's rows."""
    return ledger if ledger.num_rows else LEDGER_SCHEMA.empty_table()


def test_a_derived_revision_restores_it_and_its_downstream_and_re_reads_from_the_barrier(lake):
    """ledger (derived) is revised to B after a broken release doubled its amounts; audit
    copies the ledger. Both go back to B in one commit (T4); ledger and audit re-read their
    inputs from B in new generations, never the rows the revision rolled back; the topology
    check holds again."""
    lake.start()
    with lake.client() as client:
        bank = start_bank(lake, client)
        debits, credits, ledger = bank.tables
        audit_table = lake.table("audit")
        audit = LightPipeline(client, "audit").register()
        audit.register_reads([ledger])
        audit_at = (0, 0)
        bank.bank_batch(0)
        barrier = bank.catch_up(bank.bank_batch(1).commit_ts)
        audit_at = catch_up(client, audit, (ledger,), audit_table, audit_rows, *audit_at, barrier)
        at_barrier = bank.latest_versions()
        next_change = bank.bank_batch(2).commit_ts
        last_bank = bank.bank_batch(3).commit_ts
        broken = bank.catch_up(last_bank, doubled_ledger_rows)
        catch_up(client, audit, (ledger,), audit_table, audit_rows, *audit_at, broken)
        broken_txns = {t.txn_id for t in client.list_transactions("ledger")
                       if t.input_barrier > barrier}
        assert broken_txns
        reader = ConsistentReader(None, lake.target, retry_s=2)
        read_tables = [debits, credits, ledger, audit_table]
        seen = reader.snapshot(read_tables, consistency="topology")
        assert seen.barrier_ts >= broken and seen.revised_ts == 0

        with SnapshotWatcher(lake.target, (ledger, audit_table)) as watcher:
            wait_for(lambda: len(watcher.reads) >= 4, 30, "reads before the revision")
            reply = revise(client, ledger, barrier, "ledger release 2 doubled the amounts")
            restore = {t.table: t.delta_version for t in reply.tables}
            wait_for(lambda: any(v[audit_table] is not None
                                 and v[audit_table] >= restore[audit_table]
                                 for name, v in list(watcher.reads) if name == "topology"),
                     30, "a topology read showing the restore")
        assert not watcher.errors, watcher.errors
        shown = watcher.restored_in(restore)
        assert False in shown["topology"] and True in shown["topology"], shown

        assert reply.derived and reply.writing_pipeline_id == "ledger"
        assert reply.root_pipeline_id == "" and reply.root_batch_id == -1
        assert [t.table for t in reply.tables] == [ledger, audit_table]
        assert reply.tables[0].restored_version == at_barrier[ledger]
        assert [(p.pipeline_id, p.generation, p.start_barrier) for p in reply.pipelines] == [
            ("ledger", 1, barrier), ("audit", 1, barrier)]
        assert client.pipeline("bank").generation == 0  # the root keeps running
        assert table_totals(ledger, restore[ledger], absolute=True) == table_totals(
            ledger, at_barrier[ledger], absolute=True)
        # topology reads go back to B (up to the inputs' next change) and show the restore
        at_b = client.call("GetSnapshot", pb.GetSnapshotRequest(
            tables=[debits, credits, ledger, audit_table], consistency=pb.CONSISTENCY_TOPOLOGY))
        assert barrier <= at_b.barrier_ts < next_change
        assert at_b.revised_ts == reply.revision_ts
        # a reader that read a later barrier follows the revision back, once (T2 after it)
        back = reader.snapshot(read_tables, consistency="topology")
        assert barrier <= back.barrier_ts < seen.barrier_ts
        assert back.revised_ts == reply.revision_ts
        assert back.versions[ledger] == restore[ledger]
        assert [t.delta_version for t in at_b.tables[2:]] == [restore[ledger],
                                                              restore[audit_table]]

        # both re-read from B in their new generations (new checkpoints: batch ids from 0)
        bank.ledger.register()
        audit.register()
        bank.ledger_after, bank.ledger_batch = barrier, 0
        fixed = bank.catch_up(last_bank)
        catch_up(client, audit, (ledger,), audit_table, audit_rows, barrier, 0, fixed)
        changes = client.call("GetTableChanges", pb.GetTableChangesRequest(
            table=ledger, after_barrier=barrier, upto_barrier=fixed))
        fresh = {t.txn_id for t in client.list_transactions("ledger") if t.generation == 1}
        assert changes.changes and {c.txn_id for c in changes.changes} <= fresh
        assert not {c.txn_id for c in changes.changes} & broken_txns

        check = client.call("GetSnapshot", pb.GetSnapshotRequest(
            tables=[debits, credits, ledger, audit_table], consistency=pb.CONSISTENCY_TOPOLOGY))
        assert check.barrier_ts >= fixed
        versions = [t.delta_version if t.exists else None for t in check.tables]
        d, c = table_totals(debits, versions[0]), table_totals(credits, versions[1])
        led = table_totals(ledger, versions[2], absolute=True)
        assert (led.rows, led.amount) == (d.rows + c.rows, d.amount + c.amount)
        assert table_totals(audit_table, versions[3], absolute=True) == led
        assert reader.snapshot(read_tables, consistency="topology").barrier_ts >= fixed
        reader.close()


def test_a_derived_revision_across_a_revision_of_its_input_is_refused(lake):
    lake.start()
    with lake.client() as client:
        bank, barrier, _ = bank_to_revise(lake, client)
        debits, _, ledger = bank.tables
        revise(client, debits, barrier)
        with pytest.raises(grpc.RpcError) as refused:
            revise(client, ledger, barrier)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
        assert "would re-read it from the barrier" in refused.value.details()


def test_revisions_are_refused_for_barriers_not_completed_or_not_global(
        lake):
    lake.start()
    with lake.client() as client:
        bank = start_bank(lake, client)
        debits, _, ledger = bank.tables
        barrier = bank.catch_up(bank.bank_batch(0).commit_ts)
        versions = bank.latest_versions()
        cases = [
            (ledger, barrier + 1000 * (INTERVAL_MS << 18), "not completed"),
            (debits, barrier + 1, "not a global barrier"),
            (debits, barrier + 1000 * (INTERVAL_MS << 18), "not completed"),
        ]
        for table, to_barrier, words in cases:
            with pytest.raises(grpc.RpcError) as refused:
                revise(client, table, to_barrier)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
            assert words in refused.value.details(), refused.value.details()
        with pytest.raises(grpc.RpcError) as reserved:  # nobody drives the revision pipeline
            client.call("OpenTransaction", pb.OpenTransactionRequest(
                pipeline_id="percolake.revise", batch_id=0, tables=[debits]))
        assert reserved.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bank.latest_versions() == versions  # nothing was written


def test_below_the_retention_floor_a_revision_is_refused(tmp_path):
    from coordinator.core import CoordinatorConfig, TransactionCoordinator
    from coordinator.core.state import wall_ms
    from coordinator.store.base import TableWriter
    from coordinator.store.memory import MemoryStore
    from percolake.errors import FailedPrecondition

    store = MemoryStore()
    table = f"file://{os.path.realpath(tmp_path)}/t"
    store.insert_table_writer(TableWriter(table, "bank", 0))
    core = TransactionCoordinator(store, CoordinatorConfig([str(tmp_path)], retention_hours=1,
                                                           barrier_interval_s=0.2))
    barrier = barrier_at_or_below(core.oracle.next(), INTERVAL_MS)
    core.prune_history(now_ms=wall_ms() + 2 * 3600 * 1000)
    with pytest.raises(FailedPrecondition, match="retention floor"):
        core.revise(table, barrier)


def test_a_revision_that_cannot_take_a_table_frees_the_others_at_once(tmp_path):
    """A live write holds the table past --conflict-wait: the revision is refused and its
    attempt aborted at once (not left holding tables until it expires); once the write
    aborted, the same revision goes through (in-process core, delta-rs applier)."""
    import functools
    import time

    from coordinator.core import CoordinatorConfig, TransactionCoordinator
    from coordinator.store.memory import MemoryStore
    from percolake.errors import Conflict

    root = os.path.realpath(tmp_path)
    table = f"file://{root}/t"
    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig(
        [root], conflict_wait_s=0.2, barrier_interval_s=0.2),
        applier=functools.partial(apply_table_write, roots=[root]))
    txn, _ = core.open_transaction("bank", 0, tables=[table])
    core.commit(txn.txn_id, None, [table], [TableWriteRecord(table, WriteMode.APPEND, (
        AddFileRecord(f"_percolake/{txn.txn_id}/part-0.parquet", 10, {}, 0,
                      '{"numRecords":1}'),), SCHEMA)])
    assert core.get_snapshot([table]).versions == {table: 0}
    time.sleep(0.3)
    barrier = barrier_at_or_below(core.oracle.next(), INTERVAL_MS)
    holder, _ = core.open_transaction("bank", 1, tables=[table])
    with pytest.raises(Conflict):
        core.revise(table, barrier)
    attempts = core.list_transactions(TxnQuery(pipeline_id="percolake.revise"))
    assert [a.state for a in attempts] == [TxnState.ABORTED]
    core.abort(holder.txn_id, None)
    revision = core.revise(table, barrier)
    assert [(t.table, t.restored_version, t.delta_version) for t in revision.tables] == [
        (table, 0, 1)]
    assert [(p.pipeline_id, p.generation) for p in revision.pipelines] == [("bank", 1)]


@pytest.mark.parametrize("failpoint", ["after-revise-commit", "after-revise-reset"])
def test_a_crash_in_a_revision_is_finished_by_running_it_again(lake, failpoint):
    lake.start(f"{failpoint}=exit")
    with lake.client() as client:
        bank, barrier, at_barrier = bank_to_revise(lake, client)
        debits, _, ledger = tables = bank.tables
        crashed_call(client, "Revise", pb.ReviseRequest(table=debits, to_barrier=barrier))
    lake.wait_crashed_at(failpoint)
    with lake.store() as store:
        [revision] = [p for p in store.load_pipelines() if p.pipeline_id == "percolake.revise"]
        [txn] = [t for t in store.unfinished_txns() if t.pipeline_id == "percolake.revise"]
        assert txn.state == TxnState.COMMITTED and not any(e.applied for e in txn.tables.values())
        generations = {p.pipeline_id: p.generation for p in store.load_pipelines()}
        reset = failpoint == "after-revise-reset"
        assert generations == {"bank": int(reset), "ledger": int(reset), revision.pipeline_id: 0}
    lake.restart()
    with lake.client() as client:
        bank.client = client
        # a restarted coordinator makes a committed revision's resets before any request
        assert client.pipeline("ledger").generation == client.pipeline("bank").generation == 1
        # a reader rolls the revision forward
        assert client.snapshot(list(tables)).tables[2].delta_version > at_barrier[ledger]
        assert client.pipeline("ledger").generation == client.pipeline("bank").generation == 1
        reply = revise(client, debits, barrier)  # the same command again
        assert reply.txn_id == txn.txn_id and reply.revision_ts == txn.commit_ts
        assert [(p.pipeline_id, p.generation, p.start_barrier) for p in reply.pipelines] == [
            ("bank", 1, txn.commit_ts), ("ledger", 1, txn.commit_ts)]
        assert {t.table: t.restored_version for t in reply.tables} == at_barrier
        assert totals(tables, bank.latest_versions()) == totals(tables, at_barrier)
        assert client.call("GetPipeline", pb.GetPipelineRequest(
            pipeline_id="ledger")).generation == 1
        assert revise(client, debits, barrier).txn_id == txn.txn_id  # and again: nothing new


def test_the_revise_command_prints_the_restore_and_the_offsets_to_restart_from(lake, capsys):
    lake.start()
    with lake.client() as client:
        bank, barrier, at_barrier = bank_to_revise(lake, client)
    debits = bank.tables[0]
    args = ["revise", "--target", lake.target, "--table", debits, "--to-barrier",
            str(barrier), "--json"]
    assert cli.main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {t["table"]: t["restored_version"] for t in printed["tables"]} == at_barrier
    assert [p["pipeline_id"] for p in printed["pipelines"]] == ["bank", "ledger"]
    assert json.loads(printed["root_source_offsets"]) == {"batch": 1}
    assert cli.main(args[:-1]) == 0  # the same again, readable: the same revision
    text = capsys.readouterr().out
    assert printed["txn_id"] in text and '{"batch": 1}' in text and "generation 1" in text
    assert cli.main(["revise", "--target", lake.target, "--table", bank.tables[2],
                     "--to-barrier", str(barrier)]) == 1  # its input was revised since
    assert "would re-read it from the barrier" in capsys.readouterr().err


# ---------------------------------------------------------------- in-process refusals and offsets


def _core_with_lineage(tmp_path: Path, writers: dict[str, str],
                       reads: dict[str, list[str]], applier: bool = False):
    from coordinator.core import CoordinatorConfig, TransactionCoordinator
    from coordinator.store.base import ReadEdge, TableWriter
    from coordinator.store.memory import MemoryStore

    store = MemoryStore()
    for table, pipeline in writers.items():
        store.insert_table_writer(TableWriter(table, pipeline, 0))
    for pipeline, tables in reads.items():
        for table in tables:
            store.insert_read_edge(ReadEdge(pipeline, table, 0))
    root = os.path.realpath(tmp_path)
    return TransactionCoordinator(store, CoordinatorConfig([root], barrier_interval_s=0.2),
                                  applier=functools.partial(apply_table_write, roots=[root])
                                  if applier else None)


def test_a_revision_is_refused_when_a_downstream_pipeline_also_reads_an_unaffected_table(
        tmp_path):
    """ledger reads debits (restored) and rates (not): its new generation would restart
    rates after the restore, losing rates' changes since the barrier."""
    from percolake.errors import FailedPrecondition

    root = os.path.realpath(tmp_path)
    debits, rates, ledger = (f"file://{root}/{n}" for n in ("debits", "rates", "ledger"))
    core = _core_with_lineage(tmp_path, {debits: "bank", rates: "fx", ledger: "ledger"},
                              {"ledger": [debits, rates]})
    barrier = barrier_at_or_below(core.oracle.next(), INTERVAL_MS)
    with pytest.raises(FailedPrecondition) as refused:
        core.revise(debits, barrier)
    message = str(refused.value)
    assert "pipeline 'ledger'" in message and rates in message and debits in message, message
    assert "not supported yet" in message
    assert core.list_transactions(TxnQuery(pipeline_id="percolake.revise")) == []


def test_the_root_offsets_are_those_of_the_newest_root_batch_at_the_barrier(tmp_path):
    """Batch 1 of the root wrote only credits: revising debits to a barrier after it must
    print batch 1's offsets (restarting from batch 0's would write batch 1 again)."""
    root = Path(os.path.realpath(tmp_path))
    debits, credits = (f"file://{root}/{n}" for n in ("debits", "credits"))
    core = _core_with_lineage(tmp_path, {}, {}, applier=True)

    def batch(number: int, written: list[str]):
        txn, _ = core.open_transaction("bank", number, tables=written)
        writes = [TableWriteRecord(t, WriteMode.APPEND, (_file(
            root / t.rsplit("/", 1)[1], txn.txn_id, [number]),), SCHEMA) for t in written]
        done = core.commit(txn.txn_id, None, written, writes,
                           source_offsets=json.dumps({"batch": number}))
        core.get_snapshot(written)
        return done

    batch(0, [debits, credits])
    second = batch(1, [credits])

    def completed_both() -> int | None:
        view = core.completion()
        done = [view.completed(t) for t in (debits, credits)]
        if None in done or min(done) < second.commit_ts:
            return None
        return min(done)

    barrier = wait_for(completed_both, 30, "both tables to complete batch 1's barrier")
    batch(2, [debits, credits])
    revision = core.revise(debits, barrier)
    assert (revision.root_batch_id, json.loads(revision.root_source_offsets)) == (1, {"batch": 1})
    assert {t.table: t.restored_version for t in revision.tables} == {debits: 0, credits: 1}
    assert _ids(root / "debits") == [0] and _ids(root / "credits") == [0, 1]

    # Revised again to a barrier after the first revision, before any new root batch: the
    # tables are as that revision left them (at batch 1), not as batch 2 wrote them.
    restore_ts = revision.revision_ts
    later = wait_for(lambda: (done := completed_both()) is not None and done > restore_ts and done,
                     30, "both tables to complete the revision's barrier")
    again = core.revise(debits, later)
    assert (again.root_batch_id, json.loads(again.root_source_offsets)) == (1, {"batch": 1})
    assert _ids(root / "debits") == [0] and _ids(root / "credits") == [0, 1]


def test_the_revise_barrier_is_an_oracle_timestamp_or_the_utc_time_topology_prints():
    import argparse

    from coordinator.cli.revise import barrier_argument
    from percolake.barriers import wall_ms_of_barrier

    assert barrier_argument("123456") == 123456
    assert wall_ms_of_barrier(barrier_argument("2026-11-26T06:40:05Z")) == 1_795_675_205_000
    assert barrier_argument("2026-11-26T07:40:05+01:00") == barrier_argument("2026-11-26T06:40:05Z")
    for bad in ("yesterday", "-5"):
        with pytest.raises(argparse.ArgumentTypeError):
            barrier_argument(bad)


class InProcessChain:
    """An in-process core (delta-rs applier): the root ``bank`` and downstream pipelines,
    each batch appending its batch number; a downstream one commits one batch per planned
    barrier."""

    def __init__(self, tmp_path: Path, reads: dict[str, list[str]]) -> None:
        self.root = Path(os.path.realpath(tmp_path))
        self.core = _core_with_lineage(tmp_path, {}, {}, applier=True)
        for pipeline, tables in reads.items():
            self.core.register_reads(pipeline, [self.table(t) for t in tables], None)
        self.after: dict[str, int | None] = {p: None for p in reads}
        self.batches: dict[str, int] = {}

    def table(self, name: str) -> str:
        return f"file://{self.root}/{name}"

    def write(self, pipeline: str, table: str) -> int:
        """One applied batch; returns its commit_ts."""
        core, number = self.core, self.batches.get(pipeline, 0)
        txn, _ = core.open_transaction(pipeline, number, tables=[table])
        core.commit(txn.txn_id, None, [table], [TableWriteRecord(table, WriteMode.APPEND, (
            _file(self.root / table.rsplit("/", 1)[1], txn.txn_id, [number]),), SCHEMA)])
        self.batches[pipeline] = number + 1
        core.get_snapshot([table])  # applied
        return core.get_transaction(txn.txn_id).commit_ts

    def catch_up(self, pipeline: str, table: str, upto: int) -> int:
        """The pipeline's batches until its input barrier covers ``upto``."""
        import time

        deadline = time.monotonic() + 30
        while (self.after[pipeline] or 0) < upto:
            assert time.monotonic() < deadline, f"{pipeline} did not reach {upto}"
            after = self.after[pipeline]
            plan = self.core.plan_barrier(pipeline, 0 if after is not None else None, after)
            if plan.barrier == plan.after_barrier:
                time.sleep(0.05)
                continue
            self.write(pipeline, table)
            self.after[pipeline] = plan.barrier
        return self.after[pipeline] or 0


def test_a_topology_read_racing_a_derived_revision_answers_the_state_before_it(tmp_path):
    """A derived revision commits between a topology read's completed barriers and its
    versions: the read answers entirely as the index stood when it began (never the restore
    at a barrier its inputs passed), and the next read answers the restore (T2 per answer,
    T4)."""
    import time

    from coordinator.core.snapshots import Consistency

    chain = InProcessChain(tmp_path, {"ledger": ["debits"], "audit": ["ledger"]})
    core, root = chain.core, chain.root
    debits, ledger, audit = (chain.table(n) for n in ("debits", "ledger", "audit"))
    barrier = chain.catch_up("audit", audit, chain.catch_up("ledger", ledger,
                                                            chain.write("bank", debits)))
    chain.catch_up("audit", audit, chain.catch_up("ledger", ledger, chain.write("bank", debits)))
    tables = [debits, ledger, audit]
    while core.get_snapshot(tables, consistency=Consistency.TOPOLOGY).snapshot_ts <= barrier:
        time.sleep(0.05)
    before = core.get_snapshot(tables, consistency=Consistency.TOPOLOGY)
    at_barrier = core.completion().version_at(ledger, barrier).delta_version
    checked = core._check_not_pruned  # runs between the completed barriers and the versions

    def revise_meanwhile(ts: int, what: str, floor: int | None = None) -> None:
        core._check_not_pruned = checked
        core.revise(ledger, barrier, "a release doubled the ledger")
        checked(ts, what, floor)

    core._check_not_pruned = revise_meanwhile
    racing = core.get_snapshot(tables, consistency=Consistency.TOPOLOGY)
    assert core._check_not_pruned == checked, "the revision did not run inside the read"
    assert (racing.snapshot_ts, racing.versions) == (before.snapshot_ts, before.versions)
    restored = core.get_snapshot(tables, consistency=Consistency.TOPOLOGY)
    assert barrier <= restored.snapshot_ts < before.snapshot_ts
    assert restored.versions[ledger] > before.versions[ledger]  # the restore commits
    assert restored.versions[audit] > before.versions[audit]
    assert _ids(root / "ledger", restored.versions[ledger]) == _ids(root / "ledger", at_barrier)
    assert _ids(root / "ledger", before.versions[ledger]) != _ids(root / "ledger", at_barrier)


def test_a_topology_read_between_a_revisions_commit_and_its_resets_makes_the_resets(tmp_path):
    """The revision's index is visible from its commit on, its new generations only from its
    resets: a topology read in between makes the resets first, so it never pairs the restore
    with the old generations' completed barriers (T2)."""
    from coordinator.core.snapshots import Consistency

    chain = InProcessChain(tmp_path, {"ledger": ["debits"]})
    core = chain.core
    debits, ledger = chain.table("debits"), chain.table("ledger")
    barrier = chain.catch_up("ledger", ledger, chain.write("bank", debits))
    chain.catch_up("ledger", ledger, chain.write("bank", debits))
    tables = [debits, ledger]
    before = core.get_snapshot(tables, consistency=Consistency.TOPOLOGY)
    assert before.snapshot_ts > barrier
    txn = core._commit_revision(core._plan_revision(ledger, barrier, "a bad release"))
    assert core.get_pipeline("ledger").generation == 0  # committed, not reset yet
    read = core.get_snapshot(tables, consistency=Consistency.TOPOLOGY)
    assert core.get_pipeline("ledger").generation == 1  # the read made the resets
    # back at B (below it while the restore is not applied), never the old barrier
    assert read.snapshot_ts <= barrier < before.snapshot_ts
    assert read.versions[ledger] != before.versions[ledger]
    assert read.revised_ts == txn.commit_ts
    revision = core._finish_revision(core._get(txn.txn_id))  # the command goes on: no new reset
    assert [(p.pipeline_id, p.generation) for p in revision.pipelines] == [("ledger", 1)]


# ---------------------------------------------------------------- lineage changing meanwhile


def _meanwhile(core, action: Callable[[], None]) -> list[bool]:
    """Runs ``action`` once, when the revision opens its transaction: after its plan, while
    it would wait for its tables' holds. Returns a list that holds True once it ran."""
    from coordinator.core.revision import REVISE_PIPELINE

    real, ran = core.open_transaction, []

    def open_transaction(pipeline_id, *args, **kwargs):
        if pipeline_id == REVISE_PIPELINE and not ran:
            ran.append(True)
            action()
        return real(pipeline_id, *args, **kwargs)

    core.open_transaction = open_transaction
    return ran


def test_a_table_its_pipeline_starts_writing_while_a_revision_waits_is_revised_too(tmp_path):
    """Revising ledger to B: while the revision waits, ledger commits a batch above B that
    writes ledger and a table it never wrote before (extra). The revision decides its tables
    at its commit point: extra is restored (to nothing) and its batch superseded, so the
    re-run writes its rows once (issue 28, defect 2)."""
    from coordinator.core.snapshots import Consistency

    chain = InProcessChain(tmp_path, {"ledger": ["debits"]})
    core, root = chain.core, chain.root
    debits, ledger, extra = (chain.table(n) for n in ("debits", "ledger", "extra"))
    barrier = chain.catch_up("ledger", ledger, chain.write("bank", debits))
    above = chain.write("bank", debits)
    at_barrier = core.completion().version_at(ledger, barrier).delta_version

    def batch_writing_a_new_table() -> None:
        plan = core.plan_barrier("ledger", 0, barrier)
        while plan.barrier < above:
            import time

            time.sleep(0.05)
            plan = core.plan_barrier("ledger", 0, barrier)
        number = chain.batches["ledger"]
        txn, _ = core.open_transaction("ledger", number, tables=[ledger, extra])
        core.commit(txn.txn_id, None, [ledger, extra], [TableWriteRecord(
            t, WriteMode.APPEND, (_file(root / t.rsplit("/", 1)[1], txn.txn_id, [number]),),
            SCHEMA) for t in (ledger, extra)])
        chain.batches["ledger"] = number + 1
        core.get_snapshot([ledger, extra])  # applied
        assert core.get_transaction(txn.txn_id).input_barrier > barrier

    ran = _meanwhile(core, batch_writing_a_new_table)
    revision = core.revise(ledger, barrier, "a bad release")
    assert ran
    assert {t.table: t.restored_version for t in revision.tables} == {ledger: at_barrier,
                                                                      extra: None}
    assert _ids(root / "extra") == []
    assert _ids(root / "ledger") == _ids(root / "ledger", at_barrier)
    assert core.store.first_table_commit_after(extra, 0, True) is None  # superseded
    assert [p.pipeline_id for p in revision.pipelines] == ["ledger"]
    tables = [debits, ledger, extra]
    read = core.get_snapshot(tables, consistency=Consistency.TOPOLOGY)
    assert read.snapshot_ts <= barrier or read.versions[extra] is not None


def test_a_pipeline_reading_a_revised_table_registered_while_the_revision_waits_is_reset(
        tmp_path):
    """Revising debits (root) to B: while the revision waits, audit registers a read of
    debits. The revision, deciding its pipelines at its commit point, starts audit anew
    after the restore too (issue 28, defect 2)."""
    chain = InProcessChain(tmp_path, {"ledger": ["debits"]})
    core = chain.core
    debits, ledger = chain.table("debits"), chain.table("ledger")
    barrier = chain.catch_up("ledger", ledger, chain.write("bank", debits))
    chain.write("bank", debits)
    epoch = chain.core.register_pipeline("audit", None).epoch
    ran = _meanwhile(core, lambda: core.register_reads("audit", [debits], epoch))
    revision = core.revise(debits, barrier, "a bad import")
    assert ran
    assert {p.pipeline_id: p.generation for p in revision.pipelines} == {
        "bank": 1, "ledger": 1, "audit": 1}
    assert core.get_pipeline("audit").start_barrier == revision.revision_ts


def test_a_revision_whose_lineage_keeps_changing_is_refused_with_nothing_revised(tmp_path):
    from coordinator.core.revision import REPLANS, REVISE_PIPELINE
    from percolake.errors import FailedPrecondition

    chain = InProcessChain(tmp_path, {"ledger": ["debits"]})
    core = chain.core
    debits, ledger = chain.table("debits"), chain.table("ledger")
    barrier = chain.catch_up("ledger", ledger, chain.write("bank", debits))
    real, readers = core.open_transaction, []

    def open_transaction(pipeline_id, *args, **kwargs):
        if pipeline_id == REVISE_PIPELINE:  # a new reader before every commit point
            readers.append(f"reader{len(readers)}")
            core.register_reads(readers[-1], [debits], None)
        return real(pipeline_id, *args, **kwargs)

    core.open_transaction = open_transaction
    with pytest.raises(FailedPrecondition) as refused:
        core.revise(debits, barrier, "a bad import")
    assert len(readers) == REPLANS
    assert "lineage of the revised tables changed" in str(refused.value)
    assert readers[-1] in str(refused.value) and "run it again" in str(refused.value)
    attempts = core.list_transactions(TxnQuery(pipeline_id=REVISE_PIPELINE))
    assert attempts and all(a.state == TxnState.ABORTED for a in attempts)
    assert _ids(chain.root / "debits") == [0]  # nothing restored


def test_a_derived_revision_below_its_writers_root_era_is_refused(tmp_path):
    """enrich wrote events as a root pipeline, then started reading debits: events is derived
    now, but re-reading debits cannot make its root-era commit again, so a revision to a
    barrier before that commit is refused, naming it (docs/topology.md, lineage transitions)."""
    from percolake.errors import FailedPrecondition

    chain = InProcessChain(tmp_path, {})
    core = chain.core
    debits, events = chain.table("debits"), chain.table("events")
    chain.write("bank", debits)
    root_era = chain.write("enrich", events)
    core.register_reads("enrich", [debits], None)
    barrier = barrier_at_or_below(root_era - 1, INTERVAL_MS)
    assert barrier > 0 and core.completion().completed(events) >= barrier
    with pytest.raises(FailedPrecondition) as refused:
        core.revise(events, barrier, "a bad release")
    message = str(refused.value)
    assert "before it read percolake tables" in message and events in message, message
    assert core.list_transactions(TxnQuery(pipeline_id="percolake.revise")) == []
