"""The leadership loop on a MemoryStore: acquisition, renewal, every way of stepping down, and
the fresh core a new term loads. No processes: the tests turn the loop by hand (``step``) and
drive the leader's own clock, while the store's lease runs on real time (short leases)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.leadership import VALID_FRACTION, Leadership, NotServing, OutcomeUnknown
from coordinator.servicer import CoordinatorServicer
from coordinator.store import MemoryStore
from percolake.errors import NotLeader
from percolake.leader import LEADER_METADATA_KEY, standby_message
from percolake.states import TxnState
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from tests.daemon_support import wait_for

LEASE_S = 0.3
# A node that leads by hand (``lead``, no lease loop) on a clock of its own that never moves
# stays valid however long the machine takes to load its core; its lease in the store (real
# time) lasts HELD_S, so that the others read it as held meanwhile.
HELD_S = 5.0


class Clock:
    """A monotonic clock the test moves by hand (the leader's local validity deadline)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FencedView:
    """One process's store object over the shared MemoryStore, fenced as PostgresStore is: its
    writes carry the epoch it acquired and are refused (NotLeader) unless that is still the
    newest. (A MemoryStore itself fences nothing: every user of it is one process.)"""

    WRITES = frozenset({"write_timestamp_high_water", "insert_pipeline", "update_pipeline",
                        "insert_txn", "update_txn", "add_table_commit",
                        "set_table_commit_version", "prune"})

    def __init__(self, shared: MemoryStore) -> None:
        self.shared = shared
        self.fencing_epoch: int | None = None

    def try_acquire_lease(self, holder: str, address: str, lease_s: float) -> int | None:
        epoch = self.shared.try_acquire_lease(holder, address, lease_s)
        if epoch is not None:
            self.fencing_epoch = epoch
        return epoch

    def release_lease(self, epoch: int) -> None:
        if self.fencing_epoch == epoch:
            self.fencing_epoch = None
        self.shared.release_lease(epoch)

    def close(self) -> None:
        pass  # the shared store outlives every view

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.shared, name)
        if name not in self.WRITES:
            return attribute

        def fenced(*args: Any, **kwargs: Any) -> Any:
            newest = self.shared.read_lease().epoch
            if self.fencing_epoch != newest:
                raise NotLeader(f"the lease is at epoch {newest}, this store's is "
                                f"{self.fencing_epoch}")
            return attribute(*args, **kwargs)

        return fenced


class Node:
    """One coordinator's leadership over the shared store, with what it told health. Each
    term gets a store object of its own, as a daemon's PostgresStore per term."""

    def __init__(self, store: MemoryStore, warehouse: Path, name: str,
                 clock: Clock | None = None, lease_s: float = LEASE_S) -> None:
        self.serving_log: list[bool] = []
        self.built: list[TransactionCoordinator] = []
        self.address = f"127.0.0.1:{name}"

        def build(view: FencedView) -> TransactionCoordinator:
            core = TransactionCoordinator(view, CoordinatorConfig([str(warehouse)]))
            self.built.append(core)
            return core

        self.leadership = Leadership(lambda: FencedView(store), build, node_id=f"node-{name}",
                                     advertise=self.address, lease_s=lease_s,
                                     on_serving=self.serving_log.append,
                                     monotonic=clock or time.monotonic)

    def lead(self) -> TransactionCoordinator:
        """Acquires the lease (one step) and waits until the new core serves."""
        self.leadership.step()
        wait_for(lambda: self.leadership.is_leader, 5, "the new core to serve")
        return self.leadership.core

    def refusal(self) -> NotServing:
        with pytest.raises(NotServing) as refused, self.leadership.serving():
            pass
        return refused.value


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    shared = MemoryStore()
    yield shared
    shared.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def expire_lease() -> None:
    """Real time past the store's lease (the leader under test did not renew)."""
    time.sleep(LEASE_S * 1.3)


