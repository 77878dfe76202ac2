"""A batch's nested struct fields shaped to its table's, as delta-spark's append shapes them.

delta-spark 4.4 matches nested fields by name, at any depth (structs, structs in arrays, map
values): a field named in another case is the table's (unless ``spark.sql.caseSensitive``),
fields in another order are matched by name, and a field the batch lacks reads as null, with or
without ``mergeSchema``. A field the batch adds is a schema change: kept here, after the
table's fields, so that the schema check refuses it without ``merge_schema`` and the merge adds
it with it. A NOT NULL field (or column) the batch lacks is refused before anything is written,
even for an empty batch, with delta-spark's ``DELTA_MISSING_NOT_NULL_COLUMN_VALUE``.

Shaping a column to the table's field order here means the files carry the table's nested
layout: the write intent's schema is then the table's (plus any new fields), which is what the
coordinator's check and the apply expect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkside.errors import SchemaMismatch

Key = Callable[[str], str]
MISSING_NOT_NULL_CLASS = "[DELTA_MISSING_NOT_NULL_COLUMN_VALUE]"


def conform_column(column: Column, source: T.DataType, target: Any, key: Key,
                   path: str) -> Column | None:
    """``column`` (of Spark type ``source``) with its nested struct fields named, ordered and
    completed as the Delta type ``target`` (parsed JSON) has them; None if it has them already.
    Fields ``target`` lacks stay, after the others; a field whose type differs stays as it is
    (the schema check names it).

    Raises:
        SchemaMismatch: two fields of one struct name one field of the table.
    """
    return _shaped(column, source, target, key, path) if _differs(source, target, key, path) \
        else None


def _differs(source: T.DataType, target: Any, key: Key, path: str) -> bool:
    """Whether ``source``'s nested fields are not yet ``target``'s (names, order, presence)."""
    kind = target.get("type") if isinstance(target, dict) else None
    if isinstance(source, T.StructType) and kind == "struct":
        names = [f["name"] for f in target["fields"]]
        if names != source.names[:len(names)]:
            return True
        given = _by_key(source, key, path)
        return any(_differs(given[key(f["name"])].dataType, f["type"], key,
                            f"{path}.{f['name']}") for f in target["fields"])
    if isinstance(source, T.ArrayType) and kind == "array":
        return _differs(source.elementType, target["elementType"], key, f"{path}.element")
    if isinstance(source, T.MapType) and kind == "map":
        return _differs(source.valueType, target["valueType"], key, f"{path}.value")
    return False


def _shaped(column: Column, source: T.DataType, target: Any, key: Key, path: str) -> Column:
    if not _differs(source, target, key, path):
        return column
    if isinstance(source, T.ArrayType):
        return F.transform(column, lambda element: _shaped(
            element, source.elementType, target["elementType"], key, f"{path}.element"))
    if isinstance(source, T.MapType):
        return F.transform_values(column, lambda _, value: _shaped(
            value, source.valueType, target["valueType"], key, f"{path}.value"))
    assert isinstance(source, T.StructType)  # _differs is True only for these three
    given = _by_key(source, key, path)
    parts: list[Column] = []
    for field in target["fields"]:
        found = given.pop(key(field["name"]), None)
        value = F.lit(None).cast(spark_type(field["type"])) if found is None else _shaped(
            column.getField(found.name), found.dataType, field["type"], key,
            f"{path}.{field['name']}")
        parts.append(value.alias(field["name"]))
    parts += [column.getField(f.name).alias(f.name) for f in given.values()]  # new fields
    return F.when(column.isNull(), F.lit(None)).otherwise(F.struct(*parts))


def _by_key(struct: T.StructType, key: Key, path: str) -> dict[str, T.StructField]:
    found: dict[str, T.StructField] = {}
    for field in struct.fields:
        if key(field.name) in found:
            raise SchemaMismatch(f"column {path!r} has fields {found[key(field.name)].name!r} "
                                 f"and {field.name!r}, which name one field of the table")
        found[key(field.name)] = field
    return found


def spark_type(delta_type: Any) -> T.DataType:
    """The Spark type of a (parsed) Delta type."""
    return T.StructField.fromJson({"name": "x", "type": delta_type, "nullable": True,
                                   "metadata": {}}).dataType


def missing_not_null(table_fields: list[dict[str, Any]], batch: T.StructType, key: Key,
                     computed: set[str], prefix: str = "") -> str | None:
    """The first NOT NULL column or struct field (``a.b``, the table's pre-order) the batch
    lacks, None if it has them all; ``computed``: top-level columns the write computes
    (generated columns). Fields inside arrays and maps are not NOT NULL in Delta."""
    given = {key(f.name): f for f in batch.fields}
    for field in table_fields:
        path = f"{prefix}{field['name']}"
        found = given.get(key(field["name"]))
        if found is None and field["name"] in computed:
            continue
        kind = field["type"]
        nested = kind["fields"] if isinstance(kind, dict) and kind.get("type") == "struct" \
            else []
        if found is None:
            if not field.get("nullable", True):
                return path
            first = _first_not_null(nested, f"{path}.")
            if first:
                return first
        elif nested and isinstance(found.dataType, T.StructType):
            first = missing_not_null(nested, found.dataType, key, set(), f"{path}.")
            if first:
                return first
    return None


def _first_not_null(fields: list[dict[str, Any]], prefix: str) -> str | None:
    for field in fields:
        path = f"{prefix}{field['name']}"
        if not field.get("nullable", True):
            return path
        kind = field["type"]
        if isinstance(kind, dict) and kind.get("type") == "struct":
            first = _first_not_null(kind["fields"], f"{path}.")
            if first:
                return first
    return None


def missing_not_null_message(path: str) -> str:
    """delta-spark's refusal of a batch that lacks the NOT NULL column ``path``."""
    return (f"{MISSING_NOT_NULL_CLASS} Column {path}, which has a NOT NULL constraint, is "
            "missing from the data being written into the table.")
