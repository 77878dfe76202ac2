"""``percolake-coordinator vacuum --table T``: removes a table's unreferenced files through the
coordinator (``Vacuum``, docs/topology.md safe expiry), which refuses while a lease, a
downstream pipeline's range still to read or the time-travel floor needs any of them, naming
what blocks. Prints what was removed (or with ``--dry-run`` would be).

Exit status: 0 done, 1 refused (the coordinator's status and message, naming the blocker, on
stderr), 2 bad arguments or unusable client settings."""

from __future__ import annotations

import argparse
import json
from typing import Any

from coordinator.cli.client import Call, add_common_arguments, run_calls
from percolake.lake.defaults import DEFAULT_RETENTION_HOURS
from percolake.v1 import coordinator_pb2 as pb


def add_command(commands: Any, default_target: str) -> None:
    """Adds ``vacuum`` to the top-level subparsers."""
    vacuum = commands.add_parser(
        "vacuum", help="remove a table's unreferenced files (delta-rs vacuum), safely",
        description="Remove the files of a Delta table that its log stopped referencing more "
        "than --retention-hours ago, unless a snapshot lease, a downstream pipeline's range "
        "not read yet or time travel above the retention floor still needs one of them: then "
        "nothing is removed and the refusal names what blocks (docs/topology.md). Needs ADMIN "
        "on every pipeline and WRITE on the table when the coordinator authenticates callers.")
    vacuum.add_argument("--table", required=True, help="the table's URI or path")
    vacuum.add_argument("--retention-hours", type=_hours,
                        help="remove only files unreferenced for longer than this many hours "
                        "(default: the table's delta.deletedFileRetentionDuration, "
                        f"{DEFAULT_RETENTION_HOURS} when it sets none, as delta-spark's VACUUM)")
    vacuum.add_argument("--dry-run", action="store_true",
                        help="only list what would be removed (and check what blocks)")
    add_common_arguments(vacuum, default_target)


def _hours(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of hours: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"hours are >= 0, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    def work(call: Call) -> str:
        request = pb.VacuumRequest(table=args.table, dry_run=args.dry_run)
        if args.retention_hours is not None:
            request.retention_hours = args.retention_hours
        reply = call("Vacuum", request)
        result = vacuum_json(reply, args.dry_run)
        return json.dumps(result) if args.json else render(result)

    return run_calls("vacuum", args, work)


def vacuum_json(reply: pb.VacuumResponse, dry_run: bool) -> dict[str, Any]:
    """The reply as ``--json`` prints it."""
    oldest = reply.oldest_needed_version
    return {"table": reply.canonical_table, "dry_run": dry_run,
            "removed_files": list(reply.removed_files),
            "oldest_needed_version": None if oldest < 0 else oldest,
            "kept_for": list(reply.kept_for)}


def render(result: dict[str, Any]) -> str:
    verb = "would remove" if result["dry_run"] else "removed"
    lines = [f"{result['table']}: {verb} {len(result['removed_files'])} file(s)"]
    lines += [f"  {path}" for path in result["removed_files"]]
    if result["kept_for"]:
        oldest = result["oldest_needed_version"]
        lines.append(f"kept for: {'; '.join(result['kept_for'])} (oldest version needed: "
                     f"{oldest})")
    return "\n".join(lines)
