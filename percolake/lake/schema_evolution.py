"""Schema evolution of a write with ``merge_schema``: the table's schema after the write.

One pure function shared by the participant (its early refusal), the coordinator's write check
(before the commit point) and the apply (the ``metaData`` action committed with the data), so
the three agree. The rules are delta-spark's append with ``mergeSchema``:

- every column of the table stays as it is (type, nullability, metadata: NOT NULL, generation
  expressions), in its place; a column the batch lacks reads as null;
- a batch column the table lacks is added at the end, nullable, without metadata; a struct
  gains the nested fields the batch adds the same way;
- a column whose type differs is refused, unless the table has ``delta.enableTypeWidening=true``
  and the change is one delta-spark 4.4's ``mergeSchema`` append widens by itself
  (``widens``): then the column takes the batch's type and its field metadata gains
  ``delta.typeChanges`` (``type_changes``), as delta-spark writes it;
- on a column-mapped table every new field (nested ones too) gets a column mapping id above the
  table's ``delta.columnMapping.maxColumnId``, numbered in the merged schema's pre-order as
  delta-spark numbers them, and a physical name ``col-<uuid>``; the participant assigns them
  (its files carry them), the write intent carries the merged schema, and the coordinator's
  check and the apply verify them (``column_mapping_problem``).

Names match exactly here: the participant has renamed a batch column that differs from a table
column only in case to the table's name before (Spark's case-insensitive resolution).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from percolake.lake.table_features import FIELD_ID, PHYSICAL_NAME

MAPPING_KEYS = (FIELD_ID, PHYSICAL_NAME)
TYPE_CHANGES = "delta.typeChanges"  # a field's widenings, oldest first
ENABLE_TYPE_WIDENING = "delta.enableTypeWidening"
INTEGRAL_SIZES = {"byte": 1, "short": 2, "integer": 4, "long": 8}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(-?\d+)\)")
MAX_COLUMN_ID = "delta.columnMapping.maxColumnId"
NULLABILITY_KEYS = ("nullable", "containsNull", "valueContainsNull", "metadata")


class SchemaConflict(ValueError):
    """A batch column's type differs from the table's: no schema merge can take it."""


def merged_schema(table_json: str, batch_json: str, column_mapping: bool = False,
                  type_widening: bool = False, implicit_conversions: bool = False) -> str:
    """The table's schema JSON with the batch's new columns (and nested fields) added.

    ``column_mapping``: the table is column-mapped; new fields keep the mapping metadata (id,
    physical name) the batch gives them, and nothing else of their metadata.
    ``type_widening``: the table has ``delta.enableTypeWidening=true``; a column whose batch
    type ``widens`` its table type takes the batch's type, with the change recorded in
    ``delta.typeChanges``.
    ``implicit_conversions``: a column whose type differs and is not widened keeps the table's
    type (its values are cast to it), as delta-spark's MERGE schema evolution merges the
    source's schema, instead of being refused.

    Raises:
        SchemaConflict: names every column whose type differs between table and batch (and
            cannot be widened), with what to do (never with ``implicit_conversions``).
    """
    table = json.loads(table_json)
    batch = json.loads(batch_json)
    problems: list[str] = []
    merged = _merge_struct(table, batch, "", problems,
                           _Rules(column_mapping, type_widening, implicit_conversions))
    if problems:
        raise SchemaConflict("; ".join(problems))
    return json.dumps(merged, separators=(",", ":"))


def added_columns(table_json: str, batch_json: str) -> list[str]:
    """The columns (``a.b`` for nested fields; ``a.element.b`` in an array's structs,
    ``a.value.b`` in a map's values) the batch has and the table lacks."""
    found: list[str] = []
    _collect_added(json.loads(table_json), json.loads(batch_json), "", found)
    return found


class _Rules(NamedTuple):
    mapped: bool  # column-mapped table
    widening: bool  # delta.enableTypeWidening=true
    implicit: bool = False  # a type that is not widened stays the table's (MERGE)


def extends(table_type: Any, batch_type: Any) -> bool:
    """Whether the (parsed) Delta type ``batch_type`` is ``table_type`` with nested fields added
    after each struct's own, as ``merged_schema`` adds them (a write that needs
    ``merge_schema``, nothing else)."""
    problems: list[str] = []
    merged = _merge_type(table_type, batch_type, "", problems, _Rules(False, False),
                         "", [])
    return not problems and _shape(merged) == _shape(batch_type)


def _merge_struct(table: dict[str, Any], batch: dict[str, Any], prefix: str,
                  problems: list[str], rules: _Rules) -> dict[str, Any]:
    fields = [dict(f) for f in table["fields"]]
    by_name = {f["name"]: i for i, f in enumerate(fields)}
    for new in batch["fields"]:
        index = by_name.get(new["name"])
        if index is None:
            fields.append(_new_field(new, rules.mapped))
            continue
        old = fields[index]
        changes: list[dict[str, str]] = []
        merged = {**old, "type": _merge_type(old["type"], new["type"], f"{prefix}{old['name']}",
                                             problems, rules, "", changes)}
        if changes:  # on the field itself, nested element/key/value changes by fieldPath
            metadata = dict(old.get("metadata") or {})
            metadata[TYPE_CHANGES] = [*metadata.get(TYPE_CHANGES, []), *changes]
            merged["metadata"] = metadata
        fields[index] = merged
    return {**table, "fields": fields}


def _merge_type(old: Any, new: Any, path: str, problems: list[str], rules: _Rules,
                field_path: str, changes: list[dict[str, str]]) -> Any:
    """The merged type; a widening is appended to ``changes`` with its ``fieldPath`` below
    the enclosing field (``element``, ``key``, ``value``, dotted when nested)."""
    if isinstance(old, dict) and isinstance(new, dict) and old.get("type") == new.get("type"):
        kind = old["type"]
        if kind == "struct":
            return _merge_struct(old, new, f"{path}.", problems, rules)
        if kind == "array":
            return {**old, "elementType": _merge_type(
                old["elementType"], new["elementType"], f"{path}.element", problems, rules,
                _below(field_path, "element"), changes)}
        if kind == "map":
            return {**old,
                    "keyType": _merge_type(old["keyType"], new["keyType"], f"{path}.key",
                                           problems, rules, _below(field_path, "key"),
                                           changes),
                    "valueType": _merge_type(old["valueType"], new["valueType"],
                                             f"{path}.value", problems, rules,
                                             _below(field_path, "value"), changes)}
    if _shape(old) == _shape(new):
        return old
    if rules.widening and isinstance(old, str) and isinstance(new, str) and widens(old, new):
        change = {"toType": new, "fromType": old}
        if field_path:
            change["fieldPath"] = field_path
        changes.append(change)
        return new
    if not rules.implicit:
        problems.append(type_change_problem(path, old, new, rules.widening))
    return old


def _below(field_path: str, step: str) -> str:
    return f"{field_path}.{step}" if field_path else step


def widens(from_type: str, to_type: str) -> bool:
    """Whether delta-spark 4.4's ``mergeSchema`` append widens a column of ``from_type`` to
    ``to_type`` on a table with ``delta.enableTypeWidening=true`` (measured: byte, short,
    integer, long to a larger one; float to double; byte, short, integer to double; a decimal
    to one with at least as many integer and fraction digits; byte, short, integer to a
    decimal with at least 10 integer digits, long with at least 20; date to timestamp_ntz).
    Not: long to double, anything to float, narrowing, date to timestamp."""
    if from_type == to_type:
        return False
    if from_type in INTEGRAL_SIZES and to_type in INTEGRAL_SIZES:
        return INTEGRAL_SIZES[from_type] < INTEGRAL_SIZES[to_type]
    if to_type == "double":
        return from_type in ("float", "byte", "short", "integer")
    if (from_type, to_type) == ("date", "timestamp_ntz"):
        return True
    to_decimal = _DECIMAL.fullmatch(to_type)
    if to_decimal is None:
        return False
    precision, scale = int(to_decimal[1]), int(to_decimal[2])
    from_decimal = _DECIMAL.fullmatch(from_type)
    if from_decimal is not None:
        return (precision - scale >= int(from_decimal[1]) - int(from_decimal[2])
                and scale >= int(from_decimal[2]))
    if from_type in ("byte", "short", "integer"):
        return precision - scale >= 10
    return from_type == "long" and precision - scale >= 20


def type_change_problem(path: str, old: Any, new: Any, widening: bool,
                        merge_schema: bool = True) -> str:
    """The refusal of a column whose batch type differs from the table's, saying what to do:
    ``widening`` the table has ``delta.enableTypeWidening=true``, ``merge_schema`` the write
    asked for a schema merge."""
    problem = (f"column {path!r} is {json.dumps(_shape(old))} in the table but "
               f"{json.dumps(_shape(new))} in the batch")
    if not (isinstance(old, str) and isinstance(new, str)):
        return problem  # nested types: their fields are compared (and merged) one by one
    if not widens(old, new):
        return (f"{problem}, a change Delta's type widening does not make (merge_schema adds "
                f"columns and widens types only); cast the column to {old}")
    if widening:  # only without merge_schema: with it the column is widened
        return (f"{problem} (the table has {ENABLE_TYPE_WIDENING}=true: "
                "txn.write(..., merge_schema=True) widens it)")
    how = "merge_schema=True widens it" if merge_schema \
        else "txn.write(..., merge_schema=True) widens it"
    return (f"{problem}: {how} only on a table with {ENABLE_TYPE_WIDENING}=true (set it with "
            f"delta-spark: ALTER TABLE ... SET TBLPROPERTIES "
            f"('{ENABLE_TYPE_WIDENING}' = 'true')), or cast the column to {old}")


def timestamp_ntz_problem(merged_json: str, features: tuple[str, ...]) -> str | None:
    """A merged schema with a TIMESTAMP_NTZ column (a new one, or a date widened) needs the
    table's ``timestampNtz`` feature, which delta-spark does not add by itself on an append
    (``DELTA_FEATURES_REQUIRE_MANUAL_ENABLEMENT``): why not, None if fine."""
    if "timestampNtz" in features or '"timestamp_ntz"' not in merged_json:
        return None
    return ("the merged schema has a TIMESTAMP_NTZ column and the table lacks the "
            "timestampNtz feature; enable it with delta-spark (ALTER TABLE ... SET "
            "TBLPROPERTIES ('delta.feature.timestampNtz' = 'supported')) first")


def type_widening_enabled(configuration: Mapping[str, str | None]) -> bool:
    """Whether a table's configuration sets ``delta.enableTypeWidening=true``."""
    return str(configuration.get(ENABLE_TYPE_WIDENING) or "").lower() == "true"


def _collect_added(table: dict[str, Any], batch: dict[str, Any], prefix: str,
                   found: list[str]) -> None:
    existing = {f["name"]: f for f in table["fields"]}
    for field in batch["fields"]:
        old = existing.get(field["name"])
        path = f"{prefix}{field['name']}"
        if old is None:
            found.append(path)
        else:
            _collect_added_in(old["type"], field["type"], path, found)


def _collect_added_in(table: Any, batch: Any, path: str, found: list[str]) -> None:
    """The fields ``batch`` adds to the nested type ``table`` (structs, also in arrays and map
    values, as delta-spark's ``mergeSchema`` adds them)."""
    kind = table.get("type") if isinstance(table, dict) else None
    if not isinstance(batch, dict) or batch.get("type") != kind:
        return
    if kind == "struct":
        _collect_added(table, batch, f"{path}.", found)
    elif kind == "array":
        _collect_added_in(table["elementType"], batch["elementType"], f"{path}.element", found)
    elif kind == "map":
        _collect_added_in(table["keyType"], batch["keyType"], f"{path}.key", found)
        _collect_added_in(table["valueType"], batch["valueType"], f"{path}.value", found)


def _new_field(field: dict[str, Any], mapped: bool) -> dict[str, Any]:
    """A new column or nested field: nullable, no metadata but its column mapping (as Spark
    writes it)."""
    metadata = field.get("metadata") or {}
    return {"name": field["name"], "type": _nullable_type(field["type"], mapped),
            "nullable": True,
            "metadata": {k: metadata[k] for k in MAPPING_KEYS if mapped and k in metadata}}


def _nullable_type(delta_type: Any, mapped: bool) -> Any:
    if not isinstance(delta_type, dict):
        return delta_type
    kind = delta_type.get("type")
    if kind == "struct":
        return {**delta_type, "fields": [_new_field(f, mapped) for f in delta_type["fields"]]}
    if kind == "array":
        return {**delta_type, "elementType": _nullable_type(delta_type["elementType"], mapped),
                "containsNull": True}
    if kind == "map":
        return {**delta_type, "keyType": _nullable_type(delta_type["keyType"], mapped),
                "valueType": _nullable_type(delta_type["valueType"], mapped),
                "valueContainsNull": True}
    return delta_type


# ---------------------------------------------------------------- column mapping

def with_column_mapping(merged_json: str, max_column_id: int) -> str:
    """``merged_json`` (a column-mapped table's schema with new fields) with an id and a
    physical name for every field that lacks them: ids from ``max_column_id`` + 1 in the
    schema's pre-order (a struct before its fields, fields in order), as delta-spark numbers
    the columns a ``mergeSchema`` append adds."""
    schema = json.loads(merged_json)
    next_id = max_column_id
    for field in _fields(schema):
        metadata = field.setdefault("metadata", {})
        if FIELD_ID not in metadata:
            next_id += 1
            metadata[FIELD_ID] = next_id
            metadata[PHYSICAL_NAME] = f"col-{uuid.uuid4()}"
    return json.dumps(schema, separators=(",", ":"))


def max_column_id(configuration: Mapping[str, str | None], schema_json: str) -> int:
    """A column-mapped table's ``delta.columnMapping.maxColumnId``: its configuration's, or
    the highest id of ``schema_json`` if that is higher (0 without column mapping)."""
    highest = max((int((f.get("metadata") or {}).get(FIELD_ID, 0))
                   for f in _fields(json.loads(schema_json))), default=0)
    return max(int(configuration.get(MAX_COLUMN_ID) or 0), highest)


def column_mapping_problem(table_json: str, merged_json: str, max_column_id: int) -> str | None:
    """Why the mapping of a column-mapped table's merged schema is not one the table can take,
    None if it can: every field has an id and a physical name, the ids are unique, those the
    table lacks lie above its ``delta.columnMapping.maxColumnId``, and no two fields of one
    struct share a physical name."""
    known = {int(f["metadata"][FIELD_ID]) for f in _fields(json.loads(table_json))
             if FIELD_ID in (f.get("metadata") or {})}
    seen: set[int] = set()
    problems: list[str] = []
    for path, struct in _structs(json.loads(merged_json), ""):
        names: set[str] = set()
        for field in struct["fields"]:
            metadata = field.get("metadata") or {}
            where = f"{path}{field['name']}"
            if FIELD_ID not in metadata or PHYSICAL_NAME not in metadata:
                problems.append(f"new column {where!r} has no column mapping id and physical "
                                "name")
                continue
            field_id, physical = int(metadata[FIELD_ID]), str(metadata[PHYSICAL_NAME])
            if field_id in seen:
                problems.append(f"column {where!r} reuses column mapping id {field_id}")
            elif field_id not in known and field_id <= max_column_id:
                problems.append(f"new column {where!r} has column mapping id {field_id}, not "
                                f"above the table's maxColumnId {max_column_id}")
            if physical in names:
                problems.append(f"column {where!r} reuses physical name {physical!r}")
            seen.add(field_id)
            names.add(physical)
    return "; ".join(problems) or None


def _fields(data_type: Any) -> Iterator[dict[str, Any]]:
    """Every struct field of a (parsed) Delta type, in pre-order."""
    if not isinstance(data_type, dict):
        return
    kind = data_type.get("type")
    if kind == "struct":
        for field in data_type["fields"]:
            yield field
            yield from _fields(field["type"])
    elif kind == "array":
        yield from _fields(data_type["elementType"])
    elif kind == "map":
        yield from _fields(data_type["keyType"])
        yield from _fields(data_type["valueType"])


def _structs(data_type: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every struct of a (parsed) Delta type with the path of its fields' prefix."""
    if not isinstance(data_type, dict):
        return
    kind = data_type.get("type")
    if kind == "struct":
        yield path, data_type
        for field in data_type["fields"]:
            yield from _structs(field["type"], f"{path}{field['name']}.")
    elif kind == "array":
        yield from _structs(data_type["elementType"], f"{path}element.")
    elif kind == "map":
        yield from _structs(data_type["keyType"], f"{path}key.")
        yield from _structs(data_type["valueType"], f"{path}value.")


def _shape(delta_type: Any) -> Any:
    """A type without nullability and metadata."""
    if isinstance(delta_type, dict):
        return {k: _shape(v) for k, v in delta_type.items() if k not in NULLABILITY_KEYS}
    if isinstance(delta_type, list):
        return [_shape(v) for v in delta_type]
    return delta_type
