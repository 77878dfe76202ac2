"""Operating commands (docs/operations.md): ``transactions list|describe|abort|find-hanging``,
``pipelines list|describe`` and ``snapshot``, each a read or one administrative call to a
running coordinator, following its leader like every client command.

Exit status: 0 done, 1 the coordinator refused (its status and message on stderr), 2 bad
arguments or unusable client settings."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from coordinator.cli.client import Call, add_common_arguments, run_calls
from coordinator.table_names import named, names_in
from coordinator.views import (
    UNFINISHED,
    age_text,
    duration,
    find_hanging,
    now_ms,
    pipeline_json,
    quarantine_json,
    quarantine_note,
    ts_time,
    txn_json,
)
from percolake.barriers import LOGICAL_BITS
from percolake.v1 import coordinator_pb2 as pb

STATES = ("OPEN", "PREWRITTEN", "COMMITTED", "APPLIED", "ABORTED")


def as_of(text: str) -> int:
    """A commit_ts (an integer, as `transactions describe` shows it) or a UTC time
    (2026-11-26T00:40:00Z)."""
    if text.isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a commit_ts or an ISO time like 2026-11-26T00:40:00Z, got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return (int(when.timestamp() * 1000) + 1 << LOGICAL_BITS) - 1


# ---------------------------------------------------------------- parsers

def add_commands(commands: Any, default_target: str) -> None:
    """Adds ``transactions``, ``pipelines`` and ``snapshot`` to the top-level subparsers."""
    txns = commands.add_parser(
        "transactions", help="list, describe, abort transactions; find hanging ones",
        description="Look at the coordinator's transactions and act on them: list, describe, "
        "abort a live one, find those hanging past a threshold (docs/operations.md).")
    actions = txns.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", help="list transactions, oldest first",
        description="List transactions, oldest first. Without --pipeline it needs ADMIN on "
        "every pipeline when the coordinator authenticates callers.")
    listing.add_argument("--pipeline", default="", help="only this pipeline's transactions")
    listing.add_argument("--state", action="append", choices=STATES, type=str.upper,
                         help="only transactions in this state; repeat for several")
    listing.add_argument("--older-than", type=duration, metavar="DURATION",
                         help="only transactions created longer ago than this (90s, 5m, 1h)")
    listing.add_argument("--limit", type=_positive_int, default=100,
                         help="show at most this many transactions")
    add_common_arguments(listing, default_target)

    describe = actions.add_parser(
        "describe", help="show one transaction in full",
        description="Show one transaction: state, pipeline, generation, batch, attempt, "
        "epoch, query id, timings, and per table its write location, file and row counts, "
        "and the Delta version it produced once applied.")
    describe.add_argument("txn_id", metavar="TXN_ID", help="the transaction id")
    add_common_arguments(describe, default_target)

    abort = actions.add_parser(
        "abort", help="abort a live (OPEN or PREWRITTEN) transaction",
        description="Abort a live transaction and delete its files. A committed transaction "
        "is never aborted: the coordinator refuses (exit status 1, the reason on stderr). "
        "Aborting another principal's transaction needs ADMIN on its pipeline.")
    abort.add_argument("txn_id", metavar="TXN_ID", help="the transaction id")
    abort.add_argument("--reason", required=True, help="why; recorded as its abort reason")
    add_common_arguments(abort, default_target)

    hanging = actions.add_parser(
        "find-hanging", help="live or committed-but-unapplied transactions past a threshold",
        description="Transactions still OPEN or PREWRITTEN, or COMMITTED but not yet applied "
        "to every table, created longer ago than --older-than: the tables each holds and, "
        "for one blocked waiting to take a table, the transaction holding that table. Needs "
        "ADMIN on every pipeline with authentication.")
    hanging.add_argument("--older-than", type=duration, default=120.0, metavar="DURATION",
                         help="age threshold (90s, 2m, 1h); default 2m")
    hanging.add_argument("--pipeline", default="", help="only this pipeline's transactions")
    add_common_arguments(hanging, default_target)

    pipes = commands.add_parser(
        "pipelines", help="list or describe pipelines",
        description="Look at the coordinator's pipelines (docs/operations.md).")
    pipe_actions = pipes.add_subparsers(dest="action", required=True, metavar="ACTION")
    plist = pipe_actions.add_parser(
        "list", help="list every pipeline",
        description="List every pipeline with its generation, epoch, query id and last "
        "commit. Needs ADMIN on every pipeline when the coordinator authenticates callers.")
    add_common_arguments(plist, default_target)
    pdescribe = pipe_actions.add_parser(
        "describe", help="show one pipeline in full",
        description="Show one pipeline: generation, epoch, query id, last committed batch "
        "and when, its tables (those of the last committed batch), its live attempts and its "
        "resets.")
    pdescribe.add_argument("pipeline_id", metavar="PIPELINE", help="the pipeline id")
    add_common_arguments(pdescribe, default_target)

    snap = commands.add_parser(
        "snapshot", help="a consistent Delta version per table",
        description="A consistent point in time: the snapshot_ts and, per table, the Delta "
        "version to read (or that the table has no committed write yet).")
    snap.add_argument("tables", nargs="+", metavar="TABLE", help="table URIs or paths")
    snap.add_argument("--as-of", type=as_of, metavar="TS",
                      help="time travel: a commit_ts, or a UTC time like "
                      "2026-11-26T00:40:00Z (the state after every commit up to then); with "
                      "--consistency topology, a completed global barrier")
    snap.add_argument("--consistency", choices=sorted(_CONSISTENCY), default="snapshot",
                      help="snapshot: every table at one commit_ts (default); topology: every "
                      "table at its version at the latest global barrier all completed; "
                      "read_committed: each table's latest applied version")
    add_common_arguments(snap, default_target)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


# ---------------------------------------------------------------- running

def run(args: argparse.Namespace) -> int:
    """Runs one operating command; 0 done, 1 the coordinator refused, 2 bad settings."""
    name = " ".join(filter(None, [args.command, getattr(args, "action", "")]))

    def work(call: Call) -> str:
        as_json, table = _HANDLERS[name](args, call)
        return json.dumps(as_json, indent=None) if args.json else table

    return run_calls(name, args, work)


def _transactions(call: Call, request: pb.ListTransactionsRequest,
                  limit: int | None = None) -> Iterator[pb.Transaction]:
    """Every transaction the request matches (page after page), at most ``limit``."""
    shown = 0
    while True:
        reply = call("ListTransactions", request)
        for txn in reply.transactions:
            if limit is not None and shown >= limit:
                return
            shown += 1
            yield txn
        if not reply.next_page_token:
            return
        request.page_token = reply.next_page_token


def _list(args: argparse.Namespace, call: Call) -> tuple[Any, str]:
    request = pb.ListTransactionsRequest(
        pipeline_id=args.pipeline, states=[pb.TransactionState.Value(s) for s in args.state or []],
        page_size=min(args.limit, 1000))
    if args.older_than is not None:
        request.created_before_unix_ms = max(1, now_ms() - int(args.older_than * 1000))
    txns = [txn_json(t) for t in _transactions(call, request, args.limit)]
    return txns, _txn_table(txns) if txns else "no transactions"


def _describe(args: argparse.Namespace, call: Call) -> tuple[Any, str]:
    txn = txn_json(call("GetTransaction", pb.GetTransactionRequest(txn_id=args.txn_id)))
    return txn, _txn_details(txn)


def _abort(args: argparse.Namespace, call: Call) -> tuple[Any, str]:
    current = call("GetTransaction", pb.GetTransactionRequest(txn_id=args.txn_id))
    request = pb.AbortTransactionRequest(txn_id=args.txn_id, reason=args.reason)
    if current.epoch:  # a fenced pipeline's transaction is aborted with its own epoch
        request.epoch = current.epoch
    txn = txn_json(call("AbortTransaction", request).transaction)
    return txn, f"transaction {txn['txn_id']} is {txn['state']}: {txn['abort_reason']}"


def _find_hanging(args: argparse.Namespace, call: Call) -> tuple[Any, str]:
    request = pb.ListTransactionsRequest(pipeline_id=args.pipeline, states=UNFINISHED,
                                         page_size=1000)
    unfinished = [txn_json(t) for t in _transactions(call, request)]
    if args.pipeline:  # the holder of a waited-for table may be another pipeline's
        others = pb.ListTransactionsRequest(states=UNFINISHED, page_size=1000)
        every = [txn_json(t) for t in _transactions(call, others)] \
            if any(t["waiting_for_table"] for t in unfinished) else unfinished
    else:
        every = unfinished
    quarantines = [quarantine_json(q) for q in call(
        "ListQuarantines", pb.ListQuarantinesRequest(pipeline_id=args.pipeline)).quarantines]
    hanging = find_hanging(unfinished, every, args.older_than, quarantines)
    if not hanging:
        return hanging, f"no transaction unfinished for longer than {age_text(args.older_than)}"
    rows = []
    for txn in hanging:
        wait = txn["waiting_for"]
        holder = "" if wait is None else (
            f"{wait['holder_txn_id']} ({wait['holder_pipeline_id']}, {wait['holder_state']})"
            if wait["holder_txn_id"] else "(released)")
        rows.append([txn["txn_id"], txn["pipeline_id"], str(txn["batch_id"]), txn["state"],
                     age_text(txn["age_s"]), ", ".join(t["table"] for t in txn["tables"]),
                     wait["table"] if wait else "", holder])
    text = _table(["TXN_ID", "PIPELINE", "BATCH", "STATE", "AGE", "HOLDS", "WAITING FOR",
                   "HELD BY"], rows)
    notes = [quarantine_note(q) for txn in hanging for q in txn["quarantined"]]
    return hanging, "\n".join([text, *notes])


def _pipelines_list(args: argparse.Namespace, call: Call) -> tuple[Any, str]:
    request = pb.ListPipelinesRequest(page_size=1000)
    pipelines = []
    while True:
        reply = call("ListPipelines", request)
        pipelines.extend(pipeline_json(p) for p in reply.pipelines)
        if not reply.next_page_token:
            break
        request.page_token = reply.next_page_token
    if not pipelines:
        return pipelines, "no pipelines"
    return pipelines, _table(
        ["PIPELINE", "GENERATION", "EPOCH", "QUERY ID", "LAST BATCH", "LAST COMMIT (UTC)",
         "SINCE"],
        [[p["pipeline_id"], str(p["generation"]), str(p["epoch"]), p["query_id"],
          _opt(p["last_committed_batch_id"]), p["last_commit"],
          age_text(p["seconds_since_last_commit"])] for p in pipelines])


def _pipelines_describe(args: argparse.Namespace, call: Call) -> tuple[Any, str]:
    pipeline = pipeline_json(call("GetPipeline", pb.GetPipelineRequest(
        pipeline_id=args.pipeline_id)))
    live = [txn_json(t) for t in _transactions(call, pb.ListTransactionsRequest(
        pipeline_id=args.pipeline_id, states=UNFINISHED, page_size=1000))]
    tables: list[str] = []
    names: dict[str, str] = {}
    if pipeline["last_committed_batch_id"] is not None:
        for txn in _transactions(call, pb.ListTransactionsRequest(
                pipeline_id=args.pipeline_id, generation=pipeline["generation"],
                batch_id=pipeline["last_committed_batch_id"],
                states=[pb.COMMITTED, pb.APPLIED])):
            tables = [p.table for p in txn.participants]
            names = names_in([txn])
    result = {**pipeline, "tables": tables, "table_names": names, "live_attempts": live}
    lines = [f"pipeline            {pipeline['pipeline_id']}",
             f"generation          {pipeline['generation']}",
             f"epoch               {pipeline['epoch']}",
             f"query id            {pipeline['query_id'] or '(unbound)'}",
             f"created             {pipeline['created']}",
             f"last batch          {_opt(pipeline['last_committed_batch_id']) or '(none)'}",
             f"last commit         {pipeline['last_commit'] or '(never)'}"
             + (f" ({age_text(pipeline['seconds_since_last_commit'])} ago)"
                if pipeline["last_commit"] else ""),
             f"tables              {', '.join(named(t, names) for t in tables) or '(none)'}"]
    lines.append("live attempts       " + ("(none)" if not live else ", ".join(
        f"{t['txn_id']} batch {t['batch_id']} attempt {t['attempt']} {t['state']} "
        f"age {age_text(t['age_s'])}" for t in live)))
    for reset in pipeline["resets"]:
        lines.append(f"reset               generation {reset['from_generation']} -> "
                     f"{reset['to_generation']} at {reset['reset']}: {reset['reason']}")
    return result, "\n".join(lines)


def _snapshot(args: argparse.Namespace, call: Call) -> tuple[Any, str]:
    request = pb.GetSnapshotRequest(tables=args.tables,
                                    consistency=_CONSISTENCY[args.consistency])
    if args.as_of is not None and args.consistency == "topology":
        request.as_of_barrier = args.as_of >> LOGICAL_BITS << LOGICAL_BITS
    elif args.as_of is not None:
        request.as_of_ts = args.as_of
    reply = call("GetSnapshot", request)
    result = {"snapshot_ts": reply.snapshot_ts, "snapshot_time": ts_time(reply.snapshot_ts),
              "consistency": args.consistency,
              "tables": [{"table": t.table, "canonical_table": t.canonical_table,
                          "exists": t.exists,
                          "delta_version": t.delta_version if t.exists else None}
                         for t in reply.tables]}
    point = "global barrier" if args.consistency == "topology" else "snapshot_ts"
    text = f"{point} {reply.snapshot_ts} ({result['snapshot_time']})\n" + _table(
        ["TABLE", "DELTA VERSION"],
        [[t["canonical_table"], str(t["delta_version"]) if t["exists"]
          else "(no committed write)"] for t in result["tables"]])
    return result, text


_CONSISTENCY = {"snapshot": pb.CONSISTENCY_SNAPSHOT, "topology": pb.CONSISTENCY_TOPOLOGY,
                "read_committed": pb.CONSISTENCY_READ_COMMITTED}

_HANDLERS: dict[str, Callable[[argparse.Namespace, Call], tuple[Any, str]]] = {
    "transactions list": _list, "transactions describe": _describe,
    "transactions abort": _abort, "transactions find-hanging": _find_hanging,
    "pipelines list": _pipelines_list, "pipelines describe": _pipelines_describe,
    "snapshot": _snapshot,
}


# ---------------------------------------------------------------- output

def _opt(value: int | None) -> str:
    return "" if value is None else str(value)


def _named(table: dict[str, Any]) -> str:
    """A table as the text output shows it: its location, and its catalog name if known."""
    return f"{table['table']} ({table['name']})" if table.get("name") else table["table"]


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True))
                     .rstrip() for row in [header, *rows])


def _txn_table(txns: list[dict[str, Any]]) -> str:
    return _table(
        ["TXN_ID", "PIPELINE", "GEN", "BATCH", "ATTEMPT", "STATE", "AGE", "CREATED (UTC)",
         "TABLES"],
        [[t["txn_id"], t["pipeline_id"], str(t["generation"]), str(t["batch_id"]),
          str(t["attempt"]), t["state"], age_text(t["age_s"]), t["created"],
          str(len(t["tables"]))] for t in txns])


def _txn_details(txn: dict[str, Any]) -> str:
    lines = [f"{label:<20}{value}" for label, value in (
        ("transaction", txn["txn_id"]), ("state", txn["state"]),
        ("pipeline", txn["pipeline_id"]), ("generation", txn["generation"]),
        ("batch", txn["batch_id"]), ("attempt", txn["attempt"]), ("epoch", txn["epoch"]),
        ("query id", txn["query_id"] or "(none)"), ("principal", txn["principal"] or "(none)"),
        ("created", txn["created"]), ("updated", txn["updated"]),
        ("age", age_text(txn["age_s"])), ("start_ts", txn["start_ts"]),
        ("commit_ts", f"{txn['commit_ts']} ({txn['committed']})" if txn["commit_ts"]
         else "(not committed)"),
    )]
    if txn["waiting_for_table"]:
        lines.append(f"{'waiting for':<20}{txn['waiting_for_table']} (held by another "
                     "transaction)")
    if txn["abort_reason"]:
        lines.append(f"{'abort reason':<20}{txn['abort_reason']}")
    if txn["tables"]:
        lines.append("")
        lines.append(_table(
            ["TABLE", "MODE", "PREWRITTEN", "FILES", "ROWS", "APPLIED", "DELTA VERSION",
             "WRITE LOCATION"],
            [[_named(t), t["mode"], "yes" if t["prewritten"] else "no", str(t["file_count"]),
              str(t["row_count"]),
              "abandoned" if t["abandoned"] else "yes" if t["applied"] else "no",
              _opt(t["delta_version"]), t["write_location"]] for t in txn["tables"]]))
    return "\n".join(lines)
