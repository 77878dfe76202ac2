"""delta-spark's ``DeltaTable`` interface inside a percolake transaction: ``txn.delta_table(t)``.

The names, arguments, argument checks and results are delta-spark's, so code ports by changing
the line that makes the table object. What differs is when the change becomes visible: an
operation here is computed at once (on Spark, see ``sparkside.row_level``) but committed with
the rest of the batch, exactly once (docs/row-level-writes.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkside.assignments import (
    Assigned,
    Path,
    assigned_value,
    by_column,
    check_paths,
    key_path,
    merge_key_path,
)
from sparkside.column_identity import ColumnIdentity, named
from sparkside.deletion_vector_writes import ROW_INDEX
from sparkside.errors import MergeClauseError, MultipleSourceRowsMatch
from sparkside.jvm_names import jvm_class
from sparkside.merge_evolution import evolving_source_schema
from sparkside.merge_source import merge_source
from sparkside.row_level import (
    DELETE,
    FILE,
    INSERT,
    UPDATE_POSTIMAGE,
    UPDATE_PREIMAGE,
    RowLevelTable,
    change_rows,
    column_mapping,
    condition_column,
    observed,
)
from sparkside.table_rules import generation_expressions, regenerated

TableState = Callable[[], RowLevelTable]
T_HERE, S_HERE, ACTION, ROW_ID = "__percolake_t", "__percolake_s", "__percolake_action", \
    "__percolake_row"


class TransactionDeltaTable:
    """A Delta table as delta-spark's ``DeltaTable`` shows it, written within the batch."""

    def __init__(self, state: TableState, alias: str | None = None,
                 identity: ColumnIdentity | None = None) -> None:
        self._state = state
        self._alias = alias
        # the ids of toDF()'s columns, shared with the aliases (sparkside.column_identity)
        self._identity = identity or ColumnIdentity()

    def alias(self, aliasName: str) -> TransactionDeltaTable:  # noqa: N803 - delta-spark's
        """The table under another name in conditions and expressions."""
        if not isinstance(aliasName, str):
            raise ValueError(f"aliasName needs to be a string but got '{type(aliasName)}'.")
        return TransactionDeltaTable(self._state, aliasName, self._identity)

    def toDF(self) -> DataFrame:  # noqa: N802 - delta-spark's name
        """The table as of this batch so far: its version read plus the batch's earlier
        operations on it. Its Column objects resolve in this object's (and its aliases')
        operations, as in delta-spark (``sparkside.column_identity``)."""
        state = self._state()
        state.read_whole_table()  # what the batch does with the rows is not known
        frame = self._frame(state).drop(FILE, ROW_INDEX)
        self._identity.remember(frame)
        return frame

    def delete(self, condition: str | Column | None = None) -> None:
        """Deletes the rows where ``condition`` is true (all rows without one)."""
        state = self._state()
        state.refuse_removal()
        state.start()
        target = self._frame(state)
        matched = F.coalesce(condition_column(condition), F.lit(False))
        touched = _files_where(state, target, condition_column(condition))
        on_partitions = _on_partitions_only(target, condition, state.partition_by)
        # as delta-spark: whole files go when the condition names partition columns only
        merge_on_read = not on_partitions and state.merge_on_read_for(touched)
        in_place = state.in_place(touched) if merge_on_read else F.lit(False)
        observation = Observation("percolake_delete")
        read = self._rows(state, touched)
        rows = read.observe(
            observation, F.sum(F.when(matched, 1).otherwise(0)).alias("numDeletedRows"),
            F.sum(F.when(matched | in_place, 0).otherwise(1)).alias("numCopiedRows"))
        output = rows.where(~matched & ~in_place).select(*state.columns()) \
            if touched and not (merge_on_read and _all_in_place(state, touched)) else None
        deleted = rows.where(matched & in_place) if merge_on_read else None
        # as delta-spark: no change file when the condition names partition columns only
        # (whole files go; change data readers take their removes as deletes)
        changes = change_rows(read, [(matched, _row(read, state.columns()), DELETE)]) \
            if state.change_data and touched and not on_partitions else None
        state.replace(touched, output, "DELETE",
                      {} if touched else {"numDeletedRows": 0, "numCopiedRows": 0},
                      {"predicate": _predicates([_resolved(target, condition)
                                                 if condition is not None else "true"])},
                      changes, deleted)
        if touched:
            state.metrics_update(observed(observation))

    def update(self, condition: str | Column | None = None,
               set: dict[str, str | Column] | None = None) -> None:  # noqa: A002 - delta-spark's
        """Sets the columns of ``set`` on the rows where ``condition`` is true (all rows
        without one)."""
        assignments = column_mapping(set, "'set'")
        state = self._state()
        state.refuse_removal()
        state.start()
        target = self._frame(state)
        paths = {key: key_path(target, key) for key in assignments}
        check_paths(_table_struct(target, state.columns()), list(paths.values()))
        types = _types(target)
        new = _new_values(paths, assignments, _types_of(target, assignments), state.columns(),
                          types, current=F.col, allow_missing=False)
        parameters = {"predicate": _predicates([_resolved(target, condition)]
                                               if condition is not None else [])}
        matched = F.coalesce(condition_column(condition), F.lit(False))
        touched = _files_where(state, target, condition_column(condition))
        if not touched:
            state.replace([], None, "UPDATE", {"numUpdatedRows": 0, "numCopiedRows": 0},
                          parameters)
            return
        merge_on_read = state.merge_on_read_for(touched)
        in_place = state.in_place(touched) if merge_on_read else F.lit(False)
        observation = Observation("percolake_update")
        read = self._rows(state, touched)
        rows = read.observe(
            observation, F.sum(F.when(matched, 1).otherwise(0)).alias("numUpdatedRows"),
            F.sum(F.when(matched | in_place, 0).otherwise(1)).alias("numCopiedRows"))
        # merge-on-read: the updated rows (and the rows of files this batch wrote) are written,
        # the old versions of updated rows deleted by a deletion vector
        output = rows.where(matched | ~in_place).select(*[
            F.when(matched, new[c]).otherwise(F.col(c)).alias(c) if c in new else F.col(c)
            for c in state.columns()], matched.alias(ACTION))
        output = regenerated(output, state.columns(), state.schema_json, {
            name: F.col(ACTION) for name in generation_expressions(state.schema_json)
            if name not in new})
        deleted = rows.where(matched & in_place) if merge_on_read else None
        changes = None
        if state.change_data:
            updated = F.struct(*[new[c].alias(c) if c in new else read[c]
                                 for c in state.columns()])
            changes = change_rows(read, [
                (matched, _row(read, state.columns()), UPDATE_PREIMAGE),
                (matched, updated, UPDATE_POSTIMAGE)])
        state.replace(touched, output, "UPDATE", {}, parameters, changes, deleted)
        state.metrics_update(observed(observation))

    def merge(self, source: DataFrame, condition: str | Column) -> TransactionMergeBuilder:
        """A MERGE of ``source`` into the table on ``condition``; add clauses, then
        ``execute()``."""
        if source is None:
            raise ValueError("'source' in merge cannot be None")
        if not isinstance(source, DataFrame):
            raise TypeError("Type of 'source' in merge must be DataFrame.")
        if condition is None:
            raise ValueError("'condition' in merge cannot be None")
        return TransactionMergeBuilder(self, source, condition_column(condition))

    def _frame(self, state: RowLevelTable | None = None) -> DataFrame:
        return self._aliased((state or self._state()).current())

    def _frame_listed(self, state: RowLevelTable) -> DataFrame | None:
        current = state.current_listed()
        return None if current is None else self._aliased(current)

    def _rows(self, state: RowLevelTable, touched: list[str]) -> DataFrame:
        """The rows of the files ``touched``, read alone (the rewrite's input)."""
        return self._aliased(state.rows_of(touched))

    def _as_target_of(self, shared: frozenset) -> TransactionDeltaTable:
        """This object as the target of a MERGE whose source has the columns ``shared`` of its
        ``toDF()`` (a MERGE of the table with a frame made from it): then the target reads
        under new column identities, as delta-spark renews the target's."""
        return TransactionDeltaTable(self._state, self._alias) if shared else self

    def _aliased(self, frame: DataFrame) -> DataFrame:
        frame = self._identity.applied(frame)
        return frame.alias(self._alias) if self._alias else frame


