"""Delta's conflict rules for a row-level write, one rule per test (no Spark): a MERGE that
read partition ``region = 'eu'`` of a table partitioned by region, judged before the commit
point (``check_row_level_write``) and applied after it (docs/row-level-writes.md, Concurrency).
Outside writers are delta-rs's operations and, for blind appends, log entries as delta-spark
writes them (``isBlindAppend=true``)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from percolake.lake.conflicts import RowLevelConflict, check_row_level_write
from percolake.lake.delta_commit import apply_table_write, files_of_version
from percolake.lake.log_entry import add_action, operation_commit_info, put_entry, remove_action
from percolake.lake.read_set import SERIALIZABLE, WRITE_SERIALIZABLE, ReadSet
from percolake.lake.warehouse import canonical_table_uri
from percolake.records import AddFileRecord, RemoveFileRecord, TableWriteRecord, WriteMode

APP, TXN = "percolake:p:g0", "c" * 32
EU = {"column": "region", "op": "=", "value": "eu"}


@pytest.fixture
def table(tmp_path: Path) -> Path:
    """Version 0: one file in eu (ids 1, 2), one in us (ids 3, 4)."""
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3, 4], "value": [10, 20, 30, 40],
                                         "region": ["eu", "eu", "us", "us"]}),
                    partition_by=["region"])
    return path


def uri(table: Path) -> str:
    return canonical_table_uri(str(table))


def merge_of_eu(table: Path, isolation: str = WRITE_SERIALIZABLE, predicate: object = EU,
                **changes: object) -> TableWriteRecord:
    """A MERGE that read eu at version 0 and replaces its file by one holding (1, 11), (2, 20)
    and an insert (9, 90)."""
    folder = table / "_percolake" / TXN / "op0" / "region=eu"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "part-0.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2, 9], pa.int64()),
                             "value": pa.array([11, 20, 90], pa.int64())}), path)
    files = files_of_version(uri(table), 0)
    eu = [f for f in files.files if f.partition_values == {"region": "eu"}]
    write = TableWriteRecord(
        uri(table), WriteMode.ROW_LEVEL,
        (AddFileRecord(path.relative_to(table).as_posix(), path.stat().st_size,
                       {"region": "eu"}, 0, json.dumps({"numRecords": 3})),),
        files.schema_json, ("region",),
        remove_files=tuple(RemoveFileRecord(f.path, f.size, {"region": "eu"}) for f in eu),
        read_version=0, operation="MERGE", read_set=ReadSet(isolation, predicate).to_json())
    return dataclasses.replace(write, **changes)


def write_file(table: Path, folder: str, ids: list[int]) -> AddFileRecord:
    """A data file under ``folder`` (``region=<r>`` last) holding ``ids``, value id * 10."""
    relative = f"{folder}/part-{uuid.uuid4().hex}.parquet"
    (table / relative).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                             "value": pa.array([i * 10 for i in ids], pa.int64())}),
                   table / relative)
    return AddFileRecord(relative, (table / relative).stat().st_size,
                         {"region": folder.rsplit("=", 1)[1]}, 0,
                         json.dumps({"numRecords": len(ids)}))


def blind_append(table: Path, region: str, ids: list[int]) -> None:
    """A delta-spark append: its commitInfo says isBlindAppend=true."""
    add = write_file(table, f"region={region}", ids)
    version = DeltaTable(str(table)).version() + 1
    info = operation_commit_info("WRITE", {"mode": "Append"}, {}, 0, isBlindAppend=True,
                                 engineInfo="Apache-Spark/4.2.0 Delta-Lake/4.4.0")
    assert put_entry(uri(table), version, [info, add_action(add)])


def outside_merge(table: Path, rows: dict[int, tuple[int, str]]) -> None:
    """delta-rs's MERGE (not a blind append): updates or inserts ``rows`` by id."""
    source = pa.table({"id": pa.array(list(rows), pa.int64()),
                       "value": pa.array([v for v, _ in rows.values()], pa.int64()),
                       "region": [r for _, r in rows.values()]})
    (DeltaTable(str(table)).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())


