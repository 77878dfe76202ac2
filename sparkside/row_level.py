"""Row-level writes of one table in one batch, copy-on-write (docs/row-level-writes.md).

A table's MERGE, UPDATE and DELETE calls of a batch share one :class:`RowLevelTable`: the table
as read at ``read_version`` (pinned at the first call, after the attempt holds the table, I12),
minus the files the batch's earlier operations replaced, plus the files they wrote. Each
operation finds the files holding rows it changes (a join that keeps ``_metadata.file_path``;
Spark pushes the condition's target-only predicates into the Delta scan, which prunes
partitions and files by their statistics), has the executors read exactly those files
(``sparkside.file_scan``) and rewrite their surviving and changed rows (and the inserts) once,
into the attempt's folder, and replaces them in the state:
a later operation reads the earlier ones' output (read your own writes). At the commit the state
is one ROW_LEVEL write intent: the files it adds, the files of ``read_version`` it removes.

On a table with the change data feed (``delta.enableChangeDataFeed``) an operation also writes
its changed rows with ``_change_type`` as change data files (the commit's ``cdc`` actions), where
delta-spark writes them; where delta-spark writes none (a MERGE that rewrote no file, a DELETE
whose condition names partition columns only, an append) the adds and removes say it all, unless
another operation of the commit wrote change files: a change data reader then reads only those,
so the implied changes are written as change files too (``write_record``).

On a table with ``delta.enableDeletionVectors=true`` (and no change data feed) an operation is
merge-on-read, as delta-spark's: the files of the table it touches are kept, the rows it deletes
or updates marked in a deletion vector per file (``sparkside.deletion_vector_writes``), only the
updated and inserted rows written as new files; a file whose every row goes is removed. Files an
earlier operation of the batch wrote are still rewritten (they are in no Delta version yet).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from percolake.lake.conflicts import log_entries_after
from percolake.lake.deletion_vector_files import stored_descriptor
from percolake.lake.deletion_vectors import deletion_vectors
from percolake.lake.delta_commit import (
    TableLayout,
    files_of_version,
    open_table,
    table_constraints,
)
from percolake.lake.log_entry import log_path
from percolake.lake.read_set import (
    WHOLE_TABLE,
    WRITE_SERIALIZABLE,
    Predicate,
    ReadSet,
    table_isolation_level,
    union,
)
from percolake.lake.schema_evolution import MAX_COLUMN_ID, merged_schema, type_widening_enabled
from percolake.lake.schema_evolution import max_column_id as mapping_max_column_id
from percolake.lake.warehouse import is_object_store, spark_uri
from percolake.records import (
    AddFileRecord,
    ChangeFileRecord,
    DeletionVectorRecord,
    RemoveFileRecord,
    TableWriteRecord,
    WriteMode,
)
from sparkside.batch_write_plan import plan_write
from sparkside.column_mapping import ColumnMapping, by_name
from sparkside.deletion_vector_writes import (
    ROW_INDEX,
    StoredVector,
    deleted_by,
    table_relative,
    write_vectors,
)
from sparkside.errors import RowLevelWriteRefused
from sparkside.file_scan import FileScan
from sparkside.nested_fields import spark_type
from sparkside.read_predicates import read_predicate
from sparkside.reader import read_table_version
from sparkside.table_rules import (
    checked_rows,
    generation_expressions,
    regenerated,
    violation_of,
)
from sparkside.writer import write_files

FILE = "__percolake_file"  # the hidden column naming each row's data file
USER_METADATA_KEY = "spark.databricks.delta.commitInfo.userMetadata"
SPARK_WRITE_MARK = "percolake:inside-batch:"
CHANGE_DATA_FEED = "delta.enableChangeDataFeed"
DELETION_VECTORS = "delta.enableDeletionVectors"
APPEND_ONLY = "delta.appendOnly"
CHANGE_TYPE = "_change_type"  # Delta's change data column and its values
INSERT, DELETE = "insert", "delete"
UPDATE_PREIMAGE, UPDATE_POSTIMAGE = "update_preimage", "update_postimage"
CHANGE_FOLDER = "_change_data"
_EVENT, _ROW = "__percolake_change", "row"


def condition_column(condition: str | Column | None, argname: str = "'condition'") -> Column:
    """A condition as a Column (None: true), typed as delta-spark types it."""
    if condition is None:
        return F.lit(True)
    if isinstance(condition, Column):
        return condition
    if isinstance(condition, str):
        return F.expr(condition)
    raise TypeError(f"{argname} must be a Spark SQL Column or a string (expression in SQL "
                    f"syntax), found to be of type {type(condition)}")


def column_mapping(values: Any, argname: str) -> dict[str, Column]:
    """A ``set``/``values`` dict as delta-spark checks it: column names to Columns or SQL."""
    if values is None:
        raise ValueError(f"{argname} cannot be None")
    if type(values) is not dict:
        raise TypeError(f"{argname} must be a dict, found to be {type(values)}")
    mapped: dict[str, Column] = {}
    for name, expr in values.items():
        if type(name) is not str:
            raise TypeError(f"Keys of dict in {argname} must contain only strings with column "
                            f"names, found '{name}' of type '{type(name)}")
        if isinstance(expr, Column):
            mapped[name] = expr
        elif type(expr) is str:
            mapped[name] = F.expr(expr)
        else:
            raise TypeError(f"Values of dict in {argname} must contain only Spark SQL Columns "
                            "or strings (expressions in SQL syntax) as values, found "
                            f"'{expr}' of type '{type(expr)}'")
    return mapped


@dataclass
class RowLevelTable:
    """One table's row-level state in one batch (see the module doc)."""

    spark: SparkSession
    table: str  # canonical URI
    location: str  # the attempt's folder for the table
    read_version: int
    schema_json: str
    partition_by: list[str]
    base: dict[str, AddFileRecord]  # the files of read_version, by relative path
    with_vectors: frozenset[str] = frozenset()  # files of read_version with a deletion vector
    read_vectors: dict[str, dict] = field(default_factory=dict)  # their descriptors
    # merge-on-read (delta.enableDeletionVectors): files of read_version kept with a new
    # deletion vector (also in ``removed``), and each one's _metadata.file_path
    merge_on_read: bool = False
    kept: dict[str, DeletionVectorRecord] = field(default_factory=dict)
    kept_as_read: dict[str, str] = field(default_factory=dict)
    removed: dict[str, RemoveFileRecord] = field(default_factory=dict)
    added: dict[str, AddFileRecord] = field(default_factory=dict)
    added_folders: dict[str, str] = field(default_factory=dict)  # added path -> its op folder
    removed_as_read: set[str] = field(default_factory=set)  # their _metadata.file_path
    base_replaced: bool = False  # a txn.write overwrite replaced every file of read_version
    operations: list[str] = field(default_factory=list)
    parameters: list[dict[str, str]] = field(default_factory=list)  # each operation's
    metrics: dict[str, int] = field(default_factory=dict)
    started: float = 0.0  # when the running operation started (time.monotonic)
    schema_evolved: bool = False  # withSchemaEvolution changed schema_json in this batch
    type_widening: bool = False  # delta.enableTypeWidening=true with the typeWidening feature
    mapping: ColumnMapping | None = None  # a column-mapped table's (its files' names)
    max_column_id: int = 0  # a column-mapped table's delta.columnMapping.maxColumnId, so far
    change_data: bool = False  # delta.enableChangeDataFeed: operations write change files
    constraints: tuple[tuple[str, str], ...] = ()  # delta.constraints.<name>: (name, SQL)
    append_only: bool = False  # delta.appendOnly=true: no operation may remove a row
    batch_id: int = -1  # the batch writing it, for the errors' messages
    changes: dict[str, ChangeFileRecord] = field(default_factory=dict)  # by relative path
    implied: list[DataFrame] = field(default_factory=list)  # changes no change file holds yet
    implied_written: int = 0  # folders of implied changes written so far
    # what the operations read, for Delta's conflict rules (percolake.lake.read_set): the
    # table's isolation level, each operation's read predicate, the running one's reads
    isolation_level: str = WRITE_SERIALIZABLE
    reads: list[Predicate] = field(default_factory=list)
    operation_reads: list[Predicate] = field(default_factory=list)
    _file_scan: FileScan | None = field(default=None, repr=False)
    _scanned: dict[str, Any] = field(default_factory=dict, repr=False)  # ``note_scan``'s

    @classmethod
    def read(cls, spark: SparkSession, table: str, location: str,
             batch_id: int = -1) -> RowLevelTable:
        """The table at its latest version, pinned: call with the table held by the attempt.

        Raises:
            RowLevelWriteRefused: no Delta table there.
        """
        delta = open_table(table)
        if delta is None:
            raise RowLevelWriteRefused(
                f"{table} is not a Delta table: txn.delta_table needs an existing table "
                "(create it first, e.g. with CREATE TABLE ... USING DELTA or txn.write)")
        configuration = delta.metadata().configuration
        change_data = str(configuration.get(CHANGE_DATA_FEED, "")).lower() == "true"
        mapped = str(configuration.get("delta.columnMapping.mode") or "none") != "none"
        version = delta.version()
        files = files_of_version(table, version)
        protocol = delta.protocol()
        readers, writers = protocol.reader_features or [], protocol.writer_features or []
        vectors = deletion_vectors(table, version) if "deletionVectors" in readers else {}
        # delta-spark's rule: the table enables them and its protocol has the feature. Not
        # done here (copy-on-write instead): tables with the change data feed, object stores.
        merge_on_read = (str(configuration.get(DELETION_VECTORS, "")).lower() == "true"
                         and "deletionVectors" in writers and not change_data
                         and not is_object_store(table))
        return cls(spark, table, location, version, files.schema_json,
                   list(files.partition_columns), {f.path: f for f in files.files},
                   with_vectors=frozenset(vectors), read_vectors=vectors,
                   merge_on_read=merge_on_read,
                   mapping=ColumnMapping(files.schema_json) if mapped else None,
                   max_column_id=mapping_max_column_id(configuration, files.schema_json),
                   change_data=change_data,
                   constraints=table_constraints(configuration), batch_id=batch_id,
                   append_only=str(configuration.get(APPEND_ONLY, "")).lower() == "true",
                   isolation_level=table_isolation_level(configuration),
                   type_widening=type_widening_enabled(configuration)
                   and "typeWidening" in writers)

    # ------------------------------------------------------------------ reading

    def current(self) -> DataFrame:
        """The table as this batch's operations left it, with each row's file in FILE."""
        return self._current_of(self._base())

    def current_listed(self) -> DataFrame | None:
        """``current()`` read from the add actions that the read version's checksum lists:
        Spark plans no scan of the version (no file listing, no statistics job), so its
        reads prune no file by statistics. None when the checksum lists no files."""
        listed = self._scan().listed()
        if listed is None:
            return None
        self._scanned = listed
        return self._current_of(self._with_evolved(self._scan().rows(list(listed.values()))))

    def _current_of(self, base: DataFrame) -> DataFrame:
        """``current()`` from ``base``, the rows of the version read."""
        columns = base.columns
        frame = base.select(*columns, F.col("_metadata.file_path").alias(FILE),
                            *self._row_index())
        if self.base_replaced:  # an overwrite of the batch: no row of the version read stays
            frame = frame.where(F.lit(False))
        elif self.removed_as_read:
            frame = frame.where(~F.col(FILE).isin(sorted(self.removed_as_read)))
        frame = self._without_kept_rows(frame, self.kept_as_read.values())
        by_folder: dict[str, list[str]] = {}
        for path, folder in self.added_folders.items():
            by_folder.setdefault(folder, []).append(path)
        for folder, paths in sorted(by_folder.items()):
            frame = frame.unionByName(self._written(base, folder, paths))
        return frame

    def rows_of(self, touched: Sequence[str]) -> DataFrame:
        """The current rows of exactly the files ``touched`` (``_metadata.file_path`` values
        from ``current()``), with FILE, in ``current()``'s columns: only those files are read
        (``sparkside.file_scan``), so a rewrite costs the files it rewrites."""
        columns = self.columns()  # the table's, as the scans below name them
        of_base = [p for p in touched if self._relative(p) not in self.added]
        of_batch = [p for p in touched if self._relative(p) in self.added]
        frame = None
        if of_base:
            frame = self._with_evolved(self._scan().rows(self._add_actions(of_base))).select(
                *columns, F.col("_metadata.file_path").alias(FILE), *self._row_index())
            frame = self._without_kept_rows(frame, of_base)
        by_folder: dict[str, list[str]] = {}
        for spark_path in of_batch:
            path = self._relative(spark_path)
            by_folder.setdefault(self.added_folders[path], []).append(path)
        base = self._base() if by_folder else None
        for folder, paths in sorted(by_folder.items()):
            written = self._written(base, folder, paths)
            frame = written if frame is None else frame.unionByName(written)
        if frame is None:  # nothing touched: no rows, the same columns
            return self.current().limit(0)
        return frame

    def _written(self, base: DataFrame, folder: str, paths: list[str]) -> DataFrame:
        """The rows of files this batch wrote into ``folder`` (``paths`` relative to the table
        root, as written: escaped partition values stay escaped), in ``base``'s columns, with
        FILE (a column-mapped table's files are read by physical name)."""
        reader = self.spark.read.option("basePath", spark_uri(folder))
        # a Hadoop path names its file literally (no '%' decoded), so the written path is
        # appended to the table's Spark path as it is, never decoded as a URI would be
        root = spark_uri(self.table).rstrip("/")
        files = [f"{root}/{p}" for p in sorted(paths)]
        extra = [F.col("_metadata.file_path").alias(FILE), *self._row_index()]
        if self.mapping is None:
            written = reader.schema(base.schema).parquet(*files)
            return written.select(*base.columns, *extra)
        read = reader.schema(self.mapping.physical_struct()).parquet(*files)
        return self.mapping.read_frame(read, *extra).select(
            *base.columns, FILE, *([ROW_INDEX] if self.merge_on_read else []))

    def _row_index(self) -> list[Column]:
        """The ROW_INDEX column of a read, on a merge-on-read table (none otherwise)."""
        return [F.col("_metadata.row_index").alias(ROW_INDEX)] if self.merge_on_read else []

    def _without_kept_rows(self, frame: DataFrame, files: Iterable[str]) -> DataFrame:
        """``frame`` without the rows the batch's deletion vectors so far delete from
        ``files`` (``_metadata.file_path`` values; those of no kept file are ignored)."""
        by_path = {self.kept_as_read[p]: p for p in self.kept_as_read}
        vectors = {spark_path: stored_descriptor(self.kept[by_path[spark_path]])
                   for spark_path in set(files) if spark_path in by_path}
        if not vectors:
            return frame
        deleted = deleted_by(self.spark, self.table, FILE, vectors)
        return frame.join(deleted, [FILE, ROW_INDEX], "left_anti").select(*frame.columns)

    def _base(self) -> DataFrame:
        """The table at ``read_version``, with the columns this batch added (null)."""
        return self._with_evolved(read_table_version(self.spark, self.table, self.read_version))

    def _with_evolved(self, frame: DataFrame) -> DataFrame:
        """``frame`` (rows read in the table's schema before this batch evolved it) in the
        evolved schema: new columns null, new nested fields null, widened types cast."""
        if not self.schema_evolved:
            return frame
        have = {f.name: f.dataType for f in frame.schema.fields}
        changes: dict[str, Column] = {}
        for column in json.loads(self.schema_json)["fields"]:
            name, column_type = column["name"], column["type"]
            wanted = spark_type(column_type)
            found = have.get(name)
            if found is None:
                changes[name] = F.lit(None).cast(wanted)
            elif found.simpleString() != wanted.simpleString():
                quoted = F.col("`" + name.replace("`", "``") + "`")
                changes[name] = by_name(quoted, found, column_type).cast(wanted)
        return frame.withColumns(changes) if changes else frame

    def evolve(self, source_json: str) -> None:
        """Merges the source columns of ``source_json`` (``merge_evolution``) into the table's
        schema as delta-spark's MERGE schema evolution does: new columns and nested fields
        (null in the rows written before), widened types (with ``delta.typeChanges``, on a
        table with type widening), other types kept; committed with the batch's write."""
        if self.mapping is None:
            evolved = merged_schema(self.schema_json, source_json,
                                    type_widening=self.type_widening, implicit_conversions=True)
            mapping = None
        else:  # new ids above maxColumnId and physical names, as delta-spark assigns them
            mapping = ColumnMapping.with_new_columns(
                self.schema_json, self.max_column_id, source_json,
                type_widening=self.type_widening, implicit_conversions=True)
            evolved = mapping.schema_json
        self._take_schema(evolved, mapping)

    def merge_write_schema(self, write_schema_json: str) -> None:
        """A ``txn.write(..., merge_schema=True)`` of the batch: its new columns (ids and
        physical names already assigned from this state, ``ColumnMapping.evolved``) and
        widened types join the table's schema, as its apply would merge them."""
        evolved = merged_schema(self.schema_json, write_schema_json,
                                column_mapping=self.mapping is not None,
                                type_widening=self.type_widening)
        self._take_schema(evolved, None if self.mapping is None else ColumnMapping(evolved))

    def _take_schema(self, evolved: str, mapping: ColumnMapping | None) -> None:
        if json.loads(evolved) == json.loads(self.schema_json):
            return
        self.schema_json = evolved
        self.schema_evolved = True
        if mapping is not None:
            self.mapping = mapping
            self.max_column_id = mapping_max_column_id(
                {MAX_COLUMN_ID: str(self.max_column_id)}, self.schema_json)

    def _scan(self) -> FileScan:
        if self._file_scan is None:
            self._file_scan = FileScan.at(self.spark, self.table, self.read_version)
        return self._file_scan

    def _add_actions(self, touched: Sequence[str]) -> list[Any]:
        """The add actions of ``read_version`` of the files ``touched`` (all of them, or
        AssertionError: the scan and the log disagree)."""
        spellings = {}
        listed = []  # from the scan that found them, when it listed every one
        for spark_path in touched:
            relative = self._relative(spark_path)
            segments = relative.count("/") + 1  # the log's (URI-encoded) spelling, and ours
            raw = "/".join(urlparse(spark_path).path.split("/")[-segments:])
            # percolake's own adds spell the path as log_path does (non-ASCII encoded, which
            # Spark's file paths leave as is)
            spellings.update({raw: relative, relative: relative, log_path(relative): relative})
            add = self._scanned.get(raw) or self._scanned.get(relative) \
                or self._scanned.get(log_path(relative))
            if add is not None:
                listed.append(add)
        actions = listed if len(listed) == len(touched) else \
            self._scan().add_actions(spellings)
        found = {spellings[a.path()] for a in actions}
        missing = {self._relative(p) for p in touched} - found
        if missing:
            raise AssertionError(f"table {self.table} at version {self.read_version} has no "
                                 f"add action for {sorted(missing)[:3]}, which Spark read")
        return actions

    def note_scan(self, frame: DataFrame) -> None:
        """``frame``, just executed, found the files an operation touches: the add actions its
        scan listed are looked up there (no Spark job) when the rewrite reads them."""
        found = self._scan().scanned(frame)
        if found:  # else the listing of an earlier read of the version stays (same actions)
            self._scanned = found

    def layout_after(self, layout: TableLayout | None) -> TableLayout | None:
        """``layout`` (the table's latest) with the schema this batch's operations left, so a
        later ``txn.write`` of the batch is shaped, checked and column-mapped against the
        table as it will find it (columns a MERGE added, their mapping ids)."""
        if layout is None:
            return None
        return layout._replace(schema_json=self.schema_json, max_column_id=self.max_column_id)

    def columns(self) -> list[str]:
        return [f["name"] for f in json.loads(self.schema_json)["fields"]]

    # ------------------------------------------------------------------ writing

    def start(self) -> None:
        """Marks the start of an operation (its time metrics count from here)."""
        self.started = time.monotonic()
        self.operation_reads = []

    def note_read(self, frame: DataFrame) -> None:
        """The running operation read the table by ``frame`` (a job over ``current()``): its
        read predicate is the partition filters delta-spark listed the files by. Every job
        of an operation that reads the table's rows beyond the files it replaces must be
        noted; an operation that notes none counts as reading the whole table."""
        self.operation_reads.append(
            read_predicate(frame, self.table, self.read_version, self.partition_by))

    def refuse_removal(self) -> None:
        """delta-spark's refusal of an operation that would remove rows from a
        ``delta.appendOnly`` table: an UPDATE or a DELETE at once, a MERGE once it has found
        target rows to change (one that only inserts is an append there).

        Raises:
            RowLevelWriteRefused: the table only takes appends.
        """
        if self.append_only:
            raise RowLevelWriteRefused(
                "[DELTA_CANNOT_MODIFY_APPEND_ONLY] This table is configured to only allow "
                "appends. If you would like to permit updates or deletes, use 'ALTER TABLE "
                f"delta.`{self.table}` SET TBLPROPERTIES ({APPEND_ONLY}=false)'.")

    def read_whole_table(self) -> None:
        """The batch read the table's rows outside an operation (``toDF()``): every file."""
        self.reads.append(WHOLE_TABLE)

    def replace(self, touched: Sequence[str], output: DataFrame | None, operation: str,
                metrics: dict[str, int], parameters: dict[str, str] | None = None,
                changes: DataFrame | None = None,
                deleted: DataFrame | None = None) -> dict[str, int]:
        """Writes ``output`` (rows in the table's columns) as new files and replaces the files
        ``touched`` (``_metadata.file_path`` values) with them; adds the file and time metrics
        and records the operation's Delta ``parameters``. On a table with the change data
        feed, ``changes`` (``change_rows``) are written as change files; None: the operation's
        changes are the rows of its new files (inserts) and of ``touched`` (deletes), kept
        for ``write_record``.

        A replaced file that carries a deletion vector is removed with it (the apply reads it
        from the log): its visible rows, the ones the rewrite read, are what it writes back.

        Merge-on-read (``deleted`` given: the rows, with FILE and ROW_INDEX, that the
        operation deletes or updates in files of the table, see ``merge_on_read_for``): the
        touched files of the table are not replaced but kept with a deletion vector of those
        rows (``output`` then holds only the new rows and the rows of touched files this batch
        wrote); a file whose every row is deleted is removed.
        """
        if touched:
            self.refuse_removal()
        scanned = time.monotonic()
        folder = f"{self.location}/op{len(self.operations)}"
        if self.change_data and changes is None and touched:  # read before they leave
            self.implied.append(self._as_changes(self.rows_of(touched), DELETE))
        adds: list[AddFileRecord] = []
        if output is not None:
            adds = self._write_checked(output, folder)
            self.added_folders.update({a.path: folder for a in adds})
            self.added.update({a.path: a for a in adds})
        change_files = 0
        if self.change_data and changes is not None:
            change_files = self._write_changes(changes, folder)
        elif self.change_data and adds:
            self._imply_inserts(adds, folder)
        vectors = VectorCounts()
        if deleted is not None:
            vectors = self._keep_with_vectors(write_vectors(
                deleted, FILE, self.table, self._table_relative_folder(folder),
                {path: stored_descriptor(v) for path, v in self.kept.items()}
                | {p: v for p, v in self.read_vectors.items() if p not in self.kept}),
                {self._relative(p): p for p in touched})
        written = time.monotonic()
        removed_files = removed_bytes = 0
        for spark_path in touched:
            path = self._relative(spark_path)
            if path in self.added:  # written by an earlier operation of this batch
                self.added.pop(path)
                self.added_folders.pop(path)
            elif deleted is None:
                file = self.base[path]
                self.removed[path] = RemoveFileRecord(path, file.size,
                                                      dict(file.partition_values))
                self.removed_as_read.add(spark_path)
                removed_files += 1
                removed_bytes += file.size
                vectors.removed += path in self.with_vectors or path in self.kept
                self.kept.pop(path, None)
                self.kept_as_read.pop(path, None)
        # delta-spark counts the files a merge-on-read operation removes whole; its UPDATE
        # counts those given a vector too
        removed_files += vectors.files_removed + (
            vectors.added + vectors.updated if operation == "UPDATE" else 0)
        metrics = {**metrics,
                   **_file_metrics(operation, len(adds), sum(a.size for a in adds),
                                   removed_files, removed_bytes, vectors, change_files),
                   **_time_metrics(operation, self.started or scanned, scanned, written)}
        self.operations.append(operation)
        self.parameters.append(dict(parameters or {}))
        self.reads.append(union(self.operation_reads) if self.operation_reads else WHOLE_TABLE)
        self.operation_reads = []
        self.metrics_update(metrics)
        return metrics

    def _write_checked(self, output: DataFrame, folder: str) -> list[AddFileRecord]:
        """Writes an operation's ``output`` as new files under ``folder``, every row checked
        against the table's rules (NOT NULL, CHECK constraints, generated columns) as the
        executors write it, as delta-spark's commands check theirs.

        Raises:
            ConstraintViolation: a row breaks a rule; the batch fails before its commit.
        """
        rows = checked_rows(output, self.schema_json, self.constraints)
        try:
            return (write_files(rows, self.table, folder, self.partition_by)
                    if self.mapping is None
                    else self.mapping.write(rows, self.table, folder, self.partition_by))
        except Exception as exc:
            violation = violation_of(exc, self.table, self.batch_id)
            if violation is None:
                raise
            raise violation from None

    def merge_on_read_for(self, touched: Sequence[str]) -> bool:
        """Whether an operation touching ``touched`` keeps the table's files with deletion
        vectors: the table enables them and every such file's statistics count its rows (a
        file whose every row goes is removed instead)."""
        if not self.merge_on_read:
            return False
        paths = [self._relative(p) for p in touched]
        return all(self.base[p].stats and "numRecords" in json.loads(self.base[p].stats)
                   for p in paths if p not in self.added)

    def in_batch(self, spark_path: str) -> bool:
        """Whether the file is one this batch wrote (not yet in any Delta version)."""
        return self._relative(spark_path) in self.added

    def in_place(self, touched: Sequence[str]) -> Column:
        """True for the rows (of ``touched``) in files of the table, false for those in files
        this batch wrote: on a merge-on-read operation the former get deletion vectors, the
        latter are rewritten."""
        ours = sorted(p for p in touched if self.in_batch(p))
        return ~F.col(FILE).isin(ours) if ours else F.lit(True)

    def _table_relative_folder(self, folder: str) -> str:
        root = self.table.rstrip("/") + "/"
        if not folder.startswith(root):
            raise AssertionError(f"the attempt's folder {folder} is not in table {self.table}")
        return folder[len(root):]

    def _keep_with_vectors(self, stored: list[StoredVector],
                           as_read: dict[str, str]) -> VectorCounts:
        """Each file of the table with its new deletion vector: kept with it, or removed when
        the vector deletes every row (as delta-spark does). ``as_read``: the touched files'
        ``_metadata.file_path`` in ``current()``, by relative path."""
        counts = VectorCounts()
        for vector in stored:
            path = table_relative(self.table, vector.file)
            spark_path = as_read[path]
            file = self.base[path]
            had_vector = path in self.kept or path in self.read_vectors
            self.removed[path] = RemoveFileRecord(path, file.size, dict(file.partition_values))
            if vector.cardinality >= file.row_count():
                self.kept.pop(path, None)
                self.kept_as_read.pop(path, None)
                self.removed_as_read.add(spark_path)
                counts.files_removed += 1
                counts.removed += had_vector
                continue
            self.kept[path] = DeletionVectorRecord(
                path, vector.vector_path, vector.vector_file_size, vector.offset,
                vector.size_in_bytes, vector.cardinality, file.modification_time,
                _wide_bounds(file.stats))
            self.kept_as_read[path] = spark_path
            counts.updated += had_vector
            counts.added += not had_vector
        return counts

    def include_write(self, write: TableWriteRecord, folder: str) -> None:
        """A ``txn.write`` of the batch (written into ``folder``), in call order: an append
        adds its files; an overwrite replaces the files it overwrites, the version read's and
        the batch's own; ``merge_schema`` evolves the schema (``sparkside.batch_write_plan``).
        Later operations read its result; the batch commits it in its one Delta commit."""
        live = {p: f for p, f in self.base.items() if p not in self.removed or p in self.kept}
        plan = plan_write(write, {} if self.base_replaced else live, self.added,
                          self.schema_json, self.partition_by)
        replaced_base = [self._scan().spark_path(p) for p in plan.removes] \
            if not plan.whole_table else []
        if self.change_data and (plan.removes or plan.drops):  # read before they leave
            replaced = self.current() if plan.whole_table else self.rows_of(
                replaced_base + [self._scan().spark_path(p) for p in plan.drops])
            self.implied.append(self._as_changes(replaced, DELETE))
        for path in plan.removes:
            file = self.base[path]
            self.removed[path] = RemoveFileRecord(path, file.size, dict(file.partition_values))
            self.kept.pop(path, None)  # kept with a vector so far: now removed whole
            self.kept_as_read.pop(path, None)
        self.removed_as_read.update(replaced_base)
        self.base_replaced |= plan.whole_table
        if plan.whole_table:
            self.kept.clear()
            self.kept_as_read.clear()
        for path in plan.drops:
            self.added.pop(path)
            self.added_folders.pop(path)
        if write.merge_schema:
            self.merge_write_schema(write.schema_json)
        if self.change_data and write.add_files:
            self._imply_inserts(write.add_files, folder)
        self.added.update({a.path: a for a in write.add_files})
        self.added_folders.update({a.path: folder for a in write.add_files})
        self.operations.append("WRITE")
        self.parameters.append(plan.parameters)
        self.reads.append(plan.read_predicate)
        self.metrics_update(plan.metrics)

    def metrics_update(self, metrics: dict[str, int]) -> None:
        """Adds an operation's row metrics (observed while its files were written)."""
        for key, value in metrics.items():
            self.metrics[key] = self.metrics.get(key, 0) + value

    def _write_changes(self, changes: DataFrame, folder: str) -> int:
        """Has the executors write ``changes`` as change files under ``folder``'s
        ``_change_data`` (partitioned like the table); returns how many."""
        location = f"{folder}/{CHANGE_FOLDER}"
        # a new row's generated columns as its written row has them (an assigned value is
        # checked to equal its expression there, or the operation failed)
        new_row = F.col(CHANGE_TYPE).isin(UPDATE_POSTIMAGE, INSERT)
        rows = regenerated(changes, [*self.columns(), CHANGE_TYPE], self.schema_json, {
            name: new_row for name in generation_expressions(self.schema_json)})
        written = (write_files(rows, self.table, location, self.partition_by)
                   if self.mapping is None  # else physical names, _change_type as it is
                   else self.mapping.write(rows, self.table, location, self.partition_by,
                                           passthrough=(CHANGE_TYPE,)))
        self.changes.update({a.path: ChangeFileRecord(a.path, a.size, dict(a.partition_values))
                             for a in written})
        return len(written)

    def _imply_inserts(self, adds: Sequence[AddFileRecord], folder: str) -> None:
        paths = [a.path for a in adds]
        self.implied.append(self._as_changes(self._written(self._base(), folder, paths), INSERT))

    def _as_changes(self, rows: DataFrame, change_type: str) -> DataFrame:
        return rows.select(*[c for c in rows.columns if c != FILE],
                           F.lit(change_type).alias(CHANGE_TYPE))

    def _write_implied(self) -> None:
        """A commit with change files is read by change data readers from them alone: the
        changes of operations that wrote none are written as change files too."""
        if not (self.changes and self.implied):
            return
        frames = [self._with_evolved(frame).select(*self.columns(), CHANGE_TYPE)
                  for frame in self.implied]
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        self._write_changes(union, f"{self.location}/implied{self.implied_written}")
        self.implied_written += 1
        self.implied = []

    def write_record(self) -> TableWriteRecord | None:
        """The batch's ROW_LEVEL write intent of the table, None if nothing changed."""
        if not self.added and not self.removed:
            return None
        self._write_implied()
        return TableWriteRecord(
            table=self.table, mode=WriteMode.ROW_LEVEL,
            add_files=tuple(sorted(self.added.values(), key=lambda a: a.path)),
            schema_json=self.schema_json, partition_by=tuple(self.partition_by),
            remove_files=tuple(sorted(self.removed.values(), key=lambda r: r.path)),
            merge_schema=self.schema_evolved,
            read_version=self.read_version, operation=",".join(self.operations),
            operation_metrics=json.dumps({k: str(v) for k, v in sorted(self.metrics.items())},
                                         separators=(",", ":")),
            operation_parameters=json.dumps(self.commit_parameters(), separators=(",", ":")),
            change_files=tuple(sorted(self.changes.values(), key=lambda c: c.path)),
            read_set=ReadSet(self.isolation_level, union(self.reads)).to_json(),
            deletion_vectors=tuple(sorted(self.kept.values(), key=lambda v: v.path)))

    def commit_parameters(self) -> dict[str, str]:
        """The commit's operationParameters: one operation's own (as delta-spark writes
        them); for several, each operation's in call order, under ``operations``."""
        if len(self.operations) == 1:
            return self.parameters[0]
        return {"operations": json.dumps(
            [{"operation": o, "parameters": p}
             for o, p in zip(self.operations, self.parameters, strict=True)],
            separators=(",", ":"))}

    def _relative(self, spark_path: str) -> str:
        path = table_relative(self.table, spark_path)
        if path not in self.added and path not in self.base:
            raise AssertionError(f"Spark read {spark_path}, not a file of {self.table} at "
                                 f"version {self.read_version} nor of this batch")
        return path


