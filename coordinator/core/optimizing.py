"""The pipelines of ``percolake-coordinator optimize`` (docs/operations.md): the compactions of
a table run as ordinary transactions of its own pipeline ``percolake.optimize.<hash of the
table>`` (its batches number that table's compactions), which owns no table (lineage: a
compaction does not make it a table's writer, and it may compact any pipeline's table) and may
commit nothing but writes that only rearrange rows (``OPTIMIZE``, ``data_change=False``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from coordinator.validation import REARRANGING_OPERATION
from percolake.errors import InvalidArgument
from percolake.records import TableWriteRecord, WriteMode

OPTIMIZE_PIPELINE_PREFIX = "percolake.optimize."


def optimize_pipeline(canonical_table: str) -> str:
    """The pipeline of the compactions of the table (one per table: their batch ids)."""
    return OPTIMIZE_PIPELINE_PREFIX + hashlib.sha256(canonical_table.encode()).hexdigest()[:16]


def is_optimize_pipeline(pipeline_id: str) -> bool:
    return pipeline_id.startswith(OPTIMIZE_PIPELINE_PREFIX)


def check_optimize_writes(pipeline_id: str, writes: Iterable[TableWriteRecord]) -> None:
    """Refuses any write but a rearrangement in a transaction of the optimize pipeline."""
    if not is_optimize_pipeline(pipeline_id):
        return
    for write in writes:
        if write.mode != WriteMode.ROW_LEVEL or write.operation != REARRANGING_OPERATION:
            raise InvalidArgument(
                f"pipeline {pipeline_id!r} owns no table and commits only compactions "
                f"(ROW_LEVEL {REARRANGING_OPERATION} writes); table {write.table} got a "
                f"{write.mode.value} {write.operation or ''} write")