def table_rows(table: Path) -> list[tuple]:
    data = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    return sorted((r["id"], r["value"], r["region"]) for r in data)


def apply(write: TableWriteRecord) -> int:
    return apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=7)


def test_a_blind_append_to_the_partition_read_does_not_conflict_and_the_merge_lands_after_it(
        table):
    write = merge_of_eu(table)
    blind_append(table, "eu", [5])
    check_row_level_write(write)
    assert apply(write) == 2, "its own commit is the next version"
    assert table_rows(table) == [(1, 11, "eu"), (2, 20, "eu"), (3, 30, "us"), (4, 40, "us"),
                                 (5, 50, "eu"), (9, 90, "eu")]


def test_a_blind_append_to_another_partition_does_not_conflict(table):
    write = merge_of_eu(table)
    blind_append(table, "us", [5])
    check_row_level_write(write)


def test_under_serializable_a_blind_append_conflicts_where_the_write_read_only(table):
    write = merge_of_eu(table, isolation=SERIALIZABLE)
    blind_append(table, "us", [5])
    check_row_level_write(write)
    blind_append(table, "eu", [6])
    with pytest.raises(RowLevelConflict, match=r"version 2 \(WRITE.*added 1 file.*region.*eu"):
        check_row_level_write(write)


def test_a_blind_append_conflicts_with_a_write_that_changes_the_metadata(table):
    write = merge_of_eu(table, merge_schema=True)  # MERGE withSchemaEvolution
    blind_append(table, "eu", [5])
    with pytest.raises(RowLevelConflict, match="added 1 file"):
        check_row_level_write(write)


def test_an_outside_merge_of_another_partition_does_not_conflict_and_both_land(table):
    write = merge_of_eu(table)
    outside_merge(table, {3: (33, "us"), 7: (70, "us")})  # rewrites us, inserts into us
    check_row_level_write(write)
    apply(write)
    assert table_rows(table) == [(1, 11, "eu"), (2, 20, "eu"), (3, 33, "us"), (4, 40, "us"),
                                 (7, 70, "us"), (9, 90, "eu")]


def test_an_outside_merge_adding_rows_to_the_partition_read_conflicts(table):
    write = merge_of_eu(table)
    outside_merge(table, {8: (80, "eu")})  # an insert only: adds to eu, removes nothing
    with pytest.raises(RowLevelConflict, match=r"\(MERGE, by delta-rs.*added 1 file"):
        check_row_level_write(write)


def test_an_append_that_is_not_blind_conflicts_only_where_the_write_read(table):
    write = merge_of_eu(table)
    write_deltalake(str(table), pa.table({"id": [5], "value": [50], "region": ["us"]}),
                    mode="append")  # delta-rs writes no isBlindAppend
    check_row_level_write(write)
    write_deltalake(str(table), pa.table({"id": [6], "value": [60], "region": ["eu"]}),
                    mode="append")
    with pytest.raises(RowLevelConflict, match="version 2 .*added 1 file"):
        check_row_level_write(write)


def test_an_outside_optimize_of_another_partition_does_not_conflict(table):
    write = merge_of_eu(table)
    write_deltalake(str(table), pa.table({"id": [5], "value": [50], "region": ["us"]}),
                    mode="append")
    DeltaTable(str(table)).optimize.compact(partition_filters=[("region", "=", "us")])
    assert DeltaTable(str(table)).history(1)[0]["operation"] == "OPTIMIZE"
    check_row_level_write(write)
    apply(write)
    assert table_rows(table) == [(1, 11, "eu"), (2, 20, "eu"), (3, 30, "us"), (4, 40, "us"),
                                 (5, 50, "us"), (9, 90, "eu")]


def test_an_outside_optimize_of_the_partition_read_conflicts(table):
    write = merge_of_eu(table)
    blind_append(table, "eu", [5])
    DeltaTable(str(table)).optimize.compact(partition_filters=[("region", "=", "eu")])
    # the file of version 0 it read, not the one appended since
    with pytest.raises(RowLevelConflict, match=r"\(OPTIMIZE.*removed 1 file"):
        check_row_level_write(write)


