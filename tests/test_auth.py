"""Authentication, permissions, identity, token and ACL management, and the audit log, against
a real daemon started with ``--authenticate`` (docs/security.md).

One daemon serves the module. Its principals: ``admin`` (the bootstrap token file), ``root``
(ADMIN on every pipeline), ``alice`` (WRITE on pipelines ``a-*`` and on tables under
``alice/``), ``dave`` (WRITE on ``a-*`` too, no tables), ``bob`` (WRITE on ``b-*`` and tables
under ``bob/``), ``carol`` (DESCRIBE on ``a-*``, READ on tables under ``alice/``).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.auth import tokens
from coordinator.auth.credentials import BootstrapTokenError, Credentials, bootstrap_token_hash
from coordinator.auth.identity import Unauthenticated, authenticate
from coordinator.auth_records import TokenRecord
from coordinator.launcher import DaemonProcess
from coordinator.store import MemoryStore
from percolake.credentials import ClientSecurity
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from tests.daemon_support import apply_all, expect_status, table_write, unique

ROOT = Path(__file__).resolve().parent.parent
DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
QUERY_ID = "c0ffee00-1234-4abc-8def-0123456789ab"
NEW_QUERY_ID = "c0ffee00-5678-4abc-8def-0123456789ab"


class Caller:
    """A stub whose every call carries ``authorization: Bearer <token>`` (none: no metadata)."""

    def __init__(self, stub: Any, token: str | None, metadata: list | None = None) -> None:
        self._stub = stub
        self._metadata = metadata if metadata is not None else (
            [("authorization", f"Bearer {token}")] if token else [])

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)

        def call(request: Any, timeout: float = 30, **kwargs: Any) -> Any:
            return method(request, timeout=timeout, metadata=self._metadata, **kwargs)

        return call


class Secured:
    """The module's daemon and a Caller per principal."""

    def __init__(self, daemon: DaemonProcess, warehouse: Path, audit_log: Path) -> None:
        self.daemon = daemon
        self.warehouse = warehouse
        self.audit_log = audit_log
        self.channel = grpc.insecure_channel(daemon.target)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.secrets: dict[str, str] = {}
        self.token_ids: dict[str, str] = {}

    def as_(self, principal: str) -> Caller:
        return Caller(self.stub, self.secrets[principal])

    def grant(self, principal: str, permission: int, pipeline: str = "", table: str = "") -> None:
        entry = pb.AclEntry(principal=principal, permission=permission,
                            resource_type=pb.PIPELINE if pipeline else pb.TABLE,
                            pattern=pipeline or table)
        self.as_("admin").AddAcl(pb.AclRequest(entry=entry))

    def token_for(self, principal: str) -> str:
        reply = self.as_("admin").CreateToken(pb.CreateTokenRequest(principal=principal))
        self.secrets[principal] = reply.bearer_token
        self.token_ids[principal] = reply.token.token_id
        return reply.bearer_token

    def table(self, owner: str, name: str | None = None) -> str:
        return str(self.warehouse / owner / (name or unique("t")))


def wait_serving_with(daemon: DaemonProcess, token: str, timeout_s: float = 30.0) -> None:
    with grpc.insecure_channel(daemon.target) as channel:
        health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=timeout_s, wait_for_ready=True,
            metadata=[("authorization", f"Bearer {token}")])


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("auth")
    warehouse = base / "warehouse"
    for owner in ("alice", "bob"):
        (warehouse / owner).mkdir(parents=True)
    daemon = DaemonProcess(base / "data", [str(warehouse)], extra_args=[
        "--authenticate", "--admin-token-file", str(base / "admin.token"),
        "--audit-log", str(base / "audit.log"), "--shutdown-grace", "5"])
    daemon.start(serving=False)  # health needs a credential: waited for with the admin's
    env = Secured(daemon, warehouse, base / "audit.log")
    env.secrets["admin"] = (base / "admin.token").read_text().strip()
    try:
        wait_serving_with(daemon, env.secrets["admin"])
        for principal in ("root", "alice", "dave", "bob", "carol"):
            env.token_for(principal)
        env.grant("root", pb.ADMIN, pipeline="*")
        env.grant("alice", pb.WRITE, pipeline="a-*")
        env.grant("alice", pb.WRITE, table=str(warehouse / "alice"))
        env.grant("dave", pb.WRITE, pipeline="a-*")
        env.grant("bob", pb.WRITE, pipeline="b-*")
        env.grant("bob", pb.WRITE, table=str(warehouse / "bob"))
        env.grant("carol", pb.DESCRIBE, pipeline="a-*")
        env.grant("carol", pb.READ, table=str(warehouse / "alice"))
        yield env
    finally:
        env.channel.close()
        daemon.stop()


