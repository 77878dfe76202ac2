"""Round trips, not requests, on a batch's path on S3: the coordinator's and the participant's
reads of a 3-table batch, counted on a latency relay (``tests/latency_relay.py``, 100 ms per
request) in front of moto's server.

The daemon reaches the store through the relay; the test's own writes and delta-rs applies go
straight to moto, so the relay sees the coordinator's requests alone. In the steady state
(each table's layout cached at the previous batch) a ReportApplied of three tables, or an Open
carrying the applied reports (however many), is one round trip of one GET per reported entry;
the next Commit's write check of three tables one round trip (per table: the cached commit
file, the one after the reported entry, the attempt's listing, all at once; the tables side by
side), never reading the reported entry again; and the participant's schema check reads the
batch's layouts in one round trip, once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from deltalake import Schema

from percolake.lake import storage
from percolake.lake.delta_commit import apply_table_write, open_table
from percolake.lake.table_cache import DeltaTables, TableCache
from percolake.lake.version_checksum import background_written
from percolake.records import TableWriteRecord, WriteMode
from percolake.v1 import coordinator_pb2 as pb
from sparkside.schema_check import SchemaChecker
from tests.daemon_support import apply_all, unique
from tests.latency_relay import LatencyRelay, round_trips
from tests.test_s3_daemon import write_files, write_intent
from tests.test_s3_semantics import SCHEMA, upload

DELAY_S = 0.3  # well above the scheduling delays of a loaded machine (0.1 s was not, in CI)
TABLES = ("debits", "credits", "fees")


@pytest.fixture
def relay(moto_server):  # noqa: ANN001, ANN201 - MotoServer -> LatencyRelay
    with LatencyRelay(moto_server.port, delay_s=DELAY_S) as relay:
        yield relay


def summary(requests) -> list[tuple[str, str]]:  # noqa: ANN001
    return sorted((r.kind, r.target) for r in requests)


def test_a_log_entry_is_read_with_one_get(moto_server, s3_env, s3_bucket, relay, monkeypatch):
    moto_server.put(s3_bucket, "wh/t/_delta_log/00000000000000000000.json", b"{}\n")
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
    assert storage.read_object(f"s3://{s3_bucket}/wh/t/_delta_log/00000000000000000000.json") \
        == b"{}\n"
    assert storage.read_object(f"s3://{s3_bucket}/wh/t/_delta_log/00000000000000000001.json") \
        is None
    assert [r.kind for r in relay.requests()] == ["GET", "GET"]  # no HEAD before either


def s3_daemon(daemon_factory, moto_server, s3_bucket, relay, tmp_path: Path):  # noqa: ANN001, ANN201
    """A daemon that reaches moto through the relay (never rolling forward on its own)."""
    return daemon_factory.start(
        ["--roll-forward-after", "3600", "--txn-timeout", "60"],
        warehouse=f"s3://{s3_bucket}/wh", data_dir=tmp_path / "data",
        env=moto_server.env(AWS_ENDPOINT_URL=relay.endpoint))


def commit_batch(stub, moto_server, relay, pipeline: str, batch: int, tables: list[str],  # noqa: ANN001
                 reports: list[pb.AppliedReport] = ()) -> tuple[pb.Transaction, dict]:  # noqa: ANN001
    """Open (carrying ``reports``), one file per table, Commit, each table applied straight to
    moto as a participant applies it. Returns the transaction, its applied versions and the
    daemon's requests during the Open and during the Commit."""
    relay.reset()
    opened = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=batch, tables=tables, applied_reports=reports),
        timeout=60)
    calls = {"open": relay.requests()}
    locations = {p.table: p.write_location for p in opened.transaction.participants}
    writes = [write_intent(t, write_files(moto_server, locations[t], [batch])) for t in tables]
    relay.reset()
    committed = stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=opened.transaction.txn_id, writes=writes), timeout=60).transaction
    assert committed.state == pb.COMMITTED
    calls["commit"] = relay.requests()
    calls["versions"] = apply_all(stub, committed.txn_id)  # straight to moto
    return committed, calls


