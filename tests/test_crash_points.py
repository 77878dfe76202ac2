"""Fault injection, fast mode (issue 5): each crash point C1-C10 once, with real processes
(C11 with a real query: ``tests/spark/test_checkpoint_reset.py``).

Every scenario runs the coordinator as its own process, kills the named process hard at its
protocol step (a failpoint's ``os._exit`` or SIGKILL), restarts it on the same data dir, port
and checkpoint, lets the work finish, and hands everything to the checker
(``tests/crash/checker.py``), which reads every Delta version with ``deltalake``, the
coordinator's records and a concurrent snapshot reader's observations. The long mode is
``scripts/crash_soak.py --minutes M``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from tests.crash import light, scenarios
from tests.crash.checker import Checker, read_versions
from tests.crash.harness import Scenario
from tests.crash.rpc import Client, state_name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


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


def _committed_before_replay(outcome: scenarios.Outcome) -> dict[str, bool]:
    return {c["point"]: c["committed_before_replay"] for c in outcome.notes["crashes"]}


AFTER_THE_COMMIT_POINT = ["C6", "C7", "C8", "C8r"]


@spark_test
def test_driver_dies_before_the_commit_point_c1_c2_c3_then_after_it_c6_c7_c8_c8r(tmp_path):
    """One driver after another dies at each driver crash point, each next driver replaying the
    batch its predecessor died in: one chain, one coordinator, reader and checker for all.

    Before the commit point, in batch 0: C1 after Open, C2 as the first of the batch's three
    concurrent table writes has its files (the other two submitted beside it), C2 after the
    second table's files, C3 after every table's files. No attempt committed; each is aborted,
    its files deleted (I3), and the next driver runs the user's function for the batch again.

    After the commit point, each SIGKILLed in a batch of its own (1 to 4): C6 after the commit
    reply, C7 after one secondary, C8 after all of them, C8r after every table's Delta commit
    but before the applied report is handed to the background sender. The batch is applied to
    every table (I4) and the next driver does not run the user's function for it again (I2).
    C8r's transaction is committed with every table done; the replay is answered already
    committed, the report comes by the replay or the coordinator's roll-forward, and it ends
    APPLIED.

    Every batch is in every table exactly once (I2), readers never saw a partial batch (I1).
    It is also issue 32's acceptance run: every batch the drivers from C6 on commit, besides the
    bank tables, MERGEs each account's net change into a balances table keyed by account and
    inserts then deletes on a fourth table, through ``txn.delta_table``, both tables made by
    delta-spark (CREATE TABLE ... USING DELTA) before the stream. Every snapshot read shows
    each account's balance equal to its credits minus its debits, and delta-spark's latest
    reads hold every batch exactly once (``tests/crash/row_level_job.py``)."""
    before = list(scenarios.BEFORE_THE_COMMIT_POINT)
    outcome = scenarios.driver_crash_chain(tmp_path, AFTER_THE_COMMIT_POINT, row_level=True,
                                           first_batch_points=before)
    _assert_clean(outcome)
    row_level = outcome.notes["row_level"]
    assert row_level["final_read"] and row_level["snapshot_reads_checked"] >= 3, outcome.notes
    assert _committed_before_replay(outcome) == {
        **dict.fromkeys(before, False), **dict.fromkeys(AFTER_THE_COMMIT_POINT, True)}, \
        outcome.notes
    crashes = {c["point"]: c for c in outcome.notes["crashes"]}
    for point in before:
        crash = crashes[point]
        assert not {"COMMITTED", "APPLIED"} & set(crash["states_after_crash"]), crash
        assert crash["batch"] in crash["next_run_user_fn"], crash
    assert outcome.report.aborted >= len(before), outcome.summary()
    deferred = crashes["C8r"]
    assert len(deferred["tables_with_crashed_batch"]) == 3, deferred  # every secondary done
    assert "APPLIED" in deferred["states_after_recovery"], deferred
    for point in AFTER_THE_COMMIT_POINT:
        assert crashes[point]["batch"] not in crashes[point]["next_run_user_fn"], crashes[point]


# ---------------------------------------------------------------- coordinator crashes


@spark_test
def test_coordinator_dies_around_commit_c4_then_c5_driver_survives_every_batch_once(tmp_path):
    """C4 before the commit is durable, then, once restarted, C5 on its next commit, after it
    is durable but before the reply: the driver rides out both restarts on its retries; every
    batch lands exactly once (I2, I4, I6)."""
    outcome = scenarios.coordinator_crash(tmp_path, "C4+C5", "before-commit-durable",
                                          then="after-commit-durable-before-reply")
    _assert_clean(outcome)
    assert outcome.notes["coordinator_restarts"] >= 2, outcome.notes
    assert outcome.notes["driver_rc"] == 0, outcome.notes


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


# ---------------------------------------------------------------- merges (issue 32)


def _run_merge_driver(daemon, table: Path, query_id: str, failpoint: str = ""):  # noqa: ANN001, ANN202
    env = {**os.environ, "PERCOLAKE_FAILPOINTS": failpoint}
    return subprocess.run(
        [sys.executable, "-m", "tests.crash.merge_driver", daemon.target, str(table), "merge",
         query_id], env=env, capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parent.parent)


def _commits_of(table: Path, txn_id: str) -> list[dict]:
    infos = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if info and info.get("percolake.txn_id") == txn_id:
                infos.append(info)
    return infos


@pytest.mark.parametrize("point", ["before-row-level-entry", "after-row-level-entry"])
def test_a_driver_killed_around_a_merges_delta_commit_applies_it_exactly_once(daemon, point):
    """The driver dies in the merge's apply after COMMITTED: before its Delta log entry is put,
    or after it is put but before the coordinator records it applied. The restarted driver
    (same query) replays the batch: it is answered already committed, finishes the apply, and
    the table holds the merge exactly once (no row lost, none updated or inserted twice), in
    one commit named MERGE; the transaction ends APPLIED."""
    from deltalake import write_deltalake

    from percolake.lake.arrow_read import read_delta_table

    table = daemon.warehouse / "balances"
    write_deltalake(str(table), pa.table({"id": pa.array([1, 2, 3], pa.int64()),
                                          "value": pa.array([10, 20, 30], pa.int64())}))
    query_id = str(uuid.uuid4())
    crashed = _run_merge_driver(daemon, table, query_id, f"{point}=exit")
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    assert f"failpoint {point}: exit" in crashed.stderr
    txn_id = json.loads(crashed.stdout.splitlines()[-1])["txn_id"]
    with Client(daemon.target) as client:
        assert state_name(client.transaction(txn_id).state) == "COMMITTED"
    assert len(_commits_of(table, txn_id)) == (0 if point.startswith("before") else 1)

    replay = _run_merge_driver(daemon, table, query_id)
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert json.loads(replay.stdout.splitlines()[-1]) == {"txn_id": txn_id, "replayed": True}
    rows = sorted((r["id"], r["value"]) for r in read_delta_table(str(table)).to_pylist())
    assert rows == [(1, 10), (2, 25), (3, 30), (4, 40)]
    commits = _commits_of(table, txn_id)
    assert len(commits) == 1 and commits[0]["operation"] == "MERGE", commits
    with Client(daemon.target) as client:
        assert state_name(client.transaction(txn_id).state) == "APPLIED"
        batch = [t for t in client.list_transactions("merge")
                 if state_name(t.state) in ("COMMITTED", "APPLIED")]
        assert [t.txn_id for t in batch] == [txn_id]


# ---------------------------------------------------------------- merge_schema's log entry


@pytest.mark.parametrize("failpoint", ["before-log-entry", "after-log-entry"])
def test_a_merge_schema_roll_forward_crashing_around_its_log_entry_lands_exactly_once(
        tmp_path, failpoint):
    """The coordinator's roll-forward of a committed merge_schema write dies before or after
    writing a Delta log entry of its own (every table's apply is one: appends); restarted, it
    rolls the batch forward: one version with the data and the new column, every table once."""
    outcome = scenarios.merge_schema_entry_crash(tmp_path, failpoint)
    _assert_clean(outcome)
    if failpoint == "after-log-entry":
        assert outcome.notes["entries_at_crash"] > 0, outcome.notes
    else:  # the crashing table's apply had written nothing (others run beside it)
        assert outcome.notes["tables_without_entry_at_crash"] > 0, outcome.notes
    assert outcome.notes["entries"] == 1
