"""``percolake-coordinator optimize --table T [--where PREDICATE]``: compaction of a table's
small files as a percolake transaction (docs/operations.md), so users need no outside writer
for maintenance.

The command is the transaction's participant, as a Spark driver is for a batch: it opens a
transaction of the table's pipeline ``percolake.optimize.<hash>`` declaring the table (so it
waits for, and then holds off, every other percolake transaction on it), reads the small files
of the table (or of the partitions ``--where`` selects) with pyarrow, writes the compacted files
into the attempt's folder, and commits them as a ``ROW_LEVEL`` write with operation
``OPTIMIZE`` and ``data_change=False``; the coordinator checks it against the table's log
before the commit point (an outside commit since the read aborts it) and applies it. Any
failure before the commit aborts the attempt and its files are deleted; after it, the
coordinator applies it.

Exit status: 0 done (or nothing to compact), 1 the coordinator refused (its status and message
on stderr, e.g. ABORTED when another transaction held the table for --conflict-wait), 2 bad
arguments or unusable client settings."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from typing import TYPE_CHECKING, Any

import grpc

from coordinator.cli.client import Call, add_common_arguments, run_calls
from percolake import codec
from percolake.errors import InvalidArgument, ProtocolError
from percolake.lake.defaults import DEFAULT_TARGET_SIZE
from percolake.lake.warehouse import canonical_table_uri
from percolake.v1 import coordinator_pb2 as pb

if TYPE_CHECKING:
    from percolake.lake.compaction import Plan

HEARTBEAT_S = 5.0
OPEN_ATTEMPTS = 5  # batch ids taken by concurrent optimize runs meanwhile


def add_command(commands: Any, default_target: str) -> None:
    """Adds ``optimize`` to the top-level subparsers."""
    optimize = commands.add_parser(
        "optimize", help="compact a table's small files as a percolake transaction",
        description="Compact the small files of a Delta table (all of them, or those of the "
        "partitions --where selects) into files of up to --target-size bytes, as a "
        "transaction of the table's own pipeline percolake.optimize.<hash>: it holds the "
        "table like any transaction, and its commit (a ROW_LEVEL write, operation OPTIMIZE, "
        "dataChange=false) is exactly once. Needs WRITE on the pipelines "
        "percolake.optimize.* and on the table when the coordinator authenticates callers "
        "(docs/operations.md).")
    optimize.add_argument("--table", required=True, help="the table's URI or path")
    optimize.add_argument("--where", default="",
                          help="a partition predicate: column = 'value' (also != <> < <= > "
                          ">=), column IN ('a', 'b'), column IS [NOT] NULL, joined by AND; "
                          "only partition columns")
    optimize.add_argument("--target-size", type=_positive, default=DEFAULT_TARGET_SIZE,
                          help="the largest compacted file, in bytes; files at least this "
                          f"large are left alone (default {DEFAULT_TARGET_SIZE})")
    add_common_arguments(optimize, default_target)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of bytes: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    from percolake.lake import compaction  # pyarrow and delta-rs: only when optimizing

    if args.where.strip():  # a bad predicate is refused before anything is sent
        try:
            compaction.check_where(args.table, args.where)
        except ProtocolError as exc:
            print(f"optimize failed: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, InvalidArgument) else 1

    def work(call: Call) -> str:
        result = optimize(call, args.table, args.where, args.target_size)
        return json.dumps(result) if args.json else render(result)

    try:
        return run_calls("optimize", args, work)
    except (ProtocolError, Refused) as exc:  # a table optimize cannot rewrite, or busy ids
        print(f"optimize failed: {exc}", file=sys.stderr)
        return 1


class Refused(Exception):
    """The command gave up without a coordinator's refusal to show."""


