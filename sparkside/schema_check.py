"""Checking a batch's schema against its Delta table before any file is written.

Loading a table's log with delta-rs costs tens of milliseconds, once per table per batch, while
a table's schema almost never changes. Each table's schema and partition columns are kept with
the newest commit file they are known to hold at. A directory listing shows the commits made
since (the previous batch's own, usually); only if one of them carries a ``metaData`` action
(a schema or partitioning change), or cannot be read, is the log loaded again.
"""

from __future__ import annotations

from pathlib import Path

from coordinator.delta_commit import describe_schema_mismatch, table_layout
from coordinator.warehouse import local_path
from sparkside.errors import SchemaMismatch

Layout = tuple[str, list[str]]


class SchemaChecker:
    """Refuses a write that does not fit its table; remembers each table's layout per version."""

    def __init__(self) -> None:
        self._layouts: dict[str, tuple[str, Layout]] = {}

    def layout(self, table: str) -> Layout | None:
        """The table's current (schema JSON, partition columns), None if it does not exist."""
        log_dir = Path(local_path(table)) / "_delta_log"
        commits = _commit_files(log_dir)
        if not commits:
            self._layouts.pop(table, None)
            return None
        newest = commits[-1]
        cached = self._layouts.get(table)
        if cached is not None and cached[0] in commits:
            since = commits[commits.index(cached[0]) + 1:]
            if not any(_changes_metadata(log_dir / name) for name in since):
                self._layouts[table] = (newest, cached[1])
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


def _commit_files(log_dir: Path) -> list[str]:
    """The table's commit file names (``<20 digits>.json``), oldest first; [] if none."""
    try:
        names = [p.name for p in log_dir.iterdir()]
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(".json") and n[:-5].isdigit())


def _changes_metadata(commit_file: Path) -> bool:
    """Whether a commit may change the layout (a ``metaData`` action, or unreadable)."""
    try:
        text = commit_file.read_text()
    except OSError:
        return True
    return '"metaData"' in text
