"""Writing a column-mapped Delta table's files as delta-spark does (``delta.columnMapping.mode``
``name`` or ``id``): each column, nested fields too, under its physical name with its column
mapping id as the Parquet field id; partition values keyed by physical names (Delta's log keys
them so). Readers find a column by physical name (``name``) or field id (``id``): a file with the
logical names reads back as nulls.

A ``merge_schema`` write (or a MERGE ``withSchemaEvolution``) that adds columns gets them ids and
physical names here, before its files are written (``ColumnMapping.evolved``,
``ColumnMapping.with_new_columns``); the write intent then carries the merged schema,
which the coordinator checks and the apply commits (``percolake.lake.schema_evolution``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from percolake.lake.schema_evolution import (
    SchemaConflict,
    added_columns,
    merged_schema,
    with_column_mapping,
)
from percolake.lake.table_features import physical_names, physical_schema
from percolake.records import AddFileRecord, PartitionValues
from sparkside.writer import write_files

if TYPE_CHECKING:
    from percolake.lake.delta_commit import TableLayout


class ColumnMapping:
    """A column-mapped table's physical names and field ids (from its schema)."""

    def __init__(self, table_schema_json: str) -> None:
        self.schema_json = table_schema_json
        self.logical = json.loads(table_schema_json)
        self.physical = physical_schema(self.logical)
        self.names = physical_names(table_schema_json)  # top level: logical -> physical
        self._logical = {p: n for n, p in self.names.items()}

    @classmethod
    def of(cls, layout: TableLayout | None) -> ColumnMapping | None:
        """The table's mapping, None for a new table or one without column mapping."""
        if layout is None or layout.protocol.column_mapping == "none":
            return None
        return cls(layout.schema_json)

    @classmethod
    def evolved(cls, layout: TableLayout, batch_json: str) -> ColumnMapping | None:
        """The mapping of the table's schema merged with a ``merge_schema`` batch's new
        columns, each with an id above the table's maxColumnId and a physical name (as
        delta-spark assigns them), and its widened columns' new types (``delta.typeChanges``);
        None if the batch adds no column and widens none. Its ``schema_json`` is the schema
        the write intent carries."""
        try:
            mapping = cls.with_new_columns(layout.schema_json, layout.max_column_id,
                                           batch_json, type_widening=layout.type_widening)
        except SchemaConflict:
            return None  # the schema check refuses the batch, naming the columns
        if not added_columns(layout.schema_json, batch_json) \
                and json.loads(mapping.schema_json) == json.loads(layout.schema_json):
            return None
        return mapping

    @classmethod
    def with_new_columns(cls, table_schema_json: str, max_column_id: int, batch_json: str,
                         type_widening: bool = False,
                         implicit_conversions: bool = False) -> ColumnMapping:
        """The mapping of ``table_schema_json`` merged with the columns of ``batch_json`` it
        lacks (and, with ``type_widening``, its widenings), each new field with an id above
        ``max_column_id`` and a physical name (the batch's own field metadata is left out:
        only the ids assigned here count). Used by ``merge_schema`` appends and by MERGE's
        ``withSchemaEvolution`` (with ``implicit_conversions``, ``merged_schema``'s).

        Raises:
            SchemaConflict: a batch column's type differs from the table's (and is no
                widening ``type_widening`` allows; never with ``implicit_conversions``).
        """
        merged = merged_schema(table_schema_json, batch_json, type_widening=type_widening,
                               implicit_conversions=implicit_conversions)
        return cls(with_column_mapping(merged, max_column_id))

    def frame(self, df: DataFrame, passthrough: Sequence[str] = ()) -> DataFrame:
        """``df`` (the table's columns, any order; nested struct fields matched by name, a
        missing one null) with physical names and field ids; its ``passthrough`` columns
        (no table column, e.g. the change files' ``_change_type``) keep their name and get no
        field id, as delta-spark writes them."""
        logical = {f["name"]: f for f in self.logical["fields"]}
        fields = {f["name"]: f for f in self.physical["fields"]}
        columns: list[Column] = []
        for source in df.schema.fields:
            if source.name in passthrough:
                columns.append(F.col("`" + source.name.replace("`", "``") + "`"))
                continue
            field = fields[self.names[source.name]]
            data_type = T.StructField.fromJson(field).dataType
            column = F.col("`" + source.name.replace("`", "``") + "`")
            if not isinstance(field["type"], str):  # renames nested fields, with their ids
                column = by_name(column, source.dataType,
                                 logical[source.name]["type"]).cast(data_type)
            columns.append(column.alias(field["name"], metadata=field["metadata"]))
        return df.select(*columns)

    def write(self, df: DataFrame, table_uri: str, location_uri: str,
              partition_by: list[str], passthrough: Sequence[str] = ()) -> list[AddFileRecord]:
        """Writes ``df`` (the table's columns, by column name, and the ``passthrough`` ones of
        ``frame``) as the table's files: physical names and field ids, statistics keyed by
        physical names; the adds' partition values keyed by column name, as write intents
        carry them."""
        adds = write_files(self.frame(df, passthrough), table_uri, location_uri,
                           self.partition_columns(partition_by), self.physical)
        return [dataclasses.replace(a, partition_values=self.logical_values(a.partition_values))
                for a in adds]

    def read_frame(self, files: DataFrame, *extra: Column) -> DataFrame:
        """Files this mapping wrote (read with ``physical_struct``), under column names,
        with the ``extra`` columns."""
        logical = T.StructType.fromJson(self.logical)
        return files.select(*[
            F.col("`" + self.names[f.name].replace("`", "``") + "`").cast(f.dataType)
            .alias(f.name) for f in logical.fields], *extra)

    def physical_struct(self) -> T.StructType:
        return T.StructType.fromJson(self.physical)

    def partition_columns(self, logical: list[str]) -> list[str]:
        return [self.names[c] for c in logical]

    def logical_values(self, values: PartitionValues) -> dict[str, str | None]:
        """Partition values keyed by physical name, keyed by column name."""
        return {self._logical.get(k, k): v for k, v in values.items()}


