"""Delta type widening at unit level: which changes ``merge_schema`` widens (delta-spark 4.4's
``mergeSchema`` append, measured), the ``delta.typeChanges`` it records, the refusals, and the
commits to a table with the ``typeWidening`` feature (delta-rs 1.6 commits nothing to one:
every write there is a log entry of percolake's own). Tables made with ``write_deltalake`` and
turned into type-widening tables by a hand-written log entry, as delta-spark's ``ALTER TABLE
... SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')`` writes it; the Spark test
``tests/spark/test_delta_features.py::test_merge_schema_widens_types_as_delta_spark_does``
compares with delta-spark itself. No Spark here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from percolake.errors import FailedPrecondition
from percolake.lake.delta_commit import apply_table_write, describe_schema_mismatch
from percolake.lake.schema_evolution import (
    SchemaConflict,
    merged_schema,
    timestamp_ntz_problem,
    widens,
)
from percolake.lake.table_features import refusal, table_protocol
from percolake.lake.write_check import WriteChecker
from percolake.records import TableWriteRecord, WriteMode
from sparkside.schema_check import SchemaChecker
from tests.lake_support import one_file_write

APP = "percolake:p:g0"

# delta-spark 4.4.0's verdicts on an append with mergeSchema to a table with
# delta.enableTypeWidening=true (tests/spark measured them: OK widens, else
# DELTA_FAILED_TO_MERGE_FIELDS)
WIDENED = [("byte", "short"), ("byte", "long"), ("short", "integer"), ("integer", "long"),
           ("float", "double"), ("byte", "double"), ("integer", "double"),
           ("date", "timestamp_ntz"), ("decimal(5,2)", "decimal(10,2)"),
           ("decimal(5,2)", "decimal(7,2)"), ("decimal(5,2)", "decimal(6,3)"),
           ("byte", "decimal(10,0)"), ("integer", "decimal(10,0)"),
           ("integer", "decimal(12,2)"), ("long", "decimal(20,0)")]
REFUSED = [("long", "integer"), ("long", "double"), ("integer", "float"),
           ("float", "decimal(30,10)"), ("byte", "decimal(5,0)"), ("integer", "decimal(11,2)"),
           ("decimal(5,2)", "decimal(6,1)"), ("decimal(5,2)", "decimal(4,2)"),
           ("date", "timestamp"), ("integer", "string"), ("integer", "integer")]


def field(name: str, kind: object, nullable: bool = True, metadata: dict | None = None) -> dict:
    return {"name": name, "type": kind, "nullable": nullable, "metadata": metadata or {}}


def schema(*fields: dict) -> str:
    return json.dumps({"type": "struct", "fields": list(fields)})


@pytest.mark.parametrize(("old", "new"), WIDENED)
def test_the_changes_delta_spark_widens_on_a_merge_schema_append_are_widened(old, new):
    assert widens(old, new)
    merged = json.loads(merged_schema(schema(field("c", old, False, {"comment": "kept"})),
                                      schema(field("c", new)), type_widening=True))
    assert merged["fields"] == [field("c", new, False, {
        "comment": "kept", "delta.typeChanges": [{"toType": new, "fromType": old}]})]


@pytest.mark.parametrize(("old", "new"), REFUSED)
def test_the_changes_delta_spark_refuses_are_refused_saying_to_cast(old, new):
    assert not widens(old, new)
    if old == new:
        return
    expected = f'column \'c\' is "{old}" in the table but "{new}" in the batch'
    with pytest.raises(SchemaConflict,
                       match=re.escape(expected) + ".*" + re.escape(f"cast the column to {old}")):
        merged_schema(schema(field("c", old)), schema(field("c", new)), type_widening=True)


def test_nested_widenings_are_recorded_as_delta_spark_records_them():
    """The shape delta-spark 4.4.0 wrote for the same change: a struct field carries its own
    change; an array's element and a map's key and value are recorded on the enclosing field
    with a fieldPath; a second widening is appended."""
    table = schema(
        field("s", {"type": "struct", "fields": [field("a", "integer"), field("b", "string")]}),
        field("arr", {"type": "array", "elementType": "short", "containsNull": True}),
        field("m", {"type": "map", "keyType": "integer", "valueType": "float",
                    "valueContainsNull": True}),
        field("nest", {"type": "array", "elementType": {
            "type": "array", "elementType": "byte", "containsNull": True}, "containsNull": True}),
        field("b", "short", True, {"delta.typeChanges": [{"toType": "short",
                                                           "fromType": "byte"}]}))
    batch = schema(
        field("s", {"type": "struct", "fields": [field("a", "long"), field("b", "string")]}),
        field("arr", {"type": "array", "elementType": "integer", "containsNull": True}),
        field("m", {"type": "map", "keyType": "long", "valueType": "double",
                    "valueContainsNull": True}),
        field("nest", {"type": "array", "elementType": {
            "type": "array", "elementType": "short", "containsNull": True}, "containsNull": True}),
        field("b", "integer"))
    merged = json.loads(merged_schema(table, batch, type_widening=True))["fields"]
    assert merged[0] == field("s", {"type": "struct", "fields": [
        field("a", "long", True, {"delta.typeChanges": [{"toType": "long",
                                                         "fromType": "integer"}]}),
        field("b", "string")]})
    assert merged[1]["metadata"] == {"delta.typeChanges": [
        {"toType": "integer", "fromType": "short", "fieldPath": "element"}]}
    assert merged[2]["metadata"] == {"delta.typeChanges": [
        {"toType": "long", "fromType": "integer", "fieldPath": "key"},
        {"toType": "double", "fromType": "float", "fieldPath": "value"}]}
    assert merged[2]["type"]["keyType"] == "long" and merged[2]["type"]["valueType"] == "double"
    assert merged[3]["metadata"]["delta.typeChanges"] == [
        {"toType": "short", "fromType": "byte", "fieldPath": "element.element"}]
    assert merged[4] == field("b", "integer", True, {"delta.typeChanges": [
        {"toType": "short", "fromType": "byte"}, {"toType": "integer", "fromType": "short"}]})


def test_without_enable_type_widening_a_widening_is_refused_naming_the_property():
    with pytest.raises(SchemaConflict) as refused:
        merged_schema(schema(field("id", "integer")), schema(field("id", "long")))
    assert "column 'id' is \"integer\" in the table but \"long\" in the batch" in str(
        refused.value)
    assert "delta.enableTypeWidening" in str(refused.value)
    assert "cast the column to integer" in str(refused.value)


def test_without_merge_schema_a_wider_type_is_refused_naming_the_option():
    table, batch = schema(field("id", "integer")), schema(field("id", "long"))
    enabled = describe_schema_mismatch(table, batch, [], [], type_widening=True)
    assert enabled is not None and "txn.write(..., merge_schema=True) widens it" in enabled
    disabled = describe_schema_mismatch(table, batch, [], [])
    assert disabled is not None and "merge_schema=True" in disabled \
        and "delta.enableTypeWidening=true" in disabled


def test_a_date_widened_to_timestamp_ntz_needs_the_timestamp_ntz_feature():
    merged = merged_schema(schema(field("d", "date")), schema(field("d", "timestamp_ntz")),
                           type_widening=True)
    problem = timestamp_ntz_problem(merged, ("typeWidening",))
    assert problem is not None and "delta.feature.timestampNtz" in problem
    assert timestamp_ntz_problem(merged, ("timestampNtz", "typeWidening")) is None


def test_type_widening_is_written_and_its_preview_refused_naming_the_feature():
    assert refusal("t", table_protocol(3, 7, ["typeWidening"], ["typeWidening"], {})) is None
    message = refusal("t", table_protocol(3, 7, ["typeWidening-preview"],
                                          ["typeWidening-preview"], {}))
    assert message is not None and "'typeWidening-preview' (reader and writer)" in message
    assert "DROP FEATURE typeWidening-preview" in message


# ---------------------------------------------------------------- commits, with delta-rs


def widening_table(root: Path, enabled: bool = True) -> Path:
    """An ``x integer`` table (one row) with the typeWidening feature, delta.enableTypeWidening
    as given, as delta-spark's ALTER TABLE SET TBLPROPERTIES leaves it."""
    write_deltalake(str(root), pa.table({"x": pa.array([1], pa.int32())}))
    log = root / "_delta_log"
    first = [json.loads(line) for line in (log / f"{0:020d}.json").read_text().splitlines()]
    metadata = next(a["metaData"] for a in first if "metaData" in a)
    metadata["configuration"] = {"delta.enableTypeWidening": str(enabled).lower()}
    actions = [{"commitInfo": {"operation": "SET TBLPROPERTIES"}},
               {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                             "readerFeatures": ["typeWidening"],
                             "writerFeatures": ["typeWidening"]}},
               {"metaData": metadata}]
    (log / f"{1:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    return root


def long_write(root: Path, txn: str, merge: bool = True,
               mode: WriteMode = WriteMode.APPEND) -> TableWriteRecord:
    return one_file_write(root, txn, pa.table({"x": pa.array([2**40], pa.int64())}), merge,
                          mode)


def entry(root: Path, version: int) -> list[dict]:
    text = (root / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_a_merge_write_widens_the_column_with_the_data_in_one_own_log_entry(tmp_path):
    root = widening_table(tmp_path / "t")
    write = long_write(root, "txn-1")
    WriteChecker().check(write)  # the coordinator's check before the commit point
    version = apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1", commit_ts=7)
    assert version == 2
    actions = entry(root, version)
    assert [next(iter(a)) for a in actions] == ["commitInfo", "txn", "metaData", "add"]
    assert actions[0]["commitInfo"]["operationParameters"] == {
        "mode": "Append", "partitionBy": "[]", "canMergeSchema": True}
    assert json.loads(actions[2]["metaData"]["schemaString"])["fields"] == [field(
        "x", "long", True, {"delta.typeChanges": [{"toType": "long", "fromType": "integer"}]})]
    assert actions[2]["metaData"]["configuration"] == {"delta.enableTypeWidening": "true"}
    loaded = DeltaTable(str(root))  # delta-rs loads it (it reads no data of such a table)
    assert loaded.transaction_version(APP) == 0
    assert json.loads(loaded.schema().to_json())["fields"][0]["type"] == "long"
    again = apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1", commit_ts=7)
    assert again == 2 and DeltaTable(str(root)).version() == 2


def test_every_write_to_a_type_widening_table_is_an_own_log_entry(tmp_path):
    """delta-rs 1.6 refuses every commit to such a table: an append and an overwrite without
    merge_schema commit through percolake's own entry, without a metaData action."""
    root = widening_table(tmp_path / "t")
    apply_table_write(long_write(root, "txn-1"), app_id=APP, app_version=0, txn_id="txn-1",
                      commit_ts=7)
    append = long_write(root, "txn-2", merge=False)
    WriteChecker().check(append)
    assert apply_table_write(append, app_id=APP, app_version=1, txn_id="txn-2",
                             commit_ts=8) == 3
    assert [next(iter(a)) for a in entry(root, 3)] == ["commitInfo", "txn", "add"]
    overwrite = long_write(root, "txn-3", merge=False, mode=WriteMode.OVERWRITE)
    WriteChecker().check(overwrite)
    assert apply_table_write(overwrite, app_id=APP, app_version=2, txn_id="txn-3",
                             commit_ts=9) == 4
    kinds = [next(iter(a)) for a in entry(root, 4)]
    assert kinds.count("remove") == 3 and kinds.count("add") == 1
    assert len(DeltaTable(str(root)).file_uris()) == 1


def test_the_checks_refuse_a_widening_of_a_table_without_enable_type_widening(tmp_path):
    root = widening_table(tmp_path / "t", enabled=False)
    with pytest.raises(FailedPrecondition, match=r"column 'x' is \"integer\" in the table but "
                                                 r"\"long\".*delta.enableTypeWidening=true"):
        WriteChecker().check(long_write(root, "txn-1"))
    layout = SchemaChecker().layout(f"file://{root}")
    assert layout is not None and not layout.type_widening
    assert not (root / "_delta_log" / f"{2:020d}.json").exists()
