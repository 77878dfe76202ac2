"""Fault injection, fast mode (issue 5): each crash point C1-C11 once, with real processes.

Every scenario runs the coordinator as its own process, kills the named process hard at its
protocol step (a failpoint's ``os._exit`` or SIGKILL), restarts it on the same data dir, port
and checkpoint, lets the work finish, and hands everything to the checker
(``tests/crash/checker.py``), which reads every Delta version with ``deltalake``, the
coordinator's records and a concurrent snapshot reader's observations. The long mode is
``scripts/crash_soak.py --minutes M``.
"""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest

from tests.crash import light, scenarios
from tests.crash.checker import Checker, read_versions
from tests.crash.harness import Scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def spark_test(fn):  # noqa: ANN001, ANN201 - a test function
    """A test with a Spark driver (marked ``spark``)."""
    return pytest.mark.spark(fn)


def _assert_clean(outcome: scenarios.Outcome) -> None:
    assert not outcome.violations, outcome.summary()


# ---------------------------------------------------------------- the checker is not vacuous


def test_checker_flags_duplicates_aborted_files_losses_and_torn_reads(tmp_path):
    """The checker passes a clean run and reports each kind of damage done to it by hand."""
    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import AddAction

    from percolake.v1 import coordinator_pb2 as pb

    sc = Scenario(tmp_path)
    sc.daemon.extra_args.append("--shared-table-writers")  # an intruder pipeline writes below
    try:
        sc.start_coordinator()
        runs = light.run_light(sc.target, str(sc.lake), pipelines=1, batches=3, k=sc.k)
        for run in runs:
            run.join(60)
            assert not run.errors, run.errors
        tables = light.all_tables(runs)
        debits = next(t for t in tables if t.name == "p0_debits")
        with sc.client() as client:
            clean = Checker(client, tables).check({("p0", 0): range(3)})
            assert not clean.violations, clean.summary()
            assert clean.batches_verified == 3 and clean.versions_checked >= 12

            # Damage 1: the newest batch applied a second time (same files, a new version).
            dt = DeltaTable(debits.path)
            newest = set(read_versions(debits.path)[-1].adds)
            dt.create_write_transaction(
                [AddAction(p, os.path.getsize(os.path.join(debits.path, p)), {}, 0, True,
                           f'{{"numRecords":{sc.k}}}') for p in sorted(newest)],
                "append", dt.schema())
            # Damage 2: a file of an aborted attempt reaches the Delta log.
            opened = client.call("OpenTransaction", pb.OpenTransactionRequest(
                pipeline_id="intruder", batch_id=0, tables=[debits.path]))
            txn_id = opened.transaction.txn_id
            client.call("AbortTransaction", pb.AbortTransactionRequest(txn_id=txn_id))
            folder = sc.lake / "p0_debits" / "_percolake" / txn_id
            folder.mkdir(parents=True)
            rows = pa.table({c: pa.array([7], pa.int64()) for c in debits.columns})
            import pyarrow.parquet as pq

            pq.write_table(rows, folder / "part-0.parquet")
            dt = DeltaTable(debits.path)
            dt.create_write_transaction(
                [AddAction(f"_percolake/{txn_id}/part-0.parquet",
                           (folder / "part-0.parquet").stat().st_size, {}, 0, True,
                           '{"numRecords":1}')], "append", dt.schema())
            # Damage 3: a plain Delta write outside any attempt folder.
            write_deltalake(debits.path, rows, mode="append")
            # Damage 4: an expected batch that never ran; damage 5: a torn snapshot read.
            torn = {"reader": "r", "snapshot_ts": 1 << 62, "prefixes": ["p0_"], "tables": {
                "p0_debits": {"version": 0, "txns": {}, "rows": 3, "sum": 10},
                "p0_credits": {"version": 0, "txns": {}, "rows": 0, "sum": 0}}}
            damaged = Checker(client, tables).check({("p0", 0): range(4)}, [torn],
                                                    cleanup_timeout_s=0.5)
        text = "\n".join(damaged.violations)
        assert "applied twice" in text, text
        assert f"of txn {txn_id} (ABORTED) is visible" in text, text
        assert "attempt folder of an aborted txn still exists" in text, text
        assert "outside any attempt folder" in text, text
        assert "missing [3]" in text, text
        assert "debits 3 rows / 10 vs credits 0 rows / 0" in text, text
    finally:
        sc.close()


