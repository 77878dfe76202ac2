"""MERGE ``withSchemaEvolution()`` as delta-spark 4.4 evolves the table (measured against it;
docs/row-level-writes.md, schema evolution):

- the source columns merged into the table's schema are all of them with an ``UpdateAll`` or
  ``InsertAll`` clause, else those the keys of an explicit ``set`` of a matched update or
  ``values`` of an insert name (resolved, ``sparkside.assignments``; a nested key ``s.z``
  names the source's field ``z`` of ``s`` only): a column the table lacks is added (after the
  table's, in the source's order, with the source column's type, whatever expression is
  assigned to it); nested struct fields the source has and the table lacks are added to the
  table's structs (also those of arrays and map values); names match the table's case aside;
  a column whose source type widens the table's is widened on a table with
  ``delta.enableTypeWidening=true``; any other type difference keeps the table's type and the
  value is cast to it. ``whenNotMatchedBySourceUpdate`` adds nothing;
- an assigned struct (in a MERGE or an UPDATE, with or without schema evolution) is matched
  to the column's by field name, case aside (``fitted``); with schema evolution a field it
  lacks is null, except in ``UpdateAll``, where the row keeps the target's value of that
  field; a null struct stays null (unless the target's kept fields are not). A struct with a
  field the column lacks, or without schema evolution one lacking a field of the column, is
  refused, as delta-spark refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkside.errors import MergeClauseError
from sparkside.store_assignment import assigned_cast
from sparkside.writer import as_nullable, struct_schema_json

SCHEMA_MISMATCH_CLASS = "[DELTA_UPDATE_SCHEMA_MISMATCH_EXPRESSION]"
ATOMIC = (T.AtomicType, T.NullType)


def evolving_source_schema(source: T.StructType, table: T.StructType, star: bool,
                           assigned: Iterable[Sequence[str]]) -> str | None:
    """The Delta schema JSON of the source columns a MERGE with schema evolution merges into
    the table (module doc): every one with ``star`` (an UpdateAll or InsertAll clause), else
    those the ``assigned`` paths (matched updates' and inserts' keys, resolved) name, and of
    a struct only its fields they name; columns and nested fields named as the table names
    them where they differ only in case. None: none."""
    paths = [tuple(part.lower() for part in path) for path in assigned]
    kept = _assigned_fields(source, (), paths, star)
    fields = [T.StructField(_table_name(table, f.name),
                            _in_table_case(f.dataType, _field_type(table, f.name)), True)
              for f in kept.fields]
    return struct_schema_json(T.StructType(fields)) if fields else None


def _assigned_fields(struct: T.StructType, prefix: tuple[str, ...],
                     paths: list[tuple[str, ...]], star: bool) -> T.StructType:
    """The fields of ``struct`` (at path ``prefix``) a clause assigns: named whole by a path,
    or structs with fields below them named; everything with ``star``."""
    kept = []
    for field in struct.fields:
        path = (*prefix, field.name.lower())
        below = [p for p in paths if len(p) > len(path) and p[:len(path)] == path]
        if path in paths:
            kept.append(field)
        elif isinstance(field.dataType, T.StructType) and (below or star):
            kept.append(T.StructField(field.name, _assigned_fields(
                field.dataType, path, paths, star), field.nullable, field.metadata))
        elif star:
            kept.append(field)
    return T.StructType(kept)


def _in_table_case(data_type: T.DataType, table_type: T.DataType | None) -> T.DataType:
    """``data_type`` with each nested struct field the table has (case aside) named as the
    table names it, so that merging the schemas matches them as delta-spark does."""
    if isinstance(data_type, T.StructType) and isinstance(table_type, T.StructType):
        return T.StructType([
            T.StructField(_table_name(table_type, f.name),
                          _in_table_case(f.dataType, _field_type(table_type, f.name)),
                          f.nullable, f.metadata) for f in data_type.fields])
    if isinstance(data_type, T.ArrayType) and isinstance(table_type, T.ArrayType):
        return T.ArrayType(_in_table_case(data_type.elementType, table_type.elementType),
                           data_type.containsNull)
    if isinstance(data_type, T.MapType) and isinstance(table_type, T.MapType):
        return T.MapType(data_type.keyType,
                         _in_table_case(data_type.valueType, table_type.valueType),
                         data_type.valueContainsNull)
    return data_type


def _table_name(struct: T.StructType, name: str) -> str:
    return next((f.name for f in struct.fields if f.name.lower() == name.lower()), name)


def _field_type(struct: T.StructType, name: str) -> T.DataType | None:
    return next((f.dataType for f in struct.fields if f.name.lower() == name.lower()), None)


def fitted(value: Column, value_type: T.DataType, target: T.DataType, allow_missing: bool,
           kept: Column | None = None, column: str = "") -> Column:
    """``value`` (of Spark type ``value_type``) assigned to a column or field of type
    ``target``, cast as delta-spark casts it (module doc): structs (also in arrays and map
    values) matched by field name, case aside; ``allow_missing`` (schema evolution): a field
    the value lacks is null, or with ``kept`` (an UpdateAll's target value) the target's.
    ``column``: the column (or field ``a.b``) assigned, named by a refusal of a value
    (``sparkside.store_assignment``).

    Raises:
        MergeClauseError: ``mismatch`` found a struct that cannot be matched
            (``DELTA_UPDATE_SCHEMA_MISMATCH_EXPRESSION``).
    """
    found = mismatch(value_type, target, allow_missing)
    if found is not None:
        given, wanted = found
        raise MergeClauseError(
            f"{SCHEMA_MISMATCH_CLASS} Cannot cast {given.simpleString()} to "
            f"{wanted.simpleString()}. All nested columns must match (withSchemaEvolution() "
            "adds the source's new fields to the table).")
    return _fit(value, value_type, target, kept, column)


def mismatch(value_type: T.DataType, target: T.DataType, allow_missing: bool
             ) -> tuple[T.StructType, T.StructType] | None:
    """The first pair of structs (the value's, the target's) that ``fitted`` cannot match by
    name, None if there is none: a value struct with a field the target's lacks (case aside),
    or, without ``allow_missing``, with fewer fields."""
    if isinstance(value_type, T.ArrayType) and isinstance(target, T.ArrayType):
        return mismatch(value_type.elementType, target.elementType, allow_missing)
    if isinstance(value_type, T.MapType) and isinstance(target, T.MapType):
        return mismatch(value_type.keyType, target.keyType, allow_missing) \
            or mismatch(value_type.valueType, target.valueType, allow_missing)
    if not (isinstance(value_type, T.StructType) and isinstance(target, T.StructType)) \
            or _same_ignoring_case(value_type, target):
        return None
    fields = {f.name.lower(): f.dataType for f in target.fields}
    if any(f.name.lower() not in fields for f in value_type.fields) or (
            len(value_type.fields) != len(target.fields) and not allow_missing):
        return value_type, target
    return next((found for found in (mismatch(f.dataType, fields[f.name.lower()], allow_missing)
                                     for f in value_type.fields) if found), None)


def _fit(value: Column, value_type: T.DataType, target: T.DataType,
         kept: Column | None = None, column: str = "") -> Column:
    """``fitted``'s value, ``mismatch`` having found none."""
    if isinstance(value_type, T.ArrayType) and isinstance(target, T.ArrayType) \
            and isinstance(value_type.elementType, T.StructType) \
            and isinstance(target.elementType, T.StructType) and value_type != target:
        return F.transform(value, lambda element: _fit(
            element, value_type.elementType, target.elementType)).cast(as_nullable(target))
    if isinstance(value_type, T.MapType) and isinstance(target, T.MapType) \
            and _has_struct(value_type) and _has_struct(target) \
            and not _same_ignoring_case(value_type, target):
        shaped = value
        if value_type.keyType != target.keyType:
            shaped = F.transform_keys(shaped, lambda key, _: _fit(
                key, value_type.keyType, target.keyType))
        if value_type.valueType != target.valueType:
            shaped = F.transform_values(shaped, lambda _, item: _fit(
                item, value_type.valueType, target.valueType))
        return shaped.cast(as_nullable(target))
    if isinstance(value_type, T.StructType) and isinstance(target, T.StructType) \
            and not _same_ignoring_case(value_type, target):
        return _struct_by_name(value, value_type, target, kept, column)
    if isinstance(value_type, ATOMIC) and isinstance(target, ATOMIC):
        return assigned_cast(value, value_type, target, column)
    return value.cast(target) if value_type != target else value


def _struct_by_name(value: Column, value_type: T.StructType, target: T.StructType,
                    kept: Column | None, column: str) -> Column:
    """The value's fields in the target's order, by name; a field it lacks null, or the
    ``kept`` target value's; null where the value is (and ``kept`` is, if it gives fields)."""
    given = {f.name.lower(): f for f in value_type.fields}
    parts = []
    for field in target.fields:
        found = given.get(field.name.lower())
        before = kept.getField(field.name) if kept is not None else None
        if found is not None:
            part = _fit(value.getField(found.name), found.dataType, field.dataType, before,
                        f"{column}.{field.name}" if column else field.name)
        else:
            part = before if before is not None else F.lit(None).cast(field.dataType)
        parts.append(part.alias(field.name))
    null = value.isNull()
    if kept is not None and _has_extra_fields(value_type, target):
        null = null & kept.isNull()  # the target's fields the value lacks stay
    return F.when(null, F.lit(None)).otherwise(F.struct(*parts)).cast(as_nullable(target))


def _same_ignoring_case(a: T.DataType, b: T.DataType) -> bool:
    """Spark's ``equalsIgnoreCaseAndNullability``."""
    if isinstance(a, T.StructType) and isinstance(b, T.StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name.lower() == y.name.lower() and _same_ignoring_case(x.dataType, y.dataType)
            for x, y in zip(a.fields, b.fields, strict=True))
    if isinstance(a, T.ArrayType) and isinstance(b, T.ArrayType):
        return _same_ignoring_case(a.elementType, b.elementType)
    if isinstance(a, T.MapType) and isinstance(b, T.MapType):
        return _same_ignoring_case(a.keyType, b.keyType) \
            and _same_ignoring_case(a.valueType, b.valueType)
    return a == b


def _has_struct(data_type: T.DataType) -> bool:
    if isinstance(data_type, T.StructType):
        return True
    if isinstance(data_type, T.ArrayType):
        return _has_struct(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return _has_struct(data_type.keyType) or _has_struct(data_type.valueType)
    return False


def _has_extra_fields(value_type: T.StructType, target: T.StructType) -> bool:
    """Whether ``target`` has struct fields ``value_type`` lacks, at any depth of structs
    (those in arrays and maps are not kept)."""
    given = {f.name.lower(): f.dataType for f in value_type.fields}
    for field in target.fields:
        found = given.get(field.name.lower())
        if found is None:
            return True
        if isinstance(found, T.StructType) and isinstance(field.dataType, T.StructType) \
                and _has_extra_fields(found, field.dataType):
            return True
    return False
