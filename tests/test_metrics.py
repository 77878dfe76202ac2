"""Prometheus metrics (serve --metrics-port, docs/metrics.md): scraped over HTTP from a real
daemon before and after real requests; each counter must move by exactly what was done."""

from __future__ import annotations

import socket
import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import report_applied, table_write, unique, wait_for

# every label name the exposition may carry; pipeline only on the per-pipeline gauge
ALLOWED_LABELS = {"method", "code", "state", "reason", "outcome", "pipeline", "table", "le"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def served(daemon_factory):
    port = _free_port()
    # --shared-table-writers: pipelines of their own wait for one table (the table wait metric)
    daemon = daemon_factory.start(["--metrics-port", str(port), "--roll-forward-after", "3600",
                                   "--conflict-wait", "1", "--shared-table-writers"],
                                  name="metrics")
    daemon.metrics_url = f"http://127.0.0.1:{port}/metrics"
    wait_for(lambda: _reachable(daemon.metrics_url), 15, "the metrics endpoint")
    yield daemon
    daemon.stop()


def _reachable(url: str) -> bool:
    try:
        return bool(scrape_text(url))
    except OSError:
        return False


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        return reply.read().decode()


class Scrape:
    """One scrape, parsed: ``value(sample_name, **labels)`` (0 when the series is absent)."""

    def __init__(self, url: str) -> None:
        self.text = scrape_text(url)
        self.samples = [s for family in text_string_to_metric_families(self.text)
                        for s in family.samples]

    def value(self, name: str, **labels: str) -> float:
        found = [s.value for s in self.samples
                 if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        return sum(found)

    def series(self, name: str) -> list:
        return [s for s in self.samples if s.name == name]


def _batch(stub, daemon, pipeline: str) -> str:
    """open, prewrite, commit, apply and report one table: the participant's batch."""
    table = str(daemon.warehouse / unique("t"))
    txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=0),
                               timeout=30).transaction
    stub.Prewrite(pb.PrewriteRequest(txn_id=txn.txn_id,
                                     writes=[table_write(table, txn.txn_id)]), timeout=30)
    committed = stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=txn.txn_id),
                                       timeout=30).transaction
    assert committed.state == pb.COMMITTED
    assert report_applied(stub, txn.txn_id).state == pb.APPLIED
    return txn.txn_id


def test_a_batch_moves_each_counter_by_its_calls(served):
    pipeline = unique("metrics")
    before = Scrape(served.metrics_url)
    _batch(served.stub, served, pipeline)
    after = Scrape(served.metrics_url)

    def moved(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    for method in ("OpenTransaction", "Prewrite", "CommitTransaction", "ReportApplied",
                   "GetTransaction"):
        assert moved("percolake_rpcs_total", method=method, code="OK") == 1, method
        assert moved("percolake_rpc_duration_seconds_count", method=method) == 1, method
    for state in ("OPEN", "PREWRITTEN", "COMMITTED", "APPLIED"):
        assert moved("percolake_transaction_transitions_total", state=state) == 1, state
    assert moved("percolake_transaction_transitions_total", state="ABORTED") == 0
    assert moved("percolake_commit_latency_seconds_count") == 1
    assert moved("percolake_refused_requests_total") == 0
    # every answer waited for durability once (I8): the five calls above at least
    assert moved("percolake_store_flush_duration_seconds_count") >= 5
    assert after.value("percolake_leader") == 1
    since = after.value("percolake_pipeline_seconds_since_last_commit", pipeline=pipeline)
    assert [s.labels for s in after.series("percolake_pipeline_seconds_since_last_commit")
            if s.labels["pipeline"] == pipeline], "no gauge for the pipeline that committed"
    assert 0 <= since < 60
    # nothing left unfinished by this batch
    assert after.value("percolake_transactions", state="COMMITTED") == 0


def test_a_refused_request_is_counted_by_its_reason_and_status(served):
    before = Scrape(served.metrics_url)
    missing = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(grpc.RpcError) as refused:
        served.stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=missing, reason="x"),
                                     timeout=30)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    after = Scrape(served.metrics_url)
    assert (after.value("percolake_refused_requests_total", reason="NotFound")
            - before.value("percolake_refused_requests_total", reason="NotFound")) == 1
    assert (after.value("percolake_rpcs_total", method="AbortTransaction", code="NOT_FOUND")
            - before.value("percolake_rpcs_total", method="AbortTransaction",
                           code="NOT_FOUND")) == 1


