"""S3 tables through a real coordinator daemon, against moto's S3 API server on 127.0.0.1.

Each test gets its own bucket and daemon (warehouse roots on that bucket; the AWS variables
passed through ``daemon_factory``'s ``env=``). Data files are uploaded by the test into the
attempt's prefix with Arrow's S3 filesystem, the way executors would write them; secondaries
are applied with delta-rs in this process (as the participant does) or rolled forward by the
daemon's resolver. What is checked: commit and apply of a batch of two S3 tables, snapshot
versions, roll-forward, abort with cleanup of exactly that prefix, confinement refusals on S3
URIs, the faults (credentials missing, bucket missing, endpoint unreachable) and that the
secret key never reaches a log line, the store or an RPC answer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import Schema

from percolake.lake.arrow_read import read_delta_table
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import apply_all, expect_status, unique, wait_for
from tests.s3_support import CLOSED_PORT

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string())])
SCHEMA_JSON = Schema.from_arrow(SCHEMA).to_json()
INVALID = grpc.StatusCode.INVALID_ARGUMENT
DENIED = grpc.StatusCode.PERMISSION_DENIED


def start(daemon_factory, moto_server, tmp_path: Path, roots: list[str], *args: str,
          env: dict[str, str] | None = None):
    """A daemon over ``roots`` (local and S3 mixed) reaching ``moto_server``."""
    first, *rest = roots
    extra = [a for r in rest for a in ("--warehouse", r)]
    return daemon_factory.start(
        ["--roll-forward-after", "3600", "--txn-timeout", "60", *extra, *args],
        warehouse=first, data_dir=tmp_path / "data",
        env=moto_server.env(**(env or {})))


def open_txn(stub, pipeline: str, batch: int, tables: list[str]) -> pb.OpenTransactionResponse:
    return stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=batch, tables=tables), timeout=30)


def write_files(moto_server, write_location: str, ids: list[int], day: str = "d1",
                files: int = 1) -> list[pb.AddFile]:
    """Parquet files of ``ids`` in partition ``day`` under the attempt's location, written as
    an executor would (Arrow's S3 filesystem for ``s3://``, the local disk for ``file://``)."""
    table, _, attempt = write_location.rpartition("/_percolake/")
    adds = []
    for i in range(files):
        relative = f"_percolake/{attempt}/day={day}/part-{i:05d}.parquet"
        data = pa.table({"id": pa.array(ids, pa.int64())})
        if table.startswith("s3://"):
            fs = moto_server.filesystem()
            path = f"{table.removeprefix('s3://')}/{relative}"
            pq.write_table(data, path, filesystem=fs)
            size = fs.get_file_info(path).size
        else:
            path = Path(table.removeprefix("file://")) / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(data, path)
            size = path.stat().st_size
        adds.append(pb.AddFile(path=relative, size=size, partition_values={"day": day},
                               modification_time=1_700_000_000_000,
                               stats=json.dumps({"numRecords": len(ids)})))
    return adds


def write_intent(table: str, adds: list[pb.AddFile]) -> pb.TableWrite:
    return pb.TableWrite(table=table, mode=pb.APPEND, add_files=adds, schema_json=SCHEMA_JSON,
                         partition_by=["day"])


def commit_batch(stub, moto_server, pipeline: str, batch: int, tables: list[str],
                 ids: list[int]) -> pb.Transaction:
    """Open, write one file per table into its attempt prefix, commit in one call."""
    opened = open_txn(stub, pipeline, batch, tables)
    locations = {p.table: p.write_location for p in opened.transaction.participants}
    writes = [write_intent(t, write_files(moto_server, locations[t], ids)) for t in locations]
    return stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=opened.transaction.txn_id, writes=writes, release_unwritten=True),
        timeout=60).transaction


def get(stub, txn_id: str) -> pb.Transaction:
    return stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn_id), timeout=30)


def ids_of(table: str, version: int | None = None) -> list[int]:
    return sorted(read_delta_table(table, version).column("id").to_pylist())


