"""``percolake-coordinator topology``: the ETL topology as ``GetTopology`` answers it (docs/
topology.md): pipelines with what they read and write, tables with their writer, readers, last
completed global barrier, delay and bottleneck, and each pipeline's own and end-to-end delay.
A read of a running coordinator, following its leader.

Exit status: 0 done, 1 the coordinator refused (its status and message on stderr), 2 bad
arguments or unusable client settings."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from coordinator.cli.client import Call, add_common_arguments, run_calls
from coordinator.table_names import catalog_names, named
from coordinator.views import delay_text, topology_json
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
        reply = call("GetTopology", pb.GetTopologyRequest())
        result = topology_json(reply, catalog_names(call, [t.writer for t in reply.tables]))
        return json.dumps(result) if args.json else render(result)

    return run_calls("topology", args, work)


def render(result: dict[str, Any]) -> str:
    """Two readable tables: pipelines, then tables (each with its catalog name where
    known)."""
    if not result["pipelines"] and not result["tables"]:
        return "no pipelines"
    names = result["names"]
    pipelines = _columns(
        ["PIPELINE", "GEN", "KIND", "READS", "WRITES", "OWN DELAY", "END-TO-END"],
        [[p["pipeline_id"], str(p["generation"]), "root" if p["root"] else "downstream",
          ", ".join(named(t, names) for t in p["reads"]) or "-",
          ", ".join(named(t, names) for t in p["writes"]) or "-",
          delay_text(p["own_delay_ms"]), delay_text(p["end_to_end_delay_ms"])]
         for p in result["pipelines"]])
    tables = _columns(
        ["TABLE", "WRITER", "READERS", "COMPLETED BARRIER (UTC)", "DELAY", "BOTTLENECK"],
        [[named(t["table"], names), t["writer"] or "-", ", ".join(t["readers"]) or "-",
          t["completed_barrier"] or "(not known yet)", delay_text(t["delay_ms"]),
          "" if t["bottleneck_pipeline"] is None
          else f"{t['bottleneck_pipeline']} ({delay_text(t['bottleneck_delay_ms'])})"]
         for t in result["tables"]])
    interval = result["barrier_interval_ms"] / 1000
    return (f"{pipelines}\n\n{tables or 'no tables'}\n\nglobal barriers every {interval:g} s; "
            f"now {result['now']}")


def _columns(header: Sequence[str], rows: list[Sequence[str]]) -> str:
    if not rows:
        return ""
    widths = [max(len(c) for c in column) for column in zip(header, *rows, strict=True)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