def report_of(txn: pb.Transaction, versions: dict[str, int]) -> pb.AppliedReport:
    return pb.AppliedReport(txn_id=txn.txn_id, tables=[
        pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()])


def entry_gets(requests, table: str) -> list[int]:  # noqa: ANN001
    """The versions of ``table``'s log entries the requests read."""
    prefix = f"/{table.split('/', 3)[2]}/{table.split('/', 3)[3]}/_delta_log/"
    return sorted(int(r.target[len(prefix):].split(".")[0]) for r in requests
                  if r.kind == "GET" and r.target.startswith(prefix))


def test_a_batch_of_three_s3_tables_costs_the_coordinator_one_round_trip_per_call(
        daemon_factory, moto_server, s3_env, s3_bucket, relay, tmp_path: Path):
    stub = s3_daemon(daemon_factory, moto_server, s3_bucket, relay, tmp_path).stub
    pipeline = unique("rt")
    tables = [f"s3://{s3_bucket}/wh/{name}" for name in TABLES]
    for batch in range(3):  # batch 0 creates the tables, 1 loads the layouts, 2 is measured
        committed, calls = commit_batch(stub, moto_server, relay, pipeline, batch, tables)
        relay.reset()
        applied = stub.ReportApplied(pb.ReportAppliedRequest(
            txn_id=committed.txn_id, tables=report_of(committed, calls["versions"]).tables),
            timeout=60)
        assert applied.transaction.state == pb.APPLIED
        report = relay.requests()
    # batch 2: per table the cached entry (version 0), the one after the entry batch 1's
    # report read (2, not there yet), the attempt's listing: 9 requests, none waiting for
    # another; entry 1 (batch 1's commit, read by its report) is not read again
    commit = calls["commit"]
    assert all(entry_gets(commit, t) == [0, 2] for t in tables), summary(commit)
    assert len([r for r in commit if r.kind == "LIST"]) == 3, summary(commit)
    assert len(commit) == 9 and round_trips(commit) == 1, summary(commit)
    assert [r.kind for r in report] == ["GET"] * 3 and round_trips(report) == 1, summary(report)
    assert all(entry_gets(report, t) == [2] for t in tables), summary(report)


def test_an_open_carrying_the_applied_report_costs_one_round_trip_and_no_entry_is_read_twice(
        daemon_factory, moto_server, s3_env, s3_bucket, relay, tmp_path: Path):
    """The carried report's case: each Open carries the previous batch's report (never sent
    with ReportApplied): its check reads the reported entries in one round trip, and the
    Commit's write check after it does not read them again."""
    stub = s3_daemon(daemon_factory, moto_server, s3_bucket, relay, tmp_path).stub
    pipeline = unique("carried")
    tables = [f"s3://{s3_bucket}/wh/{name}" for name in TABLES]
    reports: list[pb.AppliedReport] = []
    measured = []
    for batch in range(4):  # batch 0 creates the tables, 1 loads the layouts
        committed, calls = commit_batch(stub, moto_server, relay, pipeline, batch, tables,
                                        reports)
        reports = [report_of(committed, calls["versions"])]
        measured.append(calls)
    for batch in (2, 3):  # the Open carries the report of batch - 1, committed at batch - 1
        opened, commit = measured[batch]["open"], measured[batch]["commit"]
        assert [r.kind for r in opened] == ["GET"] * 3 and round_trips(opened) == 1, \
            summary(opened)
        assert all(entry_gets(opened, t) == [batch - 1] for t in tables), summary(opened)
        assert all(entry_gets(commit, t) == [batch - 2, batch] for t in tables), summary(commit)
        assert len(commit) == 9 and round_trips(commit) == 1, summary(commit)
    state = stub.GetTransaction(pb.GetTransactionRequest(txn_id=reports[0].txn_id), timeout=30)
    assert state.state == pb.COMMITTED  # the last report was never carried: still held


