"""Bad input against a real daemon: the right gRPC status, an actionable message, no change,
and the daemon keeps serving (docs/protocol.md, "Status codes").

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
    ("declare-s3-outside-warehouse", "DeclareTables", lambda c: c.declare("s3://bucket/t"),
     PD, ("outside the warehouse",)),
    ("declare-s3-bad-bucket", "DeclareTables", lambda c: c.declare("s3://b/t"), IA,
     ("bucket name",)),
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

INT64_MAX = 2**63 - 1
DEEP = 100_000  # beyond any recursion limit


def _stats(rows: object) -> str:
    return json.dumps({"numRecords": rows})


def _nested_struct(levels: int) -> str:
    """A well-formed Delta schema whose one column nests ``levels`` structs deep."""
    inner: dict[str, Any] = {"type": "struct", "fields": [
        {"name": "leaf", "type": "long", "nullable": True, "metadata": {}}]}
    for _ in range(levels):
        inner = {"type": "struct", "fields": [
            {"name": "n", "type": inner, "nullable": True, "metadata": {}}]}
    return json.dumps({"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "deep", "type": inner, "nullable": True, "metadata": {}}]})


def _file_at(txn_id: str, modification_time: int) -> pb.AddFile:
    file = add_file(txn_id)
    file.modification_time = modification_time
    return file


def _schema(*fields: object) -> str:
    return json.dumps({"type": "struct", "fields": list(fields)})


# Issue 13 items 4 and 14: numbers out of range, JSON of the wrong depth or shape, bytes that
# are not text, invisible characters. Each answered INTERNAL (or was accepted) before.
RANGE_AND_SHAPE_CASES: list[tuple[str, str, Build, grpc.StatusCode, tuple[str, ...]]] = [
    # --- item 4: numbers that would overflow an int64 reply field or SQLite
    ("prewrite-numrecords-beyond-int64", "Prewrite", lambda c: c.prewrite(
        add_files=[add_file(c.txn_id, stats=_stats(2**63))]), IA, ("numRecords", "at most")),
    ("prewrite-numrecords-huge", "Prewrite", lambda c: c.prewrite(
        add_files=[add_file(c.txn_id, stats=_stats(10**40))]), IA, ("numRecords",)),
    ("commit-numrecords-beyond-int64", "CommitTransaction",
     lambda c: pb.CommitTransactionRequest(txn_id=c.txn_id, writes=[c.write(
         add_files=[add_file(c.txn_id, stats=_stats(2**64))])]), IA, ("numRecords",)),
    ("prewrite-row-sum-beyond-int64", "Prewrite", lambda c: c.prewrite(add_files=[
        add_file(c.txn_id, f"p{i}.parquet", stats=_stats(2**53 - 1)) for i in range(1025)]),
     IA, ("rows", "at most")),
    ("prewrite-nullcount-beyond-int64", "Prewrite", lambda c: c.prewrite(add_files=[
        add_file(c.txn_id, stats=json.dumps({"numRecords": 1, "nullCount": {"id": 2**64}}))]),
     IA, ("nullCount",)),
    ("prewrite-stats-infinity", "Prewrite", lambda c: c.prewrite(add_files=[
        add_file(c.txn_id, stats='{"numRecords": 1, "minValues": {"id": 1e999}}')]), IA,
     ("stats", "finite")),
    ("prewrite-stats-nan", "Prewrite", lambda c: c.prewrite(add_files=[
        add_file(c.txn_id, stats='{"numRecords": 1, "maxValues": {"id": NaN}}')]), IA,
     ("stats",)),
    ("addfile-size-huge", "Prewrite", lambda c: c.prewrite(
        add_files=[add_file(c.txn_id, size=INT64_MAX)]), IA, ("size", "at most")),
    ("addfile-negative-mtime", "Prewrite", lambda c: c.prewrite(
        add_files=[_file_at(c.txn_id, -1)]), IA, ("modification_time",)),
    ("addfile-mtime-beyond-year-9999", "Prewrite", lambda c: c.prewrite(
        add_files=[_file_at(c.txn_id, INT64_MAX)]), IA, ("modification_time",)),
    ("open-timeout-beyond-int64-ms", "OpenTransaction", lambda c: pb.OpenTransactionRequest(
        pipeline_id=c.pipeline, batch_id=1, timeout_ms=INT64_MAX), RE,
     ("timeout_ms", "--max-txn-timeout")),
    ("open-timeout-beyond-a-day", "OpenTransaction", lambda c: pb.OpenTransactionRequest(
        pipeline_id=c.pipeline, batch_id=1, timeout_ms=10**10), RE, ("timeout_ms", "3600 s")),
    ("snapshot-wait-beyond-lock-wait", "GetSnapshot", lambda c: pb.GetSnapshotRequest(
        tables=[c.table()], wait_timeout_ms=INT64_MAX), IA, ("wait_timeout_ms", "at most")),
    ("list-page-token-beyond-sqlite", "ListTransactions", lambda c: pb.ListTransactionsRequest(
        page_token=_b64("ts:" + "9" * 30)), IA, ("page_token",)),
    ("list-page-token-negative", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(page_token=_b64("ts:-5")), IA, ("page_token",)),
    ("list-page-token-unicode-digits", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(page_token=_b64("ts:\u0665")), IA, ("page_token",)),
    ("list-page-token-not-utf8", "ListTransactions", lambda c: pb.ListTransactionsRequest(
        page_token=base64.urlsafe_b64encode(b"ts:\xff").decode()), IA, ("page_token",)),
    ("snapshot-batch-negative-generation", "GetSnapshot", lambda c: pb.GetSnapshotRequest(
        tables=[c.table()], as_of_batch=pb.BatchRef(pipeline_id=c.pipeline, generation=-1)),
     IA, ("generation",)),
    ("snapshot-too-many-table-names", "GetSnapshot",
     lambda c: pb.GetSnapshotRequest(tables=[c.table()] * 1001), RE, ("1000",)),
    ("declare-too-many-table-names", "DeclareTables",
     lambda c: pb.DeclareTablesRequest(txn_id=c.txn_id, tables=[c.table()] * 1001), RE,
     ("1000",)),
    # --- item 14: JSON nested too deep or of the wrong shape
    ("schema-nested-beyond-recursion", "Prewrite",
     lambda c: c.prewrite(schema_json="[" * DEEP + "]" * DEEP), IA, ("schema_json", "nested")),
    ("schema-struct-nested-too-deep", "Prewrite",
     lambda c: c.prewrite(schema_json=_nested_struct(200)), IA, ("schema_json", "nested")),
    ("stats-nested-beyond-recursion", "Prewrite", lambda c: c.prewrite(add_files=[
        add_file(c.txn_id, stats='{"a":' * DEEP + "1" + "}" * DEEP)]), IA, ("stats", "nested")),
    ("schema-fields-not-a-list", "Prewrite",
     lambda c: c.prewrite(schema_json='{"type": "struct", "fields": 5}'), IA,
     ("schema_json", "fields")),
    ("schema-fields-not-objects", "Prewrite",
     lambda c: c.prewrite(schema_json='{"type": "struct", "fields": [1, 2]}'), IA,
     ("schema_json", "field")),
    ("schema-not-a-struct-type", "Prewrite",
     lambda c: c.prewrite(schema_json='{"type": "array", "fields": [{"name": "id"}]}'), IA,
     ("schema_json", "struct")),
    ("schema-field-without-type", "Prewrite",
     lambda c: c.prewrite(schema_json=_schema({"name": "id"})), IA, ("schema_json", "type")),
    ("schema-field-name-not-text", "Prewrite",
     lambda c: c.prewrite(schema_json=_schema({"name": 7, "type": "long"})), IA,
     ("schema_json", "name")),
    ("schema-nested-type-malformed", "Prewrite", lambda c: c.prewrite(schema_json=_schema(
        {"name": "a", "type": {"type": "array"}})), IA, ("schema_json", "elementType")),
    ("schema-nested-fields-malformed", "Prewrite", lambda c: c.prewrite(schema_json=_schema(
        {"name": "a", "type": {"type": "struct", "fields": {"x": 1}}})), IA,
     ("schema_json", "fields")),
    ("schema-duplicate-columns", "Prewrite", lambda c: c.prewrite(schema_json=_schema(
        {"name": "id", "type": "long"}, {"name": "ID", "type": "string"})), IA,
     ("schema_json", "twice")),
    ("addfile-nul-in-path", "Prewrite", lambda c: c.prewrite(add_files=[
        pb.AddFile(path=f"_percolake/{c.txn_id}/a\x00b.parquet", size=1)]), IA, ("path",)),
    ("declare-nul-after-percent-decoding", "DeclareTables",
     lambda c: c.declare(f"file://{c.warehouse}/a%00b"), IA, ("NUL",)),
    # --- item 14: ids restricted to printable characters
    ("open-bidi-override-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="orders\u202eredro"), IA,
     ("pipeline_id", "U+202E")),
    ("open-bidi-isolate-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="a\u2067b"), IA, ("U+2067",)),
    ("open-zero-width-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="orders\u200b"), IA, ("U+200B",)),
    ("open-line-separator-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="a\u2028b"), IA, ("U+2028",)),
    ("open-paragraph-separator-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="a\u2029b"), IA, ("U+2029",)),
    ("open-private-use-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="a\ue000b"), IA, ("U+E000",)),
    ("open-unassigned-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="a\u0378b"), IA, ("U+0378",)),
    ("open-c1-control-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="a\x85b"), IA, ("U+0085",)),
    ("open-no-break-space-pipeline", "OpenTransaction",
     lambda c: pb.OpenTransactionRequest(pipeline_id="a\u00a0b"), IA, ("U+00A0",)),
    ("register-bidi-pipeline", "RegisterPipeline",
     lambda c: pb.RegisterPipelineRequest(pipeline_id="p\u202a"), IA, ("pipeline_id",)),
    ("list-bidi-pipeline", "ListTransactions",
     lambda c: pb.ListTransactionsRequest(pipeline_id="p\u200f"), IA, ("pipeline_id",)),
    ("snapshot-batch-bidi-pipeline", "GetSnapshot", lambda c: pb.GetSnapshotRequest(
        tables=[c.table()], as_of_batch=pb.BatchRef(pipeline_id="p\u202e")), IA,
     ("pipeline_id",)),
    ("reset-bidi-pipeline", "ResetPipeline",
     lambda c: pb.ResetPipelineRequest(pipeline_id="p\u2066", reason="r"), IA,
     ("pipeline_id",)),
    ("get-bidi-txn", "GetTransaction",
     lambda c: pb.GetTransactionRequest(txn_id=c.txn_id + "\u202e"), IA, ("txn_id",)),
    ("abort-zero-width-txn", "AbortTransaction",
     lambda c: pb.AbortTransactionRequest(txn_id="\ufeff" + c.txn_id), IA, ("txn_id",)),
    ("open-query-id-unicode-digits", "OpenTransaction", lambda c: pb.OpenTransactionRequest(
        pipeline_id=c.pipeline, batch_id=1,
        query_id="\u0660" * 8 + "-0000-4000-8000-000000000001"), IA, ("query_id",)),
    ("open-query-id-braces", "OpenTransaction", lambda c: pb.OpenTransactionRequest(
        pipeline_id=c.pipeline, batch_id=1,
        query_id="{00000000-0000-4000-8000-000000000001}"), IA, ("query_id",)),
]
CASES += RANGE_AND_SHAPE_CASES


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


def test_huge_row_count_is_refused_before_commit_and_nothing_commits(limited):
    """Issue 13 item 4: numRecords beyond int64 made Commit, its retry, the replay's Open and
    GetTransaction answer INTERNAL after COMMITTED. Now it is refused at prewrite and commit,
    nothing commits, and every RPC about the transaction answers."""
    daemon, _ = limited
    stub, pipeline = daemon.stub, unique("huge-rows")
    table = str(daemon.warehouse / f"t-{pipeline}")
    txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=7),
                               timeout=30).transaction
    huge = table_write(table, txn.txn_id)
    huge.add_files[0].stats = _stats(2**63)
    expect_status(stub.Prewrite, pb.PrewriteRequest(txn_id=txn.txn_id, writes=[huge]), IA,
                  "numRecords")
    commit = pb.CommitTransactionRequest(txn_id=txn.txn_id, tables=[table], writes=[huge])
    expect_status(stub.CommitTransaction, commit, IA, "numRecords")
    expect_status(stub.CommitTransaction, commit, IA, "numRecords")  # the retry: same answer

    got = stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id, include_writes=True),
                              timeout=30)
    assert got.state == pb.OPEN and not any(p.prewritten for p in got.participants)
    replay = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=7),
                                  timeout=30)
    assert not replay.already_committed and replay.transaction.txn_id != txn.txn_id
    listed = stub.ListTransactions(pb.ListTransactionsRequest(pipeline_id=pipeline), timeout=30)
    assert [t.state for t in listed.transactions] == [pb.ABORTED, pb.OPEN]


def test_largest_accepted_row_count_commits_and_every_reply_carries_it(limited):
    """The bound is no lower than it must be: a write summing to exactly int64's maximum is
    accepted, and Commit, its retry and GetTransaction all report that row count."""
    daemon, _ = limited
    stub, pipeline = daemon.stub, unique("max-rows")
    table = str(daemon.warehouse / f"t-{pipeline}")
    txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline), timeout=30)
    txn_id = txn.transaction.txn_id
    per_file = 2**53 - 1
    files = [add_file(txn_id, f"p{i}.parquet", stats=_stats(per_file)) for i in range(32)]
    for file in files:  # the coordinator checks each file exists with its stated size
        on_disk = Path(table) / file.path
        on_disk.parent.mkdir(parents=True, exist_ok=True)
        on_disk.write_bytes(b"x" * file.size)
    write = table_write(table, txn_id)
    write.ClearField("add_files")
    write.add_files.extend(files)
    commit = pb.CommitTransactionRequest(txn_id=txn_id, tables=[table], writes=[write])
    first = stub.CommitTransaction(commit, timeout=30).transaction
    again = stub.CommitTransaction(commit, timeout=30).transaction
    got = stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn_id), timeout=30)
    for reply in (first, again, got):
        assert reply.state == pb.COMMITTED
        assert reply.participants[0].row_count == 32 * per_file


def test_bad_heartbeat_timeout_never_reaches_heartbeat(limited):
    """A timeout beyond int64 milliseconds made Heartbeat answer INTERNAL; the largest
    accepted timeout (serve --max-txn-timeout, 3600 s by default) is answered in full."""
    daemon, _ = limited
    stub = daemon.stub
    expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=unique("hb"), timeout_ms=INT64_MAX), RE, "timeout_ms")
    most = 3600 * 1000
    txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=unique("hb"),
                                                         timeout_ms=most), timeout=30)
    beat = stub.Heartbeat(pb.HeartbeatRequest(txn_id=txn.transaction.txn_id), timeout=30)
    assert beat.state == pb.OPEN and beat.expires_in_ms == most


def test_reasons_keep_their_text_but_lose_invisible_characters(limited, case):
    """Abort reasons come from exception messages: never refused for their characters (an
    abort must not fail), but direction-changing and invisible ones are replaced."""
    daemon, _ = limited
    reason = "ValueError: bad row\n\tat line 3 \u202egnp.exe\u200b"
    reply = daemon.stub.AbortTransaction(pb.AbortTransactionRequest(
        txn_id=case.txn_id, reason=reason), timeout=30)
    assert reply.transaction.abort_reason == "ValueError: bad row\n\tat line 3 \ufffdgnp.exe\ufffd"


def test_a_repeated_state_filter_is_answered(limited, case):
    """Each listed state became one SQL parameter: a long repeated list is one filter."""
    daemon, _ = limited
    reply = daemon.stub.ListTransactions(pb.ListTransactionsRequest(
        pipeline_id=case.pipeline, states=[pb.OPEN] * 50_000), timeout=30)
    assert [t.txn_id for t in reply.transactions] == [case.txn_id]


def _identity(data: bytes) -> bytes:
    return data


COORDINATOR = pb.DESCRIPTOR.services_by_name["Coordinator"]
NOT_PROTOBUF = [b"\xff\xff\xff\xff",  # not a field tag
                b"\x0a\x05ab",  # a string field shorter than its length
                b"\x0a\x02\xc3\x28",  # a string field that is not UTF-8
                b"\x08" + b"\xff" * 11]  # a varint longer than ten bytes


@pytest.mark.parametrize("method", [m.name for m in COORDINATOR.methods])
def test_request_bytes_that_are_not_protobuf_are_invalid_argument(limited, method):
    """grpcio answers INTERNAL when a request does not parse; the daemon answers
    INVALID_ARGUMENT naming the method, and keeps serving."""
    daemon, _ = limited
    with grpc.insecure_channel(daemon.target) as channel:
        call = channel.unary_unary(f"/{COORDINATOR.full_name}/{method}",
                                   request_serializer=_identity,
                                   response_deserializer=_identity)
        for raw in NOT_PROTOBUF:
            details = expect_status(call, raw, IA, method)
            assert "protobuf" in details.lower()
    assert daemon.is_running()


def test_health_request_bytes_that_are_not_protobuf_are_invalid_argument(limited):
    daemon, _ = limited
    with grpc.insecure_channel(daemon.target) as channel:
        call = channel.unary_unary("/grpc.health.v1.Health/Check",
                                   request_serializer=_identity, response_deserializer=_identity)
        expect_status(call, b"\xff\xff", IA, "Check")


def _commit_with_files(stub: Any, table: Path, txn_id: str) -> pb.Transaction:
    """Commits one 100-byte file to ``table`` (the file exists: the write check stats it)."""
    write = table_write(str(table), txn_id)
    folder = table / "_percolake" / txn_id
    folder.mkdir(parents=True, exist_ok=True)
    (table / write.add_files[0].path).write_bytes(b"x" * write.add_files[0].size)
    return stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=txn_id, tables=[str(table)], writes=[write]), timeout=30).transaction


def test_a_batch_committed_after_a_higher_batch_still_applies(limited):
    """Found by scripts/fuzz.py: batch 3 committed after batch 5 (a client without epochs,
    or a checkpoint restored from a backup) is COMMITTED, then its apply skips it as already
    there (app version 5 >= 3) and fails: the table stays held and every RPC touching it
    answers INTERNAL. Either the commit is refused up front or it applies."""
    daemon, _ = limited
    stub, pipeline = daemon.stub, unique("order")
    table = daemon.warehouse / f"t-{pipeline}"
    newer = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=5),
                                 timeout=30).transaction
    _commit_with_files(stub, table, newer.txn_id)
    stub.GetSnapshot(pb.GetSnapshotRequest(tables=[str(table)]), timeout=60)
    older = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=3),
                                 timeout=30).transaction
    try:
        _commit_with_files(stub, table, older.txn_id)
    except grpc.RpcError as exc:
        assert exc.code() == FP, exc
        return
    stub.GetSnapshot(pb.GetSnapshotRequest(tables=[str(table)]), timeout=60)
    got = stub.GetTransaction(pb.GetTransactionRequest(txn_id=older.txn_id), timeout=30)
    assert got.state == pb.APPLIED


@pytest.mark.parametrize("name", ["tab\tx", "nl\nx", "del\x7fx", "back\\slash"])
def test_table_names_delta_cannot_open_are_refused(limited, case, name):
    """Found by scripts/fuzz.py: such a table is declared, prewritten and COMMITTED, then
    its apply fails for ever (delta-rs refuses control characters in a path; it reads a
    backslash as a separator, so ``a\\b`` is opened as ``a/b``, another table)."""
    daemon, _ = limited
    expect_status(daemon.stub.DeclareTables, case.declare(f"{case.warehouse}/{name}"), IA)