def test_a_batch_of_two_s3_tables_commits_applies_and_snapshots(
        daemon_factory, moto_server, s3_bucket, s3_env, tmp_path):
    daemon = start(daemon_factory, moto_server, tmp_path, [f"s3a://{s3_bucket}/wh"])
    stub = daemon.stub
    pipeline = unique("bank")
    debits, credits = f"s3://{s3_bucket}/wh/debits", f"s3://{s3_bucket}/wh/credits"
    spellings = [f"s3a://{s3_bucket}/wh/debits", f"S3://{s3_bucket}/wh/credits/"]
    txn = commit_batch(stub, moto_server, pipeline, 0, spellings, [1, 2])
    assert txn.state == pb.COMMITTED
    assert sorted(p.table for p in txn.participants) == sorted([debits, credits])
    assert {p.write_location for p in txn.participants} == {
        f"{t}/_percolake/{txn.txn_id}" for t in (debits, credits)}

    versions = apply_all(stub, txn.txn_id)  # delta-rs in this process, as a participant does
    assert versions == {debits: 0, credits: 0}
    applied = stub.ReportApplied(pb.ReportAppliedRequest(txn_id=txn.txn_id, tables=[
        pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()]), timeout=30)
    assert applied.transaction.state == pb.APPLIED  # verified by reading the log on S3

    second = commit_batch(stub, moto_server, pipeline, 1, [debits, credits], [3])
    # a report naming the wrong version is refused: the daemon reads that entry on S3
    apply_all(stub, second.txn_id)
    expect_status(stub.ReportApplied, pb.ReportAppliedRequest(txn_id=second.txn_id, tables=[
        pb.AppliedTable(table=debits, delta_version=0)]), grpc.StatusCode.FAILED_PRECONDITION,
        "not transaction")
    snapshot = stub.GetSnapshot(pb.GetSnapshotRequest(tables=[debits, spellings[1]]),
                                timeout=60)
    assert [(t.canonical_table, t.exists, t.delta_version) for t in snapshot.tables] == [
        (debits, True, 1), (credits, True, 1)]
    assert ids_of(debits) == [1, 2, 3] and ids_of(credits, 0) == [1, 2]
    assert get(stub, second.txn_id).state == pb.APPLIED  # the snapshot recorded the versions
    assert [k for k in moto_server.keys(s3_bucket, "wh/debits/_delta_log/")
            if k.endswith(".json")] == [f"wh/debits/_delta_log/{v:020d}.json" for v in (0, 1)]


def test_the_resolver_rolls_forward_a_batch_over_s3_and_local_tables(
        daemon_factory, moto_server, s3_bucket, s3_env, tmp_path):
    local_root = tmp_path / "lake"
    local_root.mkdir()
    daemon = start(daemon_factory, moto_server, tmp_path,
                   [str(local_root), f"s3://{s3_bucket}/wh"], "--roll-forward-after", "1")
    s3_table, local_table = f"s3://{s3_bucket}/wh/t", f"file://{local_root}/t"
    txn = commit_batch(daemon.stub, moto_server, unique("p"), 0, [s3_table, str(local_root / "t")],
                       [7, 8])
    assert txn.state == pb.COMMITTED
    done = wait_for(lambda: (t := get(daemon.stub, txn.txn_id)).state == pb.APPLIED and t, 30,
                    "the resolver to roll the commit forward")
    assert {p.table: p.delta_version for p in done.participants} == {s3_table: 0,
                                                                    local_table: 0}
    assert ids_of(s3_table) == ids_of(local_table) == [7, 8]
    entry = moto_server.client.get_object(Bucket=s3_bucket,
                                          Key=f"wh/t/_delta_log/{0:020d}.json")
    assert txn.txn_id.encode() in entry["Body"].read()


def test_abort_deletes_exactly_that_attempt_prefix(daemon_factory, moto_server, s3_bucket,
                                                   s3_env, tmp_path):
    daemon = start(daemon_factory, moto_server, tmp_path, [f"s3://{s3_bucket}/wh"],
                   "--shared-table-writers")  # pipelines of their own write one table
    stub = daemon.stub
    table = f"s3://{s3_bucket}/wh/t"
    kept = commit_batch(stub, moto_server, unique("kept"), 0, [table], [1])
    apply_all(stub, kept.txn_id)
    opened = open_txn(stub, unique("doomed"), 0, [table.replace("s3://", "s3a://")])
    location = opened.transaction.participants[0].write_location
    txn_id = opened.transaction.txn_id
    write_files(moto_server, location, [5], files=3)
    moto_server.put(s3_bucket, f"wh/t/_percolake/{txn_id}-sibling/keep")  # same start, not below
    moto_server.put(s3_bucket, f"wh/t2/_percolake/{txn_id}/keep")  # another table
    before = moto_server.keys(s3_bucket)
    doomed = [k for k in before if k.startswith(f"wh/t/_percolake/{txn_id}/")]
    assert len(doomed) == 3
    aborted = stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=txn_id, reason="test"),
                                    timeout=30).transaction
    assert aborted.state == pb.ABORTED
    wait_for(lambda: not moto_server.keys(s3_bucket, f"wh/t/_percolake/{txn_id}/"), 30,
             "the aborted attempt's objects to be deleted")
    assert moto_server.keys(s3_bucket) == [k for k in before if k not in doomed]
    assert ids_of(table) == [1]  # the committed table is untouched