def by_name(column: Column, source: T.DataType, target: Any) -> Column:
    """``column`` (of Spark type ``source``) with its struct fields, nested ones too, in the
    order of the Delta type ``target`` (parsed JSON), matched by name; a field ``target`` has
    and ``source`` lacks is null. Unchanged where the names already line up, so that a cast to
    ``target``'s physical type (which goes by position) renames each field to its own."""
    if _names(source) == _names(_spark_type(target)):
        return column
    if isinstance(source, T.StructType) and _kind(target) == "struct":
        given = {f.name: f for f in source.fields}
        parts = []
        for field in target["fields"]:
            found = given.get(field["name"])
            parts.append((F.lit(None).cast(_spark_type(field["type"])) if found is None
                          else by_name(column.getField(found.name), found.dataType,
                                       field["type"])).alias(field["name"]))
        return F.when(column.isNull(), F.lit(None)).otherwise(F.struct(*parts))
    if isinstance(source, T.ArrayType) and _kind(target) == "array":
        return F.transform(column, lambda element: by_name(element, source.elementType,
                                                            target["elementType"]))
    if isinstance(source, T.MapType) and _kind(target) == "map":
        return F.transform_values(column, lambda _, value: by_name(value, source.valueType,
                                                                   target["valueType"]))
    return column


def _kind(delta_type: Any) -> str | None:
    return delta_type.get("type") if isinstance(delta_type, dict) else None


def _spark_type(delta_type: Any) -> T.DataType:
    return T.StructField.fromJson({"name": "x", "type": delta_type, "nullable": True,
                                   "metadata": {}}).dataType


def _names(data_type: T.DataType) -> Any:
    """The nested field names of a Spark type, in order."""
    if isinstance(data_type, T.StructType):
        return tuple((f.name, _names(f.dataType)) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return ("array", _names(data_type.elementType))
    if isinstance(data_type, T.MapType):
        return ("map", _names(data_type.keyType), _names(data_type.valueType))
    return None
