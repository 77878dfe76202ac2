"""The coordinator's pre-commit check: a write that the apply could not make, or would make
losing data, is refused before the commit point; a fitting one passes and then applies.

Real Delta tables (``write_deltalake``) and real Parquet files in tmp_path, no mocks of delta-rs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Schema, write_deltalake

from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.lake import write_check
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import apply_table_write
from percolake.lake.write_check import WriteChecker
from percolake.records import AddFileRecord, RemoveFileRecord, TableWriteRecord, WriteMode

X_LONG = pa.schema([("x", pa.int64())])
X_P = pa.schema([("x", pa.int64()), ("p", pa.string())])


def delta_json(schema: pa.Schema) -> str:
    return Schema.from_arrow(schema).to_json()


def make_table(root: Path, schema: pa.Schema = X_LONG, partition_by: list[str] | None = None,
               configuration: dict[str, str | None] | None = None) -> None:
    rows = {f.name: pa.array([1] if f.type == pa.int64() else ["a"], f.type) for f in schema}
    write_deltalake(str(root), pa.table(rows, schema=schema), partition_by=partition_by,
                    configuration=configuration)


def data_file(root: Path, txn: str, data: pa.Table, folder: str = "",
              partition_values: dict[str, str | None] | None = None) -> AddFileRecord:
    """A Parquet file written where the participant writes it, described as Spark's writer does:
    its literal path relative to the table root (``sparkside.writer.describe_files``)."""
    directory = root / "_percolake" / txn / folder
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"part-{len(list(directory.iterdir()))}.parquet"
    pq.write_table(data, path)
    return AddFileRecord(path.relative_to(root).as_posix(), path.stat().st_size,
                         partition_values or {}, 0, json.dumps({"numRecords": data.num_rows}))


def intent(root: Path, files: list[AddFileRecord], schema: pa.Schema | str = X_LONG,
           mode: WriteMode = WriteMode.APPEND, partition_by: tuple[str, ...] = (),
           replace: tuple = ()) -> TableWriteRecord:
    schema_json = schema if isinstance(schema, str) else delta_json(schema)
    return TableWriteRecord(f"file://{root}", mode, tuple(files), schema_json, partition_by,
                            replace)


def longs(*values: int) -> pa.Table:
    return pa.table({"x": pa.array(values, pa.int64())})


def rows(root: Path) -> list[dict]:
    return sorted(read_delta_table(str(root)).to_pylist(), key=str)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "t"


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every time the check loads a table's log with delta-rs."""
    calls: list[str] = []
    real = write_check.table_layout

    def counting(table: str):  # noqa: ANN202
        calls.append(table)
        return real(table)

    monkeypatch.setattr(write_check, "table_layout", counting)
    return calls


def test_a_fitting_write_passes_and_then_applies(root):
    make_table(root)
    write = intent(root, [data_file(root, "t1", longs(2, 3))])
    WriteChecker().check(write)
    apply_table_write(write, app_id="app", app_version=1, txn_id="t1", commit_ts=1)
    assert rows(root) == [{"x": 1}, {"x": 2}, {"x": 3}]


@pytest.mark.parametrize("schema_json", [
    "not json",
    '{"fields": 5}',
    '{"fields": [1, 2]}',
    '{"type": "struct", "fields": []}',
    '{"type":"struct","fields":[{"name":"x","type":"lnog","nullable":true,"metadata":{}}]}',
    '{"type":"struct","fields":[{"name":"x","type":"decimal(50,2)","nullable":true,'
    '"metadata":{}}]}',
    '{"type":"struct","fields":[{"name":"x","type":"long","nullable":true,"metadata":{}},'
    '{"name":"X","type":"long","nullable":true,"metadata":{}}]}',
    '{"type":"struct","fields":[{"name":"x\\u0000","type":"long","nullable":true,'
    '"metadata":{}}]}',
])
def test_a_schema_delta_rs_cannot_use_is_invalid_argument(root, schema_json):
    make_table(root)
    write = intent(root, [data_file(root, "t1", longs(2))], schema_json)
    with pytest.raises(InvalidArgument, match=f"table file://{root}: "):
        WriteChecker().check(write)


