"""Columns of ``txn.delta_table(...).toDF()`` in that table's operations, as in delta-spark.

delta-spark's ``DeltaTable`` holds one DataFrame: ``toDF()`` returns it, and its MERGE, UPDATE and
DELETE run on it, so a Column taken from it (``t.toDF()["id"]``, ``t.toDF().id``: Spark's
resolved attributes, named by expression id) resolves in any operation of that table object or
of its aliases, also after earlier operations changed the table. A Column of another DataFrame
(another ``DeltaTable.forPath`` of the same path, ``spark.read``) does not resolve: Spark's
analysis refuses it.

Here each operation reads the table as the batch left it, a new plan with new expression ids.
So one table object (and its aliases) keeps the ids its first ``toDF()`` gave its columns, and
every frame its operations and later ``toDF()`` calls read is projected onto them: the same
Column objects resolve there, and only there. A column whose type the batch changed since
(type widening) gets a new id: a Column of its old type does not resolve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession

from sparkside.jvm_names import jvm_class


@dataclass
class ColumnIdentity:
    """One table object's column ids (Catalyst ``ExprId``, with the column's type), by name;
    empty until its first ``toDF()``."""

    ids: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def remember(self, frame: DataFrame) -> None:
        """The ids of ``frame``'s columns (the object's first ``toDF()``; later ones are
        ``applied`` these already)."""
        if self.ids:
            return
        output = _analyzed(frame).output()
        for i in range(output.size()):
            attribute = output.apply(i)
            self.ids[attribute.name()] = (attribute.exprId(), attribute.dataType().json())

    def shared_with(self, frame: DataFrame) -> frozenset[tuple[int, str]]:
        """The ids of these that columns of ``frame`` have (a frame made from ``toDF()``);
        empty when none do."""
        if not self.ids:
            return frozenset()
        ids = {_key(known[0]) for known in self.ids.values()}
        output = _analyzed(frame).output()
        return frozenset(key for key in (_key(output.apply(i).exprId())
                                          for i in range(output.size())) if key in ids)

    def applied(self, frame: DataFrame) -> DataFrame:
        """``frame`` with each column this object's ``toDF()`` named under that column's id
        (the same type), other columns as they are; ``frame`` itself when nothing changes."""
        if not self.ids:
            return frame
        plan = _analyzed(frame)
        jvm = frame.sparkSession._jvm  # noqa: SLF001 - PySpark has no public plan API
        alias = jvm_class(jvm, "org.apache.spark.sql.catalyst.expressions.Alias")
        output = plan.output()
        projected = jvm_class(jvm, "java.util.ArrayList")()
        renamed = False
        for i in range(output.size()):
            attribute = output.apply(i)
            name = attribute.name()
            known = self.ids.get(name)
            if known is None or known[1] != attribute.dataType().json() \
                    or attribute.exprId().equals(known[0]):
                projected.add(attribute)
                continue
            renamed = True
            projected.add(alias(attribute, name, known[0],
                                *[getattr(alias, f"$lessinit$greater$default${n}")(attribute, name)
                                  for n in (4, 5, 6)]))
        if not renamed:
            return frame
        scala = jvm_class(jvm, "scala.jdk.javaapi.CollectionConverters")
        project = jvm_class(jvm, "org.apache.spark.sql.catalyst.plans.logical.Project")(
            scala.asScala(projected).toList(), plan)
        session = frame.sparkSession
        return DataFrame(jvm_class(jvm, "org.apache.spark.sql.classic.Dataset").ofRows(
            session._jsparkSession, project), session)  # noqa: SLF001


def named(column: Column, ids: frozenset[tuple[int, str]], spark: SparkSession) -> Column:
    """``column`` with each attribute whose id is in ``ids`` replaced by its name (with its
    qualifier), left for analysis to resolve: what delta-spark's MERGE does with the attributes
    its target and source share, so that one naming both sides is ambiguous, not either's."""
    jvm = spark._jvm  # noqa: SLF001 - PySpark has no public plan API
    expression = spark._jsparkSession.expression(column._jc)  # noqa: SLF001
    rewritten = _named(jvm, expression, ids)
    if rewritten is None:
        return column
    return Column(jvm_class(jvm, "org.apache.spark.sql.classic.ExpressionUtils").column(rewritten))


def _named(jvm: Any, expression: Any, ids: frozenset[tuple[int, str]]) -> Any:  # noqa: ANN401
    """``expression`` rewritten by ``named``, or None when nothing in it changes."""
    if expression.getClass().getSimpleName() == "AttributeReference" \
            and _key(expression.exprId()) in ids:
        qualifier = expression.qualifier()
        parts = [qualifier.apply(i) for i in range(qualifier.size())] + [expression.name()]
        return jvm_class(jvm, "org.apache.spark.sql.catalyst.analysis.UnresolvedAttribute")(
            jvm_class(jvm, "scala.jdk.javaapi.CollectionConverters").asScala(parts).toSeq())
    children = expression.children()
    rewritten = [_named(jvm, children.apply(i), ids) for i in range(children.size())]
    if all(child is None for child in rewritten):
        return None
    new = jvm_class(jvm, "java.util.ArrayList")()
    for i, child in enumerate(rewritten):
        new.add(children.apply(i) if child is None else child)
    return expression.withNewChildren(
        jvm_class(jvm, "scala.jdk.javaapi.CollectionConverters").asScala(new).toSeq())


def _analyzed(frame: DataFrame) -> Any:  # noqa: ANN401 - a JVM LogicalPlan
    return frame._jdf.queryExecution().analyzed()  # noqa: SLF001


def _key(expr_id: Any) -> tuple[int, str]:  # noqa: ANN401 - a JVM ExprId
    return expr_id.id(), expr_id.jvmId().toString()
