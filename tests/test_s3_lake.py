"""The lake functions on S3 tables, in this process, against moto's S3 API server: Delta commits
with conditional puts (a writer outside percolake makes ours re-check, never overwrite), the
log read through the object store, the pre-commit check listing sizes, cleanup of one attempt's
prefix only, bounded and clear failures (bucket missing, endpoint unreachable).

Data files are written with Arrow's S3 filesystem under ``<table>/_percolake/<txn_id>/``, as an
executor writing Arrow batches would.
"""

from __future__ import annotations

import json
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Schema
from deltalake.transaction import AddAction

from percolake.errors import FailedPrecondition
from percolake.lake import cleanup, delta_commit, storage
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.cleanup import remove_attempt_files
from percolake.lake.delta_commit import (
    ApplyFailed,
    apply_table_write,
    commit_uri,
    is_commit_of,
    open_table,
)
from percolake.lake.version_checksum import background_written, read_checksum
from percolake.lake.warehouse import UnsafeLocation, write_location
from percolake.lake.write_check import WriteChecker
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from tests.s3_support import CLOSED_PORT

X_P = pa.schema([("x", pa.int64()), ("p", pa.string())])
SCHEMA_JSON = Schema.from_arrow(X_P).to_json()


def upload(moto_server, table: str, txn_id: str, xs: list[int], part: str = "a",
           name: str = "part-0.parquet") -> AddFileRecord:
    """Writes one Parquet file of rows ``x`` in partition ``p=part`` into the attempt's prefix
    (Arrow's S3 filesystem, as an executor would) and describes it as an add action."""
    relative = f"_percolake/{txn_id}/p={part}/{name}"
    path = f"{table.removeprefix('s3://')}/{relative}"
    fs = moto_server.filesystem()
    pq.write_table(pa.table({"x": pa.array(xs, pa.int64())}), path, filesystem=fs)
    size = fs.get_file_info(path).size
    return AddFileRecord(relative, size, {"p": part}, 1_700_000_000_000,
                         json.dumps({"numRecords": len(xs)}))


def write_of(table: str, files: list[AddFileRecord], mode: WriteMode = WriteMode.APPEND,
             replace: tuple = ()) -> TableWriteRecord:
    return TableWriteRecord(table, mode, tuple(files), SCHEMA_JSON, ("p",), replace)


def rows(table: str, version: int | None = None) -> list[tuple[int, str]]:
    data = read_delta_table(table, version)
    return sorted(zip(data.column("x").to_pylist(), data.column("p").to_pylist(), strict=True))


def apply(write: TableWriteRecord, txn_id: str, batch: int, **kwargs) -> int:
    return apply_table_write(write, app_id="percolake:p:g0", app_version=batch, txn_id=txn_id,
                             commit_ts=batch + 1, **kwargs)


def entries(moto_server, bucket: str) -> list[str]:  # noqa: ANN001
    """The keys of the table's log entries (not its checksums or checkpoints)."""
    return [k for k in moto_server.keys(bucket, "wh/t/_delta_log/") if k.endswith(".json")]


@pytest.fixture
def table(s3_env, s3_bucket) -> str:
    return f"s3://{s3_bucket}/wh/t"


def test_apply_creates_then_appends_and_is_idempotent(moto_server, table, s3_bucket):
    first = write_of(table, [upload(moto_server, table, "t1", [1, 2])])
    assert apply(first, "t1", 0, roots=[f"s3a://{s3_bucket}/wh"]) == 0
    assert apply(first, "t1", 0) == 0  # again: the app transaction says it is there
    second = write_of(table, [upload(moto_server, table, "t2", [3], part="b")])
    assert apply(second, "t2", 1) == 1
    assert apply(second, "t2", 1) == 1
    assert rows(table) == [(1, "a"), (2, "a"), (3, "b")]
    assert rows(table, 0) == [(1, "a"), (2, "a")]
    assert is_commit_of(table, 1, "t2", "percolake:p:g0", 1)
    assert not is_commit_of(table, 0, "t2", "percolake:p:g0", 1)
    assert not is_commit_of(table, 7, "t2", "percolake:p:g0", 1)  # no such version
    assert entries(moto_server, s3_bucket) == [f"wh/t/_delta_log/{v:020d}.json" for v in (0, 1)]
    background_written()  # each version's checksum, written off the apply's path
    assert [read_checksum(table, v)["numFiles"] for v in (0, 1)] == [1, 2]


