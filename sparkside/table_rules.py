"""A batch shaped to its Delta table and checked against the table's rules, as delta-spark's
writer does, inside the write's own Spark job (the data is read once).

Shaping: a batch column that differs from a table column only in case is written as the
table's column (unless ``spark.sql.caseSensitive``); a table column the batch lacks is null;
a generated column (``delta.generationExpression`` in its field metadata) the batch lacks is
computed; columns follow the table's order, new ones (``merge_schema``) after them; nested
struct fields are matched the same way, at any depth (``nested_fields``: a field the batch
lacks is null). A batch that lacks a NOT NULL column or struct field is refused at once, as
delta-spark refuses it (``DELTA_MISSING_NOT_NULL_COLUMN_VALUE``).

Rules, enforced by a filter whose condition raises (``raise_error``) on the first offending row
the executors meet, so nothing is written by a failing task and the batch fails before its
commit (the attempt is aborted, its files deleted):

- NOT NULL of a column or a nested struct field (a null parent struct counts as null, as in
  delta-spark): ``[DELTA_NOT_NULL_CONSTRAINT_VIOLATED] NOT NULL constraint violated for column:
  s.x.``
- CHECK constraints (``delta.constraints.<name>``; null counts as false, as in delta-spark) and
  generated columns given by the batch (``<column> <=> <expression>``):
  ``[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint <name> (<expression>) violated by
  row with values:`` then `` - <column> : <value>`` for each column the expression names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from percolake.lake.delta_commit import TableLayout
from sparkside.errors import ConstraintViolation, SchemaMismatch
from sparkside.nested_fields import conform_column, missing_not_null, missing_not_null_message

GENERATION_KEY = "delta.generationExpression"
NOT_NULL_CLASS = "[DELTA_NOT_NULL_CONSTRAINT_VIOLATED]"
CHECK_CLASS = "[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES]"
GENERATED_NAME = "Generated Column"
_RAISED = re.compile(r"\[DELTA_(?:NOT_NULL_CONSTRAINT_VIOLATED|VIOLATE_CONSTRAINT_WITH_VALUES)\]"
                     r".*?(?= SQLSTATE: |\Z)", re.S)


@dataclass(frozen=True)
class Rule:
    """One rule every row must keep: ``condition`` (SQL) true, else ``message`` and the values
    of ``columns``."""

    condition: str
    message: str
    columns: tuple[str, ...] = ()


def quoted(path: str) -> str:
    return ".".join(f"`{part.replace('`', '``')}`" for part in path.split("."))


def table_rules(schema_json: str, constraints: tuple[tuple[str, str], ...],
                given: set[str], shown: Callable[[str], str] = lambda text: f"({text})"
                ) -> list[Rule]:
    """The rules of a table (schema JSON, ``(name, expression)`` constraints) for a batch that
    gives the columns ``given``; ``shown`` spells an expression in a refusal's message
    (``spark_sql_of``: as delta-spark's does)."""
    fields = json.loads(schema_json)["fields"]
    rules = [Rule(f"{quoted(path)} IS NOT NULL",
                  f"{NOT_NULL_CLASS} NOT NULL constraint violated for column: {path}.")
             for path in not_null_paths(fields)]
    for field in fields:
        expression = (field.get("metadata") or {}).get(GENERATION_KEY)
        if expression and field["name"] in given:
            text = f"{field['name']} <=> {expression}"
            rules.append(Rule(f"{quoted(field['name'])} <=> ({expression})",
                              _check_message(GENERATED_NAME, shown(text)),
                              referenced_columns(text, [f["name"] for f in fields])))
    names = [f["name"] for f in fields]
    for name, expression in constraints:
        rules.append(Rule(f"coalesce(({expression}), false)",
                          _check_message(name, shown(expression)),
                          referenced_columns(expression, names)))
    return rules


def _check_message(name: str, shown: str) -> str:
    return f"{CHECK_CLASS} CHECK constraint {name} {shown} violated by row with values:"


def spark_sql_of(spark: SparkSession) -> Callable[[str], str]:
    """An expression as Spark's parser spells it back (``(v > 0)``, ``(g <=> (v * 2))``), as
    delta-spark's refusals show a rule; the text in parentheses if Spark cannot parse it."""
    parser = spark._jsparkSession.sessionState().sqlParser()  # noqa: SLF001

    def shown(text: str) -> str:
        try:
            return str(parser.parseExpression(text).sql())
        except Exception:  # noqa: BLE001 - Spark's parse error: the rule's own check reports it
            return f"({text})"

    return shown


def not_null_paths(fields: list[dict[str, Any]], prefix: str = "") -> list[str]:
    """The NOT NULL columns and struct fields (``a.b``); fields inside arrays and maps are
    not checked (delta-spark does not check them either)."""
    paths: list[str] = []
    for field in fields:
        path = f"{prefix}{field['name']}"
        if not field.get("nullable", True):
            paths.append(path)
        kind = field["type"]
        if isinstance(kind, dict) and kind.get("type") == "struct":
            paths.extend(not_null_paths(kind["fields"], f"{path}."))
    return paths


def referenced_columns(expression: str, columns: list[str]) -> tuple[str, ...]:
    """The table columns an SQL expression names, in the order it first names them."""
    found: list[tuple[int, str]] = []
    for column in columns:
        pattern = rf"(?<![\w.`])`?{re.escape(column)}`?(?![\w`])"
        match = re.search(pattern, expression, re.I)
        if match:
            found.append((match.start(), column))
    return tuple(column for _, column in sorted(found))


def conform_batch(df: DataFrame, layout: TableLayout | None, table: str,
                  batch_id: int) -> DataFrame:
    """``df`` shaped to the table, with the table's rules as a raising filter (module doc).

    Raises:
        SchemaMismatch: two batch columns (or struct fields) that name one of the table.
        ConstraintViolation: the batch lacks a NOT NULL column or struct field (as
            delta-spark, even when it has no rows).
    """
    if layout is None:
        return df
    table_fields = json.loads(layout.schema_json)["fields"]
    case_sensitive = str(df.sparkSession.conf.get("spark.sql.caseSensitive", "false")) \
        .lower() == "true"
    key = (lambda name: name) if case_sensitive else str.lower
    batch_by_key: dict[str, str] = {}
    for name in df.columns:
        if key(name) in batch_by_key:
            raise SchemaMismatch(f"batch {batch_id} for table {table} has columns "
                                 f"{batch_by_key[key(name)]!r} and {name!r}, which name one "
                                 "column of the table. Nothing was written.")
        batch_by_key[key(name)] = name
    computed = {f["name"] for f in table_fields if (f.get("metadata") or {}).get(GENERATION_KEY)}
    missing = missing_not_null(table_fields, df.schema, key, computed)
    if missing:
        raise ConstraintViolation(f"batch {batch_id} breaks a rule of table {table}: "
                                  f"{missing_not_null_message(missing)}\nNothing was written.")
    batch_types = {f.name: f.dataType for f in df.schema.fields}
    spark_fields = {f.name: f for f in T.StructType.fromJson(json.loads(layout.schema_json))}
    columns: list[Column] = []
    given: set[str] = set()
    generated: list[tuple[str, str]] = []
    for field in table_fields:
        name = field["name"]
        source = batch_by_key.pop(key(name), None)
        expression = (field.get("metadata") or {}).get(GENERATION_KEY)
        if source is not None:
            given.add(name)
            column = F.col(quoted(source))
            shaped = conform_column(column, batch_types[source], field["type"], key, name)
            columns.append((column if shaped is None else shaped).alias(name))
        elif expression:
            generated.append((name, expression))
        else:
            columns.append(F.lit(None).cast(spark_fields[name].dataType).alias(name))
    new = list(batch_by_key.values())  # refused by the schema check without merge_schema
    shaped = df.select(*columns, *[F.col(quoted(n)) for n in new])
    if generated:  # computed from the batch's columns, already named as the table's
        shaped = shaped.select("*", *[F.expr(e).cast(spark_fields[n].dataType).alias(n)
                                      for n, e in generated])
    order = [f["name"] for f in table_fields] + new
    shaped = shaped.select(*[F.col(quoted(n)) for n in order])
    rules = table_rules(layout.schema_json, layout.constraints, given,
                        spark_sql_of(df.sparkSession))
    return shaped.where(_raising_condition(rules)) if rules else shaped


def generation_expressions(schema_json: str) -> dict[str, str]:
    """The table's generated columns: each one's name and generation expression."""
    return {f["name"]: expression for f in json.loads(schema_json)["fields"]
            if (expression := (f.get("metadata") or {}).get(GENERATION_KEY))}


def regenerated(rows: DataFrame, columns: list[str], schema_json: str,
                recompute: dict[str, Column]) -> DataFrame:
    """``rows`` in ``columns`` (the table's; helper columns beside them are dropped) with each
    generated column named in ``recompute`` computed again from the row's new values where its
    condition is true, as delta-spark's UPDATE and MERGE compute the generated columns an
    assignment does not name; elsewhere the row's own value stays."""
    types = {f.name: f.dataType for f in T.StructType.fromJson(json.loads(schema_json))}
    expressions = generation_expressions(schema_json)
    return rows.select(*[
        F.when(recompute[name], F.expr(expressions[name]).cast(types[name]))
        .otherwise(F.col(quoted(name))).alias(name)
        if name in recompute else F.col(quoted(name)) for name in columns])


def checked_rows(rows: DataFrame, schema_json: str,
                 constraints: tuple[tuple[str, str], ...]) -> DataFrame:
    """``rows`` in the table's columns, every one of them given (a row-level operation's
    output), with the table's rules as a raising filter (module doc): delta-spark checks every
    row its commands write."""
    rules = table_rules(schema_json, constraints, set(generation_expressions(schema_json)),
                        spark_sql_of(rows.sparkSession))
    return rows.where(_raising_condition(rules)) if rules else rows


def _raising_condition(rules: list[Rule]) -> Column:
    """True for a row that keeps every rule; raises with the first broken rule's message."""
    checks = []
    for rule in rules:
        parts: list[Column] = [F.lit(rule.message)]
        for column in rule.columns:
            parts += [F.lit(f"\n - {column} : "),
                      F.coalesce(F.col(quoted(column)).cast("string"), F.lit("null"))]
        checks.append(F.when(~F.expr(rule.condition), F.raise_error(F.concat(*parts))))
    return F.coalesce(*checks, F.lit(True))


def violation_of(error: BaseException, table: str, batch_id: int) -> ConstraintViolation | None:
    """The constraint violation a failed write job raised, None if it failed otherwise."""
    found = _RAISED.search(str(error))
    if found is None:
        return None
    return ConstraintViolation(f"batch {batch_id} breaks a rule of table {table}: "
                               f"{found.group(0).strip()}\nNothing was committed.")
