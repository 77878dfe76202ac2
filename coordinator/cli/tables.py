"""``percolake-coordinator tables quarantined|release-quarantine``: the tables quarantined
because a committed row-level write cannot be applied as it read them, and the operator's
choice that releases one (docs/row-level-writes.md, "Quarantine"; docs/operations.md).

Exit status: 0 done, 1 the coordinator refused (its status and message on stderr: an unsafe
reapply names why), 2 bad arguments or unusable client settings."""

from __future__ import annotations

import argparse
import json
from typing import Any

from coordinator.cli.client import Call, add_common_arguments, run_calls
from coordinator.views import quarantine_json, quarantine_note
from percolake.v1 import coordinator_pb2 as pb

CHOICES = {"reapply": pb.QUARANTINE_REAPPLY, "abandon": pb.QUARANTINE_ABANDON}


def add_commands(commands: Any, default_target: str) -> None:
    """Adds ``tables`` and its actions to the top-level subparsers."""
    tables = commands.add_parser(
        "tables", help="quarantined tables and their release",
        description="The tables quarantined because a committed row-level write (MERGE, "
        "UPDATE, DELETE, OPTIMIZE) cannot be applied as it read them: an outside writer "
        "changed the files it read after the commit point (docs/row-level-writes.md).")
    actions = tables.add_subparsers(dest="action", required=True, metavar="ACTION")
    listed = actions.add_parser(
        "quarantined", help="list the quarantined tables",
        description="List the quarantined tables: the table, the committed transaction whose "
        "write is held back, why, since when, and the command that releases it.")
    listed.add_argument("--all", action="store_true",
                        help="also the released ones, with the choice made, by whom and why")
    listed.add_argument("--pipeline", default="", help="only those of this pipeline's "
                        "transactions")
    add_common_arguments(listed, default_target)
    release = actions.add_parser(
        "release-quarantine", help="choose what becomes of a quarantined table's write",
        description="Release a quarantined table by choosing what becomes of the committed "
        "write held back. reapply: apply the write's files onto the table as it is now; "
        "refused unless every file the write removes is still in the table and the layout "
        "is unchanged (then no row is lost or written twice, but rows an outside writer "
        "added since were not seen by the operation). abandon: never apply it; the table "
        "keeps none of the write's changes (the batch's other tables keep theirs) and its "
        "files stay in the attempt's folder. The choice is recorded with who made it and "
        "why, and cannot be changed. Needs ADMIN on every pipeline and WRITE on the table "
        "when the coordinator authenticates callers.")
    release.add_argument("--table", required=True, help="the table's URI or path")
    release.add_argument("--txn", required=True, dest="txn_id",
                         help="the committed transaction that quarantined it (a guard)")
    release.add_argument("--choice", required=True, choices=sorted(CHOICES),
                         help="reapply (only when safe) or abandon: see above")
    release.add_argument("--reason", required=True, help="why; kept with the choice")
    add_common_arguments(release, default_target)


def run(args: argparse.Namespace) -> int:
    def work(call: Call) -> str:
        if args.action == "quarantined":
            reply = call("ListQuarantines", pb.ListQuarantinesRequest(
                include_released=args.all, pipeline_id=args.pipeline))
            records = [quarantine_json(q) for q in reply.quarantines]
            return json.dumps(records) if args.json else _render(records)
        record = quarantine_json(call("ReleaseQuarantine", pb.ReleaseQuarantineRequest(
            table=args.table, txn_id=args.txn_id, choice=CHOICES[args.choice],
            reason=args.reason)))
        return json.dumps(record) if args.json else _released(record)

    return run_calls(f"tables {args.action}", args, work)


def _render(records: list[dict[str, Any]]) -> str:
    if not records:
        return "no quarantined table"
    return "\n".join(quarantine_note(r) if r["released"] is None else _released(r)
                     for r in records)


def _released(record: dict[str, Any]) -> str:
    outcome = (f"applied onto version {record['as_of_version']} as Delta version "
               f"{record['delta_version']}" if record["choice"] == "reapply" else
               f"abandoned at version {record['as_of_version']}: the table holds none of it")
    who = record["chosen_by"] or "(anonymous)"
    return (f"released {record['table']} (transaction {record['txn_id']}): {outcome}; "
            f"chosen by {who} at {record['chosen']}: {record['choice_reason']}")
