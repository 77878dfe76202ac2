"""A row-level write's read set (no Spark): the read predicate's evaluation on partition values
(SQL's three-valued logic, typed values, column mapping), its validation, the table's isolation
level, and the translation of delta-spark's Catalyst partition filters into it."""

from __future__ import annotations

import json

import pytest

from percolake.lake.read_set import (
    SERIALIZABLE,
    WRITE_SERIALIZABLE,
    PartitionMatcher,
    ReadSet,
    table_isolation_level,
    union,
)
from sparkside.read_predicates import EXPRESSIONS, translate


def schema(**types: str) -> str:
    return json.dumps({"type": "struct", "fields": [
        {"name": name, "type": kind, "nullable": True, "metadata": {}}
        for name, kind in types.items()]})


SCHEMA = schema(id="long", n="integer", day="date", amount="decimal(5,2)", flag="boolean",
                region="string", at="timestamp")


def matches(predicate: object, **values: str | None) -> bool:
    return PartitionMatcher(predicate, SCHEMA).may_match(values)


def term(column: str, op: str, value: str | None = None) -> dict:
    return {"column": column, "op": op, "value": value}


def test_comparisons_compare_as_the_columns_type():
    assert matches(term("n", ">", "9"), n="10"), "10 > 9 as numbers, not as text"
    assert not matches(term("n", "<", "9"), n="10")
    assert matches(term("day", ">=", "2024-01-02"), day="2024-01-10")
    assert matches(term("amount", "=", "1.50"), amount="1.5")
    assert matches(term("flag", "=", "true"), flag="true")
    assert not matches(term("region", "=", "eu"), region="us")
    assert matches(term("region", "!=", "eu"), region="us")


def test_null_partition_values_follow_sqls_three_valued_logic():
    # region = 'eu' is null for a null region: the file is not selected, nor by its negation
    assert not matches(term("region", "=", "eu"), region=None)
    assert not matches({"not": term("region", "=", "eu")}, region=None)
    assert matches(term("region", "<=>", None), region=None)
    assert not matches(term("region", "<=>", "eu"), region=None)
    assert matches({"column": "region", "op": "is_null"}, region="")  # Delta: "" is null
    assert matches({"or": [term("region", "=", "eu"), {"column": "region", "op": "is_null"}]},
                   region=None)
    assert not matches({"and": [term("region", "=", "eu"), term("n", "=", "1")]},
                       region=None, n="1")
    in_with_null = {"column": "n", "op": "in", "values": ["1", None]}
    assert matches(in_with_null, n="1")
    assert not matches(in_with_null, n="2") and not matches({"not": in_with_null}, n="2")


def test_what_cannot_be_decided_may_match():
    assert matches(term("n", "=", "1"), region="eu"), "a column the file lacks"
    assert matches(term("at", ">", "2024-01-01 00:00:00"), at="2023-01-01 00:00:00"), \
        "timestamps are not compared (time zones)"
    assert matches(term("n", "=", "1"), n="not a number")
    assert PartitionMatcher(term("n", "=", "1"), SCHEMA).may_match(None)
    assert not PartitionMatcher(False, SCHEMA).may_match(None), "nothing read"


def test_a_column_mapped_tables_values_are_keyed_by_physical_name():
    mapped = json.dumps({"type": "struct", "fields": [
        {"name": "region", "type": "string", "nullable": True,
         "metadata": {"delta.columnMapping.physicalName": "col-7f", "delta.columnMapping.id": 2}}]})
    matcher = PartitionMatcher(term("region", "=", "eu"), mapped)
    assert matcher.may_match({"col-7f": "eu"}) and not matcher.may_match({"col-7f": "us"})


def test_a_read_set_round_trips_and_malformed_ones_are_refused():
    read = ReadSet(WRITE_SERIALIZABLE, union([term("region", "=", "eu"),
                                              term("region", "=", "us")]))
    assert ReadSet.from_json(read.to_json()) == read
    assert ReadSet.from_json("") == ReadSet(SERIALIZABLE, True), "intents made before"
    bad = {
        "isolation_level": {"isolation_level": "SnapshotIsolation", "predicate": True},
        "op": {"isolation_level": SERIALIZABLE, "predicate": {"column": "a", "op": "~"}},
        "exactly the keys": {"isolation_level": SERIALIZABLE,
                             "predicate": {"column": "a", "op": "=", "values": ["1"]}},
        "strings or null": {"isolation_level": SERIALIZABLE, "predicate": term("a", "=", 1)},
        "nested": {"isolation_level": SERIALIZABLE, "predicate": _nested(40)},
    }
    for message, data in bad.items():
        with pytest.raises(ValueError, match=message):
            ReadSet.from_data(data)


