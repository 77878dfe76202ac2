"""Writing a column-mapped Delta table's files as delta-spark does (``delta.columnMapping.mode``
``name`` or ``id``): each column, nested fields too, under its physical name with its column
mapping id as the Parquet field id; partition values keyed by physical names (Delta's log keys
them so). Readers find a column by physical name (``name``) or field id (``id``): a file with the
logical names reads back as nulls.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from percolake.lake.table_features import physical_names, physical_schema
from percolake.records import PartitionValues

if TYPE_CHECKING:
    from percolake.lake.delta_commit import TableLayout


class ColumnMapping:
    """A column-mapped table's physical names and field ids (from its schema)."""

    def __init__(self, table_schema_json: str) -> None:
        self.physical = physical_schema(json.loads(table_schema_json))
        self.names = physical_names(table_schema_json)  # top level: logical -> physical
        self._logical = {p: n for n, p in self.names.items()}

    @classmethod
    def of(cls, layout: TableLayout | None) -> ColumnMapping | None:
        """The table's mapping, None for a new table or one without column mapping."""
        if layout is None or layout.protocol.column_mapping == "none":
            return None
        return cls(layout.schema_json)

    def frame(self, df: DataFrame) -> DataFrame:
        """``df`` (the table's columns, any order) with physical names and field ids."""
        fields = {f["name"]: f for f in self.physical["fields"]}
        columns: list[Column] = []
        for name in df.columns:
            field = fields[self.names[name]]
            data_type = T.StructField.fromJson(field).dataType
            column = F.col("`" + name.replace("`", "``") + "`")
            if not isinstance(field["type"], str):  # renames nested fields, with their ids
                column = column.cast(data_type)
            columns.append(column.alias(field["name"], metadata=field["metadata"]))
        return df.select(*columns)

    def partition_columns(self, logical: list[str]) -> list[str]:
        return [self.names[c] for c in logical]

    def logical_values(self, values: PartitionValues) -> dict[str, str | None]:
        """Partition values keyed by physical name, keyed by column name."""
        return {self._logical.get(k, k): v for k, v in values.items()}
