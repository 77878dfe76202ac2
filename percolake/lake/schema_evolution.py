"""Schema evolution of a write with ``merge_schema``: the table's schema after the write.

One pure function shared by the participant (its early refusal), the coordinator's write check
(before the commit point) and the apply (the ``metaData`` action committed with the data), so
the three agree. The rules are delta-spark's append with ``mergeSchema``:

- every column of the table stays as it is (type, nullability, metadata: NOT NULL, generation
  expressions), in its place; a column the batch lacks reads as null;
- a batch column the table lacks is added at the end, nullable, without metadata; a struct
  gains the nested fields the batch adds the same way;
- a column whose type differs is refused: type widening needs Delta's ``typeWidening`` table
  feature, with which delta-rs (the apply) commits nothing.

Names match exactly here: the participant has renamed a batch column that differs from a table
column only in case to the table's name before (Spark's case-insensitive resolution).
"""

from __future__ import annotations

import json
from typing import Any

NULLABILITY_KEYS = ("nullable", "containsNull", "valueContainsNull", "metadata")


class SchemaConflict(ValueError):
    """A batch column's type differs from the table's: no schema merge can take it."""


def merged_schema(table_json: str, batch_json: str) -> str:
    """The table's schema JSON with the batch's new columns (and nested fields) added.

    Raises:
        SchemaConflict: names every column whose type differs between table and batch.
    """
    table = json.loads(table_json)
    batch = json.loads(batch_json)
    problems: list[str] = []
    merged = _merge_struct(table, batch, "", problems)
    if problems:
        raise SchemaConflict("; ".join(problems))
    return json.dumps(merged, separators=(",", ":"))


def added_columns(table_json: str, batch_json: str) -> list[str]:
    """The columns (``a.b`` for nested fields) the batch has and the table lacks."""
    found: list[str] = []
    _collect_added(json.loads(table_json), json.loads(batch_json), "", found)
    return found


def _merge_struct(table: dict[str, Any], batch: dict[str, Any], prefix: str,
                  problems: list[str]) -> dict[str, Any]:
    fields = [dict(f) for f in table["fields"]]
    by_name = {f["name"]: i for i, f in enumerate(fields)}
    for new in batch["fields"]:
        index = by_name.get(new["name"])
        if index is None:
            fields.append({"name": new["name"], "type": _nullable_type(new["type"]),
                           "nullable": True, "metadata": {}})
            continue
        old = fields[index]
        fields[index] = {**old, "type": _merge_type(old["type"], new["type"],
                                                    f"{prefix}{old['name']}", problems)}
    return {**table, "fields": fields}


def _merge_type(old: Any, new: Any, path: str, problems: list[str]) -> Any:
    if isinstance(old, dict) and isinstance(new, dict) and old.get("type") == new.get("type"):
        kind = old["type"]
        if kind == "struct":
            return _merge_struct(old, new, f"{path}.", problems)
        if kind == "array":
            return {**old, "elementType": _merge_type(old["elementType"], new["elementType"],
                                                      f"{path}.element", problems)}
        if kind == "map":
            return {**old,
                    "keyType": _merge_type(old["keyType"], new["keyType"], f"{path}.key",
                                           problems),
                    "valueType": _merge_type(old["valueType"], new["valueType"],
                                             f"{path}.value", problems)}
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
        elif _is_struct(old["type"]) and _is_struct(field["type"]):
            _collect_added(old["type"], field["type"], f"{path}.", found)


def _is_struct(delta_type: Any) -> bool:
    return isinstance(delta_type, dict) and delta_type.get("type") == "struct"


def _nullable_type(delta_type: Any) -> Any:
    """A new column's type: every nested field nullable, no metadata (as Spark writes it)."""
    if not isinstance(delta_type, dict):
        return delta_type
    kind = delta_type.get("type")
    if kind == "struct":
        return {**delta_type, "fields": [
            {"name": f["name"], "type": _nullable_type(f["type"]), "nullable": True,
             "metadata": {}} for f in delta_type["fields"]]}
    if kind == "array":
        return {**delta_type, "elementType": _nullable_type(delta_type["elementType"]),
                "containsNull": True}
    if kind == "map":
        return {**delta_type, "keyType": _nullable_type(delta_type["keyType"]),
                "valueType": _nullable_type(delta_type["valueType"]),
                "valueContainsNull": True}
    return delta_type


def _shape(delta_type: Any) -> Any:
    """A type without nullability and metadata."""
    if isinstance(delta_type, dict):
        return {k: _shape(v) for k, v in delta_type.items() if k not in NULLABILITY_KEYS}
    if isinstance(delta_type, list):
        return [_shape(v) for v in delta_type]
    return delta_type
