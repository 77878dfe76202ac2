"""``percolake-coordinator optimize`` on an S3 table, against moto's S3 API server: the daemon's
warehouse root is on the bucket, and the command (a separate process, as users run it) reads
the table, writes the compacted files into the attempt's prefix of the table and commits them
through the coordinator, with the same AWS settings as the daemon (its own environment: without
them it is refused, naming the variable to set). On every S3 API server of the tests
(``s3_store``: moto's and SeaweedFS's)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from percolake.lake import storage
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import commit_uri
from percolake.v1 import coordinator_pb2 as pb
from tests.test_ops_cli import cli


def small_files_table(uri: str) -> None:
    """Partition ``a``: three one-row files; ``b``: two; ``c``: one."""
    for i, part in enumerate("aaabbc"):
        write_deltalake(uri, pa.table({"id": pa.array([i], pa.int64()), "part": [part]}),
                        partition_by=["part"], mode="append",
                        storage_options=storage.delta_storage_options(uri))


def rows(uri: str) -> list[tuple]:
    data = read_delta_table(uri)
    return sorted(zip(data.column("id").to_pylist(), data.column("part").to_pylist(),
                      strict=True))


def test_optimize_compacts_an_s3_table_into_its_own_prefix_without_changing_data(
        daemon_factory, s3_store, s3_store_env, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch):
    bucket = s3_store.create_bucket()
    root = f"s3://{bucket}/wh"
    daemon = daemon_factory.start(["--txn-timeout", "60"], warehouse=root,
                                  data_dir=tmp_path / "data", env=s3_store.env(),
                                  name="optimize-s3")
    try:
        table = f"{root}/compact-me"
        small_files_table(table)
        options = storage.delta_storage_options(table)
        before, version = rows(table), DeltaTable(table, storage_options=options).version()
        with monkeypatch.context() as without_keys:  # the command's own settings
            without_keys.delenv("AWS_SECRET_ACCESS_KEY")
            without_keys.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
            refused = cli("optimize", "--table", table, "--target", daemon.target)
        assert refused.returncode == 1 and "AWS_SECRET_ACCESS_KEY" in refused.stderr, \
            refused.stderr
        assert DeltaTable(table, storage_options=options).version() == version
        done = cli("optimize", "--table", table, "--where", "part IN ('a', 'b')", "--json",
                   "--target", daemon.target)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert (result["files_removed"], result["files_added"], result["read_version"],
                result["delta_version"]) == (5, 2, version, version + 1)
        assert rows(table) == before  # the same rows, once each

        entry = [json.loads(line) for line in
                 storage.read_object(commit_uri(table, version + 1)).decode().splitlines()]
        adds = [a["add"] for a in entry if "add" in a]
        changes = [a[k]["dataChange"] for a in entry for k in ("add", "remove") if k in a]
        assert len(changes) == 7 and not any(changes)  # streaming readers skip it
        prefix = f"wh/compact-me/_percolake/{result['txn_id']}/"
        keys = s3_store.keys(bucket, prefix)
        assert sorted(f"wh/compact-me/{a['path']}" for a in adds) == keys  # in the table
        history = DeltaTable(table, storage_options=options).history(1)[0]
        assert history["operation"] == "OPTIMIZE"
        txn = daemon.stub.GetTransaction(pb.GetTransactionRequest(txn_id=result["txn_id"]),
                                         timeout=30)
        assert txn.state == pb.APPLIED
    finally:
        daemon.stop()
