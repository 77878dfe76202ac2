"""What atomic exactly-once costs a Spark streaming job: percolake vs the non-atomic baseline.

The same streaming job (``rate-micro-batch`` source, fixed rows per batch, 3 Delta tables
written per batch, N batches) runs

- (A) through percolake: ``Participant.wrap`` (Open declaring the tables, per table a schema
  check + executors write, Commit carrying the write intents, per table a delta-rs commit, one
  ReportApplied);
- (B) as the baseline people use today: the same executors' file-writing path
  (``sparkside.writer.write_files``), then each table committed on its own with a Delta app
  transaction (``apply_table_write``), no coordinator, no atomicity across tables.

Runs alternate A B B A A B ... after an unmeasured warm-up of both, so machine drift and
run order cancel. Per-batch time is measured inside
``foreachBatch`` (batch 0, which creates the tables, is left out). The coordinator's share of a
batch is the time the participant spends in coordinator RPCs (heartbeats excluded: they run
in the background).

    python scripts/bench_overhead.py --quick --json /tmp/overhead.json
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _benchlib as bl  # noqa: E402

from coordinator.launcher import DaemonProcess  # noqa: E402
from percolake.lake.warehouse import canonical_table_uri, write_location  # noqa: E402
from percolake.records import TableWriteRecord, WriteMode, delta_app_id  # noqa: E402

TABLES = ("debits", "credits", "balances")
PHASES: dict[str, float] = {}  # seconds spent per phase in the current run (driver thread)


def _timed(name: str, fn):  # noqa: ANN001, ANN202
    """Wraps ``fn`` to add its wall time to PHASES[name] (where a batch's time goes)."""

    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            PHASES[name] = PHASES.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


def _instrument() -> None:
    """Times the phases of both paths: file writing, Delta commits, the participant's schema
    check. The coordinator's RPC time is counted separately (heartbeats excluded)."""
    import sparkside.participant as participant
    import sparkside.writer as writer
    from percolake.lake import delta_commit

    participant.write_files = _timed("write files (executors)", participant.write_files)
    writer.write_files = participant.write_files
    participant.apply_table_write = _timed("Delta commits (delta-rs)",
                                           participant.apply_table_write)
    delta_commit.apply_table_write = participant.apply_table_write
    from sparkside import schema_check

    schema_check.SchemaChecker.check = _timed("schema check (participant)",
                                              schema_check.SchemaChecker.check)


def _tables(root: Path, run: str) -> list[str]:
    return [str(root / run / name) for name in TABLES]


def _frames(batch_df):  # noqa: ANN001, ANN202
    from pyspark.sql import functions as F

    base = batch_df.select(F.col("value").alias("id"), F.col("timestamp").alias("ts"))
    return [
        base.select("id", "ts", (F.col("id") % 97).cast("double").alias("amount")),
        base.select("id", "ts", (F.col("id") % 89).cast("double").alias("amount")),
        base.select((F.col("id") % 16).alias("account"), F.col("id").alias("last_id")),
    ]


def _run_query(spark, fn, checkpoint: Path, rows: int, batches: int,  # noqa: ANN001
               done: threading.Event) -> None:
    stream = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
              .option("numPartitions", 2).load())
    query = (stream.writeStream.foreachBatch(fn).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="0 seconds").start())
    try:
        while not done.wait(0.2):
            if query.exception() is not None:
                raise RuntimeError(f"streaming query failed: {query.exception()}")
    finally:
        query.stop()


