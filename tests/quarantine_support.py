"""A partitioned Delta table and a row-level write of one of its partitions, for the quarantine
and optimize tests: built with delta-rs and pyarrow, no Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import files_of_version
from percolake.lake.warehouse import canonical_table_uri
from percolake.records import AddFileRecord, RemoveFileRecord, TableWriteRecord, WriteMode


def partitioned_table(path: Path) -> None:
    """Partition ``a`` in one file (ids 1, 2), partition ``b`` in two (ids 3 and 4)."""
    for ids, part in (([1, 2], "a"), ([3], "b"), ([4], "b")):
        write_deltalake(str(path), pa.table({"id": pa.array(ids, pa.int64()),
                                             "value": pa.array([i * 10 for i in ids],
                                                               pa.int64()),
                                             "part": [part] * len(ids)}),
                        partition_by=["part"], mode="append")


def update_partition_a(path: Path, txn_id: str) -> TableWriteRecord:
    """An UPDATE of the table's latest version setting id 2's value to 25: partition ``a``'s
    file replaced by one written into the attempt's folder."""
    uri = canonical_table_uri(str(path))
    version = DeltaTable(str(path)).version()
    files = files_of_version(uri, version)
    replaced = [f for f in files.files if f.partition_values.get("part") == "a"]
    folder = path / "_percolake" / txn_id / "op0" / "part=a"
    folder.mkdir(parents=True, exist_ok=True)
    written = folder / "part-00000.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()),
                             "value": pa.array([10, 25], pa.int64())}), written)
    add = AddFileRecord(written.relative_to(path).as_posix(), written.stat().st_size,
                        {"part": "a"}, 0, json.dumps({"numRecords": 2}))
    return TableWriteRecord(
        uri, WriteMode.ROW_LEVEL, (add,), files.schema_json, ("part",),
        remove_files=tuple(RemoveFileRecord(f.path, f.size, dict(f.partition_values))
                           for f in replaced),
        read_version=version, operation="UPDATE",
        operation_metrics=json.dumps({"numUpdatedRows": "1", "numCopiedRows": "1"}))


def table_rows(path: Path) -> list[tuple]:
    """The table's rows at its latest version, sorted."""
    data = read_delta_table(canonical_table_uri(str(path)))
    return sorted(zip(*(data.column(c).to_pylist() for c in ("id", "value", "part")),
                      strict=True))


BEFORE = [(1, 10, "a"), (2, 20, "a"), (3, 30, "b"), (4, 40, "b")]
UPDATED = [(1, 10, "a"), (2, 25, "a"), (3, 30, "b"), (4, 40, "b")]
