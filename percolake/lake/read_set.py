"""What a row-level write read, as Delta's conflict rules judge it (docs/row-level-writes.md).

A MERGE, UPDATE or DELETE reads the table's files its condition selects: delta-spark lists them
by the condition's partition filters (the *read predicate*) and records them as the files read.
A ``ReadSet`` carries that predicate, over partition columns, and the isolation level the write
commits under, with the write intent to the coordinator. The files read are the files of the
read version whose partition values the predicate may select, plus the files the write replaces.

The predicate is JSON, evaluated on a file's partition values (Delta's strings) with SQL's
three-valued logic; a file *may match* unless the predicate is false or null for it:

- ``true`` (the whole table; the only predicate of an unpartitioned table), ``false``;
- ``{"and": [...]}``, ``{"or": [...]}``, ``{"not": p}``;
- ``{"column": c, "op": o, "value": v}`` with ``o`` one of ``=``, ``<=>`` (null-safe),
  ``!=``, ``<``, ``<=``, ``>``, ``>=`` and ``v`` a value as Delta writes partition values (or
  null); ``{"column": c, "op": "in", "values": [...]}``; ``{"column": c, "op": "is_null"}``,
  ``{"column": c, "op": "is_not_null"}``.

Values are compared as the column's type (integers, decimals, dates, booleans, strings); a value
that cannot be compared so, a column the file lacks or a type without an order here makes the
file match (conservative: a read predicate may only ever be widened).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from percolake.lake.partition_values import typed_partition_value
from percolake.lake.table_features import physical_names

Predicate = Any  # bool or a dict, as in the module doc
WHOLE_TABLE: Predicate = True

SERIALIZABLE = "Serializable"
WRITE_SERIALIZABLE = "WriteSerializable"
SNAPSHOT_ISOLATION = "SnapshotIsolation"  # writes that only rearrange rows (OPTIMIZE)
ISOLATION_LEVELS = (SERIALIZABLE, WRITE_SERIALIZABLE)  # what a table may ask for
ISOLATION_PROPERTY = "delta.isolationLevel"

COMPARISONS = ("=", "<=>", "!=", "<", "<=", ">", ">=")
COLUMN_OPS = (*COMPARISONS, "in", "is_null", "is_not_null")
ORDERED_TYPES = ("byte", "short", "integer", "long", "date", "boolean", "string")
MAX_DEPTH = 32


def table_isolation_level(configuration: Mapping[str, Any]) -> str:
    """The isolation level a table's writes commit under: ``delta.isolationLevel`` if it names
    one (``Serializable``), else WriteSerializable; a value Delta does not define for tables
    counts as the strictest, Serializable."""
    value = configuration.get(ISOLATION_PROPERTY)
    if value is None or str(value).strip() == "":
        return WRITE_SERIALIZABLE
    for level in ISOLATION_LEVELS:
        if str(value).strip().lower() == level.lower():
            return level
    return SERIALIZABLE


@dataclass(frozen=True)
class ReadSet:
    """A row-level write's read predicate and isolation level (see the module doc)."""

    isolation_level: str = SERIALIZABLE
    predicate: Predicate = WHOLE_TABLE

    def to_json(self) -> str:
        return json.dumps({"isolation_level": self.isolation_level,
                           "predicate": self.predicate}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ReadSet:
        """The read set of a write intent; "" (intents made before read sets) is the whole
        table under Serializable, the rule those writes were checked by.

        Raises:
            ValueError: not a read set, naming what is wrong.
        """
        return cls() if not text else cls.from_data(json.loads(text))

    @classmethod
    def from_data(cls, data: Any) -> ReadSet:
        """A read set from its parsed JSON.

        Raises:
            ValueError: not a read set, naming what is wrong.
        """
        if not isinstance(data, dict) or set(data) != {"isolation_level", "predicate"}:
            raise ValueError("a read set is a JSON object of isolation_level and predicate")
        if data["isolation_level"] not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level must be one of {list(ISOLATION_LEVELS)}, not "
                             f"{str(data['isolation_level'])[:40]!r}")
        check_predicate(data["predicate"])
        return cls(data["isolation_level"], data["predicate"])


