"""The read-only web view of ``serve --http-port`` (docs/operations.md): server-rendered HTML
pages and their JSON twins under ``/api``, read in-process from the serving core.

Each page makes the calls the equivalent RPCs make (the servicer's own method bodies) under
the same access rules: HTTPS with the daemon's certificate when it has one, a client
certificate under ``--client-ca``, and with ``--authenticate`` a bearer token or that
certificate (401 without; ``http_serving``) and the permission the RPC needs (403). A standby
answers 503 naming the leader. Every value is HTML-escaped; pages carry no script (the CSP
forbids any).
"""

from __future__ import annotations

import html
import json
import logging
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import grpc

from coordinator.auth.access import Checks, authorize
from coordinator.auth.credentials import Credentials
from coordinator.auth.identity import Unauthenticated
from coordinator.http_serving import HTTP_EXPECTED, CallerHandler, HttpAccess, HttpServer
from coordinator.leadership import CoreProvider, NotServing
from coordinator.oracle import wall_ms_of
from coordinator.servicer import CoordinatorServicer
from coordinator.status_codes import status_for
from coordinator.table_names import catalog_names
from coordinator.views import (
    UNFINISHED,
    age_text,
    delay_text,
    duration,
    find_hanging,
    pipeline_json,
    quarantine_json,
    topology_json,
    txn_json,
    utc_time,
)
from percolake.errors import InvalidArgument, NotLeader, ProtocolError, StoreUnavailable
from percolake.v1 import coordinator_pb2 as pb

log = logging.getLogger("percolake.web")
MAX_LIMIT = 1000
_HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404,
                grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.UNAVAILABLE: 503,
                grpc.StatusCode.RESOURCE_EXHAUSTED: 429}
_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"}