def test_concurrent_appliers_commit_each_write_exactly_once_on_s3(moto_server, table,
                                                                 s3_bucket):
    """Four appliers (the participant and the coordinator's roll-forward, say) apply the same
    write at once, the first one creating the table: the conditional puts let one win each
    version, the others re-check and answer the same version."""
    for batch in range(3):
        write = write_of(table, [upload(moto_server, table, f"t{batch}", [batch])])
        versions: list[int] = []
        errors: list[BaseException] = []

        def run(write=write, batch=batch, versions=versions, errors=errors) -> None:  # noqa: ANN001
            try:
                versions.append(apply(write, f"t{batch}", batch))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors and versions == [batch] * 4
    assert rows(table) == [(0, "a"), (1, "a"), (2, "a")]
    assert len(entries(moto_server, s3_bucket)) == 3


def test_overwrite_partitions_on_s3_removes_only_the_named_partition(moto_server, table):
    apply(write_of(table, [upload(moto_server, table, "t1", [1], "a"),
                           upload(moto_server, table, "t1", [2], "b")]), "t1", 0)
    apply(write_of(table, [upload(moto_server, table, "t2", [9], "a")],
                   WriteMode.OVERWRITE_PARTITIONS, ({"p": "a"},)), "t2", 1)
    assert rows(table) == [(2, "b"), (9, "a")]


def test_apply_refuses_an_s3_table_outside_the_roots(moto_server, table, s3_bucket):
    write = write_of(table, [upload(moto_server, table, "t1", [1])])
    for roots in ([f"s3://{s3_bucket}/other"], ["s3://another-bucket/wh"], ["/tmp"]):
        with pytest.raises(UnsafeLocation):
            apply(write, "t1", 0, roots=roots)
    assert moto_server.keys(s3_bucket, "wh/t/_delta_log/") == []


def test_a_writer_outside_percolake_makes_our_commit_re_check_never_overwrite(
        moto_server, table, s3_bucket, monkeypatch):
    """Our applier loads the table at version 0; before it commits, a writer outside percolake
    commits version 1 with delta-rs. The conditional put of our version 1 fails, we re-check and
    land at version 2; the other writer's entry is intact."""
    apply(write_of(table, [upload(moto_server, table, "t1", [1])]), "t1", 0)
    outsider = upload(moto_server, table, "outsider", [100])
    real_open = delta_commit.open_table
    raced: list[int] = []

    def open_then_outsider_commits(uri, version=None):  # noqa: ANN001, ANN202
        loaded = real_open(uri, version)
        if not raced:
            other = DeltaTable(uri, storage_options=storage.delta_storage_options(uri))
            other.create_write_transaction(
                [AddAction(outsider.path, outsider.size, {"p": "a"}, 1, True, outsider.stats)],
                "append", Schema.from_arrow(X_P), partition_by=["p"],
                commit_properties=CommitProperties(custom_metadata={"writer": "outsider"},
                                                   max_commit_retries=0))
            raced.append(other.version())
        return loaded

    monkeypatch.setattr(delta_commit, "open_table", open_then_outsider_commits)
    version = apply(write_of(table, [upload(moto_server, table, "t2", [2])]), "t2", 1)
    assert version == 2 and len(raced) == 1
    entry = storage.read_object(commit_uri(table, 1))
    assert b'"writer":"outsider"' in entry and b"t2" not in entry
    assert rows(table) == [(1, "a"), (2, "a"), (100, "a")]


@pytest.mark.parametrize("mode", [WriteMode.APPEND, WriteMode.OVERWRITE])
def test_a_commit_that_keeps_losing_fails_after_bounded_retries(moto_server, table,
                                                                monkeypatch, mode):
    """An append's own log entry finds the version taken at every conditional put; an
    overwrite's delta-rs commit fails as concurrent every time: both give up after
    MAX_ATTEMPTS, with nothing written."""
    from deltalake.exceptions import CommitFailedError

    apply(write_of(table, [upload(moto_server, table, "t1", [1])]), "t1", 0)
    monkeypatch.setattr(delta_commit, "MAX_ATTEMPTS", 2)

    class Loses:
        def __init__(self, real):  # noqa: ANN001
            self.real = real

        def __getattr__(self, name):  # noqa: ANN001, ANN204
            return getattr(self.real, name)

        def create_write_transaction(self, *args, **kwargs):  # noqa: ANN002, ANN003
            raise CommitFailedError("version already exists")

    real_open = delta_commit.open_table
    monkeypatch.setattr(delta_commit, "open_table", lambda uri, version=None: Loses(
        real_open(uri, version)))
    monkeypatch.setattr(storage, "put_object_if_absent", lambda uri, data: False)
    with pytest.raises(ApplyFailed):
        apply(write_of(table, [upload(moto_server, table, "t2", [2])], mode), "t2", 1)
    assert storage.read_object(commit_uri(table, 1)) is None


# ---------------------------------------------------------------- the pre-commit check


