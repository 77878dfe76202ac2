"""Checking a batch's schema against its Delta table before any file is written.

The participant's early refusal, so that a batch that cannot fit its table (its columns, or a
table feature percolake cannot write, ``table_features``) writes no file; the
coordinator checks the write again before the commit point (``percolake.lake.write_check``).
Layouts come from the shared ``LayoutCache``: a table's log is loaded once per version that
changed its schema or partitioning, not once per batch. ``BatchLayouts`` reads each table's
layout once per batch, the tables declared at Open side by side as soon as it returns: on an
object store one round trip for the batch, not a few per table.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from threading import Lock

from percolake.lake.delta_commit import TableLayout, describe_schema_mismatch
from percolake.lake.table_features import refusal
from percolake.lake.write_check import LayoutCache, merge_problem
from sparkside.errors import SchemaMismatch, UnsupportedTableFeature

LAYOUT_READERS = 8  # tables whose layouts are read at once


class SchemaChecker:
    """Refuses a write that does not fit its table; remembers each table's layout per version."""

    def __init__(self) -> None:
        self._layouts = LayoutCache()
        self._pool: ThreadPoolExecutor | None = None
        self._lock = Lock()

    def layout(self, table: str) -> TableLayout | None:
        """The table's current layout, None if it does not exist."""
        return self._layouts.get(table)

    def for_batch(self, tables: list[str]) -> BatchLayouts:
        """The layouts one batch uses, ``tables`` (those declared at Open) being read now, side
        by side in the background."""
        if not tables:
            return BatchLayouts(self, {})
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=LAYOUT_READERS,
                                                thread_name_prefix="percolake-layout")
            pool = self._pool
        return BatchLayouts(self, {table: pool.submit(self.layout, table) for table in tables})

    def check_features(self, table: str) -> TableLayout | None:
        """The table's layout, once its protocol is one percolake can write.

        Raises:
            UnsupportedTableFeature: a feature percolake cannot write (named, with what to do).
        """
        return refuse_features(table, self.layout(table))

    def check(self, table: str, schema_json: str, partition_by: list[str], mode: str,
              batch_id: int, merge_schema: bool = False) -> list[str]:
        """``check_layout`` against the table's current layout."""
        return check_layout(self.layout(table), table, schema_json, partition_by, mode,
                            batch_id, merge_schema)


class BatchLayouts:
    """Each table's layout as one batch sees it, read at most once for the batch (the write's
    feature check, its shaping and its schema check all use that one)."""

    def __init__(self, checker: SchemaChecker,
                 reading: dict[str, Future[TableLayout | None]]) -> None:
        self._checker = checker
        self._reading = reading

    def get(self, table: str) -> TableLayout | None:
        """The table's layout read for this batch (now, if it was not read at Open).

        Raises:
            whatever reading the layout raised (the object store, delta-rs).
        """
        reading = self._reading.get(table)
        if reading is not None:
            return reading.result()
        return self.fresh(table)

    def fresh(self, table: str) -> TableLayout | None:
        """The table's layout read now, kept for the rest of the batch."""
        done: Future[TableLayout | None] = Future()
        try:
            done.set_result(self._checker.layout(table))
        except Exception as exc:
            done.set_exception(exc)
        self._reading[table] = done
        return done.result()


def refuse_features(table: str, layout: TableLayout | None) -> TableLayout | None:
    """``layout``, once its protocol is one percolake can write.

    Raises:
        UnsupportedTableFeature: a feature percolake cannot write (named, with what to do).
    """
    if layout is not None:
        refused = refusal(table, layout.protocol)
        if refused:
            raise UnsupportedTableFeature(f"{refused}. Nothing was written.")
    return layout


def check_layout(layout: TableLayout | None, table: str, schema_json: str,
                 partition_by: list[str], mode: str, batch_id: int,
                 merge_schema: bool = False) -> list[str]:
    """The partition columns the write uses (the table's when ``partition_by`` is empty),
    ``layout`` being the table's (None: it does not exist). With ``merge_schema`` the batch may
    have columns the table lacks, as the coordinator's check allows (``merge_problem``).

    Raises:
        SchemaMismatch: the batch's columns or partitioning do not fit the table.
        ValueError: ``overwrite_partitions`` of an unpartitioned or new unpartitioned table.
    """
    if layout is None:
        if mode == "overwrite_partitions" and not partition_by:
            raise ValueError(f"overwrite_partitions of new table {table} needs partition_by")
        return partition_by
    current = layout.partition_columns
    if merge_schema:
        problem = merge_problem(layout, schema_json, tuple(partition_by or current))
    else:
        problem = describe_schema_mismatch(layout.schema_json, schema_json,
                                           partition_by or None, current, layout.type_widening)
    if problem:
        raise SchemaMismatch(f"batch {batch_id} does not fit table {table}: {problem}. "
                             "Nothing was written.")
    if mode == "overwrite_partitions" and not current:
        raise ValueError(f"overwrite_partitions needs a partitioned table; {table} is not")
    return current
