"""Checking a batch's schema against its Delta table before any file is written.

Loading a table's log with delta-rs costs tens of milliseconds, once per table per batch, while
a table's schema almost never changes. Each table's schema and partition columns are kept with
the name of the newest commit file they were read at; a directory listing tells whether the
table moved since, and only then is the log loaded again.
"""

from __future__ import annotations

from coordinator.delta_commit import describe_schema_mismatch, newest_log_entry, table_layout
from sparkside.errors import SchemaMismatch

Layout = tuple[str, list[str]]


class SchemaChecker:
    """Refuses a write that does not fit its table; remembers each table's layout per version."""

    def __init__(self) -> None:
        self._layouts: dict[str, tuple[str, Layout]] = {}

    def layout(self, table: str) -> Layout | None:
        """The table's current (schema JSON, partition columns), None if it does not exist."""
        newest = newest_log_entry(table)
        if newest is None:
            self._layouts.pop(table, None)
            return None
        cached = self._layouts.get(table)
        if cached is not None and cached[0] == newest:
            return cached[1]
        layout = table_layout(table)
        if layout is not None:
            self._layouts[table] = (newest, layout)
        return layout

    def check(self, table: str, schema_json: str, partition_by: list[str], mode: str,
              batch_id: int) -> list[str]:
        """The partition columns the write uses.

        Raises:
            SchemaMismatch: the batch's columns or partitioning do not fit the table.
            ValueError: ``overwrite_partitions`` of an unpartitioned or new unpartitioned table.
        """
        layout = self.layout(table)
        if layout is None:
            if mode == "overwrite_partitions" and not partition_by:
                raise ValueError(f"overwrite_partitions of new table {table} needs partition_by")
            return partition_by
        existing_schema, current = layout
        problem = describe_schema_mismatch(existing_schema, schema_json, partition_by, current)
        if problem:
            raise SchemaMismatch(f"batch {batch_id} does not fit table {table}: {problem}. "
                                 "Nothing was written.")
        if mode == "overwrite_partitions" and not current:
            raise ValueError(f"overwrite_partitions needs a partitioned table; {table} is not")
        return current
