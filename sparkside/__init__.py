"""percolake's Spark side: the participant that wraps ``foreachBatch``, the consistent reader
and the percolake streaming source.

Names are imported on first use: Spark's Python workers import ``sparkside.source`` (the
streaming source) without the participant, whose Delta commits load delta-rs, which must not
run in a forked worker.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "BatchRefused": "sparkside.errors",
    "CommitOutcomeUnknown": "sparkside.errors",
    "ConstraintViolation": "sparkside.errors",
    "CoordinatorUnavailable": "sparkside.errors",
    "NotAppendOnly": "sparkside.errors",
    "PercolakeError": "sparkside.errors",
    "SchemaMismatch": "sparkside.errors",
    "TableNotWritten": "sparkside.errors",
    "TransactionAborted": "sparkside.errors",
    "UnsupportedTableFeature": "sparkside.errors",
    "UnknownTable": "sparkside.errors",
    "UpstreamSchemaChanged": "sparkside.errors",
    "WriteConflict": "sparkside.errors",
    "BatchTransaction": "sparkside.participant",
    "Participant": "sparkside.participant",
    "ConsistentReader": "sparkside.reader",
    "Snapshot": "sparkside.reader",
    "register": "sparkside.source",
    "resolve_table": "sparkside.catalog",
    "configure_spark": "sparkside.session",
    "local_spark": "sparkside.session",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sparkside' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
