"""The Delta applier: idempotent, exact, safe under concurrent appliers (delta-rs only)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Schema

from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import (
    apply_table_write,
    describe_schema_mismatch,
    table_layout,
)
from percolake.lake.warehouse import UnsafeLocation, canonical_table_uri, local_path
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode

APP = "percolake:p:g0"
SCHEMA = Schema.from_arrow(pa.schema([("id", pa.int64()), ("day", pa.string())])).to_json()


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return tmp_path / "t"


def data_file(table: Path, txn: str, ids: list[int], day: str | None) -> AddFileRecord:
    folder = table / "_percolake" / txn / f"day={day}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-{len(list(folder.iterdir()))}.parquet"
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
    return AddFileRecord(path.relative_to(table).as_posix(), path.stat().st_size, {"day": day},
                         0, json.dumps({"numRecords": len(ids)}))


def write(table: Path, mode: WriteMode, files: list[AddFileRecord],
          replace: tuple = ()) -> TableWriteRecord:
    return TableWriteRecord(f"file://{table}", mode, tuple(files), SCHEMA, ("day",), replace)


def ids(table: Path, version: int | None = None) -> list[tuple[int, str]]:
    return sorted((r["id"], r["day"]) for r in read_delta_table(str(table), version).to_pylist())


def test_first_write_creates_the_table_with_its_data_in_one_version(table):
    first = write(table, WriteMode.APPEND, [data_file(table, "a", [1, 2], "d1")])
    assert apply_table_write(first, app_id=APP, app_version=0, txn_id="a", commit_ts=10) == 0
    assert ids(table, 0) == [(1, "d1"), (2, "d1")]
    assert DeltaTable(str(table)).transaction_version(APP) == 0
    info = DeltaTable(str(table)).history(1)[0]
    assert info["percolake.txn_id"] == "a" and info["percolake.commit_ts"] == "10"


def test_applying_twice_returns_the_same_version_and_writes_nothing(table):
    first = write(table, WriteMode.APPEND, [data_file(table, "a", [1], "d1")])
    second = write(table, WriteMode.APPEND, [data_file(table, "b", [2], "d1")])
    apply_table_write(first, app_id=APP, app_version=0, txn_id="a", commit_ts=10)
    assert apply_table_write(second, app_id=APP, app_version=1, txn_id="b", commit_ts=11) == 1
    for _ in range(3):
        assert apply_table_write(first, app_id=APP, app_version=0, txn_id="a", commit_ts=10) == 0
        assert apply_table_write(second, app_id=APP, app_version=1, txn_id="b",
                                 commit_ts=11) == 1
    assert DeltaTable(str(table)).version() == 1 and ids(table) == [(1, "d1"), (2, "d1")]


def test_overwrite_partitions_replaces_only_the_named_partitions(table):
    apply_table_write(write(table, WriteMode.APPEND, [data_file(table, "a", [1, 2], "d1"),
                                                      data_file(table, "a", [3], "d2")]),
                      app_id=APP, app_version=0, txn_id="a", commit_ts=10)
    replace = write(table, WriteMode.OVERWRITE_PARTITIONS, [data_file(table, "b", [9], "d1")],
                    ({"day": "d1"},))
    apply_table_write(replace, app_id=APP, app_version=1, txn_id="b", commit_ts=11)
    assert ids(table) == [(3, "d2"), (9, "d1")]
    assert ids(table, 0) == [(1, "d1"), (2, "d1"), (3, "d2")]  # history intact


def test_overwrite_replaces_the_whole_table(table):
    apply_table_write(write(table, WriteMode.APPEND, [data_file(table, "a", [1], "d1"),
                                                      data_file(table, "a", [2], "d2")]),
                      app_id=APP, app_version=0, txn_id="a", commit_ts=10)
    apply_table_write(write(table, WriteMode.OVERWRITE, [data_file(table, "b", [7], "d3")]),
                      app_id=APP, app_version=1, txn_id="b", commit_ts=11)
    assert ids(table) == [(7, "d3")]


def test_concurrent_appliers_commit_each_write_exactly_once(table):
    for batch in range(4):
        pending = write(table, WriteMode.APPEND, [data_file(table, f"t{batch}", [batch], "d")])
        versions: list[int] = []

        def apply(pending=pending, batch=batch, versions=versions) -> None:  # noqa: ANN001
            versions.append(apply_table_write(pending, app_id=APP, app_version=batch,
                                              txn_id=f"t{batch}", commit_ts=10 + batch))

        threads = [threading.Thread(target=apply) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert versions == [batch] * 4
    assert ids(table) == [(b, "d") for b in range(4)]


def test_schema_mismatch_names_the_columns(table):
    apply_table_write(write(table, WriteMode.APPEND, [data_file(table, "a", [1], "d1")]),
                      app_id=APP, app_version=0, txn_id="a", commit_ts=10)
    other = Schema.from_arrow(pa.schema([("id", pa.string()), ("extra", pa.int32())])).to_json()
    existing = table_layout(f"file://{table}").schema_json
    problem = describe_schema_mismatch(existing, other, [], ["day"])
    assert "'day'" in problem or "day" in problem
    assert "extra" in problem and "'id'" in problem
    assert describe_schema_mismatch(SCHEMA, SCHEMA, ["day"], ["day"]) is None


def spark_named_file(table: Path, txn: str, folder: str, ids: list[int]) -> Path:
    """A data file in a folder named the way Spark names partition folders (escaped)."""
    path = table / "_percolake" / txn / folder / f"part-{len(ids)}-{txn}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
    return path


def test_overwrite_partitions_finds_files_whose_paths_the_log_encodes(table):
    """delta-rs stores add paths URI-encoded; a remove must name the same file, not re-encode."""
    odd = "a/b c:d%"
    first = spark_named_file(table, "a", "day=a%2Fb c%3Ad%25", [1])
    other = spark_named_file(table, "a", "day=x", [2])
    files = [AddFileRecord(p.relative_to(table).as_posix(), p.stat().st_size, {"day": day}, 0,
                           json.dumps({"numRecords": 1}))
             for p, day in ((first, odd), (other, "x"))]
    apply_table_write(write(table, WriteMode.APPEND, files), app_id=APP, app_version=0,
                      txn_id="a", commit_ts=10)
    assert ids(table) == [(1, odd), (2, "x")]
    replace = write(table, WriteMode.OVERWRITE_PARTITIONS, [data_file(table, "b", [9], "y")],
                    ({"day": odd},))
    apply_table_write(replace, app_id=APP, app_version=1, txn_id="b", commit_ts=11)
    assert ids(table) == [(2, "x"), (9, "y")]
    apply_table_write(write(table, WriteMode.OVERWRITE, [data_file(table, "c", [5], "z")]),
                      app_id=APP, app_version=2, txn_id="c", commit_ts=12)
    assert ids(table) == [(5, "z")]


def test_overwrite_partitions_compares_timestamp_partitions_as_timestamps(table):
    schema = Schema.from_arrow(pa.schema([("id", pa.int64()),
                                          ("at", pa.timestamp("us", tz="UTC"))])).to_json()

    def at_write(txn: str, ids_: list[int], value: str, mode: WriteMode,
                 replace: tuple = ()) -> TableWriteRecord:
        path = spark_named_file(table, txn, "at=" + value.replace(":", "%3A"), ids_)
        add = AddFileRecord(path.relative_to(table).as_posix(), path.stat().st_size,
                            {"at": value}, 0, json.dumps({"numRecords": len(ids_)}))
        return TableWriteRecord(f"file://{table}", mode, (add,), schema, ("at",), replace)

    apply_table_write(at_write("a", [1], "2026-01-02 00:00:00", WriteMode.APPEND),
                      app_id=APP, app_version=0, txn_id="a", commit_ts=10)
    apply_table_write(at_write("b", [2], "2026-01-03 00:00:00.000000", WriteMode.APPEND),
                      app_id=APP, app_version=1, txn_id="b", commit_ts=11)
    # the same instant spelled as delta-rs and Spark spell it
    apply_table_write(at_write("c", [3], "2026-01-02 00:00:00.000000",
                               WriteMode.OVERWRITE_PARTITIONS, ({"at": "2026-01-02 00:00:00"},)),
                      app_id=APP, app_version=2, txn_id="c", commit_ts=12)
    rows = read_delta_table(str(table)).to_pylist()
    assert sorted((r["id"], r["at"].isoformat()) for r in rows) == [
        (2, "2026-01-03T00:00:00+00:00"), (3, "2026-01-02T00:00:00+00:00")]


def test_schema_check_ignores_nullability_but_not_nested_types():
    def schema(fields: list[pa.Field]) -> str:
        return Schema.from_arrow(pa.schema(fields)).to_json()

    table = schema([pa.field("id", pa.int64(), nullable=False),
                    pa.field("tags", pa.list_(pa.field("item", pa.string(), nullable=False)))])
    nullable = schema([pa.field("id", pa.int64()), pa.field("tags", pa.list_(pa.string()))])
    assert describe_schema_mismatch(table, nullable, [], []) is None
    nested = schema([pa.field("id", pa.int64()), pa.field("tags", pa.list_(pa.int32()))])
    assert "'tags'" in describe_schema_mismatch(table, nested, [], [])


@pytest.mark.parametrize("name", ["sales 25 #1?+é", "50% off", "a%zz;b=c:d~&'@", "日本"])
def test_apply_writes_a_table_whose_folder_name_needs_encoding(tmp_path, name):
    canonical = canonical_table_uri(str(tmp_path / name))
    folder = Path(local_path(canonical))
    record = TableWriteRecord(canonical, WriteMode.APPEND,
                              (data_file(folder, "a", [1, 2], "d1"),), SCHEMA, ("day",))
    second = TableWriteRecord(canonical, WriteMode.APPEND,
                              (data_file(folder, "b", [3], "d2"),), SCHEMA, ("day",))
    for _ in range(2):
        assert apply_table_write(record, app_id=APP, app_version=0, txn_id="a", commit_ts=10,
                                 roots=[str(tmp_path)]) == 0
        assert apply_table_write(second, app_id=APP, app_version=1, txn_id="b", commit_ts=11,
                                 roots=[str(tmp_path)]) == 1
    assert folder == tmp_path / name and ids(folder) == [(1, "d1"), (2, "d1"), (3, "d2")]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize("swapped", ["t", "t/_delta_log"])
def test_apply_refuses_a_table_reached_through_a_symlink_swapped_in_after_the_check(
        tmp_path, swapped):
    wh, outside = tmp_path / "wh", tmp_path / "outside"
    record = write(wh / "t", WriteMode.APPEND, [data_file(wh / "t", "a", [1], "d1")])
    outside.mkdir()
    if (wh / swapped).exists():
        (wh / swapped).rename(tmp_path / "moved")
    (wh / swapped).symlink_to(outside)
    for roots in ([str(wh)], None):
        with pytest.raises(UnsafeLocation, match="symlink"):
            apply_table_write(record, app_id=APP, app_version=0, txn_id="a", commit_ts=10,
                              roots=roots)
    assert list(outside.iterdir()) == []


def test_apply_with_roots_refuses_a_table_outside_every_root(tmp_path):
    (tmp_path / "wh").mkdir()
    record = write(tmp_path / "t", WriteMode.APPEND, [data_file(tmp_path / "t", "a", [1], "d1")])
    with pytest.raises(UnsafeLocation, match="outside"):
        apply_table_write(record, app_id=APP, app_version=0, txn_id="a", commit_ts=10,
                          roots=[str(tmp_path / "wh")])
    assert not (tmp_path / "t" / "_delta_log").exists()


@pytest.mark.parametrize("mode", [WriteMode.OVERWRITE, WriteMode.OVERWRITE_PARTITIONS])
def test_an_overwrite_removes_files_whose_paths_delta_spark_left_unescaped(tmp_path, mode):
    """delta-spark's adds keep non-ASCII partition values unescaped in their paths (``p=é``);
    the removes of an overwrite must spell them so, or Delta keeps the files (a remove matches
    its add by the spelling) and the replaced rows stay beside the new ones."""
    root = tmp_path / "t"
    (root / "_delta_log").mkdir(parents=True)
    schema = {"type": "struct", "fields": [
        {"name": "x", "type": "long", "nullable": True, "metadata": {}},
        {"name": "p", "type": "string", "nullable": True, "metadata": {}}]}
    entry = [{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
             {"metaData": {"id": "t", "format": {"provider": "parquet", "options": {}},
                           "schemaString": json.dumps(schema), "partitionColumns": ["p"],
                           "configuration": {}, "createdTime": 1}}]
    for n, value in enumerate(["é", "日本", "a b"]):
        (root / f"p={value}").mkdir()
        pq.write_table(pa.table({"x": [n]}), root / f"p={value}" / f"f{n}.parquet")
        entry.append({"add": {"path": f"p={value}/f{n}.parquet", "partitionValues": {"p": value},
                              "size": (root / f"p={value}" / f"f{n}.parquet").stat().st_size,
                              "modificationTime": 1, "dataChange": True,
                              "stats": '{"numRecords":1}'}})
    (root / "_delta_log" / f"{0:020d}.json").write_text(
        "".join(json.dumps(a, ensure_ascii=False) + "\n" for a in entry), encoding="utf-8")
    values = ["é", "日本", "a b"] if mode == WriteMode.OVERWRITE_PARTITIONS else ["z"]
    adds = []
    for n, value in enumerate(values):
        folder = root / "_percolake" / "t1" / f"p={value}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"x": [10 + n]}), folder / "n.parquet")
        adds.append(AddFileRecord(f"_percolake/t1/p={value}/n.parquet",
                                  (folder / "n.parquet").stat().st_size, {"p": value}, 1,
                                  '{"numRecords":1}'))
    replace = tuple({"p": v} for v in values) if mode == WriteMode.OVERWRITE_PARTITIONS else ()
    apply_table_write(TableWriteRecord(f"file://{root}", mode, tuple(adds), json.dumps(schema),
                                       ("p",), replace),
                      app_id="app", app_version=1, txn_id="t1", commit_ts=5)
    removed = [json.loads(line)["remove"]["path"] for line in
               (root / "_delta_log" / f"{1:020d}.json").read_text(encoding="utf-8").splitlines()
               if '"remove"' in line]
    assert sorted(removed) == sorted(a["add"]["path"] for a in entry if "add" in a)
    assert sorted(r["x"] for r in read_delta_table(str(root)).to_pylist()) \
        == [10 + n for n in range(len(values))]