def test_the_write_check_lists_sizes_on_s3(moto_server, table):
    checker = WriteChecker()
    good = upload(moto_server, table, "t1", [1, 2])
    checker.check(write_of(table, [good]))  # a new table: files checked, nothing else
    apply(write_of(table, [good]), "t1", 0)
    checker.check(write_of(table, [upload(moto_server, table, "t2", [3])]))
    missing = AddFileRecord("_percolake/t3/p=a/none.parquet", 10, {"p": "a"}, 1, "{}")
    with pytest.raises(FailedPrecondition, match="1 files missing.*none.parquet"):
        checker.check(write_of(table, [missing]))
    wrong = upload(moto_server, table, "t4", [4])
    wrong = AddFileRecord(wrong.path, wrong.size + 1, wrong.partition_values, 1, wrong.stats)
    with pytest.raises(FailedPrecondition, match="another size"):
        checker.check(write_of(table, [wrong]))
    other_schema = TableWriteRecord(table, WriteMode.APPEND, (good,), Schema.from_arrow(
        pa.schema([("x", pa.string()), ("p", pa.string())])).to_json(), ("p",))
    with pytest.raises(FailedPrecondition, match="column 'x'"):
        checker.check(other_schema)


def test_the_layout_cache_follows_an_s3_table_commit_by_commit(moto_server, table,
                                                                monkeypatch):
    from percolake.lake import write_check

    loads: list[str] = []
    real = write_check.table_layout
    monkeypatch.setattr(write_check, "table_layout", lambda t: loads.append(t) or real(t))
    cache = write_check.LayoutCache()
    assert cache.get(table) is None and loads == []  # no log: no delta-rs load
    for batch in range(3):
        apply(write_of(table, [upload(moto_server, table, f"t{batch}", [batch])]),
              f"t{batch}", batch)
        assert cache.get(table).version == batch
    assert len(loads) == 1  # loaded once, then moved on by reading the new entries


def test_a_missing_bucket_is_a_clear_refusal(moto_server, s3_env):
    table = "s3://no-such-bucket-here/wh/t"
    add = AddFileRecord("_percolake/t1/p=a/x.parquet", 10, {"p": "a"}, 1, "{}")
    with pytest.raises(storage.StorageRefused, match="bucket 'no-such-bucket-here' does not "
                                                     "exist"):
        WriteChecker().check(write_of(table, [add]))
    with pytest.raises(storage.StorageRefused, match="does not exist"):
        open_table(table)


def test_an_unreachable_endpoint_fails_within_bounds_naming_it(s3_env, monkeypatch):
    endpoint = f"http://127.0.0.1:{CLOSED_PORT}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    storage.configure(timeout_s=2)
    try:
        started = time.monotonic()
        with pytest.raises(storage.StorageUnavailable, match="did not answer") as caught:
            open_table("s3://some-bucket/wh/t")
        with pytest.raises(storage.StorageUnavailable, match="did not answer"):
            storage.list_files("s3://some-bucket/wh/t/_percolake/x")
        with pytest.raises(storage.StorageUnavailable):
            remove_attempt_files("s3://some-bucket/wh/t/_percolake/x")
        assert time.monotonic() - started < 30
        assert endpoint in str(caught.value)
        assert s3_env["AWS_SECRET_ACCESS_KEY"] not in str(caught.value)
    finally:
        storage.configure(timeout_s=30)


# ---------------------------------------------------------------- cleanup


def test_cleanup_removes_exactly_the_attempt_prefix_idempotently(moto_server, table, s3_bucket):
    for txn_id in ("abc", "abcd", "other"):
        upload(moto_server, table, txn_id, [1])
        upload(moto_server, table, txn_id, [2], name="part-1.parquet")
    moto_server.put(s3_bucket, "wh/t/_percolake/abc/deep/er/file with space%41.bin")
    moto_server.put(s3_bucket, "wh/t/_percolake/abc.json")  # a sibling key, not below abc/
    moto_server.put(s3_bucket, "wh/t2/_percolake/abc/part-0.parquet")  # another table
    moto_server.put(s3_bucket, "wh/t/data.parquet")
    before = moto_server.keys(s3_bucket)
    location = write_location(table, "abc")
    remove_attempt_files(location, roots=[f"s3://{s3_bucket}/wh"])
    after = moto_server.keys(s3_bucket)
    assert [k for k in before if k not in after] == [
        k for k in before if k.startswith("wh/t/_percolake/abc/")]
    assert not any(k.startswith("wh/t/_percolake/abc/") for k in after)
    assert set(after) - set(before) == set()  # nothing written, no directory marker
    remove_attempt_files(location, roots=[f"s3://{s3_bucket}/wh"])  # again: nothing to do
    remove_attempt_files(location)
    assert moto_server.keys(s3_bucket) == after