@pytest.mark.parametrize("depth", [200, 5_000, 200_000])
def test_a_deeply_nested_schema_is_invalid_argument(root, depth):
    nested = '{"type":"array","elementType":' * depth + '"long"' + ',"containsNull":true}' * depth
    schema_json = ('{"type":"struct","fields":[{"name":"x","type":' + nested
                   + ',"nullable":true,"metadata":{}}]}')
    for text in (schema_json, "[" * depth + "]" * depth):
        with pytest.raises(InvalidArgument, match="schema"):
            WriteChecker().check(intent(root, [], text))


@pytest.mark.parametrize("mode", [WriteMode.APPEND, WriteMode.OVERWRITE])
def test_a_string_column_onto_a_long_table_is_refused(root, mode):
    make_table(root)
    batch = pa.table({"y": ["s"]})
    write = intent(root, [data_file(root, "t1", batch)], batch.schema, mode)
    with pytest.raises(FailedPrecondition, match=r"missing columns \['x'\].*unknown columns "
                                                 r"\['y'\]") as refused:
        WriteChecker().check(write)
    assert f"file://{root}" in str(refused.value)


def test_a_type_change_is_refused_naming_the_column(root):
    make_table(root)
    batch = pa.table({"x": ["s"]})
    with pytest.raises(FailedPrecondition, match="column 'x' is \"long\" in the table but "
                                                 "\"string\" in the batch"):
        WriteChecker().check(intent(root, [data_file(root, "t1", batch)], batch.schema))


def test_the_apply_cannot_change_the_schema_so_overwrite_must_fit_too(root):
    """Why overwrite is checked like append: applied anyway, the table keeps its old schema
    and the batch's column is lost (delta-rs commits with mode="append" plus removes)."""
    make_table(root)
    batch = pa.table({"y": ["s"]})
    write = intent(root, [data_file(root, "t1", batch)], batch.schema, WriteMode.OVERWRITE)
    apply_table_write(write, app_id="app", app_version=1, txn_id="t1", commit_ts=1)
    assert DeltaTable(str(root)).schema().to_json() == delta_json(X_LONG)
    assert rows(root) == [{"x": None}]


def test_partition_columns_must_be_the_table_s(root):
    make_table(root, X_P, ["p"])
    checker = WriteChecker()
    unpartitioned = intent(root, [data_file(root, "t1", longs(2))], X_P)
    with pytest.raises(FailedPrecondition, match=r"partitioned by \['p'\], not \[\]"):
        checker.check(unpartitioned)
    by_x = intent(root, [data_file(root, "t2", pa.table({"p": ["a"]}), "x=2",
                                   {"x": "2"})], X_P, WriteMode.OVERWRITE_PARTITIONS, ("x",),
                  ({"x": "2"},))
    with pytest.raises(FailedPrecondition, match=r"partitioned by \['p'\], not \['x'\]"):
        checker.check(by_x)
    fits = intent(root, [data_file(root, "t3", longs(2), "p=b", {"p": "b"})], X_P,
                  WriteMode.OVERWRITE_PARTITIONS, ("p",), ({"p": "b"},))
    checker.check(fits)


def test_a_partitioned_write_onto_an_unpartitioned_table_is_refused(root):
    make_table(root)
    write = intent(root, [data_file(root, "t1", longs(), "x=2", {"x": "2"})],
                   partition_by=("x",))
    with pytest.raises(FailedPrecondition, match=r"partitioned by \[\], not \['x'\]"):
        WriteChecker().check(write)


@pytest.mark.parametrize(("partition_by", "problem"), [
    (("y",), "not in the schema"),
    (("P",), "not in the schema"),
    (("p", "p"), "twice"),
    (("s",), "not of a primitive type"),
])
def test_malformed_partition_columns_are_invalid_argument(root, partition_by, problem):
    schema = pa.schema([("x", pa.int64()), ("p", pa.string()),
                        ("s", pa.struct([("a", pa.int64())]))])
    write = intent(root, [], schema, partition_by=partition_by)
    with pytest.raises(InvalidArgument, match=problem):
        WriteChecker().check(write)


@pytest.mark.parametrize("table_exists", [True, False])
def test_a_missing_file_is_refused_naming_it(root, table_exists):
    if table_exists:
        make_table(root)
    present = data_file(root, "t1", longs(2))
    gone = data_file(root, "t1", longs(3))
    os.remove(root / gone.path)
    with pytest.raises(FailedPrecondition, match=f"missing: \\['{gone.path}'\\]"):
        WriteChecker().check(intent(root, [present, gone]))


