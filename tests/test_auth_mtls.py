"""Under mutual TLS a client certificate names principal ``cert:<CN>``, read from its parsed
subject as a whole; a bearer token, when sent, names the principal instead (a bad one is
refused, never replaced by the certificate). Certificate principals never meet token
principals: a CN ``admin`` is not the bootstrap admin."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.auth import tokens
from coordinator.auth.credentials import Credentials
from coordinator.auth.identity import Unauthenticated, authenticate, certificate_principal
from coordinator.auth_records import TokenRecord
from coordinator.launcher import DaemonProcess
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from tests.daemon_support import expect_status, rpc_error, unique
from tests.tls_support import Authority, Pem

DENIED = grpc.StatusCode.PERMISSION_DENIED
CN, ORG = NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME


def subject(*attributes: tuple[x509.ObjectIdentifier, str]) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes])


# name of the certificate's files -> (its subject, what the refusal names)
UNUSABLE_SUBJECTS = {
    "nul": (subject((CN, "admin\x00x")), "U+0000"),
    "two-cns": (subject((CN, "admin"), (CN, "bob")), "2 common names"),
    "two-cns-one-rdn": (x509.Name([x509.RelativeDistinguishedName([
        x509.NameAttribute(CN, "admin"), x509.NameAttribute(CN, "bob")])]), "2 common names"),
    "newline": (subject((CN, "ad\nmin")), "U+000A"),
    "delete": (subject((CN, "admin\x7f")), "U+007F"),
    "right-to-left": (subject((CN, "nimda\u202e")), "U+202E"),
    "blank-around": (subject((CN, " admin")), "surrounding blanks"),
    "wildcard": (subject((CN, "*")), "'*' names no principal"),
    "no-cn": (subject((ORG, "percolake")), "no common name"),
}


class Mtls:
    def __init__(self, daemon: DaemonProcess, ca: Path, folder: Path, authority: Authority,
                 admin_token: str, audit_log: Path) -> None:
        self.daemon = daemon
        self.ca = ca.read_bytes()
        self.folder = folder
        self.authority = authority
        self.admin_token = admin_token
        self.audit_log = audit_log
        self._channels: list[grpc.Channel] = []

    def channel(self, common_name: str, name: x509.Name | None = None) -> grpc.Channel:
        """A channel presenting a client certificate whose subject CN is ``common_name`` (or
        whose subject is ``name``; ``common_name`` then names its files)."""
        pem: Pem = self.authority.client(self.folder, common_name, name)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=pem.key.read_bytes(),
            certificate_chain=pem.cert.read_bytes())
        channel = grpc.secure_channel(self.daemon.target, credentials)
        self._channels.append(channel)
        return channel

    def stub(self, common_name: str, name: x509.Name | None = None) -> pb_grpc.CoordinatorStub:
        return pb_grpc.CoordinatorStub(self.channel(common_name, name))

    def as_admin(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.admin_token}")]

    def grant(self, principal: str, pattern: str, permission: int) -> None:
        self.stub("ops").AddAcl(pb.AclRequest(entry=pb.AclEntry(
            principal=principal, resource_type=pb.PIPELINE, pattern=pattern,
            permission=permission)), metadata=self.as_admin(), timeout=30)

    def audit_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.audit_log.read_text().splitlines()]

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
        "--admin-token-file", str(base / "admin.token"), "--audit-log", str(base / "audit.log"),
        "--shutdown-grace", "5"])
    daemon.start(serving=False)
    env = Mtls(daemon, authority.cert, base / "clients", authority,
               (base / "admin.token").read_text().strip(), base / "audit.log")
    try:
        # health needs a credential too: the certificate is one
        health_pb2_grpc.HealthStub(env.channel("probe")).Check(
            health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True)
        yield env
    finally:
        env.close()
        daemon.stop()


def test_the_certificates_common_name_is_principal_cert_cn(mtls):
    pipeline = unique("m-cert")
    mtls.grant("cert:alice", "m-*", pb.WRITE)
    alice = mtls.stub("alice")
    assert alice.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline),
                                  timeout=30).epoch == 1
    txn = alice.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=0,
                                                          epoch=1), timeout=30).transaction
    assert txn.principal == "cert:alice"
    expect_status(mtls.stub("mallory").RegisterPipeline,
                  pb.RegisterPipelineRequest(pipeline_id=pipeline), DENIED, "'cert:mallory'",
                  "WRITE")


def test_an_entry_for_a_token_principal_does_not_apply_to_a_certificate_of_that_name(mtls):
    pipeline = unique("t-only")
    mtls.grant("tess", "t-*", pb.WRITE)
    expect_status(mtls.stub("tess").RegisterPipeline,
                  pb.RegisterPipelineRequest(pipeline_id=pipeline), DENIED, "'cert:tess'")


def test_a_certificate_named_admin_is_not_the_bootstrap_admin(mtls):
    expect_status(mtls.stub("admin").ListTokens, pb.ListTokensRequest(), DENIED,
                  "'cert:admin'", "ADMIN")
    # named as an administrator on purpose, a certificate may do what the admin does
    mtls.grant("cert:ops-admin", "*", pb.ADMIN)
    assert mtls.stub("ops-admin").ListTokens(pb.ListTokensRequest(), timeout=30) is not None


def test_a_token_principal_cannot_take_a_certificates_name(mtls):
    ops = mtls.stub("ops")
    for principal, words in (("cert:alice", "names a client certificate"),
                             ("CERT:alice", "lower case")):
        error = rpc_error(lambda request, timeout: ops.CreateToken(
            request, timeout=timeout, metadata=mtls.as_admin()),
            pb.CreateTokenRequest(principal=principal))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert words in error.details()


@pytest.mark.parametrize("files", sorted(UNUSABLE_SUBJECTS))
def test_an_unusable_certificate_name_is_refused_with_one_audit_line(mtls, files):
    name, reason = UNUSABLE_SUBJECTS[files]
    before = len(mtls.audit_lines())
    details = expect_status(mtls.stub(files, name).ListTokens, pb.ListTokensRequest(),
                            grpc.StatusCode.UNAUTHENTICATED, reason)
    added = mtls.audit_lines()[before:]
    assert len(added) == 1, added
    (line,) = added
    assert (line["method"], line["principal"], line["action"]) == ("ListTokens", "", "refused")
    assert line["outcome"] == {"status": "UNAUTHENTICATED", "message": details}


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


@pytest.mark.parametrize("files", sorted(UNUSABLE_SUBJECTS))
def test_certificate_principal_refuses_what_the_daemon_refuses(tmp_path, files):
    """The same rule on the DER form the HTTP endpoints see."""
    authority = Authority.create(tmp_path / "ca")
    name, reason = UNUSABLE_SUBJECTS[files]
    pem = authority.client(tmp_path, files, name)
    der = x509.load_pem_x509_certificate(pem.cert.read_bytes()).public_bytes(Encoding.DER)
    with pytest.raises(Unauthenticated, match=re.escape(reason)):
        certificate_principal(der)
    assert certificate_principal(authority.client(tmp_path, "alice").cert.read_bytes()) \
        == "cert:alice"


def test_a_token_stored_for_a_certificate_principal_authenticates_nobody():
    """Tokens made before certificate principals were kept apart cannot act as one."""
    made = tokens.new_token()
    credentials = Credentials(lambda: ([TokenRecord(made.token_id, made.secret_hash,
                                                    "cert:ops", 1)], []))
    credentials.refresh()
    with pytest.raises(Unauthenticated, match="only a client certificate"):
        authenticate(credentials, [f"Bearer {made.bearer}"], None)
