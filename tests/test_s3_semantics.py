"""The object-store semantics percolake relies on, on every S3 API server of the tests
(``s3_store``: moto's and SeaweedFS's S3 gateway, a real server): a conditional put lets exactly
one writer create a log entry (``If-None-Match: *``, by percolake's own log entries and by
delta-rs's commits), a listing made right after a write shows it with its size (the write check
and the cleanup trust that), a large file written by Arrow's multipart upload is one object,
listed and read whole, and a batch's write check, commit and applied check on that server.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import Schema

from percolake.lake import storage
from percolake.lake.delta_commit import apply_table_write, commit_uri, is_commit_of
from percolake.lake.write_check import WriteChecker
from percolake.parallel import in_parallel
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode

SCHEMA = pa.schema([("x", pa.int64()), ("p", pa.string())])
APP_ID = "percolake:semantics:g0"


def write_object(path: str, data: bytes) -> None:
    """``bucket/key`` written through Arrow's S3 filesystem, as an executor writes a file."""
    with storage.s3_filesystem().open_output_stream(path) as out:
        for start in range(0, len(data), 1 << 20):
            out.write(data[start:start + (1 << 20)])


def upload(table: str, txn_id: str, xs: list[int]) -> AddFileRecord:
    relative = f"_percolake/{txn_id}/p=a/part-0.parquet"
    path = f"{table.removeprefix('s3://')}/{relative}"
    pq.write_table(pa.table({"x": pa.array(xs, pa.int64())}), path,
                   filesystem=storage.s3_filesystem())
    size = storage.s3_filesystem().get_file_info(path).size
    return AddFileRecord(relative, size, {"p": "a"}, 1_700_000_000_000,
                         json.dumps({"numRecords": len(xs)}))


def test_a_conditional_put_lets_exactly_one_writer_create_a_log_entry(s3_store, s3_store_env):
    bucket = s3_store.create_bucket()
    entry = commit_uri(f"s3://{bucket}/wh/t", 0)
    bodies = [f'{{"writer":{i}}}\n'.encode() for i in range(4)]
    won = in_parallel(lambda body: storage.put_object_if_absent(entry, body), bodies, 4)
    assert sorted(won) == [False, False, False, True], won
    assert storage.read_object(entry) == bodies[won.index(True)]
    assert storage.put_object_if_absent(entry, b"late\n") is False
    assert storage.read_object(entry) == bodies[won.index(True)]


def test_concurrent_delta_commits_write_each_version_once(s3_store, s3_store_env):
    """Four appliers of one write at once (delta-rs's conditional put, ``conditional_put=etag``):
    one commits each version, the others re-check and answer that version."""
    bucket = s3_store.create_bucket()
    table = f"s3://{bucket}/wh/t"
    schema_json = Schema.from_arrow(SCHEMA).to_json()
    for batch in range(2):
        write = TableWriteRecord(table, WriteMode.APPEND, (upload(table, f"t{batch}", [batch]),),
                                 schema_json, ("p",))
        versions = in_parallel(lambda _, write=write, batch=batch: apply_table_write(
            write, app_id=APP_ID, app_version=batch, txn_id=f"t{batch}", commit_ts=batch + 1),
            range(4), 4)
        assert versions == [batch] * 4, versions
    assert [k for k in s3_store.keys(bucket, "wh/t/_delta_log/") if k.endswith(".json")] == [
        f"wh/t/_delta_log/{v:020d}.json" for v in (0, 1)]


def test_a_listing_right_after_a_write_shows_it_and_after_a_delete_does_not(s3_store,
                                                                           s3_store_env):
    bucket = s3_store.create_bucket()
    attempt = f"s3://{bucket}/wh/t/_percolake/a1"
    sizes: dict[str, int] = {}
    for i in range(4):
        relative = f"p={i % 2}/part-{i}.parquet"
        write_object(f"{bucket}/wh/t/_percolake/a1/{relative}", b"x" * (100 * i + 1))
        sizes[relative] = 100 * i + 1
        assert {path: size for path, (size, _) in storage.list_files(attempt).items()} == sizes
    storage.delete_objects(attempt, list(sizes))
    assert storage.list_files(attempt) == {}
    assert storage.read_object(f"{attempt}/p=0/part-0.parquet") is None


def test_a_multipart_upload_is_one_object_listed_and_read_whole(s3_store, s3_store_env):
    """Arrow uploads a file of more than its part size (10 MiB) in parts: the store shows one
    object of the whole size (a multipart ETag: ``-<parts>``) and reads it back whole."""
    bucket = s3_store.create_bucket()
    data = os.urandom(12 << 20)
    write_object(f"{bucket}/wh/t/_percolake/a1/big.parquet", data)
    listed = storage.list_files(f"s3://{bucket}/wh/t/_percolake/a1")
    assert listed["big.parquet"][0] == len(data)
    head = s3_store.client.head_object(Bucket=bucket, Key="wh/t/_percolake/a1/big.parquet")
    assert head["ETag"].strip('"').endswith("-2"), head["ETag"]
    assert storage.read_object(f"s3://{bucket}/wh/t/_percolake/a1/big.parquet") == data


def test_a_batch_is_checked_committed_and_verified_on_the_store(s3_store, s3_store_env):
    """What the daemon does per table: the write check (listing, log entries), the apply
    (delta-rs commit), the applied check (the log entry read back)."""
    bucket = s3_store.create_bucket()
    table = f"s3://{bucket}/wh/t"
    schema_json = Schema.from_arrow(SCHEMA).to_json()
    checker = WriteChecker()
    for batch in range(3):
        write = TableWriteRecord(table, WriteMode.APPEND, (upload(table, f"t{batch}", [batch]),),
                                 schema_json, ("p",))
        checker.check(write)
        version = apply_table_write(write, app_id=APP_ID, app_version=batch,
                                    txn_id=f"t{batch}", commit_ts=batch + 1)
        assert version == batch
        assert is_commit_of(table, version, f"t{batch}", APP_ID, batch)
        assert not is_commit_of(table, version, "another", APP_ID, batch)
        assert checker.layouts.get(table).version == batch