def test_an_open_carrying_several_reports_reads_all_their_entries_in_one_round_trip(
        daemon_factory, moto_server, s3_env, s3_bucket, relay, tmp_path: Path):
    """Two unconfirmed reports (two batches of different tables) ride on one Open: their six
    entries are read side by side, not one report after the other."""
    stub = s3_daemon(daemon_factory, moto_server, s3_bucket, relay, tmp_path).stub
    pipeline = unique("several")
    first = [f"s3://{s3_bucket}/wh/{name}" for name in TABLES]
    second = [f"s3://{s3_bucket}/wh/{name}2" for name in TABLES]
    reports = []
    for batch, tables in enumerate((first, second)):
        committed, calls = commit_batch(stub, moto_server, relay, pipeline, batch, tables)
        reports.append(report_of(committed, calls["versions"]))
    relay.reset()
    opened = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=2, tables=first + second, applied_reports=reports),
        timeout=60)
    read = relay.requests()
    assert len(opened.transaction.participants) == 6
    assert [r.kind for r in read] == ["GET"] * 6 and round_trips(read) == 1, summary(read)
    for report in reports:
        state = stub.GetTransaction(pb.GetTransactionRequest(txn_id=report.txn_id), timeout=30)
        assert state.state == pb.APPLIED


def test_a_report_carried_while_the_same_report_is_checked_reads_its_entries_once(
        daemon_factory, moto_server, s3_env, s3_bucket, relay, tmp_path: Path):
    """The participant sends a batch's report in the background and carries it on the next
    Open until confirmed: when the Open comes while the sent report's entries are being read,
    its check takes those reads instead of reading the entries again."""
    stub = s3_daemon(daemon_factory, moto_server, s3_bucket, relay, tmp_path).stub
    pipeline = unique("raced")
    tables = [f"s3://{s3_bucket}/wh/{name}" for name in TABLES]
    committed, calls = commit_batch(stub, moto_server, relay, pipeline, 0, tables)
    report = report_of(committed, calls["versions"])
    relay.reset()
    sent = stub.ReportApplied.future(pb.ReportAppliedRequest(
        txn_id=committed.txn_id, tables=report.tables), timeout=60)
    deadline = time.monotonic() + 30
    while len(relay.requests()) < 3 and time.monotonic() < deadline:  # its GETs are held
        time.sleep(0.005)
    opened = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=1, tables=tables, applied_reports=[report]),
        timeout=60)
    assert sent.result().transaction.state == pb.APPLIED
    assert len(opened.transaction.participants) == 3
    read = relay.requests()
    assert all(entry_gets(read, t) == [0] for t in tables), summary(read)
    assert len(read) == 3, summary(read)


