"""What the operator sees of transactions, pipelines and the topology: the JSON shapes and texts
the command line (``transactions``, ``pipelines``, ``topology``; ``coordinator/cli``) and the web
view (``coordinator/web.py``) share, and which transactions hang (docs/operations.md). It sits
below both: the web view belongs to the daemon, which never imports the command line."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from percolake.barriers import wall_ms_of_barrier
from percolake.records import RECOVERY_COMMAND
from percolake.v1 import coordinator_pb2 as pb

# Live: holding its tables. COMMITTED: decided, but not yet applied to every Delta table.
UNFINISHED = (pb.OPEN, pb.PREWRITTEN, pb.COMMITTED)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """Seconds of ``90s``, ``5m``, ``1h`` or ``2d``."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration like 90s, 5m, 1h or 2d, got {text!r}")
    return float(match[1]) * _UNIT_S[match[2]]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso_time(unix_ms: int) -> str:
    """UTC ISO 8601 with milliseconds, or "" for 0 (never)."""
    return utc_time(unix_ms) if unix_ms else ""


def ts_time(ts: int) -> str:
    return iso_time(wall_ms_of_barrier(ts)) if ts else ""


def age_text(seconds: float | None) -> str:
    """A duration as its two largest units: 45s, 1m30s, 1h, 2d3h."""
    if seconds is None:
        return ""
    left = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(p for p in parts[:2] if not p.startswith("0") or len(parts) == 1)


def txn_json(txn: pb.Transaction) -> dict[str, Any]:
    """A transaction as ``--json`` prints it (times as unix ms and as UTC ISO)."""
    return {
        "txn_id": txn.txn_id, "pipeline_id": txn.pipeline_id, "generation": txn.generation,
        "batch_id": txn.batch_id, "attempt": txn.attempt,
        "state": pb.TransactionState.Name(txn.state), "epoch": txn.epoch,
        "query_id": txn.query_id, "principal": txn.principal,
        "abort_reason": txn.abort_reason, "waiting_for_table": txn.waiting_for_table,
        "start_ts": txn.start_ts,
        "commit_ts": txn.commit_ts, "committed": ts_time(txn.commit_ts),
        "created_unix_ms": txn.created_unix_ms, "created": iso_time(txn.created_unix_ms),
        "updated_unix_ms": txn.updated_unix_ms, "updated": iso_time(txn.updated_unix_ms),
        "age_s": round(max(0, now_ms() - txn.created_unix_ms) / 1000, 3),
        "tables": [{"table": p.table, "name": p.catalog_name or None,
                    "write_location": p.write_location,
                    "mode": pb.WriteMode.Name(p.mode or pb.APPEND),
                    "prewritten": p.prewritten, "file_count": p.file_count,
                    "row_count": p.row_count, "applied": p.applied,
                    "delta_version": p.delta_version if p.applied else None,
                    "abandoned": p.abandoned}
                   for p in txn.participants],
    }


def pipeline_json(pipeline: pb.Pipeline) -> dict[str, Any]:
    """A pipeline as ``--json`` prints it."""
    last = pipeline.last_commit_unix_ms
    return {
        "pipeline_id": pipeline.pipeline_id, "generation": pipeline.generation,
        "epoch": pipeline.epoch, "query_id": pipeline.query_id,
        "created_unix_ms": pipeline.created_unix_ms, "created": iso_time(pipeline.created_unix_ms),
        "last_committed_batch_id": pipeline.last_committed_batch_id
        if pipeline.HasField("last_committed_batch_id") else None,
        "last_commit_unix_ms": last, "last_commit": iso_time(last),
        "seconds_since_last_commit": round((now_ms() - last) / 1000, 3) if last else None,
        "resets": [{"from_generation": r.from_generation, "to_generation": r.to_generation,
                    "reason": r.reason, "reset_unix_ms": r.reset_unix_ms,
                    "reset": iso_time(r.reset_unix_ms)} for r in pipeline.resets],
    }


