"""The pure rules of a MERGE's or UPDATE's ``set``/``values`` keys and assigned structs, as
delta-spark 4.4 applies them (no Spark needed; tests/spark/test_merge_schema_evolution.py runs
them side by side with delta-spark): which keys are refused, which source fields schema
evolution merges into the table, and which structs cannot be matched by name."""

from __future__ import annotations

import json

from pyspark.sql import types as T

from sparkside.assignments import by_column, check_paths
from sparkside.errors import MergeClauseError
from sparkside.merge_evolution import evolving_source_schema, mismatch

INT, LONG, TEXT, DOUBLE = T.IntegerType(), T.LongType(), T.StringType(), T.DoubleType()


def struct(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(name, data_type) for name, data_type in fields])


PQ = struct(("p", INT), ("q", INT))
COLUMN = struct(("x", INT), ("y", TEXT), ("i", PQ))
TABLE = struct(("id", LONG), ("s", COLUMN), ("v", LONG))


def refusal(paths: list[tuple[str, ...]], insert: bool = False) -> str | None:
    try:
        check_paths(TABLE, paths, insert)
    except MergeClauseError as error:
        return error.getCondition()
    return None


def test_nested_keys_are_taken_unless_they_conflict_or_insert() -> None:
    assert refusal([("s", "x"), ("s", "i", "q"), ("v",)]) is None
    assert refusal([("s", "z")]) is None, "a field schema evolution adds"
    assert refusal([("s", "x"), ("s",)]) == "DELTA_CONFLICT_SET_COLUMN"
    assert refusal([("s", "x"), ("S", "X")]) == "DELTA_CONFLICT_SET_COLUMN", "case aside"
    assert refusal([("v",), ("V",)]) == "DELTA_CONFLICT_SET_COLUMN"
    assert refusal([("s", "i", "q"), ("s", "i")]) == "DELTA_CONFLICT_SET_COLUMN"
    assert refusal([("v", "q")]) == "DELTA_UNSUPPORTED_FIELD_UPDATE_NON_STRUCT"
    assert refusal([("id",), ("s", "x")], insert=True) == \
        "DELTA_UNSUPPORTED_NESTED_FIELD_IN_OPERATION"
    assert refusal([("v",), ("V",)], insert=True) is None, "the first of them wins"


def test_keys_are_grouped_by_the_column_they_assign_case_aside() -> None:
    paths = {"S.X": ("s", "x"), "t.v": ("v",), "s.i.q": ("s", "i", "q"), "n": ("N",)}
    assert by_column(paths, ["id", "s", "v", "n"]) == {"s": ["S.X", "s.i.q"], "v": ["t.v"],
                                                      "n": ["n"]}


def fields(schema_json: str | None) -> dict:
    assert schema_json is not None
    return {f["name"]: f["type"] for f in json.loads(schema_json)["fields"]}


def test_schema_evolution_merges_the_assigned_source_fields_named_as_the_table_names_them(
        ) -> None:
    source = struct(("id", LONG), ("n", INT),
                    ("s", struct(("X", INT), ("Y", TEXT), ("z", DOUBLE), ("w", INT))),
                    ("S2", T.ArrayType(struct(("X", INT)))))
    table = struct(("id", LONG), ("s", struct(("x", INT), ("y", TEXT))),
                   ("s2", T.ArrayType(struct(("x", INT), ("y", INT)))))
    nested = fields(evolving_source_schema(source, table, False, [("s", "z"), ("id",)]))
    assert list(nested) == ["id", "s"], "only the columns assigned"
    assert [f["name"] for f in nested["s"]["fields"]] == ["z"], "only the field assigned"
    whole = fields(evolving_source_schema(source, table, False, [("S",), ("s2",)]))
    assert [f["name"] for f in whole["s"]["fields"]] == ["x", "y", "z", "w"], \
        "the source's X and Y are the table's x and y"
    assert whole["s2"]["elementType"]["fields"][0]["name"] == "x", "in arrays too"
    assert list(fields(evolving_source_schema(source, table, True, []))) == \
        ["id", "n", "s", "s2"]
    assert evolving_source_schema(source, table, False, [("v",)]) is None


def test_a_struct_matches_by_name_case_aside_unless_its_fields_are_not_the_columns() -> None:
    column = COLUMN
    reordered = struct(("Y", TEXT), ("i", struct(("Q", INT), ("P", INT))), ("X", INT))
    fewer = struct(("x", INT), ("y", TEXT))
    other = struct(("a", INT), ("y", TEXT), ("i", PQ))
    for allow_missing in (False, True):
        assert mismatch(reordered, column, allow_missing) is None
        assert mismatch(other, column, allow_missing) == (other, column)
    assert mismatch(fewer, column, False) == (fewer, column)
    assert mismatch(fewer, column, True) is None, "schema evolution: missing fields are null"
    inner = struct(("x", INT), ("y", TEXT), ("i", struct(("p", INT), ("r", INT))))
    assert mismatch(inner, column, True) == (inner["i"].dataType, column["i"].dataType)
    assert mismatch(T.ArrayType(other), T.ArrayType(column), True) == (other, column)
    assert mismatch(T.IntegerType(), column, False) is None, "not a struct: Spark's cast"
