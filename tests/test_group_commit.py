"""SqliteStore group commit: batches share one COMMIT, and nothing is durable before flush()."""

import sqlite3
import threading

import pytest

from coordinator.store import SqliteStore
from percolake.errors import StoreConflict
from percolake.records import TxnRecord
from percolake.states import TxnState


def txn(txn_id: str, start_ts: int) -> TxnRecord:
    return TxnRecord(txn_id=txn_id, pipeline_id="p", generation=0, batch_id=start_ts, attempt=1,
                     epoch=0, query_id="", state=TxnState.OPEN, start_ts=start_ts,
                     created_ms=1, updated_ms=1)


def durable_ids(tmp_path) -> set[str]:
    """What another connection (a restart) sees: only committed rows."""
    with sqlite3.connect(tmp_path / "coordinator.db") as other:
        return {r[0] for r in other.execute("SELECT txn_id FROM transactions")}


def test_batches_become_durable_at_flush_not_before(tmp_path):
    store = SqliteStore(tmp_path, group_commit=True)
    store.insert_txn(txn("a", 1))
    with store.batch():
        store.insert_txn(txn("b", 2))
    assert store.get_txn("b") is not None  # the store reads its own pending writes
    assert durable_ids(tmp_path) == set()
    store.flush()
    assert durable_ids(tmp_path) == {"a", "b"}
    store.close()


def test_a_failed_batch_rolls_back_only_its_own_writes(tmp_path):
    store = SqliteStore(tmp_path, group_commit=True)
    store.insert_txn(txn("a", 1))
    with pytest.raises(StoreConflict), store.batch():
        store.insert_txn(txn("b", 2))
        store.insert_txn(txn("a", 3))  # conflicts: the whole batch goes
    store.flush()
    assert durable_ids(tmp_path) == {"a"}
    assert store.get_txn("b") is None
    store.close()


def test_timestamp_high_water_is_durable_at_once(tmp_path):
    store = SqliteStore(tmp_path, group_commit=True)
    store.write_timestamp_high_water(1234)
    assert SqliteStore(tmp_path).read_timestamp_high_water() == 1234
    store.close()


def test_close_commits_what_is_pending(tmp_path):
    store = SqliteStore(tmp_path, group_commit=True)
    store.insert_txn(txn("a", 1))
    store.close()
    assert durable_ids(tmp_path) == {"a"}


def test_concurrent_writers_share_commits_and_all_are_durable_after_their_flush(tmp_path):
    store = SqliteStore(tmp_path, group_commit=True)
    errors: list[BaseException] = []

    def writer(worker: int) -> None:
        try:
            for i in range(50):
                txn_id = f"w{worker}-{i}"
                store.insert_txn(txn(txn_id, worker * 1000 + i))
                store.flush()
                assert txn_id in durable_ids(tmp_path)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(durable_ids(tmp_path)) == 400
    assert store.group_commits < 400  # several batches shared a commit
    store.close()


def test_without_group_commit_every_batch_is_durable_on_return(tmp_path):
    store = SqliteStore(tmp_path)
    store.insert_txn(txn("a", 1))
    assert durable_ids(tmp_path) == {"a"}
    store.flush()  # a no-op
    store.close()