def optimize(call: Call, table: str, where: str, target_size: int) -> dict[str, Any]:
    """One compaction transaction; returns what it did (see ``render``)."""
    from percolake.lake import compaction

    txn, location = _open(call, table)
    beating = threading.Event()
    heart = threading.Thread(target=_heartbeat, args=(call, txn.txn_id, beating), daemon=True)
    heart.start()
    try:
        plan = compaction.plan(location.table, where, target_size)
        if not plan.groups:
            _abort(call, txn.txn_id, "optimize: nothing to compact")
            return _result(location.table, txn.txn_id, plan, None, None)
        folder = location.write_location[len(location.table):].lstrip("/")
        write = compaction.rewrite(location.table, plan, folder, where)
        _commit(call, txn.txn_id, location.table, write)
    except BaseException as exc:
        beating.set()
        _abort(call, txn.txn_id, f"optimize failed before its commit: {exc}"[:900])
        raise
    finally:
        beating.set()
    snapshot = call("GetSnapshot", pb.GetSnapshotRequest(tables=[location.table]))
    return _result(location.table, txn.txn_id, plan, write, snapshot.tables[0].delta_version)


def _commit(call: Call, txn_id: str, table: str, write: Any) -> None:
    """The commit; when its answer is lost (the coordinator failed after the commit point,
    or no leader answered in time), the transaction's state decides: committed is done."""
    try:
        call("CommitTransaction", pb.CommitTransactionRequest(
            txn_id=txn_id, tables=[table], writes=[codec.table_write_to_pb(write)]))
    except grpc.RpcError as exc:
        if exc.code() in _REFUSALS:
            raise
        state = call("GetTransaction", pb.GetTransactionRequest(txn_id=txn_id)).state
        if state not in (pb.COMMITTED, pb.APPLIED):
            raise


_REFUSALS = (grpc.StatusCode.ABORTED, grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
             grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND)


def _open(call: Call, table: str) -> tuple[pb.Transaction, pb.TableLocation]:
    from coordinator.core.optimizing import optimize_pipeline

    pipeline_id = optimize_pipeline(canonical_table_uri(table))
    try:
        pipeline = call("GetPipeline", pb.GetPipelineRequest(pipeline_id=pipeline_id))
        batch = pipeline.last_committed_batch_id + 1 \
            if pipeline.HasField("last_committed_batch_id") else 0
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        batch = 0
    for _ in range(OPEN_ATTEMPTS):
        reply = call("OpenTransaction", pb.OpenTransactionRequest(
            pipeline_id=pipeline_id, batch_id=batch, tables=[table]))
        if not reply.already_committed:
            return reply.transaction, reply.locations[0]
        batch += 1  # another optimize run committed this batch id meanwhile
    raise Refused(f"{OPEN_ATTEMPTS} batch ids of {pipeline_id} were taken by other "
                   "optimize runs meanwhile; run it again")


def _heartbeat(call: Call, txn_id: str, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        try:
            call("Heartbeat", pb.HeartbeatRequest(txn_id=txn_id))
        except grpc.RpcError:
            return  # the commit or the abort answers for the transaction


def _abort(call: Call, txn_id: str, reason: str) -> None:
    # on failure it expires without heartbeats, and its files are deleted then
    with contextlib.suppress(grpc.RpcError):
        call("AbortTransaction", pb.AbortTransactionRequest(txn_id=txn_id, reason=reason))


def _result(table: str, txn_id: str, plan: Plan, write: Any,
            version: int | None) -> dict[str, Any]:
    return {"table": table, "txn_id": txn_id, "read_version": plan.version,
            "delta_version": version, "files_removed": len(plan.removed),
            "files_added": 0 if write is None else len(write.add_files),
            "bytes_removed": sum(f.size for f in plan.removed),
            "bytes_added": 0 if write is None else sum(f.size for f in write.add_files),
            "partitions_optimized": plan.partitions, "files_considered": plan.considered}


def render(result: dict[str, Any]) -> str:
    if result["delta_version"] is None:
        return (f"{result['table']}: nothing to compact at version {result['read_version']} "
                f"({result['files_considered']} file(s) considered)")
    return (f"{result['table']}: compacted {result['files_removed']} file(s) "
            f"({result['bytes_removed']} bytes) into {result['files_added']} "
            f"({result['bytes_added']} bytes) in {result['partitions_optimized']} "
            f"partition(s); Delta version {result['delta_version']} (transaction "
            f"{result['txn_id']}, read at version {result['read_version']})")