def open_batch(env: Secured, principal: str, pipeline: str, tables: list[str] = (),
               batch: int = 0) -> tuple[pb.Transaction, int]:
    caller = env.as_(principal)
    epoch = caller.RegisterPipeline(pb.RegisterPipelineRequest(
        pipeline_id=pipeline, query_id=QUERY_ID)).epoch
    txn = caller.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=batch, epoch=epoch, query_id=QUERY_ID,
        tables=list(tables))).transaction
    return txn, epoch


# ---------------------------------------------------------------- authentication

@pytest.mark.parametrize(("metadata", "problem"), [
    ([], "no credential"),
    ([("authorization", "Basic YWxpY2U6c2VjcmV0")], "malformed authorization"),
    ([("authorization", "Bearer")], "malformed authorization"),
    ([("authorization", "Bearer plk_0123456789abcdef_" + "A" * 43)], "unknown or revoked"),
    ([("authorization", "Bearer not-a-token-at-all")], "unknown or revoked"),
    ([("authorization", "Bearer a"), ("authorization", "Bearer b")], "2 authorization"),
])
def test_a_missing_or_bad_credential_is_unauthenticated_saying_what_is_expected(
        secured, metadata, problem):
    caller = Caller(secured.stub, None, metadata)
    expect_status(caller.GetPipeline, pb.GetPipelineRequest(pipeline_id="a-x"), UNAUTHENTICATED,
                  problem, "authorization: Bearer <token>", "client certificate")


def test_health_and_reflection_need_a_credential_by_default(secured):
    health = health_pb2_grpc.HealthStub(secured.channel)
    expect_status(health.Check, health_pb2.HealthCheckRequest(), UNAUTHENTICATED,
                  "no credential")
    reply = Caller(health, secured.secrets["carol"]).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_open_health_serves_health_and_reflection_but_nothing_else(daemon_factory):
    daemon = daemon_factory.start(["--authenticate", "--open-health"])  # waits on health
    try:
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        with grpc.insecure_channel(daemon.target) as channel:
            replies = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
            services = [s.name for r in replies for s in r.list_services_response.service]
            assert "percolake.v1.Coordinator" in services
            expect_status(pb_grpc.CoordinatorStub(channel).GetPipeline,
                          pb.GetPipelineRequest(pipeline_id="p"), UNAUTHENTICATED)
    finally:
        daemon.stop()


