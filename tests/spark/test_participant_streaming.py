"""A real streaming query writing three Delta tables through the participant."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from percolake import failpoints
from sparkside import ConsistentReader, Participant
from tests.spark.conftest import run_until
from tests.spark.helpers import committed_batches, files_of_every_version, rows, transactions

ROWS = 10
pytestmark = pytest.mark.spark


def bank_writer(lake, calls, fail_on=None):  # noqa: ANN001, ANN201
    """Each batch moves money: one debit and one credit of the same amount per row."""

    def write_batch(df, batch_id, txn):  # noqa: ANN001, ANN202
        calls.append(batch_id)
        moves = df.select(F.lit(batch_id).alias("batch"), F.col("value").alias("move"),
                          (F.col("value") % 7 + 1).alias("amount"))
        txn.write(moves.select("batch", "move", "amount"), str(lake / "debits"))
        if fail_on is not None and fail_on(batch_id):
            raise RuntimeError(f"user code failed in batch {batch_id}")
        txn.write(moves.select("batch", "move", "amount"), str(lake / "credits"))
        balances = moves.groupBy((F.col("move") % 3).alias("account")).agg(
            F.sum("amount").alias("balance"))
        txn.write(balances, str(lake / "balances"), mode="overwrite")

    return write_batch


def assert_exactly_once(lake, batches):  # noqa: ANN001
    """Every committed batch appears exactly once in debits and credits, nothing else does."""
    for name in ("debits", "credits"):
        found = Counter((r["batch"], r["move"]) for r in rows(lake / name))
        expected = {(b, v) for b in batches for v in range(b * ROWS, (b + 1) * ROWS)}
        assert set(found) == expected, f"{name}: rows of other batches or missing rows"
        assert set(found.values()) == {1}, f"{name}: duplicated rows"


def test_every_batch_lands_exactly_once_in_every_table(spark, lake_daemon, lake, tmp_path):
    participant = Participant(lake_daemon.target, pipeline_id=f"once-{lake.name}")
    calls: list[int] = []
    run_until(spark, participant, bank_writer(lake, calls), tmp_path / "ck",
              lambda: len(committed_batches(lake_daemon.stub, participant.pipeline_id)) >= 3,
              rows_per_batch=ROWS)
    batches = committed_batches(lake_daemon.stub, participant.pipeline_id)
    reader = ConsistentReader(spark, lake_daemon.target)
    tables = [str(lake / t) for t in ("debits", "credits", "balances")]
    snap = reader.snapshot(tables)
    assert_exactly_once(lake, batches)
    # one Delta version per committed batch per table, each tagged with its transaction
    assert snap.versions[tables[0]] == snap.versions[tables[1]] == len(batches) - 1
    debits = snap.table(tables[0]).agg(F.sum("amount")).first()[0]
    credits = snap.table(tables[1]).agg(F.sum("amount")).first()[0]
    assert debits == credits == sum(r["amount"] for r in rows(lake / "debits"))


def test_replayed_committed_batch_is_not_written_again(spark, lake_daemon, lake, tmp_path):
    pipeline = f"replay-{lake.name}"
    calls: list[int] = []
    failpoints.enable("after-commit-reply", "2*raise")  # batch 1 commits, then the driver "dies"
    first = run_until(spark, Participant(lake_daemon.target, pipeline_id=pipeline),
                      bank_writer(lake, calls), tmp_path / "ck", lambda: False)
    assert first.exception() is not None and 1 in committed_batches(lake_daemon.stub, pipeline)
    failpoints.disable()
    run_until(spark, Participant(lake_daemon.target, pipeline_id=pipeline),
              bank_writer(lake, calls), tmp_path / "ck",
              lambda: len(committed_batches(lake_daemon.stub, pipeline)) >= 4)
    assert calls.count(1) == 1, f"the user's function ran again for committed batch 1: {calls}"
    assert_exactly_once(lake, committed_batches(lake_daemon.stub, pipeline))


def test_exception_in_user_function_leaves_no_trace(spark, lake_daemon, lake, tmp_path):
    pipeline = f"fail-{lake.name}"
    calls: list[int] = []
    seen: set[int] = set()

    def first_try_of_batch_1(batch_id: int) -> bool:
        fail = batch_id == 1 and batch_id not in seen
        seen.add(batch_id)
        return fail

    failed = run_until(spark, Participant(lake_daemon.target, pipeline_id=pipeline),
                       bank_writer(lake, calls, first_try_of_batch_1), tmp_path / "ck",
                       lambda: False)
    assert "user code failed in batch 1" in str(failed.exception())
    aborted = [t for t in transactions(lake_daemon.stub, pipeline) if t.batch_id == 1]
    assert len(aborted) == 1 and aborted[0].abort_reason.startswith("RuntimeError")
    attempt_dir = lake / "debits" / "_percolake" / aborted[0].txn_id
    assert not attempt_dir.exists(), "files of the aborted attempt remain"
    run_until(spark, Participant(lake_daemon.target, pipeline_id=pipeline),
              bank_writer(lake, calls), tmp_path / "ck",
              lambda: len(committed_batches(lake_daemon.stub, pipeline)) >= 3)
    assert calls.count(1) == 2  # failed once, then succeeded
    assert_exactly_once(lake, committed_batches(lake_daemon.stub, pipeline))
    for name in ("debits", "credits"):
        assert not any(aborted[0].txn_id in p for p in files_of_every_version(lake / name))


def test_snapshots_taken_during_writes_always_balance(spark, lake_daemon, lake, tmp_path,
                                                      monkeypatch):
    """A reader thread snapshots debits and credits while batches land.

    The tables' Delta commits run one at a time here and a failpoint holds the participant for
    a moment after each, so the tables on disk are torn for a while in every batch (debits has
    the batch, credits not yet; side by side, the tear lasts only between two commits).
    Snapshots taken then must still balance and hold the whole batch: the coordinator rolls
    the rest of it forward before answering (I1, I4).
    """
    pipeline = f"bank-{lake.name}"
    debits, credits = lake / "debits", lake / "credits"
    tables = [str(debits), str(credits)]
    stop = threading.Event()
    checked: list[tuple[int, int]] = []
    torn: list[tuple[tuple, tuple]] = []
    errors: list[BaseException] = []

    def latest(path) -> int | None:  # noqa: ANN001
        return DeltaTable(str(path)).version() if DeltaTable.is_deltatable(str(path)) else None

    def read_snapshots() -> None:
        """Polls the tables on disk; snapshots when they are torn, and now and then anyway.

        (Snapshotting all the time would roll every batch forward before the participant
        applies it, and the tables would never be seen torn.)
        """
        reader = ConsistentReader(spark, lake_daemon.target)
        last = 0.0
        while not stop.is_set():
            try:
                on_disk = (latest(debits), latest(credits))
                is_torn = on_disk[0] is not None and on_disk[0] != on_disk[1]
                if not is_torn and time.monotonic() - last < 1.0:
                    time.sleep(0.005)
                    continue
                last = time.monotonic()
                snap = reader.snapshot(tables)
                versions = (snap.versions[tables[0]], snap.versions[tables[1]])
                if None in versions:
                    continue
                checked.append((sum(r["amount"] for r in rows(debits, versions[0])),
                                sum(r["amount"] for r in rows(credits, versions[1]))))
                if is_torn:
                    torn.append((on_disk, versions))
                    assert versions[0] >= on_disk[0], \
                        f"snapshot {versions} misses the batch already in debits {on_disk}"
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                return

    monkeypatch.setattr("sparkside.participant.SECONDARY_WORKERS", 1)
    failpoints.enable("after-secondary", "sleep(0.4)")
    reader = threading.Thread(target=read_snapshots)
    reader.start()
    try:
        run_until(spark, Participant(lake_daemon.target, pipeline_id=pipeline),
                  bank_writer(lake, []), tmp_path / "ck",
                  lambda: len(committed_batches(lake_daemon.stub, pipeline)) >= 4)
    finally:
        stop.set()
        reader.join()
    assert not errors, errors
    assert torn, "the reader never saw the tables torn on disk: the test proves nothing"
    assert len(checked) >= 3
    assert all(d == c for d, c in checked), f"a snapshot saw a partial batch: {checked}"
    assert_exactly_once(lake, committed_batches(lake_daemon.stub, pipeline))
