"""``percolake-coordinator revise``: roll a table and every table downstream of it back to
their versions at a global barrier (docs/topology.md, revision), through the ``Revise`` RPC.

Exit status: 0 done, 1 the coordinator refused (its status and message on stderr), 2 bad
arguments or unusable client settings. Running the same command again after a failure or a
lost answer finishes the same revision (it is never made twice while nothing changed)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from coordinator.cli.client import Call, add_common_arguments, run_calls
from coordinator.cli.operations import as_of
from percolake.barriers import LOGICAL_BITS
from percolake.v1 import coordinator_pb2 as pb


def add_command(commands: Any, default_target: str) -> None:
    """Adds ``revise`` to the top-level subparsers."""
    revise = commands.add_parser(
        "revise", help="roll a table and its downstream tables back to a barrier",
        description="Restore a table, the other tables of its pipeline and every table "
        "downstream of them to their versions at a global barrier, in one commit that readers "
        "see all at once, and start a new generation of each affected pipeline. A root table: "
        "the downstream pipelines' input restarts after the restore; the source offsets the "
        "root pipeline must restart from are printed. A derived table: its pipeline and the "
        "downstream ones re-read their inputs from the barrier. Needs ADMIN on every pipeline "
        "when the coordinator authenticates callers.")
    revise.add_argument("--table", required=True, help="the table to revise (root or derived)")
    revise.add_argument("--to-barrier", required=True, type=barrier_argument,
                        help="a global barrier the tables completed: its oracle timestamp "
                        "(completed_barrier_ts of `topology --json`) or its UTC time as "
                        "`topology` prints it (2026-11-26T06:40:05Z)")
    revise.add_argument("--reason", default="", help="why; recorded with the pipeline resets")
    add_common_arguments(revise, default_target)


def barrier_argument(text: str) -> int:
    """An oracle timestamp, or a UTC time: the oracle timestamp its millisecond starts with,
    which a global barrier is."""
    if text.strip().isdigit():
        return int(text)
    return as_of(text.strip()) >> LOGICAL_BITS << LOGICAL_BITS


def run(args: argparse.Namespace) -> int:
    def work(call: Call) -> str:
        reply = call("Revise", pb.ReviseRequest(table=args.table, to_barrier=args.to_barrier,
                                                reason=args.reason))
        result = revision_json(reply)
        return json.dumps(result) if args.json else render(result)

    return run_calls("revise", args, work)


def revision_json(reply: pb.ReviseResponse) -> dict[str, Any]:
    """The reply as ``--json`` prints it."""
    return {
        "txn_id": reply.txn_id, "revision_ts": reply.revision_ts,
        "tables": [{"table": t.table,
                    "restored_version": t.restored_version if t.existed else None,
                    "existed": t.existed, "delta_version": t.delta_version}
                   for t in reply.tables],
        "pipelines": [{"pipeline_id": p.pipeline_id, "generation": p.generation,
                       "start_barrier": p.start_barrier} for p in reply.pipelines],
        "root_pipeline_id": reply.root_pipeline_id,
        "root_batch_id": reply.root_batch_id if reply.root_batch_id >= 0 else None,
        "root_source_offsets": reply.root_source_offsets,
        "derived": reply.derived, "writing_pipeline_id": reply.writing_pipeline_id,
    }


def render(result: dict[str, Any]) -> str:
    lines = [f"revision {result['txn_id']} committed at {result['revision_ts']}", "", "tables:"]
    for t in result["tables"]:
        restored = (f"version {t['restored_version']} restored" if t["existed"]
                    else "no version at the barrier: emptied")
        lines.append(f"  {t['table']}: {restored} (as version {t['delta_version']})")
    lines.append("")
    if result["pipelines"]:
        lines.append("new generations (start each on a new checkpoint):")
        lines.extend(f"  {p['pipeline_id']}: generation {p['generation']}, " + (
            "its source restarts from the offsets below" if p["pipeline_id"] ==
            result["root_pipeline_id"] else f"input starts after barrier {p['start_barrier']}")
            for p in result["pipelines"])
    else:
        lines.append("no downstream pipelines")
    lines.append("")
    if result["derived"]:
        lines.append(f"derived table: pipeline {result['writing_pipeline_id']} and the "
                     "downstream ones re-read their inputs from the barrier; no root restarts")
        return "\n".join(lines)
    root = result["root_pipeline_id"]
    if result["root_batch_id"] is None:
        lines.append(f"root pipeline {root}: no batch at or below the barrier (or its record "
                     "was pruned); restart its source from the beginning")
    elif result["root_source_offsets"]:
        lines.append(f"root pipeline {root}: restart from the source offsets of its batch "
                     f"{result['root_batch_id']}:")
        lines.append(f"  {result['root_source_offsets']}")
    else:
        lines.append(f"root pipeline {root}: batch {result['root_batch_id']} recorded no "
                     "source offsets")
    return "\n".join(lines)