@dataclass(frozen=True)
class _Clause:
    kind: str  # "matched", "not_matched", "not_matched_by_source"
    condition: Column | None
    action: str  # "update", "delete", "insert"
    assignments: dict[str, Column] | None = None  # None with update/insert: all columns
    star: bool = False  # UpdateAll/InsertAll, its assignments made by ``_all_columns``
    targets: dict[str, Path] | None = None  # each assignment key's column path, resolved


class TransactionMergeBuilder:
    """delta-spark's ``DeltaMergeBuilder``: each ``when...`` returns a new builder."""

    def __init__(self, table: TransactionDeltaTable, source: DataFrame, condition: Column,
                 clauses: tuple[_Clause, ...] = (), schema_evolution: bool = False) -> None:
        self._table = table
        self._source = source
        self._condition = condition
        self._clauses = clauses
        self._schema_evolution = schema_evolution

    def _with(self, clause: _Clause) -> TransactionMergeBuilder:
        return TransactionMergeBuilder(self._table, self._source, self._condition,
                                       self._clauses + (clause,), self._schema_evolution)

    @staticmethod
    def _when(condition: str | Column | None) -> Column | None:
        return None if condition is None else condition_column(condition)

    def whenMatchedUpdate(self, condition: str | Column | None = None,  # noqa: N802
                          set: dict[str, str | Column] | None = None  # noqa: A002
                          ) -> TransactionMergeBuilder:
        return self._with(_Clause("matched", self._when(condition), "update",
                                  column_mapping(set, "'set'")))

    def whenMatchedUpdateAll(self, condition: str | Column | None = None  # noqa: N802
                             ) -> TransactionMergeBuilder:
        return self._with(_Clause("matched", self._when(condition), "update"))

    def whenMatchedDelete(self, condition: str | Column | None = None  # noqa: N802
                          ) -> TransactionMergeBuilder:
        return self._with(_Clause("matched", self._when(condition), "delete"))

    def whenNotMatchedInsert(self, condition: str | Column | None = None,  # noqa: N802
                             values: dict[str, str | Column] | None = None
                             ) -> TransactionMergeBuilder:
        return self._with(_Clause("not_matched", self._when(condition), "insert",
                                  column_mapping(values, "'values'")))

    def whenNotMatchedInsertAll(self, condition: str | Column | None = None  # noqa: N802
                                ) -> TransactionMergeBuilder:
        return self._with(_Clause("not_matched", self._when(condition), "insert"))

    def whenNotMatchedBySourceUpdate(self, condition: str | Column | None = None,  # noqa: N802
                                     set: dict[str, str | Column] | None = None  # noqa: A002
                                     ) -> TransactionMergeBuilder:
        return self._with(_Clause("not_matched_by_source", self._when(condition), "update",
                                  column_mapping(set, "'set'")))

    def whenNotMatchedBySourceDelete(self, condition: str | Column | None = None  # noqa: N802
                                     ) -> TransactionMergeBuilder:
        return self._with(_Clause("not_matched_by_source", self._when(condition), "delete"))

    def withSchemaEvolution(self) -> TransactionMergeBuilder:  # noqa: N802
        """The table's schema evolves as delta-spark's MERGE schema evolution evolves it
        (``sparkside.merge_evolution``), committed with the batch."""
        return TransactionMergeBuilder(self._table, self._source, self._condition,
                                       self._clauses, schema_evolution=True)

    def execute(self) -> DataFrame:
        """Runs the MERGE within the batch; returns delta-spark's metrics row
        (num_affected_rows, num_updated_rows, num_deleted_rows, num_inserted_rows)."""
        _check_clauses(self._clauses)
        shared = self._table._identity.shared_with(self._source)
        table = self._table._as_target_of(shared)
        condition, clauses = self._condition, self._clauses
        if shared:  # as delta-spark: what both sides have is left to analysis by name
            spark = self._source.sparkSession
            condition = named(condition, shared, spark)
            clauses = tuple(replace(
                c, condition=None if c.condition is None else named(c.condition, shared, spark),
                assignments=None if c.assignments is None else {
                    k: named(v, shared, spark) for k, v in c.assignments.items()})
                for c in clauses)
        state = table._state()
        state.start()
        target = table._frame(state)
        _check_attributes(target, self._source, condition, clauses)
        clauses = _with_targets(clauses, target, self._source, state.columns(),
                                self._schema_evolution)
        if self._schema_evolution:
            evolving = evolving_source_schema(
                self._source.schema, _table_struct(target, state.columns()),
                star=any(c.assignments is None and c.action != "delete" for c in clauses),
                assigned=[p for c in clauses if c.targets is not None
                          and c.kind != "not_matched_by_source" for p in c.targets.values()])
            if evolving is not None:
                state.evolve(evolving)
                target = table._frame(state)
        insert_only = all(c.kind == "not_matched" for c in clauses)
        with merge_source(self._source, insert_only) as source:
            metrics = _merge(state, table, target, source.frame, condition,
                             clauses, _merge_parameters(target, self._source,
                                                        condition, clauses),
                             self._schema_evolution)
        metrics["materializeSourceTimeMs"] = source.materialize_ms
        state.metrics_update(metrics)
        updated = metrics["numTargetRowsUpdated"]
        deleted = metrics["numTargetRowsDeleted"]
        inserted = metrics["numTargetRowsInserted"]
        spark = self._source.sparkSession
        return spark.createDataFrame(
            [(updated + deleted + inserted, updated, deleted, inserted)],
            "num_affected_rows long, num_updated_rows long, num_deleted_rows long, "
            "num_inserted_rows long")


