"""Support of the coordinator's lake tests: a coordinator core in the test's process that applies
to real Delta tables (``make_core``; the ``core`` fixture of tests/conftest.py), and prewritten
table writes (one Parquet file in an attempt's folder and the write intent that names it)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import Schema

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.store import SqliteStore
from percolake.lake.delta_commit import apply_table_write
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode


def make_core(warehouse: Path, data: Path) -> TransactionCoordinator:
    """A coordinator core over the root ``warehouse`` with its SQLite store in ``data``,
    applying commits to the Delta tables itself (no daemon): restart it by making another on
    the same ``data``."""
    return TransactionCoordinator(
        SqliteStore(data, group_commit=True),
        CoordinatorConfig([str(warehouse)], retention_hours=24, barrier_interval_s=0.05),
        applier=functools.partial(apply_table_write, roots=[str(warehouse)]))


def one_file_write(root: Path, txn: str, data: pa.Table, merge: bool = True,
                   mode: WriteMode = WriteMode.APPEND) -> TableWriteRecord:
    """``data`` written as ``<root>/_percolake/<txn>/part-0.parquet``, and an unpartitioned
    write of that one file (``merge``: merge_schema)."""
    folder = root / "_percolake" / txn
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "part-0.parquet"
    pq.write_table(data, path)
    add = AddFileRecord(path.relative_to(root).as_posix(), path.stat().st_size, {}, 0,
                        json.dumps({"numRecords": data.num_rows}))
    return TableWriteRecord(f"file://{root}", mode, (add,),
                            Schema.from_arrow(data.schema).to_json(), (), (), merge)
