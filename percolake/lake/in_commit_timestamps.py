"""In-commit timestamps (the ``inCommitTimestamp`` writer feature) on the log entries percolake
writes itself, as delta-spark 4.4.0 writes them.

While a table has the feature and ``delta.enableInCommitTimestamps=true``, every commit's first
action is its ``commitInfo`` and carries ``inCommitTimestamp``: the commit's time in ms, above
the previous commit's (the commit after a clock step back takes the previous one's plus 1).
delta-spark sets the ``commitInfo``'s ``timestamp`` to the same value; readers take a
version's time from it (``DESCRIBE HISTORY``, ``timestampAsOf``) instead of the entry's file
modification time. The enablement properties (``delta.inCommitTimestampEnablementVersion``
and ``...Timestamp``) belong to the commit that turns the feature on, which is delta-spark's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from percolake.lake.table_cache import read_entry

FEATURE = "inCommitTimestamp"
ENABLED_KEY = "delta.enableInCommitTimestamps"


def required(writer_features: list[str] | None, configuration: Mapping[str, str | None]) -> bool:
    """Whether each commit to a table with these writer features and configuration needs an
    in-commit timestamp."""
    return FEATURE in (writer_features or ()) and \
        str(configuration.get(ENABLED_KEY)).lower() == "true"


def previous_timestamp(table_uri: str, version: int) -> int | None:
    """The ``inCommitTimestamp`` of ``version``'s commit, None without one (or no entry)."""
    entry = read_entry(table_uri, version)
    if not entry:
        return None
    for line in entry.decode().splitlines():
        if '"commitInfo"' in line:
            value = json.loads(line)["commitInfo"].get("inCommitTimestamp")
            return int(value) if value is not None else None
    return None


def stamped(entry: list[dict[str, Any]], previous: int | None, now_ms: int) -> list[dict[str, Any]]:
    """``entry`` with its ``commitInfo`` first, carrying the in-commit timestamp that follows
    ``previous`` (the previous commit's) at ``now_ms``."""
    infos = [a for a in entry if "commitInfo" in a]
    if len(infos) != 1:
        raise ValueError(f"a log entry needs one commitInfo for its in-commit timestamp, "
                         f"not {len(infos)}")
    stamp = now_ms if previous is None else max(now_ms, previous + 1)
    info = {"inCommitTimestamp": stamp,
            **{k: v for k, v in infos[0]["commitInfo"].items() if k != "inCommitTimestamp"},
            "timestamp": stamp}
    return [{"commitInfo": info}, *(a for a in entry if "commitInfo" not in a)]