def test_the_first_node_acquires_and_the_other_stands_by(store, tmp_path, clock):
    a, b = Node(store, tmp_path, "1", clock, lease_s=HELD_S), Node(store, tmp_path, "2")
    core = a.lead()
    lease = store.read_lease()
    assert (lease.holder, lease.address, lease.epoch) == ("node-1", a.address, a.leadership.epoch)
    assert lease.remaining_s > 0
    assert a.serving_log == [True]
    with a.leadership.serving() as term:
        assert term.core is core and term.epoch == lease.epoch
        term.confirm()

    assert b.leadership.step() == pytest.approx(LEASE_S / 8)
    assert not b.leadership.is_leader and b.built == []
    refused = b.refusal()
    assert refused.leader_address == a.address
    assert str(refused) == standby_message(b.address, a.address, lease.epoch)


def test_renewals_keep_the_lease_and_a_release_hands_it_over(store, tmp_path):
    lease_s = 1.0  # real time here: room for a busy machine's scheduling delays
    a, b = Node(store, tmp_path, "1", lease_s=lease_s), Node(store, tmp_path, "2", Clock())
    a.leadership.start()
    try:
        wait_for(lambda: a.leadership.is_leader, 5, "a to lead")
        epoch = a.leadership.epoch
        for _ in range(4):
            time.sleep(lease_s / 2)
            assert b.leadership.step() == pytest.approx(LEASE_S / 8)  # not acquired
            assert a.leadership.is_leader and a.leadership.epoch == epoch
            assert store.read_lease().remaining_s > 0
    finally:
        a.leadership.stop()
        a.leadership.close()
    assert a.serving_log == [True, False] and not a.leadership.is_leader
    assert store.read_lease().remaining_s <= 0  # released: no waiting for it to run out
    b.lead()
    assert b.leadership.epoch == epoch + 1


def test_a_refused_renewal_steps_down(store, tmp_path, clock):
    a, b = Node(store, tmp_path, "1", clock), Node(store, tmp_path, "2", Clock(), HELD_S)
    old = a.lead()
    with a.leadership.serving() as term:
        pass
    expire_lease()  # a's own clock stands still: only the store knows the lease ran out
    b.lead()
    assert a.leadership.is_leader  # it does not know yet
    a.leadership.step()  # its renewal is refused
    assert not a.leadership.is_leader and a.serving_log == [True, False]
    assert term.retired.wait(5) and old._stop.is_set()  # the old core's resolver stopped
    with pytest.raises(OutcomeUnknown):
        term.confirm()
    assert a.leadership.step() == pytest.approx(LEASE_S / 8)  # a standby now
    assert not a.leadership.is_leader
    assert a.refusal().leader_address == b.address


def test_a_stepped_down_leader_names_the_new_one_before_its_loop_turns_again(store, tmp_path,
                                                                            clock):
    a, b = Node(store, tmp_path, "1", clock), Node(store, tmp_path, "2", Clock(), HELD_S)
    a.lead()
    with a.leadership.serving() as term:
        pass
    expire_lease()
    b.lead()
    a.leadership.step()  # its renewal is refused: it steps down
    assert term.retired.wait(5)  # its old term's store is closed; its loop has not turned since
    refused = a.refusal()
    assert refused.leader_address == b.address
    assert str(refused) == standby_message(a.address, b.address, b.leadership.epoch)


def test_an_expired_local_deadline_stops_serving_before_anything_else(store, tmp_path, clock):
    a = Node(store, tmp_path, "1", clock)
    first = a.lead()
    epoch = a.leadership.epoch
    with a.leadership.serving() as term:
        clock.advance(VALID_FRACTION * LEASE_S)  # e.g. a SIGSTOP in the middle of a call
        with pytest.raises(OutcomeUnknown, match="outcome is unknown"):
            term.confirm()
    refused = a.refusal()  # the next call finds it first, with no renewal attempted
    assert refused.leader_address is None  # the lease names this very node
    assert a.serving_log == [True, False]
    assert term.retired.wait(5) and first._stop.is_set()
    second = a.lead()  # its own lease: acquired again at once, with a new epoch
    assert second is not first and a.leadership.epoch == epoch + 1


