"""Errors the Spark side raises; each names what happened and what to do."""

from __future__ import annotations

import re


class PercolakeError(RuntimeError):
    """Base class of every percolake error on the Spark side."""


class CoordinatorUnavailable(PercolakeError):
    """The coordinator did not answer within the retry budget; nothing was guessed."""


class CommitOutcomeUnknown(CoordinatorUnavailable):
    """The commit request may or may not have been decided; a replay of the batch finds out."""


class BatchRefused(PercolakeError):
    """FAILED_PRECONDITION: fenced driver, another query id, or a state that forbids the call."""


class WriteConflict(PercolakeError):
    """A table stayed held by another live transaction."""


class TransactionAborted(PercolakeError):
    """The attempt was aborted (timeout, newer attempt); Spark's retry of the batch starts anew."""


class RowLevelConflict(TransactionAborted):
    """A commit made outside percolake conflicts with a MERGE, UPDATE or DELETE of the batch
    (docs/row-level-writes.md); the participant retries the batch from a fresh read."""


class InvalidRequest(PercolakeError):
    """The coordinator refused the request as malformed, outside the warehouse, or too large."""


class SchemaMismatch(PercolakeError):
    """The batch's schema does not fit the existing table; nothing was written."""


class UnsupportedTableFeature(PercolakeError):
    """The table requires a Delta feature percolake cannot write; nothing was declared or
    written (docs/delta-features.md)."""


class TableNotWritten(PercolakeError):
    """The table has no committed write at or before the snapshot."""


class ObjectStoreNotConfigured(PercolakeError):
    """The SparkSession cannot reach the object store: Hadoop's S3 connector is missing."""


class NotAppendOnly(PercolakeError):
    """A change the percolake source cannot stream (a version that removed rows); a table
    written by overwrite is read whole in the batch with ``txn.read(table)``."""


class ConstraintViolation(PercolakeError):
    """A row of the batch breaks a NOT NULL, CHECK or generated-column rule of its table (the
    message names the rule and the row's values, as delta-spark's), or the batch lacks a NOT
    NULL column (raised by ``txn.write``); nothing was committed."""


class UnknownTable(PercolakeError):
    """A table name that is neither a path nor a table of the session's catalog."""


class UpstreamSchemaChanged(PercolakeError):
    """An upstream table of the percolake source gained columns since the query started."""


class RowLevelWriteRefused(PercolakeError):
    """A MERGE, UPDATE or DELETE that percolake cannot make exactly (no table, a table feature
    it does not support, files with deletion vectors, a delta-spark write inside the batch)."""


class MultipleSourceRowsMatch(PercolakeError):
    """delta-spark's DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE: several source rows
    matched one target row of a MERGE whose matched clauses could act on it ambiguously."""

    ERROR_CLASS = "DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE"

    def getErrorClass(self) -> str:  # noqa: N802 - PySpark's name for it
        return self.ERROR_CLASS


class MergeClauseError(PercolakeError, ValueError):
    """A MERGE's clauses that delta-spark refuses too (e.g. a clause without a condition
    before another of its kind); its message starts with delta-spark's error class."""

    def getCondition(self) -> str | None:  # noqa: N802 - PySpark's name for it
        """delta-spark's error class, as its ``AnalysisException.getCondition()`` gives it."""
        found = re.match(r"\[([A-Z_.]+)\]", str(self))
        return found.group(1) if found else None