@dataclass
class VectorCounts:
    """An operation's deletion vectors, as delta-spark counts them: files that get one
    (added), whose vector grows (updated), removed files that had one (removed); and the
    files a merge-on-read operation removed because every row went."""

    added: int = 0
    updated: int = 0
    removed: int = 0
    files_removed: int = 0


def _wide_bounds(stats: str) -> str:
    """A file's statistics once a deletion vector hides some of its rows: the same, its
    minimum and maximum no longer tight (``tightBounds``), as delta-spark writes them."""
    return json.dumps({**json.loads(stats), "tightBounds": False}, separators=(",", ":"))


def _file_metrics(operation: str, added: int, added_bytes: int, removed: int,
                  removed_bytes: int, vectors: VectorCounts,
                  change_files: int = 0) -> dict[str, int]:
    """Delta's file metrics under the names its operation uses. As delta-spark's history
    shows them, an updated deletion vector counts as one added and one removed too."""
    vectors_added, vectors_removed = vectors.added + vectors.updated, \
        vectors.removed + vectors.updated
    if operation == "MERGE":
        return {"numTargetFilesAdded": added, "numTargetFilesRemoved": removed,
                "numTargetBytesAdded": added_bytes, "numTargetBytesRemoved": removed_bytes,
                "numTargetDeletionVectorsAdded": vectors_added,
                "numTargetDeletionVectorsUpdated": vectors.updated,
                "numTargetDeletionVectorsRemoved": vectors_removed,
                "numTargetChangeFilesAdded": change_files}
    return {"numAddedFiles": added, "numRemovedFiles": removed,
            "numAddedBytes": added_bytes, "numRemovedBytes": removed_bytes,
            "numDeletionVectorsAdded": vectors_added,
            "numDeletionVectorsUpdated": vectors.updated,
            "numDeletionVectorsRemoved": vectors_removed, "numAddedChangeFiles": change_files}