def run_percolake(spark, target: str, root: Path, rows: int, batches: int) -> dict:  # noqa: ANN001
    from sparkside import Participant

    run = f"percolake-{uuid.uuid4().hex[:8]}"
    tables = _tables(root, run)
    participant = Participant(target, run)
    rpc_time = threading.local()
    original = participant.client.call

    def timed_call(method, request, *args, **kwargs):  # noqa: ANN001, ANN202
        t0 = time.perf_counter()
        try:
            return original(method, request, *args, **kwargs)
        finally:
            if method != "Heartbeat" and getattr(rpc_time, "on", False):
                rpc_time.total += time.perf_counter() - t0

    participant.client.call = timed_call  # type: ignore[method-assign]
    times: list[float] = []
    coordinator: list[float] = []
    done = threading.Event()

    def user_fn(batch_df, batch_id, txn):  # noqa: ANN001, ANN202
        for frame, table in zip(_frames(batch_df), tables, strict=True):
            txn.write(frame, table)

    wrapped = participant.wrap(user_fn)

    def batch_fn(batch_df, batch_id):  # noqa: ANN001, ANN202
        if done.is_set():
            return
        rpc_time.on, rpc_time.total = True, 0.0
        t0 = time.perf_counter()
        wrapped(batch_df, batch_id)
        elapsed = time.perf_counter() - t0
        rpc_time.on = False
        if batch_id > 0:
            times.append(elapsed)
            coordinator.append(rpc_time.total)
        else:
            PHASES.clear()
        if batch_id >= batches:
            done.set()

    _run_query(spark, batch_fn, root / run / "_checkpoint", rows, batches, done)
    participant.close()
    phases = {k: v / len(times) for k, v in PHASES.items()}
    phases["coordinator RPCs"] = statistics.fmean(coordinator)
    return {"times": times, "coordinator": coordinator, "phases": phases}


