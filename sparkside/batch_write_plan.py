"""What a batch's ``txn.write`` of a table does to the table's row-level state, when the batch
also writes the table with ``txn.delta_table`` (docs/row-level-writes.md).

The writes of one table in one batch run in call order and become one Delta commit, so a
``txn.write`` among MERGE, UPDATE and DELETE calls is one more operation on the table as the
batch's earlier operations left it, as delta-spark's writer would find it one version later:

- an append adds its files and reads nothing;
- an overwrite replaces every file: those of the version read that are still live, and those
  the batch's earlier operations wrote (never committed then); it reads the whole table;
- a partition overwrite replaces the files of the partitions its rows fall in, compared as
  typed values as the apply compares them; it reads those partitions;
- ``merge_schema`` adds the write's new columns to the state's schema (the caller does it).

The plan has no I/O: which files go, the read predicate, and the operation's Delta parameters
and metrics, under the names delta-spark's ``WRITE`` uses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from percolake.lake.partition_values import typed_partition_value
from percolake.lake.read_set import WHOLE_TABLE, Predicate, union
from percolake.records import AddFileRecord, PartitionValues, TableWriteRecord, WriteMode

PartitionKey = tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class WritePlan:
    """One ``txn.write`` as an operation of the table's row-level state."""

    removes: tuple[str, ...]  # files of the version read (relative paths) the write replaces
    drops: tuple[str, ...]  # files the batch wrote before that the write replaces
    whole_table: bool  # an overwrite: nothing of the table as it was stays
    read_predicate: Predicate  # what the write read (False: nothing, an append)
    parameters: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, int] = field(default_factory=dict)


def plan_write(write: TableWriteRecord, live_base: Mapping[str, AddFileRecord],
               added: Mapping[str, AddFileRecord], schema_json: str,
               partition_by: list[str]) -> WritePlan:
    """The plan of ``write`` on a table whose live files are ``live_base`` (of the version
    read, not yet replaced by the batch) and ``added`` (written by the batch's earlier
    operations), in the table's ``schema_json`` and ``partition_by``."""
    whole = write.mode == WriteMode.OVERWRITE
    if write.mode == WriteMode.OVERWRITE_PARTITIONS:
        types = partition_types(schema_json, partition_by)
        replaced = {partition_key(p, types) for p in write.replace_partitions}
        removes = tuple(sorted(p for p, f in live_base.items()
                               if partition_key(f.partition_values, types) in replaced))
        drops = tuple(sorted(p for p, f in added.items()
                             if partition_key(f.partition_values, types) in replaced))
        read = partitions_predicate(write.replace_partitions, partition_by)
    elif whole:
        removes, drops, read = tuple(sorted(live_base)), tuple(sorted(added)), WHOLE_TABLE
    else:
        removes, drops, read = (), (), False
    parameters = {"mode": "Append" if write.mode == WriteMode.APPEND else "Overwrite",
                  "partitionBy": json.dumps(list(partition_by))}
    if write.mode == WriteMode.OVERWRITE_PARTITIONS:
        parameters["isDynamicPartitionOverwrite"] = "true"
    if write.merge_schema:
        parameters["canMergeSchema"] = "true"
    metrics = {"numFiles": len(write.add_files),
               "numOutputRows": sum(a.row_count() for a in write.add_files),
               "numOutputBytes": sum(a.size for a in write.add_files)}
    if write.mode != WriteMode.APPEND:  # as the batch's earlier operations count removes
        metrics.update(numRemovedFiles=len(removes),
                       numRemovedBytes=sum(live_base[p].size for p in removes))
    return WritePlan(removes, drops, whole, read, parameters, metrics)


def partition_types(schema_json: str, partition_by: list[str]) -> dict[str, str]:
    """The Delta type name of each partition column (``"string"`` for one not found)."""
    fields = {f["name"]: f["type"] for f in json.loads(schema_json)["fields"]}
    return {c: fields[c] if isinstance(fields.get(c), str) else "string" for c in partition_by}


def partition_key(values: PartitionValues, types: Mapping[str, str]) -> PartitionKey:
    """A hashable, typed form of one file's partition values, equal for equal partitions
    (Delta: an empty string is null)."""
    return tuple(sorted((column, typed_partition_value(None if value == "" else value,
                                                       types.get(column, "string")))
                        for column, value in values.items()))


def partitions_predicate(partitions: tuple[PartitionValues, ...],
                         partition_by: list[str]) -> Predicate:
    """A read predicate selecting exactly the files of ``partitions`` (False for none)."""
    terms: list[Predicate] = []
    for values in partitions:
        equal = [{"column": c, "op": "<=>", "value": None if values.get(c) == ""
                  else values.get(c)} for c in partition_by]
        terms.append(equal[0] if len(equal) == 1 else {"and": equal})
    return union(terms)
