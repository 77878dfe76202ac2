"""Writing one table's data files with Spark's executors, and describing them as Delta adds.

Executors write Parquet once, into the attempt's folder ``<table>/_percolake/<txn_id>``; the
driver then reads only the files' footers (pyarrow) for Delta's per-file stats.
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq
from deltalake import Schema
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema

from coordinator.records import AddFileRecord
from coordinator.warehouse import local_path

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def delta_schema_json(df: DataFrame) -> str:
    """The Delta schema JSON of a DataFrame's schema (partition columns included)."""
    arrow = to_arrow_schema(df.schema, timezone="UTC")
    return Schema.from_arrow(arrow).to_json()


def write_files(df: DataFrame, table_uri: str, location_uri: str,
                partition_by: list[str]) -> list[AddFileRecord]:
    """Has the executors write ``df`` as Parquet under ``location_uri``; returns the adds.

    Paths in the returned adds are relative to the table root, as Delta stores them.
    """
    location = local_path(location_uri)
    writer = df.write.mode("overwrite").option("compression", "snappy")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.parquet(location)
    return describe_files(table_uri, location, partition_by)


def describe_files(table_uri: str, location: str, partition_by: list[str]) -> list[AddFileRecord]:
    """Delta add actions (with stats) of every data file Spark wrote under ``location``."""
    root = Path(local_path(table_uri))
    adds: list[AddFileRecord] = []
    for folder, _, files in os.walk(location):
        for name in sorted(files):
            if name.startswith((".", "_")) or not name.endswith(".parquet"):
                continue
            path = Path(folder) / name
            metadata = pq.read_metadata(path)
            if metadata.num_rows == 0:
                continue  # Spark writes an empty file for an empty batch: nothing to add
            relative = path.relative_to(root).as_posix()
            adds.append(AddFileRecord(
                path=relative,
                size=path.stat().st_size,
                partition_values=_partition_values(path.relative_to(location), partition_by),
                modification_time=int(path.stat().st_mtime * 1000),
                stats=json.dumps(_stats(metadata), separators=(",", ":")),
            ))
    return sorted(adds, key=lambda a: a.path)


def _partition_values(relative: Path, partition_by: list[str]) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for part in relative.parts[:-1]:
        key, sep, raw = part.partition("=")
        if sep and key in partition_by:
            value = unquote(raw)
            values[key] = None if value == HIVE_NULL else value
    missing = [c for c in partition_by if c not in values]
    if missing:
        raise AssertionError(f"file {relative} lacks partition folders for {missing}")
    return values


def _json_value(value: object) -> object:
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value.astimezone(datetime.timezone.utc).isoformat(timespec="microseconds") \
            .replace("+00:00", "Z")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    return None  # binary and other types: no min/max


def _stats(metadata: pq.FileMetaData) -> dict[str, object]:
    """numRecords, and min/max/nullCount of top-level columns over all row groups."""
    mins: dict[str, object] = {}
    maxs: dict[str, object] = {}
    nulls: dict[str, int] = {}
    complete: dict[str, bool] = {}
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            name = column.path_in_schema
            if "." in name:
                continue  # nested fields: no stats
            stats = column.statistics
            if stats is None or not stats.has_null_count:
                complete[name] = False
                continue
            nulls[name] = nulls.get(name, 0) + stats.null_count
            if stats.has_min_max:
                low, high = _json_value(stats.min), _json_value(stats.max)
                if low is None or high is None:
                    complete[name] = False
                    continue
                mins[name] = low if name not in mins else min(mins[name], low)  # type: ignore
                maxs[name] = high if name not in maxs else max(maxs[name], high)  # type: ignore
            elif stats.null_count != group.num_rows:
                complete[name] = False
            complete.setdefault(name, True)
    ok = [n for n, whole in complete.items() if whole]
    return {
        "numRecords": metadata.num_rows,
        "minValues": {n: mins[n] for n in ok if n in mins},
        "maxValues": {n: maxs[n] for n in ok if n in maxs},
        "nullCount": {n: nulls[n] for n in nulls},
    }
