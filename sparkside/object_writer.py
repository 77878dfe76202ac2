"""Writing one table's data files straight to an object store from Spark's executors.

Each task gets its partition of the batch as Arrow record batches (``mapInArrow``), splits them
by the table's partition columns, and writes one Parquet file per partition value with
pyarrow's S3 filesystem, once, under the attempt's prefix ``<table>/_percolake/<txn_id>/``: no
local staging, no rename. The task returns each file's Delta add (path, size, partition values,
stats from the footer it has just written), so the driver downloads nothing.

Why not Spark's own Parquet writer through ``s3a://``: its commit protocol writes under
``_temporary`` and renames, which on S3 is a copy of every file at job commit; the committers
that avoid it need ``spark-hadoop-cloud``, which is not published for Spark 4.2.0. Measured on
moto (``scripts/bench_s3_write.py``, docs/benchmarks.md): 0.6 s (2 files) to 1.2 s (8 files)
per table write through s3a against 0.14-0.3 s here, and 3 requests per file instead of ~28.

The S3 settings are resolved on the driver (environment or profile) and travel inside the
task, as Spark's own ``fs.s3a`` credentials do: executors need no AWS variables of their own.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from percolake.errors import ProtocolError
from percolake.lake import storage
from percolake.lake.parquet_stats import delta_stats
from percolake.lake.partition_values import (
    floating_partition_value,
    timestamp_partition_value,
)
from percolake.lake.warehouse import split_object_uri
from percolake.records import AddFileRecord

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
RESULT_SCHEMA = ("path string, size long, partition_values string, modification_time long, "
                 "stats string, attempt int")
# An executor's storage failure crosses Spark's task boundary as text; these brackets carry
# its already-scrubbed message through the Python traceback Spark wraps it in.
# (built from a constant, so the traceback's own copy of the raising line never matches)
_MARK = "percolake-storage-error"
ARROW_FIELD_ID = b"PARQUET:field_id"
_ERROR_MARK = re.compile(re.escape(_MARK) + r"\[(.*?)\]" + re.escape(_MARK), re.S)


@dataclasses.dataclass(frozen=True)
class _Target:
    """What a task needs: where to write and how to reach the store (no credential in repr)."""

    bucket: str
    table_key: str  # the table's key prefix, decoded
    location_key: str  # the attempt folder's key prefix, decoded
    partition_by: tuple[str, ...]
    settings: storage.S3Settings
    bounds: storage.Limits
    file_prefix: str
    physical: dict[str, Any] | None = None  # column mapping: the physical schema (field ids)


def write_object_files(df: DataFrame, table_uri: str, location_uri: str,
                       partition_by: list[str], physical: dict[str, Any] | None = None
                       ) -> list[AddFileRecord]:
    """Has the executors write ``df`` under the object-store ``location_uri``; returns the adds,
    with paths relative to the table root. ``physical``: a column-mapped table's physical
    schema, whose Parquet field ids the files carry (``df`` has its physical names).

    Raises:
        StorageSettingsError, StorageRefused, StorageUnavailable: the store's settings are
            missing, or it refused or did not answer a write (message from the executor).
    """
    _, bucket, table_key = split_object_uri(table_uri)
    _, location_bucket, location_key = split_object_uri(location_uri)
    if location_bucket != bucket or not location_key.startswith(table_key.rstrip("/") + "/"):
        raise AssertionError(f"write location {location_uri} is not below {table_uri}")
    target = _Target(bucket, table_key.rstrip("/"), location_key.rstrip("/"),
                     tuple(partition_by), storage.s3_settings(), storage.limits(),
                     f"part-{uuid.uuid4().hex[:12]}", physical)
    try:
        rows = df.mapInArrow(lambda batches: _write_task(target, batches), RESULT_SCHEMA) \
            .collect()
    except Exception as exc:
        raise _storage_error_of(exc, location_uri) from None
    adds = [AddFileRecord(path=r.path, size=r.size,
                          partition_values=json.loads(r.partition_values),
                          modification_time=r.modification_time, stats=r.stats) for r in rows]
    speculation = (df.sparkSession.conf.get("spark.speculation", "false") or "").lower()
    if any(r.attempt > 0 for r in rows) or speculation == "true":
        _remove_unreferenced(location_uri, target, adds)
    return sorted(adds, key=lambda a: a.path)


def _remove_unreferenced(location_uri: str, target: _Target, adds: list[AddFileRecord]) -> None:
    """Deletes what failed or speculative task attempts left under the attempt's prefix: files
    no add names (a retried task writes new files rather than overwrite, so that a late
    attempt can never replace a file whose stats were already reported)."""
    prefix = target.location_key[len(target.table_key) + 1:] + "/"
    named = {a.path[len(prefix):] for a in adds}
    extra = [path for path in storage.list_files(location_uri) if path not in named]
    if extra:
        storage.delete_objects(location_uri, extra)


def _storage_error_of(exc: Exception, location_uri: str) -> Exception:
    found = _ERROR_MARK.search(str(exc))
    if found is None:
        return exc
    return storage.storage_error(OSError(found.group(1)), location_uri,
                                 "write the data files below")


# ---------------------------------------------------------------- on the executors


def _write_task(target: _Target, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    collected = list(batches)
    if not collected:
        return
    table = pa.Table.from_batches(collected)
    if table.num_rows == 0:
        return
    context = TaskContext.get()
    attempt = context.attemptNumber() if context else 0
    task = f"{context.partitionId() if context else 0:05d}-{attempt}"
    filesystem = storage.s3_filesystem(target.settings, target.bounds)
    results = []
    for number, (values, part) in enumerate(_split(table, target.partition_by)):
        folder = "/".join(f"{_escape(c)}={_escape(v) if v is not None else HIVE_NULL}"
                          for c, v in values.items())
        name = f"{target.file_prefix}-{task}-{number:03d}.snappy.parquet"
        relative_to_location = f"{folder}/{name}" if folder else name
        key = f"{target.location_key}/{relative_to_location}"
        if target.physical is not None:
            part = part.cast(with_field_ids(part.schema, target.physical))
        collector: list[pq.FileMetaData] = []
        try:
            with filesystem.open_output_stream(f"{target.bucket}/{key}") as out:
                pq.write_table(part, out, compression="snappy", metadata_collector=collector)
                size = out.tell()
        except OSError as exc:
            message = storage.scrub(str(exc), target.settings.secrets)
            raise OSError(f"{_MARK}[{message}]{_MARK}") from None
        results.append({
            "path": key[len(target.table_key) + 1:],
            "size": size,
            "partition_values": json.dumps(values, separators=(",", ":")),
            "modification_time": int(time.time() * 1000),
            "stats": json.dumps(delta_stats(collector[0]), separators=(",", ":")),
            "attempt": attempt,
        })
    yield pa.RecordBatch.from_pylist(results, schema=pa.schema([
        ("path", pa.string()), ("size", pa.int64()), ("partition_values", pa.string()),
        ("modification_time", pa.int64()), ("stats", pa.string()), ("attempt", pa.int32())]))


def _split(table: pa.Table, partition_by: tuple[str, ...]
           ) -> Iterator[tuple[dict[str, str | None], pa.Table]]:
    """The rows of each partition value (as Delta writes it), partition columns dropped, every
    field nullable (as Spark's own files and the table's Delta schema have them)."""
    data_columns = [c for c in table.column_names if c not in partition_by]
    schema = pa.schema([table.schema.field(c).with_nullable(True) for c in data_columns])
    if not partition_by:
        yield {}, table.select(data_columns).cast(schema)
        return
    numbered = table.append_column("__percolake_row", pa.array(range(table.num_rows), pa.int64()))
    groups = numbered.group_by(list(partition_by), use_threads=False) \
        .aggregate([("__percolake_row", "list")])
    for group in groups.to_pylist():
        values = {c: _partition_value(group[c], table.schema.field(c).type)
                  for c in partition_by}
        rows = table.take(pa.array(group["__percolake_row_list"], pa.int64()))
        yield values, rows.select(data_columns).cast(schema)


def _partition_value(value: object, arrow_type: pa.DataType) -> str | None:
    """A partition value (of the column's ``arrow_type``) as Delta's log stores it (what
    Spark's writer would give)."""
    if value is None or value == "":
        return None  # Spark writes an empty string partition value as null
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return timestamp_partition_value(value)
    if isinstance(value, float):
        return floating_partition_value(value, pa.types.is_float32(arrow_type))
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, bytes):
        raise ProtocolError("binary partition columns are not supported")
    return str(value)


def _escape(text: str) -> str:
    """A folder name part for ``text``: letters, digits and ``_.-`` kept, the rest %XX (so a
    value never makes a ``/``, ``..`` or a character an object key cannot carry)."""
    escaped = quote(text, safe="_-")
    return escaped.replace(".", "%2E") if escaped in (".", "..") else escaped


def with_field_ids(schema: pa.Schema, physical: dict[str, Any]) -> pa.Schema:
    """An Arrow schema whose fields carry the Parquet field ids of ``physical`` (a Delta schema
    from ``physical_schema``), matched by name: what pyarrow writes as field ids."""
    fields = {f["name"]: f for f in physical["fields"]}
    return pa.schema([_arrow_field(f, fields.get(f.name)) for f in schema])


def _arrow_field(field: pa.Field, spec: dict[str, Any] | None) -> pa.Field:
    if spec is None:
        return field
    field = field.with_type(_arrow_type(field.type, spec["type"]))
    field_id = spec.get("metadata", {}).get("parquet.field.id")
    if field_id is None:
        return field
    return field.with_metadata({**(field.metadata or {}), ARROW_FIELD_ID: str(field_id)})


def _arrow_type(arrow_type: pa.DataType, delta_type: Any) -> pa.DataType:
    if not isinstance(delta_type, dict):
        return arrow_type
    if pa.types.is_struct(arrow_type) and delta_type.get("type") == "struct":
        specs = {f["name"]: f for f in delta_type["fields"]}
        return pa.struct([_arrow_field(arrow_type.field(i), specs.get(arrow_type.field(i).name))
                          for i in range(arrow_type.num_fields)])
    if pa.types.is_list(arrow_type) and delta_type.get("type") == "array":
        value = arrow_type.value_field
        return pa.list_(value.with_type(_arrow_type(value.type, delta_type["elementType"])))
    if pa.types.is_map(arrow_type) and delta_type.get("type") == "map":
        key, item = arrow_type.key_field, arrow_type.item_field
        return pa.map_(key.with_type(_arrow_type(key.type, delta_type["keyType"])),
                       item.with_type(_arrow_type(item.type, delta_type["valueType"])))
    return arrow_type
