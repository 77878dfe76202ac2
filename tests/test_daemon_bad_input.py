"""Bad input against a real daemon: the right gRPC status, an actionable message, no change,
and the daemon keeps serving (DESIGN.md "Bad input").

Each case runs against a fresh OPEN transaction ``c.txn_id`` of a fresh pipeline ``c.pipeline``
on one shared daemon started with small size limits.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import add_file, expect_status, table_write, unique

IA = grpc.StatusCode.INVALID_ARGUMENT
NF = grpc.StatusCode.NOT_FOUND
PD = grpc.StatusCode.PERMISSION_DENIED
RE = grpc.StatusCode.RESOURCE_EXHAUSTED
FP = grpc.StatusCode.FAILED_PRECONDITION
MAX_MESSAGE = 1024 * 1024
MAX_INTENT = 64 * 1024
UNKNOWN_TXN = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def limited(daemon_factory, tmp_path_factory):
    daemon = daemon_factory.start(
        ["--max-message-bytes", str(MAX_MESSAGE), "--max-intent-bytes", str(MAX_INTENT),
         "--conflict-wait", "1", "--roll-forward-after", "3600"], name="bad-input")
    outside = tmp_path_factory.mktemp("outside-the-warehouse")
    (daemon.warehouse / "link").symlink_to(outside, target_is_directory=True)
    (daemon.warehouse / "dangling").symlink_to(outside / "not-yet")
    yield daemon, outside
    daemon.stop()


@dataclass
class Case:
    """The context of one bad request: a live transaction and paths around the warehouse."""

    stub: Any
    warehouse: Path
    outside: Path
    pipeline: str
    txn_id: str

    def table(self, name: str = "t") -> str:
        return str(self.warehouse / f"{name}-{self.pipeline}")

    def write(self, **fields: Any) -> pb.TableWrite:
        """A valid write intent of ``self.table()`` with ``fields`` replaced."""
        write = table_write(self.table(), self.txn_id)
        for name, value in fields.items():
            if isinstance(value, list):
                write.ClearField(name)
                getattr(write, name).extend(value)
            else:
                setattr(write, name, value)
        return write

    def prewrite(self, **fields: Any) -> pb.PrewriteRequest:
        return pb.PrewriteRequest(txn_id=self.txn_id, writes=[self.write(**fields)])

    def declare(self, table: str) -> pb.DeclareTablesRequest:
        return pb.DeclareTablesRequest(txn_id=self.txn_id, tables=[table])


@pytest.fixture
def case(limited) -> Case:
    daemon, outside = limited
    pipeline = unique("bad")
    txn = daemon.stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline),
                                      timeout=30).transaction
    return Case(daemon.stub, daemon.warehouse, outside, pipeline, txn.txn_id)


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


Build = Callable[[Case], Any]
# (id, rpc, request builder, status, words the message must contain)
CASES: list[tuple[str, str, Build, grpc.StatusCode, tuple[str, ...]]] = [
    # --- empty, blank, malformed ids
    ("register-empty-pipeline", "RegisterPipeline",
     lambda c: pb.RegisterPipelineRequest(pipeline_id=""), IA, ("pipeline_id", "non-empty")),
    ("open-empty-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id=""), IA, ("pipeline_id", "non-empty")),
    ("open-blank-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="   "), IA, ("pipeline_id",)),
    ("open-control-char-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="a\nb"), IA, ("control characters",)),
    ("open-long-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="p" * 300), IA, ("at most 256",)),
    ("get-empty-txn", "GetTransaction",
     lambda c: pb.GetTransactionRequest(txn_id=""), IA, ("txn_id", "non-empty")),
    ("declare-empty-txn", "DeclareTables",
     lambda c: pb.DeclareTablesRequest(txn_id="", tables=[c.table()]), IA, ("txn_id",)),
    ("prewrite-empty-txn", "Prewrite",
     lambda c: pb.PrewriteRequest(txn_id="", writes=[c.write()]), IA, ("txn_id",)),
    ("commit-empty-txn", "CommitTransaction",
     lambda c: pb.CommitTransactionRequest(txn_id=""), IA, ("txn_id",)),
    ("abort-empty-txn", "AbortTransaction",
     lambda c: pb.AbortTransactionRequest(txn_id=""), IA, ("txn_id",)),
    ("heartbeat-empty-txn", "Heartbeat", lambda c: pb.HeartbeatRequest(txn_id=""), IA,
     ("txn_id",)),
    ("report-empty-txn", "ReportApplied", lambda c: pb.ReportAppliedRequest(
        txn_id="", tables=[pb.AppliedTable(table=c.table(), delta_version=0)]), IA, ("txn_id",)),
    ("get-pipeline-empty", "GetPipeline", lambda c: pb.GetPipelineRequest(pipeline_id=""), IA,
     ("pipeline_id",)),
    ("reset-empty-pipeline", "ResetPipeline",
     lambda c: pb.ResetPipelineRequest(pipeline_id="", reason="r"), IA, ("pipeline_id",)),
    ("list-control-char-pipeline", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(pipeline_id="a\tb"), IA, ("pipeline_id",)),
    # --- negative numbers
    ("open-negative-batch", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id=c.pipeline, batch_id=-1), IA,
     ("batch_id", ">= 0", "-1")),
    ("open-negative-epoch", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id=c.pipeline, epoch=-1), IA, ("epoch",)),
    ("open-negative-timeout", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id=c.pipeline, timeout_ms=-5), IA,
     ("timeout_ms",)),
    ("commit-negative-epoch", "CommitTransaction",
     lambda c: pb.CommitTransactionRequest(txn_id=c.txn_id, epoch=-1), IA, ("epoch",)),
    ("heartbeat-negative-epoch", "Heartbeat",
     lambda c: pb.HeartbeatRequest(txn_id=c.txn_id, epoch=-2), IA, ("epoch",)),
    ("report-negative-version", "ReportApplied", lambda c: pb.ReportAppliedRequest(
        txn_id=c.txn_id, tables=[pb.AppliedTable(table=c.table(), delta_version=-1)]), IA,
     ("delta_version",)),
    ("list-negative-batch", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(pipeline_id=c.pipeline, batch_id=-1), IA,
     ("batch_id",)),
    ("list-negative-generation", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(pipeline_id=c.pipeline, generation=-1), IA,
     ("generation",)),
    ("abort-long-reason", "AbortTransaction",
     lambda c: pb.AbortTransactionRequest(txn_id=c.txn_id, reason="r" * 5000), IA,
     ("reason", "1000")),
    ("list-negative-page-size", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(page_size=-1), IA, ("page_size",)),
    ("list-huge-page-size", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(page_size=5000), IA, ("page_size", "1000")),
    ("list-negative-created-after", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(created_after_unix_ms=-1), IA, ("created",)),
    ("snapshot-negative-as-of", "GetSnapshot",
     lambda c: pb.GetSnapshotRequest(tables=[c.table()], as_of_ts=-1), IA, ("as_of_ts",)),
    ("snapshot-negative-batch", "GetSnapshot", lambda c: pb.GetSnapshotRequest(
        tables=[c.table()], as_of_batch=pb.BatchRef(pipeline_id=c.pipeline, batch_id=-3)), IA,
     ("batch_id",)),
    ("snapshot-negative-wait", "GetSnapshot",
     lambda c: pb.GetSnapshotRequest(tables=[c.table()], wait_timeout_ms=-1), IA,
     ("wait_timeout_ms",)),
    ("reset-negative-generation", "ResetPipeline", lambda c: pb.ResetPipelineRequest(
        pipeline_id=c.pipeline, reason="r", expected_generation=-1), IA, ("generation",)),
    # --- unknown things
    ("get-unknown-txn", "GetTransaction", lambda c: pb.GetTransactionRequest(txn_id=UNKNOWN_TXN),
     NF, (UNKNOWN_TXN,)),
    ("commit-unknown-txn", "CommitTransaction",
     lambda c: pb.CommitTransactionRequest(txn_id=UNKNOWN_TXN), NF, (UNKNOWN_TXN,)),
    ("abort-unknown-txn", "AbortTransaction",
     lambda c: pb.AbortTransactionRequest(txn_id=UNKNOWN_TXN), NF, (UNKNOWN_TXN,)),
    ("heartbeat-unknown-txn", "Heartbeat", lambda c: pb.HeartbeatRequest(txn_id=UNKNOWN_TXN),
     NF, (UNKNOWN_TXN,)),
    ("declare-unknown-txn", "DeclareTables",
     lambda c: pb.DeclareTablesRequest(txn_id=UNKNOWN_TXN, tables=[c.table()]), NF,
     (UNKNOWN_TXN,)),
    ("prewrite-unknown-txn", "Prewrite", lambda c: pb.PrewriteRequest(
        txn_id=UNKNOWN_TXN, writes=[table_write(c.table(), UNKNOWN_TXN)]), NF, (UNKNOWN_TXN,)),
    ("report-unknown-txn", "ReportApplied", lambda c: pb.ReportAppliedRequest(
        txn_id=UNKNOWN_TXN, tables=[pb.AppliedTable(table=c.table(), delta_version=0)]), NF,
     (UNKNOWN_TXN,)),
    ("get-unknown-pipeline", "GetPipeline",
     lambda c: pb.GetPipelineRequest(pipeline_id="never-seen"), NF, ("never-seen",)),
    ("reset-unknown-pipeline", "ResetPipeline",
     lambda c: pb.ResetPipelineRequest(pipeline_id="never-seen", reason="r"), NF,
     ("never-seen",)),
    ("snapshot-unknown-batch", "GetSnapshot", lambda c: pb.GetSnapshotRequest(
        tables=[c.table()], as_of_batch=pb.BatchRef(pipeline_id=c.pipeline, batch_id=99)), NF,
     ("batch 99",)),
    # --- table paths
    ("declare-outside-warehouse", "DeclareTables", lambda c: c.declare(str(c.outside / "t")),
     PD, ("outside the warehouse", "--warehouse")),
    ("declare-outside-file-uri", "DeclareTables",
     lambda c: c.declare(f"file://{c.outside}/t"), PD, ("outside the warehouse",)),
    ("declare-warehouse-root-itself", "DeclareTables", lambda c: c.declare(str(c.warehouse)),
     PD, ("warehouse",)),
    ("declare-root-of-filesystem", "DeclareTables", lambda c: c.declare("/"), PD,
     ("warehouse",)),
    ("declare-dotdot-escape", "DeclareTables",
     lambda c: c.declare(f"{c.warehouse}/../escaped"), IA, ("'..'",)),
    ("declare-dotdot-inside", "DeclareTables",
     lambda c: c.declare(f"{c.warehouse}/a/../b"), IA, ("'..'",)),
    ("declare-dotdot-file-uri", "DeclareTables",
     lambda c: c.declare(f"file://{c.warehouse}/../escaped"), IA, ("'..'",)),
    ("declare-encoded-dotdot", "DeclareTables",
     lambda c: c.declare(f"file://{c.warehouse}/%2e%2e/escaped"), IA, ("'..'",)),
    ("declare-symlink-escape", "DeclareTables",
     lambda c: c.declare(f"{c.warehouse}/link/t"), PD, ("outside the warehouse",
                                                        "resolved to")),
    ("declare-dangling-symlink-escape", "DeclareTables",
     lambda c: c.declare(f"{c.warehouse}/dangling"), PD, ("outside the warehouse",)),
    ("declare-relative-path", "DeclareTables", lambda c: c.declare("warehouse/t"), IA,
     ("absolute",)),
    ("declare-relative-dot", "DeclareTables", lambda c: c.declare("./t"), IA, ("absolute",)),
    ("declare-s3-scheme", "DeclareTables", lambda c: c.declare("s3://bucket/t"), IA,
     ("scheme", "s3")),
    ("declare-hdfs-scheme", "DeclareTables",
     lambda c: c.declare(f"hdfs://{c.warehouse}/t"), IA, ("scheme",)),
    ("declare-remote-file-uri", "DeclareTables",
     lambda c: c.declare(f"file://otherhost{c.warehouse}/t"), IA, ("local",)),
    ("declare-empty-table", "DeclareTables", lambda c: c.declare(""), IA, ("non-empty",)),
    ("declare-nul-in-path", "DeclareTables", lambda c: c.declare(f"{c.warehouse}/a\x00b"), IA,
     ("NUL",)),
    ("declare-inside-attempt-folder", "DeclareTables",
     lambda c: c.declare(f"{c.warehouse}/t/_percolake/x"), IA, ("_percolake",)),
    ("declare-very-long-path", "DeclareTables",
     lambda c: c.declare(f"{c.warehouse}/{'x' * 5000}"), IA, ("4096",)),
    ("declare-no-tables", "DeclareTables", lambda c: pb.DeclareTablesRequest(txn_id=c.txn_id),
     IA, ("at least one",)),
    ("open-table-outside", "OpenTransaction", lambda c: pb.OpenTransactionRequest(
        pipeline_id=c.pipeline, batch_id=1, tables=[str(c.outside / "t")]), PD,
     ("outside the warehouse",)),
    ("prewrite-table-outside", "Prewrite", lambda c: c.prewrite(table=str(c.outside / "t")),
     PD, ("outside the warehouse",)),
    ("snapshot-table-outside", "GetSnapshot",
     lambda c: pb.GetSnapshotRequest(tables=[str(c.outside / "t")]), PD, ("outside",)),
    ("report-table-outside", "ReportApplied", lambda c: pb.ReportAppliedRequest(
        txn_id=c.txn_id, tables=[pb.AppliedTable(table=str(c.outside / "t"))]), PD,
     ("outside",)),
    # --- query ids
    ("register-malformed-query-id", "RegisterPipeline", lambda c: pb.RegisterPipelineRequest(
        pipeline_id=c.pipeline, query_id="not-a-uuid"), IA, ("query_id", "UUID")),
    ("open-malformed-query-id", "OpenTransaction", lambda c: pb.OpenTransactionRequest(
        pipeline_id=c.pipeline, batch_id=1, query_id="1234"), IA, ("query_id", "UUID")),
    ("open-empty-query-id", "OpenTransaction", lambda c: pb.OpenTransactionRequest(
        pipeline_id=c.pipeline, batch_id=1, query_id=""), IA, ("query_id",)),
    # --- sizes
    ("prewrite-oversized-message", "Prewrite",
     lambda c: c.prewrite(add_files=[add_file(c.txn_id, stats=json.dumps(
         {"numRecords": 1, "pad": "x" * (2 * MAX_MESSAGE)}))]), RE, ()),
    ("prewrite-oversized-intent", "Prewrite", lambda c: c.prewrite(add_files=[
        add_file(c.txn_id, f"part-{i:05d}-{'x' * 60}.parquet") for i in range(1000)]), RE,
     ("intent", str(MAX_INTENT), "never truncated")),
    ("commit-oversized-intent", "CommitTransaction", lambda c: pb.CommitTransactionRequest(
        txn_id=c.txn_id, writes=[c.write(add_files=[
            add_file(c.txn_id, f"part-{i:05d}-{'x' * 60}.parquet") for i in range(1000)])]),
     RE, ("intent", str(MAX_INTENT))),
    ("declare-too-many-tables", "DeclareTables", lambda c: pb.DeclareTablesRequest(
        txn_id=c.txn_id, tables=[c.table(f"t{i}") for i in range(1001)]), RE, ("1000",)),
    # --- write intents
    ("prewrite-no-writes", "Prewrite", lambda c: pb.PrewriteRequest(txn_id=c.txn_id), IA,
     ("at least one",)),
    ("addfile-outside-attempt-dir", "Prewrite",
     lambda c: c.prewrite(add_files=[pb.AddFile(path="data/part-0.parquet", size=1)]), IA,
     ("data/part-0.parquet", "_percolake/")),
    ("addfile-other-attempt-dir", "Prewrite", lambda c: c.prewrite(add_files=[
        pb.AddFile(path=f"_percolake/{UNKNOWN_TXN}/part-0.parquet", size=1)]), IA,
     ("_percolake/",)),
    ("addfile-absolute", "Prewrite", lambda c: c.prewrite(add_files=[
        pb.AddFile(path=f"/_percolake/{c.txn_id}/part-0.parquet", size=1)]), IA,
     ("relative path",)),
    ("addfile-dotdot", "Prewrite", lambda c: c.prewrite(add_files=[
        pb.AddFile(path=f"_percolake/{c.txn_id}/../../x.parquet", size=1)]), IA,
     ("relative path",)),
    ("addfile-negative-size", "Prewrite",
     lambda c: c.prewrite(add_files=[add_file(c.txn_id, size=-1)]), IA, ("negative size",)),
    ("addfile-stats-not-json", "Prewrite", lambda c: c.prewrite(
        add_files=[add_file(c.txn_id, stats="{numRecords: 1")]), IA, ("stats",)),
    ("addfile-stats-numrecords-not-a-number", "Prewrite", lambda c: c.prewrite(
        add_files=[add_file(c.txn_id, stats='{"numRecords": "many"}')]), IA, ("stats",)),
    ("addfile-stats-not-an-object", "Prewrite", lambda c: c.prewrite(
        add_files=[add_file(c.txn_id, stats="[1, 2]")]), IA, ("stats",)),
    ("commit-writes-stats-not-an-object", "CommitTransaction",
     lambda c: pb.CommitTransactionRequest(txn_id=c.txn_id, writes=[
         c.write(add_files=[add_file(c.txn_id, stats='{"numRecords": [1]}')])]), IA,
     ("stats",)),
    ("addfile-partition-values-unpartitioned", "Prewrite", lambda c: c.prewrite(
        add_files=[add_file(c.txn_id, partition_values={"day": "d1"})]), IA,
     ("partitioned by",)),
    ("addfile-null-and-valued-partition", "Prewrite", lambda c: c.prewrite(
        partition_by=["day"], add_files=[add_file(
            c.txn_id, partition_values={"day": "d1"}, null_partition_columns=["day"])]), IA,
     ("null",)),
    ("schema-not-json", "Prewrite", lambda c: c.prewrite(schema_json="{oops"), IA,
     ("schema_json",)),
    ("schema-not-struct", "Prewrite", lambda c: c.prewrite(schema_json="[1]"), IA,
     ("schema_json", "struct")),
    ("schema-empty", "Prewrite", lambda c: c.prewrite(schema_json=""), IA, ("schema_json",)),
    ("partition-column-not-in-schema", "Prewrite", lambda c: c.prewrite(partition_by=["nope"]),
     IA, ("nope", "not in schema")),
    ("replace-partitions-on-append", "Prewrite", lambda c: c.prewrite(
        partition_by=["day"], add_files=[add_file(c.txn_id, partition_values={"day": "d1"})],
        replace_partitions=[pb.PartitionSpec(values={"day": "d1"})]), IA,
     ("OVERWRITE_PARTITIONS",)),
    ("overwrite-partitions-unpartitioned", "Prewrite",
     lambda c: c.prewrite(mode=pb.OVERWRITE_PARTITIONS), IA, ("partition",)),
    ("same-table-twice", "Prewrite", lambda c: pb.PrewriteRequest(txn_id=c.txn_id, writes=[
        c.write(), c.write(table=f"file://{c.table()}/")]), IA, ("twice",)),
    ("unknown-write-mode", "Prewrite", lambda c: c.prewrite(mode=42), IA, ("mode", "42")),
    # --- reports
    ("report-no-tables", "ReportApplied", lambda c: pb.ReportAppliedRequest(txn_id=c.txn_id),
     IA, ("at least one",)),
    ("report-table-twice", "ReportApplied", lambda c: pb.ReportAppliedRequest(
        txn_id=c.txn_id, tables=[pb.AppliedTable(table=c.table()),
                                 pb.AppliedTable(table=c.table())]), IA, ("twice",)),
    ("report-on-open-txn", "ReportApplied", lambda c: pb.ReportAppliedRequest(
        txn_id=c.txn_id, tables=[pb.AppliedTable(table=c.table())]), FP, ("committed",)),
    # --- listing
    ("list-garbage-page-token", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(page_token="not a token!"), IA, ("page_token",)),
    ("list-forged-page-token", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(page_token=_b64("ts:abc")), IA, ("page_token",)),
    ("list-foreign-page-token", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(page_token=_b64("offset:5")), IA, ("page_token",)),
    ("list-unknown-state", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(states=[99]), IA, ("state", "99")),
    ("list-unspecified-state", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(states=[pb.TRANSACTION_STATE_UNSPECIFIED]), IA,
     ("state",)),
    # --- snapshots and resets
    ("snapshot-no-tables", "GetSnapshot", lambda c: pb.GetSnapshotRequest(), IA,
     ("at least one",)),
    ("snapshot-future-as-of", "GetSnapshot",
     lambda c: pb.GetSnapshotRequest(tables=[c.table()], as_of_ts=2**62), IA, ("future",)),
    ("reset-without-reason", "ResetPipeline",
     lambda c: pb.ResetPipelineRequest(pipeline_id=c.pipeline, reason=" "), IA, ("reason",)),
]


def _state(stub: Any, case: Case) -> tuple[Any, list[Any]]:
    txn = stub.GetTransaction(pb.GetTransactionRequest(txn_id=case.txn_id), timeout=30)
    listed = stub.ListTransactions(pb.ListTransactionsRequest(pipeline_id=case.pipeline),
                                   timeout=30).transactions
    return txn, list(listed)


@pytest.mark.parametrize(("rpc", "build", "code", "words"),
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_bad_input_gets_its_status_and_changes_nothing(limited, case, rpc, build, code, words):
    daemon, _ = limited
    before = _state(daemon.stub, case)

    expect_status(getattr(daemon.stub, rpc), build(case), code, *words)

    assert _state(daemon.stub, case) == before, "a refused request changed the store"
    with grpc.insecure_channel(daemon.target) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    fresh = daemon.stub.OpenTransaction(
        pb.OpenTransactionRequest(pipeline_id=unique("after-bad")), timeout=30)
    assert fresh.transaction.state == pb.OPEN
    assert daemon.is_running()


def test_refused_open_creates_no_pipeline(limited):
    daemon, outside = limited
    pipeline = unique("never-created")
    expect_status(daemon.stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=pipeline, tables=[str(outside / "t")]), PD)
    expect_status(daemon.stub.GetPipeline, pb.GetPipelineRequest(pipeline_id=pipeline), NF)
    listed = daemon.stub.ListTransactions(pb.ListTransactionsRequest(pipeline_id=pipeline),
                                          timeout=30)
    assert not listed.transactions


@pytest.mark.parametrize("stats", ['{"numRecords": "many"}', "[1, 2]", '{"numRecords": null}',
                                   '"just a string"'])
def test_odd_stats_never_make_transactions_unreadable(daemon, stats):
    """Stats that are JSON but not a Delta stats object are refused up front; whatever happens,
    every transaction stays readable and listable."""
    stub = daemon.stub
    txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="p"), timeout=30).transaction
    write = table_write(daemon.warehouse / "t", txn.txn_id)
    write.add_files[0].stats = stats
    try:
        stub.Prewrite(pb.PrewriteRequest(txn_id=txn.txn_id, writes=[write]), timeout=30)
        refusal = None
    except grpc.RpcError as exc:
        refusal = exc
    stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id), timeout=30)
    listed = stub.ListTransactions(pb.ListTransactionsRequest(), timeout=30).transactions
    assert [t.txn_id for t in listed] == [txn.txn_id]
    assert refusal is not None and refusal.code() == IA, refusal


def test_the_unmodified_request_of_the_cases_is_accepted(limited, case):
    """The base write every case modifies is accepted: the refusals come from the changes."""
    daemon, _ = limited
    reply = daemon.stub.Prewrite(case.prewrite(), timeout=30)
    assert reply.transaction.state == pb.PREWRITTEN
