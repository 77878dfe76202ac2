"""Compaction of a Delta table's small files as a row-level write that only rearranges rows
(``percolake-coordinator optimize``, docs/operations.md): the plan (which files, grouped by
partition), the rewrite of each group into one file with pyarrow (local disk or S3), and the
write intent (``ROW_LEVEL``, operation ``OPTIMIZE``, ``data_change=False``). No Spark, no
delta-rs writer: the coordinator commits the intent like any transaction's.

On a table with deletion vectors, as delta-spark's OPTIMIZE does, the rewrite leaves out the
rows a file's vector deletes (``deleted_rows``), a file with a vector is a candidate even when it
is large, and its remove carries the vector (``row_level_entry``); a file left alone (the only
candidate of its partition) keeps its vector, as in delta-spark.

Only partition predicates select what is compacted (``partition_filter``): ``col = 'v'``,
``!=``/``<>``, ``<``, ``<=``, ``>``, ``>=``, ``col IN ('a', 'b')``, ``col IS NULL``,
``col IS NOT NULL``, joined by ``AND``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.lake import storage
from percolake.lake.defaults import DEFAULT_TARGET_SIZE
from percolake.lake.deleted_rows import deleted_rows
from percolake.lake.deletion_vectors import DeletionVector, deletion_vectors
from percolake.lake.delta_commit import TableLayout, files_of_version, table_layout
from percolake.lake.parquet_stats import delta_stats
from percolake.lake.warehouse import is_object_store, local_path
from percolake.records import (
    AddFileRecord,
    PartitionValues,
    RemoveFileRecord,
    TableWriteRecord,
    WriteMode,
)

OPERATION = "OPTIMIZE"
# features whose files pyarrow cannot rewrite faithfully: row ids
REFUSED_FEATURES = ("rowTracking",)
_CONDITION = re.compile(
    r"^\s*`?(?P<column>[A-Za-z_][A-Za-z0-9_]*)`?\s*(?:"
    r"(?P<op>=|==|!=|<>|<=|>=|<|>)\s*(?P<value>'(?:[^']|'')*'|-?\d+(?:\.\d+)?)"
    r"|(?P<not>NOT\s+)?IN\s*\((?P<values>[^)]*)\)"
    r"|IS\s+(?P<isnot>NOT\s+)?NULL)\s*$", re.IGNORECASE)
_AND = re.compile(r"\s+AND\s+", re.IGNORECASE)
_NUMERIC = {"byte", "short", "integer", "long", "float", "double"}

Condition = Callable[[PartitionValues], bool]


@dataclass(frozen=True)
class Plan:
    """What one compaction rewrites: groups of small files, each becoming one file."""

    version: int
    layout: TableLayout
    groups: tuple[tuple[AddFileRecord, ...], ...]
    considered: int  # files in the selected partitions
    partitions: int  # partitions with at least one group
    vectors: Mapping[str, DeletionVector] = field(default_factory=dict)  # files' vectors

    @property
    def removed(self) -> list[AddFileRecord]:
        return [f for group in self.groups for f in group]


def partition_filter(predicate: str, layout: TableLayout) -> Condition:
    """The partitions ``predicate`` selects, as a test of a file's partition values.

    Raises:
        InvalidArgument: not a conjunction of the supported conditions on partition columns.
    """
    types = {f["name"]: f["type"] for f in json.loads(layout.schema_json)["fields"]}
    tests: list[Condition] = []
    for part in _AND.split(predicate.strip()):
        match = _CONDITION.match(part)
        if match is None:
            raise InvalidArgument(
                f"--where {predicate!r}: {part!r} is not a partition condition; use column = "
                "'value', != <> < <= > >=, IN ('a', 'b'), IS [NOT] NULL, joined by AND")
        column = match["column"]
        if column not in layout.partition_columns:
            raise InvalidArgument(
                f"--where {predicate!r}: {column!r} is not a partition column of the table "
                f"(its partition columns: {', '.join(layout.partition_columns) or 'none'}); "
                "only partition predicates select what optimize compacts")
        tests.append(_test(column, match, types.get(column, "string")))
    return lambda values: all(test(values) for test in tests)


def _test(column: str, match: re.Match[str], delta_type: object) -> Condition:
    numeric = isinstance(delta_type, str) and delta_type in _NUMERIC

    def typed(text: str | None) -> object:
        if text is None:
            return None
        return float(text) if numeric else text

    if match["isnot"] is not None or match["op"] is None and match["values"] is None:
        wants_null = match["isnot"] is None
        return lambda values: (values.get(column) is None) == wants_null
    if match["values"] is not None:
        items = {typed(_literal(v)) for v in re.findall(r"'(?:[^']|'')*'|-?\d+(?:\.\d+)?",
                                                       match["values"])}
        negated = match["not"] is not None
        return lambda values: values.get(column) is not None and (
            (typed(values.get(column)) in items) != negated)
    wanted, op = typed(_literal(match["value"])), match["op"]
    compare = {"=": lambda a, b: a == b, "==": lambda a, b: a == b,
               "!=": lambda a, b: a != b, "<>": lambda a, b: a != b,
               "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
               ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}[op]
    return lambda values: values.get(column) is not None and compare(
        typed(values.get(column)), wanted)


def _literal(text: str) -> str:
    return text[1:-1].replace("''", "'") if text.startswith("'") else text


def check_where(table_uri: str, where: str) -> None:
    """Refuses a ``where`` that is not a partition predicate of the table as it is now.

    Raises:
        InvalidArgument: not a partition predicate. FailedPrecondition: no such table.
    """
    layout = table_layout(table_uri)
    if layout is None:
        raise FailedPrecondition(f"{table_uri} is not a Delta table")
    partition_filter(where, layout)


def plan(table_uri: str, where: str = "", target_size: int = DEFAULT_TARGET_SIZE) -> Plan:
    """Groups the table's files smaller than ``target_size`` by partition (of those ``where``
    selects) and packs each partition's into groups of at most ``target_size`` bytes; a
    group of one file is left alone.

    Raises:
        FailedPrecondition: no such table, or one whose files pyarrow cannot rewrite.
        InvalidArgument: ``where`` is not a partition predicate.
    """
    layout = table_layout(table_uri)
    if layout is None:
        raise FailedPrecondition(f"{table_uri} is not a Delta table")
    refused = [f for f in REFUSED_FEATURES if layout.protocol.has(f)]
    if refused:
        raise FailedPrecondition(
            f"table {table_uri} has the table feature(s) {', '.join(refused)}: optimize "
            "rewrites files with pyarrow, which would not keep them; use delta-spark's OPTIMIZE "
            "with no percolake transaction running on the table")
    selects = partition_filter(where, layout) if where.strip() else (lambda values: True)
    vectors = deletion_vectors(table_uri, layout.version) \
        if layout.protocol.has("deletionVectors") else {}
    by_partition: dict[tuple, list[AddFileRecord]] = {}
    considered = 0
    for file in files_of_version(table_uri, layout.version).files:
        if not selects(file.partition_values):
            continue
        considered += 1
        if file.size < target_size or file.path in vectors:
            key = tuple(sorted(file.partition_values.items(), key=lambda kv: kv[0]))
            by_partition.setdefault(key, []).append(file)
    groups: list[tuple[AddFileRecord, ...]] = []
    partitions = 0
    for files in by_partition.values():
        packed = [g for g in _pack(sorted(files, key=lambda f: f.path), target_size)
                  if len(g) > 1]
        partitions += bool(packed)
        groups.extend(packed)
    return Plan(layout.version, layout, tuple(groups), considered, partitions, vectors)


def _pack(files: Sequence[AddFileRecord], target_size: int) -> list[tuple[AddFileRecord, ...]]:
    groups: list[list[AddFileRecord]] = [[]]
    size = 0
    for file in files:
        if groups[-1] and size + file.size > target_size:
            groups.append([])
            size = 0
        groups[-1].append(file)
        size += file.size
    return [tuple(g) for g in groups if g]


def table_filesystem(table_uri: str) -> pafs.FileSystem:
    """The table's root as an Arrow filesystem: paths relative to the table."""
    if is_object_store(table_uri):
        return pafs.SubTreeFileSystem(storage.arrow_path(table_uri), storage.s3_filesystem())
    return pafs.SubTreeFileSystem(str(local_path(table_uri)), pafs.LocalFileSystem())


