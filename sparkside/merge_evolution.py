"""MERGE ``withSchemaEvolution()`` as delta-spark 4.4 evolves the table (measured against it;
docs/row-level-writes.md, schema evolution):

- the source columns merged into the table's schema are all of them with an ``UpdateAll`` or
  ``InsertAll`` clause, else those an explicit ``set`` of a matched update or ``values`` of an
  insert names (case-insensitively): a column the table lacks is added (after the table's, in
  the source's order, with the source column's type, whatever expression is assigned to it);
  nested struct fields the source has and the table lacks are added to the table's structs
  (also those of arrays and map values); a column whose source type widens the table's is
  widened on a table with ``delta.enableTypeWidening=true``; any other type difference keeps
  the table's type and the value is cast to it. ``whenNotMatchedBySourceUpdate`` adds nothing;
- an assigned struct is matched to the column's by field name; a field it lacks is null,
  except in ``UpdateAll``, where the row keeps the target's value of that field (a source
  struct that lacks none is assigned whole: null stays null). Without schema evolution a
  struct whose fields are not the column's is refused, as delta-spark refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkside.column_mapping import by_name
from sparkside.errors import MergeClauseError
from sparkside.nested_fields import spark_type
from sparkside.writer import struct_schema_json

SCHEMA_MISMATCH_CLASS = "[DELTA_UPDATE_SCHEMA_MISMATCH_EXPRESSION]"


def evolving_source_schema(source: T.StructType, table_columns: Sequence[str], star: bool,
                           assigned: Iterable[str]) -> str | None:
    """The Delta schema JSON of the source columns a MERGE with schema evolution merges into
    the table (module doc): every one with ``star`` (an UpdateAll or InsertAll clause), else
    those the names ``assigned`` (keys of matched updates' ``set`` and inserts' ``values``)
    name; each named as the table names it where they differ only in case. None: none."""
    wanted = {name.lower() for name in assigned}
    table = {c.lower(): c for c in table_columns}
    fields = [T.StructField(table.get(f.name.lower(), f.name), f.dataType, True)
              for f in source.fields if star or f.name.lower() in wanted]
    return struct_schema_json(T.StructType(fields)) if fields else None


def fitted(value: Column, value_type: T.DataType, column_type: Any, evolving: bool,
           column: str, kept: Column | None = None) -> Column:
    """``value`` (of Spark type ``value_type``) assigned to the table's column ``column`` of
    (parsed) Delta type ``column_type``: nested struct fields matched by name, cast to the
    column's type (module doc). ``kept``: an UpdateAll's target value, whose fields stay where
    the source struct lacks them.

    Raises:
        MergeClauseError: without schema evolution, a nested value whose fields are not the
            column's (delta-spark's DELTA_UPDATE_SCHEMA_MISMATCH_EXPRESSION).
    """
    target = spark_type(column_type)
    if not (_is_nested(value_type) and _is_nested(target)):
        return value.cast(target)
    if not evolving and _field_names(value_type) != _field_names(target):
        raise MergeClauseError(
            f"{SCHEMA_MISMATCH_CLASS} Cannot cast {value_type.simpleString()} to "
            f"{target.simpleString()}. All nested columns must match (column {column}; "
            "withSchemaEvolution() adds the source's new fields to the table).")
    shaped = by_name(value, value_type, column_type) if kept is None \
        else _updated(value, value_type, kept, column_type)
    return shaped.cast(target)


def _updated(value: Column, value_type: T.DataType, kept: Column, column_type: Any) -> Column:
    """An UpdateAll's struct: the source's fields, the target's where the source lacks them."""
    if not (isinstance(value_type, T.StructType) and isinstance(column_type, dict)
            and column_type.get("type") == "struct"):
        return by_name(value, value_type, column_type)
    given = {f.name: f for f in value_type.fields}
    fields = column_type["fields"]
    if all(f["name"] in given for f in fields):
        return by_name(value, value_type, column_type)  # assigned whole
    return F.struct(*[
        (_updated(value.getField(f["name"]), given[f["name"]].dataType,
                  kept.getField(f["name"]), f["type"]) if f["name"] in given
         else kept.getField(f["name"])).alias(f["name"]) for f in fields])


def _is_nested(data_type: T.DataType) -> bool:
    return isinstance(data_type, (T.StructType, T.ArrayType, T.MapType))


def _field_names(data_type: T.DataType) -> Any:
    """The nested field names of a Spark type, order aside (case-insensitive)."""
    if isinstance(data_type, T.StructType):
        return frozenset((f.name.lower(), _field_names(f.dataType)) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return ("array", _field_names(data_type.elementType))
    if isinstance(data_type, T.MapType):
        return ("map", _field_names(data_type.keyType), _field_names(data_type.valueType))
    return None
