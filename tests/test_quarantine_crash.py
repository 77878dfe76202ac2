"""Issue 32's crash test (I10, I12): the coordinator is killed between its commit point and the
tables' Delta commits of a row-level write, an outside OPTIMIZE (delta-rs compaction) runs on
the tables, and the coordinator restarts. Never a lost or duplicated row: the table whose
compaction removed the file the write replaces ends quarantined (shown by find-hanging, the
metrics and the web view, refusing new commits naming the recovery command) and the table
compacted elsewhere ends applied exactly; the operator's abandon then frees the first."""

from __future__ import annotations

import json
import socket
import urllib.request

import grpc
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from percolake import codec
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import canonical, wait_for
from tests.quarantine_support import (
    BEFORE,
    UPDATED,
    partitioned_table,
    table_rows,
    update_partition_a,
)
from tests.test_ops_cli import cli


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as reply:  # noqa: S310 - loopback only
        return reply.read().decode()


def test_a_kill_between_commit_and_apply_then_outside_optimize_never_loses_or_doubles_rows(
        daemon_factory, tmp_path):
    warehouse, data = tmp_path / "warehouse", tmp_path / "data"
    warehouse.mkdir()
    broken, exact = warehouse / "broken", warehouse / "exact"
    partitioned_table(broken)
    partitioned_table(exact)
    write_deltalake(str(broken), pa.table({"id": pa.array([5], pa.int64()),
                                           "value": pa.array([50], pa.int64()),
                                           "part": ["a"]}), partition_by=["part"], mode="append")
    metrics_port, http_port = _free_port(), _free_port()
    daemon = daemon_factory.start(
        ["--roll-forward-after", "1", "--metrics-port", str(metrics_port),
         "--http-port", str(http_port)], warehouse=warehouse, data_dir=data,
        env={"PERCOLAKE_FAILPOINTS": "after-commit-durable-before-reply=exit"})
    stub = daemon.stub
    txn_id = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="merge", batch_id=0),
                                  timeout=30).transaction.txn_id
    tables = [canonical(broken), canonical(exact)]
    stub.DeclareTables(pb.DeclareTablesRequest(txn_id=txn_id, tables=tables), timeout=30)
    writes = [codec.table_write_to_pb(update_partition_a(path, txn_id))
              for path in (broken, exact)]
    with pytest.raises(grpc.RpcError):  # the coordinator dies right after its commit point
        stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn_id, tables=tables,
                                                           writes=writes), timeout=30)
    wait_for(lambda: not daemon.is_running(), 30, "the coordinator to die at the failpoint")
    before_broken = sorted([*BEFORE, (5, 50, "a")])
    assert table_rows(broken) == before_broken and table_rows(exact) == BEFORE

    # the outside OPTIMIZE: of the partition the write replaces a file of, and of another one
    DeltaTable(str(broken)).optimize.compact(partition_filters=[("part", "=", "a")])
    DeltaTable(str(exact)).optimize.compact(partition_filters=[("part", "=", "b")])

    daemon.start(env={"PERCOLAKE_FAILPOINTS": ""})
    stub = daemon.stub

    def state() -> pb.Transaction:
        return stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn_id), timeout=30)

    wait_for(lambda: len(stub.ListQuarantines(pb.ListQuarantinesRequest(), timeout=30)
                         .quarantines) == 1
             and any(p.applied for p in state().participants), 60,
             "the roll-forward to apply one table and quarantine the other")
    assert table_rows(exact) == UPDATED  # still exact: applied once
    assert table_rows(broken) == before_broken  # not applied against other data
    assert {p.table: p.applied for p in state().participants} == {
        tables[0]: False, tables[1]: True}
    assert state().state == pb.COMMITTED

    # refused before the commit point, naming why and the way out
    nxt = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="merge", batch_id=1),
                               timeout=30).transaction.txn_id
    with pytest.raises(grpc.RpcError) as refused:
        stub.DeclareTables(pb.DeclareTablesRequest(txn_id=nxt, tables=[tables[0]]), timeout=30)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is quarantined" in refused.value.details()
    assert "OPTIMIZE" in refused.value.details()
    assert "tables release-quarantine" in refused.value.details()
    stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=nxt, reason="refused"), timeout=30)

    # shown by find-hanging, the metrics and the web view
    hanging = cli("transactions", "find-hanging", "--target", daemon.target)
    assert hanging.returncode == 0, hanging.stderr
    assert f"QUARANTINED {tables[0]} (transaction {txn_id}" in hanging.stdout
    assert (f"tables release-quarantine --table {tables[0]} --txn {txn_id}"
            in hanging.stdout)
    listed = json.loads(cli("transactions", "find-hanging", "--json", "--target",
                            daemon.target).stdout)
    assert [q["table"] for t in listed for q in t["quarantined"]] == [tables[0]]
    assert "percolake_quarantined_tables 1.0" in _get(f"http://127.0.0.1:{metrics_port}/metrics")
    web = json.loads(_get(f"http://127.0.0.1:{http_port}/api/hanging"))
    assert [q["txn_id"] for t in web["transactions"] for q in t["quarantined"]] == [txn_id]
    assert "Quarantined tables" in _get(f"http://127.0.0.1:{http_port}/hanging")

    # the operator's choice: reapply is unsafe here (named), abandon frees the table
    unsafe = cli("tables", "release-quarantine", "--table", str(broken), "--txn", txn_id,
                 "--choice", "reapply", "--reason", "try", "--target", daemon.target)
    assert unsafe.returncode == 1 and "Choose abandon" in unsafe.stderr
    released = cli("tables", "release-quarantine", "--table", str(broken), "--txn", txn_id,
                   "--choice", "abandon", "--reason", "batch 0's update re-run by hand",
                   "--json", "--target", daemon.target)
    assert released.returncode == 0, released.stderr
    record = json.loads(released.stdout)
    assert (record["choice"], record["choice_reason"], record["released"] is not None) == (
        "abandon", "batch 0's update re-run by hand", True)
    assert state().state == pb.APPLIED
    assert table_rows(broken) == before_broken
    described = json.loads(cli("transactions", "describe", txn_id, "--json", "--target",
                               daemon.target).stdout)
    assert {t["table"]: t["abandoned"] for t in described["tables"]} == {
        tables[0]: True, tables[1]: False}
    assert "percolake_quarantined_tables 0.0" in _get(f"http://127.0.0.1:{metrics_port}/metrics")
    kept = json.loads(cli("tables", "quarantined", "--all", "--json", "--target",
                          daemon.target).stdout)
    assert [(q["txn_id"], q["choice"]) for q in kept] == [(txn_id, "abandon")]
    assert cli("tables", "quarantined", "--target", daemon.target).stdout.strip() == \
        "no quarantined table"
    later = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="merge", batch_id=1),
                                 timeout=30).transaction.txn_id
    stub.DeclareTables(pb.DeclareTablesRequest(txn_id=later, tables=[tables[0]]), timeout=30)
    daemon.stop()
