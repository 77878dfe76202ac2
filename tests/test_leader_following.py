"""Clients given several coordinator addresses follow the leader (issue 16, item 4).

Real gRPC servers in this process on free 127.0.0.1 ports play the coordinators: a leader
answers, a standby answers UNAVAILABLE with the standby message and the leader's address in
its trailing metadata, a dead address has nothing listening.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from percolake.leader import (
    LEADER_METADATA_KEY,
    RETRY_METADATA,
    LeaderFollower,
    LeaderNotReached,
    parse_targets,
    standby_message,
)
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from sparkside.client import CoordinatorClient
from sparkside.errors import BatchRefused, CoordinatorUnavailable, InvalidRequest
from tests.crash.rpc import Client as HarnessClient

ROOT = Path(__file__).resolve().parent.parent
GENERATION = 3


class FakeCoordinator(pb_grpc.CoordinatorServicer):
    """A coordinator that is the leader (``points_to is None and leading``) or a standby."""

    def __init__(self, port: int = 0, start: bool = True) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_CoordinatorServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port(f'127.0.0.1:{port}')}"
        self.leading = True
        self.points_to: str | None = None
        self.refuse: grpc.StatusCode | None = None
        self.refuse_details: str | None = None  # None: "refused by ADDRESS"
        self.shed = 0  # the next calls answered RESOURCE_EXHAUSTED with the retry marker
        self.calls: Counter[str] = Counter()
        self.resets: list[pb.ResetPipelineRequest] = []
        if start:
            self.server.start()

    def lead(self) -> None:
        self.leading, self.points_to = True, None

    def stand_by(self, leader: FakeCoordinator | str | None) -> None:
        self.leading = False
        self.points_to = leader.address if isinstance(leader, FakeCoordinator) else leader

    def _gate(self, method: str, context: grpc.ServicerContext) -> None:
        self.calls[method] += 1
        if not self.leading:
            if self.points_to:
                context.set_trailing_metadata(((LEADER_METADATA_KEY, self.points_to),))
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          standby_message(self.address, self.points_to, 7))
        if self.refuse is not None:
            context.abort(self.refuse, self.refuse_details or f"refused by {self.address}")
        if self.shed > 0:
            self.shed -= 1
            context.set_trailing_metadata(RETRY_METADATA)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many requests; retry later")

    def GetPipeline(self, request: pb.GetPipelineRequest,
                    context: grpc.ServicerContext) -> pb.Pipeline:
        self._gate("GetPipeline", context)
        return pb.Pipeline(pipeline_id=request.pipeline_id, generation=GENERATION, epoch=5,
                           query_id=self.address)  # query_id: who answered

    def ResetPipeline(self, request: pb.ResetPipelineRequest,
                      context: grpc.ServicerContext) -> pb.ResetPipelineResponse:
        self._gate("ResetPipeline", context)
        self.resets.append(request)
        return pb.ResetPipelineResponse(changed=True, pipeline=pb.Pipeline(
            pipeline_id=request.pipeline_id, generation=request.expected_generation + 1,
            epoch=6))

    def total(self) -> int:
        return sum(self.calls.values())


@pytest.fixture
def make() -> Iterator[Callable[[], FakeCoordinator]]:
    """``make()`` starts one more fake coordinator; all stop after the test."""
    started: list[FakeCoordinator] = []

    def start() -> FakeCoordinator:
        started.append(FakeCoordinator())
        return started[-1]

    yield start
    for fake in started:
        fake.server.stop(grace=None)


def dead_address() -> str:
    """A 127.0.0.1 port with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def get_pipeline(client: CoordinatorClient) -> pb.Pipeline:
    return client.call("GetPipeline", pb.GetPipelineRequest(pipeline_id="p"))


def test_standby_then_leader_ends_at_the_leader_and_stays(make):
    leader, standby, bystander = make(), make(), make()
    standby.stand_by(leader)
    bystander.stand_by(leader)
    client = CoordinatorClient(f"{standby.address},{bystander.address},{leader.address}",
                               retry_s=10)
    try:
        assert get_pipeline(client).query_id == leader.address
        # The standby's hint leads straight to the leader, past the next address.
        assert (standby.total(), bystander.total(), leader.total()) == (1, 0, 1)
        assert client.leader == leader.address
        assert get_pipeline(client).query_id == leader.address
        assert (standby.total(), bystander.total(), leader.total()) == (1, 0, 2)
    finally:
        client.close()


def test_a_leader_named_by_a_standby_is_learnt(make):
    leader, standby = make(), make()
    standby.stand_by(leader)
    follower = LeaderFollower(standby.address)
    try:
        reply = follower.call("GetPipeline", pb.GetPipelineRequest(pipeline_id="p"),
                              timeout_s=5, retry_s=5)
        assert reply.query_id == leader.address
        assert follower.addresses == [standby.address, leader.address]
        assert follower.current == leader.address
    finally:
        follower.close()