def _sql(condition: str | Column) -> str:
    """A condition's SQL text: as written, or the Column's expression."""
    if isinstance(condition, str):
        return condition
    text = str(condition)
    return text[len("Column<'"):-len("'>")] if text.startswith("Column<'") else text


def _resolved(frame: DataFrame, condition: str | Column) -> str:
    """A condition as delta-spark's history shows it: Spark's string of the expression resolved
    against ``frame`` (columns with their expression ids: ``(region#12 = eu)``), constants
    folded (``value > 5`` on a bigint column is ``(value#8L > 5)``, not ``cast(5 as bigint)``);
    the text given if Spark cannot resolve it there (the operation then fails naming it)."""
    try:
        plan = _folded(frame.where(condition_column(condition)))
        return str(plan.condition().toString())
    except Exception:  # noqa: BLE001 - Py4J's or Spark's error: the operation reports it
        return _sql(condition)


def _predicates(conditions: list[str]) -> str:
    """delta-spark's ``predicate`` parameter: a JSON list of conditions' SQL."""
    return json.dumps(conditions, separators=(",", ":"))


def _merge_parameters(target: DataFrame, source: DataFrame, condition: Column,
                      clauses: tuple[_Clause, ...]) -> dict[str, str]:
    """A MERGE's operationParameters as delta-spark writes them: its condition, and each
    clause kind's list of ``{predicate, actionType}`` in clause order, each condition resolved
    where delta-spark resolves it (matched clauses on the join, not matched ones on the
    source, not matched by source ones on the target)."""
    joined = target.join(source, condition, "inner")
    scope = {"matched": joined, "not_matched": source, "not_matched_by_source": target}

    def of_kind(kind: str) -> str:
        return json.dumps([({"predicate": _resolved(scope[kind], c.condition)}
                            if c.condition is not None else {}) | {"actionType": c.action}
                           for c in clauses if c.kind == kind], separators=(",", ":"))

    return {"predicate": _predicates([_join_condition(joined, condition)]),
            "matchedPredicates": of_kind("matched"),
            "notMatchedPredicates": of_kind("not_matched"),
            "notMatchedBySourcePredicates": of_kind("not_matched_by_source")}