def _time_metrics(operation: str, started: float, scanned: float,
                  written: float) -> dict[str, int]:
    """Delta's time metrics: finding the rows (scan), writing the files (rewrite), both. A
    MERGE's ``materializeSourceTimeMs`` is added by the MERGE (``sparkside.merge_source``)."""
    def ms(seconds: float) -> int:
        return int(seconds * 1000)

    metrics = {"executionTimeMs": ms(written - started), "scanTimeMs": ms(scanned - started),
               "rewriteTimeMs": ms(written - scanned)}
    if operation == "MERGE":
        metrics["materializeSourceTimeMs"] = 0
    return metrics


def change_rows(frame: DataFrame, events: Sequence[tuple[Column, Column, str]]) -> DataFrame:
    """The change data rows of ``frame`` in one pass: for each ``(when, row, change_type)``
    (``row`` a struct of the table's columns), a row of ``row``'s fields and
    ``_change_type`` for each row of ``frame`` where ``when`` holds."""
    each = F.array(*[F.when(when, F.struct(row.alias(_ROW), F.lit(kind).alias(CHANGE_TYPE)))
                     for when, row, kind in events])
    exploded = frame.select(F.explode(each).alias(_EVENT)).where(F.col(_EVENT).isNotNull())
    event = F.col(_EVENT)
    names = [f.name for f in exploded.schema[_EVENT].dataType[_ROW].dataType.fields]
    return exploded.select(*[event[_ROW][n].alias(n) for n in names],
                           event[CHANGE_TYPE].alias(CHANGE_TYPE))