class WebError(Exception):
    """An answer other than 200: its HTTP status, message and, on a standby, the leader."""

    def __init__(self, status: int, message: str, leader: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.leader = leader


def _rpc_body(name: str) -> Callable[..., Any]:
    """The servicer's method body (what ``rpc`` wraps), called without gRPC."""
    return getattr(CoordinatorServicer, name).__wrapped__


class Reader:
    """Makes RPC-equivalent reads on the serving core as one caller (``principal``; None with
    authentication off)."""

    def __init__(self, cores: CoreProvider | None, credentials: Credentials | None,
                 principal: str | None) -> None:
        self.cores = cores
        self.credentials = credentials
        self.principal = principal

    def call(self, name: str, request: Any) -> Any:
        if self.cores is None:
            raise WebError(503, "the coordinator is still starting; retry")
        body = _rpc_body(name)
        try:
            with self.cores.serving() as term:
                core = term.core
                try:
                    decision = None if self.credentials is None else authorize(
                        name, Checks(self.principal or "", self.credentials, core), request)
                    reply = body(None, core, request, None)
                except (NotLeader, StoreUnavailable) as exc:
                    if isinstance(exc, NotServing):
                        raise
                    raise self.cores.lost(term, exc) from exc
                finally:
                    core.wait_durable()  # what the answer rests on is durable first (I8)
                term.confirm()
        except NotServing as exc:
            raise WebError(503, str(exc), exc.leader_address) from exc
        except ProtocolError as exc:
            raise WebError(_HTTP_STATUS.get(status_for(exc), 500), str(exc)) from exc
        if decision is not None and decision.hide_identity is not None:
            decision.hide_identity(reply)
        return reply

    def transactions(self, request: pb.ListTransactionsRequest,
                     limit: int | None = None) -> Iterator[dict[str, Any]]:
        shown = 0
        while True:
            reply = self.call("ListTransactions", request)
            for txn in reply.transactions:
                if limit is not None and shown >= limit:
                    return
                shown += 1
                yield txn_json(txn)
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token


# ---------------------------------------------------------------- the views (JSON-able data)

def _one(query: dict[str, list[str]], name: str, default: str = "") -> str:
    values = query.get(name, [])
    return values[-1].strip() if values else default


def _states(query: dict[str, list[str]]) -> list[int]:
    names = [s.strip().upper() for v in query.get("state", []) for s in v.split(",") if s.strip()]
    try:
        return [pb.TransactionState.Value(s) for s in names]
    except ValueError:
        raise InvalidArgument(f"state must be OPEN, PREWRITTEN, COMMITTED, APPLIED or ABORTED, "
                              f"got {', '.join(names)!r}") from None


def _older_than(query: dict[str, list[str]], default: float | None) -> float | None:
    text = _one(query, "older-than")
    if not text:
        return default
    try:
        return duration(text)
    except Exception as exc:  # argparse.ArgumentTypeError, with the expected form
        raise InvalidArgument(f"older-than: {exc}") from None


def _limit(query: dict[str, list[str]]) -> int:
    text = _one(query, "limit", "100")
    if not text.isdigit() or not 0 < int(text) <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be an integer 1..{MAX_LIMIT}, got {text!r}")
    return int(text)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def pipelines_view(reader: Reader, query: dict[str, list[str]]) -> list[dict[str, Any]]:
    request = pb.ListPipelinesRequest(page_size=MAX_LIMIT)
    pipelines = []
    while True:
        reply = reader.call("ListPipelines", request)
        pipelines.extend(pipeline_json(p) for p in reply.pipelines)
        if not reply.next_page_token:
            return pipelines
        request.page_token = reply.next_page_token


def transactions_view(reader: Reader, query: dict[str, list[str]]) -> list[dict[str, Any]]:
    limit = _limit(query)
    request = pb.ListTransactionsRequest(pipeline_id=_one(query, "pipeline"),
                                         states=_states(query), page_size=limit)
    older = _older_than(query, None)
    if older is not None:
        request.created_before_unix_ms = max(1, _now_ms() - int(older * 1000))
    return list(reader.transactions(request, limit))


def transaction_view(reader: Reader, txn_id: str) -> dict[str, Any]:
    return txn_json(reader.call("GetTransaction", pb.GetTransactionRequest(txn_id=txn_id)))


def pipeline_view(reader: Reader, pipeline_id: str) -> dict[str, Any]:
    """As ``pipelines describe``: with the tables of its last committed batch and its live
    attempts."""
    pipeline = pipeline_json(reader.call("GetPipeline",
                                         pb.GetPipelineRequest(pipeline_id=pipeline_id)))
    live = list(reader.transactions(pb.ListTransactionsRequest(
        pipeline_id=pipeline_id, states=UNFINISHED, page_size=MAX_LIMIT)))
    tables: list[str] = []
    names: dict[str, str] = {}
    if pipeline["last_committed_batch_id"] is not None:
        for txn in reader.transactions(pb.ListTransactionsRequest(
                pipeline_id=pipeline_id, generation=pipeline["generation"],
                batch_id=pipeline["last_committed_batch_id"],
                states=[pb.COMMITTED, pb.APPLIED])):
            tables = [t["table"] for t in txn["tables"]]
            names = {t["table"]: t["name"] for t in txn["tables"] if t["name"]}
    return {**pipeline, "tables": tables, "table_names": names, "live_attempts": live}


def topology_view(reader: Reader, query: dict[str, list[str]]) -> dict[str, Any]:
    """As ``topology --json``; ``table`` (repeatable) narrows it as GetTopology's ``tables``."""
    reply = reader.call("GetTopology", pb.GetTopologyRequest(tables=_tables(query)))
    return topology_json(reply, catalog_names(reader.call, [t.writer for t in reply.tables]))


def leases_view(reader: Reader, query: dict[str, list[str]]) -> dict[str, Any]:
    """The live leases as ListLeases answers this caller (the ids of other principals' leases
    empty unless ADMIN); ``table`` (repeatable) lists those on any of these tables."""
    tables = _tables(query)
    reply = reader.call("ListLeases", pb.ListLeasesRequest(tables=tables))
    now_ms = _now_ms()
    names = _lease_names(reader, reply.leases)
    return {"tables": tables, "now_unix_ms": now_ms, "now": utc_time(now_ms),
            "leases": [lease_json(lease, now_ms, names) for lease in reply.leases],
            "names": names}


def _lease_names(reader: Reader, leases: Iterable[pb.Lease]) -> dict[str, str]:
    """The catalog names of the leased tables where known; none for a caller that may not
    describe their writers (the leases are shown all the same)."""
    tables = sorted({t.table for lease in leases for t in lease.tables})
    if not tables:
        return {}
    try:
        topology = reader.call("GetTopology", pb.GetTopologyRequest(tables=tables))
        return catalog_names(reader.call, [t.writer for t in topology.tables])
    except WebError as exc:
        if exc.status != 403:
            raise
        return {}


def lease_json(lease: pb.Lease, now_ms: int,
               names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A lease as /api/leases shows it: times as UTC too; ``lease_id`` null where hidden; each
    table's catalog name where known (else null)."""
    barrier_ms = wall_ms_of(lease.barrier_ts)
    names = names or {}
    return {"lease_id": lease.lease_id or None, "holder": lease.holder,
            "tables": [{"table": t.table, "name": names.get(t.table),
                        "delta_version": t.delta_version} for t in lease.tables],
            "barrier_ts": lease.barrier_ts, "barrier_unix_ms": barrier_ms,
            "barrier": utc_time(barrier_ms),
            "created_unix_ms": lease.created_unix_ms, "created": utc_time(lease.created_unix_ms),
            "expires_unix_ms": lease.expires_unix_ms, "expires": utc_time(lease.expires_unix_ms),
            "expires_in_s": max(0.0, (lease.expires_unix_ms - now_ms) / 1000)}


def _tables(query: dict[str, list[str]]) -> list[str]:
    return [t.strip() for t in query.get("table", []) if t.strip()]


def hanging_view(reader: Reader, query: dict[str, list[str]]) -> dict[str, Any]:
    older = _older_than(query, 120.0)
    assert older is not None
    pipeline = _one(query, "pipeline")
    unfinished = list(reader.transactions(pb.ListTransactionsRequest(
        pipeline_id=pipeline, states=UNFINISHED, page_size=MAX_LIMIT)))
    every = unfinished
    if pipeline and any(t["waiting_for_table"] for t in unfinished):
        every = list(reader.transactions(pb.ListTransactionsRequest(
            states=UNFINISHED, page_size=MAX_LIMIT)))
    quarantines = [quarantine_json(q) for q in reader.call(
        "ListQuarantines", pb.ListQuarantinesRequest(pipeline_id=pipeline)).quarantines]
    return {"older_than_s": older, "pipeline_id": pipeline,
            "transactions": find_hanging(unfinished, every, older, quarantines)}


# ---------------------------------------------------------------- HTML

def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _link(path: str, label: Any) -> str:
    return f'<a href="{_e(path)}">{_e(label)}</a>'


def _txn_link(txn_id: str) -> str:
    return _link("/transactions/" + urllib.parse.quote(txn_id, safe=""), txn_id)


def _pipeline_link(pipeline_id: str) -> str:
    return _link("/pipelines/" + urllib.parse.quote(pipeline_id, safe=""), pipeline_id)


def _table(header: list[str], rows: list[list[str]], empty: str) -> str:
    """``rows`` hold HTML already escaped (cells built with _e or the link helpers)."""
    if not rows:
        return f'<p class="empty">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fields(pairs: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


_STYLE = """body{font-family:system-ui,sans-serif;margin:0;color:#222}
header{background:#1f3a5f;color:#fff;padding:.6em 1.2em}header a{color:#fff;margin-right:1.2em}
main{padding:1em 1.2em}table{border-collapse:collapse;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#eef2f7}
dl{display:grid;grid-template-columns:12em auto;gap:.2em 1em}dt{font-weight:600}dd{margin:0}
.state{font-weight:600}.error{color:#a00}.empty{color:#666}form{margin:.5em 0 1em}
form input{margin-right:.8em}"""


def page(title: str, body: str) -> str:
    nav = "".join(_link(path, label) for path, label in (
        ("/", "Pipelines"), ("/transactions", "Transactions"), ("/hanging", "Hanging"),
        ("/topology", "Topology"), ("/leases", "Leases")))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{_e(title)} - percolake</title><style>{_STYLE}</style></head><body>"
            f"<header><strong>percolake</strong> &nbsp; {nav}</header>"
            f"<main><h1>{_e(title)}</h1>{body}</main></body></html>")


def _age(seconds: float | None) -> str:
    return _e(age_text(seconds))


def _txn_rows(txns: list[dict[str, Any]]) -> list[list[str]]:
    return [[_txn_link(t["txn_id"]), _pipeline_link(t["pipeline_id"]), _e(t["generation"]),
             _e(t["batch_id"]), _e(t["attempt"]), f'<span class="state">{_e(t["state"])}</span>',
             _age(t["age_s"]), _e(t["created"]), _e(", ".join(x["table"] for x in t["tables"])),
             _e(t["abort_reason"])] for t in txns]


_TXN_HEADER = ["Transaction", "Pipeline", "Gen", "Batch", "Attempt", "State", "Age",
               "Created (UTC)", "Tables", "Abort reason"]


def pipelines_html(pipelines: list[dict[str, Any]]) -> str:
    rows = [[_pipeline_link(p["pipeline_id"]), _e(p["generation"]), _e(p["epoch"]),
             _e(p["query_id"]), _e(p["last_committed_batch_id"]), _e(p["last_commit"]),
             _age(p["seconds_since_last_commit"]),
             _link("/transactions?pipeline=" + urllib.parse.quote(p["pipeline_id"], safe=""),
                   "transactions")] for p in pipelines]
    return page("Pipelines", _table(
        ["Pipeline", "Generation", "Epoch", "Query id", "Last batch", "Last commit (UTC)",
         "Since", ""], rows, "no pipelines"))


def transactions_html(txns: list[dict[str, Any]], query: dict[str, list[str]]) -> str:
    form = ('<form method="get" action="/transactions">'
            f'pipeline <input name="pipeline" value="{_e(_one(query, "pipeline"))}">'
            f'state <input name="state" value="{_e(",".join(query.get("state", [])))}" '
            'placeholder="OPEN,PREWRITTEN">'
            f'older than <input name="older-than" value="{_e(_one(query, "older-than"))}" '
            'placeholder="5m">'
            f'limit <input name="limit" value="{_e(_one(query, "limit", "100"))}" size="5">'
            '<input type="submit" value="Filter"></form>')
    return page("Transactions", form + _table(_TXN_HEADER, _txn_rows(txns),
                                              "no transactions match"))


def transaction_html(txn: dict[str, Any]) -> str:
    fields = _fields([
        ("transaction", _e(txn["txn_id"])), ("state", _e(txn["state"])),
        ("pipeline", _pipeline_link(txn["pipeline_id"])), ("generation", _e(txn["generation"])),
        ("batch", _e(txn["batch_id"])), ("attempt", _e(txn["attempt"])),
        ("epoch", _e(txn["epoch"])), ("query id", _e(txn["query_id"] or "(none)")),
        ("principal", _e(txn["principal"] or "(none)")), ("created", _e(txn["created"])),
        ("updated", _e(txn["updated"])), ("age", _age(txn["age_s"])),
        ("start_ts", _e(txn["start_ts"])),
        ("commit_ts", _e(f"{txn['commit_ts']} ({txn['committed']})" if txn["commit_ts"]
                         else "(not committed)")),
        ("waiting for table", _e(txn["waiting_for_table"] or "(none)")),
        ("abort reason", _e(txn["abort_reason"] or "(none)"))])
    tables = _table(
        ["Table", "Mode", "Prewritten", "Files", "Rows", "Applied", "Delta version",
         "Write location"],
        [[_e(t["table"] + (f" ({t['name']})" if t.get("name") else "")), _e(t["mode"]),
          _e("yes" if t["prewritten"] else "no"),
          _e(t["file_count"]), _e(t["row_count"]), _e("yes" if t["applied"] else "no"),
          _e(t["delta_version"]), _e(t["write_location"])] for t in txn["tables"]],
        "no tables")
    return page(f"Transaction {txn['txn_id']}", fields + "<h2>Tables</h2>" + tables)


def pipeline_html(pipeline: dict[str, Any]) -> str:
    fields = _fields([
        ("pipeline", _e(pipeline["pipeline_id"])), ("generation", _e(pipeline["generation"])),
        ("epoch", _e(pipeline["epoch"])), ("query id", _e(pipeline["query_id"] or "(unbound)")),
        ("created", _e(pipeline["created"])),
        ("last batch", _e(pipeline["last_committed_batch_id"])),
        ("last commit", _e(pipeline["last_commit"] or "(never)")),
        ("since last commit", _age(pipeline["seconds_since_last_commit"])),
        ("tables", "<br>".join(_table_cell(t, pipeline["table_names"])
                               for t in pipeline["tables"]) or _e("(none)")),
        ("transactions", _link("/transactions?pipeline=" + urllib.parse.quote(
            pipeline["pipeline_id"], safe=""), "all of this pipeline's"))])
    resets = _table(["From generation", "To generation", "When (UTC)", "Reason"],
                    [[_e(r["from_generation"]), _e(r["to_generation"]), _e(r["reset"]),
                      _e(r["reason"])] for r in pipeline["resets"]], "no resets")
    live = _table(_TXN_HEADER, _txn_rows(pipeline["live_attempts"]), "no live attempt")
    return page(f"Pipeline {pipeline['pipeline_id']}",
                fields + "<h2>Live attempts</h2>" + live + "<h2>Resets</h2>" + resets)


def hanging_html(found: dict[str, Any]) -> str:
    rows = []
    for txn in found["transactions"]:
        wait = txn["waiting_for"]
        holder = "" if wait is None else (
            _txn_link(wait["holder_txn_id"]) + _e(f" ({wait['holder_pipeline_id']}, "
                                                  f"{wait['holder_state']})")
            if wait["holder_txn_id"] else _e("(released)"))
        rows.append([_txn_link(txn["txn_id"]), _pipeline_link(txn["pipeline_id"]),
                     _e(txn["batch_id"]), _e(txn["state"]), _age(txn["age_s"]),
                     _e(", ".join(t["table"] for t in txn["tables"])),
                     _e(wait["table"] if wait else ""), holder])
    intro = (f"<p>Transactions OPEN, PREWRITTEN, or COMMITTED but not yet applied, created "
             f"longer ago than {_age(found['older_than_s'])} (change with "
             "<code>?older-than=30s</code>), and every one holding a quarantined table.</p>")
    quarantined = [[_e(q["table"]), _txn_link(q["txn_id"]), _e(q["quarantined"]),
                    _e(q["reason"]), f"<code>{_e(q['release_command'])}</code>"]
                   for txn in found["transactions"] for q in txn["quarantined"]]
    return page("Hanging transactions", intro + _table(
        ["Transaction", "Pipeline", "Batch", "State", "Age", "Holds", "Waiting for", "Held by"],
        rows, "no hanging transaction") + "<h2>Quarantined tables</h2>" + _table(
        ["Table", "Transaction", "Since", "Why", "Release with"], quarantined,
        "no quarantined table"))


def _pipeline_links(pipeline_ids: list[str]) -> str:
    return ", ".join(_pipeline_link(p) for p in pipeline_ids) or _e("-")


def _table_cell(table: str, names: Mapping[str, str] | None = None) -> str:
    """A table's location, and its catalog name where known."""
    name = (names or {}).get(table)
    return f"<code>{_e(table)}</code>" + (f" <b>{_e(name)}</b>" if name else "")


def _barrier(ts: int | None, utc: str | None = None, unknown: str = "(not known yet)") -> str:
    """A barrier as its UTC wall time and its raw oracle timestamp."""
    if ts is None:
        return _e(unknown)
    return f"{_e(utc or utc_time(wall_ms_of(ts)))}<br><small>ts {_e(ts)}</small>"


def _leases_link(tables: list[str], label: str) -> str:
    return _link("/leases?" + urllib.parse.urlencode([("table", t) for t in tables]), label)


def topology_html(topology: dict[str, Any]) -> str:
    pipelines = _table(
        ["Pipeline", "Generation", "Kind", "Reads", "Writes", "Own delay", "End-to-end delay",
         "Last input barrier (UTC)"],
        [[_pipeline_link(p["pipeline_id"]), _e(p["generation"]),
          _e("root" if p["root"] else "downstream"),
          "<br>".join(_table_cell(t, topology["names"]) for t in p["reads"]) or _e("-"),
          "<br>".join(_table_cell(t, topology["names"]) for t in p["writes"]) or _e("-"),
          _e(delay_text(p["own_delay_ms"])), _e(delay_text(p["end_to_end_delay_ms"])),
          _e("-") if p["root"] else _barrier(p["last_input_barrier_ts"], unknown="(none yet)")]
         for p in topology["pipelines"]], "no pipelines")
    tables = _table(
        ["Table", "Writer", "Readers", "Completed barrier (UTC)", "Delay", "Bottleneck",
         ""],
        [[_table_cell(t["table"], topology["names"]),
          _pipeline_links([t["writer"]] if t["writer"] else []),
          _pipeline_links(t["readers"]),
          _barrier(t["completed_barrier_ts"], t["completed_barrier"]),
          _e(delay_text(t["delay_ms"])),
          "" if t["bottleneck_pipeline"] is None else _pipeline_link(t["bottleneck_pipeline"])
          + _e(f" ({delay_text(t['bottleneck_delay_ms'])})"),
          _leases_link([t["table"]], "leases")] for t in topology["tables"]], "no tables")
    interval = f"{topology['barrier_interval_ms'] / 1000:g}"
    intro = (f"<p>Global barriers every {_e(interval)} s; "
             f"answered at {_barrier(topology['now_ts'], topology['now'])}. A table's delay is "
             "now minus its completed barrier; its bottleneck is the pipeline with the largest "
             "own delay on its way from the roots (docs/topology.md).</p>")
    return page("Topology", intro + "<h2>Pipelines</h2>" + pipelines + "<h2>Tables</h2>"
                + tables)


def leases_html(leases: dict[str, Any]) -> str:
    rows = [[_e(lease["lease_id"] or "(hidden: another principal's)"), _e(lease["holder"]),
             "<br>".join(f"{_table_cell(t['table'], leases['names'])} "
                         f"v{_e(t['delta_version'])}"
                         for t in lease["tables"]),
             _barrier(lease["barrier_ts"], lease["barrier"]), _e(lease["created"]),
             _e(lease["expires"]) + _e(f" (in {age_text(lease['expires_in_s'])})")]
            for lease in leases["leases"]]
    scope = ("on " + ", ".join(_table_cell(t) for t in leases["tables"]) if leases["tables"]
             else "on every table")
    intro = (f"<p>Live snapshot leases {scope} (vacuum keeps their files until they expire); "
             "name tables with <code>?table=T</code> (repeat it). The ids of other principals' "
             "leases are shown only to an ADMIN.</p>")
    return page("Leases", intro + _table(
        ["Lease", "Holder", "Tables (Delta version)", "Barrier (UTC)", "Created (UTC)",
         "Expires (UTC)"], rows, "no live lease"))


def error_html(error: WebError) -> str:
    body = f'<p class="error">{_e(error)}</p>'
    if error.leader:
        body += f"<p>The leader is at <code>{_e(error.leader)}</code>.</p>"
    return page(f"Error {error.status}", body)


# ---------------------------------------------------------------- routing and serving

def route(reader: Reader, path: str, query: dict[str, list[str]]) -> tuple[Any, Callable[[], str]]:
    """(the JSON data, its HTML page) of ``path`` without the ``/api`` prefix."""
    if path in ("/", "/pipelines"):
        pipelines = pipelines_view(reader, query)
        return pipelines, lambda: pipelines_html(pipelines)
    if path == "/transactions":
        txns = transactions_view(reader, query)
        return txns, lambda: transactions_html(txns, query)
    if path == "/hanging":
        found = hanging_view(reader, query)
        return found, lambda: hanging_html(found)
    if path == "/topology":
        topology = topology_view(reader, query)
        return topology, lambda: topology_html(topology)
    if path == "/leases":
        leases = leases_view(reader, query)
        return leases, lambda: leases_html(leases)
    for prefix, view, render in (("/transactions/", transaction_view, transaction_html),
                                 ("/pipelines/", pipeline_view, pipeline_html)):
        if path.startswith(prefix) and len(path) > len(prefix):
            data = view(reader, urllib.parse.unquote(path[len(prefix):]))
            return data, lambda data=data, render=render: render(data)
    raise WebError(404, f"no page {path}; see /, /transactions, /hanging, /topology, /leases "
                   "and /api/...")


class WebServer:
    """The web view on ``host:port`` (0: a free port); ``cores`` gives the running core
    provider (None while starting); ``access`` what callers must present."""

    def __init__(self, host: str, port: int, cores: Callable[[], CoreProvider | None],
                 access: HttpAccess) -> None:
        self._http = HttpServer(host, port, _Handler, access, "web",
                                cores=staticmethod(cores))
        self.port = self._http.port

    def stop(self) -> None:
        self._http.stop()


class _Handler(CallerHandler):
    cores: Callable[[], CoreProvider | None]
    server_version = "percolake-web"

    def do_GET(self) -> None:  # noqa: N802
        parts = urllib.parse.urlsplit(self.path)
        path = parts.path
        is_api = path == "/api" or path.startswith("/api/")
        if is_api:
            path = path[len("/api"):] or "/"
        query = urllib.parse.parse_qs(parts.query)
        principal = ""
        try:
            principal = self._principal()
            reader = Reader(self.cores(), self.access.credentials,
                            None if self.access.credentials is None else principal)
            data, render = route(reader, path, query)
        except WebError as exc:
            if exc.status in (401, 403):
                self.audit_refusal(principal, "UNAUTHENTICATED" if exc.status == 401
                                   else "PERMISSION_DENIED", str(exc))
            self._error(exc, is_api)
            return
        except InvalidArgument as exc:
            self._error(WebError(400, str(exc)), is_api)
            return
        except Exception as exc:  # a bug: loud in the log, a 500 to the browser
            log.exception("web view failed", extra={"path": parts.path})
            self._error(WebError(500, f"{type(exc).__name__}: {exc}"), is_api)
            return
        if is_api:
            self._send(200, "application/json", json.dumps(data))
        else:
            self._send(200, "text/html; charset=utf-8", render())

    def _principal(self) -> str:
        try:
            return self.principal() or ""
        except Unauthenticated as exc:
            if exc.code == grpc.StatusCode.UNAVAILABLE:
                raise WebError(503, str(exc)) from exc
            raise WebError(401, f"{exc}: {HTTP_EXPECTED}") from exc

    def _error(self, error: WebError, is_api: bool) -> None:
        extra = {"WWW-Authenticate": 'Bearer realm="percolake"'} if error.status == 401 else {}
        if error.leader:
            extra["X-Percolake-Leader"] = error.leader
        if is_api:
            self._send(error.status, "application/json", json.dumps(
                {"error": str(error), "status": error.status, "leader": error.leader}), extra)
        else:
            self._send(error.status, "text/html; charset=utf-8", error_html(error), extra)

    def _send(self, status: int, content_type: str, text: str,
              extra: dict[str, str] | None = None) -> None:
        body = text.encode()
        self.send_response(status)
        for name, value in {**_HEADERS, **(extra or {}), "Content-Type": content_type,
                            "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
