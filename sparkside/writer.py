"""Writing one table's data files with Spark's executors, and describing them as Delta adds.

Executors write Parquet once, into the attempt's folder ``<table>/_percolake/<txn_id>``. On a
local filesystem Spark's Parquet writer does it and the driver reads the files' footers (pyarrow)
for Delta's per-file stats; on an object store ``object_writer`` does both on the executors.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import threading
import zoneinfo
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow.parquet as pq
from deltalake import Schema
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from percolake.lake.parquet_stats import delta_stats
from percolake.lake.partition_values import timestamp_partition_value
from percolake.lake.warehouse import is_object_store, local_path
from percolake.records import AddFileRecord
from sparkside.object_writer import write_object_files

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
TIMESTAMP_TYPE_KEY = "spark.sql.parquet.outputTimestampType"
DELTA_TIMESTAMPS = "TIMESTAMP_MICROS"  # Delta's timestamps, not Spark's INT96

# The session setting is shared by every thread writing at once: it is set when the first
# write starts and restored when the last one ends (per session: [writes running, value before]).
_timestamp_lock = threading.Lock()
_timestamp_users: dict[int, list] = {}


def delta_schema_json(df: DataFrame) -> str:
    """The Delta schema JSON of a DataFrame's schema (partition columns included).

    Every field is nullable, nested ones too, as in the Parquet files Spark writes.
    """
    return struct_schema_json(df.schema)


def struct_schema_json(schema: T.StructType) -> str:
    """The Delta schema JSON of a Spark schema, every field nullable (``delta_schema_json``)."""
    arrow = to_arrow_schema(as_nullable(schema), timezone="UTC")
    return Schema.from_arrow(arrow).to_json()


def as_nullable(data_type: T.DataType) -> T.DataType:
    """``data_type`` with every nested field, element and value nullable (Spark's
    ``asNullable``)."""
    if isinstance(data_type, T.StructType):
        return T.StructType([T.StructField(f.name, as_nullable(f.dataType), True, f.metadata)
                             for f in data_type.fields])
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(as_nullable(data_type.elementType), True)
    if isinstance(data_type, T.MapType):
        return T.MapType(as_nullable(data_type.keyType), as_nullable(data_type.valueType),
                         True)
    return data_type


def write_files(df: DataFrame, table_uri: str, location_uri: str, partition_by: list[str],
                physical: dict[str, Any] | None = None) -> list[AddFileRecord]:
    """Has the executors write ``df`` as Parquet under ``location_uri``; returns the adds.

    Paths in the returned adds are relative to the table root, as Delta stores them. On an
    object store the executors write through Arrow (``object_writer``); locally through Spark's
    Parquet writer, then the driver reads the footers. ``physical``: a column-mapped table's
    physical schema (``df`` already carries its names and, as Spark's field metadata, its
    field ids, which Spark's writer writes itself).
    """
    if is_object_store(location_uri):
        return write_object_files(df, table_uri, location_uri, partition_by, physical)
    location = local_path(location_uri)
    writer = df.write.mode("overwrite").option("compression", "snappy")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    with delta_timestamps(df.sparkSession):
        writer.parquet(location)
    conf = df.sparkSession.conf
    types = {f.name: f.dataType for f in df.schema.fields if f.name in partition_by}
    session_zone = conf.get("spark.sql.session.timeZone", "UTC") or "UTC"
    adds = describe_files(table_uri, location, partition_by)
    return [_canonical_partitions(add, types, session_zone) for add in adds]


@contextmanager
def delta_timestamps(session: SparkSession) -> Iterator[None]:
    """Spark writes timestamps as Delta's microseconds while at least one write runs."""
    conf, key = session.conf, session._jsparkSession.hashCode()  # the JVM session's
    with _timestamp_lock:
        users = _timestamp_users.get(key)
        if users is None:
            users = _timestamp_users[key] = [0, conf.get(TIMESTAMP_TYPE_KEY, None)]
            conf.set(TIMESTAMP_TYPE_KEY, DELTA_TIMESTAMPS)
        users[0] += 1
    try:
        yield
    finally:
        with _timestamp_lock:
            users[0] -= 1
            if users[0] == 0:
                del _timestamp_users[key]
                previous = users[1]
                if previous is None:
                    conf.unset(TIMESTAMP_TYPE_KEY)
                elif previous != DELTA_TIMESTAMPS:
                    conf.set(TIMESTAMP_TYPE_KEY, previous)


def _canonical_partitions(add: AddFileRecord, types: dict[str, T.DataType],
                          session_zone: str) -> AddFileRecord:
    """Timestamp partition values as delta-spark writes them: UTC, with microseconds, in ISO
    8601 with a ``Z`` (``2026-01-01T12:00:00.000000Z``); timestamp_ntz ones without a zone.

    Spark names timestamp partition folders in the session time zone and drops a zero
    fraction; delta-spark reads a timestamp partition value without a zone in the reading
    session's time zone, so a zoneless UTC value would read hours off outside UTC.
    """
    values = dict(add.partition_values)
    for column, value in values.items():
        data_type = types.get(column)
        if value is None or not isinstance(data_type, T.TimestampType | T.TimestampNTZType):
            continue
        moment = datetime.datetime.fromisoformat(value)
        if isinstance(data_type, T.TimestampType):
            moment = moment.replace(tzinfo=zoneinfo.ZoneInfo(session_zone))
        values[column] = timestamp_partition_value(moment)
    return dataclasses.replace(add, partition_values=values)


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
                stats=json.dumps(delta_stats(metadata), separators=(",", ":")),
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