def test_a_call_shed_by_the_leader_is_sent_again_to_it_after_a_pause(make):
    leader, other = make(), make()
    leader.shed = 2
    client = CoordinatorClient(f"{leader.address},{other.address}", retry_s=10)
    try:
        assert get_pipeline(client).query_id == leader.address
        assert (leader.calls["GetPipeline"], other.total()) == (3, 0)  # same address, no rotation
    finally:
        client.close()


def test_a_leader_still_shedding_when_the_retry_time_ends_is_unavailable(make):
    leader = make()
    leader.shed = 10**6
    client = CoordinatorClient(leader.address, retry_s=1)
    try:
        with pytest.raises(CoordinatorUnavailable, match="too many requests"):
            get_pipeline(client)
        assert leader.calls["GetPipeline"] >= 2
    finally:
        client.close()


def test_a_resource_exhausted_without_the_retry_marker_is_final(make):
    leader = make()
    leader.refuse = grpc.StatusCode.RESOURCE_EXHAUSTED
    client = CoordinatorClient(leader.address, retry_s=10)
    try:
        with pytest.raises(InvalidRequest, match="RESOURCE_EXHAUSTED"):
            get_pipeline(client)
        assert leader.calls["GetPipeline"] == 1
    finally:
        client.close()


def test_a_dead_address_is_passed_quickly(make):
    leader = make()
    client = CoordinatorClient(f"{dead_address()},{leader.address}", retry_s=10)
    try:
        started = time.monotonic()
        assert get_pipeline(client).query_id == leader.address
        assert time.monotonic() - started < 2.0
        started = time.monotonic()
        get_pipeline(client)
        assert time.monotonic() - started < 0.5
        assert leader.total() == 2
    finally:
        client.close()


def test_leadership_moving_mid_run_is_followed(make):
    first, second = make(), make()
    second.stand_by(first)
    client = CoordinatorClient(f"{first.address},{second.address}", retry_s=10)
    try:
        assert get_pipeline(client).query_id == first.address
        assert (first.total(), second.total()) == (1, 0)
        # A takeover: the old leader now answers as a standby naming the new one.
        second.lead()
        first.stand_by(second)
        assert get_pipeline(client).query_id == second.address
        assert (first.total(), second.total()) == (2, 1)
        assert get_pipeline(client).query_id == second.address
        assert (first.total(), second.total()) == (2, 2)
        # And back, while no leader is known for a moment: the client waits it out.
        second.stand_by(None)
        threading.Timer(0.4, first.lead).start()
        assert get_pipeline(client).query_id == first.address
        assert client.leader == first.address
    finally:
        client.close()