def test_the_sweep_deletes_files_written_late_into_an_aborted_attempt(
        daemon_factory, moto_server, s3_bucket, s3_env, tmp_path):
    """An executor of a frozen driver writes into an attempt after its abort was cleaned up;
    the sweep of recently aborted attempts (run at every start) deletes them on S3 too."""
    daemon = start(daemon_factory, moto_server, tmp_path, [f"s3://{s3_bucket}/wh"])
    opened = open_txn(daemon.stub, unique("p"), 0, [f"s3://{s3_bucket}/wh/t"])
    txn_id = opened.transaction.txn_id
    daemon.stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=txn_id, reason="test"),
                                 timeout=30)
    write_files(moto_server, opened.transaction.participants[0].write_location, [1], files=2)
    moto_server.put(s3_bucket, "wh/t/_percolake/other-attempt/keep")
    assert len(moto_server.keys(s3_bucket, f"wh/t/_percolake/{txn_id}/")) == 2
    daemon.restart()
    wait_for(lambda: not moto_server.keys(s3_bucket, f"wh/t/_percolake/{txn_id}/"), 30,
             "the start-up sweep to delete the late files")
    assert moto_server.keys(s3_bucket) == ["wh/t/_percolake/other-attempt/keep"]


def test_confinement_refusals_on_s3_uris(daemon_factory, moto_server, s3_bucket, s3_env,
                                         tmp_path):
    daemon = start(daemon_factory, moto_server, tmp_path, [f"s3://{s3_bucket}/wh"])
    stub = daemon.stub
    pipeline = unique("p")
    b = s3_bucket
    refusals = [
        (f"s3://other-{b}/wh/t", DENIED, "outside the warehouse roots"),
        (f"s3://{b}/wh2/t", DENIED, "outside"),
        (f"s3://{b}/w/t", DENIED, "outside"),
        (f"s3://{b}/t", DENIED, "outside"),
        (f"s3://{b}/wh", DENIED, "outside"),  # the root itself: strictly below only
        (f"s3a://{b}/wh/", DENIED, "outside"),
        (f"s3://{b}/wh/../elsewhere/t", INVALID, "'..'"),
        (f"s3://{b}/wh/%2E%2E/elsewhere/t", INVALID, "'..'"),
        (f"s3://{b}/wh/%2e%2e/t", INVALID, "'..'"),
        (f"s3://{b}/wh/t/%2F../x", INVALID, "encoded '/'"),
        (f"s3://{b}/wh/t/_percolake/abc", INVALID, "_percolake"),
        (f"s3://{b}/wh/t/%5Fpercolake/abc", INVALID, "_percolake"),
        (f"s3a://{b}/wh/_percolake/x/t", INVALID, "_percolake"),
        (f"s3://{b}:9000/wh/t", INVALID, "bucket name"),
        (f"s3://{b.upper()}/wh/t", INVALID, "bucket name"),
        (f"s3://{b}/wh/t?versionId=1", INVALID, "query"),
        (f"s3://{b}/wh//t", INVALID, "empty segment"),
        (f"s3://{b}/wh/a b", INVALID, "not allowed"),
        (f"gs://{b}/wh/t", INVALID, "not supported"),
    ]
    for table, code, words in refusals:
        expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=0, tables=[table]), code, words)
    secret = moto_server.secret
    details = expect_status(stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=0,
        tables=[f"s3://AKIA:{secret}@{b}/wh/t"]), INVALID, "user information")
    assert secret not in details
    listed = stub.ListTransactions(pb.ListTransactionsRequest(pipeline_id=pipeline), timeout=30)
    assert list(listed.transactions) == []  # nothing recorded
    assert moto_server.keys(s3_bucket) == []  # nothing written
    assert secret not in daemon.log_tail(10_000)


@pytest.mark.parametrize(("unset", "named"), [
    (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), "AWS_ACCESS_KEY_ID"),
    (("AWS_SECRET_ACCESS_KEY",), "AWS_SECRET_ACCESS_KEY"),
])
def test_missing_credentials_stop_the_daemon_at_start_naming_the_variable(
        daemon_factory, moto_server, s3_bucket, tmp_path, unset, named):
    env = {name: "" for name in unset}
    env.update(AWS_PROFILE="", AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"))
    with pytest.raises(RuntimeError, match="coordinator exited with 2") as caught:
        start(daemon_factory, moto_server, tmp_path, [f"s3://{s3_bucket}/wh"], env=env)
    assert named in str(caught.value)
    assert moto_server.secret not in str(caught.value)


def test_a_missing_bucket_refuses_the_commit_naming_it(daemon_factory, moto_server, s3_env,
                                                       tmp_path):
    bucket = "percolake-missing-bucket"
    daemon = start(daemon_factory, moto_server, tmp_path, [f"s3://{bucket}/wh"])
    opened = open_txn(daemon.stub, unique("p"), 0, [f"s3://{bucket}/wh/t"])
    txn_id = opened.transaction.txn_id
    add = pb.AddFile(path=f"_percolake/{txn_id}/day=d1/part-0.parquet", size=10,
                     partition_values={"day": "d1"}, stats='{"numRecords":1}')
    expect_status(daemon.stub.CommitTransaction, pb.CommitTransactionRequest(
        txn_id=txn_id, writes=[write_intent(f"s3://{bucket}/wh/t", [add])]),
        grpc.StatusCode.FAILED_PRECONDITION, f"bucket '{bucket}' does not exist")
    assert get(daemon.stub, txn_id).state in (pb.OPEN, pb.PREWRITTEN)  # not committed
    daemon.stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=txn_id, reason="test"),
                                 timeout=30)
    assert get(daemon.stub, txn_id).state == pb.ABORTED
    assert "warehouse root not usable now" in wait_for(
        lambda: "warehouse root not usable" in daemon.log_tail(200) and daemon.log_tail(200),
        15, "the start-up probe's warning")


