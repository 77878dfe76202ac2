"""MERGE ``withSchemaEvolution()`` through ``txn.delta_table``, side by side with delta-spark's
own MERGE on a copy of the same delta-spark-made table: explicit ``set``/``values`` naming new
columns, nested struct fields added and lacked, type widening on a column-mapped table; and the
refusals delta-spark makes too (docs/row-level-writes.md)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from sparkside import Participant
from sparkside.errors import MergeClauseError
from tests.spark.test_row_level import history, without_ids

pytestmark = pytest.mark.spark

Merge = Callable[[object], object]


def made(spark: SparkSession, path: Path, ddl: str, rows: list[tuple],
         properties: str = "") -> Path:
    """A table made by delta-spark (CREATE TABLE, then an append) and its copy."""
    spark.sql(f"CREATE TABLE delta.`{path}` ({ddl}) USING DELTA {properties}")
    spark.createDataFrame(rows, ddl).write.format("delta").mode("append").save(str(path))
    reference = path.with_name(f"{path.name}-reference")
    shutil.copytree(path, reference)
    return reference


def rows(spark: SparkSession, path: Path) -> list[str]:
    return sorted(str(r) for r in spark.read.format("delta").load(str(path)).collect())


def newest_entry(path: Path) -> list[dict]:
    return [json.loads(line) for line in
            max((path / "_delta_log").glob("*.json")).read_text().splitlines()]


def newest_metadata(path: Path) -> dict:
    """The table's metadata as its newest ``metaData`` action left it (delta-spark commits each
    MERGE apart, percolake a batch's operations on one table as one commit)."""
    for entry in sorted((path / "_delta_log").glob("*.json"), reverse=True):
        actions = [json.loads(line) for line in entry.read_text().splitlines()]
        found = [a["metaData"] for a in actions if "metaData" in a]
        if found:
            return found[-1]
    raise AssertionError(f"{path} has no metaData action")


def logical(schema_string: str) -> object:
    """A schema with each field's physical name left out (a random ``col-<uuid>``)."""
    def strip(value: object) -> object:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if k != "delta.columnMapping.physicalName"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(json.loads(schema_string))


def both(spark: SparkSession, participant: Participant, batch_id: int,
         merges: list[tuple[Path, Path, Merge]]) -> None:
    """Runs each merge in one batch on its table, then with delta-spark on its copy."""
    def batch(df: DataFrame, b: int, txn) -> None:  # noqa: ANN001
        for ours, _, merge in merges:
            merge(txn.delta_table(str(ours)))

    participant.run_batch(spark.range(1), batch_id, batch)
    for _, theirs, merge in merges:
        merge(DeltaTable.forPath(spark, str(theirs)))


def evolving_all(source: DataFrame) -> Merge:
    return lambda dt: (dt.alias("t").merge(source.alias("s"), "t.id = s.id")
                       .withSchemaEvolution().whenMatchedUpdateAll()
                       .whenNotMatchedInsertAll().execute())