def _join_condition(joined: DataFrame, condition: Column) -> str:
    """A MERGE's condition resolved on its join, as delta-spark's history shows it."""
    try:
        found = _folded(joined).condition()
        return str(found.get().toString()) if found.isDefined() else _sql(condition)
    except Exception:  # noqa: BLE001 - Py4J's or Spark's error: the MERGE reports it
        return _sql(condition)


def _folded(frame: DataFrame) -> Any:
    """The analyzed plan of ``frame`` (a JVM object) with Spark's constant folding applied."""
    jvm = frame.sparkSession._jvm  # noqa: SLF001 - PySpark has no public plan access
    analyzed = frame._jdf.queryExecution().analyzed()  # noqa: SLF001
    return jvm_class(jvm, "org.apache.spark.sql.catalyst.optimizer.ConstantFolding").apply(analyzed)


def _check_attributes(target: DataFrame, source: DataFrame, condition: Column,
                      clauses: tuple[_Clause, ...]) -> None:
    """A MERGE's Column objects resolve on its target and source, as delta-spark resolves
    them: a column of another DataFrame (another table object's ``toDF()``) fails the MERGE
    with delta-spark's error class, before anything is read."""
    values = [c.condition for c in clauses if c.condition is not None] + [
        v for c in clauses for v in (c.assignments or {}).values()]
    try:
        joined = target.join(source, condition, "full_outer")
        joined.select(*[v.alias(f"v{n}") for n, v in enumerate(values)]).schema  # noqa: B018
    except Exception as error:  # noqa: BLE001 - Spark's; others are reported by the MERGE
        spark_class = getattr(error, "getCondition", lambda: None)() or ""
        if not spark_class.startswith("MISSING_ATTRIBUTES."):
            return
        message = str(error).split("] ", 1)[-1].split("\n")[0]
        raise MergeClauseError(
            f"[DELTA_MERGE_RESOLVED_ATTRIBUTE_MISSING_FROM_INPUT] {message} In a MERGE, use "
            "SQL strings, or Column objects of the source and of this table object's (or its "
            "alias') toDF(); not those of another DataFrame.") from None


