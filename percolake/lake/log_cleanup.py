"""Deleting a table's expired Delta log entries (docs/checkpoints.md), as delta-spark does after
a checkpoint, but never past a version someone still reads.

An entry is expired when its file is older than the table's ``delta.logRetentionDuration``
(default ``interval 30 days``; ``delta.enableExpiredLogCleanup=false`` turns cleanup off).
Only whole versions go, oldest first, and only below a complete checkpoint at or below
``keep_from``: every version from that checkpoint on stays readable (the checkpoint plus the
entries after it), so time travel to ``keep_from`` or later works on. What ``keep_from`` is
(leases, downstream ranges, the coordinator's time-travel floor) is the coordinator's
decision (``coordinator.core.log_retention``); nothing here knows leases.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from percolake.lake import storage
from percolake.lake.warehouse import is_object_store, local_path

DEFAULT_LOG_RETENTION = "interval 30 days"
RETENTION_KEY = "delta.logRetentionDuration"
CLEANUP_KEY = "delta.enableExpiredLogCleanup"
_NEVER = 2**62  # a modification time later than any cutoff
_UNIT_MS = {"microsecond": 0.001, "millisecond": 1, "second": 1000, "minute": 60_000,
            "hour": 3_600_000, "day": 86_400_000, "week": 7 * 86_400_000}
_INTERVAL_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+?)s?\b")
# <version>.json, .crc, .checkpoint.parquet, .checkpoint.<part>.<parts>.parquet
_LOG_FILE = re.compile(
    r"^(\d{20})\.(json|crc|checkpoint\.parquet|checkpoint\.(\d+)\.(\d+)\.parquet)$")


def log_retention_ms(configuration: Mapping[str, str | None]) -> int:
    """The table's ``delta.logRetentionDuration`` in ms (Delta's ``interval <n> <unit>``).

    Raises:
        ValueError: a duration Delta would not accept either (named).
    """
    text = configuration.get(RETENTION_KEY) or DEFAULT_LOG_RETENTION
    retention = interval_ms(text)
    if retention is None:
        raise ValueError(f"{RETENTION_KEY} {text!r} is not a duration such as "
                         f"{DEFAULT_LOG_RETENTION!r}")
    return retention


def interval_ms(text: str) -> int | None:
    """A Delta table property's duration (``interval 30 days``, ``interval 1 week 12 hours``)
    in ms, rounded up; None if it is not one."""
    body = text.strip().lower().removeprefix("interval").strip()
    parts = _INTERVAL_PART.findall(body)
    if not parts or _INTERVAL_PART.sub("", body).strip() \
            or any(unit not in _UNIT_MS for _, unit in parts):
        return None
    return math.ceil(sum(float(amount) * _UNIT_MS[unit] for amount, unit in parts))


def cleanup_enabled(configuration: Mapping[str, str | None]) -> bool:
    return str(configuration.get(CLEANUP_KEY, "true")).lower() != "false"


def expired_entries(table_uri: str, keep_from: int, retention_ms: int,
                    now_ms: int | None = None) -> list[str]:
    """The log files cleanup may delete now, oldest version first (names in ``_delta_log``).

    ``keep_from``: the oldest version that must stay readable.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    cutoff_ms = now_ms - retention_ms
    by_version: dict[int, list[tuple[str, int]]] = {}
    parts: dict[tuple[int, int], set[int]] = {}
    for name, mtime_ms in log_listing(table_uri).items():
        match = _LOG_FILE.match(name)
        if match is None:
            continue  # _last_checkpoint, staged uploads, compactions: never touched
        version = int(match.group(1))
        by_version.setdefault(version, []).append((name, mtime_ms))
        if match.group(3) is not None:
            parts.setdefault((version, int(match.group(4))), set()).add(int(match.group(3)))
    complete = {v for v, files in by_version.items()
                if any(n.endswith(".checkpoint.parquet") for n, _ in files)}
    complete |= {v for (v, total), seen in parts.items() if len(seen) == total}
    boundary = max((v for v in complete if v <= keep_from), default=None)
    if boundary is None:
        return []
    expired: list[str] = []
    for version in sorted(v for v in by_version if v < boundary):
        files = by_version[version]
        if any(mtime > cutoff_ms for _, mtime in files):
            break  # only a prefix goes: the log never has a hole
        expired.extend(sorted(n for n, _ in files))
    return expired


def clean_log(table_uri: str, keep_from: int, configuration: Mapping[str, str | None],
              now_ms: int | None = None) -> list[str]:
    """Deletes the table's expired log entries below the newest checkpoint at or below
    ``keep_from`` (module doc), oldest first. Returns the names deleted."""
    if not cleanup_enabled(configuration):
        return []
    expired = expired_entries(table_uri, keep_from, log_retention_ms(configuration), now_ms)
    if not expired:
        return expired
    if is_object_store(table_uri):
        storage.delete_objects(table_uri, [f"_delta_log/{name}" for name in expired])
        return expired
    log_dir = Path(local_path(table_uri)) / "_delta_log"
    for name in expired:
        try:
            os.unlink(log_dir / name)
        except FileNotFoundError:
            continue
    return expired


def log_listing(table_uri: str) -> dict[str, int]:
    """Every file of the table's ``_delta_log`` -> its modification time in ms."""
    if is_object_store(table_uri):
        listed = storage.list_files(f"{table_uri.rstrip('/')}/_delta_log")
        # an object without a modification time never counts as expired
        return {name: _NEVER if mtime_ns is None else mtime_ns // 1_000_000
                for name, (_, mtime_ns) in listed.items() if "/" not in name}
    found: dict[str, int] = {}
    try:
        with os.scandir(Path(local_path(table_uri)) / "_delta_log") as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    found[entry.name] = entry.stat(follow_symlinks=False).st_mtime_ns // 1_000_000
    except FileNotFoundError:
        pass
    return found
