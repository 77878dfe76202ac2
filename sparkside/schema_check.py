"""Checking a batch's schema against its Delta table before any file is written.

The participant's early refusal, so that a batch that cannot fit its table (its columns, or a
table feature percolake cannot write, ``table_features``) writes no file; the
coordinator checks the write again before the commit point (``percolake.lake.write_check``).
Layouts come from the shared ``LayoutCache``: a table's log is loaded once per version that
changed its schema or partitioning, not once per batch.
"""

from __future__ import annotations

from percolake.lake.delta_commit import TableLayout, describe_schema_mismatch
from percolake.lake.table_features import refusal
from percolake.lake.write_check import LayoutCache, merge_problem
from sparkside.errors import SchemaMismatch, UnsupportedTableFeature


class SchemaChecker:
    """Refuses a write that does not fit its table; remembers each table's layout per version."""

    def __init__(self) -> None:
        self._layouts = LayoutCache()

    def layout(self, table: str) -> TableLayout | None:
        """The table's current layout, None if it does not exist."""
        return self._layouts.get(table)

    def check_features(self, table: str) -> TableLayout | None:
        """The table's layout, once its protocol is one percolake can write.

        Raises:
            UnsupportedTableFeature: a feature percolake cannot write (named, with what to do).
        """
        layout = self.layout(table)
        if layout is not None:
            refused = refusal(table, layout.protocol)
            if refused:
                raise UnsupportedTableFeature(f"{refused}. Nothing was written.")
        return layout

    def check(self, table: str, schema_json: str, partition_by: list[str], mode: str,
              batch_id: int, merge_schema: bool = False) -> list[str]:
        """The partition columns the write uses (the table's when ``partition_by`` is empty).
        With ``merge_schema`` the batch may have columns the table lacks, as the coordinator's
        check allows (``merge_problem``).

        Raises:
            SchemaMismatch: the batch's columns or partitioning do not fit the table.
            ValueError: ``overwrite_partitions`` of an unpartitioned or new unpartitioned table.
        """
        layout = self.layout(table)
        if layout is None:
            if mode == "overwrite_partitions" and not partition_by:
                raise ValueError(f"overwrite_partitions of new table {table} needs partition_by")
            return partition_by
        current = layout.partition_columns
        if merge_schema:
            problem = merge_problem(layout, schema_json, tuple(partition_by or current))
        else:
            problem = describe_schema_mismatch(layout.schema_json, schema_json,
                                               partition_by or None, current)
        if problem:
            raise SchemaMismatch(f"batch {batch_id} does not fit table {table}: {problem}. "
                                 "Nothing was written.")
        if mode == "overwrite_partitions" and not current:
            raise ValueError(f"overwrite_partitions needs a partitioned table; {table} is not")
        return current