def _check_clauses(clauses: tuple[_Clause, ...]) -> None:
    """delta-spark's rules: at least one clause; of each kind only the last may omit its
    condition."""
    if not clauses:
        raise MergeClauseError("[DELTA_MERGE_MISSING_WHEN] There must be at least one WHEN "
                               "clause in a MERGE statement.")
    names = {"matched": ("MATCHED", "DELTA_NON_LAST_MATCHED_CLAUSE_OMIT_CONDITION"),
             "not_matched": ("NOT MATCHED",
                             "DELTA_NON_LAST_NOT_MATCHED_CLAUSE_OMIT_CONDITION"),
             "not_matched_by_source": (
                 "NOT MATCHED BY SOURCE",
                 "DELTA_NON_LAST_NOT_MATCHED_BY_SOURCE_CLAUSE_OMIT_CONDITION")}
    for kind, (name, error) in names.items():
        of_kind = [c for c in clauses if c.kind == kind]
        if any(c.condition is None for c in of_kind[:-1]):
            raise MergeClauseError(
                f"[{error}] When there are more than one {name} clauses in a MERGE statement, "
                f"only the last {name} clause can omit the condition.")


def _merge(state: RowLevelTable, table: TransactionDeltaTable, target: DataFrame,
           source: DataFrame, condition: Column, clauses: tuple[_Clause, ...],
           parameters: dict[str, str], schema_evolution: bool = False) -> dict[str, int]:
    """The copy-on-write MERGE (docs/row-level-writes.md): touched files, then one rewrite."""
    columns = state.columns()
    types = _types(target)
    clauses = tuple(_all_columns(c, state, source, schema_evolution) for c in clauses)
    matched = [c for c in clauses if c.kind == "matched"]
    not_matched = [c for c in clauses if c.kind == "not_matched"]
    by_source = [c for c in clauses if c.kind == "not_matched_by_source"]
    source = source.withColumn(S_HERE, F.lit(True))
    if not by_source and not _prunes_target(target, source, condition):
        # the whole version is read: from its checksum's listing, no scan to plan (as
        # delta-spark's MERGE lists it)
        listed = _joinable(table._frame_listed(state), source, condition)
        target = target if listed is None else listed
    source_rows = Observation("percolake_merge_source")
    metrics: dict[str, int] = {}
    touched: list[str] = []
    if matched:  # also when by_source: the several-matches check holds for every MERGE
        touched = _touched_by_matches(
            state, table, target, source, source.observe(
                source_rows, F.count(F.lit(1)).alias("numSourceRows")),
            condition, columns, matched)
        metrics.update(observed(source_rows))
        source_rows = Observation("percolake_merge_source_rewrite")
    if by_source:  # every target row may change
        touched = _files_where(state, target, F.lit(True))
    insert_only = not matched and not by_source
    rewritten = None if insert_only else \
        table._rows(state, touched).withColumn(T_HERE, F.lit(True))
    merge_on_read = not insert_only and state.merge_on_read_for(touched)
    in_place = state.in_place(touched) if merge_on_read else F.lit(False)
    if rewritten is None:  # delta-spark's insert-only MERGE: one pass, no file rewritten
        joined = source.observe(source_rows, F.count(F.lit(1)).alias("numSourceRows")) \
            .join(target, condition, "left_anti") \
            .withColumn(T_HERE, F.lit(None).cast("boolean"))
    elif not_matched:
        joined = rewritten.join(source.observe(source_rows, F.count(F.lit(1))
                                               .alias("numSourceRows")),
                                condition, "full_outer")
    elif touched:
        joined = rewritten.join(source, condition, "left_outer")
    else:  # nothing to insert, no row matched
        state.replace([], None, "MERGE", {}, parameters)
        return {**_zero_merge_metrics(), **metrics}
    t_here, s_here = F.col(T_HERE).isNotNull(), F.col(S_HERE).isNotNull()
    cases = {"matched": t_here & s_here, "not_matched": s_here & ~t_here,
             "not_matched_by_source": t_here & ~s_here}
    action = F.when(F.lit(False), F.lit(None))
    numbered = list(enumerate(clauses))
    for i, clause in numbered:
        when = cases[clause.kind]
        if clause.condition is not None:
            when = when & F.coalesce(clause.condition, F.lit(False))
        action = action.when(when, F.lit(i))
    value_types = _value_types(joined, clauses)
    joined = joined.withColumn(ACTION, action.otherwise(F.lit(None)).cast("int"))
    acted = joined
    act = F.col(ACTION)

    def count_of(kind: str, what: str, name: str) -> Column:
        ids = [i for i, c in numbered if c.kind == kind and c.action == what]
        hit = act.isin(ids) if ids else F.lit(False)
        return F.sum(F.when(hit, 1).otherwise(0)).alias(name)

    rewrite = Observation("percolake_merge")
    joined = joined.observe(
        rewrite,
        count_of("matched", "update", "numTargetRowsMatchedUpdated"),
        count_of("matched", "delete", "numTargetRowsMatchedDeleted"),
        count_of("not_matched", "insert", "numTargetRowsInserted"),
        count_of("not_matched_by_source", "update", "numTargetRowsNotMatchedBySourceUpdated"),
        count_of("not_matched_by_source", "delete", "numTargetRowsNotMatchedBySourceDeleted"),
        F.sum(F.when(act.isNull() & t_here & ~in_place, 1).otherwise(0))
        .alias("numTargetRowsCopied"))

    def current(name: str) -> Column | None:
        return None if rewritten is None else rewritten[name]

    new = {i: _new_values(c.targets or {}, c.assignments,
                          {k: value_types[i, k] for k in c.assignments}, columns, types,
                          current, schema_evolution,
                          # UpdateAll with schema evolution keeps the fields the source lacks
                          current if c.star and c.action == "update" and schema_evolution
                          else lambda _: None)
           for i, c in numbered if c.assignments is not None}
    outputs, before = [], []
    for name in columns:
        value = F.lit(None).cast(types[name]) if rewritten is None else rewritten[name]
        before.append(value.alias(name))
        for i, clause in reversed(numbered):
            if clause.action == "delete":
                continue
            assigned = new[i].get(name)
            if assigned is not None:
                value = F.when(act == i, assigned).otherwise(value)
            elif clause.action == "insert":
                value = F.when(act == i, F.lit(None).cast(types[name])).otherwise(value)
        outputs.append(value.alias(name))
    deletes = [i for i, c in numbered if c.action == "delete"]
    keep = (act.isNotNull() & ~act.isin(deletes)) if deletes else act.isNotNull()
    # merge-on-read: target rows of the table's files that no clause acts on stay where they
    # are; those it updates or deletes get a deletion vector
    output = joined.where(keep | (act.isNull() & t_here & ~in_place)).select(*outputs, act)
    output = regenerated(output, columns, state.schema_json, {
        name: act.isNotNull() & ~act.isin([i for i in new if name in new[i]])
        for name in generation_expressions(state.schema_json)})
    deleted = joined.where(t_here & act.isNotNull() & in_place) if merge_on_read else None
    changes = None
    if state.change_data and touched:  # as delta-spark: none when no target file is rewritten
        def of(action: str) -> Column:
            ids = [i for i, c in numbered if c.action == action]
            return act.isin(ids) if ids else F.lit(False)

        after = F.struct(*outputs)
        changes = change_rows(acted, [
            (of("update"), F.struct(*before), UPDATE_PREIMAGE),
            (of("update"), after, UPDATE_POSTIMAGE),
            (of("delete"), F.struct(*before), DELETE), (of("insert"), after, INSERT)])
    state.replace(touched, output, "MERGE", {}, parameters, changes, deleted)
    metrics.update(observed(rewrite))
    if "numSourceRows" not in metrics:
        metrics.update(observed(source_rows) if not_matched else {})
    metrics["numTargetRowsUpdated"] = (metrics["numTargetRowsMatchedUpdated"]
                                       + metrics["numTargetRowsNotMatchedBySourceUpdated"])
    metrics["numTargetRowsDeleted"] = (metrics["numTargetRowsMatchedDeleted"]
                                       + metrics["numTargetRowsNotMatchedBySourceDeleted"])
    metrics["numOutputRows"] = (metrics["numTargetRowsInserted"] + metrics["numTargetRowsUpdated"]
                                + metrics["numTargetRowsCopied"])
    return metrics