def test_merge_schema_evolution_equals_delta_spark(spark, lake_daemon, lake) -> None:  # noqa: ANN001
    participant = Participant(lake_daemon.target, pipeline_id=f"mschema-{lake.name}")
    # (a) explicit set/values naming columns the table lacks: added with the source column's
    # type (n: int, whatever is assigned), in the source's order, the key's case aside
    explicit = lake / "explicit"
    explicit_ref = made(spark, explicit, "id long, value long, region string",
                        [(1, 1, "eu"), (2, 2, "us")])
    flat = spark.createDataFrame([(1, 100, "first", 5, 0.5), (7, 700, "new", 6, 0.7)],
                                 "id long, value long, note string, n int, unused double")

    def assigned(dt) -> object:  # noqa: ANN001
        return (dt.alias("t").merge(flat.alias("s"), "t.id = s.id").withSchemaEvolution()
                .whenMatchedUpdate(set={"value": "s.value", "N": "s.n * 2"})
                .whenNotMatchedInsert(values={"id": "s.id", "note": "upper(s.note)",
                                              "n": "s.n"}).execute())

    # (b) nested fields: a wider struct (fields reordered, one added at each depth, in an
    # array's structs too) then, in the same batch, a narrower one (UpdateAll keeps the
    # target's fields it lacks, InsertAll leaves them null; a null struct)
    nested = lake / "nested"
    ddl = "id long, s struct<x:int,y:string,i:struct<p:int,q:int>>, a array<struct<x:int,y:string>>"
    nested_ref = made(spark, nested, ddl, [(1, (1, "one", (1, 1)), [(1, "one")]),
                                           (2, (2, "two", (2, 2)), [(2, "two")]),
                                           (3, (3, "three", (3, 3)), [])])
    wider = spark.createDataFrame(
        [(1, ("uno", 10, 1.5, (10, 10, 10)), [("uno", 10, 1.5)]), (7, None, None)],
        "id long, s struct<y:string,x:int,z:double,i:struct<q:int,p:int,r:int>>, "
        "a array<struct<y:string,x:int,z:double>>")
    narrower = spark.createDataFrame([(2, (20, (20,))), (3, None), (8, (80, (80,)))],
                                     "id long, s struct<x:int,i:struct<p:int>>")

    # (c) type widening (and a new nested field and column) on a column-mapped table with
    # delta.enableTypeWidening: v int -> long with delta.typeChanges, new ids above maxColumnId
    widened = lake / "widened"
    widened_ref = made(spark, widened, "id long, v int, s struct<x:int,y:string>",
                       [(1, 1, (1, "one")), (2, 2, (2, "two"))],
                       "TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
                       "'delta.enableTypeWidening' = 'true')")
    wide = spark.createDataFrame([(1, 2**40, (10, "uno", 1.5), "a"), (7, 7, None, "b")],
                                 "id long, v long, s struct<x:int,y:string,z:double>, note string")

    both(spark, participant, 0, [(explicit, explicit_ref, assigned),
                                 (nested, nested_ref, evolving_all(wider)),
                                 (nested, nested_ref, evolving_all(narrower)),
                                 (widened, widened_ref, evolving_all(wide))])
    for ours, theirs in ((explicit, explicit_ref), (nested, nested_ref), (widened, widened_ref)):
        assert rows(spark, ours) == rows(spark, theirs), ours.name
        entry = newest_entry(ours)
        (metadata,) = [a["metaData"] for a in entry if "metaData" in a]
        assert any("add" in a for a in entry), "the new schema is in the commit of the data"
        expected = newest_metadata(theirs)
        assert logical(metadata["schemaString"]) == logical(expected["schemaString"]), ours.name
        assert metadata["configuration"] == expected["configuration"], ours.name
    assert spark.read.format("delta").load(str(explicit)).columns == \
        ["id", "value", "region", "note", "n"]
    ours_history, their_history = history(spark, explicit), history(spark, explicit_ref)
    assert ours_history["operation"] == their_history["operation"] == "MERGE"
    assert without_ids(ours_history["operationParameters"]) == \
        without_ids(their_history["operationParameters"])
    assert json.loads(next(a["metaData"]["schemaString"] for a in newest_entry(widened)
                           if "metaData" in a))["fields"][1]["metadata"]["delta.typeChanges"] \
        == [{"toType": "long", "fromType": "integer"}]

    # refused as delta-spark refuses: a key naming no column of the table nor of the source;
    # a new column set by a not-matched-by-source clause; without withSchemaEvolution, a
    # struct whose fields are not the column's
    other = spark.createDataFrame([(1, 5)], "id long, m int")
    refusals = [
        ("DELTA_MERGE_UNRESOLVED_EXPRESSION", explicit, explicit_ref, lambda dt: (
            dt.alias("t").merge(flat.alias("s"), "t.id = s.id").withSchemaEvolution()
            .whenMatchedUpdate(set={"missing": "s.value"}).execute())),
        ("DELTA_MERGE_UNRESOLVED_EXPRESSION", explicit, explicit_ref, lambda dt: (
            dt.alias("t").merge(other.alias("s"), "t.id = s.id").withSchemaEvolution()
            .whenNotMatchedBySourceUpdate(set={"m": "1"}).execute())),
        ("DELTA_UPDATE_SCHEMA_MISMATCH_EXPRESSION", nested, nested_ref, lambda dt: (
            dt.alias("t").merge(narrower.alias("s"), "t.id = s.id")
            .whenMatchedUpdate(set={"s": "s.s"}).execute())),
    ]
    for batch_id, (error_class, ours, theirs, merge) in enumerate(refusals, start=1):
        with pytest.raises(Exception, match=error_class):
            merge(DeltaTable.forPath(spark, str(theirs)))
        with pytest.raises(MergeClauseError, match=error_class):
            participant.run_batch(spark.range(1), batch_id,
                                  lambda df, b, txn, m=merge, t=ours: m(txn.delta_table(str(t))))
    assert rows(spark, explicit) == rows(spark, explicit_ref)


