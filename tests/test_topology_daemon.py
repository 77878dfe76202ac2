"""The topology over gRPC and the CLI (docs/topology.md), against a real daemon: a second
writer and a cycle refused with FAILED_PRECONDITION naming the owner or the cycle, GetTopology's
contents, a root table's completed barrier advancing, and ``percolake-coordinator topology``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from percolake.barriers import LOGICAL_BITS, barrier_at_or_below
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import (
    apply_all,
    canonical,
    expect_status,
    table_write,
    unique,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
INTERVAL_S = 0.2


@pytest.fixture(scope="module")
def topology_daemon(daemon_factory):
    daemon = daemon_factory.start(["--barrier-interval", str(INTERVAL_S)], name="topology")
    yield daemon
    daemon.stop()


@pytest.fixture
def stub(topology_daemon):
    return topology_daemon.stub


def table_in(daemon, name: str) -> str:
    return canonical(daemon.warehouse / unique(name))


def open_with(stub, pipeline: str, tables: list[str], batch: int = 0) -> pb.Transaction:
    return stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=batch, tables=tables), timeout=30).transaction


def commit_and_apply(stub, txn: pb.Transaction, table: str) -> None:
    stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=txn.txn_id, tables=[table], writes=[table_write(table, txn.txn_id)]), timeout=30)
    versions = apply_all(stub, txn.txn_id)
    stub.ReportApplied(pb.ReportAppliedRequest(txn_id=txn.txn_id, tables=[
        pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()]), timeout=30)


def topology(stub) -> pb.GetTopologyResponse:
    return stub.GetTopology(pb.GetTopologyRequest(), timeout=30)


def test_a_second_writing_pipeline_is_refused_naming_the_owner(stub, topology_daemon):
    bank, ledger = unique("bank"), unique("ledger")
    debits = table_in(topology_daemon, "debits")
    open_with(stub, bank, [debits])
    expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=ledger, batch_id=0, tables=[debits]), FAILED_PRECONDITION,
        debits, f"pipeline '{bank}'", "--shared-table-writers")
    txn = open_with(stub, ledger, [])
    expect_status(stub.DeclareTables, pb.DeclareTablesRequest(
        txn_id=txn.txn_id, tables=[debits]), FAILED_PRECONDITION, f"pipeline '{bank}'")


def test_a_read_closing_a_cycle_is_refused_naming_the_cycle(stub, topology_daemon):
    bank, ledger = unique("bank"), unique("ledger")
    debits, x = table_in(topology_daemon, "debits"), table_in(topology_daemon, "x")
    open_with(stub, bank, [debits])
    reply = stub.RegisterReads(pb.RegisterReadsRequest(pipeline_id=ledger, tables=[debits]),
                               timeout=30)
    assert list(reply.tables) == [debits] and reply.added == 1
    again = stub.RegisterReads(pb.RegisterReadsRequest(pipeline_id=ledger, tables=[debits]),
                               timeout=30)
    assert again.added == 0  # idempotent
    open_with(stub, ledger, [x])
    expect_status(stub.RegisterReads, pb.RegisterReadsRequest(pipeline_id=bank, tables=[x]),
                  FAILED_PRECONDITION, f"{bank} -> {debits} -> {ledger} -> {x} -> {bank}")


def test_register_reads_refuses_no_tables_and_tables_outside_the_warehouse(stub):
    expect_status(stub.RegisterReads, pb.RegisterReadsRequest(pipeline_id="p", tables=[]),
                  grpc.StatusCode.INVALID_ARGUMENT, "at least one table")
    expect_status(stub.RegisterReads, pb.RegisterReadsRequest(
        pipeline_id="p", tables=["/elsewhere/t"]), grpc.StatusCode.PERMISSION_DENIED)


def test_get_topology_shows_pipelines_tables_edges_and_a_root_barrier_advancing(
        stub, topology_daemon):
    bank, ledger = unique("bank"), unique("ledger")
    debits, out = table_in(topology_daemon, "debits"), table_in(topology_daemon, "ledger")
    txn = open_with(stub, bank, [debits])
    commit_and_apply(stub, txn, debits)
    stub.RegisterReads(pb.RegisterReadsRequest(pipeline_id=ledger, tables=[debits]), timeout=30)
    open_with(stub, ledger, [out])
    first = topology(stub)
    assert first.barrier_interval_ms == INTERVAL_S * 1000
    assert first.now_unix_ms == first.now_ts >> LOGICAL_BITS
    pipelines = {p.pipeline_id: p for p in first.pipelines}
    assert (pipelines[bank].root, list(pipelines[bank].reads), list(pipelines[bank].writes)) \
        == (True, [], [debits])
    assert (pipelines[ledger].root, list(pipelines[ledger].reads),
            list(pipelines[ledger].writes)) == (False, [debits], [out])
    edges = {(e.pipeline_id, e.table, e.kind) for e in first.edges}
    assert {(bank, debits, pb.EDGE_WRITES), (ledger, debits, pb.EDGE_READS),
            (ledger, out, pb.EDGE_WRITES)} <= edges
    tables = {t.table: t for t in first.tables}
    root = tables[debits]
    assert (root.writer, list(root.readers)) == (bank, [ledger])
    assert root.HasField("completed_barrier_ts")
    # its commit is applied: every barrier the oracle passed is complete
    assert root.completed_barrier_ts == barrier_at_or_below(first.now_ts - 1,
                                                            first.barrier_interval_ms)
    assert root.completed_barrier_unix_ms == root.completed_barrier_ts >> LOGICAL_BITS
    assert root.delay_ms == first.now_unix_ms - root.completed_barrier_unix_ms
    # downstream: the root's commit is a change the ledger has not read, so it completed the
    # barriers below that commit only (tests/test_topology_barriers.py has the rule's cases)
    assert tables[out].HasField("completed_barrier_ts")
    commit_ts = stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id)).commit_ts
    assert tables[out].completed_barrier_ts == barrier_at_or_below(
        commit_ts - 1, first.barrier_interval_ms) <= root.completed_barrier_ts
    assert tables[out].delay_ms >= root.delay_ms
    assert tables[out].bottleneck_pipeline in (bank, ledger)
    assert pipelines[ledger].end_to_end_delay_ms == tables[out].delay_ms
    assert pipelines[ledger].own_delay_ms == tables[out].delay_ms - root.delay_ms
    only = stub.GetTopology(pb.GetTopologyRequest(tables=[out]), timeout=30)
    assert [t.table for t in only.tables] == [out]
    assert [p.pipeline_id for p in only.pipelines] == [ledger]
    later = wait_for(lambda: (reply := topology(stub)) and {
        t.table: t for t in reply.tables}[debits].completed_barrier_ts
        > root.completed_barrier_ts and reply, 30, "the root table's barrier to advance")
    assert later.now_ts > first.now_ts


def test_topology_cli_prints_json_and_a_readable_table(stub, topology_daemon):
    bank = unique("bank")
    debits = table_in(topology_daemon, "debits")
    open_with(stub, bank, [debits])
    result = cli("topology", "--target", topology_daemon.target, "--json")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    (pipeline,) = [p for p in shown["pipelines"] if p["pipeline_id"] == bank]
    assert pipeline == {"pipeline_id": bank, "generation": 0, "root": True, "reads": [],
                        "writes": [debits], "own_delay_ms": pipeline["own_delay_ms"],
                        "end_to_end_delay_ms": pipeline["own_delay_ms"],
                        "last_input_barrier_ts": None}
    assert pipeline["own_delay_ms"] >= 0
    (table,) = [t for t in shown["tables"] if t["table"] == debits]
    assert table["writer"] == bank and table["completed_barrier_ts"] is not None
    assert table["delay_ms"] >= 0
    assert table["bottleneck_pipeline"] == bank
    assert table["bottleneck_delay_ms"] == pipeline["own_delay_ms"]
    text = cli("topology", "--target", topology_daemon.target)
    assert text.returncode == 0, text.stderr
    assert bank in text.stdout and debits in text.stdout and "DELAY" in text.stdout
    assert "OWN DELAY" in text.stdout and "END-TO-END" in text.stdout
    assert "BOTTLENECK" in text.stdout


def test_topology_cli_exit_status_when_refused_or_misconfigured(topology_daemon):
    unreachable = cli("topology", "--target", "not-a-target")
    assert unreachable.returncode == 2, unreachable.stderr
    assert "topology failed" in unreachable.stderr


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "coordinator", *args], capture_output=True,
                          text=True, timeout=90, cwd=ROOT, env=env)