def _touched_by_matches(state: RowLevelTable, table: TransactionDeltaTable, target: DataFrame,
                        source: DataFrame, observed_source: DataFrame, condition: Column,
                        columns: list[str], matched: list[_Clause]) -> list[str]:
    """The files holding target rows the condition matches; fails as delta-spark does when
    several source rows match one target row (unless the only matched clause is an
    unconditional delete), naming that row.

    The join is deterministic so that Spark pushes the condition's target-only predicates
    into the Delta scan (partition and statistics pruning); a target row is told apart by its
    file and a hash of its values. Only files where such a key met several source rows (equal
    rows, or a hash collision) are read again, alone, with a row id, for the exact count."""
    hashable = [target[c] for c in columns
                if not isinstance(target.schema[c].dataType, T.MapType)]
    key = F.xxhash64(*hashable) if hashable else F.lit(0)
    per_key = target.join(observed_source, condition, "inner").groupBy(
        F.col(FILE), key.alias(ROW_ID)).agg(F.count(F.lit(1)).alias("n"))
    per_file_frame = per_key.groupBy(FILE).agg(F.max("n").alias("n"))
    per_file = per_file_frame.collect()
    state.note_read(per_file_frame)
    state.note_scan(per_file_frame)
    touched = [r[FILE] for r in per_file]
    unambiguous = (len(matched) == 1 and matched[0].action == "delete"
                   and matched[0].condition is None)
    suspects = [r[FILE] for r in per_file if r["n"] > 1]
    if unambiguous or not suspects:
        return touched
    rows = table._rows(state, suspects).withColumn(ROW_ID, F.monotonically_increasing_id())
    worst = rows.join(source, condition, "inner").groupBy(ROW_ID).agg(
        F.count(F.lit(1)).alias("n"),
        F.first(F.struct(*[rows[c] for c in columns])).alias("row")).orderBy(
            F.desc("n")).first()
    if worst is not None and worst["n"] > 1:
        raise MultipleSourceRowsMatch(
            f"[{MultipleSourceRowsMatch.ERROR_CLASS}] Cannot perform Merge as multiple source "
            "rows matched and attempted to modify the same target row in the Delta table in "
            f"possibly conflicting ways: {worst['n']} source rows match the target row "
            f"{worst['row'].asDict()}. Preprocess the source so that at most one of its rows "
            "matches each target row (e.g. keep the latest change per key).")
    return touched


