"""Conversion between protobuf messages and the coordinator's records. No logic here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from percolake.errors import InvalidArgument
from percolake.records import (
    AddFileRecord,
    ChangeFileRecord,
    DeletionVectorRecord,
    PipelineRecord,
    RemoveFileRecord,
    TableEntry,
    TableWriteRecord,
    TxnRecord,
    WriteMode,
)
from percolake.states import TxnState
from percolake.v1 import coordinator_pb2 as pb

_MODE_TO_PB = {
    WriteMode.APPEND: pb.APPEND,
    WriteMode.OVERWRITE: pb.OVERWRITE,
    WriteMode.OVERWRITE_PARTITIONS: pb.OVERWRITE_PARTITIONS,
    WriteMode.ROW_LEVEL: pb.ROW_LEVEL,
}
_MODE_FROM_PB = {v: k for k, v in _MODE_TO_PB.items()}
_MODE_FROM_PB[pb.WRITE_MODE_UNSPECIFIED] = WriteMode.APPEND
_STATE_TO_PB = {s: pb.TransactionState.Value(s.value) for s in TxnState}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}
INT64_MAX = 2**63 - 1


def int64(value: int) -> int:
    """A count the codec computes (a sum), saturated to int64: validation bounds every sum a
    write can make, so this only ever guards records stored before those bounds existed, whose
    replies must still be answered (a replay must learn that its batch committed)."""
    return max(-INT64_MAX - 1, min(value, INT64_MAX))


def state_to_pb(state: TxnState) -> int:
    return _STATE_TO_PB[state]


def state_from_pb(value: int) -> TxnState:
    if value not in _STATE_FROM_PB:
        raise InvalidArgument(f"unknown transaction state {value}")
    return _STATE_FROM_PB[value]


def _partition_values(values: Mapping[str, str],
                      nulls: Sequence[str]) -> dict[str, str | None]:
    """A file's partition values from the message's map and its null columns (one copy)."""
    # an unpartitioned table's files send an empty map: no copy through the Mapping protocol
    merged: dict[str, str | None] = dict(values) if len(values) else {}
    if not nulls:  # the usual case: nothing to check
        return merged
    overlap = set(merged) & set(nulls)
    if overlap:
        raise InvalidArgument(f"partition columns {sorted(overlap)} are both null and valued")
    merged.update(dict.fromkeys(nulls))
    return merged


def _partition_fields(values: dict[str, str | None]) -> tuple[dict[str, str], list[str]]:
    return ({k: v for k, v in values.items() if v is not None},
            sorted(k for k, v in values.items() if v is None))


def table_write_from_pb(msg: pb.TableWrite) -> TableWriteRecord:
    if msg.mode not in _MODE_FROM_PB:
        raise InvalidArgument(f"table {msg.table}: unknown write mode {msg.mode}")
    return TableWriteRecord(
        table=msg.table,
        mode=_MODE_FROM_PB[msg.mode],
        add_files=tuple(
            AddFileRecord(
                path=f.path, size=f.size,
                partition_values=_partition_values(f.partition_values,
                                                   f.null_partition_columns),
                modification_time=f.modification_time, stats=f.stats,
            )
            for f in msg.add_files
        ),
        schema_json=msg.schema_json,
        partition_by=tuple(msg.partition_by),
        replace_partitions=tuple(_partition_values(p.values, p.null_columns)
                                 for p in msg.replace_partitions),
        merge_schema=msg.merge_schema,
        catalog_name=msg.catalog_name,
        remove_files=tuple(
            RemoveFileRecord(path=f.path, size=f.size,
                             partition_values=_partition_values(f.partition_values,
                                                                f.null_partition_columns))
            for f in msg.remove_files),
        read_version=msg.read_version if msg.mode == pb.ROW_LEVEL else -1,
        operation=msg.operation,
        operation_metrics=msg.operation_metrics,
        data_change=not (msg.mode == pb.ROW_LEVEL and msg.rearranges_only),
        operation_parameters=msg.operation_parameters,
        change_files=tuple(
            ChangeFileRecord(path=f.path, size=f.size,
                             partition_values=_partition_values(dict(f.partition_values),
                                                                list(f.null_partition_columns)))
            for f in msg.change_files),
        read_set=msg.read_set if msg.mode == pb.ROW_LEVEL else "",
        deletion_vectors=tuple(
            DeletionVectorRecord(path=v.path, vector_path=v.vector_path,
                                 vector_file_size=v.vector_file_size, offset=v.offset,
                                 size_in_bytes=v.size_in_bytes, cardinality=v.cardinality,
                                 modification_time=v.modification_time, stats=v.stats)
            for v in msg.deletion_vectors),
    )


def table_write_to_pb(write: TableWriteRecord) -> pb.TableWrite:
    msg = pb.TableWrite(table=write.table, mode=_MODE_TO_PB[write.mode],
                        schema_json=write.schema_json, partition_by=list(write.partition_by),
                        merge_schema=write.merge_schema, catalog_name=write.catalog_name)
    for f in write.add_files:
        values, nulls = _partition_fields(f.partition_values)
        msg.add_files.add(path=f.path, size=f.size, partition_values=values,
                          null_partition_columns=nulls, modification_time=f.modification_time,
                          stats=f.stats)
    for spec in write.replace_partitions:
        values, nulls = _partition_fields(spec)
        msg.replace_partitions.add(values=values, null_columns=nulls)
    for f in write.remove_files:
        values, nulls = _partition_fields(f.partition_values)
        msg.remove_files.add(path=f.path, size=f.size, partition_values=values,
                             null_partition_columns=nulls)
    if write.mode == WriteMode.ROW_LEVEL:
        msg.read_version = write.read_version
        msg.operation = write.operation
        msg.operation_metrics = write.operation_metrics
        msg.rearranges_only = not write.data_change
        msg.operation_parameters = write.operation_parameters
        msg.read_set = write.read_set
    for f in write.change_files:
        values, nulls = _partition_fields(f.partition_values)
        msg.change_files.add(path=f.path, size=f.size, partition_values=values,
                             null_partition_columns=nulls)
    for v in write.deletion_vectors:
        msg.deletion_vectors.add(path=v.path, vector_path=v.vector_path,
                                 vector_file_size=v.vector_file_size, offset=v.offset,
                                 size_in_bytes=v.size_in_bytes, cardinality=v.cardinality,
                                 modification_time=v.modification_time, stats=v.stats)
    return msg


def _participant_to_pb(entry: TableEntry, include_writes: bool,
                       msg: pb.TableParticipant) -> None:
    """Fills ``msg`` (added in place to its transaction: no copy of a built message)."""
    msg.table = entry.table
    msg.write_location = entry.write_location
    msg.prewritten = entry.prewritten
    msg.applied = entry.applied
    msg.delta_version = entry.delta_version or 0
    msg.abandoned = entry.abandoned
    if entry.write is not None:
        msg.catalog_name = entry.write.catalog_name
        msg.mode = _MODE_TO_PB[entry.write.mode]
        msg.file_count = len(entry.write.add_files)
        msg.row_count = int64(entry.write.row_count())
        if include_writes:
            msg.write.CopyFrom(table_write_to_pb(entry.write))


def txn_to_pb(txn: TxnRecord, include_writes: bool = False) -> pb.Transaction:
    msg = pb.Transaction(
        txn_id=txn.txn_id, pipeline_id=txn.pipeline_id, generation=txn.generation,
        batch_id=txn.batch_id, attempt=txn.attempt, state=_STATE_TO_PB[txn.state],
        start_ts=txn.start_ts, commit_ts=txn.commit_ts,
        epoch=txn.epoch, abort_reason=txn.abort_reason, created_unix_ms=txn.created_ms,
        updated_unix_ms=txn.updated_ms, query_id=txn.query_id, principal=txn.principal,
        input_barrier=txn.input_barrier, source_offsets=txn.source_offsets,
    )
    for entry in txn.tables.values():
        _participant_to_pb(entry, include_writes, msg.participants.add())
    return msg


def locations_to_pb(txn: TxnRecord) -> list[pb.TableLocation]:
    return [pb.TableLocation(table=e.table, write_location=e.write_location)
            for e in txn.tables.values()]


def pipeline_to_pb(pipeline: PipelineRecord) -> pb.Pipeline:
    return pb.Pipeline(
        pipeline_id=pipeline.pipeline_id, generation=pipeline.generation, epoch=pipeline.epoch,
        query_id=pipeline.query_id, created_unix_ms=pipeline.created_ms,
        last_commit_unix_ms=pipeline.last_commit_ms,
        resets=[pb.PipelineReset(from_generation=r.from_generation,
                                 to_generation=r.to_generation, reason=r.reason,
                                 reset_unix_ms=r.reset_ms, previous_query_id=r.previous_query_id,
                                 bound_query_id=r.bound_query_id)
                for r in pipeline.resets],
    )


def optional(msg, field: str):  # noqa: ANN001, ANN201 - any message, any scalar
    """The value of an ``optional`` proto3 field, or None when absent."""
    return getattr(msg, field) if msg.HasField(field) else None