# ---------------------------------------------------------------- driver crashes


@spark_test
@pytest.mark.timeout(900)  # seven drivers, one after another
def test_driver_dies_at_c1_c2_c3_c6_c7_c8_each_batch_lands_exactly_once(tmp_path):
    """One driver after another dies at C1 after Open, C2 mid-prewrite (after the second
    table's files), C3 after every table's files, C6 after the commit reply, C7 after one
    secondary, C8 after all of them, each in its own batch. Before the commit point the attempt
    is aborted, its files deleted (I3) and the replay writes the batch again; after it the batch
    is applied to every table (I4) and the replay does not run the user's function again. Every
    batch is in every table exactly once (I2), readers never saw a partial batch (I1)."""
    points = ["C1", "C2", "C3", "C6", "C7", "C8"]
    outcome = scenarios.driver_crash_chain(tmp_path, points)
    _assert_clean(outcome)
    committed = {c["point"]: c["committed_before_replay"] for c in outcome.notes["crashes"]}
    assert committed == {"C1": False, "C2": False, "C3": False,
                         "C6": True, "C7": True, "C8": True}, outcome.notes


@spark_test
def test_c2_driver_dies_as_the_first_of_three_concurrent_writes_ends_batch_lands_once(tmp_path):
    """C2 with concurrent writes: the driver dies as soon as the first of batch 1's three
    table writes has its files, the other two write jobs submitted beside it. The attempt never
    committed; the next driver runs the batch again and every batch is in every table exactly
    once (I2), with no file of the dead attempt in any Delta version (I3)."""
    outcome = scenarios.driver_crash(tmp_path, "C2-concurrent", "mid-prewrite=1*exit@1",
                                     crash_batch=1)
    _assert_clean(outcome)
    assert not {"COMMITTED", "APPLIED"} & set(outcome.notes["states_after_crash"]), outcome.notes
    assert 1 in outcome.notes["user_fn_recovery_run"], outcome.notes


@spark_test
def test_driver_dies_before_the_deferred_report_batch_lands_once_and_ends_applied(tmp_path):
    """C8r: the driver dies after every table's Delta commit of batch 1 but before its applied
    report is handed to the background sender. The transaction is committed and its tables
    stay held; the next driver's replay is answered already committed (the user's function does
    not run again), the report comes by the replay or the coordinator's roll-forward, and the
    transaction ends APPLIED; every batch is in every table exactly once (I2, I4)."""
    outcome = scenarios.CRASH_POINTS["C8r"](tmp_path)
    _assert_clean(outcome)
    notes = outcome.notes
    assert {"COMMITTED", "APPLIED"} & set(notes["states_after_crash"]), notes
    assert len(notes["tables_with_crashed_batch"]) == 3, notes  # every secondary was done
    assert 1 not in notes["user_fn_recovery_run"], notes
    assert "APPLIED" in notes["states_after_recovery"], notes


# ---------------------------------------------------------------- coordinator crashes


@spark_test
@pytest.mark.parametrize("point", ["C4", "C5"])
def test_coordinator_dies_around_commit_driver_survives_every_batch_once(
        tmp_path, point):
    """C4 before the commit is durable, C5 after it but before the reply: the driver rides out
    the restart on its retries; every batch lands exactly once (I2, I4, I6)."""
    outcome = scenarios.CRASH_POINTS[point](tmp_path)
    _assert_clean(outcome)
    assert outcome.notes["coordinator_restarts"] >= 1


def test_c9_coordinator_sigkilled_under_concurrent_load_loses_and_duplicates_nothing(tmp_path):
    """C9: three pipelines commit concurrently (a shared table among them) while the coordinator
    is SIGKILLed at random moments: every acknowledged commit is applied (I4), no batch is
    committed twice (I2), timestamps rise across restarts (I6), tables follow commit_ts (I7),
    snapshot reads stay atomic (I1)."""
    outcome = scenarios.coordinator_sigkill_under_load(tmp_path, random.Random(9))
    _assert_clean(outcome)
    assert outcome.notes["restarts"] >= 3 and outcome.notes["acks"] >= 18


# ---------------------------------------------------------------- identity


