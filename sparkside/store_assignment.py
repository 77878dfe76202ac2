"""A value assigned to a column by an UPDATE or a MERGE, cast to the column's type as
delta-spark's commands cast it: by ``spark.sql.storeAssignmentPolicy`` (default ``ANSI``), not
by ``spark.sql.ansi.enabled`` (unless
``spark.databricks.delta.updateAndMergeCastingFollowsAnsiEnabledFlag`` says so, or the policy
is ``LEGACY``).

Under ``ANSI`` (and ``STRICT``, whose refusal of narrowing casts at analysis is not made here:
those values are checked as under ``ANSI``) a value that does not fit fails the write job, as
delta-spark's does, whatever the session's ANSI mode: a numeric value out of the column's range
with ``[DELTA_CAST_OVERFLOW_IN_TABLE_WRITE]``, any other value the type cannot take with
``[CAST_INVALID_INPUT]``. A plain cast in a session with ``spark.sql.ansi.enabled=false``
would wrap the number or write null instead.
"""

from __future__ import annotations

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

POLICY_KEY = "spark.sql.storeAssignmentPolicy"
FOLLOWS_ANSI_KEY = "spark.databricks.delta.updateAndMergeCastingFollowsAnsiEnabledFlag"
ANSI_KEY = "spark.sql.ansi.enabled"
_NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType,
            T.DecimalType)


def assigned_cast(value: Column, value_type: T.DataType, target: T.DataType,
                  column: str) -> Column:
    """``value`` (of ``value_type``, an atomic type) cast to ``target`` for the column (or
    struct field ``a.b``) ``column``, as delta-spark's UPDATE and MERGE cast it (module doc)."""
    if value_type == target:
        return value
    if not _checked(SparkSession.getActiveSession()):
        return value.cast(target)
    tried = value.try_cast(target)
    failed = value.isNotNull() & tried.isNull()
    return F.when(failed, F.raise_error(_refusal(value, value_type, target, column))) \
        .otherwise(tried)


def _checked(spark: SparkSession | None) -> bool:
    if spark is None:
        return True
    conf = spark.conf
    if str(conf.get(FOLLOWS_ANSI_KEY, "false")).lower() == "true":
        return str(conf.get(ANSI_KEY, "true")).lower() == "true"
    return str(conf.get(POLICY_KEY, "ANSI")).upper() != "LEGACY"


def _sql_type(data_type: T.DataType) -> str:
    return f'"{data_type.simpleString().upper()}"'


def _refusal(value: Column, value_type: T.DataType, target: T.DataType, column: str) -> Column:
    """delta-spark's error for a value ``target`` cannot take (its message and SQL state)."""
    if isinstance(value_type, _NUMERIC) and isinstance(target, _NUMERIC):
        name = ".".join(f"`{part}`" for part in column.split("."))
        return F.lit(
            f"[DELTA_CAST_OVERFLOW_IN_TABLE_WRITE] Failed to write a value of "
            f"{_sql_type(value_type)} type into the {_sql_type(target)} type column {name} "
            "due to an overflow.\nUse `try_cast` on the input value to tolerate overflow and "
            f"return NULL instead.\nIf necessary, set {POLICY_KEY} to \"LEGACY\" to bypass this "
            f"error or set {FOLLOWS_ANSI_KEY} to true to revert to the old behaviour and "
            f"follow {ANSI_KEY} in UPDATE and MERGE. SQLSTATE: 22003")
    return F.concat(
        F.lit("[CAST_INVALID_INPUT] The value '"), value.cast("string"),
        F.lit(f"' of the type {_sql_type(value_type)} cannot be cast to {_sql_type(target)} "
              "because it is malformed. Correct the value as per the syntax, or change its "
              "target type. Use `try_cast` to tolerate malformed input and return NULL "
              "instead. SQLSTATE: 22018"))