def test_the_participant_reads_a_batchs_layouts_once_side_by_side(moto_server, s3_env,
                                                                   s3_bucket, relay,
                                                                   monkeypatch):
    tables = [f"s3://{s3_bucket}/wh/{name}" for name in TABLES]

    def commit_all(batch: int) -> None:  # straight to moto, as the previous batch's apply
        for table in tables:
            apply_table_write(TableWriteRecord(
                table, WriteMode.APPEND, (upload(table, f"t{batch}", [batch]),),
                Schema.from_arrow(SCHEMA).to_json(), ("p",)), app_id="a", app_version=batch,
                txn_id=f"t{batch}", commit_ts=batch + 1)
        background_written()  # the version checksums, straight to moto too

    checker = SchemaChecker()
    commit_all(0)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
    first = checker.for_batch(tables)  # loads each layout (delta-rs), cached at version 0
    assert [first.get(t).version for t in tables] == [0, 0, 0]
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    commit_all(1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
    relay.reset()
    layouts = checker.for_batch(tables)
    assert [layouts.get(t).version for t in tables] == [1, 1, 1]
    read = relay.requests()
    assert [r.kind for r in read] == ["GET"] * 9 and round_trips(read) == 1, summary(read)
    assert [layouts.get(t).version for t in tables] == [1, 1, 1]
    assert len(relay.requests()) == 9  # read once per batch: asked again, nothing is read


def test_an_apply_puts_its_entry_and_never_reads_it_back(moto_server, s3_env, s3_bucket, relay,
                                                        monkeypatch):
    """A table's Delta commit as the participant makes it in the steady state (the table kept
    from the previous batch): the kept version's entry and the next one at once (is the log
    still the same, anything new?), then the put-if-absent of its own entry, and nothing more
    on the batch's path: the version is the put's, its entry not read back, so the batch's
    applied report can go at once. A commit made meanwhile by someone else is still seen."""
    table = f"s3://{s3_bucket}/wh/kept"
    kept = TableCache().tables
    schema = Schema.from_arrow(SCHEMA).to_json()
    writes = {batch: TableWriteRecord(table, WriteMode.APPEND,
                                      (upload(table, f"t{batch}", [batch]),), schema, ("p",))
              for batch in range(5)}

    def apply(batch: int, tables: DeltaTables | None = kept, app: str = "a") -> int:
        return apply_table_write(writes[batch], app_id=app, app_version=batch,
                                 txn_id=f"t{batch}", commit_ts=batch + 1, tables=tables)

    assert [apply(0), apply(1)] == [0, 1]  # straight to moto: created, then kept
    background_written()
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
    relay.reset()
    assert apply(2) == 2
    background_written()  # the version checksum: off the batch's path, counted apart
    on_path = [r for r in relay.requests() if not r.target.endswith(".crc")]
    assert entry_gets(on_path, table) == [1, 2], summary(on_path)  # 2: not there yet
    assert [r.kind for r in on_path if r.kind != "GET"] == ["PUT"], summary(on_path)
    assert len(on_path) == 3 and round_trips(on_path) == 2, summary(on_path)
    assert apply(3, tables=None, app="outside") == 3  # another writer's commit
    background_written()
    relay.reset()
    assert apply(4) == 4
    background_written()
    on_path = [r for r in relay.requests() if not r.target.endswith(".crc")]
    assert entry_gets(on_path, table) == [2, 3, 4], summary(on_path)
    table_now = open_table(table)
    assert table_now.transaction_version("a") == 4
    assert table_now.transaction_version("outside") == 3


def test_the_relay_delays_and_counts_each_request_of_every_client(moto_server, s3_env,
                                                                   s3_bucket, monkeypatch):
    """boto3's conditional put, Arrow's multipart upload (create, 2 parts, complete) and a
    read pass through whole, each request held back at least its delay, jitter included."""
    with LatencyRelay(moto_server.port, delay_s=DELAY_S, jitter_s=0.01, seed=7) as relay:
        monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
        uri = f"s3://{s3_bucket}/wh/t/_percolake/a1/big.parquet"
        data = bytes(range(256)) * (12 << 12)  # 12 MiB: Arrow uploads it in two parts
        assert storage.put_object_if_absent(f"s3://{s3_bucket}/wh/t/small", b"x" * 1000)
        with storage.s3_filesystem().open_output_stream(storage.arrow_path(uri)) as out:
            out.write(data)
        assert storage.read_object(uri) == data
        requests = relay.requests()
    assert [(r.method, "uploadId=" in r.target or "uploads" in r.target) for r in requests] \
        == [("PUT", False), ("POST", True), ("PUT", True), ("PUT", True), ("POST", True),
            ("GET", False)], summary(requests)
    assert all(r.answered - r.started >= DELAY_S for r in requests), requests


@pytest.mark.parametrize("piece", [1, 3, 64, 100_000])
def test_the_relay_finds_each_request_however_its_bytes_arrive(piece: int):
    """Keep-alive requests with chunked and Content-Length bodies (a body holding what looks
    like a request line too), cut into pieces of any size."""
    from tests.latency_relay import _RequestReader

    fake = b"GET /b/x HTTP/1.1\r\n\r\n"
    chunked = (b"PUT /b/k HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n" % len(fake) + fake + b"\r\n3;ext=1\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n")
    sized = b"PUT /b/k3 HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(fake) + fake
    plain = b"HEAD /b/k2 HTTP/1.1\r\nHost: x\r\n\r\n"
    stream = chunked + plain + sized + plain
    reader = _RequestReader()
    found = [(method, target) for start in range(0, len(stream), piece)
             for _, method, target in reader.feed(stream[start:start + piece])]
    assert found == [("PUT", "/b/k"), ("HEAD", "/b/k2"), ("PUT", "/b/k3"), ("HEAD", "/b/k2")]