def observed(observation: Observation) -> dict[str, int]:
    """An observation's counts (0 for a metric that saw no row); {} when Spark removed the
    observed plan (e.g. the side of a join with an empty table): the action then hands the
    observation an empty row, which ``Observation.get`` cannot read."""
    if observation._jo.getRow().size() == 0:  # noqa: SLF001 - PySpark has no public check
        return {}
    return {k: int(v or 0) for k, v in observation.get.items()}


class RowLevelWrites:
    """The row-level tables of one batch: each table's state is read once, at its first
    operation, after the attempt declared (holds) it."""

    def __init__(self, spark: SparkSession | None, declare: Callable[[str, str], str],
                 batch_id: int, txn_id: str) -> None:
        self._spark = spark
        self._declare = declare  # (table as given, canonical) -> the attempt's folder
        self.batch_id = batch_id
        self.marker = f"{SPARK_WRITE_MARK}{txn_id}"
        self.tables: dict[str, RowLevelTable] = {}
        self.written: dict[str, int] = {}  # tables of txn.write: their version seen then
        self.write_folders: dict[str, str] = {}  # tables of txn.write: where it writes
        self.included: set[str] = set()  # tables whose txn.write joined their state
        self.started_ms = int(time.time() * 1000)  # before the function runs

    def state(self, table: str, canonical: str) -> RowLevelTable:
        if canonical not in self.tables:
            if self._spark is None:
                raise ValueError("this BatchTransaction has no SparkSession to write with")
            if self.written.get(canonical) == -1:
                raise RowLevelWriteRefused(
                    f"table {table} does not exist before batch {self.batch_id}, whose "
                    "txn.write creates it: txn.delta_table needs a table that exists when the "
                    "batch starts. Create it in an earlier batch (or with CREATE TABLE ... "
                    "USING DELTA), or compute the rows before the batch's one txn.write")
            location = self._declare(table, canonical)
            self.tables[canonical] = RowLevelTable.read(self._spark, canonical, location,
                                                        self.batch_id)
        return self.tables[canonical]

    def records(self) -> list[TableWriteRecord]:
        """The batch's ROW_LEVEL write intents, one per table that changed, in first-use
        order."""
        return [r for r in (t.write_record() for t in self.tables.values()) if r is not None]

    def note_write(self, table: str, seen_version: int, folder: str) -> None:
        """``txn.write`` writes ``table`` into ``folder``; the table's latest version was
        ``seen_version`` (-1: none) when it was called."""
        self.written.setdefault(table, seen_version)
        self.write_folders[table] = folder

    def includes_write(self, table: str) -> bool:
        return table in self.included

    def include_write(self, record: TableWriteRecord) -> None:
        """The batch's ``txn.write`` of a table it also writes row by row (an append, an
        overwrite, with or without ``merge_schema``) joins the table's state, in call order:
        later operations see its result, and it commits in the same ROW_LEVEL write (one Delta
        commit)."""
        self.tables[record.table].include_write(record, self.write_folders[record.table])
        self.included.add(record.table)

    def refuse_spark_writes(self) -> None:
        """Point 4 of docs/row-level-writes.md: a delta-spark write made inside the function
        to a table the batch writes committed on its own, outside the batch. Its commit
        carries ``marker`` (``marked_spark_writes``): the tables written row by row are
        searched after their read version; those written with ``txn.write`` after the
        version seen then and, backwards, down to the first commit older than the
        function."""
        for table, state in self.tables.items():
            self._refuse_marked(table, log_entries_after(table, state.read_version))
        for table, seen in self.written.items():
            self._refuse_marked(table, log_entries_after(table, seen))
            self._refuse_marked(table, self._entries_since_start(table, seen))

    def _entries_since_start(self, table: str, version: int
                             ) -> Iterator[tuple[int, list[dict] | None]]:
        """The entries at ``version`` and before, newest first, while they were committed
        after the function started (a marked commit is stamped by this driver's clock)."""
        while version >= 0:
            entry = next(log_entries_after(table, version - 1), None)
            if entry is None or entry[0] != version:
                return
            info = next((a["commitInfo"] for a in entry[1] or () if "commitInfo" in a), {})
            if int(info.get("timestamp", 0)) < self.started_ms:
                return
            yield entry
            version -= 1

    def _refuse_marked(self, table: str, entries: Iterable[tuple[int, list[dict] | None]]
                       ) -> None:
        for version, actions in entries:
            info = next((a["commitInfo"] for a in actions or () if "commitInfo" in a), {})
            if info.get("userMetadata") == self.marker:
                raise RowLevelWriteRefused(
                    f"table {table}: a delta-spark {info.get('operation', 'write')} made "
                    f"inside batch {self.batch_id}'s function committed version {version} "
                    "on its own, outside the batch's transaction (it is not undone if the "
                    "batch fails, and a replay repeats it). Write the table through "
                    f"txn.delta_table({table!r}) (merge, update, delete) or txn.write "
                    "(appends, overwrites) instead.")


@contextmanager
def marked_spark_writes(spark: SparkSession, marker: str) -> Iterator[None]:
    """delta-spark commits made by ``spark`` meanwhile carry ``marker`` as their commitInfo's
    userMetadata (unless the user set one), so ``refuse_spark_writes`` can recognise them."""
    conf = spark.conf
    if conf.get(USER_METADATA_KEY, None):
        yield
        return
    conf.set(USER_METADATA_KEY, marker)
    try:
        yield
    finally:
        conf.unset(USER_METADATA_KEY)