@pytest.mark.parametrize("location", [
    "s3://{b}/wh/t",  # not an attempt folder
    "s3://{b}/wh/t/_percolake",
    "s3://{b}/wh/_percolake/abc",  # the root's own attempt folder: no table
    "s3://{b}/wh/t/_percolake/abc/_percolake/x",
    "s3://{b}/wh/t/%2E%2E/_percolake/abc",
    "s3://{b}/wh/t/../_percolake/abc",
    "s3a://{b}/wh/t/_percolake/abc",  # not the canonical spelling
    "s3://{b}/elsewhere/t/_percolake/abc",  # outside the root
    "s3://other-bucket/wh/t/_percolake/abc",
    "file:///wh/t/_percolake/abc",
])
def test_cleanup_refuses_anything_but_an_attempt_prefix_below_a_root(moto_server, table,
                                                                     s3_bucket, location):
    upload(moto_server, table, "abc", [1])
    moto_server.put(s3_bucket, "wh/t/keep")
    before = moto_server.keys(s3_bucket)
    with pytest.raises(UnsafeLocation):
        remove_attempt_files(location.format(b=s3_bucket), roots=[f"s3://{s3_bucket}/wh"])
    assert moto_server.keys(s3_bucket) == before


def test_cleanup_retries_a_transient_failure(moto_server, table, s3_bucket, monkeypatch):
    upload(moto_server, table, "abc", [1])
    real = storage.delete_objects
    failures = [storage.StorageUnavailable("the object store did not answer (test)")]

    def flaky(prefix, paths):  # noqa: ANN001, ANN202
        if failures:
            raise failures.pop()
        return real(prefix, paths)

    monkeypatch.setattr(storage, "delete_objects", flaky)
    monkeypatch.setattr(cleanup.time, "sleep", lambda s: None)
    remove_attempt_files(write_location(table, "abc"), roots=[f"s3://{s3_bucket}/wh"])
    assert moto_server.keys(s3_bucket, "wh/t/_percolake/abc/") == [] and not failures


def test_a_merge_schema_write_on_s3_commits_its_new_column_with_the_data_exactly_once(
        moto_server, table, s3_bucket):
    """The log entry percolake writes itself (data and metaData) goes in with a conditional
    put: of four appliers at once one writes the version, the others find it."""
    apply(write_of(table, [upload(moto_server, table, "t1", [1])]), "t1", 0)
    relative = "_percolake/t2/p=b/part-0.parquet"
    fs = moto_server.filesystem()
    path = f"{table.removeprefix('s3://')}/{relative}"
    pq.write_table(pa.table({"x": pa.array([2], pa.int64()), "note": ["new"]}), path,
                   filesystem=fs)
    add = AddFileRecord(relative, fs.get_file_info(path).size, {"p": "b"}, 0,
                        json.dumps({"numRecords": 1}))
    wider = Schema.from_arrow(pa.schema([("x", pa.int64()), ("p", pa.string()),
                                         ("note", pa.string())])).to_json()
    write = TableWriteRecord(table, WriteMode.APPEND, (add,), wider, ("p",), (), True)
    versions: list[int] = []
    threads = [threading.Thread(target=lambda: versions.append(apply(write, "t2", 1)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert versions == [1] * 4
    assert entries(moto_server, s3_bucket) == [f"wh/t/_delta_log/{v:020d}.json" for v in (0, 1)]
    data = read_delta_table(table)
    assert sorted(zip(data.column("x").to_pylist(), data.column("note").to_pylist(),
                      strict=True)) == [(1, None), (2, "new")]
    assert storage.put_object_if_absent(commit_uri(table, 1), b"{}") is False


def test_checkpoints_their_hint_and_log_cleanup_on_s3(moto_server, table, s3_bucket):
    from percolake.lake.checkpoints import Checkpointer, last_checkpoint_version
    from percolake.lake.log_cleanup import clean_log

    checkpointer = Checkpointer()
    for batch in range(12):
        write = write_of(table, [upload(moto_server, table, f"t{batch}", [batch])])
        checkpointer.applied(table, apply(write, f"t{batch}", batch))
    assert checkpointer.flush()
    assert last_checkpoint_version(table) == 10
    moto_server.filesystem().delete_file(f"{s3_bucket}/wh/t/_delta_log/_last_checkpoint")
    again = Checkpointer()  # as after a writer that died before the hint
    again.applied(table, 11)
    assert again.flush()
    assert last_checkpoint_version(table) == 10
    later = int(time.time() * 1000) + 31 * 24 * 3600 * 1000
    background_written()  # the checksums go with their entries
    assert clean_log(table, 11, {}, later) == [f"{v:020d}.{kind}" for v in range(10)
                                               for kind in ("crc", "json")]
    log = moto_server.keys(s3_bucket, "wh/t/_delta_log/")
    assert f"wh/t/_delta_log/{9:020d}.json" not in log
    assert len(rows(table)) == 12 and len(rows(table, 10)) == 11
    checkpointer.close()
    again.close()
