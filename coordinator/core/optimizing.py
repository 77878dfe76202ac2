"""The pipeline of ``percolake-coordinator optimize`` (docs/operations.md): compactions run as
ordinary transactions of ``percolake.optimize``, which owns no table (lineage: a compaction
does not make it a table's writer, and it may compact any pipeline's table) and may commit
nothing but writes that only rearrange rows (``OPTIMIZE``, ``data_change=False``)."""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.validation import REARRANGING_OPERATION
from percolake.errors import InvalidArgument
from percolake.records import TableWriteRecord, WriteMode

OPTIMIZE_PIPELINE = "percolake.optimize"


def check_optimize_writes(pipeline_id: str, writes: Iterable[TableWriteRecord]) -> None:
    """Refuses any write but a rearrangement in a transaction of the optimize pipeline."""
    if pipeline_id != OPTIMIZE_PIPELINE:
        return
    for write in writes:
        if write.mode != WriteMode.ROW_LEVEL or write.operation != REARRANGING_OPERATION:
            raise InvalidArgument(
                f"pipeline {OPTIMIZE_PIPELINE!r} owns no table and commits only compactions "
                f"(ROW_LEVEL {REARRANGING_OPERATION} writes); table {write.table} got a "
                f"{write.mode.value} {write.operation or ''} write")