def test_a_file_of_another_size_is_refused_naming_it(root):
    make_table(root)
    add = data_file(root, "t1", longs(2))
    wrong = AddFileRecord(add.path, add.size + 5, {}, 0, add.stats)
    with pytest.raises(FailedPrecondition,
                       match=f"{wrong.path} has {add.size} bytes, not {wrong.size}"):
        WriteChecker().check(intent(root, [wrong]))


def test_add_paths_are_the_files_literal_paths(root):
    """As Spark's writer names them: partition folders keep their escapes (``%2F``)."""
    make_table(root, X_P, ["p"])
    odd = data_file(root, "t1", longs(2), "p=a%2Fb c%3Ad%25", {"p": "a/b c:d%"})
    write = intent(root, [odd], X_P, partition_by=("p",))
    WriteChecker().check(write)
    apply_table_write(write, app_id="app", app_version=1, txn_id="t1", commit_ts=1)
    assert {"x": 2, "p": "a/b c:d%"} in rows(root)


def test_a_dot_segment_is_invalid_argument(root):
    """delta-rs would commit ``./part`` as a file named ``%2E/part``, which does not exist."""
    make_table(root)
    add = data_file(root, "t1", longs(2))
    folder, name = add.path.rsplit("/", 1)
    dotted = AddFileRecord(f"{folder}/./{name}", add.size, {}, 0, add.stats)
    with pytest.raises(InvalidArgument, match="segment"):
        WriteChecker().check(intent(root, [dotted]))


def test_a_new_table_needs_only_a_schema_and_partition_columns(root):
    schema = pa.schema([("y", pa.string()), ("p", pa.int64())])
    write = intent(root, [data_file(root, "t1", pa.table({"y": ["s"]}), "p=1", {"p": "1"})],
                   schema, WriteMode.OVERWRITE_PARTITIONS, ("p",), ({"p": "1"},))
    WriteChecker().check(write)
    apply_table_write(write, app_id="app", app_version=0, txn_id="t1", commit_ts=1)
    assert rows(root) == [{"y": "s", "p": 1}]


@pytest.mark.parametrize(("delta_type", "value"), [
    ("long", "7"), ("long", "abc"), ("long", "1.0"), ("long", "9223372036854775808"),
    ("integer", "2147483648"), ("boolean", "TRUE"), ("boolean", "1"), ("date", "2026-01-02"),
    ("date", "20260102"), ("timestamp", "2026-01-02 00:00:00.000000"), ("timestamp", "x"),
    ("decimal(5,2)", "1.50"), ("decimal(5,2)", "1.5"), ("double", "NaN"), ("string", "x y"),
])
def test_partition_values_are_refused_exactly_when_the_apply_fails(tmp_path, delta_type, value):
    field = {"name": "p", "type": delta_type, "nullable": True, "metadata": {}}
    schema = json.dumps({"type": "struct", "fields": [
        {"name": "x", "type": "long", "nullable": True, "metadata": {}}, field]})
    verdicts = []
    for table_exists in (False, True):
        root = tmp_path / f"t{table_exists}"
        if table_exists:
            first = intent(root, [], schema, partition_by=("p",))
            apply_table_write(first, app_id="app", app_version=0, txn_id="t0", commit_ts=1)
        write = intent(root, [data_file(root, "t1", longs(2), "p=v", {"p": value})], schema,
                       partition_by=("p",))
        try:
            WriteChecker().check(write)
            checked = True
        except InvalidArgument as refused:
            assert f"partition column 'p' ({delta_type})" in str(refused)
            checked = False
        try:  # the apply, and delta-rs's read of the version it wrote
            apply_table_write(write, app_id="app", app_version=1, txn_id="t1", commit_ts=2)
            DeltaTable(str(root)).to_pyarrow_table()
            applied = True
        except Exception:  # noqa: BLE001 - whatever the apply or the read raises
            applied = False
        verdicts.append((checked, applied))
    assert verdicts[0][0] == verdicts[0][1] and verdicts[1][0] == verdicts[1][1], verdicts