class CountingStore(MemoryStore):
    """Counts every store method called from an RPC worker thread."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if (not name.startswith("_") and callable(value)
                and threading.current_thread().name.startswith("rpc")):
            super().__getattribute__("calls").append(name)
        return value


def tampered(token: str) -> str:
    """The token with its last character changed."""
    return token[:-1] + ("B" if token.endswith("A") else "A")


def test_refusing_a_credential_costs_no_store_access(tmp_path):
    from coordinator.auth.setup import build_security
    from coordinator.auth_records import AclRecord, Permission, Resource, TokenRecord
    from coordinator.core import CoordinatorConfig, TransactionCoordinator
    from coordinator.leadership import FixedCore
    from coordinator.server import RunningServer, ServerOptions

    store = CountingStore()
    made = tokens.new_token()
    revoked = tokens.new_token()
    store.insert_token(TokenRecord(made.token_id, made.secret_hash, "alice", 1))
    store.insert_token(TokenRecord(revoked.token_id, revoked.secret_hash, "alice", 1, 2))
    core = TransactionCoordinator(store, CoordinatorConfig(warehouse_roots=[str(tmp_path)]))
    security = build_security(authenticate=True, open_health=False, audit_log="",
                              admin_token_file="", store=store, open_store=lambda: store)
    running = RunningServer(ServerOptions(port=0), security=security)
    running.start(FixedCore(core))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            request = pb.ListTransactionsRequest(pipeline_id="p")
            for metadata in ([], [("authorization", "Bearer x")],
                             [("authorization", f"Bearer {revoked.bearer}")],
                             [("authorization", f"Bearer {tampered(made.bearer)}")]):
                expect_status(Caller(stub, None, metadata).ListTransactions, request,
                              UNAUTHENTICATED)
            assert store.calls == []
            # the counter does count: a permitted call reads the store
            store.insert_acl(AclRecord("alice", Resource.PIPELINE, "p", Permission.DESCRIBE))
            security.credentials.refresh()
            Caller(stub, made.bearer).ListTransactions(request)
            assert "list_txns" in store.calls
    finally:
        running.stop()


def test_the_bootstrap_token_file_is_made_private_and_refused_when_others_may_read_it(
        tmp_path):
    path = tmp_path / "admin.token"
    first = bootstrap_token_hash(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert bootstrap_token_hash(path) == first == tokens.secret_hash(path.read_text().strip())
    path.chmod(0o644)
    with pytest.raises(BootstrapTokenError, match="chmod 600"):
        bootstrap_token_hash(path)
    path.chmod(0o600)
    path.write_text("short\n")
    with pytest.raises(BootstrapTokenError, match="at least 32 characters"):
        bootstrap_token_hash(path)


def test_only_the_bootstrap_token_has_the_bootstrap_admins_rights(tmp_path):
    """A stored token for principal ``admin`` (made while authentication was off) is not the
    bootstrap admin: it authenticates nobody, so ADMIN on '*' stays with the token file."""
    bootstrap = bootstrap_token_hash(tmp_path / "admin.token")
    stored = tokens.new_token()
    credentials = Credentials(lambda: ([TokenRecord(stored.token_id, stored.secret_hash,
                                                    "admin", 1)], []), bootstrap)
    credentials.refresh()
    token_file = (tmp_path / "admin.token").read_text().strip()
    assert authenticate(credentials, [f"Bearer {token_file}"], None) == "admin"
    with pytest.raises(Unauthenticated, match="only the bootstrap token"):
        authenticate(credentials, [f"Bearer {stored.bearer}"], None)


def test_a_reload_that_read_the_store_before_a_revocation_never_brings_the_token_back():
    """The background reload reads the store, the token is revoked and the revoking call
    reloads, then the background reload finishes: the revoked token stays refused."""
    alice = tokens.new_token()
    live = [TokenRecord(alice.token_id, alice.secret_hash, "alice", 1)]
    read_before, release = threading.Event(), threading.Event()
    calls = []

    def load() -> tuple[list[TokenRecord], list]:
        calls.append(len(calls))
        if len(calls) == 2:  # the background reload: it read the store, then stalls
            snapshot = list(live)
            read_before.set()
            release.wait(10)
            return snapshot, []
        return list(live), []

    credentials = Credentials(load)
    credentials.refresh()
    background = threading.Thread(target=credentials.refresh)
    background.start()
    assert read_before.wait(10)
    live.clear()  # the revocation, durable
    credentials.refresh()  # the revoking call's reload
    release.set()
    background.join(10)
    with pytest.raises(Unauthenticated):
        authenticate(credentials, [f"Bearer {alice.bearer}"], None)


def test_no_token_can_be_created_for_the_bootstrap_principal(secured):
    expect_status(secured.as_("admin").CreateToken, pb.CreateTokenRequest(principal="admin"),
                  grpc.StatusCode.INVALID_ARGUMENT, "'admin' is reserved", "--admin-token-file")
    listed = secured.as_("admin").ListTokens(pb.ListTokensRequest()).tokens
    assert "admin" not in {t.principal for t in listed}


# ---------------------------------------------------------------- permissions

def test_write_on_pipeline_and_tables_runs_a_batch_end_to_end(secured):
    table = secured.table("alice")
    txn, epoch = open_batch(secured, "alice", unique("a-run"), [table])
    alice = secured.as_("alice")
    assert txn.principal == "alice"
    alice.Prewrite(pb.PrewriteRequest(txn_id=txn.txn_id, epoch=epoch,
                                      writes=[table_write(table, txn.txn_id)]))
    alice.Heartbeat(pb.HeartbeatRequest(txn_id=txn.txn_id, epoch=epoch))
    committed = alice.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn.txn_id,
                                                                    epoch=epoch))
    assert committed.transaction.state == pb.COMMITTED
    versions = apply_all(alice, txn.txn_id)
    applied = alice.ReportApplied(pb.ReportAppliedRequest(txn_id=txn.txn_id, epoch=epoch, tables=[
        pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()]))
    assert applied.transaction.state == pb.APPLIED
    seen = alice.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id))
    assert (seen.epoch, seen.query_id, seen.principal) == (epoch, QUERY_ID, "alice")


def test_pipeline_permissions_are_refused_naming_the_permission_and_pipeline(secured):
    pipeline = unique("a-perm")
    request = pb.RegisterPipelineRequest(pipeline_id=pipeline)
    expect_status(secured.as_("bob").RegisterPipeline, request, DENIED,
                  "'bob'", "WRITE", f"pipeline '{pipeline}'")
    expect_status(secured.as_("carol").RegisterPipeline, request, DENIED, "'carol'", "WRITE")
    expect_status(secured.as_("bob").OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=0), DENIED, "WRITE", pipeline)
    expect_status(secured.as_("alice").AddAcl, pb.AclRequest(), DENIED,
                  "ADMIN on every pipeline ('*')")
    expect_status(secured.as_("alice").ListTransactions, pb.ListTransactionsRequest(), DENIED,
                  "ADMIN on every pipeline")


def test_describe_reads_a_pipeline_without_its_epoch_or_query_id(secured):
    pipeline = unique("a-desc")
    txn, epoch = open_batch(secured, "alice", pipeline)
    carol = secured.as_("carol")
    shown = carol.GetPipeline(pb.GetPipelineRequest(pipeline_id=pipeline))
    assert (shown.pipeline_id, shown.epoch, shown.query_id) == (pipeline, 0, "")
    listed = carol.ListTransactions(pb.ListTransactionsRequest(pipeline_id=pipeline))
    assert [(t.txn_id, t.epoch, t.query_id) for t in listed.transactions] == [
        (txn.txn_id, 0, "")]
    assert carol.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id)).epoch == 0
    expect_status(carol.GetTransaction, pb.GetTransactionRequest(
        txn_id=txn.txn_id, include_writes=True), DENIED, "WRITE", "include_writes")
    full = secured.as_("alice").GetPipeline(pb.GetPipelineRequest(pipeline_id=pipeline))
    assert (full.epoch, full.query_id) == (epoch, QUERY_ID)


def test_another_pipelines_principal_can_neither_abort_reset_nor_read_it(secured):
    pipeline = unique("a-victim")
    txn, epoch = open_batch(secured, "alice", pipeline)
    bob = secured.as_("bob")
    for call, request, permission in [
        (bob.AbortTransaction, pb.AbortTransactionRequest(txn_id=txn.txn_id, epoch=epoch),
         "ADMIN"),
        (bob.ResetPipeline, pb.ResetPipelineRequest(pipeline_id=pipeline, reason="x"), "ADMIN"),
        (bob.GetTransaction, pb.GetTransactionRequest(txn_id=txn.txn_id), "DESCRIBE"),
        (bob.GetPipeline, pb.GetPipelineRequest(pipeline_id=pipeline), "DESCRIBE"),
        (bob.ListTransactions, pb.ListTransactionsRequest(pipeline_id=pipeline), "DESCRIBE"),
    ]:
        expect_status(call, request, DENIED, "'bob'", permission, pipeline)
    assert secured.as_("alice").GetTransaction(
        pb.GetTransactionRequest(txn_id=txn.txn_id)).state == pb.OPEN


def test_knowing_the_epoch_and_query_id_gives_nothing(secured):
    pipeline = unique("a-identity")
    txn, epoch = open_batch(secured, "alice", pipeline)
    for principal in ("bob", "dave"):  # dave may drive the pipeline, but did not open txn
        caller = secured.as_(principal)
        for call, request in [
            (caller.CommitTransaction, pb.CommitTransactionRequest(
                txn_id=txn.txn_id, epoch=epoch, release_unwritten=True)),
            (caller.AbortTransaction, pb.AbortTransactionRequest(txn_id=txn.txn_id,
                                                                 epoch=epoch)),
            (caller.Heartbeat, pb.HeartbeatRequest(txn_id=txn.txn_id, epoch=epoch)),
            (caller.DeclareTables, pb.DeclareTablesRequest(
                txn_id=txn.txn_id, epoch=epoch, tables=[secured.table("alice")])),
        ]:
            expect_status(call, request, DENIED, principal)
    expect_status(secured.as_("dave").CommitTransaction, pb.CommitTransactionRequest(
        txn_id=txn.txn_id, epoch=epoch), DENIED, "opened by principal 'alice'", "only its opener")
    expect_status(secured.as_("bob").RegisterPipeline, pb.RegisterPipelineRequest(
        pipeline_id=pipeline, query_id=QUERY_ID), DENIED, "WRITE")
    assert secured.as_("alice").Heartbeat(pb.HeartbeatRequest(
        txn_id=txn.txn_id, epoch=epoch)).state == pb.OPEN


def test_admin_aborts_another_principals_transaction_and_resets(secured):
    pipeline = unique("a-admin")
    txn, epoch = open_batch(secured, "alice", pipeline)
    root = secured.as_("root")
    aborted = root.AbortTransaction(pb.AbortTransactionRequest(txn_id=txn.txn_id, epoch=epoch,
                                                               reason="stuck"))
    assert aborted.transaction.state == pb.ABORTED
    reset = root.ResetPipeline(pb.ResetPipelineRequest(pipeline_id=pipeline, reason="ops"))
    assert reset.changed and reset.pipeline.generation == 1
    listed = root.ListTransactions(pb.ListTransactionsRequest(page_size=1000)).transactions
    assert txn.txn_id in {t.txn_id for t in listed}  # every pipeline's, with ADMIN on '*'
    lines = audit_lines(secured)
    assert any(line["action"] == "abort another principal's transaction"
               and line["principal"] == "root" and line["txn_id"] == txn.txn_id
               and line["pipeline"] == pipeline and line["outcome"]["status"] == "OK"
               for line in lines)
    assert any(line["action"] == "reset pipeline" and line["pipeline"] == pipeline
               for line in lines)


def test_own_abort_needs_write_only_and_a_driver_reset_needs_require_idle(secured):
    pipeline = unique("a-own")
    txn, epoch = open_batch(secured, "alice", pipeline)
    alice = secured.as_("alice")
    assert alice.AbortTransaction(pb.AbortTransactionRequest(
        txn_id=txn.txn_id, epoch=epoch)).transaction.state == pb.ABORTED
    expect_status(alice.ResetPipeline, pb.ResetPipelineRequest(
        pipeline_id=pipeline, reason="x"), DENIED, "ADMIN", "require_idle")
    reset = alice.ResetPipeline(pb.ResetPipelineRequest(pipeline_id=pipeline, reason="new "
                                                        "checkpoint", require_idle=True))
    assert reset.changed


def test_a_write_only_reset_is_a_new_checkpoints_and_never_rebinds_its_query_id(secured):
    """WRITE with require_idle resets for a new query id only: not for the query id of the
    generation it replaces (I9: its replays would land again), nor from a start barrier of
    its choosing (ADMIN: that skips or re-reads input)."""
    pipeline = unique("a-driver-reset")
    alice = secured.as_("alice")
    alice.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline, query_id=QUERY_ID))
    expect_status(alice.ResetPipeline, pb.ResetPipelineRequest(
        pipeline_id=pipeline, reason="x", require_idle=True, query_id=QUERY_ID),
        grpc.StatusCode.FAILED_PRECONDITION, "drives generation 0", "new checkpoint")
    expect_status(alice.ResetPipeline, pb.ResetPipelineRequest(
        pipeline_id=pipeline, reason="x", require_idle=True, start_barrier=0),
        DENIED, "ADMIN", "start_barrier")
    reset = alice.ResetPipeline(pb.ResetPipelineRequest(
        pipeline_id=pipeline, reason="new checkpoint", require_idle=True, query_id=NEW_QUERY_ID))
    assert reset.changed and reset.pipeline.query_id == NEW_QUERY_ID


def test_table_permissions_are_checked_on_canonical_names(secured):
    bob_table = secured.table("bob")
    link = secured.warehouse / "alice" / unique("link")
    os.symlink(bob_table, link)
    (secured.warehouse / "bob").joinpath(Path(bob_table).name).mkdir()
    txn, epoch = open_batch(secured, "alice", unique("a-tables"))
    alice = secured.as_("alice")
    canonical = f"file://{os.path.realpath(bob_table)}"
    for spelling in (bob_table, f"file://{bob_table}", str(link)):
        expect_status(alice.DeclareTables, pb.DeclareTablesRequest(
            txn_id=txn.txn_id, epoch=epoch, tables=[spelling]), DENIED,
            "'alice'", "WRITE", f"table {canonical}")
    expect_status(alice.Prewrite, pb.PrewriteRequest(
        txn_id=txn.txn_id, epoch=epoch, writes=[table_write(bob_table, txn.txn_id)]),
        DENIED, "WRITE", canonical)
    expect_status(alice.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=txn.pipeline_id, batch_id=1, epoch=epoch, query_id=QUERY_ID,
        tables=[secured.table("alice"), bob_table]), DENIED, canonical)
    assert any(line["table"] == canonical and line["principal"] == "alice"
               and line["outcome"]["status"] == "PERMISSION_DENIED"
               for line in audit_lines(secured))


def test_snapshots_need_read_on_every_table(secured):
    mine, theirs = secured.table("alice"), secured.table("bob")
    carol = secured.as_("carol")
    reply = carol.GetSnapshot(pb.GetSnapshotRequest(tables=[mine]))
    assert [t.exists for t in reply.tables] == [False]
    expect_status(carol.GetSnapshot, pb.GetSnapshotRequest(tables=[mine, theirs]), DENIED,
                  "READ", f"table file://{os.path.realpath(theirs)}")
    expect_status(carol.GetSnapshot, pb.GetSnapshotRequest(
        tables=[mine], as_of_batch=pb.BatchRef(pipeline_id="b-x", batch_id=0)), DENIED,
        "DESCRIBE", "'b-x'")


def test_register_reads_needs_write_on_the_pipeline_and_read_on_every_table(secured):
    mine, theirs = secured.table("alice"), secured.table("bob")
    alice = secured.as_("alice")
    reply = alice.RegisterReads(pb.RegisterReadsRequest(pipeline_id="a-reader", tables=[mine]))
    assert reply.added == 1
    expect_status(alice.RegisterReads, pb.RegisterReadsRequest(
        pipeline_id="a-reader", tables=[mine, theirs]), DENIED, "READ",
        f"table file://{os.path.realpath(theirs)}")
    expect_status(secured.as_("bob").RegisterReads, pb.RegisterReadsRequest(
        pipeline_id="a-reader", tables=[theirs]), DENIED, "WRITE", "'a-reader'")


def test_get_topology_needs_describe_on_every_pipeline(secured):
    expect_status(secured.as_("carol").GetTopology, pb.GetTopologyRequest(), DENIED,
                  "DESCRIBE", "every pipeline")
    assert secured.as_("root").GetTopology(pb.GetTopologyRequest()).barrier_interval_ms == 5000


def test_leases_need_read_on_their_tables_and_vacuum_needs_admin_and_write(secured):
    mine, theirs = secured.table("alice"), secured.table("bob")
    carol = secured.as_("carol")
    reply = carol.GetSnapshot(pb.GetSnapshotRequest(tables=[mine], lease_ms=60_000,
                                                    lease_holder="carol"))
    assert reply.lease.lease_id and reply.lease.holder == "carol"
    assert carol.ListLeases(pb.ListLeasesRequest(tables=[mine])) is not None
    expect_status(carol.ListLeases, pb.ListLeasesRequest(tables=[theirs]), DENIED, "READ")
    expect_status(carol.ListLeases, pb.ListLeasesRequest(), DENIED, "ADMIN", "every pipeline")
    assert not carol.ReleaseLease(pb.ReleaseLeaseRequest(lease_id="lease-none")).released
    expect_status(secured.as_("alice").Vacuum, pb.VacuumRequest(table=mine, dry_run=True),
                  DENIED, "ADMIN", "every pipeline")
    expect_status(secured.as_("root").Vacuum, pb.VacuumRequest(table=mine, dry_run=True),
                  DENIED, "WRITE", f"table file://{os.path.realpath(mine)}")


# ---------------------------------------------------------------- management

def cli(secured: Secured, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PERCOLAKE_TOKEN": token or ""}
    return subprocess.run([sys.executable, "-m", "coordinator", *args, "--target",
                           secured.daemon.target], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=env)


def test_cli_changes_take_effect_at_once_and_survive_a_restart(secured):
    admin = secured.secrets["admin"]
    made = cli(secured, "tokens", "create", "--principal", "erin", "--json", token=admin)
    assert made.returncode == 0, made.stderr
    erin_token = json.loads(made.stdout)["bearer_token"]
    erin = Caller(secured.stub, erin_token)
    pipeline = unique("e-cli")
    expect_status(erin.RegisterPipeline, pb.RegisterPipelineRequest(pipeline_id=pipeline),
                  DENIED, "'erin'")
    added = cli(secured, "acl", "add", "--principal", "erin", "--pipeline", "e-*",
                "--permission", "write", token=admin)
    assert added.returncode == 0 and "WRITE on pipeline e-* for erin" in added.stdout
    assert erin.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline)).epoch == 1

    listed = cli(secured, "tokens", "list", token=admin)
    assert listed.returncode == 0 and "erin" in listed.stdout
    assert erin_token not in listed.stdout and "TOKEN ID" in listed.stdout
    refused = cli(secured, "acl", "list", token=secured.secrets["alice"])
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr

    secured.daemon.kill()
    secured.daemon.start(serving=False)
    wait_serving_with(secured.daemon, admin)
    assert erin.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline)).epoch == 2
    entries = json.loads(cli(secured, "acl", "list", "--principal", "erin", "--json",
                             token=admin).stdout)
    assert [(e["resource"], e["pattern"], e["permission"]) for e in entries] == [
        ("pipeline", "e-*", "WRITE")]
    erin_id = json.loads(made.stdout)["token_id"]
    revoked = cli(secured, "tokens", "revoke", "--id", erin_id, token=admin)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    expect_status(erin.GetPipeline, pb.GetPipelineRequest(pipeline_id=pipeline),
                  UNAUTHENTICATED, "unknown or revoked")


def test_acl_entries_are_validated_and_removal_is_effective_at_once(secured):
    admin = secured.as_("admin")
    for entry, words in [
        (pb.AclEntry(principal="x", resource_type=pb.TABLE, pattern="*",
                     permission=pb.ADMIN), ["ADMIN does not apply to tables"]),
        (pb.AclEntry(principal="x", resource_type=pb.PIPELINE, pattern="a*b",
                     permission=pb.WRITE), ["'*' may only end it"]),
        (pb.AclEntry(principal="x", resource_type=pb.PIPELINE, pattern="p"),
         ["permission must be one of"]),
    ]:
        expect_status(admin.AddAcl, pb.AclRequest(entry=entry),
                      grpc.StatusCode.INVALID_ARGUMENT, *words)
    secured.token_for("frank")
    entry = pb.AclEntry(principal="frank", resource_type=pb.PIPELINE, pattern="f-1",
                        permission=pb.WRITE)
    assert admin.AddAcl(pb.AclRequest(entry=entry)).changed
    assert not admin.AddAcl(pb.AclRequest(entry=entry)).changed
    frank = secured.as_("frank")
    frank.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id="f-1"))
    assert admin.RemoveAcl(pb.AclRequest(entry=entry)).changed
    expect_status(frank.RegisterPipeline, pb.RegisterPipelineRequest(pipeline_id="f-1"),
                  DENIED, "WRITE")


# ---------------------------------------------------------------- audit log

def audit_lines(secured: Secured) -> list[dict]:
    return [json.loads(line) for line in secured.audit_log.read_text().splitlines()]


def test_audit_log_records_refusals_and_admin_actions_and_no_secret(secured):
    pipeline = unique("b-audit")
    expect_status(Caller(secured.stub, None).GetPipeline,
                  pb.GetPipelineRequest(pipeline_id=pipeline), UNAUTHENTICATED)
    expect_status(secured.as_("bob").GetPipeline, pb.GetPipelineRequest(pipeline_id=pipeline),
                  grpc.StatusCode.NOT_FOUND)
    marker = unique("a-denied")
    expect_status(secured.as_("bob").RegisterPipeline,
                  pb.RegisterPipelineRequest(pipeline_id=marker), DENIED)
    lines = audit_lines(secured)
    fields = {"time", "principal", "peer", "method", "pipeline", "table", "txn_id", "action",
              "outcome"}
    assert all(set(line) == fields for line in lines)
    assert all(line["peer"].startswith(("ipv4:127.0.0.1:", "ipv6:")) for line in lines)
    unauthenticated = [line for line in lines if line["outcome"]["status"] == "UNAUTHENTICATED"]
    assert unauthenticated and unauthenticated[-1]["principal"] == ""
    assert any(line["principal"] == "bob" and line["method"] == "GetPipeline"
               and line["pipeline"] == pipeline and line["outcome"]["status"] == "NOT_FOUND"
               for line in lines)
    assert any(line["principal"] == "bob" and line["pipeline"] == marker
               and line["outcome"]["status"] == "PERMISSION_DENIED"
               and "lacks WRITE" in line["outcome"]["message"] for line in lines)
    assert any(line["action"] == "token create" and line["principal"] == "admin"
               for line in lines)
    assert any(line["action"] == "acl add" for line in lines)
    text = secured.audit_log.read_text()
    for secret in secured.secrets.values():
        assert secret not in text
    assert tokens.PREFIX not in text
    assert stat.S_IMODE(secured.audit_log.stat().st_mode) == 0o600


def test_bearer_tokens_are_stored_only_as_hashes(secured):
    import sqlite3

    db = secured.daemon.data_dir / "coordinator.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT token_id, secret_hash FROM tokens").fetchall()
    assert len(rows) >= len(secured.token_ids)
    stored = {token_id: digest for token_id, digest in rows}
    for principal, token_id in secured.token_ids.items():
        secret = tokens.split(secured.secrets[principal])[1]
        assert stored[token_id] == tokens.secret_hash(secret) != secret
    raw = b"".join(p.read_bytes() for p in secured.daemon.data_dir.iterdir() if p.is_file())
    assert not any(secret.encode() in raw for secret in secured.secrets.values())



def test_limits_and_malformed_requests_are_audited_with_the_principal(secured):
    too_many = [secured.table("alice", f"t{i}") for i in range(1001)]
    expect_status(secured.as_("alice").OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=unique("a-many"), batch_id=0, tables=too_many),
        grpc.StatusCode.RESOURCE_EXHAUSTED)
    raw = secured.channel.unary_unary("/percolake.v1.Coordinator/GetTransaction")
    marker = unique("junk").encode()
    carol = [("authorization", f"Bearer {secured.secrets['carol']}")]
    expect_status(lambda request, timeout: raw(request, timeout=timeout, metadata=carol),
                  b"\x0a\xff" + marker, grpc.StatusCode.INVALID_ARGUMENT, "not a protobuf")
    lines = audit_lines(secured)
    assert any(line["principal"] == "alice" and line["method"] == "OpenTransaction"
               and line["outcome"]["status"] == "RESOURCE_EXHAUSTED" for line in lines)
    assert any(line["principal"] == "carol" and line["method"] == "GetTransaction"
               and line["outcome"]["status"] == "INVALID_ARGUMENT" for line in lines)


def test_tokens_made_without_authentication_work_once_it_is_on(daemon_factory):
    daemon = daemon_factory.start()
    try:
        stub = daemon.stub
        made = stub.CreateToken(pb.CreateTokenRequest(principal="ops"), timeout=30)
        stub.AddAcl(pb.AclRequest(entry=pb.AclEntry(
            principal="ops", resource_type=pb.PIPELINE, pattern="*", permission=pb.ADMIN)),
            timeout=30)
        daemon.close_channel()
        daemon.kill()
        daemon.extra_args.append("--authenticate")
        daemon.start(serving=False)
        wait_serving_with(daemon, made.bearer_token)
        ops = Caller(daemon.stub, made.bearer_token)
        assert [t.principal for t in ops.ListTokens(pb.ListTokensRequest()).tokens] == ["ops"]
        expect_status(Caller(daemon.stub, None).ListTokens, pb.ListTokensRequest(),
                      UNAUTHENTICATED)
    finally:
        daemon.stop()


@pytest.mark.parametrize(("resource", "pattern", "name", "expected"), [
    ("pipeline", "sales", "sales", True),
    ("pipeline", "sales", "sales-2", False),
    ("pipeline", "sales*", "sales-2", True),
    ("pipeline", "sales*", "sale", False),
    ("pipeline", "*", "anything", True),
    ("table", "file:///lake/sales", "file:///lake/sales", True),
    ("table", "file:///lake/sales", "file:///lake/sales/orders", True),
    ("table", "file:///lake/sales", "file:///lake/salesforce", False),
    ("table", "*", "s3://bucket/t", True),
])
def test_patterns_match_ids_prefixes_and_folders(resource, pattern, name, expected):
    from coordinator.auth.acl import matches
    from coordinator.auth_records import Resource

    assert matches(Resource(resource), pattern, name) is expected


# ---------------------------------------------------------------- every client with a token

def test_every_client_authenticates_with_its_token_and_is_refused_without(secured):
    from sparkside.client import CoordinatorClient
    from sparkside.errors import InvalidRequest
    from sparkside.reader import ConsistentReader
    from tests.daemon_support import grpcurl_path

    pipeline, table = unique("a-clients"), secured.table("alice")
    alice = secured.secrets["alice"]
    good = CoordinatorClient(secured.daemon.target, retry_s=10,
                             security=ClientSecurity(token=alice))
    bad = CoordinatorClient(secured.daemon.target, retry_s=10,
                            security=ClientSecurity(token=alice[:-4] + "AAAA"))
    try:
        epoch = good.call("RegisterPipeline", pb.RegisterPipelineRequest(
            pipeline_id=pipeline, query_id=QUERY_ID)).epoch
        assert epoch >= 1
        with pytest.raises(InvalidRequest, match="UNAUTHENTICATED.*unknown or revoked"):
            bad.call("GetPipeline", pb.GetPipelineRequest(pipeline_id=pipeline))
    finally:
        good.close()
        bad.close()

    reader = ConsistentReader(None, secured.daemon.target, retry_s=10, token=alice)
    snapshot = reader._client.call("GetSnapshot", pb.GetSnapshotRequest(tables=[table]))
    assert snapshot.snapshot_ts > 0

    listed = cli(secured, "acl", "list", "--json", token=secured.secrets["root"])
    assert listed.returncode == 0, listed.stderr
    refused = cli(secured, "acl", "list", token="")
    assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr + refused.stdout

    grpcurl = grpcurl_path()
    base = [grpcurl, "-plaintext", "-d", json.dumps({"pipeline_id": pipeline})]
    method = [secured.daemon.target, "percolake.v1.Coordinator/GetPipeline"]
    ok = subprocess.run([*base, "-H", f"authorization: Bearer {alice}", *method],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["pipeline_id"] == pipeline, ok.stderr
    no = subprocess.run([*base, "-H", f"authorization: Bearer {alice}x", *method],
                        capture_output=True, text=True, timeout=60)
    assert no.returncode != 0 and "Unauthenticated" in no.stderr, no.stderr


def test_a_refused_credential_is_logged_once_without_the_token(secured):
    import time

    log_path = secured.daemon.log_path
    bogus = "plk_0123456789abcdef_" + "Z" * 43

    def refusals() -> int:
        return sum(1 for line in log_path.read_text().splitlines()
                   if '"refused"' in line and "UNAUTHENTICATED" in line)

    before = refusals()
    expect_status(Caller(secured.stub, bogus).GetPipeline,
                  pb.GetPipelineRequest(pipeline_id="a-x"), UNAUTHENTICATED)
    deadline = time.monotonic() + 5
    while refusals() < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert refusals() == before + 1
    assert "Z" * 43 not in log_path.read_text()


def test_no_client_call_acts_on_a_transaction_of_the_reserved_revision_pipeline(tmp_path):
    """The guard looks up each transaction's pipeline (without the core's lock): a call
    naming a revision's transaction is refused before the core runs, and one naming an
    unknown transaction is left to the call itself."""
    import functools

    from coordinator.auth.access import Guard
    from coordinator.core import CoordinatorConfig, TransactionCoordinator
    from coordinator.core.revision import REVISE_PIPELINE
    from percolake.errors import InvalidArgument

    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)]))
    revision, _ = core.open_transaction(REVISE_PIPELINE, 0)
    ordinary, _ = core.open_transaction("p", 0)
    guard = Guard()
    ran: list[str] = []
    requests = {
        "AbortTransaction": pb.AbortTransactionRequest,
        "CommitTransaction": pb.CommitTransactionRequest,
        "Heartbeat": pb.HeartbeatRequest,
        "ReportApplied": pb.ReportAppliedRequest,
    }
    for name, request in requests.items():
        call = functools.partial(ran.append, name)
        with pytest.raises(InvalidArgument, match="reserved"):
            guard.run(name, core, request(txn_id=revision.txn_id), call)
        guard.run(name, core, request(txn_id=ordinary.txn_id), call)
        guard.run(name, core, request(txn_id="f" * 32), call)
    assert ran == [name for name in requests for _ in range(2)]