def concat_widened(tables: Sequence[pa.Table]) -> pa.Table:
    """The rows of ``tables`` (one partition's files) in one table. A column that Delta's type
    widening widened (``delta.typeChanges``) is narrower in the files written before the
    change; each takes the widest type the files hold, as delta-spark's OPTIMIZE writes the
    wider type: integers, floats and decimals by Arrow's permissive promotion, a date by the
    timestamp (``timestamp_ntz``) another file has for it."""
    stamps = {f.name: f.type for t in tables for f in t.schema if pa.types.is_timestamp(f.type)}
    tables = [t.cast(pa.schema([f.with_type(stamps[f.name])
                                if pa.types.is_date(f.type) and f.name in stamps else f
                                for f in t.schema], t.schema.metadata))
              for t in tables]
    return pa.concat_tables(tables, promote_options="permissive")


def rewrite(table_uri: str, compaction: Plan, attempt_folder: str,
            where: str = "") -> TableWriteRecord:
    """Writes each group's rows (without those deletion vectors delete) into one new file
    under ``attempt_folder`` (relative to the table: the transaction's write location) and
    returns the write intent that swaps them.
    """
    files = table_filesystem(table_uri)
    local = not is_object_store(table_uri)
    adds: list[AddFileRecord] = []
    for group in compaction.groups:
        rows = concat_widened([_visible_rows(table_uri, files, f, compaction.vectors)
                               for f in group])
        values = dict(group[0].partition_values)
        path = f"{attempt_folder}/optimize/part-{uuid.uuid4().hex}.parquet"
        if local:  # an object store has no folders (Arrow would put marker objects)
            files.create_dir(path.rsplit("/", 1)[0], recursive=True)
        collector: list[pq.FileMetaData] = []
        with files.open_output_stream(path) as sink:
            pq.write_table(rows, sink, coerce_timestamps="us", allow_truncated_timestamps=False,
                           metadata_collector=collector)
            size = sink.tell()
        adds.append(AddFileRecord(path, size, values, int(time.time() * 1000),
                                  json.dumps(delta_stats(collector[0]))))
    removed = compaction.removed
    metrics = {"numFilesAdded": str(len(adds)), "numFilesRemoved": str(len(removed)),
               "numAddedBytes": str(sum(a.size for a in adds)),
               "numRemovedBytes": str(sum(f.size for f in removed)),
               "partitionsOptimized": str(compaction.partitions),
               "totalConsideredFiles": str(compaction.considered),
               "totalFilesSkipped": str(compaction.considered - len(removed)),
               "numBatches": str(len(compaction.groups)),
               # delta-spark's OPTIMIZE names (DESCRIBE HISTORY), beside the ones above
               "numAddedFiles": str(len(adds)), "numRemovedFiles": str(len(removed)),
               "numDeletionVectorsRemoved": str(sum(f.path in compaction.vectors
                                                    for f in removed)),
               **_size_percentiles([a.size for a in adds])}
    return TableWriteRecord(
        table_uri, WriteMode.ROW_LEVEL, tuple(adds), compaction.layout.schema_json,
        tuple(compaction.layout.partition_columns),
        remove_files=tuple(RemoveFileRecord(f.path, f.size, dict(f.partition_values))
                           for f in removed),
        read_version=compaction.version, operation=OPERATION,
        operation_metrics=json.dumps(metrics), data_change=False,
        operation_parameters=json.dumps(parameters(where)))


