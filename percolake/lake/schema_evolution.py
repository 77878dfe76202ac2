"""Schema evolution of a write with ``merge_schema``: the table's schema after the write.

One pure function shared by the participant (its early refusal), the coordinator's write check
(before the commit point) and the apply (the ``metaData`` action committed with the data), so
the three agree. The rules are delta-spark's append with ``mergeSchema``:

- every column of the table stays as it is (type, nullability, metadata: NOT NULL, generation
  expressions), in its place; a column the batch lacks reads as null;
- a batch column the table lacks is added at the end, nullable, without metadata; a struct
  gains the nested fields the batch adds the same way;
- a column whose type differs is refused: type widening needs Delta's ``typeWidening`` table
  feature, with which delta-rs (the apply) commits nothing;
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
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from percolake.lake.table_features import FIELD_ID, PHYSICAL_NAME

MAPPING_KEYS = (FIELD_ID, PHYSICAL_NAME)
MAX_COLUMN_ID = "delta.columnMapping.maxColumnId"
NULLABILITY_KEYS = ("nullable", "containsNull", "valueContainsNull", "metadata")


class SchemaConflict(ValueError):
    """A batch column's type differs from the table's: no schema merge can take it."""


def merged_schema(table_json: str, batch_json: str, column_mapping: bool = False) -> str:
    """The table's schema JSON with the batch's new columns (and nested fields) added.

    ``column_mapping``: the table is column-mapped; new fields keep the mapping metadata (id,
    physical name) the batch gives them, and nothing else of their metadata.

    Raises:
        SchemaConflict: names every column whose type differs between table and batch.
    """
    table = json.loads(table_json)
    batch = json.loads(batch_json)
    problems: list[str] = []
    merged = _merge_struct(table, batch, "", problems, column_mapping)
    if problems:
        raise SchemaConflict("; ".join(problems))
    return json.dumps(merged, separators=(",", ":"))


def added_columns(table_json: str, batch_json: str) -> list[str]:
    """The columns (``a.b`` for nested fields; ``a.element.b`` in an array's structs,
    ``a.value.b`` in a map's values) the batch has and the table lacks."""
    found: list[str] = []
    _collect_added(json.loads(table_json), json.loads(batch_json), "", found)
    return found


def extends(table_type: Any, batch_type: Any) -> bool:
    """Whether the (parsed) Delta type ``batch_type`` is ``table_type`` with nested fields added
    after each struct's own, as ``merged_schema`` adds them (a write that needs
    ``merge_schema``, nothing else)."""
    problems: list[str] = []
    merged = _merge_type(table_type, batch_type, "", problems, False)
    return not problems and _shape(merged) == _shape(batch_type)


def _merge_struct(table: dict[str, Any], batch: dict[str, Any], prefix: str,
                  problems: list[str], mapped: bool) -> dict[str, Any]:
    fields = [dict(f) for f in table["fields"]]
    by_name = {f["name"]: i for i, f in enumerate(fields)}
    for new in batch["fields"]:
        index = by_name.get(new["name"])
        if index is None:
            fields.append(_new_field(new, mapped))
            continue
        old = fields[index]
        fields[index] = {**old, "type": _merge_type(old["type"], new["type"],
                                                    f"{prefix}{old['name']}", problems, mapped)}
    return {**table, "fields": fields}


def _merge_type(old: Any, new: Any, path: str, problems: list[str], mapped: bool) -> Any:
    if isinstance(old, dict) and isinstance(new, dict) and old.get("type") == new.get("type"):
        kind = old["type"]
        if kind == "struct":
            return _merge_struct(old, new, f"{path}.", problems, mapped)
        if kind == "array":
            return {**old, "elementType": _merge_type(old["elementType"], new["elementType"],
                                                      f"{path}.element", problems, mapped)}
        if kind == "map":
            return {**old,
                    "keyType": _merge_type(old["keyType"], new["keyType"], f"{path}.key",
                                           problems, mapped),
                    "valueType": _merge_type(old["valueType"], new["valueType"],
                                             f"{path}.value", problems, mapped)}
    if _shape(old) != _shape(new):
        problems.append(f"column {path!r} is {json.dumps(_shape(old))} in the table but "
                        f"{json.dumps(_shape(new))} in the batch (merge_schema adds columns; "
                        "it changes no type: Delta's type widening needs the typeWidening "
                        "table feature, which delta-rs cannot commit to)")
    return old


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
