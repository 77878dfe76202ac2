"""Reading one data file of a percolake source's micro-batch on a Spark executor (pyarrow only).

Each file becomes Arrow record batches in exactly the Arrow schema Spark expects of the source's
Spark schema: columns in schema order, cast to their types, partition values (strings in the
Delta log) added as columns, columns and nested struct fields the file lacks (added to the table
later) as nulls. A file with columns or nested struct fields the schema lacks (added upstream
after the query started) is refused, unless the source's ``new_columns`` option is ``ignore``
(then they are left out).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql.datasource import InputPartition

from percolake.lake import storage
from sparkside.delta_log import DataFile
from sparkside.errors import UpstreamSchemaChanged

BATCH_ROWS = 65_536


@dataclass
class FilePartition(InputPartition):
    """One Spark task of a percolake source: one data file of one upstream version.

    ``s3`` carries the driver's S3 settings and limits for an object-store table (executors
    need no AWS variables of their own); it is never shown by ``repr``.
    """

    table: str
    version: int
    file: DataFile
    s3: tuple[storage.S3Settings, storage.Limits] | None = None

    def __repr__(self) -> str:
        return f"FilePartition({self.table} v{self.version} {self.file.path})"

    def filesystem(self) -> pafs.FileSystem:
        if self.s3 is None:
            return pafs.LocalFileSystem()
        return storage.s3_filesystem(*self.s3)


def read_file(partition: FilePartition, schema: pa.Schema,
              ignore_new_columns: bool = False) -> Iterator[pa.RecordBatch]:
    """The rows of the partition's file as record batches of ``schema``.

    Raises:
        UpstreamSchemaChanged: the file has columns ``schema`` lacks (the upstream table gained
            them after the query started), unless ``ignore_new_columns``; or a column of a wider
            type than ``schema``'s (Delta's type widening upstream since the query started).
    """
    with partition.filesystem().open_input_file(partition.file.path) as stream:
        parquet = pq.ParquetFile(stream)
        present = set(parquet.schema_arrow.names)
        new = added_fields(parquet.schema_arrow, schema)
        if new and not ignore_new_columns:
            raise UpstreamSchemaChanged(
                f"table {partition.table}: version {partition.version} has columns {new} that "
                "this query's percolake source lacks (the upstream table gained them after the "
                "query started; the source takes the table's schema when the query starts). "
                "Restart the query to read them, or set .option(\"new_columns\", \"ignore\") "
                "on the source to go on without them")
        wanted = [f.name for f in schema if f.name in present]
        widened = [f"{f.name} ({f.type} in the query, {parquet.schema_arrow.field(f.name).type} "
                   "in the file)" for f in schema
                   if f.name in present and wider(parquet.schema_arrow.field(f.name).type, f.type)]
        if widened:
            raise UpstreamSchemaChanged(
                f"table {partition.table}: version {partition.version} has columns of a wider "
                f"type than this query's percolake source reads: {', '.join(widened)} (Delta's "
                "type widening changed them upstream after the query started; the source takes "
                "the table's schema when the query starts). Restart the query to read them with "
                "their new types")
        values = dict(partition.file.partition_values)
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=wanted):
            yield conform(batch, schema, values)


def added_fields(file: pa.Schema, schema: pa.Schema) -> list[str]:
    """The columns and nested struct fields (``s.z``, ``a.element.z``, ``m.value.z``) of a
    file that ``schema`` lacks, sorted."""
    found: list[str] = []
    _added(pa.struct(list(file)), pa.struct(list(schema)), "", found)
    return sorted(found)


def _added(file: pa.DataType, wanted: pa.DataType, path: str, found: list[str]) -> None:
    if pa.types.is_struct(file) and pa.types.is_struct(wanted):
        known = {wanted.field(i).name: wanted.field(i).type for i in range(wanted.num_fields)}
        for field in (file.field(i) for i in range(file.num_fields)):
            where = f"{path}{field.name}"
            if field.name not in known:
                found.append(where)
            else:
                _added(field.type, known[field.name], f"{where}.", found)
    elif pa.types.is_map(file) and pa.types.is_map(wanted):
        _added(file.item_type, wanted.item_type, f"{path}value.", found)
    elif pa.types.is_list(file) and pa.types.is_list(wanted) or \
            pa.types.is_large_list(file) and pa.types.is_large_list(wanted):
        _added(file.value_type, wanted.value_type, f"{path}element.", found)


def wider(file_type: pa.DataType, query_type: pa.DataType) -> bool:
    """Whether a file's column (or a field nested in it) holds a type wider than the query
    reads: an upstream type widening since the query started (casting would overflow or lose
    digits). A narrower one is a file written before an earlier widening, which the query's
    type reads; nested fields one side lacks are left to the cast."""
    if pa.types.is_struct(file_type) and pa.types.is_struct(query_type):
        names = {file_type.field(i).name for i in range(file_type.num_fields)}
        return any(wider(file_type.field(f.name).type, f.type) for f in query_type
                   if f.name in names)
    if pa.types.is_map(file_type) and pa.types.is_map(query_type):
        return wider(file_type.key_type, query_type.key_type) \
            or wider(file_type.item_type, query_type.item_type)
    if (pa.types.is_list(file_type) or pa.types.is_large_list(file_type)) \
            and (pa.types.is_list(query_type) or pa.types.is_large_list(query_type)):
        return wider(file_type.value_type, query_type.value_type)
    if file_type == query_type:
        return False
    if pa.types.is_timestamp(file_type) and pa.types.is_date(query_type):
        return True
    try:
        unified = pa.unify_schemas([pa.schema([("c", query_type)]), pa.schema([("c", file_type)])],
                                   promote_options="permissive").field("c").type
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return False  # not a widening: the cast decides, as before
    return (pa.types.is_integer(unified) or pa.types.is_floating(unified)
            or pa.types.is_decimal(unified)) and unified != query_type


def conform(batch: pa.RecordBatch, schema: pa.Schema,
            partition_values: dict[str, str | None]) -> pa.RecordBatch:
    """``batch`` in ``schema``: partition columns from their values, missing ones null."""
    rows = batch.num_rows
    columns: list[pa.Array] = []
    for field in schema:
        if field.name in partition_values:
            raw = partition_values[field.name]
            if raw == "" and not pa.types.is_string(field.type):
                raw = None  # Delta's empty partition value of a non-string column is null
            column = pa.array([raw] * rows, pa.string()).cast(field.type)
        elif field.name in batch.schema.names:
            column = batch.column(field.name).cast(field.type)
        else:
            column = pa.nulls(rows, field.type)
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)