def condition(call: Callable[[], object]) -> str | None:
    """The error class (condition) of what ``call`` raises; fails if it raises nothing."""
    with pytest.raises(Exception) as raised:  # noqa: PT011 - any error: its class is compared
        call()
    return raised.value.getCondition()  # type: ignore[union-attr]


def test_nested_keys_nested_case_and_structs_by_name_equal_delta_spark(  # noqa: ANN001
        spark, lake_daemon, lake) -> None:
    """``set``/``values`` keys naming nested fields (``S.X``, ``t.s.i.q``: one field set, the
    others kept; a null struct becomes one), structs assigned whole matched by field name
    case aside (MERGE and UPDATE), a nested key adding a field with schema evolution and an
    UpdateAll whose source struct names the table's fields in another case: the table after
    one batch equals delta-spark's after its own operations on a copy; and the refusals
    (each tried inside the batch, changing nothing) have delta-spark's error classes."""
    participant = Participant(lake_daemon.target, pipeline_id=f"mnested-{lake.name}")
    table = lake / "nested"
    reference = made(spark, table, "id long, s struct<x:int,y:string,i:struct<p:int,q:int>>, "
                     "v long", [(1, (1, "one", (1, 1)), 10), (2, (2, "two", (2, 2)), 20),
                                (3, None, 30)])
    source = spark.createDataFrame(
        [(1, 100, (11, "eleven", 1.5)), (3, 300, None), (9, 900, (99, "nine", 2.5))],
        "id long, n int, s struct<X:int,Y:string,z:double>")

    def merge(dt, evolving: bool = False):  # noqa: ANN001, ANN202
        builder = dt.alias("t").merge(source.alias("src"), "t.id = src.id")
        return builder.withSchemaEvolution() if evolving else builder

    operations = [
        lambda dt: merge(dt).whenMatchedUpdate(set={"S.X": "src.n", "t.s.i.q": "src.n + 1"})
        .whenNotMatchedInsert(values={"id": "src.id", "s": "named_struct('Y', src.s.Y, 'i', "
                                      "named_struct('q', 1, 'p', 2), 'x', src.n)"}).execute(),
        lambda dt: dt.update("id = 2", {"s": "named_struct('i', named_struct('Q', 5, 'P', 6), "
                                             "'y', 'upd', 'X', 7)"}),
        lambda dt: dt.update("id < 3", {"s.i.P": "s.i.p * 10"}),
        lambda dt: merge(dt, evolving=True).whenMatchedUpdate(set={"s.z": "src.n"}).execute(),
        lambda dt: merge(dt, evolving=True).whenMatchedUpdateAll().execute(),
    ]
    refusals = [
        ("FIELD_NOT_FOUND", lambda dt: merge(dt).whenMatchedUpdate(set={"s.z": "src.n"})
         .execute()),
        ("FIELD_NOT_FOUND", lambda dt: merge(dt, evolving=True)
         .whenMatchedUpdate(set={"s.w": "src.n"}).execute()),
        ("DELTA_UNSUPPORTED_NESTED_FIELD_IN_OPERATION", lambda dt: merge(dt)
         .whenNotMatchedInsert(values={"id": "src.id", "s.x": "src.n"}).execute()),
        ("DELTA_CONFLICT_SET_COLUMN", lambda dt: dt.update("id = 1", {"s.x": "1", "s": "null"})),
        ("DELTA_UPDATE_SCHEMA_MISMATCH_EXPRESSION", lambda dt: dt.update(
            "id = 1", {"s": "named_struct('a', 1, 'y', 'a', 'i', named_struct('p', 1, 'q', 2))"})),
    ]
    ours: list[str | None] = []

    def batch(df: DataFrame, b: int, txn) -> None:  # noqa: ANN001
        dt = txn.delta_table(str(table))
        ours.extend(condition(lambda r=r: r(dt)) for _, r in refusals)
        for operation in operations:
            operation(dt)

    participant.run_batch(spark.range(1), 0, batch)
    theirs = DeltaTable.forPath(spark, str(reference))
    assert [condition(lambda r=r: r(theirs)) for _, r in refusals] == ours == \
        [expected for expected, _ in refusals]
    for operation in operations:
        operation(theirs)
    assert rows(spark, table) == rows(spark, reference)
    assert logical(newest_metadata(table)["schemaString"]) == \
        logical(newest_metadata(reference)["schemaString"])
    assert len(list((table / "_delta_log").glob("*.json"))) == 3, "one commit for the batch"