def test_a_renewal_overdue_by_the_local_clock_steps_down_in_the_loop(store, tmp_path, clock):
    a = Node(store, tmp_path, "1", clock)
    a.lead()
    clock.advance(LEASE_S)
    a.leadership.step()
    assert not a.leadership.is_leader and a.serving_log == [True, False]


def test_a_renewal_hanging_on_the_store_stops_serving_when_validity_ends(store, tmp_path):
    a = Node(store, tmp_path, "1")
    hang = threading.Event()
    released = threading.Event()
    renew = store.renew_lease

    def hanging_renew(epoch: int, lease_s: float) -> bool:
        if hang.is_set():
            released.wait(10)  # an unreachable store: the call neither fails nor returns
        return renew(epoch, lease_s)

    store.renew_lease = hanging_renew
    try:
        a.leadership.start()
        wait_for(lambda: a.leadership.is_leader, 5, "the leader to serve")
        hang.set()
        started = time.monotonic()
        wait_for(lambda: a.serving_log[-1:] == [False], 5, "health to turn NOT_SERVING")
        # within the validity window (0.8 lease after the last renewal sent), not after the
        # hanging call returned
        assert time.monotonic() - started < LEASE_S * 2
        assert not released.is_set() and not a.leadership.is_leader
    finally:
        released.set()
        a.leadership.stop()
        a.leadership.close()


def test_a_write_refused_by_the_store_steps_down_and_answers_unavailable(store, tmp_path, clock):
    a, b = Node(store, tmp_path, "1", clock), Node(store, tmp_path, "2", Clock(), HELD_S)
    a.lead()
    expire_lease()
    b.lead()  # a has not noticed: its renewal is not due by its own clock
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_CoordinatorServicer_to_server(CoordinatorServicer(a.leadership), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id="p"), timeout=10)
            error = refused.value
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
            assert "NotLeader" in error.details() and "outcome" in error.details()
            assert dict(error.trailing_metadata())[LEADER_METADATA_KEY] == b.address
            assert not a.leadership.is_leader and a.serving_log == [True, False]

            with pytest.raises(grpc.RpcError) as standby:
                stub.GetPipeline(pb.GetPipelineRequest(pipeline_id="p"), timeout=10)
            assert standby.value.code() == grpc.StatusCode.UNAVAILABLE
            assert standby.value.details() == standby_message(a.address, b.address,
                                                              b.leadership.epoch)
    finally:
        server.stop(None)
    with pytest.raises(NotLeader):  # and the old core can write nothing any more
        a.built[0].register_pipeline("q", None)


def test_a_new_term_loads_what_the_old_one_wrote(store, tmp_path, clock):
    a = Node(store, tmp_path, "1", clock)
    old = a.lead()
    epoch = old.register_pipeline("orders", None).epoch
    live, _ = old.open_transaction("orders", 0, epoch)
    done, _ = old.open_transaction("orders", 1, epoch)
    committed = old.commit(done.txn_id, epoch)
    last_ts = old.oracle.last

    clock.advance(LEASE_S)  # steps down ...
    a.leadership.step()
    new = a.lead()  # ... and takes over again with a fresh core
    assert new is not old
    assert new.get_pipeline("orders").pipeline_id == "orders"
    assert new.get_transaction(live.txn_id).state == TxnState.OPEN
    assert new.get_transaction(done.txn_id).commit_ts == committed.commit_ts
    assert new.oracle.next() > last_ts
    new.abort(live.txn_id, epoch, "done")  # the new term writes
    assert store.get_txn(live.txn_id).state == TxnState.ABORTED