def _prunes_target(target: DataFrame, source: DataFrame, condition: Column) -> bool:
    """Whether a conjunct of the MERGE's condition reads the target alone (delta-spark prunes
    the target's files by those; a condition of join keys alone reads every file). True when
    the condition cannot be walked here: the find pass then plans its scan as any query."""
    try:
        joined = _folded(target.join(source, condition, "inner"))
        found = joined.condition()
        if not found.isDefined():
            return True
        target_columns = target._jdf.queryExecution().analyzed().outputSet()  # noqa: SLF001
        conjuncts = [found.get()]
        while conjuncts:
            term = conjuncts.pop()
            if term.getClass().getSimpleName() == "And":
                conjuncts += [term.left(), term.right()]
            elif term.references().subsetOf(target_columns):
                return True
        return False
    except Exception:  # noqa: BLE001 - Py4J's or Spark's error: the ordinary find pass
        return True


def _joinable(target: DataFrame | None, source: DataFrame, condition: Column
              ) -> DataFrame | None:
    """``target`` if the condition resolves on its join with ``source`` (a condition holding
    another frame's column objects resolves only on that frame), else None."""
    if target is None:
        return None
    try:
        target.join(source, condition, "inner").schema  # noqa: B018 - analysis, no job
    except Exception:  # noqa: BLE001 - Spark's analysis error: the ordinary find pass
        return None
    return target


def _all_columns(clause: _Clause, state: RowLevelTable, source: DataFrame,
                 schema_evolution: bool) -> _Clause:
    """``UpdateAll``/``InsertAll``: every target column from the source column of its name.
    With schema evolution, as in delta-spark, a target column the source lacks keeps its value
    (update) or is null (insert)."""
    if clause.assignments is not None or clause.action == "delete":
        return clause
    by_name = {c.lower(): c for c in source.columns}
    missing = [c for c in state.columns() if c.lower() not in by_name]
    if schema_evolution:
        present = [c for c in state.columns() if c not in missing]
        return replace(clause, star=True,
                       assignments={c: source[by_name[c.lower()]] for c in present},
                       targets={c: (c,) for c in present})
    if missing:
        raise MergeClauseError(
            f"[DELTA_MERGE_UNRESOLVED_EXPRESSION] Cannot resolve {missing} in "
            f"{'UPDATE' if clause.action == 'update' else 'INSERT'} clause given columns "
            f"{source.columns} of the source (without withSchemaEvolution every target "
            "column must be in the source).")
    return replace(clause, star=True,
                   assignments={c: source[by_name[c.lower()]] for c in state.columns()},
                   targets={c: (c,) for c in state.columns()})


def _value_types(joined: DataFrame, clauses: tuple[_Clause, ...]) -> dict[tuple[int, str],
                                                                          T.DataType]:
    """The Spark type of each clause's assigned values (by clause index and key), resolved on
    the MERGE's join (one analysis, no job)."""
    keys = [(i, key, value) for i, c in enumerate(clauses) if c.assignments is not None
            for key, value in c.assignments.items()]
    found = _types_of(joined, {str(n): value for n, (_, _, value) in enumerate(keys)})
    return {(i, key): found[str(n)] for n, (i, key, _) in enumerate(keys)}