def test_a_live_transaction_ages_and_its_abort_is_counted_as_requested(served):
    stub = served.stub
    idle = Scrape(served.metrics_url)
    assert idle.value("percolake_oldest_live_transaction_age_seconds") == 0
    txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id=unique("aging"),
                                                         batch_id=0), timeout=30).transaction
    time.sleep(0.3)
    live = Scrape(served.metrics_url)
    assert live.value("percolake_transactions", state="OPEN") == 1
    assert live.value("percolake_oldest_live_transaction_age_seconds") >= 0.2
    stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=txn.txn_id, reason="operator"),
                          timeout=30)
    done = Scrape(served.metrics_url)
    assert done.value("percolake_transactions", state="OPEN") == 0
    assert done.value("percolake_oldest_live_transaction_age_seconds") == 0
    assert (done.value("percolake_aborts_total", reason="requested")
            - live.value("percolake_aborts_total", reason="requested")) == 1
    assert (done.value("percolake_transaction_transitions_total", state="ABORTED")
            - live.value("percolake_transaction_transitions_total", state="ABORTED")) == 1


def test_roll_forward_unapplied_age_and_table_wait_are_counted(served):
    stub = served.stub
    table = str(served.warehouse / unique("held"))

    def open_on_table(pipeline: str) -> pb.Transaction:
        return stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=0, tables=[table]), timeout=30).transaction

    first = open_on_table(unique("first"))
    stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=first.txn_id, writes=[table_write(table, first.txn_id)]), timeout=30)
    time.sleep(0.3)
    unapplied = Scrape(served.metrics_url)
    assert unapplied.value("percolake_transactions", state="COMMITTED") == 1
    assert unapplied.value("percolake_oldest_committed_transaction_age_seconds") >= 0.2

    second = open_on_table(unique("second"))  # rolls the first forward to take the table
    rolled = Scrape(served.metrics_url)
    assert (rolled.value("percolake_roll_forwards_total", outcome="ok")
            - unapplied.value("percolake_roll_forwards_total", outcome="ok")) == 1
    assert rolled.value("percolake_transactions", state="COMMITTED") == 0
    assert rolled.value("percolake_oldest_committed_transaction_age_seconds") == 0

    with pytest.raises(grpc.RpcError) as conflict:  # the second holds it: wait 1 s, give up
        open_on_table(unique("third"))
    assert conflict.value.code() == grpc.StatusCode.ABORTED, conflict.value.details()
    waited = Scrape(served.metrics_url)
    assert (waited.value("percolake_table_hold_wait_seconds_count")
            - rolled.value("percolake_table_hold_wait_seconds_count")) == 1
    assert (waited.value("percolake_table_hold_wait_seconds_sum")
            - rolled.value("percolake_table_hold_wait_seconds_sum")) >= 0.9
    assert (waited.value("percolake_refused_requests_total", reason="Conflict")
            - rolled.value("percolake_refused_requests_total", reason="Conflict")) == 1
    stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=second.txn_id, reason="done"),
                          timeout=30)


def test_labels_are_bounded_and_name_no_transaction(served):
    txn_id = _batch(served.stub, served, unique("bounded"))
    scrape = Scrape(served.metrics_url)
    assert txn_id not in scrape.text
    percolake = [s for s in scrape.samples if s.name.startswith("percolake_")]
    assert percolake, "no percolake_ metrics in the exposition"
    extra = {k for s in percolake for k in s.labels} - ALLOWED_LABELS
    assert not extra, f"unexpected label names {extra}"
    pipelines = {s.name for s in percolake if "pipeline" in s.labels}
    assert pipelines == {"percolake_pipeline_seconds_since_last_commit",
                         "percolake_pipeline_own_delay_seconds",
                         "percolake_pipeline_end_to_end_delay_seconds"}
    tables = {s.name for s in percolake if "table" in s.labels}  # one series per table
    assert tables == {"percolake_table_delay_seconds"}


def test_a_standby_exports_leader_zero_and_no_core_gauges():
    from prometheus_client import CollectorRegistry, generate_latest

    from coordinator.metrics import CoreCollector

    registry = CollectorRegistry()
    registry.register(CoreCollector(lambda: None))  # what a standby's server provides
    samples = [s for family in text_string_to_metric_families(generate_latest(registry).decode())
               for s in family.samples]
    assert [(s.name, s.value) for s in samples] == [("percolake_leader", 0)]