def test_an_optimize_of_only_files_added_after_the_read_does_not_conflict(table):
    """Its adds carry dataChange=false: the rows of the files it removes, which the write did
    not read (two blind appends)."""
    write = merge_of_eu(table)
    blind_append(table, "eu", [5])
    blind_append(table, "eu", [6])
    read = {f.path for f in files_of_version(uri(table), 0).files}
    appended = [f for f in files_of_version(uri(table), 2).files if f.path not in read]
    compacted = write_file(table, "region=eu", [5, 6])
    info = operation_commit_info("OPTIMIZE", {}, {}, 0, isBlindAppend=False)
    assert put_entry(uri(table), 3, [
        info, add_action(compacted, data_change=False),
        *(remove_action(f.path, f.size, {"region": "eu"}, 0, data_change=False)
          for f in appended)])
    check_row_level_write(write)
    apply(write)
    assert table_rows(table) == [(1, 11, "eu"), (2, 20, "eu"), (3, 30, "us"), (4, 40, "us"),
                                 (5, 50, "eu"), (6, 60, "eu"), (9, 90, "eu")]


def test_a_delete_of_a_file_read_conflicts_and_of_another_does_not(table):
    write = merge_of_eu(table)
    DeltaTable(str(table)).delete("region = 'us' AND id = 4")
    check_row_level_write(write)
    DeltaTable(str(table)).delete("region = 'eu' AND id = 2")
    with pytest.raises(RowLevelConflict, match=r"version 2 \(DELETE.*removed 1 file.*read"):
        check_row_level_write(write)


def test_a_removed_file_the_write_replaces_conflicts_whatever_its_predicate(table):
    write = merge_of_eu(table, predicate={"column": "region", "op": "=", "value": "us"})
    DeltaTable(str(table)).delete("region = 'eu' AND id = 2")
    with pytest.raises(RowLevelConflict, match="removed 1 file"):
        check_row_level_write(write)


def test_a_metadata_change_conflicts(table):
    write = merge_of_eu(table)
    DeltaTable(str(table)).alter.set_table_properties({"delta.logRetentionDuration":
                                                       "interval 30 days"})
    with pytest.raises(RowLevelConflict, match="changed the table's metadata"):
        check_row_level_write(write)


def test_a_write_that_read_the_whole_table_conflicts_with_any_data_but_a_blind_append(table):
    write = merge_of_eu(table, predicate=True)
    blind_append(table, "us", [5])
    check_row_level_write(write)
    outside_merge(table, {8: (80, "us")})  # an insert only
    with pytest.raises(RowLevelConflict, match="read of the whole table"):
        check_row_level_write(write)


def test_a_compaction_ignores_added_data_and_conflicts_on_its_files_only(table):
    """An OPTIMIZE write (dataChange=false) is judged under SnapshotIsolation, as delta-spark's
    OPTIMIZE: data added meanwhile does not matter; a file it read being removed does."""
    eu = merge_of_eu(table)
    copy = write_file(table, f"_percolake/{TXN}/optimize/region=eu", [1, 2])
    write = dataclasses.replace(eu, operation="OPTIMIZE", data_change=False, add_files=(copy,))
    write_deltalake(str(table), pa.table({"id": [6], "value": [60], "region": ["eu"]}),
                    mode="append")
    check_row_level_write(write)
    DeltaTable(str(table)).delete("region = 'eu' AND id = 2")
    with pytest.raises(RowLevelConflict, match="removed 1 file"):
        check_row_level_write(write)


def test_an_intent_without_a_read_set_keeps_the_conservative_rule(table):
    """Intents recorded before read sets: the whole table, Serializable."""
    write = merge_of_eu(table, read_set="")
    blind_append(table, "us", [5])
    with pytest.raises(RowLevelConflict, match="added 1 file"):
        check_row_level_write(write)
