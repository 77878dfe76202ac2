"""The servicer's flush before a reply (I8): a commit's reply rests on the commit's own flush
and is not held for a second one; every other reply, a retried commit's included, flushes."""

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.leadership import FixedCore
from coordinator.servicer import CoordinatorServicer
from coordinator.store import MemoryStore
from percolake.v1 import coordinator_pb2 as pb
from tests.servicer_context import InProcessContext


class FlushCountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_a_commit_reply_rests_on_its_own_flush_and_every_other_reply_flushes(tmp_path):
    store = FlushCountingStore()
    core = TransactionCoordinator(store, CoordinatorConfig([str(tmp_path)]))
    servicer, context = CoordinatorServicer(FixedCore(core)), InProcessContext()
    opened = servicer.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="p", batch_id=0),
                                      context).transaction
    assert store.flushes == 1  # the servicer's, before the Open's reply

    store.flushes = 0
    commit = pb.CommitTransactionRequest(txn_id=opened.txn_id)
    assert servicer.CommitTransaction(commit, context).transaction.commit_ts > 0
    assert store.flushes == 1  # the commit's own, after its durable write: none after it

    store.flushes = 0
    servicer.CommitTransaction(commit, context)  # a retry, answered from the record
    assert store.flushes == 1  # which may rest on a write in flight: the servicer flushes

    # a commit called outside the servicer leaves nothing behind for the thread's next reply
    later, _ = core.open_transaction("p", 1)
    core.commit(later.txn_id, None)
    store.flushes = 0
    servicer.GetTransaction(pb.GetTransactionRequest(txn_id=later.txn_id), context)
    assert store.flushes == 1