def _types_of(frame: DataFrame, values: dict[str, Column]) -> dict[str, T.DataType]:
    """The Spark type of each value (by key), resolved on ``frame`` (one analysis, no job)."""
    if not values:
        return {}
    schema = frame.select(*[v.alias(f"v{n}") for n, v in enumerate(values.values())]).schema
    return {key: schema.fields[n].dataType for n, key in enumerate(values)}


def _with_targets(clauses: tuple[_Clause, ...], target: DataFrame, source: DataFrame,
                  columns: list[str], schema_evolution: bool) -> tuple[_Clause, ...]:
    """The clauses with their keys resolved to column paths (``sparkside.assignments``: on
    the table, else with schema evolution a matched update's or an insert's on the source),
    then checked as delta-spark checks them, matched clauses first, inserts last; before
    anything is evolved or written."""
    resolved = tuple(c if c.assignments is None else replace(c, targets={
        key: merge_key_path(key, target, source, columns,
                            "UPDATE" if c.action == "update" else "INSERT",
                            schema_evolution and c.kind != "not_matched_by_source")
        for key in c.assignments}) for c in clauses)
    table = _table_struct(target, columns)
    for kind in ("matched", "not_matched_by_source", "not_matched"):
        for clause in resolved:
            if clause.kind == kind and clause.targets is not None:
                check_paths(table, list(clause.targets.values()),
                            insert=clause.action == "insert")
    return resolved


def _new_values(paths: dict[str, Path], values: dict[str, Column],
                value_types: dict[str, T.DataType], columns: Sequence[str],
                types: dict[str, T.DataType], current: Callable[[str], Column | None],
                allow_missing: bool,
                kept: Callable[[str], Column | None] = lambda _: None) -> dict[str, Column]:
    """Each column a clause's keys assign (their resolved ``paths``), by name: its new value
    given its ``current`` one (``sparkside.assignments``); ``kept``: an UpdateAll's."""
    return {column: assigned_value(
                current(column), types[column],
                [Assigned(paths[k][1:], values[k], value_types[k]) for k in keys],
                allow_missing, kept(column), column)
            for column, keys in by_column(paths, columns).items()}


def _table_struct(target: DataFrame, columns: Sequence[str]) -> T.StructType:
    """The table's columns of ``target`` (without the hidden ones) as a Spark struct."""
    return T.StructType([target.schema[c] for c in columns])


def _row(frame: DataFrame, columns: list[str]) -> Column:
    """The table's columns of ``frame``'s row, as a struct (a change row's values)."""
    return F.struct(*[frame[c] for c in columns])


def _on_partitions_only(target: DataFrame, condition: str | Column | None,
                        partition_by: list[str]) -> bool:
    """Whether ``condition`` names no column but partition columns (None: true), as
    delta-spark's DELETE tells a delete of whole files from one that rewrites them: the
    columns the analyzed filter references. Unknown (an unexpected plan): False, which
    writes change files, right for change data readers either way."""
    if condition is None:
        return True
    try:
        plan = target.where(condition_column(condition))._jdf.queryExecution().analyzed()
        references = plan.condition().references().toSeq()
        names = {references.apply(i).name().lower() for i in range(references.size())}
    except Exception:  # noqa: BLE001 - a plan of another shape: not a partition-only filter
        return False
    return names <= {c.lower() for c in partition_by}


def _files_where(state: RowLevelTable, target: DataFrame, matched: Column) -> list[str]:
    """The files of ``target`` holding a row where ``matched`` holds (one Spark query, noted
    as the operation's read; the add actions its scan listed are kept for the rewrite)."""
    files = target.where(matched).select(FILE).distinct()
    found = [r[0] for r in files.collect()]
    state.note_read(files)
    state.note_scan(files)
    return found


def _all_in_place(state: RowLevelTable, touched: list[str]) -> bool:
    """Whether every file of ``touched`` is a file of the table (none written by the batch)."""
    return not any(state.in_batch(p) for p in touched)


def _types(frame: DataFrame) -> dict[str, T.DataType]:
    return {f.name: f.dataType for f in frame.schema.fields}


def _zero_merge_metrics() -> dict[str, int]:
    return dict.fromkeys(
        ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted",
         "numTargetRowsCopied", "numOutputRows", "numTargetRowsMatchedUpdated",
         "numTargetRowsMatchedDeleted", "numTargetRowsNotMatchedBySourceUpdated",
         "numTargetRowsNotMatchedBySourceDeleted"), 0)
