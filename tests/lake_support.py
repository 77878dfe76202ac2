"""Prewritten table writes for the coordinator's lake tests: one Parquet file in an attempt's
folder and the write intent that names it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import Schema

from percolake.records import AddFileRecord, TableWriteRecord, WriteMode


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
