"""percolake's Spark side: the participant that wraps ``foreachBatch`` and the consistent reader."""

from sparkside.errors import (
    BatchRefused,
    CommitOutcomeUnknown,
    CoordinatorUnavailable,
    PercolakeError,
    SchemaMismatch,
    TableNotWritten,
    TransactionAborted,
    WriteConflict,
)
from sparkside.participant import BatchTransaction, Participant
from sparkside.reader import ConsistentReader, Snapshot
from sparkside.session import configure_spark, local_spark

__all__ = [
    "BatchRefused", "BatchTransaction", "CommitOutcomeUnknown", "ConsistentReader",
    "CoordinatorUnavailable", "Participant", "PercolakeError", "SchemaMismatch", "Snapshot",
    "TableNotWritten", "TransactionAborted", "WriteConflict", "configure_spark", "local_spark",
]