def check_predicate(predicate: Predicate, depth: int = 0) -> None:
    """Raises ValueError, naming the part, unless ``predicate`` has the module doc's form."""
    if depth > MAX_DEPTH:
        raise ValueError(f"a read predicate is nested more than {MAX_DEPTH} levels deep")
    if isinstance(predicate, bool):
        return
    if not isinstance(predicate, dict):
        raise ValueError(f"a read predicate is true, false or an object, not {predicate!r:.60}")
    if set(predicate) in ({"and"}, {"or"}):
        terms = next(iter(predicate.values()))
        if not isinstance(terms, list):
            raise ValueError("'and' and 'or' take a list of predicates")
        for term in terms:
            check_predicate(term, depth + 1)
        return
    if set(predicate) == {"not"}:
        check_predicate(predicate["not"], depth + 1)
        return
    op, column = predicate.get("op"), predicate.get("column")
    if op not in COLUMN_OPS or not isinstance(column, str):
        raise ValueError(f"a read predicate term needs a column and an op of {list(COLUMN_OPS)}"
                         f": {json.dumps(predicate)[:80]}")
    expected = {"column", "op"} | ({"value"} if op in COMPARISONS else
                                   {"values"} if op == "in" else set())
    if set(predicate) != expected:
        raise ValueError(f"a read predicate term with op {op!r} has exactly the keys "
                         f"{sorted(expected)}: {json.dumps(predicate)[:80]}")
    values = predicate.get("values", [predicate.get("value")])
    if not isinstance(values, list) or not all(v is None or isinstance(v, str)
                                               for v in values):
        raise ValueError(f"read predicate values are strings or null: "
                         f"{json.dumps(predicate)[:80]}")


def union(predicates: Iterable[Predicate]) -> Predicate:
    """A predicate selecting what any of ``predicates`` selects (``false`` for none)."""
    terms: list[Predicate] = []
    for predicate in predicates:
        if predicate is True:
            return True
        if predicate is not False and predicate not in terms:
            terms.append(predicate)
    if not terms:
        return False
    return terms[0] if len(terms) == 1 else {"or": terms}


def conjunction(predicates: Iterable[Predicate]) -> Predicate:
    """A predicate selecting what all of ``predicates`` select (``true`` for none)."""
    terms = [p for p in predicates if p is not True]
    if any(p is False for p in terms):
        return False
    if not terms:
        return True
    return terms[0] if len(terms) == 1 else {"and": terms}


class PartitionMatcher:
    """Decides whether a file of the table, by its partition values, may hold rows a read
    predicate selects."""

    def __init__(self, predicate: Predicate, schema_json: str) -> None:
        self.predicate = predicate
        self.types: dict[str, str] = {}
        self.physical: dict[str, str] = {}
        if not isinstance(predicate, bool):  # only terms name columns
            fields = json.loads(schema_json)["fields"]
            self.types = {f["name"]: f["type"] if isinstance(f["type"], str) else "struct"
                          for f in fields}
            self.physical = physical_names(schema_json)

    def may_match(self, partition_values: Mapping[str, str | None] | None) -> bool:
        """True unless the predicate is false or null for a file with these values (None:
        values unknown, so it may match)."""
        if isinstance(self.predicate, bool):
            return self.predicate
        if partition_values is None:
            return True
        try:
            return self._value(self.predicate, partition_values) is True
        except _Unknown:
            return True

    def _value(self, predicate: Predicate, values: Mapping[str, str | None]) -> bool | None:
        """SQL's three-valued result of ``predicate`` (None: null)."""
        if isinstance(predicate, bool):
            return predicate
        if "and" in predicate:
            results = [self._value(p, values) for p in predicate["and"]]
            return False if False in results else (None if None in results else True)
        if "or" in predicate:
            results = [self._value(p, values) for p in predicate["or"]]
            return True if True in results else (None if None in results else False)
        if "not" in predicate:
            inner = self._value(predicate["not"], values)
            return None if inner is None else not inner
        return self._term(predicate, values)

    def _term(self, term: Mapping[str, Any], values: Mapping[str, str | None]) -> bool | None:
        column, op = term["column"], term["op"]
        delta_type = self.types.get(column)
        if delta_type is None or not (delta_type in ORDERED_TYPES
                                      or delta_type.startswith("decimal")):
            raise _Unknown
        key = self.physical.get(column, column)
        if key not in values:
            key = column
            if key not in values:
                raise _Unknown
        value = self._typed(values[key], delta_type)
        if op == "is_null":
            return value is None
        if op == "is_not_null":
            return value is not None
        if op == "in":
            listed = [self._typed(v, delta_type) for v in term["values"]]
            if value is None:
                return None if listed else False
            if value in [v for v in listed if v is not None]:
                return True
            return None if None in listed else False
        other = self._typed(term["value"], delta_type)
        if op == "<=>":
            return value == other
        if value is None or other is None:
            return None
        return {"=": value == other, "!=": value != other, "<": value < other,
                "<=": value <= other, ">": value > other, ">=": value >= other}[op]

    @staticmethod
    def _typed(text: str | None, delta_type: str) -> Any:
        """A partition value as its type's value (Delta: an empty string is null); _Unknown
        when it does not parse as that type."""
        if text is None or text == "":
            return None
        if delta_type == "boolean" and text.lower() not in ("true", "false"):
            raise _Unknown
        value = typed_partition_value(text, delta_type)
        if delta_type != "string" and isinstance(value, str):
            raise _Unknown
        return value


class _Unknown(Exception):
    """The predicate cannot be decided for a file: it may match."""
