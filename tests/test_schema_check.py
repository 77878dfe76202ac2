"""The participant's schema check: refusals, and the cached layout reloaded only on change."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import Schema, write_deltalake

from percolake.lake import write_check
from percolake.lake.delta_commit import apply_table_write
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from sparkside import schema_check
from sparkside.errors import SchemaMismatch

IDS = pa.schema([("id", pa.int64())])


def schema_json(schema: pa.Schema) -> str:
    return Schema.from_arrow(schema).to_json()


def append(root: str, batch: int) -> None:
    rel = f"_percolake/t{batch}/part-0.parquet"
    os.makedirs(f"{root}/_percolake/t{batch}", exist_ok=True)
    pq.write_table(pa.table({"id": [batch]}), f"{root}/{rel}")
    write = TableWriteRecord(f"file://{root}", WriteMode.APPEND, (AddFileRecord(
        rel, os.path.getsize(f"{root}/{rel}"), {}, 0, '{"numRecords":1}'),), schema_json(IDS))
    apply_table_write(write, app_id="app", app_version=batch, txn_id=f"t{batch}",
                      commit_ts=batch)


@pytest.fixture
def loads(monkeypatch):
    """Every load of a table's log (the shared cache behind the checker does them)."""
    calls: list[str] = []
    real = write_check.table_layout

    def counting(table):  # noqa: ANN001, ANN202
        calls.append(table)
        return real(table)

    monkeypatch.setattr(write_check, "table_layout", counting)
    return calls


def test_new_table_takes_the_requested_partitioning(tmp_path, loads):
    checker = schema_check.SchemaChecker()
    table = f"file://{tmp_path}/new"
    assert checker.check(table, schema_json(IDS), ["id"], "append", 0) == ["id"]
    with pytest.raises(ValueError, match="needs partition_by"):
        checker.check(table, schema_json(IDS), [], "overwrite_partitions", 0)
    assert loads == []


def test_commits_without_metadata_reuse_the_cached_layout(tmp_path, loads):
    root = str(tmp_path / "t")
    checker = schema_check.SchemaChecker()
    append(root, 0)
    for batch in range(1, 4):
        assert checker.check(f"file://{root}", schema_json(IDS), [], "append", batch) == []
        append(root, batch)
    assert len(loads) == 1


def test_a_schema_change_is_seen_and_refused(tmp_path, loads):
    root = str(tmp_path / "t")
    checker = schema_check.SchemaChecker()
    append(root, 0)
    checker.check(f"file://{root}", schema_json(IDS), [], "append", 1)
    write_deltalake(root, pa.table({"name": ["x"]}), mode="overwrite", schema_mode="overwrite")
    with pytest.raises(SchemaMismatch, match="missing columns \\['name'\\]"):
        checker.check(f"file://{root}", schema_json(IDS), [], "append", 2)
    assert len(loads) == 2