def test_each_partition_value_is_probed_once(root, monkeypatch):
    make_table(root, X_P, ["p"])
    probes: list[list[str]] = []
    real = write_check._probe

    def counting(field: dict, values: list[str]) -> None:
        probes.append(values)
        real(field, values)

    monkeypatch.setattr(write_check, "_probe", counting)
    checker = WriteChecker()
    for txn, values in (("t1", ["a", "b"]), ("t2", ["b", "c"]), ("t3", ["a", "c"])):
        files = [data_file(root, txn, longs(1), f"p={v}", {"p": v}) for v in values]
        checker.check(intent(root, files, X_P, partition_by=("p",)))
    assert probes == [["a", "b"], ["c"]]


def test_an_append_only_table_refuses_overwrites(root):
    make_table(root, configuration={"delta.appendOnly": "true"})
    checker = WriteChecker()
    checker.check(intent(root, [data_file(root, "t1", longs(2))]))
    with pytest.raises(FailedPrecondition, match="delta.appendOnly"):
        checker.check(intent(root, [data_file(root, "t2", longs(2))], mode=WriteMode.OVERWRITE))


def test_an_append_only_table_takes_a_row_level_write_that_only_adds_files(root):
    """delta-spark's MERGE that only inserts is an append on a delta.appendOnly table; a
    row-level write removing a file is refused there, as its UPDATE, DELETE or MERGE would be."""
    make_table(root, configuration={"delta.appendOnly": "true"})
    checker = WriteChecker()
    inserts = dataclasses.replace(intent(root, [data_file(root, "t1", longs(2))],
                                         mode=WriteMode.ROW_LEVEL), read_version=0)
    checker.check(inserts)
    (existing,) = DeltaTable(str(root)).file_uris()
    removing = dataclasses.replace(inserts, remove_files=(
        RemoveFileRecord(Path(existing).name, Path(existing).stat().st_size, {}),))
    with pytest.raises(FailedPrecondition, match="delta.appendOnly"):
        checker.check(removing)


@pytest.mark.parametrize(("mode", "partition_by", "replace"), [
    (WriteMode.APPEND, ("p",), ({"p": "a"},)),
    (WriteMode.OVERWRITE_PARTITIONS, (), ()),
])
def test_a_bad_mode_combination_is_invalid_argument(root, mode, partition_by, replace):
    write = intent(root, [], X_P, mode, partition_by, replace)
    with pytest.raises(InvalidArgument, match="overwrite_partitions"):
        WriteChecker().check(write)


def test_the_layout_is_read_once_per_version_and_reloaded_on_a_schema_change(root, loads):
    make_table(root)
    checker = WriteChecker()
    for batch in range(1, 4):
        write = intent(root, [data_file(root, f"t{batch}", longs(batch))])
        checker.check(write)
        apply_table_write(write, app_id="app", app_version=batch, txn_id=f"t{batch}",
                          commit_ts=batch)
    assert len(loads) == 1
    write_deltalake(str(root), pa.table({"y": ["s"]}), mode="overwrite", schema_mode="overwrite")
    with pytest.raises(FailedPrecondition, match=r"missing columns \['y'\]"):
        checker.check(intent(root, [data_file(root, "t4", longs(4))]))
    batch = pa.table({"y": ["t"]})
    checker.check(intent(root, [data_file(root, "t5", batch)], batch.schema))
    assert len(loads) == 2


def test_a_table_recreated_at_the_same_version_is_reloaded(root, loads):
    make_table(root)
    checker = WriteChecker()
    checker.check(intent(root, [data_file(root, "t1", longs(2))]))
    shutil.rmtree(root)
    make_table(root, pa.schema([("y", pa.int64())]))
    with pytest.raises(FailedPrecondition, match=r"missing columns \['y'\]"):
        checker.check(intent(root, [data_file(root, "t2", longs(2))]))
    assert len(loads) == 2


def test_a_deleted_table_counts_as_new(root):
    make_table(root)
    checker = WriteChecker()
    checker.check(intent(root, [data_file(root, "t1", longs(2))]))
    shutil.rmtree(root / "_delta_log")
    batch = pa.table({"y": ["s"]})
    checker.check(intent(root, [data_file(root, "t2", batch)], batch.schema))