def parameters(where: str) -> dict[str, str]:
    """The operationParameters delta-spark's OPTIMIZE writes: its predicate (the ``--where``
    text, a JSON list; ``[]`` without one), not automatic, no Z-order or clustering columns."""
    return {"predicate": json.dumps([where.strip()] if where.strip() else []),
            "auto": "false", "zOrderBy": "[]", "clusterBy": "[]"}


def _size_percentiles(sizes: list[int]) -> dict[str, str]:
    """delta-spark's OPTIMIZE file-size metrics of the files it added."""
    if not sizes:
        return {}
    ordered = sorted(sizes)

    def at(fraction: float) -> str:
        return str(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))])

    return {"minFileSize": str(ordered[0]), "p25FileSize": at(0.25), "p50FileSize": at(0.5),
            "p75FileSize": at(0.75), "maxFileSize": str(ordered[-1])}



def _visible_rows(table_uri: str, files: pafs.FileSystem, file: AddFileRecord,
                  vectors: Mapping[str, DeletionVector]) -> pa.Table:
    """A data file's rows, without those its deletion vector (if any) deletes."""
    with files.open_input_file(file.path) as source:
        rows = pq.read_table(source)
    vector = vectors.get(file.path)
    if vector is None:
        return rows
    keep = np.ones(rows.num_rows, dtype=bool)
    keep[deleted_rows(table_uri, vector)] = False
    return rows.filter(pa.array(keep))
