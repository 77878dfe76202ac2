"""The read predicate of a Spark job over a Delta table: the partition filters by which
delta-spark listed the table's files for it (``percolake.lake.read_set``).

Spark pushes a row-level operation's target-only conditions into the Delta scan; delta-spark's
``PrepareDeltaScan`` lists the files of the version read by the scan's partition filters (and
prunes them further by statistics) into a ``PreparedDeltaFileIndex`` of the optimized plan. The
predicate recorded for the conflict check is those partition filters, translated from Catalyst
(their ``toJSON`` form) into the read set's JSON. Whatever cannot be translated exactly is
widened: a filter the translation does not know selects every file (``true``), so the recorded
predicate selects at least what the scan read, never less. A job whose plan holds no such scan
of the table, or one without partition filters, read the whole table.
"""

from __future__ import annotations

import datetime
import json
from typing import Any
from urllib.parse import unquote, urlparse

from py4j.protocol import Py4JError
from pyspark.sql import DataFrame

from percolake.lake.read_set import WHOLE_TABLE, Predicate, conjunction, union
from percolake.lake.warehouse import spark_uri
from sparkside.jvm_names import jvm_class

EXPRESSIONS = "org.apache.spark.sql.catalyst.expressions."
DELTA_PACKAGE = "org.apache.spark.sql.delta."
COMPARISONS = {"EqualTo": "=", "EqualNullSafe": "<=>", "LessThan": "<",
               "LessThanOrEqual": "<=", "GreaterThan": ">", "GreaterThanOrEqual": ">="}