def test_no_leader_within_the_retry_time_is_unavailable_naming_every_address(make):
    standby, stale = make(), make()
    dead = dead_address()
    standby.stand_by(None)       # a takeover under way: no leader known
    stale.stand_by(dead)         # names a leader that is gone
    target = f"{standby.address},{stale.address},{dead}"
    client = CoordinatorClient(target, retry_s=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(CoordinatorUnavailable) as caught:
            get_pipeline(client)
        assert time.monotonic() - started < 3.0
    finally:
        client.close()
    message = str(caught.value)
    for address in (standby.address, stale.address, dead):
        assert address in message.split("tried", 1)[1], message
    assert "not the leader" in message
    assert standby.total() >= 1 and stale.total() >= 1


def test_other_statuses_are_raised_at_once(make):
    leader, standby = make(), make()
    standby.stand_by(leader)
    leader.refuse = grpc.StatusCode.FAILED_PRECONDITION
    client = CoordinatorClient(f"{standby.address},{leader.address}", retry_s=10)
    try:
        with pytest.raises(BatchRefused, match=f"refused by {leader.address}"):
            get_pipeline(client)
        assert leader.total() == 1  # not retried
    finally:
        client.close()


def test_a_call_dropped_by_a_coordinator_shutting_down_goes_to_the_next_one(make):
    # A graceful stop ends calls that arrive before the listener closes, and that no handler
    # took, CANCELLED "CANCELLED" (gRPC core; seen in a SIGTERM takeover): nothing ran there.
    stopping, leader = make(), make()
    stopping.refuse, stopping.refuse_details = grpc.StatusCode.CANCELLED, "CANCELLED"
    client = CoordinatorClient(f"{stopping.address},{leader.address}", retry_s=10)
    try:
        assert get_pipeline(client).query_id == leader.address
        assert (stopping.total(), leader.total()) == (1, 1)
        # Any other CANCELLED is the caller's, not the server's going away: raised at once.
        leader.refuse, leader.refuse_details = grpc.StatusCode.CANCELLED, "cancelled by caller"
        with pytest.raises(InvalidRequest, match="cancelled by caller"):
            get_pipeline(client)
        assert leader.total() == 2
    finally:
        client.close()


def test_a_real_graceful_stop_never_reaches_the_caller_as_cancelled(make):
    """Calls racing a real server's graceful stop (three rounds: the race is lost in about
    half of them without the retry) all end at the other coordinator."""
    leader = make()
    errors: list[BaseException] = []
    for _ in range(3):
        stopping = make()
        client = CoordinatorClient(f"{stopping.address},{leader.address}", retry_s=10)
        running = threading.Event()
        running.set()

        def call_in_a_loop(client: CoordinatorClient = client,
                           running: threading.Event = running) -> None:
            while running.is_set():
                try:
                    get_pipeline(client)
                except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                    errors.append(exc)

        callers = [threading.Thread(target=call_in_a_loop) for _ in range(4)]
        try:
            for caller in callers:
                caller.start()
            time.sleep(0.15)
            stopping.server.stop(1).wait()
            time.sleep(0.1)
        finally:
            running.clear()
            for caller in callers:
                caller.join()
            client.close()
    assert not errors, errors[:3]
    assert leader.total() > 0


def test_follower_gives_up_with_an_rpc_error_naming_the_addresses():
    dead = [dead_address(), dead_address()]
    follower = LeaderFollower(",".join(dead))
    try:
        with pytest.raises(LeaderNotReached) as caught:
            follower.call("GetPipeline", pb.GetPipelineRequest(pipeline_id="p"),
                          timeout_s=1, retry_s=0.5)
    finally:
        follower.close()
    assert isinstance(caught.value, grpc.RpcError)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert all(address in caught.value.details() for address in dead)


def test_one_address_waits_for_a_coordinator_that_starts_late():
    fake = FakeCoordinator(port=int(dead_address().rpartition(":")[2]), start=False)
    client = CoordinatorClient(fake.address, retry_s=10)
    timer = threading.Timer(0.3, fake.server.start)
    timer.start()
    try:
        assert get_pipeline(client).query_id == fake.address
    finally:
        timer.join()
        client.close()
        fake.server.stop(grace=None)


def test_concurrent_calls_share_one_client(make):
    leader, standby = make(), make()
    standby.stand_by(leader)
    client = CoordinatorClient(f"{standby.address},{leader.address}", retry_s=10)
    try:
        with futures.ThreadPoolExecutor(max_workers=4) as pool:
            replies = list(pool.map(lambda _: get_pipeline(client).query_id, range(20)))
        assert replies == [leader.address] * 20
        assert leader.total() == 20
    finally:
        client.close()


def test_harness_client_follows_the_leader(make):
    leader, standby = make(), make()
    standby.stand_by(leader)
    with HarnessClient(f"{dead_address()},{standby.address},{leader.address}",
                       retry_s=10) as client:
        assert client.pipeline("p").query_id == leader.address
        assert client.follower.current == leader.address


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.run([sys.executable, "-m", "coordinator", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env=env)


def test_cli_reset_pipeline_follows_the_leader(make):
    leader, standby = make(), make()
    standby.stand_by(leader)
    result = cli("reset-pipeline", "--target", f"{standby.address},{leader.address}",
                 "--pipeline", "orders", "--reason", "checkpoint replaced")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["generation"] == GENERATION + 1
    # The generation was read first and the reset sent as a compare-and-set on it.
    assert [(r.pipeline_id, r.expected_generation) for r in leader.resets] == [
        ("orders", GENERATION)]
    assert standby.calls["GetPipeline"] == 1 and standby.calls["ResetPipeline"] == 0
    assert leader.calls == Counter(GetPipeline=1, ResetPipeline=1)


def test_cli_reset_pipeline_refuses_a_bad_target():
    bad = cli("reset-pipeline", "--target", "127.0.0.1:1,127.0.0.1", "--pipeline", "p",
              "--reason", "r")
    assert bad.returncode == 2 and "'127.0.0.1' is not HOST:PORT" in bad.stderr


@pytest.mark.parametrize("text", ["", " , ", "h1", "h1:", ":50051", "h1:abc", "h1:1,h2"])
def test_parse_targets_refuses_what_is_not_host_port(text):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_targets(text)
    with pytest.raises(ValueError, match="HOST:PORT"):
        CoordinatorClient(text)


def test_parse_targets_keeps_order_and_drops_duplicates():
    assert parse_targets(" h2:1, h1:2,h2:1 ,") == ["h2:1", "h1:2"]
