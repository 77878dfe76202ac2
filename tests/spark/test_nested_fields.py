"""Nested struct fields (in structs, in arrays of structs, in map values) written by ``txn.write``
to tables delta-spark made, beside delta-spark 4.4's own append of the same rows to a copy, read
back by delta-spark: fields the batch lacks read as null with or without ``merge_schema``,
fields named in another case or order are matched by name, fields the batch adds need
``merge_schema`` (on column-mapped tables they get ids and physical names as delta-spark gives
them), and a NOT NULL field the batch lacks is refused with delta-spark's message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from sparkside.errors import ConstraintViolation, SchemaMismatch
from tests.spark.test_delta_features import batches, copy_of, create, last_metadata, rows

pytestmark = pytest.mark.spark

NESTED = ("id BIGINT, s STRUCT<x: INT, y: STRING, t: STRUCT<p: INT, q: INT>>, "
          "a ARRAY<STRUCT<x: INT, y: INT>>, m MAP<STRING, STRUCT<x: INT, y: INT>>")
# lacks s.t.p, a's y and m's y; names s.y in another case and gives s's fields in another order
LACKING = (
    "SELECT 1L id, named_struct('Y', 'one', 'x', 1, 't', named_struct('q', 10)) s, "
    "array(named_struct('x', 1), null) a, map('k', named_struct('x', 1), 'n', null) m "
    "UNION ALL SELECT 2L, null, null, null")
# lacks s.y, s.t, a's y, m's x; adds s.z, a's w, m's v
ADDING = ("SELECT 3L id, named_struct('x', 3, 'z', 'new') s, "
          "array(named_struct('x', 3, 'w', 30)) a, map('k', named_struct('y', 3, 'v', 'v3')) m")


def appended_by_delta_spark(df: DataFrame, copy: Path, merge_schema: bool = False) -> None:
    df.write.format("delta").mode("append").option("mergeSchema", str(merge_schema).lower()) \
        .save(str(copy))


def same_as_delta_spark(spark: SparkSession, ours: Path, theirs: Path) -> None:
    assert rows(spark, ours) == rows(spark, theirs)
    assert spark.read.format("delta").load(str(ours)).schema == \
        spark.read.format("delta").load(str(theirs)).schema


def test_nested_fields_the_batch_lacks_read_as_null_and_new_ones_need_merge_schema(
        spark, lake_daemon, lake):
    ours, theirs = lake / "ours", lake / "theirs"
    for table in (ours, theirs):
        create(spark, table, NESTED)
    run = batches(lake_daemon, "nested")
    lacking = spark.sql(LACKING)
    run(spark, lambda txn: txn.write(lacking, str(ours)))
    appended_by_delta_spark(lacking, theirs)
    same_as_delta_spark(spark, ours, theirs)
    assert (1, (1, "one", (None, 10)), [(1, None), None], {"k": (1, None), "n": None}) in \
        rows(spark, ours)
    assert DeltaTable(str(ours)).version() == 1  # no schema change: no metaData

    adding = spark.sql(ADDING)
    with pytest.raises(SchemaMismatch, match=r"unknown columns \['s.z', 'a.element.w', "
                                             r"'m.value.v'\].*merge_schema=True"):
        run(spark, lambda txn: txn.write(adding, str(ours)))
    run(spark, lambda txn: txn.write(adding, str(ours), merge_schema=True))
    appended_by_delta_spark(adding, theirs, merge_schema=True)
    same_as_delta_spark(spark, ours, theirs)
    assert DeltaTable(str(ours)).version() == 2


def test_a_batch_lacking_a_not_null_field_is_refused_as_delta_spark_refuses_it(
        spark, lake_daemon, lake):
    """Even without rows, and whether the field or its parent struct is lacking."""
    ours, theirs = lake / "ours", lake / "theirs"
    for table in (ours, theirs):
        create(spark, table, "id BIGINT NOT NULL, s STRUCT<x: INT NOT NULL, y: INT>")
    run = batches(lake_daemon, "nested-not-null")
    for batch in (spark.createDataFrame([(1, (2,))], "id BIGINT, s STRUCT<y: INT>"),
                  spark.createDataFrame([], "id BIGINT"),
                  spark.createDataFrame([], "s STRUCT<x: INT, y: INT>")):
        with pytest.raises(Exception) as refused:  # noqa: PT011 - delta-spark's own class
            appended_by_delta_spark(batch, theirs)
        text = str(refused.value)
        expected = text[text.index("[DELTA_"):].splitlines()[0]
        assert expected.startswith("[DELTA_MISSING_NOT_NULL_COLUMN_VALUE]")
        with pytest.raises(ConstraintViolation) as ours_refused:
            run(spark, lambda txn, batch=batch: txn.write(batch, str(ours)))
        assert expected in str(ours_refused.value)
        assert "Nothing was written" in str(ours_refused.value)
    assert DeltaTable(str(ours)).version() == DeltaTable(str(theirs)).version() == 0
    assert not list(ours.glob("_percolake/*/*.parquet"))


def mapping_of(data_type: object, path: str = "") -> dict[str, tuple[int, str]]:
    """Each field's path (``a.element.x``, ``m.value.x``) -> (column mapping id, physical
    name), nested fields in structs, arrays and maps too."""
    found: dict[str, tuple[int, str]] = {}
    if not isinstance(data_type, dict):
        return found
    if data_type["type"] == "array":
        return mapping_of(data_type["elementType"], f"{path}element.")
    if data_type["type"] == "map":
        return {**mapping_of(data_type["keyType"], f"{path}key."),
                **mapping_of(data_type["valueType"], f"{path}value.")}
    for field in data_type.get("fields", []):
        where = f"{path}{field['name']}"
        found[where] = (field["metadata"]["delta.columnMapping.id"],
                        field["metadata"]["delta.columnMapping.physicalName"])
        found.update(mapping_of(field["type"], f"{where}."))
    return found


def test_nested_fields_of_a_column_mapped_table_lacked_and_added_as_delta_spark_does(
        spark, lake_daemon, lake):
    """Mode ``id`` (readers find nested fields by their field ids): fields lacked without
    merge_schema, then fields added to a struct, an array's structs and a map's values with it:
    the same rows, the same ids per field and maxColumnId as delta-spark's own appends to a
    copy; the files carry the physical names and ids."""
    path = lake / "mapped"
    create(spark, path, NESTED, "'delta.columnMapping.mode'='id'")
    copy = copy_of(path)
    before = mapping_of(json.loads(last_metadata(path)["schemaString"]))
    run = batches(lake_daemon, "nested-mapped")
    lacking, adding = spark.sql(LACKING), spark.sql(ADDING)
    run(spark, lambda txn: txn.write(lacking, str(path)))
    appended_by_delta_spark(lacking, copy)
    same_as_delta_spark(spark, path, copy)
    run(spark, lambda txn: txn.write(adding, str(path), merge_schema=True))
    appended_by_delta_spark(adding, copy, merge_schema=True)
    same_as_delta_spark(spark, path, copy)

    ours, theirs = last_metadata(path), last_metadata(copy)
    assert ours["configuration"]["delta.columnMapping.maxColumnId"] == \
        theirs["configuration"]["delta.columnMapping.maxColumnId"]
    ours_ids = mapping_of(json.loads(ours["schemaString"]))
    theirs_ids = mapping_of(json.loads(theirs["schemaString"]))
    assert {p: i for p, (i, _) in ours_ids.items()} == {p: i for p, (i, _) in theirs_ids.items()}
    assert {p: v for p, v in ours_ids.items() if p in before} == before
    assert set(ours_ids) - set(before) == {"s.z", "a.element.w", "m.value.v"}

    physical_ids = {name: field_id for field_id, name in ours_ids.values()}
    files = sorted((path / "_percolake").rglob("*.parquet"))
    assert len(files) >= 2
    for file in files:
        for field in pq.read_schema(file):
            assert int(field.metadata[b"PARQUET:field_id"]) == physical_ids[field.name]