def run_baseline(spark, root: Path, rows: int, batches: int) -> dict:  # noqa: ANN001
    from percolake.lake import delta_commit
    from sparkside import writer

    run = f"baseline-{uuid.uuid4().hex[:8]}"
    tables = [canonical_table_uri(t) for t in _tables(root, run)]
    app_id = delta_app_id(run, 0)
    times: list[float] = []
    done = threading.Event()

    def batch_fn(batch_df, batch_id):  # noqa: ANN001, ANN202
        if done.is_set():
            return
        t0 = time.perf_counter()
        for frame, table in zip(_frames(batch_df), tables, strict=True):
            attempt = uuid.uuid4().hex
            adds = writer.write_files(frame, table, write_location(table, attempt), [])
            write = TableWriteRecord(table, WriteMode.APPEND, tuple(adds),
                                     writer.delta_schema_json(frame))
            delta_commit.apply_table_write(write, app_id=app_id, app_version=batch_id,
                                           txn_id=attempt, commit_ts=0)
        elapsed = time.perf_counter() - t0
        if batch_id > 0:
            times.append(elapsed)
        else:
            PHASES.clear()
        if batch_id >= batches:
            done.set()

    _run_query(spark, batch_fn, root / run / "_checkpoint", rows, batches, done)
    return {"times": times, "phases": {k: v / len(times) for k, v in PHASES.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--pairs", type=int, help="A/B run pairs")
    parser.add_argument("--batches", type=int, help="measured batches per run")
    parser.add_argument("--rows", type=int, default=10_000, help="rows per batch")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--workdir")
    args = parser.parse_args()
    pairs = args.pairs or (2 if args.quick else 5)
    batches = args.batches or (5 if args.quick else 20)
    info = bl.machine_info()
    print(f"bench_overhead: {bl.machine_line(info)}", flush=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="percolake-overhead-"))
    lake = work / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    from sparkside import local_spark

    _instrument()
    spark = local_spark("percolake-bench-overhead")
    spark.sparkContext.setLogLevel("ERROR")
    daemon = DaemonProcess(work / "data", [str(lake)], extra_args=["--log-level", "warning"])
    a: list[float] = []
    b: list[float] = []
    coord: list[float] = []
    per_run: list[dict] = []
    phases: dict[str, dict[str, list[float]]] = {"percolake": {}, "baseline": {}}
    try:
        daemon.start()
        # Warm the JVM and both code paths first (not measured): the first streaming query of
        # a session is much slower than the next ones.
        run_percolake(spark, daemon.target, lake, args.rows, 2)
        run_baseline(spark, lake, args.rows, 2)
        for pair in range(pairs):
            # A B, then B A: neither path always runs first (ABBA cancels drift and order).
            if pair % 2 == 0:
                ra = run_percolake(spark, daemon.target, lake, args.rows, batches)
                rb = run_baseline(spark, lake, args.rows, batches)
            else:
                rb = run_baseline(spark, lake, args.rows, batches)
                ra = run_percolake(spark, daemon.target, lake, args.rows, batches)
            a += ra["times"]
            b += rb["times"]
            coord += ra["coordinator"]
            for path, run in (("percolake", ra), ("baseline", rb)):
                for name, value in run["phases"].items():
                    phases[path].setdefault(name, []).append(value)
            per_run.append({"pair": pair, "percolake_median_s": statistics.median(ra["times"]),
                            "baseline_median_s": statistics.median(rb["times"])})
            print(f"pair {pair}: percolake {per_run[-1]['percolake_median_s'] * 1e3:.0f} ms, "
                  f"baseline {per_run[-1]['baseline_median_s'] * 1e3:.0f} ms per batch",
                  flush=True)
    finally:
        daemon.stop()
        spark.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "machine": info, "rows_per_batch": args.rows, "batches_per_run": batches,
        "pairs": pairs, "runs": per_run,
        "percolake_median_s": statistics.median(a), "baseline_median_s": statistics.median(b),
        "coordinator_ms_p50": bl.pct(coord, 50) * 1e3,
        "coordinator_ms_p99": bl.pct(coord, 99) * 1e3,
        "coordinator_share_p50": bl.pct([c / t for c, t in zip(coord, a, strict=True)], 50),
    }
    result["ratio"] = result["percolake_median_s"] / result["baseline_median_s"]
    # The paired estimate: each pair ran back to back, so its ratio is free of the drift
    # between pairs that the pooled medians above still mix in.
    result["paired_ratio"] = statistics.median(
        r["percolake_median_s"] / r["baseline_median_s"] for r in per_run)
    result["phases_ms"] = {path: {k: statistics.fmean(v) * 1e3 for k, v in named.items()}
                           for path, named in phases.items()}
    names = sorted(set(result["phases_ms"]["percolake"]) | set(result["phases_ms"]["baseline"]))
    phase_rows = [[name, result["phases_ms"]["percolake"].get(name, float("nan")),
                   result["phases_ms"]["baseline"].get(name, float("nan"))] for name in names]
    phase_rows.append(["whole batch (median)", result["percolake_median_s"] * 1e3,
                       result["baseline_median_s"] * 1e3])
    rows = [[r["pair"], r["percolake_median_s"] * 1e3, r["baseline_median_s"] * 1e3,
             r["percolake_median_s"] / r["baseline_median_s"]] for r in per_run]
    rows.append(["all", result["percolake_median_s"] * 1e3, result["baseline_median_s"] * 1e3,
                 result["ratio"]])
    body = "\n".join([
        f"Spark streaming job, 3 Delta tables, {args.rows:,} rows per batch, {batches} measured "
        f"batches per run, runs alternating percolake / baseline ({pairs} pairs):\n",
        bl.table(["pair", "percolake median ms/batch", "baseline median ms/batch", "ratio"],
                 rows),
        f"\nCoordinator RPC time per batch (heartbeats excluded): p50 "
        f"{result['coordinator_ms_p50']:.1f} ms, p99 {result['coordinator_ms_p99']:.1f} ms; "
        f"median share of batch time {result['coordinator_share_p50'] * 100:.1f} %. "
        f"**Ratio {result['ratio']:.3f}** (goal ≤ 1.03; pooled medians of all batches); "
        f"median of the per-pair ratios {result['paired_ratio']:.3f}.\n",
        "Where a batch's time goes (mean ms per batch, driver side):\n",
        bl.table(["phase", "percolake", "baseline"], phase_rows),
    ])
    bl.publish("bench_overhead", info, body, result, args.json, not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
