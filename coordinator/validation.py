"""Input checks shared by every request: precise, actionable InvalidArgument messages."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter

from percolake.errors import InvalidArgument, ResourceExhausted
from percolake.lake.warehouse import ATTEMPT_DIR
from percolake.records import TableWriteRecord, WriteMode

MAX_ID_LENGTH = 256
MAX_TABLES = 1000
INT64_MAX = 2**63 - 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_id(name: str, value: str) -> None:
    if not value or not value.strip():
        raise InvalidArgument(f"{name} must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"{name} is {len(value)} characters long; at most {MAX_ID_LENGTH}")
    if _CONTROL.search(value) or value != value.strip():
        raise InvalidArgument(f"{name} {value!r} has control characters or surrounding blanks")


def check_text(name: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise InvalidArgument(f"{name} is {len(value)} characters long; at most {limit}")


def check_non_negative(name: str, value: int) -> None:
    if value < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {value}")


def check_epoch(epoch: int | None) -> None:
    if epoch is not None and epoch < 0:
        raise InvalidArgument(f"epoch must be >= 0, got {epoch}")


def check_query_id(query_id: str | None) -> None:
    """A Spark streaming query id, when present, is a UUID."""
    if query_id is None:
        return
    try:
        uuid.UUID(query_id)
    except ValueError:
        raise InvalidArgument(
            f"query_id {query_id[:80]!r} is not a Spark query id (a UUID such as "
            "'c0ffee00-1234-4abc-8def-0123456789ab'); omit it or send the streaming query's id"
        ) from None


def check_table_write(write: TableWriteRecord, txn_id: str, max_bytes: int) -> None:
    """Checks one write intent: files inside the attempt's location, consistent partitions."""
    if not isinstance(write.mode, WriteMode):
        raise InvalidArgument(f"table {write.table}: unknown write mode {write.mode!r}")
    try:
        schema = json.loads(write.schema_json)
    except ValueError as exc:
        raise InvalidArgument(f"table {write.table}: schema_json is not JSON ({exc})") from None
    if not isinstance(schema, dict) or not schema.get("fields"):
        raise InvalidArgument(f"table {write.table}: schema_json must be a Delta struct schema")
    columns = {f.get("name") for f in schema["fields"] if isinstance(f, dict)}
    missing = [c for c in write.partition_by if c not in columns]
    if missing:
        raise InvalidArgument(f"table {write.table}: partition columns {missing} not in schema")
    prefix = f"{ATTEMPT_DIR}/{txn_id}/"
    partitions = set(write.partition_by)
    counts = Counter(add.path for add in write.add_files)
    if len(counts) != len(write.add_files):
        twice = sorted(p for p, n in counts.items() if n > 1)[:3]
        raise InvalidArgument(f"table {write.table}: files listed twice: {twice}")
    for add in write.add_files:
        # String checks, same verdict as PurePosixPath's is_absolute/parts (this runs per file)
        if (add.path.startswith("/") or ".." in add.path.split("/")
                or not add.path.startswith(prefix)):
            raise InvalidArgument(
                f"table {write.table}: file {add.path!r} must be a relative path under {prefix}")
        if add.size < 0:
            raise InvalidArgument(f"table {write.table}: file {add.path} has negative size")
        if set(add.partition_values) != partitions:
            raise InvalidArgument(
                f"table {write.table}: file {add.path} has partition values for "
                f"{sorted(add.partition_values)}, the table is partitioned by {sorted(partitions)}")
        if add.stats:
            _check_stats(write.table, add.path, add.stats)
    if write.replace_partitions and write.mode != WriteMode.OVERWRITE_PARTITIONS:
        raise InvalidArgument(f"table {write.table}: replace_partitions needs OVERWRITE_PARTITIONS")
    if write.mode == WriteMode.OVERWRITE_PARTITIONS and not write.partition_by:
        raise InvalidArgument(
            f"table {write.table}: overwrite_partitions needs a partitioned table (partition_by)")
    for spec in write.replace_partitions:
        if set(spec) != partitions:
            raise InvalidArgument(
                f"table {write.table}: a replaced partition names {sorted(spec)}, "
                f"the table is partitioned by {sorted(partitions)}")
    size = len(json.dumps(write.to_json()))
    if size > max_bytes:
        raise ResourceExhausted(
            f"table {write.table}: write intent is {size} bytes, over the limit of {max_bytes}; "
            "write fewer, larger files per batch (it is never truncated)")


def _check_stats(table: str, path: str, stats: str) -> None:
    """Delta file stats: a JSON object whose numRecords, when present, is a count."""
    try:
        parsed = json.loads(stats)
    except ValueError:
        raise InvalidArgument(f"table {table}: stats of {path} are not JSON") from None
    if not isinstance(parsed, dict):
        raise InvalidArgument(f"table {table}: stats of {path} must be a JSON object")
    rows = parsed.get("numRecords", 0)
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise InvalidArgument(
            f"table {table}: numRecords in the stats of {path} must be a count, got {rows!r}")