def test_c10_old_epoch_requests_of_a_zombie_change_nothing(tmp_path):
    """C10 at the protocol level (no Spark): after a new driver registered, every request the old
    driver sends with its old epoch (commit, open, declare, prewrite, heartbeat, abort, report
    applied) is refused and changes no transaction (I5); the new driver's batches land exactly
    once; files the zombie's executors wrote after its abort are deleted eventually (I3)."""
    outcome = scenarios.zombie_light(tmp_path)
    _assert_clean(outcome)
    assert set(outcome.notes["refusals"]) == {"Commit", "Open", "Declare", "Prewrite",
                                              "Heartbeat", "Abort", "ReportApplied"}


@spark_test
def test_c10_zombie_driver_is_fenced_and_changes_nothing(tmp_path):
    """C10: the old driver wakes after a new one registered: its commit is refused as fenced,
    its attempt is aborted and none of its files reach any Delta version (I5, I3)."""
    outcome = scenarios.zombie_driver(tmp_path)
    _assert_clean(outcome)
    assert outcome.notes["epochs"][1] > outcome.notes["epochs"][0]


@spark_test
def test_c11_deleted_checkpoint_refused_until_reset_then_every_batch_lands(tmp_path):
    """C11: a query on a deleted checkpoint is refused (FAILED_PRECONDITION, nothing written,
    nothing skipped) until reset-pipeline; then generation 1's batches 0.. all land (I9)."""
    outcome = scenarios.checkpoint_reset(tmp_path)
    _assert_clean(outcome)
    assert outcome.notes["generations"] == [0, 1]


# ---------------------------------------------------------------- found by C9


def test_apply_returns_the_version_holding_the_write_when_another_commit_lands_meanwhile(
        tmp_path, monkeypatch):
    """Found by C9 (a participant and the coordinator's roll-forward apply the same write while
    a third commit lands): a re-apply must answer the Delta version that holds the write, also
    when the log moved on after the applier loaded the table. A wrong version reported first
    would make GetSnapshot hand out a version that is not the batch's (I1, I4)."""
    import pyarrow.parquet as pq
    from deltalake import Schema

    from percolake.lake import delta_commit
    from percolake.records import AddFileRecord, TableWriteRecord, WriteMode

    data = pa.table({"a": pa.array([1], pa.int64())})

    def write(txn: str) -> TableWriteRecord:
        folder = tmp_path / "t" / "_percolake" / txn
        folder.mkdir(parents=True)
        pq.write_table(data, folder / "p.parquet")
        return TableWriteRecord(
            f"file://{tmp_path}/t", WriteMode.APPEND,
            (AddFileRecord(f"_percolake/{txn}/p.parquet", (folder / "p.parquet").stat().st_size,
                           {}, 0, '{"numRecords":1}'),), Schema.from_arrow(data.schema).to_json())

    def apply(w: TableWriteRecord, txn: str, app: str, batch: int) -> int:
        return delta_commit.apply_table_write(w, app_id=app, app_version=batch, txn_id=txn,
                                              commit_ts=batch + 1)

    assert apply(write("a"), "a", "p", 0) == 0
    b = write("b")
    assert apply(b, "b", "p", 1) == 1
    other = write("c")
    real_open = delta_commit.open_table

    def open_then_another_commit_lands(uri: str, version: int | None = None):  # noqa: ANN202
        table = real_open(uri, version)
        if other is not None and not getattr(open_then_another_commit_lands, "done", False):
            open_then_another_commit_lands.done = True
            apply(other, "c", "q", 0)  # another pipeline's commit lands: version 2
        return table

    monkeypatch.setattr(delta_commit, "open_table", open_then_another_commit_lands)
    assert apply(b, "b", "p", 1) == 1  # already applied at version 1


# ---------------------------------------------------------------- table features (I10)


def test_a_table_feature_percolake_cannot_write_leaves_no_table_of_the_batch_showing_it(
        tmp_path):
    """A table of the batch requires ``identityColumns``: the commit is refused naming it, a
    coordinator crash right after changes nothing, no table shows the batch, snapshots answer;
    once the feature is dropped the batch lands everywhere exactly once."""
    outcome = scenarios.refused_table_feature(tmp_path)
    _assert_clean(outcome)
    assert "FAILED_PRECONDITION" in outcome.notes["refusal"]
    assert outcome.notes["snapshot_s"] < 5
