"""Checking a batch's schema against its Delta table before any file is written.

Loading a table's log with delta-rs costs tens of milliseconds, once per table per batch, while
a table's schema almost never changes. Each table's layout is kept with the version it was read
at; the commit files after it (usually just the previous batch's own) are read, and only if one
carries a ``metaData`` action (a schema or partitioning change), or the cached version's file is
gone, is the log loaded again.
"""

from __future__ import annotations

from pathlib import Path

from percolake.lake.delta_commit import (
    TableLayout,
    commit_file,
    describe_schema_mismatch,
    table_layout,
)
from sparkside.errors import SchemaMismatch


class SchemaChecker:
    """Refuses a write that does not fit its table; remembers each table's layout per version."""

    def __init__(self) -> None:
        self._layouts: dict[str, TableLayout] = {}

    def layout(self, table: str) -> TableLayout | None:
        """The table's current layout, None if it does not exist."""
        cached = self._layouts.get(table)
        if cached is None:
            if not commit_file(table, 0).parent.is_dir():
                return None
        elif commit_file(table, cached.version).exists():
            version = cached.version
            while not _changes_metadata(commit_file(table, version + 1)):
                version += 1
            if not commit_file(table, version + 1).exists():  # no newer commit changed it
                self._layouts[table] = cached._replace(version=version)
                return self._layouts[table]
        layout = table_layout(table)
        if layout is None:
            self._layouts.pop(table, None)
        else:
            self._layouts[table] = layout
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
        current = layout.partition_columns
        problem = describe_schema_mismatch(layout.schema_json, schema_json, partition_by, current)
        if problem:
            raise SchemaMismatch(f"batch {batch_id} does not fit table {table}: {problem}. "
                                 "Nothing was written.")
        if mode == "overwrite_partitions" and not current:
            raise ValueError(f"overwrite_partitions needs a partitioned table; {table} is not")
        return current


def _changes_metadata(commit: Path) -> bool:
    """Whether a commit may change the layout: it has a ``metaData`` action or cannot be read
    (no such version yet included, which ends the scan)."""
    try:
        return '"metaData"' in commit.read_text()
    except OSError:
        return True
