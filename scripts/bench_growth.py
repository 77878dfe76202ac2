"""How the coordinator's cost grows: with the size of a transaction, and with history.

1. Cost per transaction vs tables per transaction (1, 3, 10, 30) and files per table (10, 100,
   1,000): one client runs Open(tables) -> Commit(writes) -> ReportApplied against a real
   daemon; prints latency, the daemon's CPU per transaction, request and store bytes.
2. History: bulk-loads 10^6 (``--quick``: 10^5) APPLIED/ABORTED transactions straight into a
   SQLite store (executemany, not RPCs), then times DaemonProcess.start() to SERVING and the
   first requests, against the same with an empty store; store size.
3. Retention: one full prune of that history past the horizon (in-process, as the daemon's
   resolver runs it), rows left, live store size, and restart time after it.
4. A table's life: requests and ms per real percolake batch of 3 tables (without Spark:
   ``scripts/_lakebatch.py``) at Delta versions 10, 100, 1,000 and 10,000, on local tables and
   on S3 (moto on 127.0.0.1, requests counted in its access log), with checkpoints every 10
   versions (this branch: ``percolake.lake.checkpoints``) and, up to 100 versions on S3 and
   1,000 locally, without any checkpoint (the log replayed from version 0). The versions are
   built by writing log entries directly; the batches measured are real.

    python scripts/bench_growth.py --quick --json /tmp/growth.json
    python scripts/bench_growth.py --life-only --versions 10,100,1000,10000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _benchlib as bl  # noqa: E402
import _lakebatch as lb  # noqa: E402

from coordinator.launcher import DaemonProcess  # noqa: E402
from coordinator.oracle import LOGICAL_BITS  # noqa: E402
from coordinator.store import SqliteStore  # noqa: E402

DAEMON_ARGS = ["--roll-forward-after", "1000000", "--txn-timeout", "600", "--log-level",
               "warning"]
SCHEMA_JSON = bl.HISTORY_SCHEMA_JSON


def _stub(target: str):  # noqa: ANN202
    import grpc

    from percolake.v1 import coordinator_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(target)
    return channel, pb_grpc.CoordinatorStub(channel)


def cost_per_txn(target: str, pid: int, warehouse: Path, tables: int, files: int,
                 budget_s: float, max_txns: int) -> dict:
    """Sequential transactions of ``tables`` x ``files``; latencies and daemon CPU."""
    from percolake.v1 import coordinator_pb2 as pb

    channel, stub = _stub(target)
    pipeline = f"growth-{tables}x{files}-{uuid.uuid4().hex[:6]}"
    names = [str(warehouse / pipeline / f"t{k}") for k in range(tables)]
    lat: dict[str, list[float]] = {"open": [], "commit": [], "report": [], "txn": []}
    request_bytes = 0
    cpu0 = bl.cpu_seconds(pid)
    start = time.monotonic()
    batch = 0
    while batch < max_txns and (batch < 3 or time.monotonic() - start < budget_s):
        t0 = time.perf_counter()
        txn = stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=batch, tables=names), timeout=120).transaction
        t1 = time.perf_counter()
        writes = [pb.TableWrite(
            table=name, mode=pb.APPEND, schema_json=SCHEMA_JSON,
            add_files=[pb.AddFile(path=f"_percolake/{txn.txn_id}/part-{i:05d}.parquet",
                                  size=100_000, modification_time=1_700_000_000_000,
                                  stats=bl.HISTORY_STATS) for i in range(files)]) for name in names]
        request = pb.CommitTransactionRequest(txn_id=txn.txn_id, tables=names, writes=writes)
        request_bytes = request.ByteSize()
        stub.CommitTransaction(request, timeout=120)
        t2 = time.perf_counter()
        stub.ReportApplied(pb.ReportAppliedRequest(
            txn_id=txn.txn_id, tables=[pb.AppliedTable(table=n, delta_version=batch)
                                       for n in names]), timeout=120)
        t3 = time.perf_counter()
        lat["open"].append(t1 - t0)
        lat["commit"].append(t2 - t1)
        lat["report"].append(t3 - t2)
        lat["txn"].append(t3 - t0)
        batch += 1
    cpu = bl.cpu_seconds(pid) - cpu0
    channel.close()
    return {"tables": tables, "files": files, "txns": batch,
            "daemon_cpu_ms_per_txn": cpu * 1e3 / batch, "commit_request_bytes": request_bytes,
            "latency_ms": {k: bl.summary_ms(v) for k, v in lat.items()}}


def bulk_load(data_dir: Path, warehouse: Path, count: int, pipelines: int,
              age_days: float) -> dict:
    """Writes ``count`` historical transactions (3 tables x 4 files each, 1% aborted) and
    their snapshot-index rows straight into the store, spread over ``age_days`` ending a day
    and a half ago (so all of it is past a 24 h retention horizon)."""
    SqliteStore(data_dir).close()  # creates the schema
    conn = sqlite3.connect(data_dir / "coordinator.db", isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    end_ms = int(time.time() * 1000) - 36 * 3600 * 1000
    start_ms = end_ms - int(age_days * 86400 * 1000)
    step = (end_ms - start_ms) / count
    t0 = time.monotonic()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO pipelines VALUES (?, 0, 1, ?, ?, ?, '[]', 0)",
                     [(f"hist-{p}", str(uuid.uuid4()), start_ms, end_ms)
                      for p in range(pipelines)])
    max_ts = 0
    chunk: list[tuple] = []
    commits: list[tuple] = []
    for i in range(count):
        pipeline = i % pipelines
        batch = i // pipelines
        created = int(start_ms + i * step)
        start_ts = (created << LOGICAL_BITS) + (i & 0xFFF)
        aborted = i % 100 == 99
        commit_ts = 0 if aborted else start_ts + 7
        txn_id = uuid.uuid4().hex
        entries = []
        for k in range(3):
            table = f"file://{warehouse}/hist-{pipeline}/t{k}"
            entries.append(bl.history_table_entry(table, txn_id, created, True,
                                                  None if aborted else batch))
            if not aborted:
                commits.append((table, commit_ts, txn_id, batch))
        chunk.append((txn_id, f"hist-{pipeline}", 0, batch, 1 if not aborted else 2, 1, "",
                      "ABORTED" if aborted else "APPLIED", start_ts, commit_ts,
                      "[" + ",".join(entries) + "]", "aborted" if aborted else "",
                      created, created + 50, 3))
        max_ts = max(max_ts, commit_ts, start_ts)
        if len(chunk) >= 20_000:
            conn.executemany("INSERT INTO transactions VALUES "
                             "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", chunk)
            conn.executemany("INSERT INTO table_commits VALUES (?, ?, ?, ?)", commits)
            chunk, commits = [], []
    if chunk:
        conn.executemany("INSERT INTO transactions VALUES "
                         "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", chunk)
        conn.executemany("INSERT INTO table_commits VALUES (?, ?, ?, ?)", commits)
    conn.execute("INSERT INTO meta VALUES ('ts_high_water', ?) ON CONFLICT(key) DO UPDATE "
                 "SET value = max(value, excluded.value)", (max_ts + 1,))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return {"transactions": count, "pipelines": pipelines, "load_s": time.monotonic() - t0}


def store_bytes(data_dir: Path) -> dict:
    """File and live (used pages) size of the store, after checkpointing its WAL."""
    conn = sqlite3.connect(data_dir / "coordinator.db")
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    files = sum(p.stat().st_size for p in data_dir.glob("coordinator.db*"))
    pages, free, size = (conn.execute(f"PRAGMA {p}").fetchone()[0]
                         for p in ("page_count", "freelist_count", "page_size"))
    txns = conn.execute("SELECT count(*) FROM transactions").fetchone()[0]
    rows = conn.execute("SELECT count(*) FROM table_commits").fetchone()[0]
    conn.close()
    return {"file_bytes": files, "live_bytes": (pages - free) * size, "transactions": txns,
            "table_commits": rows}


def restart_to_serving(data_dir: Path, warehouse: Path, tries: int,
                       extra: list[str]) -> dict:
    """DaemonProcess.start() until health SERVING, then the first Open and GetSnapshot."""
    from percolake.v1 import coordinator_pb2 as pb

    serving: list[float] = []
    first: list[float] = []
    for _ in range(tries):
        daemon = DaemonProcess(data_dir, [str(warehouse)], extra_args=[*DAEMON_ARGS, *extra])
        t0 = time.monotonic()
        daemon.start()
        t1 = time.monotonic()
        channel, stub = _stub(daemon.target)
        pipeline = f"hist-{0}"
        tables = [str(warehouse / pipeline / f"t{k}") for k in range(3)]
        stub.GetSnapshot(pb.GetSnapshotRequest(tables=tables), timeout=60)
        t2 = time.monotonic()
        channel.close()
        serving.append(t1 - t0)
        first.append(t2 - t1)
        daemon.stop()
    return {"to_serving_s": min(serving), "to_serving_max_s": max(serving),
            "first_snapshot_ms": min(first) * 1e3}


def prune_all(data_dir: Path, warehouse: Path, hours: float) -> dict:
    from coordinator.core import CoordinatorConfig, TransactionCoordinator

    store = SqliteStore(data_dir, group_commit=True)
    core = TransactionCoordinator(store, CoordinatorConfig([str(warehouse)],
                                                           retention_hours=hours))
    t0 = time.monotonic()
    txns, rows = core.prune_history(chunk=5000)
    elapsed = time.monotonic() - t0
    t1 = time.monotonic()
    again = core.prune_history(chunk=5000)
    idle_pass = time.monotonic() - t1
    store.close()
    return {"deleted_transactions": txns, "deleted_index_rows": rows, "prune_s": elapsed,
            "idle_pass_ms": idle_pass * 1e3, "second_pass": again}



PHASES = ("schema check", "open", "data files", "commit", "3 applies", "report")
NO_CHECKPOINT_UPTO = {"local": 1000, "s3": 100}  # beyond: minutes per batch, not measured


class _Deferred:
    """Collects what the applies hand to the checkpointer: released after the batch's timed
    window, so its requests are counted apart (it runs off the batch's path)."""

    def __init__(self) -> None:
        self.handed: list[tuple[str, int]] = []

    def applied(self, table: str, version: int) -> None:
        self.handed.append((table, version))


def table_life(work: Path, stores: list[str], levels: list[int], batches: int) -> list[dict]:
    """Requests and ms per batch at each Delta version level, per store and checkpointing."""
    from percolake.lake.checkpoints import Checkpointer

    moto = None
    log_path = work / "moto.log"
    roots: dict[str, str] = {"local": str(work / "life")}
    Path(roots["local"]).mkdir(parents=True, exist_ok=True)
    if "s3" in stores:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.s3_support import MotoServer

        moto = MotoServer(log_path=log_path).start()
        os.environ.update(moto.env())
        roots["s3"] = f"s3://{moto.create_bucket('growth')}/life"
    daemon = DaemonProcess(work / "data-life", list(roots.values()),
                           env=moto.env() if moto else None, extra_args=DAEMON_ARGS)
    daemon.start()
    rows: list[dict] = []
    try:
        for store in stores:
            for level in levels:
                for mode in ("none", "every 10"):
                    if mode == "none" and level > NO_CHECKPOINT_UPTO[store]:
                        continue
                    rows.append(_life_run(daemon.target, roots[store], store, level, mode,
                                          batches, log_path if moto else None, Checkpointer))
                    row = rows[-1]
                    print(f"{store:5s} v{level:>6,} checkpoints {mode:8s}: batch p50 "
                          f"{row['batch_ms']:.1f} ms, {row['requests']} requests/batch",
                          flush=True)
    finally:
        daemon.stop()
        if moto is not None:
            moto.stop()
    return rows


def _checksum(request: tuple[str, str]) -> bool:
    """A version checksum's request (``_delta_log/<v>.crc``: the previous one read, the new one
    put): made by a background thread after each apply, off the batch's path."""
    return request[1].split("?", 1)[0].endswith(".crc")


def _on_path(requests: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [r for r in requests if not _checksum(r)]


def _life_run(target: str, root: str, store: str, level: int, mode: str, batches: int,
              log_path: Path | None, checkpointer_class: type) -> dict:
    from percolake.lake.delta_commit import open_table
    from percolake.lake.version_checksum import background_written

    run = f"life-{store}-{level}-{mode.replace(' ', '')}-{uuid.uuid4().hex[:6]}"
    tables = [f"{root}/{run}/t{k}" for k in range(3)]
    if store == "local":
        tables = ["file://" + t for t in tables]
    pipeline = run
    first = lb.ProtocolBatches(target, pipeline, tables)
    first.run(0)  # creates the tables (version 0)
    first.close()
    t0 = time.monotonic()
    for table in tables:
        lb.grow_log(table, pipeline, level, 10 if mode == "every 10" else 10**9)
    build_s = time.monotonic() - t0
    assert all(open_table(t).version() == level for t in tables)
    checkpointer = checkpointer_class()
    deferred = _Deferred()
    runner = lb.ProtocolBatches(target, pipeline, tables,
                                deferred if mode == "every 10" else None)
    mark = (lambda: log_path.stat().st_size) if log_path else (lambda: 0)  # noqa: E731
    times, requests, checkpoint_requests, checksum_requests = [], [], [], []
    profiles: list[list[dict[str, int]]] = []
    for k in range(batches + 1):  # the first one warms the participant's layout cache
        batch = runner.run(level + 1 + k, mark)
        if log_path is not None:  # the version checksums are written meanwhile: left out
            phases = [bl.request_kinds(_on_path(bl.moto_requests(log_path, run, a)))
                      for a in batch.marks[:-1]]
            # each phase's own: from its mark to the next (later phases subtracted)
            own = [{kind: n - phases[i + 1].get(kind, 0) for kind, n in phase.items()}
                   if i + 1 < len(phases) else phase for i, phase in enumerate(phases)]
            counted = sum(phases[0].values())
        before = mark()
        for table, version in deferred.handed:
            checkpointer.applied(table, version)
        deferred.handed.clear()
        checkpointer.flush(600)
        background_written(600)  # this batch's checksums: counted apart, below
        if k == 0:
            continue
        times.append(batch)
        if log_path is not None:
            requests.append(counted)
            profiles.append(own)
            checkpoint_requests.append(len(_on_path(bl.moto_requests(log_path, run, before))))
            checksum_requests.append(sum(map(_checksum, bl.moto_requests(log_path, run,
                                                                         batch.marks[0]))))
    checkpointer.close()
    runner.close()
    median = statistics.median
    return {"store": store, "level": level, "mode": mode, "build_s": build_s,
            "batches": len(times),
            "batch_ms": median(t.batch for t in times) * 1e3,
            "schema_check_ms": median(t.schema_check for t in times) * 1e3,
            "open_ms": median(t.open for t in times) * 1e3,
            "commit_ms": median(t.commit for t in times) * 1e3,
            "apply_ms": median(t.apply for t in times) * 1e3,
            "report_ms": median(t.report for t in times) * 1e3,
            "requests": median(requests) if requests else "–",
            # a checkpoint is due every 10th batch: the mean per batch, not the median
            "checkpoint_requests": statistics.fmean(checkpoint_requests)
            if checkpoint_requests else "–",
            # the version checksums of the batch's 3 commits (background thread)
            "checksum_requests": median(checksum_requests) if checksum_requests else "–",
            # S3 requests of the last batch measured by phase and kind
            "profile": dict(zip(PHASES, profiles[-1], strict=True)) if profiles else {}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--history", type=int, help="historical transactions to bulk-load")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--workdir")
    parser.add_argument("--life-only", action="store_true",
                        help="only the table's life (batch cost at many Delta versions)")
    parser.add_argument("--versions", default="10,100,1000,10000",
                        help="the Delta version levels of the table's life")
    parser.add_argument("--stores", default="local,s3")
    parser.add_argument("--batches", type=int, help="batches measured per level")
    args = parser.parse_args()
    history = args.history or (100_000 if args.quick else 1_000_000)
    budget = 2.0 if args.quick else 6.0
    if args.quick:
        shapes = [(t, 10) for t in (1, 3, 10, 30)] + [(3, f) for f in (100, 1000)]
    else:
        shapes = [(t, f) for f in (10, 100, 1000) for t in (1, 3, 10, 30)]
    info = bl.machine_info()
    print(f"bench_growth: {bl.machine_line(info)}", flush=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="percolake-growth-"))
    warehouse = work / "warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": info, "shapes": [], "history": {}, "life": []}
    try:
        result["life"] = table_life(work, args.stores.split(","),
                                    [int(v) for v in args.versions.split(",")],
                                    args.batches or (3 if args.quick else 5))
        if args.life_only:
            bl.publish("bench_growth", info, render_life(result["life"]), result, args.json,
                       not args.no_append)
            return 0
        daemon = DaemonProcess(work / "data-shapes", [str(warehouse)], extra_args=DAEMON_ARGS)
        daemon.start()
        try:
            for tables, files in shapes:
                before = store_bytes(daemon.data_dir)["live_bytes"]
                run = cost_per_txn(daemon.target, daemon.process.pid, warehouse, tables, files,
                                   budget, 200)
                run["store_bytes_per_txn"] = (store_bytes(daemon.data_dir)["live_bytes"]
                                              - before) / run["txns"]
                result["shapes"].append(run)
                print(f"{tables:2d} tables x {files:4d} files: txn p50 "
                      f"{run['latency_ms']['txn']['p50']:.1f} ms, daemon "
                      f"{run['daemon_cpu_ms_per_txn']:.2f} CPU ms/txn", flush=True)
        finally:
            daemon.stop()
        empty = work / "data-empty"
        SqliteStore(empty).close()
        result["history"]["empty_restart"] = restart_to_serving(empty, warehouse, 3, [])
        print(f"empty store: {result['history']['empty_restart']}", flush=True)
        data = work / "data-history"
        data.mkdir()
        print(f"bulk-loading {history:,} transactions ...", flush=True)
        result["history"]["load"] = bulk_load(data, warehouse, history, 100, 8.0)
        result["history"]["size"] = store_bytes(data)
        result["history"]["restart"] = restart_to_serving(data, warehouse, 3,
                                                          ["--retention-hours", "0"])
        print(f"history: {result['history']['size']} {result['history']['restart']}",
              flush=True)
        result["history"]["prune"] = prune_all(data, warehouse, 24.0)
        result["history"]["size_after_prune"] = store_bytes(data)
        result["history"]["restart_after_prune"] = restart_to_serving(
            data, warehouse, 3, ["--retention-hours", "0"])
        print(f"prune: {result['history']['prune']} {result['history']['size_after_prune']}",
              flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    result["restart_to_serving_s"] = result["history"]["restart"]["to_serving_s"]
    bl.publish("bench_growth", info, render_life(result["life"]) + "\n" + render(result),
               result, args.json, not args.no_append)
    return 0


def render_life(rows: list[dict]) -> str:
    table = bl.table(
        ["store", "Delta version", "checkpoints", "batch ms p50", "schema check", "open",
         "commit", "3 applies", "report (background)", "S3 requests/batch",
         "checkpoint requests/batch (mean, background)",
         "checksum requests/batch (background)", "build s"],
        [[r["store"], f"{r['level']:,}", r["mode"], r["batch_ms"], r["schema_check_ms"],
          r["open_ms"], r["commit_ms"], r["apply_ms"], r["report_ms"],
          r["requests"] if r["store"] != "local" else "–",
          r["checkpoint_requests"] if r["store"] != "local" else "–",
          r.get("checksum_requests", "–") if r["store"] != "local" else "–", r["build_s"]]
         for r in rows])
    profiled = [r for r in rows if r.get("profile")]
    if profiled:
        table += ("\n\nS3 requests of one batch by phase and kind (the last measured):\n\n"
                  + bl.table(["Delta version", "checkpoints", *PHASES], [
                      [f"{r['level']:,}", r["mode"], *(
                          " ".join(f"{k} {n}" for k, n in sorted(r["profile"][p].items()) if n)
                          or "0" for p in PHASES)] for r in profiled]))
    return ("A table's life: one real percolake batch of 3 tables (schema check, Open, Commit "
            "with the daemon's write check, 3 Delta commits side by side; ReportApplied timed "
            "apart, as the participant sends it in the background) at each Delta version; "
            "median ms; S3 requests of the batch (its path: ReportApplied's own reads "
            "included, the version checksums not), of the checkpoints written after it and of "
            "the version checksums of its 3 commits (both by background threads, off the "
            "batch's path; moto's access log):\n\n"
            + table + "\n")


def render(result: dict) -> str:
    rows = []
    for run in result["shapes"]:
        lat = run["latency_ms"]
        rows.append([run["tables"], run["files"], run["txns"], lat["open"]["p50"],
                     lat["commit"]["p50"], lat["commit"]["p99"], lat["report"]["p50"],
                     lat["txn"]["p50"], lat["txn"]["p99"], run["daemon_cpu_ms_per_txn"],
                     run["daemon_cpu_ms_per_txn"] / (run["tables"] * run["files"]) * 1e3,
                     run["commit_request_bytes"] / 1024, run["store_bytes_per_txn"] / 1024])
    parts = ["Cost per transaction (one client, Open(tables) -> Commit(writes) -> "
             "ReportApplied; ms):\n",
             bl.table(["tables", "files/table", "txns", "open p50", "commit p50", "commit p99",
                       "report p50", "txn p50", "txn p99", "daemon CPU ms/txn",
                       "daemon CPU µs/file", "commit request KiB", "store KiB/txn"], rows)]
    h = result["history"]
    size, after = h["size"], h["size_after_prune"]
    parts.append("\nHistory, restart and retention:\n")
    parts.append(bl.table(["store", "transactions", "index rows", "file MiB", "live MiB",
                           "start() to SERVING s", "worst of 3 s", "first GetSnapshot ms"], [
        ["empty", 0, 0, float("nan"), float("nan"), h["empty_restart"]["to_serving_s"],
         h["empty_restart"]["to_serving_max_s"], h["empty_restart"]["first_snapshot_ms"]],
        [f"{h['load']['transactions']:,} historical", size["transactions"],
         size["table_commits"], size["file_bytes"] / 2**20, size["live_bytes"] / 2**20,
         h["restart"]["to_serving_s"], h["restart"]["to_serving_max_s"],
         h["restart"]["first_snapshot_ms"]],
        ["after retention (24 h)", after["transactions"], after["table_commits"],
         after["file_bytes"] / 2**20, after["live_bytes"] / 2**20,
         h["restart_after_prune"]["to_serving_s"], h["restart_after_prune"]["to_serving_max_s"],
         h["restart_after_prune"]["first_snapshot_ms"]]]))
    p = h["prune"]
    parts.append(f"\nBulk load of {h['load']['transactions']:,} transactions (100 pipelines, "
                 f"3 tables x 4 files each, 1% aborted, spread over 8 days): "
                 f"{h['load']['load_s']:.1f} s. One full retention pass deleted "
                 f"{p['deleted_transactions']:,} transactions and {p['deleted_index_rows']:,} "
                 f"index rows in {p['prune_s']:.1f} s (chunks of 5,000, each its own durable "
                 f"batch: {p['prune_s'] * 1e3 / max(1, p['deleted_transactions']):.2f} ms per "
                 f"transaction deleted with its index rows, which is how long a chunk holds the "
                 f"store); a pass with nothing to delete took {p['idle_pass_ms']:.1f} ms. "
                 "SQLite reuses the freed pages (live MiB); the file shrinks only with VACUUM.\n")
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
