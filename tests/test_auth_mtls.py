"""Under mutual TLS the client certificate's subject CN names the principal; a bearer token,
when sent, names it instead (a bad one is refused, never replaced by the certificate)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.launcher import DaemonProcess
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from tests.daemon_support import expect_status, unique
from tests.tls_support import Authority, Pem

DENIED = grpc.StatusCode.PERMISSION_DENIED


class Mtls:
    def __init__(self, daemon: DaemonProcess, ca: Path, folder: Path, authority: Authority,
                 admin_token: str) -> None:
        self.daemon = daemon
        self.ca = ca.read_bytes()
        self.folder = folder
        self.authority = authority
        self.admin_token = admin_token
        self._channels: list[grpc.Channel] = []

    def channel(self, common_name: str) -> grpc.Channel:
        """A channel presenting a client certificate whose subject CN is ``common_name``."""
        pem: Pem = self.authority.client(self.folder, common_name)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=pem.key.read_bytes(),
            certificate_chain=pem.cert.read_bytes())
        channel = grpc.secure_channel(self.daemon.target, credentials)
        self._channels.append(channel)
        return channel

    def stub(self, common_name: str) -> pb_grpc.CoordinatorStub:
        return pb_grpc.CoordinatorStub(self.channel(common_name))

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mtls]:
    base = tmp_path_factory.mktemp("mtls")
    authority = Authority.create(base / "ca")
    server = authority.server(base / "server")
    (base / "warehouse").mkdir()
    daemon = DaemonProcess(base / "data", [str(base / "warehouse")], extra_args=[
        "--tls-cert", str(server.cert), "--tls-key", str(server.key),
        "--client-ca", str(authority.cert), "--authenticate",
        "--admin-token-file", str(base / "admin.token"), "--shutdown-grace", "5"])
    daemon.start(serving=False)
    env = Mtls(daemon, authority.cert, base / "clients", authority,
               (base / "admin.token").read_text().strip())
    try:
        # health needs a credential too: the certificate's CN is one
        health_pb2_grpc.HealthStub(env.channel("probe")).Check(
            health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True)
        yield env
    finally:
        env.close()
        daemon.stop()


def test_the_certificates_common_name_is_the_principal(mtls):
    admin = [("authorization", f"Bearer {mtls.admin_token}")]
    pipeline = unique("m-cert")
    mtls.stub("ops").AddAcl(pb.AclRequest(entry=pb.AclEntry(
        principal="alice", resource_type=pb.PIPELINE, pattern="m-*", permission=pb.WRITE)),
        metadata=admin, timeout=30)
    alice = mtls.stub("alice")
    assert alice.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline),
                                  timeout=30).epoch == 1
    txn = alice.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=0,
                                                          epoch=1), timeout=30).transaction
    assert txn.principal == "alice"
    expect_status(mtls.stub("mallory").RegisterPipeline,
                  pb.RegisterPipelineRequest(pipeline_id=pipeline), DENIED, "'mallory'",
                  "WRITE")


def test_a_bad_token_is_refused_even_with_a_good_certificate(mtls):
    alice = mtls.stub("alice")
    error = None
    try:
        alice.GetPipeline(pb.GetPipelineRequest(pipeline_id="m-x"), timeout=30,
                          metadata=[("authorization", "Bearer wrong")])
    except grpc.RpcError as exc:
        error = exc
    assert error is not None and error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "unknown or revoked bearer token" in error.details()
