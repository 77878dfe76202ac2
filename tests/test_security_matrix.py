"""Every surface asks what gRPC asks, under every combination of the security flags.

For each daemon configuration (plaintext, TLS or mutual TLS; with or without --authenticate
and its tokens; the HTTP endpoints on or off; /metrics opened on purpose), one in-process
daemon is started and every kind of caller is tried on every surface: gRPC, the web view's
HTML, its /api and /metrics. What each answers is compared with :func:`expected`, the rules
of docs/security.md written out independently of the code.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from coordinator.core import CoordinatorConfig
from coordinator.server import RunningServer, ServerOptions, start_server
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from tests.tls_support import Authority

UNKNOWN_TOKEN = "plk_0123456789abcdef_" + "x" * 43
# certificates (signed by the trusted CA) whose subject names no usable principal
UNUSABLE = {"nul-admin": x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin\x00x")]),
            "two-cns": x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin"),
                                  x509.NameAttribute(NameOID.COMMON_NAME, "carol")])}
# What each principal holds: alice (a token) and cert:carol may DESCRIBE every pipeline;
# cert:ops is named ADMIN on every pipeline by an ACL entry; admin is the bootstrap token's.
GRANTS = {"admin": {"describe", "admin"}, "alice": {"describe"},
          "cert:carol": {"describe"}, "cert:ops": {"describe", "admin"}}
# surface -> the permission it needs (on every pipeline, '*')
SURFACES = {"grpc GetTopology": "describe", "grpc ListTokens": "admin",
            "html /topology": "describe", "api /api/topology": "describe",
            "api /api/pipelines": "admin", "metrics /metrics": "describe"}


@dataclass(frozen=True)
class Config:
    transport: str  # plain, tls, mtls
    authenticate: bool
    http: bool
    metrics_open: bool = False

    @property
    def id(self) -> str:
        return "-".join([self.transport, "auth" if self.authenticate else "open",
                         "http" if self.http else "nohttp"]
                        + (["metrics-open"] if self.metrics_open else []))


@dataclass(frozen=True)
class Caller:
    name: str
    token: str | None = None  # "admin", "alice" or "unknown": which token it sends
    cert: str | None = None  # the CN of the client certificate it presents


CALLERS = [Caller("none"), Caller("unknown token", token="unknown"),
           Caller("good token", token="alice"), Caller("admin token", token="admin"),
           Caller("client cert", cert="carol"), Caller("cert CN admin", cert="admin"),
           Caller("cert named ADMIN by ACL", cert="ops"),
           Caller("unknown token + cert", token="unknown", cert="carol"),
           Caller("good token + cert CN admin", token="alice", cert="admin"),
           Caller("cert CN admin NUL x", cert="nul-admin"),
           Caller("cert with two CNs", cert="two-cns")]
CONFIGS = [Config(t, a, h) for t in ("plain", "tls", "mtls") for a in (False, True)
           for h in (True, False)] + [Config("mtls", True, True, metrics_open=True)]


def principal_of(config: Config, caller: Caller) -> str | None:
    """Whom the daemon takes the caller for (None: nobody); a token, once sent, decides."""
    if caller.token is not None:
        return None if caller.token == "unknown" else caller.token
    if caller.cert is not None and config.transport == "mtls":
        return None if caller.cert in UNUSABLE else f"cert:{caller.cert}"
    return None


def expected(config: Config, caller: Caller, surface: str) -> str:
    open_metrics = surface.startswith("metrics") and config.metrics_open
    if config.transport == "mtls" and caller.cert is None and not open_metrics:
        return "no handshake"  # a client certificate is required, on every port
    if not config.authenticate or open_metrics:
        return "ok"
    principal = principal_of(config, caller)
    if principal is None:
        return "unauthenticated"
    return "ok" if SURFACES[surface] in GRANTS.get(principal, set()) else "denied"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Pki:
    authority: Authority
    server_cert: Path
    server_key: Path
    folder: Path

    def client(self, cn: str) -> tuple[Path, Path]:
        """The files of the client certificate of ``cn`` (or of an UNUSABLE subject)."""
        pem = self.authority.client(self.folder, cn, UNUSABLE.get(cn))
        return pem.cert, pem.key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    base = tmp_path_factory.mktemp("matrix-pki")
    authority = Authority.create(base / "ca")
    server = authority.server(base / "server")
    pki = Pki(authority, server.cert, server.key, base / "clients")
    for cn in {c.cert for c in CALLERS if c.cert}:
        pki.client(cn)
    return pki


class Daemon:
    """One in-process daemon of ``config``, with the tokens its callers send."""

    def __init__(self, config: Config, pki: Pki, folder: Path) -> None:
        self.config = config
        self.pki = pki
        (folder / "warehouse").mkdir(parents=True)
        tls = config.transport != "plain"
        self.options = ServerOptions(
            port=0, shutdown_grace_s=0.1,
            tls_cert=str(pki.server_cert) if tls else "",
            tls_key=str(pki.server_key) if tls else "",
            client_ca=str(pki.authority.cert) if config.transport == "mtls" else "",
            authenticate=config.authenticate,
            admin_token_file=str(folder / "admin.token") if config.authenticate else "",
            audit_log=str(folder / "audit.log"),
            http_port=_free_port() if config.http else 0,
            metrics_port=_free_port() if config.http else 0,
            metrics_open=config.metrics_open)
        self.running: RunningServer = start_server(
            folder / "data", CoordinatorConfig(warehouse_roots=[str(folder / "warehouse")]),
            self.options)
        self.audit_log = folder / "audit.log"
        self.tokens = {"unknown": UNKNOWN_TOKEN, "admin": "", "alice": ""}
        if config.authenticate:
            self.tokens["admin"] = (folder / "admin.token").read_text().strip()
            self._grant()

    def _grant(self) -> None:
        admin = Caller("setup", token="admin", cert="ops")
        stub = pb_grpc.CoordinatorStub(self.channel(admin))
        self.tokens["alice"] = stub.CreateToken(pb.CreateTokenRequest(principal="alice"),
                                                metadata=self.metadata(admin),
                                                timeout=10).bearer_token
        for principal, permission in (("alice", pb.DESCRIBE), ("cert:carol", pb.DESCRIBE),
                                      ("cert:ops", pb.ADMIN)):
            stub.AddAcl(pb.AclRequest(entry=pb.AclEntry(
                principal=principal, resource_type=pb.PIPELINE, pattern="*",
                permission=permission)), metadata=self.metadata(admin), timeout=10)

    def stop(self) -> None:
        self.running.stop()

    # ------------------------------------------------------------ how each caller connects

    def metadata(self, caller: Caller) -> list[tuple[str, str]]:
        if caller.token is None:
            return []
        return [("authorization", f"Bearer {self.tokens[caller.token] or UNKNOWN_TOKEN}")]

    def channel(self, caller: Caller) -> grpc.Channel:
        target = f"127.0.0.1:{self.running.port}"
        if self.config.transport == "plain":
            return grpc.insecure_channel(target)
        cert_key = self.pki.client(caller.cert) if caller.cert else None
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(
            root_certificates=self.pki.authority.cert.read_bytes(),
            private_key=cert_key[1].read_bytes() if cert_key else None,
            certificate_chain=cert_key[0].read_bytes() if cert_key else None))

    def https(self, caller: Caller) -> ssl.SSLContext | None:
        if self.config.transport == "plain":
            return None
        context = ssl.create_default_context(cafile=str(self.pki.authority.cert))
        if caller.cert:
            context.load_cert_chain(*map(str, self.pki.client(caller.cert)))
        return context

    # ------------------------------------------------------------ what each surface answers

    def answer(self, caller: Caller, surface: str) -> str:
        kind, what = surface.split(" ", 1)
        if kind == "grpc":
            return self._grpc(caller, what)
        port = self.options.metrics_port if kind == "metrics" else self.options.http_port
        return self._http(caller, port, what)

    def _grpc(self, caller: Caller, method: str) -> str:
        request = pb.GetTopologyRequest() if method == "GetTopology" else pb.ListTokensRequest()
        with self.channel(caller) as channel:
            call = getattr(pb_grpc.CoordinatorStub(channel), method)
            try:
                call(request, metadata=self.metadata(caller), timeout=10)
            except grpc.RpcError as exc:
                return {grpc.StatusCode.UNAUTHENTICATED: "unauthenticated",
                        grpc.StatusCode.PERMISSION_DENIED: "denied",
                        grpc.StatusCode.UNAVAILABLE: "no handshake"}.get(
                            exc.code(), f"{exc.code().name}: {exc.details()}")
        return "ok"

    def _http(self, caller: Caller, port: int, path: str) -> str:
        context = self.https(caller)
        connection = (http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                      if context is None else
                      http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                                  context=context))
        headers = {"Authorization": self.metadata(caller)[0][1]} if caller.token else {}
        try:
            connection.request("GET", path, headers=headers)
            status = connection.getresponse().status
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError,
                http.client.RemoteDisconnected):
            return "no handshake"
        finally:
            connection.close()
        return {200: "ok", 401: "unauthenticated", 403: "denied"}.get(status, str(status))

    def plain_http_refused(self, port: int) -> bool:
        """Whether a plain HTTP request to ``port`` gets no answer (the port speaks TLS)."""
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request("GET", "/metrics")
            connection.getresponse()
        except (http.client.HTTPException, ConnectionError):
            return True
        finally:
            connection.close()
        return False


@pytest.fixture
def daemon_of(pki: Pki, tmp_path: Path) -> Iterator:
    started: list[Daemon] = []

    def start(config: Config) -> Daemon:
        started.append(Daemon(config, pki, tmp_path))
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()


@pytest.mark.parametrize("config", CONFIGS, ids=[c.id for c in CONFIGS])
def test_every_surface_answers_every_caller_as_the_rules_say(daemon_of, config, caplog):
    caplog.set_level(logging.INFO, logger="percolake.server")
    daemon = daemon_of(config)
    surfaces = [s for s in SURFACES if config.http or s.startswith("grpc")]
    wrong = []
    refusals = 0  # answered UNAUTHENTICATED or PERMISSION_DENIED (401, 403)
    audited_before = len(daemon.audit_log.read_text().splitlines())
    for caller in CALLERS:
        for surface in surfaces:
            got, want = daemon.answer(caller, surface), expected(config, caller, surface)
            refusals += got in ("unauthenticated", "denied")
            if got != want:
                wrong.append(f"{caller.name:24} {surface:20} answered {got!r}, expected {want!r}")
    assert not wrong, "\n".join(wrong)
    # one audit line per refusal, on every surface
    audited = [json.loads(line) for line in daemon.audit_log.read_text().splitlines()]
    assert len(audited) - audited_before == refusals
    assert all(line["action"] == "refused" for line in audited[audited_before:])

    if not config.http:
        assert daemon.running.web is None and daemon.running.metrics is None
        return
    if config.transport != "plain":  # HTTPS with the daemon's certificate, never plain HTTP
        for port in (daemon.options.http_port, daemon.options.metrics_port):
            assert daemon.plain_http_refused(port)
    # the start-up log says whether /metrics is open, and over what
    (line,) = [r for r in caplog.records if r.getMessage().startswith("serving Prometheus")]
    assert line.open == (config.metrics_open or not (config.authenticate
                                                     or config.transport == "mtls"))
    assert line.scheme == ("http" if config.transport == "plain" else "https")
