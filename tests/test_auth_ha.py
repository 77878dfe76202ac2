"""Authentication with two daemons on one PostgreSQL store: tokens and ACL entries made at the
leader reach the standby without a restart, so a standby answers a known caller "not the
leader" (not UNAUTHENTICATED) and serves it once it takes over."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc

from coordinator.launcher import DaemonProcess
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from tests.daemon_support import expect_status, rpc_error, unique, wait_for


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(root: Path, name: str, dsn: str, *, serving: bool) -> DaemonProcess:
    port = free_port()
    (root / "warehouse").mkdir(exist_ok=True)
    daemon = DaemonProcess(root / name, [str(root / "warehouse")], extra_args=[
        "--store", dsn, "--advertise", f"127.0.0.1:{port}", "--lease-s", "1.5",
        "--shutdown-grace", "2", "--authenticate", "--open-health",
        "--admin-token-file", str(root / "admin.token")])
    daemon.port = port
    return daemon.start(serving=serving)


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def test_a_standby_knows_new_tokens_and_serves_them_after_a_takeover(tmp_path, pg_dsn):
    leader = start(tmp_path, "a", pg_dsn, serving=True)
    standby = start(tmp_path, "b", pg_dsn, serving=False)
    admin = bearer((tmp_path / "admin.token").read_text().strip())
    channels = [grpc.insecure_channel(d.target) for d in (leader, standby)]
    try:
        at_leader, at_standby = (pb_grpc.CoordinatorStub(c) for c in channels)
        made = at_leader.CreateToken(pb.CreateTokenRequest(principal="alice"), metadata=admin,
                                     timeout=30)
        at_leader.AddAcl(pb.AclRequest(entry=pb.AclEntry(
            principal="alice", resource_type=pb.PIPELINE, pattern="h-*",
            permission=pb.WRITE)), metadata=admin, timeout=30)
        alice = bearer(made.bearer_token)
        pipeline = unique("h-takeover")
        request = pb.RegisterPipelineRequest(pipeline_id=pipeline)

        def standby_knows_alice() -> bool:
            error = rpc_error(lambda r, timeout: at_standby.RegisterPipeline(
                r, timeout=timeout, metadata=alice), request, 10)
            return error.code() == grpc.StatusCode.UNAVAILABLE and "leader" in error.details()

        wait_for(standby_knows_alice, 10, "the standby to load alice's token")
        expect_status(lambda r, timeout: at_standby.RegisterPipeline(
            r, timeout=timeout, metadata=bearer("plk_0123456789abcdef_" + "A" * 43)),
            request, grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked")

        leader.kill()
        standby.wait_serving(30)
        assert at_standby.RegisterPipeline(request, metadata=alice, timeout=30).epoch == 1
        at_standby.RevokeToken(pb.RevokeTokenRequest(token_id=made.token.token_id),
                               metadata=admin, timeout=30)
        expect_status(lambda r, timeout: at_standby.RegisterPipeline(
            r, timeout=timeout, metadata=alice), request, grpc.StatusCode.UNAUTHENTICATED)
    finally:
        for channel in channels:
            channel.close()
        for daemon in (leader, standby):
            daemon.stop(timeout_s=10)