FLIPPED = {"=": "=", "<=>": "<=>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
# Catalyst types whose literals the read set compares as Delta's partition values do (and
# decimals); not timestamps (their partition values' time zones) nor collated strings
TYPES = ("byte", "short", "integer", "long", "string", "boolean", "date")
EPOCH = datetime.date(1970, 1, 1)


def read_predicate(frame: DataFrame, table_uri: str, version: int,
                   partition_columns: list[str]) -> Predicate:
    """The predicate over ``partition_columns`` by which ``frame``'s plan (run or not) reads
    ``table_uri`` at ``version``: its Delta scans' partition filters, or-ed over the scans."""
    if not partition_columns:
        return WHOLE_TABLE
    try:
        return _scans_predicate(frame, table_uri, version, partition_columns)
    except Py4JError:  # a plan this module cannot walk: it read the whole table, for all we know
        return WHOLE_TABLE


def _scans_predicate(frame: DataFrame, table_uri: str, version: int,
                     partition_columns: list[str]) -> Predicate:
    jvm = frame.sparkSession._jvm
    scala = jvm_class(jvm, "scala.jdk.javaapi.CollectionConverters")
    wanted = _location(spark_uri(table_uri))
    scans: list[Predicate] = []
    for leaf in scala.asJava(frame._jdf.queryExecution().optimizedPlan().collectLeaves()):
        index = _delta_file_index(leaf)
        if index is None or _location(index.path().toString()) != wanted:
            continue
        if index.getClass().getSimpleName() != "PreparedDeltaFileIndex" \
                or index.preparedScan().version() != version:
            return WHOLE_TABLE  # a read of the table whose filters are not known here
        filters = scala.asJava(index.preparedScan().partitionFilters().toSeq())
        scans.append(conjunction(_translated(f, set(partition_columns), scala)
                                 for f in filters))
    return union(scans) if scans else WHOLE_TABLE


def _delta_file_index(leaf: Any) -> Any:
    """The Delta file index a plan's leaf reads (None for any other leaf)."""
    if leaf.getClass().getSimpleName() != "LogicalRelation":
        return None
    relation = leaf.relation()
    if relation.getClass().getSimpleName() != "HadoopFsRelation":
        return None
    index = relation.location()
    return index if index.getClass().getName().startswith(DELTA_PACKAGE) else None


def _location(uri: str) -> tuple[str, str]:
    """A table location compared across spellings (``file:/x`` and ``file:///x``)."""
    parsed = urlparse(uri)
    return parsed.netloc, unquote(parsed.path).rstrip("/")


def _translated(expression: Any, partition_columns: set[str], scala: Any) -> Predicate:
    """One Catalyst partition filter as a read predicate (widened where not exact)."""
    nodes = json.loads(expression.toJSON())
    try:
        if any(n.get("class") == EXPRESSIONS + "InSet" for n in nodes):
            _fill_inset_values(expression, nodes, scala)
    except _Untranslatable:
        return WHOLE_TABLE
    predicate, _ = translate(nodes, partition_columns)
    return predicate


def _fill_inset_values(expression: Any, nodes: list[dict], scala: Any) -> None:
    """``InSet`` (Spark's form of a long ``IN`` list) leaves its values out of ``toJSON``:
    they are read from the expression (whose pre-order walk ``nodes`` is) as partition value
    strings."""
    walk, index = [expression], 0
    while walk:
        node = walk.pop()
        if node.nodeName() == "InSet":
            child_type = nodes[index + 1].get("dataType")
            nodes[index]["values"] = [_inset_value(v, child_type)
                                      for v in scala.asJava(node.hset())]
        walk.extend(reversed(list(scala.asJava(node.children()))))
        index += 1


def _inset_value(value: Any, data_type: str | None) -> str | None:
    """An InSet element (Spark's internal value) as the partition value string."""
    if value is None:
        return None
    if data_type == "date" and isinstance(value, int):
        return (EPOCH + datetime.timedelta(days=value)).isoformat()
    if data_type == "boolean" and isinstance(value, bool):
        return "true" if value else "false"
    if data_type in ("byte", "short", "integer", "long") and isinstance(value, int):
        return str(value)
    if data_type == "string" or str(data_type).startswith("decimal("):
        return str(value.toString())  # UTF8String, Decimal
    raise _Untranslatable


def translate(nodes: list[dict], partition_columns: set[str]) -> tuple[Predicate, bool]:
    """A Catalyst expression, as its ``toJSON`` pre-order list of nodes, as a read predicate
    over ``partition_columns`` and whether it is exact (else it is wider: true for a file the
    expression is true for)."""
    try:
        predicate, exact, _ = _node(nodes, 0, partition_columns)
    except _Untranslatable:
        return WHOLE_TABLE, False
    return predicate, exact


class _Untranslatable(Exception):
    """An expression the read set cannot state: it is widened to true."""


def _node(nodes: list[dict], at: int, columns: set[str]) -> tuple[Predicate, bool, int]:
    """The predicate of the node at ``at``, whether exact, and the index after its subtree."""
    node = nodes[at]
    kind = str(node.get("class", "")).removeprefix(EXPRESSIONS)
    arity = int(node.get("num-children", 0))
    if kind in ("And", "Or"):
        left, left_exact, after = _node(nodes, at + 1, columns)
        right, right_exact, after = _node(nodes, after, columns)
        combine = conjunction if kind == "And" else union
        return combine([left, right]), left_exact and right_exact, after
    if kind == "Not":
        inner, exact, after = _node(nodes, at + 1, columns)
        if not exact:
            return WHOLE_TABLE, False, after
        return ({"not": inner} if isinstance(inner, dict) else not inner), True, after
    end = _subtree_end(nodes, at)
    try:
        return _leaf_predicate(kind, node, nodes[at + 1:end], arity, columns), True, end
    except _Untranslatable:
        return WHOLE_TABLE, False, end


def _leaf_predicate(kind: str, node: dict, children: list[dict], arity: int,
                    columns: set[str]) -> Predicate:
    """A comparison, IN, IS [NOT] NULL of a partition column and literals, or a literal."""
    if kind == "Literal" and node.get("dataType") == "boolean" and node.get("value") in (
            "true", "false"):
        return node["value"] == "true"
    if node.get("dataType") == "boolean" and _is_column(node, columns):  # WHERE flag
        return {"column": node["name"], "op": "=", "value": "true"}
    if kind in COMPARISONS and arity == 2 and len(children) == 2:
        first, second = children
        if _is_column(first, columns) and _is_literal_of(second, first):
            return {"column": first["name"], "op": COMPARISONS[kind],
                    "value": second.get("value")}
        if _is_column(second, columns) and _is_literal_of(first, second):
            return {"column": second["name"], "op": FLIPPED[COMPARISONS[kind]],
                    "value": first.get("value")}
        raise _Untranslatable
    if kind in ("IsNull", "IsNotNull") and len(children) == 1 and _is_column(children[0],
                                                                                columns):
        return {"column": children[0]["name"],
                "op": "is_null" if kind == "IsNull" else "is_not_null"}
    if kind == "In" and children and _is_column(children[0], columns) and all(
            _is_literal_of(c, children[0]) for c in children[1:]) and len(children) == arity:
        return {"column": children[0]["name"], "op": "in",
                "values": [c.get("value") for c in children[1:]]}
    if kind == "InSet" and len(children) == 1 and _is_column(children[0], columns) \
            and isinstance(node.get("values"), list):
        return {"column": children[0]["name"], "op": "in", "values": node["values"]}
    raise _Untranslatable


def _is_column(node: dict, columns: set[str]) -> bool:
    data_type = str(node.get("dataType"))
    return (node.get("class") == EXPRESSIONS + "AttributeReference"
            and node.get("name") in columns
            and (data_type in TYPES or data_type.startswith("decimal(")))


def _is_literal_of(node: dict, column: dict) -> bool:
    """A literal of the column's own type (Spark's coercion casts the literal side, and the
    optimizer folds that cast), whose value is a string or null."""
    return (node.get("class") == EXPRESSIONS + "Literal"
            and node.get("dataType") == column.get("dataType")
            and (node.get("value") is None or isinstance(node.get("value"), str)))


def _subtree_end(nodes: list[dict], at: int) -> int:
    """The index after the subtree rooted at ``at`` (pre-order, ``num-children`` each)."""
    pending, index = 1, at
    while pending:
        if index >= len(nodes):
            raise _Untranslatable
        pending += int(nodes[index].get("num-children", 0)) - 1
        index += 1
    return index
