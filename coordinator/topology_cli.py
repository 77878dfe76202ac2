"""``percolake-coordinator topology``: the ETL topology as ``GetTopology`` answers it (docs/
topology.md): pipelines with what they read and write, tables with their writer, readers, last
completed global barrier, delay and bottleneck, and each pipeline's own and end-to-end delay.
A read of a running coordinator, following its leader.

Exit status: 0 done, 1 the coordinator refused (its status and message on stderr), 2 bad
arguments or unusable client settings."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from coordinator.client_commands import Call, add_common_arguments, run_calls
from percolake.v1 import coordinator_pb2 as pb


def add_command(commands: Any, default_target: str) -> None:
    """Adds ``topology`` to the top-level subparsers."""
    topology = commands.add_parser(
        "topology", help="show pipelines, tables, lineage and barrier delays",
        description="Show the ETL topology: each pipeline (root or downstream) with the "
        "tables it reads and writes, each table with its writing pipeline, its readers, the "
        "last global barrier it completed, the delay since and its bottleneck (the pipeline "
        "with the largest own delay on its way from the roots), each pipeline's own and "
        "end-to-end delay (docs/topology.md). Needs "
        "DESCRIBE on every pipeline when the coordinator authenticates callers.")
    add_common_arguments(topology, default_target)


def run(args: argparse.Namespace) -> int:
    def work(call: Call) -> str:
        result = topology_json(call("GetTopology", pb.GetTopologyRequest()))
        return json.dumps(result) if args.json else render(result)

    return run_calls("topology", args, work)


def topology_json(reply: pb.GetTopologyResponse) -> dict[str, Any]:
    """The reply as ``--json`` prints it; barrier fields are null while not known."""
    def table(entry: pb.TopologyTable) -> dict[str, Any]:
        known = entry.HasField("completed_barrier_ts")
        return {"table": entry.table, "writer": entry.writer, "readers": list(entry.readers),
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
    }


def render(result: dict[str, Any]) -> str:
    """Two readable tables: pipelines, then tables."""
    if not result["pipelines"] and not result["tables"]:
        return "no pipelines"
    pipelines = _columns(
        ["PIPELINE", "GEN", "KIND", "READS", "WRITES", "OWN DELAY", "END-TO-END"],
        [[p["pipeline_id"], str(p["generation"]), "root" if p["root"] else "downstream",
          ", ".join(p["reads"]) or "-", ", ".join(p["writes"]) or "-",
          delay_text(p["own_delay_ms"]), delay_text(p["end_to_end_delay_ms"])]
         for p in result["pipelines"]])
    tables = _columns(
        ["TABLE", "WRITER", "READERS", "COMPLETED BARRIER (UTC)", "DELAY", "BOTTLENECK"],
        [[t["table"], t["writer"] or "-", ", ".join(t["readers"]) or "-",
          t["completed_barrier"] or "(not known yet)", delay_text(t["delay_ms"]),
          "" if t["bottleneck_pipeline"] is None
          else f"{t['bottleneck_pipeline']} ({delay_text(t['bottleneck_delay_ms'])})"]
         for t in result["tables"]])
    interval = result["barrier_interval_ms"] / 1000
    return (f"{pipelines}\n\n{tables or 'no tables'}\n\nglobal barriers every {interval:g} s; "
            f"now {result['now']}")


def _field(message: Any, name: str) -> int | None:
    """An optional field's value, None while unset (not known)."""
    return getattr(message, name) if message.HasField(name) else None


def delay_text(ms: int | None) -> str:
    """A delay in seconds as the CLI and the web view show it; "" while not known."""
    return "" if ms is None else f"{ms / 1000:.1f}s"


def _columns(header: Sequence[str], rows: list[Sequence[str]]) -> str:
    if not rows:
        return ""
    widths = [max(len(c) for c in column) for column in zip(header, *rows, strict=True)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


def utc_time(unix_ms: int) -> str:
    """Wall-clock milliseconds as UTC ISO 8601 with milliseconds (the CLI and the web view)."""
    when = dt.datetime.fromtimestamp(unix_ms / 1000, tz=dt.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{unix_ms % 1000:03d}Z"
