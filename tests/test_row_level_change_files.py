"""Change data files of row-level writes on tables with the change data feed (no Spark): the
intent carries them through the codec, the record JSON and the store; validation and the
pre-commit file check refuse wrong ones; the apply names them in ``cdc`` actions
(docs/row-level-writes.md, Change data feed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from coordinator import validation
from coordinator.store import SqliteStore
from percolake import codec
from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.lake.delta_commit import apply_table_write, files_of_version
from percolake.lake.write_check import WriteChecker
from percolake.records import (
    AddFileRecord,
    ChangeFileRecord,
    RemoveFileRecord,
    TableEntry,
    TableWriteRecord,
    TxnRecord,
    WriteMode,
)
from percolake.states import TxnState

APP, TXN = "percolake:p:g0", "c" * 32


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2], "region": ["eu", "us"]}),
                    partition_by=["region"],
                    configuration={"delta.enableChangeDataFeed": "true"})
    return path


def update_with_changes(table: Path) -> TableWriteRecord:
    """An UPDATE of id 1 (region eu) to 10: the eu file replaced, one change file."""
    folder = table / "_percolake" / TXN / "op0"
    data = folder / "region=eu" / "part-0.parquet"
    change = folder / "_change_data" / "region=eu" / "part-0.parquet"
    for path in (data, change):
        path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([10], pa.int64())}), data)
    pq.write_table(pa.table({"id": pa.array([1, 10], pa.int64()),
                             "_change_type": ["update_preimage", "update_postimage"]}), change)
    files = files_of_version(f"file://{table}", 0)
    eu = next(f for f in files.files if f.partition_values == {"region": "eu"})
    return TableWriteRecord(
        f"file://{table}", WriteMode.ROW_LEVEL,
        (AddFileRecord(data.relative_to(table).as_posix(), data.stat().st_size,
                       {"region": "eu"}, 0, '{"numRecords":1}'),),
        files.schema_json, ("region",),
        remove_files=(RemoveFileRecord(eu.path, eu.size, {"region": "eu"}),),
        read_version=0, operation="UPDATE", operation_metrics='{"numAddedChangeFiles":"1"}',
        change_files=(ChangeFileRecord(change.relative_to(table).as_posix(),
                                       change.stat().st_size, {"region": "eu"}),))


def test_change_files_survive_the_codec_the_record_json_and_the_store(table, tmp_path):
    write = update_with_changes(table)
    assert codec.table_write_from_pb(codec.table_write_to_pb(write)) == write
    assert TableWriteRecord.from_json(json.loads(write.json_text)) == write
    plain = dataclasses.replace(write, change_files=())
    assert "change_files" not in plain.to_json(), "records without them keep their form"
    record = TxnRecord(txn_id=TXN, pipeline_id="p", generation=0, batch_id=0, attempt=1,
                       epoch=1, query_id="", state=TxnState.PREWRITTEN, start_ts=1,
                       created_ms=1, updated_ms=1)
    record.tables[write.table] = TableEntry(write.table, f"{write.table}/_percolake/{TXN}",
                                            write)
    store = SqliteStore(tmp_path / "store")
    store.insert_txn(record)
    store.close()
    assert SqliteStore(tmp_path / "store").get_txn(TXN).tables[write.table].write == write


def test_validation_refuses_change_files_that_cannot_be_meant(table):
    write = update_with_changes(table)
    validation.check_table_write(write, TXN, 10**6)
    change = write.change_files[0]
    cases = {
        "change_files needs the ROW_LEVEL mode": dataclasses.replace(
            write, mode=WriteMode.APPEND, remove_files=(), read_version=-1, operation=""),
        "listed twice": dataclasses.replace(write, change_files=(change, change)),
        "both added and change files": dataclasses.replace(write, change_files=(
            dataclasses.replace(change, path=write.add_files[0].path),)),
        "relative path under": dataclasses.replace(write, change_files=(
            dataclasses.replace(change, path="_change_data/elsewhere.parquet"),)),
        "has size": dataclasses.replace(write, change_files=(
            dataclasses.replace(change, size=-1),)),
        "partition values": dataclasses.replace(write, change_files=(
            dataclasses.replace(change, partition_values={}),)),
    }
    for message, bad in cases.items():
        with pytest.raises(InvalidArgument, match=message):
            validation.check_table_write(bad, TXN, 10**6)


def test_a_missing_or_resized_change_file_is_refused_before_the_commit_point(table):
    write = update_with_changes(table)
    checker = WriteChecker(roots=[str(table.parent)])
    checker.check(write)
    resized = dataclasses.replace(write, change_files=(
        dataclasses.replace(write.change_files[0], size=write.change_files[0].size + 1),))
    with pytest.raises(FailedPrecondition, match="of another size"):
        checker.check(resized)
    (table / write.change_files[0].path).unlink()
    with pytest.raises(FailedPrecondition, match="files missing"):
        checker.check(write)


def test_the_commit_names_each_change_file_in_a_cdc_action_as_delta_spark_writes_it(table):
    write = update_with_changes(table)
    assert apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5) == 1
    actions = [json.loads(line) for line in
               (table / "_delta_log" / f"{1:020d}.json").read_text().splitlines()]
    cdc = [a["cdc"] for a in actions if "cdc" in a]
    change = write.change_files[0]
    assert cdc == [{"path": change.path, "partitionValues": {"region": "eu"},
                    "size": change.size, "dataChange": False}]
    kinds = [next(iter(a)) for a in actions]
    assert kinds.count("add") == 1 and kinds.count("remove") == 1
    assert all(a[k]["dataChange"] for a in actions for k in ("add", "remove") if k in a)
