"""Schema evolution and table rules at unit level: the merged schema, the coordinator's check of
a ``merge_schema`` intent, its apply (data and new schema in one Delta commit, idempotent, racing
another writer), the rules read from a table, the source's refusal of new upstream columns.

Real Delta tables (delta-rs) and Parquet files in tmp_path; no Spark.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from coordinator.validation import check_table_write
from percolake import codec
from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.lake import delta_commit, log_entry
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import apply_table_write, table_layout
from percolake.lake.schema_evolution import (
    SchemaConflict,
    added_columns,
    column_mapping_problem,
    max_column_id,
    merged_schema,
    with_column_mapping,
)
from percolake.lake.write_check import WriteChecker, merge_problem
from percolake.records import AddFileRecord, RemoveFileRecord, TableWriteRecord, WriteMode
from sparkside.catalog import is_table_name, resolve_table
from sparkside.delta_log import DataFile
from sparkside.errors import UnknownTable, UpstreamSchemaChanged
from sparkside.source import SourceOptions
from sparkside.source_files import FilePartition, read_file
from sparkside.table_rules import not_null_paths, referenced_columns, table_rules
from tests.lake_support import one_file_write

APP = "percolake:p:g0"


def field(name: str, kind: object, nullable: bool = True, metadata: dict | None = None) -> dict:
    return {"name": name, "type": kind, "nullable": nullable, "metadata": metadata or {}}


def schema(*fields: dict) -> str:
    return json.dumps({"type": "struct", "fields": list(fields)})


TABLE = schema(field("id", "long", False),
               field("s", {"type": "struct", "fields": [field("x", "integer", False)]}),
               field("day", "date", True, {"delta.generationExpression": "CAST(ts AS DATE)"}))


def test_merge_keeps_every_table_column_and_adds_new_ones_nullable_at_the_end():
    batch = schema(field("day", "date"), field("currency", "string"), field("id", "long"),
                   field("s", {"type": "struct", "fields": [field("x", "integer"),
                                                            field("y", "string", False)]}))
    merged = json.loads(merged_schema(TABLE, batch))
    table = json.loads(TABLE)
    assert [f["name"] for f in merged["fields"]] == ["id", "s", "day", "currency"]
    assert merged["fields"][0] == table["fields"][0]  # NOT NULL kept
    assert merged["fields"][2] == table["fields"][2]  # generation expression kept
    assert merged["fields"][3] == field("currency", "string")
    assert merged["fields"][1]["type"]["fields"] == [field("x", "integer", False),
                                                     field("y", "string")]
    assert added_columns(TABLE, batch) == ["currency", "s.y"]  # in the batch's order
    assert merged_schema(TABLE, TABLE) == json.dumps(table, separators=(",", ":"))


def test_merge_refuses_another_type_naming_the_column_and_why():
    batch = schema(field("id", "integer"), field("s", "string"))
    with pytest.raises(SchemaConflict) as refused:
        merged_schema(TABLE, batch)
    assert "'id'" in str(refused.value) and "'s'" in str(refused.value)
    assert "type widening does not make" in str(refused.value)  # a narrowing
    assert "cast the column to long" in str(refused.value)


def test_rules_of_a_table_name_their_constraint_and_the_columns_it_shows():
    rules = table_rules(TABLE, (("positive", "id > 0 AND `day` IS NOT NULL"),),
                        given={"id", "s", "day"})
    assert [r.message for r in rules[:2]] == [
        "[DELTA_NOT_NULL_CONSTRAINT_VIOLATED] NOT NULL constraint violated for column: id.",
        "[DELTA_NOT_NULL_CONSTRAINT_VIOLATED] NOT NULL constraint violated for column: s.x."]
    assert rules[2].message.startswith("[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK "
                                       "constraint Generated Column (day <=> CAST(ts AS DATE))")
    assert rules[3].columns == ("id", "day")
    assert rules[3].condition == "coalesce((id > 0 AND `day` IS NOT NULL), false)"
    no_day = table_rules(TABLE, (), given={"id", "s"})  # computed, not checked
    assert [r.message for r in no_day if "Generated" in r.message] == []
    assert not_null_paths(json.loads(TABLE)["fields"]) == ["id", "s.x"]
    assert referenced_columns("amount > 0 AND amounts < 3 AND t.amount2 = 1",
                              ["amount", "amounts", "amount2"]) == ("amount", "amounts")


# ---------------------------------------------------------------- check and apply with delta-rs


@pytest.fixture
def table(tmp_path: Path) -> Path:
    root = tmp_path / "t"
    write_deltalake(str(root), pa.table({"id": pa.array([1], pa.int64())}))
    DeltaTable(str(root)).alter.add_constraint({"positive": "id > 0"})
    return root


def new_column_write(root: Path, txn: str = "txn-1", merge: bool = True,
                     mode: WriteMode = WriteMode.APPEND) -> TableWriteRecord:
    return one_file_write(root, txn, pa.table({"id": pa.array([2], pa.int64()),
                                               "currency": pa.array(["EUR"])}), merge, mode)


def test_the_check_refuses_new_columns_naming_the_option_and_passes_them_with_it(table):
    checker = WriteChecker()
    with pytest.raises(FailedPrecondition, match=r"unknown columns \['currency'\].*merge_schema"):
        checker.check(new_column_write(table, merge=False))
    checker.check(new_column_write(table))
    assert table_layout(f"file://{table}").constraints == (("positive", "id > 0"),)


def test_a_merge_write_commits_its_new_column_with_the_data_in_one_version(table):
    write = new_column_write(table)
    version = apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1", commit_ts=7)
    assert version == 2
    entry = [json.loads(line) for line in
             (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]
    kinds = [next(iter(action)) for action in entry]
    assert kinds == ["commitInfo", "txn", "metaData", "add"]
    assert entry[0]["commitInfo"]["percolake.txn_id"] == "txn-1"
    assert entry[2]["metaData"]["configuration"] == {"delta.constraints.positive": "id > 0"}
    loaded = DeltaTable(str(table))
    assert loaded.transaction_version(APP) == 0
    assert [f.name for f in loaded.schema().fields] == ["id", "currency"]
    assert sorted(read_delta_table(str(table)).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "currency": None}, {"id": 2, "currency": "EUR"}]
    again = apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1", commit_ts=7)
    assert again == 2 and DeltaTable(str(table)).version() == 2


def test_a_merge_overwrite_removes_the_old_files_in_the_same_version(table):
    write = new_column_write(table, mode=WriteMode.OVERWRITE)
    version = apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1", commit_ts=7)
    assert read_delta_table(str(table)).to_pylist() == [{"id": 2, "currency": "EUR"}]
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    assert '"remove"' in text and '"metaData"' in text


def test_a_merge_apply_that_loses_the_race_for_its_version_checks_again(table, monkeypatch):
    write = new_column_write(table)
    real = log_entry.put_entry
    lost: list[int] = []

    def taken_once(table_uri: str, version: int, actions: list) -> bool:
        if not lost:  # another writer commits that version first
            lost.append(version)
            write_deltalake(str(table), pa.table({"id": pa.array([3], pa.int64())}),
                            mode="append")
            return real(table_uri, version, actions)  # the version exists now: False
        return real(table_uri, version, actions)

    monkeypatch.setattr(delta_commit, "put_entry", taken_once)
    version = apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1", commit_ts=7)
    assert lost == [2] and version == 3
    assert sorted(r["id"] for r in read_delta_table(str(table)).to_pylist()) == [1, 2, 3]


def test_a_merge_write_whose_columns_the_table_has_already_commits_through_delta_rs(table):
    first = apply_table_write(new_column_write(table), app_id=APP, app_version=0,
                              txn_id="txn-1", commit_ts=7)
    second = dataclasses.replace(new_column_write(table, "txn-2"))
    version = apply_table_write(second, app_id=APP, app_version=1, txn_id="txn-2", commit_ts=8)
    assert (first, version) == (2, 3)
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    assert '"metaData"' not in text


def test_log_paths_are_encoded_as_delta_rs_encodes_them(tmp_path):
    name = "p=a b%/x:y#1.parquet"
    root = tmp_path / "enc"
    write_deltalake(str(root), pa.table({"id": pa.array([1], pa.int64())}))
    (root / "p=a b%").mkdir()
    pq.write_table(pa.table({"id": pa.array([2], pa.int64())}), root / "p=a b%" / "x:y#1.parquet")
    DeltaTable(str(root)).create_write_transaction(
        [delta_commit.AddAction(name, 1, {}, 0, True, "{}")], "append",
        DeltaTable(str(root)).schema())
    logged = [json.loads(line) for line in
              (root / "_delta_log" / f"{1:020d}.json").read_text().splitlines()]
    assert [a["add"]["path"] for a in logged if "add" in a] == [log_entry.log_path(name)]


def test_merge_schema_and_the_catalog_name_survive_the_record_and_the_wire(table):
    write = dataclasses.replace(new_column_write(table), catalog_name="sales.orders")
    assert TableWriteRecord.from_json(json.loads(write.json_text)) == write
    assert codec.table_write_from_pb(codec.table_write_to_pb(write)) == write
    plain = new_column_write(table, merge=False)
    assert "merge_schema" not in plain.to_json() and "catalog_name" not in plain.to_json()
    with pytest.raises(InvalidArgument, match="catalog_name"):
        check_table_write(dataclasses.replace(write, catalog_name="x" * 2000), "txn-1", 1 << 20)


# ---------------------------------------------------------------- the source's new columns


def test_the_source_refuses_a_file_with_columns_added_upstream_unless_told_to_ignore(tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "currency": ["EUR"]}), path)
    partition = FilePartition("file:///lake/t", 4, DataFile(str(path), path.stat().st_size, ()))
    started_with = pa.schema([("id", pa.int64())])
    with pytest.raises(UpstreamSchemaChanged, match=r"\['currency'\].*Restart the query.*"
                                                    r"new_columns"):
        list(read_file(partition, started_with))
    rows = [b.to_pylist() for b in read_file(partition, started_with, ignore_new_columns=True)]
    assert rows == [[{"id": 1}]]


def test_the_source_refuses_a_column_widened_upstream_and_reads_older_narrower_files(tmp_path):
    wide, narrow = tmp_path / "wide.parquet", tmp_path / "narrow.parquet"
    pq.write_table(pa.table({"id": pa.array([2**40], pa.int64()),
                             "s": pa.array([{"a": 1.5}], pa.struct([("a", pa.float64())]))}),
                   wide)
    pq.write_table(pa.table({"id": pa.array([1], pa.int32()),
                             "s": pa.array([{"a": 0.5}], pa.struct([("a", pa.float32())]))}),
                   narrow)
    started_with = pa.schema([("id", pa.int32()), ("s", pa.struct([("a", pa.float32())]))])
    partition = FilePartition("file:///lake/t", 5, DataFile(str(wide), wide.stat().st_size, ()))
    with pytest.raises(UpstreamSchemaChanged, match=r"id \(int32 in the query, int64 in the "
                                                    r"file\), s \(.*Restart the query"):
        list(read_file(partition, started_with))
    widened_query = pa.schema([("id", pa.int64()), ("s", pa.struct([("a", pa.float64())]))])
    old = FilePartition("file:///lake/t", 1, DataFile(str(narrow), narrow.stat().st_size, ()))
    assert [b.to_pylist() for b in read_file(old, widened_query)] == [[{"id": 1, "s": {"a": 0.5}}]]


def test_names_and_paths_are_told_apart_and_the_source_refuses_a_name_saying_what_to_do():
    for name in ("orders", "sales.orders", "spark_catalog.sales.orders", "`my db`.`t-1`"):
        assert is_table_name(name), name
    for path in ("/lake/orders", "file:///lake/o", "s3://bucket/o", "s3a://b/o", "lake/o",
                 "a.b.c.d"):
        assert not is_table_name(path), path
    assert resolve_table(None, "/lake/orders") == "/lake/orders"
    with pytest.raises(UnknownTable, match="'sales.orders'"):
        resolve_table(None, "sales.orders")
    with pytest.raises(ValueError, match=r"resolve_table\(spark, 'sales.orders'\)"):
        SourceOptions.of({"path": "sales.orders", "coordinator": "h:1", "pipeline": "p"})


# ---------------------------------------------------------------- column-mapped tables

MAPPED_ID = field("id", "long", True, {"delta.columnMapping.id": 1,
                                       "delta.columnMapping.physicalName": "col-id"})


def mapped_table(root: Path, max_column_id: int = 2, schema_json: str | None = None) -> Path:
    """A column-mapped table (mode name) as delta-spark logs one: id is ``col-id``; a dropped
    column once held id 2, so maxColumnId is above the highest id left (``schema_json``: the
    table's schema instead, the file being a stand-in)."""
    (root / "_delta_log").mkdir(parents=True)
    data = pa.table({"col-id": pa.array([1], pa.int64())})
    pq.write_table(data, root / "part-0.parquet")
    actions = [
        {"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}},
        {"metaData": {"id": "mapped", "format": {"provider": "parquet", "options": {}},
                      "schemaString": schema_json or schema(MAPPED_ID),
                      "partitionColumns": [],
                      "configuration": {"delta.columnMapping.mode": "name",
                                        "delta.columnMapping.maxColumnId": str(max_column_id)},
                      "createdTime": 1}},
        {"add": {"path": "part-0.parquet", "partitionValues": {},
                 "size": (root / "part-0.parquet").stat().st_size, "modificationTime": 1,
                 "dataChange": True, "stats": '{"numRecords":1}'}}]
    (root / "_delta_log" / f"{0:020d}.json").write_text(
        "".join(json.dumps(a) + "\n" for a in actions))
    return root


def mapped_write(root: Path, merged: str) -> TableWriteRecord:
    """A merge_schema write of (id, currency, n.q) whose file carries the physical names."""
    fields = {f["name"]: f["metadata"] for f in json.loads(merged)["fields"]}
    physical = {name: meta.get("delta.columnMapping.physicalName", name)
                for name, meta in fields.items()}
    nested = json.loads(merged)["fields"][2]["type"]["fields"][0]["metadata"] \
        .get("delta.columnMapping.physicalName", "q")
    folder = root / "_percolake" / "txn-1"
    folder.mkdir(parents=True, exist_ok=True)
    data = pa.table({physical["id"]: pa.array([2], pa.int64()),
                     physical["currency"]: pa.array(["EUR"]),
                     physical["n"]: pa.array([{nested: 7}])})
    path = folder / "part-0.parquet"
    pq.write_table(data, path)
    add = AddFileRecord(path.relative_to(root).as_posix(), path.stat().st_size, {}, 0,
                        json.dumps({"numRecords": 1}))
    return TableWriteRecord(f"file://{root}", WriteMode.APPEND, (add,), merged, (), (), True)


def batch_with_new_columns() -> str:
    return schema(field("id", "long"), field("currency", "string"),
                  field("n", {"type": "struct", "fields": [field("q", "integer")]}))


def test_new_columns_of_a_mapped_table_get_ids_above_max_column_id_in_pre_order():
    merged = merged_schema(schema(MAPPED_ID), batch_with_new_columns())
    mapped = json.loads(with_column_mapping(merged, 2))
    ids = {f["name"]: f["metadata"]["delta.columnMapping.id"] for f in mapped["fields"]}
    assert ids == {"id": 1, "currency": 3, "n": 4}  # as delta-spark numbers them
    nested = mapped["fields"][2]["type"]["fields"][0]["metadata"]
    assert nested["delta.columnMapping.id"] == 5
    names = [f["metadata"]["delta.columnMapping.physicalName"] for f in mapped["fields"]]
    assert names[0] == "col-id" and all(n.startswith("col-") for n in names)
    assert len(set(names)) == 3
    assert max_column_id({"delta.columnMapping.maxColumnId": "2"}, json.dumps(mapped)) == 5
    assert column_mapping_problem(schema(MAPPED_ID), json.dumps(mapped), 2) is None


def test_the_check_refuses_new_mapped_columns_without_ids_or_with_ids_the_table_used(tmp_path):
    root = mapped_table(tmp_path / "m")
    checker = WriteChecker()
    merged = merged_schema(schema(MAPPED_ID), batch_with_new_columns())
    with pytest.raises(FailedPrecondition, match="'currency' has no column mapping id"):
        checker.check(mapped_write(root, merged))
    reused = with_column_mapping(merged, 1)  # id 2 was a dropped column's
    with pytest.raises(FailedPrecondition, match="'currency' has column mapping id 2, not "
                                                 "above the table's maxColumnId 2"):
        checker.check(mapped_write(root, reused))
    checker.check(mapped_write(root, with_column_mapping(merged, 2)))


def test_a_merge_write_to_a_mapped_table_commits_the_new_mapping_and_raises_max_column_id(
        tmp_path):
    root = mapped_table(tmp_path / "m")
    merged = with_column_mapping(merged_schema(schema(MAPPED_ID), batch_with_new_columns()), 2)
    write = mapped_write(root, merged)
    version = apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1", commit_ts=7)
    entry = [json.loads(line) for line in
             (root / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]
    metadata = next(a["metaData"] for a in entry if "metaData" in a)
    assert metadata["configuration"] == {"delta.columnMapping.mode": "name",
                                         "delta.columnMapping.maxColumnId": "5"}
    assert json.loads(metadata["schemaString"]) == json.loads(merged)
    layout = table_layout(f"file://{root}")
    assert layout.max_column_id == 5 and layout.schema_json
    assert apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1",
                             commit_ts=7) == version  # once


def test_a_mapped_merge_whose_ids_an_outside_writer_took_is_not_applied(tmp_path):
    root = mapped_table(tmp_path / "m")
    merged = with_column_mapping(merged_schema(schema(MAPPED_ID), batch_with_new_columns()), 2)
    write = mapped_write(root, merged)
    WriteChecker().check(write)
    taken = [{"metaData": {"id": "mapped", "format": {"provider": "parquet", "options": {}},
                           "schemaString": schema(MAPPED_ID), "partitionColumns": [],
                           "configuration": {"delta.columnMapping.mode": "name",
                                             "delta.columnMapping.maxColumnId": "3"},
                           "createdTime": 1}}]  # ADD then DROP COLUMN by delta-spark
    assert log_entry.put_entry(f"file://{root}", 1, taken)
    with pytest.raises(SchemaConflict, match="'currency' has column mapping id 3"):
        apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1", commit_ts=7)
    assert DeltaTable(str(root)).version() == 1


def test_a_mapped_merge_keys_its_adds_partition_values_by_physical_name(tmp_path):
    """Found by the Spark test: the log entry's adds key partitionValues as the log does."""
    root = tmp_path / "p"
    (root / "_delta_log").mkdir(parents=True)
    day = field("day", "string", True, {"delta.columnMapping.id": 2,
                                        "delta.columnMapping.physicalName": "col-day"})
    actions = [
        {"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}},
        {"metaData": {"id": "p", "format": {"provider": "parquet", "options": {}},
                      "schemaString": schema(MAPPED_ID, day), "partitionColumns": ["day"],
                      "configuration": {"delta.columnMapping.mode": "name",
                                        "delta.columnMapping.maxColumnId": "2"},
                      "createdTime": 1}}]
    (root / "_delta_log" / f"{0:020d}.json").write_text(
        "".join(json.dumps(a) + "\n" for a in actions))
    merged = json.loads(with_column_mapping(merged_schema(
        schema(MAPPED_ID, day), schema(field("id", "long"), field("day", "string"),
                                       field("currency", "string"))), 2))
    currency = merged["fields"][2]["metadata"]["delta.columnMapping.physicalName"]
    folder = root / "_percolake" / "txn-1"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"col-id": pa.array([1], pa.int64()), currency: ["EUR"]}),
                   folder / "part-0.parquet")
    add = AddFileRecord("_percolake/txn-1/part-0.parquet",
                        (folder / "part-0.parquet").stat().st_size, {"day": "a"}, 0,
                        json.dumps({"numRecords": 1}))
    write = TableWriteRecord(f"file://{root}", WriteMode.APPEND, (add,), json.dumps(merged),
                             ("day",), (), True)
    WriteChecker().check(write)
    version = apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1", commit_ts=7)
    entry = [json.loads(line) for line in
             (root / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]
    assert [a["add"]["partitionValues"] for a in entry if "add" in a] == [{"col-day": "a"}]
    assert DeltaTable(str(root)).version() == version  # delta-rs reads the entry back


def mapped(name: str, kind: object, field_id: int) -> dict:
    return field(name, kind, True, {"delta.columnMapping.id": field_id,
                                    "delta.columnMapping.physicalName": f"col-{field_id}"})


def in_array(*fields: dict) -> dict:
    return {"type": "array", "elementType": {"type": "struct", "fields": list(fields)},
            "containsNull": True}


def in_map(*fields: dict) -> dict:
    return {"type": "map", "keyType": "string",
            "valueType": {"type": "struct", "fields": list(fields)}, "valueContainsNull": True}


NESTED_MAPPED = schema(mapped("a", in_array(mapped("x", "integer", 2)), 1),
                       mapped("m", in_map(mapped("x", "integer", 4)), 3))
ADDS_INSIDE = schema(field("a", in_array(field("x", "integer"), field("w", "integer"))),
                     field("m", in_map(field("x", "integer"), field("v", "string"))))


def test_fields_added_inside_arrays_and_maps_are_new_columns_named_and_mapped(tmp_path):
    """A batch whose only new fields lie in an array's structs or a map's values: they are new
    columns (named in the refusal without merge_schema), and on a column-mapped table the
    coordinator refuses them without ids, as it does top-level ones."""
    assert added_columns(NESTED_MAPPED, ADDS_INSIDE) == ["a.element.w", "m.value.v"]
    problem = delta_commit.describe_schema_mismatch(NESTED_MAPPED, ADDS_INSIDE, None, [])
    assert problem == ("unknown columns ['a.element.w', 'm.value.v'] (txn.write(..., "
                       "merge_schema=True) adds them to the table)")
    layout = table_layout(f"file://{mapped_table(tmp_path / 'm', 4, NESTED_MAPPED)}")
    unmapped = merged_schema(NESTED_MAPPED, ADDS_INSIDE, column_mapping=True)
    assert "new column 'a.element.w' has no column mapping id" in \
        merge_problem(layout, unmapped, ())
    ids = json.loads(with_column_mapping(unmapped, 4))
    assert ids["fields"][0]["type"]["elementType"]["fields"][1]["metadata"][
        "delta.columnMapping.id"] == 5
    assert merge_problem(layout, json.dumps(ids), ()) is None


def test_the_source_refuses_nested_fields_added_upstream_and_reads_lacked_ones_as_null(tmp_path):
    """A struct, an array's structs and a map's values that gained a field after the query
    started: refused naming them (or left out with new_columns=ignore); older files that lack
    a field the query's schema has read it as null."""
    def struct(*names: str) -> pa.DataType:
        return pa.struct([(n, pa.int64()) for n in names])

    def write(name: str, *fields: str) -> FilePartition:
        data = pa.table({"s": pa.array([dict.fromkeys(fields, 1)], struct(*fields)),
                         "a": pa.array([[dict.fromkeys(fields, 2)]], pa.list_(struct(*fields))),
                         "m": pa.array([[("k", dict.fromkeys(fields, 3))]],
                                       pa.map_(pa.string(), struct(*fields)))})
        path = tmp_path / f"{name}.parquet"
        pq.write_table(data, path)
        return FilePartition("file:///lake/t", 4, DataFile(str(path), path.stat().st_size, ()))

    started_with = pa.schema([("s", struct("x", "y")), ("a", pa.list_(struct("x", "y"))),
                              ("m", pa.map_(pa.string(), struct("x", "y")))])
    newer = write("newer", "x", "y", "z")
    with pytest.raises(UpstreamSchemaChanged, match=r"\['a.element.z', 'm.value.z', 's.z'\]"
                                                    r".*Restart the query.*new_columns"):
        list(read_file(newer, started_with))
    (ignored,) = [b.to_pylist() for b in read_file(newer, started_with, ignore_new_columns=True)]
    assert ignored == [{"s": {"x": 1, "y": 1}, "a": [{"x": 2, "y": 2}],
                        "m": [("k", {"x": 3, "y": 3})]}]
    (older,) = [b.to_pylist() for b in read_file(write("older", "x"), started_with)]
    assert older == [{"s": {"x": 1, "y": None}, "a": [{"x": 2, "y": None}],
                      "m": [("k", {"x": 3, "y": None})]}]


def test_a_merge_with_schema_evolution_commits_the_new_mapping_with_its_rewrite(tmp_path):
    """MERGE withSchemaEvolution on a column-mapped table (a ROW_LEVEL write with merge_schema):
    the new columns' ids, physical names and the raised maxColumnId are committed in the entry
    that removes the rewritten file and adds the new ones, as delta-spark's MERGE commits them."""
    root = mapped_table(tmp_path / "m")
    merged = with_column_mapping(merged_schema(schema(MAPPED_ID), batch_with_new_columns()), 2)
    appended = mapped_write(root, merged)
    write = dataclasses.replace(
        appended, mode=WriteMode.ROW_LEVEL, read_version=0, operation="MERGE",
        remove_files=(RemoveFileRecord("part-0.parquet",
                                       (root / "part-0.parquet").stat().st_size, {}),))
    WriteChecker().check(write)
    version = apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1", commit_ts=7)
    entry = [json.loads(line) for line in
             (root / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]
    assert [next(iter(a)) for a in entry] == ["commitInfo", "txn", "metaData", "add", "remove"]
    metadata = entry[2]["metaData"]
    assert metadata["configuration"] == {"delta.columnMapping.mode": "name",
                                         "delta.columnMapping.maxColumnId": "5"}
    assert json.loads(metadata["schemaString"]) == json.loads(merged)
    assert table_layout(f"file://{root}").max_column_id == 5
    assert apply_table_write(write, app_id=APP, app_version=0, txn_id="txn-1",
                             commit_ts=7) == version  # once


def test_new_columns_of_a_mapped_table_keep_the_table_mapping_and_drop_the_batch_metadata():
    """``ColumnMapping.with_new_columns`` (merge_schema appends and MERGE withSchemaEvolution):
    the table's columns keep their ids and names; a batch column's own metadata (e.g. read from
    another mapped table) never reaches the table, only the ids assigned above maxColumnId."""
    from sparkside.column_mapping import ColumnMapping

    foreign = {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-other"}
    mapping = ColumnMapping.with_new_columns(
        schema(MAPPED_ID), 7, schema(field("id", "long"), field("note", "string", True, foreign)))
    fields = json.loads(mapping.schema_json)["fields"]
    assert fields[0] == MAPPED_ID
    assert fields[1]["metadata"]["delta.columnMapping.id"] == 8
    assert fields[1]["metadata"]["delta.columnMapping.physicalName"].startswith("col-")
    assert fields[1]["metadata"]["delta.columnMapping.physicalName"] != "col-other"
    assert mapping.names == {"id": "col-id",
                             "note": fields[1]["metadata"]["delta.columnMapping.physicalName"]}