def topology_json(reply: pb.GetTopologyResponse,
                  names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The reply as ``--json`` prints it; barrier fields are null while not known. ``names``:
    the catalog names of tables where known (``coordinator.table_names``), each table's
    ``name`` (null where not known) and, for the pipelines' reads and writes, ``names``."""
    names = names or {}

    def table(entry: pb.TopologyTable) -> dict[str, Any]:
        known = entry.HasField("completed_barrier_ts")
        return {"table": entry.table, "name": names.get(entry.table),
                "writer": entry.writer, "readers": list(entry.readers),
                "completed_barrier_ts": entry.completed_barrier_ts if known else None,
                "completed_barrier_unix_ms":
                    entry.completed_barrier_unix_ms if known else None,
                "completed_barrier": utc_time(entry.completed_barrier_unix_ms) if known else None,
                "delay_ms": entry.delay_ms if known else None,
                "bottleneck_pipeline": entry.bottleneck_pipeline or None,
                "bottleneck_delay_ms": _field(entry, "bottleneck_delay_ms")}

    return {
        "barrier_interval_ms": reply.barrier_interval_ms, "now_ts": reply.now_ts,
        "now_unix_ms": reply.now_unix_ms, "now": utc_time(reply.now_unix_ms),
        "pipelines": [{"pipeline_id": p.pipeline_id, "generation": p.generation,
                       "root": p.root, "reads": list(p.reads), "writes": list(p.writes),
                       "own_delay_ms": _field(p, "own_delay_ms"),
                       "end_to_end_delay_ms": _field(p, "end_to_end_delay_ms"),
                       "last_input_barrier_ts": _field(p, "last_input_barrier_ts")}
                      for p in reply.pipelines],
        "tables": [table(t) for t in reply.tables],
        "edges": [{"pipeline_id": e.pipeline_id, "table": e.table,
                   "kind": "reads" if e.kind == pb.EDGE_READS else "writes"}
                  for e in reply.edges],
        "names": dict(names),
    }


def _field(message: Any, name: str) -> int | None:
    """An optional field's value, None while unset (not known)."""
    return getattr(message, name) if message.HasField(name) else None


def delay_text(ms: int | None) -> str:
    """A delay in seconds as the CLI and the web view show it; "" while not known."""
    return "" if ms is None else f"{ms / 1000:.1f}s"


def utc_time(unix_ms: int) -> str:
    """Wall-clock milliseconds as UTC ISO 8601 with milliseconds (the CLI and the web view)."""
    when = dt.datetime.fromtimestamp(unix_ms / 1000, tz=dt.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{unix_ms % 1000:03d}Z"


CHOICES = {pb.QUARANTINE_REAPPLY: "reapply", pb.QUARANTINE_ABANDON: "abandon"}


def quarantine_json(record: pb.TableQuarantine) -> dict[str, Any]:
    """A quarantined table (or a released one, with the choice made) as ``--json`` prints it."""
    released = record.released_unix_ms
    return {
        "table": record.table, "txn_id": record.txn_id, "reason": record.reason,
        "quarantined_unix_ms": record.quarantined_unix_ms,
        "quarantined": iso_time(record.quarantined_unix_ms),
        "choice": CHOICES.get(record.choice), "chosen_by": record.chosen_by,
        "chosen_unix_ms": record.chosen_unix_ms or None,
        "chosen": iso_time(record.chosen_unix_ms) or None,
        "choice_reason": record.choice_reason,
        "as_of_version": None if record.as_of_version < 0 else record.as_of_version,
        "released_unix_ms": released or None, "released": iso_time(released) or None,
        "delta_version": None if record.delta_version < 0 else record.delta_version,
        "release_command": None if released else RECOVERY_COMMAND.format(
            table=record.table, txn_id=record.txn_id),
    }


def quarantine_note(record: dict[str, Any]) -> str:
    """What a quarantined table's line says: the table, since when, why, the way out."""
    return (f"QUARANTINED {record['table']} (transaction {record['txn_id']}, since "
            f"{record['quarantined']}): {record['reason']}\n  release with: "
            f"{record['release_command']}")


def find_hanging(unfinished: list[dict[str, Any]], every: list[dict[str, Any]],
                 older_than_s: float,
                 quarantines: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The transactions of ``unfinished`` (OPEN, PREWRITTEN or COMMITTED) older than
    ``older_than_s``, each with ``waiting_for``: None, or the table it waits to take and the
    transaction of ``every`` (all unfinished ones, of any pipeline) holding that table; and
    ``quarantined``: the quarantined tables it holds (``quarantine_json``s of
    ``quarantines``). A transaction holding a quarantined table is listed whatever its age:
    it stays until an operator releases the table."""
    holders = {table["table"]: txn for txn in every for table in txn["tables"]}
    by_txn: dict[str, list[dict[str, Any]]] = {}
    for record in quarantines:
        by_txn.setdefault(record["txn_id"], []).append(record)
    hanging = []
    for txn in unfinished:
        quarantined = by_txn.get(txn["txn_id"], [])
        if txn["age_s"] < older_than_s and not quarantined:
            continue
        waited = txn["waiting_for_table"]
        holder = holders.get(waited) if waited else None
        hanging.append({**txn, "waiting_for": None if not waited else {
            "table": waited, "holder_txn_id": holder["txn_id"] if holder else "",
            "holder_pipeline_id": holder["pipeline_id"] if holder else "",
            "holder_state": holder["state"] if holder else "",
            "holder_age_s": holder["age_s"] if holder else None},
            "quarantined": quarantined})
    return hanging