def test_an_unreachable_endpoint_fails_the_commit_within_bounds(daemon_factory, moto_server,
                                                                s3_bucket, tmp_path):
    endpoint = f"http://127.0.0.1:{CLOSED_PORT}"
    daemon = start(daemon_factory, moto_server, tmp_path, [f"s3://{s3_bucket}/wh"],
                   "--object-store-timeout", "2", env={"AWS_ENDPOINT_URL": endpoint})
    opened = open_txn(daemon.stub, unique("p"), 0, [f"s3://{s3_bucket}/wh/t"])
    txn_id = opened.transaction.txn_id
    add = pb.AddFile(path=f"_percolake/{txn_id}/day=d1/part-0.parquet", size=10,
                     partition_values={"day": "d1"}, stats='{"numRecords":1}')
    started = time.monotonic()
    details = expect_status(daemon.stub.CommitTransaction, pb.CommitTransactionRequest(
        txn_id=txn_id, writes=[write_intent(f"s3://{s3_bucket}/wh/t", [add])]),
        grpc.StatusCode.UNAVAILABLE, "did not answer", endpoint, timeout=60)
    assert time.monotonic() - started < 30
    assert moto_server.secret not in details
    assert get(daemon.stub, txn_id).state in (pb.OPEN, pb.PREWRITTEN)  # not committed
    daemon.stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=txn_id, reason="test"),
                                 timeout=30)  # durable; its cleanup fails, logged, retried
    assert get(daemon.stub, txn_id).state == pb.ABORTED
    assert daemon.is_running()


def test_the_secret_key_never_reaches_a_log_line_the_store_or_an_answer(
        daemon_factory, moto_server, s3_bucket, s3_env, tmp_path):
    daemon = start(daemon_factory, moto_server, tmp_path, [f"s3://{s3_bucket}/wh"],
                   "--log-level", "debug", "--roll-forward-after", "1",
                   "--shared-table-writers")  # pipelines of their own write one table
    stub = daemon.stub
    secret = moto_server.secret
    table = f"s3://{s3_bucket}/wh/t"
    committed = commit_batch(stub, moto_server, unique("p"), 0, [table], [1])
    wait_for(lambda: get(stub, committed.txn_id).state == pb.APPLIED, 30, "roll-forward")
    opened = open_txn(stub, unique("q"), 0, [table])
    stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=opened.transaction.txn_id),
                          timeout=30)
    missing = pb.AddFile(path="_percolake/x/day=d1/none.parquet", size=1,
                         partition_values={"day": "d1"})
    refused = open_txn(stub, unique("r"), 0, [table]).transaction.txn_id
    missing.path = f"_percolake/{refused}/day=d1/none.parquet"
    expect_status(stub.CommitTransaction, pb.CommitTransactionRequest(
        txn_id=refused, writes=[write_intent(table, [missing])]),
        grpc.StatusCode.FAILED_PRECONDITION, "missing")
    answers = [stub.GetTransaction(pb.GetTransactionRequest(txn_id=t, include_writes=True),
                                   timeout=30).SerializeToString()
               for t in (committed.txn_id, opened.transaction.txn_id, refused)]
    answers.append(stub.ListTransactions(pb.ListTransactionsRequest(), timeout=30)
                   .SerializeToString())
    answers.append(stub.GetSnapshot(pb.GetSnapshotRequest(tables=[table]), timeout=30)
                   .SerializeToString())
    assert daemon.stop() == 0
    log = daemon.log_path.read_bytes()
    assert b"rolled forward" in log and len(log) > 1000  # the debug log was written
    stored = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
    assert stored  # the SQLite files
    for blob in [log, stored, *answers]:
        assert secret.encode() not in blob