def _nested(depth: int) -> object:
    predicate: object = True
    for _ in range(depth):
        predicate = {"not": predicate}
    return predicate


def test_the_tables_isolation_level_is_write_serializable_unless_it_asks_for_serializable():
    assert table_isolation_level({}) == WRITE_SERIALIZABLE
    assert table_isolation_level({"delta.isolationLevel": "Serializable"}) == SERIALIZABLE
    assert table_isolation_level({"delta.isolationLevel": "writeserializable"}) \
        == WRITE_SERIALIZABLE
    assert table_isolation_level({"delta.isolationLevel": "Strict"}) == SERIALIZABLE


# ---------------------------------------------------------------- Catalyst's partition filters

def attribute(name: str, data_type: str) -> dict:
    return {"class": EXPRESSIONS + "AttributeReference", "num-children": 0, "name": name,
            "dataType": data_type, "nullable": True, "metadata": {}, "qualifier": []}


def literal(value: str | None, data_type: str) -> dict:
    return {"class": EXPRESSIONS + "Literal", "num-children": 0, "value": value,
            "dataType": data_type}


def node(kind: str, children: int, **fields: object) -> dict:
    return {"class": EXPRESSIONS + kind, "num-children": children, **fields}


COLUMNS = {"n", "region", "day", "flag"}


def test_comparisons_of_a_partition_column_with_a_literal_translate_exactly():
    # (n = 1), as delta-spark 4.4's PreparedDeltaFileIndex holds it (toJSON, trimmed)
    recorded = json.loads(
        '[{"class":"org.apache.spark.sql.catalyst.expressions.EqualTo","num-children":2,'
        '"left":0,"right":1},{"class":"org.apache.spark.sql.catalyst.expressions.'
        'AttributeReference","num-children":0,"name":"n","dataType":"integer","nullable":true,'
        '"metadata":{},"qualifier":[]},{"class":"org.apache.spark.sql.catalyst.expressions.'
        'Literal","num-children":0,"value":"1","dataType":"integer"}]')
    assert translate(recorded, COLUMNS) == (term("n", "=", "1"), True)
    flipped = [node("LessThan", 2), literal("5", "integer"), attribute("n", "integer")]
    assert translate(flipped, COLUMNS) == (term("n", ">", "5"), True)
    dated = [node("Or", 2), node("EqualTo", 2), attribute("day", "date"),
             literal("2024-01-02", "date"), node("IsNull", 1), attribute("region", "string")]
    assert translate(dated, COLUMNS) == ({"or": [term("day", "=", "2024-01-02"),
                                                 {"column": "region", "op": "is_null"}]}, True)
    listed = [node("In", 3), attribute("region", "string"), literal("eu", "string"),
              literal("us", "string")]
    assert translate(listed, COLUMNS) == (
        {"column": "region", "op": "in", "values": ["eu", "us"]}, True)
    inset = [node("InSet", 1, hset=None, values=["1", "2"]), attribute("n", "integer")]
    assert translate(inset, COLUMNS)[0] == {"column": "n", "op": "in", "values": ["1", "2"]}
    negated = [node("Not", 1), attribute("flag", "boolean")]
    assert translate(negated, COLUMNS) == ({"not": term("flag", "=", "true")}, True)


def test_what_does_not_translate_is_widened_never_narrowed():
    arithmetic = [node("EqualTo", 2), node("Add", 2), attribute("n", "integer"),
                  literal("1", "integer"), literal("2", "integer")]
    assert translate(arithmetic, COLUMNS) == (True, False)
    cast = [node("EqualTo", 2), node("Cast", 1, dataType="integer"),
            attribute("region", "string"), literal("1", "integer")]
    assert translate(cast, COLUMNS) == (True, False)
    # AND keeps the part it knows; OR and NOT of an unknown part select everything
    known, unknown = [node("EqualTo", 2), attribute("n", "integer"), literal("1", "integer")], \
        [node("StartsWith", 2), attribute("region", "string"), literal("e", "string")]
    assert translate([node("And", 2), *unknown, *known], COLUMNS) == (term("n", "=", "1"), False)
    assert translate([node("Or", 2), *unknown, *known], COLUMNS) == (True, False)
    assert translate([node("Not", 1), node("And", 2), *unknown, *known], COLUMNS) \
        == (True, False)
    other_column = [node("EqualTo", 2), attribute("id", "long"), literal("1", "long")]
    assert translate(other_column, COLUMNS) == (True, False)
    timestamp = [node("GreaterThan", 2), attribute("n", "timestamp"),
                 literal("2023-01-01 00:00:00", "timestamp")]
    assert translate(timestamp, COLUMNS) == (True, False)
    inset_unread = [node("InSet", 1, hset=None), attribute("n", "integer")]
    assert translate(inset_unread, COLUMNS) == (True, False)
