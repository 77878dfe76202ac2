"""The keys of a MERGE's or UPDATE's ``set``/``values`` and the values they assign, as
delta-spark 4.4 resolves and applies them (measured against it; docs/row-level-writes.md):

- a key is a column path, resolved by Spark as delta-spark resolves it (``s.x``, ```s`.`x```,
  ``t.s.x`` with the table's alias; names case-insensitive unless ``spark.sql.caseSensitive``):
  ``key_path``. A MERGE with schema evolution resolves a matched update's or an insert's key
  the table cannot resolve against the source instead (a new column or nested field);
- a nested key assigns one struct field and keeps the others: the struct is rebuilt field by
  field (a null struct becomes a struct of nulls with that field set, as in delta-spark);
  ``assigned_value``. Two keys of one clause naming one path, or a path and a field below it,
  are refused (``DELTA_CONFLICT_SET_COLUMN``), so is a nested key of an insert
  (``DELTA_UNSUPPORTED_NESTED_FIELD_IN_OPERATION``) and a key below a field that is not a
  struct; ``check_paths`` checks them before anything is evolved or written;
- the value is cast to the column's type with nested struct fields matched by name
  (``merge_evolution.fitted``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkside.errors import MergeClauseError
from sparkside.merge_evolution import fitted

Path = tuple[str, ...]
UNRESOLVED_CLASS = "DELTA_MERGE_UNRESOLVED_EXPRESSION"


@dataclass(frozen=True)
class Assigned:
    """One key's assignment below a column: the path under the column (() for the column
    itself), the value and its Spark type."""

    below: Path
    value: Column
    value_type: T.DataType


def key_path(frame: DataFrame, key: str) -> Path:
    """The column path (the column's name, then its nested fields' names as ``frame`` spells
    them) that the ``set``/``values`` key ``key`` names in ``frame``, resolved by Spark's
    analyzer as delta-spark resolves it (one analysis, no job).

    Raises:
        AnalysisException: Spark's (e.g. ``UNRESOLVED_COLUMN``, ``FIELD_NOT_FOUND``).
        MergeClauseError: the key names something inside an array or a map.
    """
    selected = frame.select(F.col(key))._jdf.queryExecution().analyzed()  # noqa: SLF001
    return tuple(_name_parts(selected.projectList().head(), key))


def _name_parts(expression: object, key: str) -> list[str]:
    """The names of a resolved column or struct field expression (a JVM ``Expression``)."""
    kind = expression.getClass().getSimpleName()  # type: ignore[attr-defined]
    if kind == "Alias":
        return _name_parts(expression.child(), key)  # type: ignore[attr-defined]
    if kind == "GetStructField":
        parent = expression.child()  # type: ignore[attr-defined]
        field = parent.dataType().apply(expression.ordinal())  # type: ignore[attr-defined]
        return [*_name_parts(parent, key), field.name()]
    if kind == "AttributeReference":
        return [expression.name()]  # type: ignore[attr-defined]
    raise MergeClauseError(
        f"[DELTA_UNSUPPORTED_NESTED_FIELD_IN_UPDATE] {key}: updating nested fields is only "
        "supported for StructType (not inside an array or a map: assign the whole column).")


def merge_key_path(key: str, target: DataFrame, source: DataFrame, columns: Sequence[str],
                   clause: str, on_source: bool) -> Path:
    """A MERGE clause's key resolved as delta-spark resolves it: against the table, else (a
    matched update or an insert with schema evolution, ``on_source``) against the source.

    Raises:
        MergeClauseError: a column neither resolves (``DELTA_MERGE_UNRESOLVED_EXPRESSION``,
            naming the columns it was looked for in).
        AnalysisException: Spark's other resolution errors (e.g. ``FIELD_NOT_FOUND``).
    """
    try:
        return key_path(target, key)
    except AnalysisException as error:
        if not on_source:
            raise _unresolved(error, key, clause, columns) from error
    try:
        return key_path(source, key)
    except AnalysisException as error:
        raise _unresolved(error, key, clause, source.columns) from error


def _unresolved(error: AnalysisException, key: str, clause: str,
                columns: Sequence[str]) -> Exception:
    if not str(error.getCondition() or "").startswith("UNRESOLVED_COLUMN"):
        return error
    return MergeClauseError(f"[{UNRESOLVED_CLASS}] Cannot resolve {key} in {clause} clause "
                            f"given columns {', '.join(columns)}.")


def check_paths(table: T.StructType, paths: Sequence[Path], insert: bool = False) -> None:
    """Refuses the keys of one clause (their resolved ``paths``, in the user's order) as
    delta-spark refuses them: a nested key of an insert; two naming one path or a path and
    one below it; a key below a field of ``table`` that is not a struct. A field ``table``
    lacks is one schema evolution adds (the key was resolved against the source).

    Raises:
        MergeClauseError: with delta-spark's error class.
    """
    if insert:
        nested = next((p for p in paths if len(p) > 1), None)
        if nested is not None:
            raise MergeClauseError(
                "[DELTA_UNSUPPORTED_NESTED_FIELD_IN_OPERATION] Nested field is not supported "
                f"in the INSERT clause of MERGE operation (field = {_quoted(nested)}); assign "
                "the whole column instead, e.g. with named_struct(...).")
        return  # the first of keys naming one column wins, as in delta-spark
    _check_level(table, list(paths), ())


def _check_level(struct: T.StructType | None, paths: list[Path], prefix: Path) -> None:
    heads: dict[str, list[Path]] = {}
    for path in paths:
        heads.setdefault(path[0].lower(), []).append(path)
    for group in heads.values():
        if any(len(p) == 1 for p in group) and len(group) > 1:
            raise MergeClauseError(
                "[DELTA_CONFLICT_SET_COLUMN] There is a conflict from these SET columns: "
                f"[{', '.join(_quoted(prefix + p, dotted=True) for p in group)}].")
        deeper = [p[1:] for p in group if len(p) > 1]
        if not deeper:
            continue
        field = _field(struct, group[0][0]) if struct is not None else None
        if field is not None and not isinstance(field.dataType, T.StructType):
            raise MergeClauseError(
                "[DELTA_UNSUPPORTED_FIELD_UPDATE_NON_STRUCT] Updating nested fields is only "
                "supported for StructType, but you are trying to update a field of "
                f"{_quoted(prefix + (field.name,), dotted=True)}, which is of type: "
                f"{field.dataType.simpleString()}.")
        _check_level(field.dataType if field is not None else None,  # type: ignore[arg-type]
                     deeper, prefix + (group[0][0],))


def by_column(paths: dict[str, Path], columns: Sequence[str]) -> dict[str, list[str]]:
    """The keys of ``paths`` (key -> resolved path) by the table column each assigns, in the
    user's order (a path's column matched as the table names it, case aside)."""
    names = {c.lower(): c for c in columns}
    exact = set(columns)
    found: dict[str, list[str]] = {}
    for key, path in paths.items():
        column = path[0] if path[0] in exact else names.get(path[0].lower())
        if column is None:
            raise AssertionError(f"{key} names {path[0]}, not a column of {list(columns)}")
        found.setdefault(column, []).append(key)
    return found


def assigned_value(current: Column | None, column_type: T.DataType,
                   assignments: Sequence[Assigned], allow_missing: bool,
                   kept: Column | None = None, column: str = "") -> Column:
    """The new value of a column (or struct field) of ``column_type`` whose current value is
    ``current`` under ``assignments`` (checked by ``check_paths``): an assignment of the whole
    column is fitted to its type (``kept``: an UpdateAll's target value, see ``fitted``); one
    below it rebuilds the struct from its fields, each assigned or kept. ``column``: its name
    (``a.b`` for a field), for a refusal of a value."""
    whole = [a for a in assignments if not a.below]
    if whole:
        return fitted(whole[0].value, whole[0].value_type, column_type, allow_missing, kept,
                      column)
    if current is None or not isinstance(column_type, T.StructType):
        raise AssertionError(f"nested assignments to a {column_type.simpleString()} value")
    parts = []
    for field in column_type.fields:
        mine = [Assigned(a.below[1:], a.value, a.value_type) for a in assignments
                if _field(column_type, a.below[0]) is field]
        value = current.getField(field.name)
        parts.append((assigned_value(value, field.dataType, mine, allow_missing,
                                     column=f"{column}.{field.name}" if column else field.name)
                      if mine else value).alias(field.name))
    return F.struct(*parts)


def _field(struct: T.StructType, name: str) -> T.StructField | None:
    """The field ``name`` names: spelled so, else the one spelled so case aside."""
    exact = next((f for f in struct.fields if f.name == name), None)
    return exact or next((f for f in struct.fields if f.name.lower() == name.lower()), None)


def _quoted(path: Path, dotted: bool = False) -> str:
    """A path as delta-spark's messages show it: ```s`.`x``` (``dotted``: ```s.x```)."""
    return f"`{'.'.join(path)}`" if dotted else ".".join(f"`{p}`" for p in path)
