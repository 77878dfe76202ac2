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

``--store s3`` measures the same on S3 tables as well: the script starts moto's S3 server on
127.0.0.1 (and stops it), makes a bucket, runs the coordinator with ``--warehouse
s3://<bucket>/wh`` and the server's AWS variables, and each pair runs both paths on local
tables and then on S3 tables (the executors write through Arrow, delta-rs commits with
conditional puts; the streaming checkpoints stay local in both paths). It prints the local and
the S3 figures side by side, and the S3 requests per batch of each path (moto's access log).

    python scripts/bench_overhead.py --quick --json /tmp/overhead.json
    python scripts/bench_overhead.py --quick --store s3 --json /tmp/overhead-s3.json
"""

from __future__ import annotations

import argparse
import os
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


def _tables(root: Path | str, run: str) -> list[str]:
    if isinstance(root, str):  # an object-store root, s3://bucket/prefix
        return [f"{root}/{run}/{name}" for name in TABLES]
    return [str(root / run / name) for name in TABLES]


def _checkpoint(root: Path | str, run: str, checkpoints: Path | None) -> Path:
    """The query's checkpoint: in the run's folder for local tables, else below
    ``checkpoints`` (Spark's checkpoint stays on the local disk for S3 tables too)."""
    if checkpoints is not None:
        return checkpoints / run
    assert isinstance(root, Path)
    return root / run / "_checkpoint"


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


def run_percolake(spark, target: str, root: Path | str, rows: int, batches: int,  # noqa: ANN001
                  checkpoints: Path | None = None, mark=None) -> dict:  # noqa: ANN001
    """``mark()`` (optional) is called as the first measured batch starts; its value is
    returned as ``mark`` (the S3 runs pass the moto log's size, to count requests)."""
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
    marked: list[object] = []

    def user_fn(batch_df, batch_id, txn):  # noqa: ANN001, ANN202
        for frame, table in zip(_frames(batch_df), tables, strict=True):
            txn.write(frame, table)

    wrapped = participant.wrap(user_fn)

    def batch_fn(batch_df, batch_id):  # noqa: ANN001, ANN202
        if done.is_set():
            return
        if batch_id == 1 and mark is not None:
            marked.append(mark())
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

    _run_query(spark, batch_fn, _checkpoint(root, run, checkpoints), rows, batches, done)
    participant.close()
    phases = {k: v / len(times) for k, v in PHASES.items()}
    phases["coordinator RPCs"] = statistics.fmean(coordinator)
    return {"times": times, "coordinator": coordinator, "phases": phases, "run": run,
            "mark": marked[0] if marked else None}


def run_baseline(spark, root: Path | str, rows: int, batches: int,  # noqa: ANN001
                 checkpoints: Path | None = None, mark=None) -> dict:  # noqa: ANN001
    from percolake.lake import delta_commit
    from sparkside import writer

    run = f"baseline-{uuid.uuid4().hex[:8]}"
    tables = [canonical_table_uri(t) for t in _tables(root, run)]
    app_id = delta_app_id(run, 0)
    times: list[float] = []
    done = threading.Event()
    marked: list[object] = []

    def batch_fn(batch_df, batch_id):  # noqa: ANN001, ANN202
        if done.is_set():
            return
        if batch_id == 1 and mark is not None:
            marked.append(mark())
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

    _run_query(spark, batch_fn, _checkpoint(root, run, checkpoints), rows, batches, done)
    return {"times": times, "phases": {k: v / len(times) for k, v in PHASES.items()},
            "run": run, "mark": marked[0] if marked else None}


class _Store:
    """What one store's runs collected: batch times, RPC time, per-run medians, phases."""

    def __init__(self) -> None:
        self.a: list[float] = []
        self.b: list[float] = []
        self.a_runs: list[list[float]] = []
        self.b_runs: list[list[float]] = []
        self.coord: list[float] = []
        self.per_run: list[dict] = []
        self.phases: dict[str, dict[str, list[float]]] = {"percolake": {}, "baseline": {}}
        self.s3_runs: list[tuple[str, dict]] = []  # (path, run) of S3 runs: requests

    def add(self, pair: int, ra: dict, rb: dict) -> dict:
        self.a += ra["times"]
        self.b += rb["times"]
        self.a_runs.append(ra["times"])
        self.b_runs.append(rb["times"])
        self.coord += ra["coordinator"]
        for path, run in (("percolake", ra), ("baseline", rb)):
            for name, value in run["phases"].items():
                self.phases[path].setdefault(name, []).append(value)
        self.per_run.append({"pair": pair, "percolake_median_s": statistics.median(ra["times"]),
                             "baseline_median_s": statistics.median(rb["times"])})
        return self.per_run[-1]

    def summary(self) -> dict:
        """The figures of this store, under the JSON names of the local run."""
        result = {
            "runs": self.per_run,
            "percolake_median_s": statistics.median(self.a),
            "baseline_median_s": statistics.median(self.b),
            "coordinator_ms_p50": bl.pct(self.coord, 50) * 1e3,
            "coordinator_ms_p99": bl.pct(self.coord, 99) * 1e3,
            "coordinator_share_p50": bl.pct(
                [c / t for c, t in zip(self.coord, self.a, strict=True)], 50),
        }
        result["ratio"] = result["percolake_median_s"] / result["baseline_median_s"]
        # The paired estimate: each pair ran back to back, so its ratio is free of the drift
        # between pairs that the pooled medians above still mix in.
        result["paired_ratio"] = statistics.median(
            r["percolake_median_s"] / r["baseline_median_s"] for r in self.per_run)
        result["phases_ms"] = {path: {k: statistics.fmean(v) * 1e3 for k, v in named.items()}
                               for path, named in self.phases.items()}
        # 95 % bootstrap interval of ``ratio``: pairs resampled, then batches within a pair
        _, low, high = bl.ratio_interval(self.a_runs, self.b_runs)
        result["ratio_ci95"] = [low, high]
        return result


def _requests_per_batch(log_path: Path, runs: list[tuple[str, dict]],
                        batches: int) -> dict[str, dict[str, float]]:
    """Median S3 requests per measured batch of each path, by kind (moto's access log from
    the first measured batch on; every request of a run names its tables' prefix)."""
    per_path: dict[str, list[dict[str, int]]] = {}
    for path, run in runs:
        if run.get("mark") is None:
            continue
        kinds = bl.request_kinds(bl.moto_requests(log_path, run["run"], run["mark"]))
        kinds["total"] = sum(kinds.values())
        per_path.setdefault(path, []).append(kinds)
    out: dict[str, dict[str, float]] = {}
    for path, counted in per_path.items():
        names = sorted({k for c in counted for k in c})
        out[path] = {k: statistics.median(c.get(k, 0) for c in counted) / batches
                     for k in names}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--pairs", type=int, help="A/B run pairs")
    parser.add_argument("--batches", type=int, help="measured batches per run")
    parser.add_argument("--rows", type=int, default=10_000, help="rows per batch")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--workdir")
    parser.add_argument(
        "--store", choices=("local", "s3"), default="local",
        help="local: local Delta tables only (the default). s3: the local runs and, in the "
             "same run, the same pairs on S3 tables of a moto S3 server started on 127.0.0.1 "
             "(coordinator with --warehouse s3://<bucket>/wh); prints local and S3 side by "
             "side, with the S3 requests per batch of each path")
    args = parser.parse_args()
    pairs = args.pairs or (2 if args.quick else 5)
    batches = args.batches or (5 if args.quick else 20)
    info = bl.machine_info()
    print(f"bench_overhead: {bl.machine_line(info)}", flush=True)
    started = time.monotonic()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="percolake-overhead-"))
    lake = work / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    from sparkside import local_spark

    _instrument()
    moto = None
    log_path = work / "moto.log"
    roots: dict[str, Path | str] = {"local": lake}
    if args.store == "s3":
        from tests.s3_support import MotoServer

        log_path.unlink(missing_ok=True)
        moto = MotoServer(log_path=log_path).start()
        os.environ.update(moto.env())  # the driver's and executors' S3 settings
        roots["s3"] = f"s3://{moto.create_bucket('overhead')}/wh"
        spark = local_spark("percolake-bench-overhead",
                            conf={"spark.driver.host": "127.0.0.1",
                                  "spark.driver.bindAddress": "127.0.0.1"},
                            warehouse=str(roots["s3"]))
        daemon = DaemonProcess(work / "data", [str(lake), str(roots["s3"])], env=moto.env(),
                               extra_args=["--log-level", "warning"])
    else:
        spark = local_spark("percolake-bench-overhead")
        daemon = DaemonProcess(work / "data", [str(lake)],
                               extra_args=["--log-level", "warning"])
    spark.sparkContext.setLogLevel("ERROR")
    checkpoints = {"local": None, "s3": work / "checkpoints"}
    stores = {name: _Store() for name in roots}
    mark = (lambda: log_path.stat().st_size) if moto else None  # noqa: E731

    def run(path: str, store: str, count: int, measured: bool = True) -> dict:
        extra = {"checkpoints": checkpoints[store],
                 "mark": mark if store == "s3" and measured else None}
        if path == "percolake":
            result = run_percolake(spark, daemon.target, roots[store], args.rows, count,
                                   **extra)
        else:
            result = run_baseline(spark, roots[store], args.rows, count, **extra)
        if store == "s3" and measured:
            stores[store].s3_runs.append((path, result))
        return result

    try:
        daemon.start()
        # Warm the JVM and both code paths first (not measured): the first streaming query of
        # a session is much slower than the next ones.
        for store in roots:
            run("percolake", store, 2, measured=False)
            run("baseline", store, 2, measured=False)
        for pair in range(pairs):
            for store in roots:
                # A B, then B A: neither path always runs first (ABBA cancels drift and order).
                if pair % 2 == 0:
                    ra = run("percolake", store, batches)
                    rb = run("baseline", store, batches)
                else:
                    rb = run("baseline", store, batches)
                    ra = run("percolake", store, batches)
                got = stores[store].add(pair, ra, rb)
                where = "" if args.store == "local" else f" {store}"
                print(f"pair {pair}{where}: percolake {got['percolake_median_s'] * 1e3:.0f} ms, "
                      f"baseline {got['baseline_median_s'] * 1e3:.0f} ms per batch", flush=True)
    finally:
        daemon.stop()
        spark.stop()
        if moto is not None:
            moto.stop()
    elapsed = time.monotonic() - started
    summaries = {name: store.summary() for name, store in stores.items()}
    result = {"machine": info, "rows_per_batch": args.rows, "batches_per_run": batches,
              "pairs": pairs, **summaries["local"], "store": args.store}
    if moto is not None:
        summaries["s3"]["requests_per_batch"] = _requests_per_batch(
            log_path, stores["s3"].s3_runs, batches)
        result["s3"] = summaries["s3"]
        result["seconds_total"] = elapsed
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    if args.store == "local":
        body = _local_body(result, args.rows, batches, pairs)
    else:
        body = _side_by_side_body(summaries, args.rows, batches, pairs, elapsed)
    bl.publish("bench_overhead", info, body, result, args.json, not args.no_append)
    return 0


def _phase_rows(summaries: list[dict]) -> list[list[object]]:
    """Rows of phase -> mean ms per batch, percolake and baseline of each summary in turn."""
    names = sorted({n for s in summaries for path in ("percolake", "baseline")
                    for n in s["phases_ms"][path]})
    rows: list[list[object]] = [
        [name, *(s["phases_ms"][path].get(name, float("nan")) for s in summaries
                 for path in ("percolake", "baseline"))] for name in names]
    rows.append(["whole batch (median)",
                 *(v for s in summaries for v in (s["percolake_median_s"] * 1e3,
                                                  s["baseline_median_s"] * 1e3))])
    return rows


def _local_body(result: dict, rows_per_batch: int, batches: int, pairs: int) -> str:
    per_run = result["runs"]
    rows = [[r["pair"], r["percolake_median_s"] * 1e3, r["baseline_median_s"] * 1e3,
             r["percolake_median_s"] / r["baseline_median_s"]] for r in per_run]
    rows.append(["all", result["percolake_median_s"] * 1e3, result["baseline_median_s"] * 1e3,
                 result["ratio"]])
    low, high = result["ratio_ci95"]
    return "\n".join([
        f"Spark streaming job, 3 Delta tables, {rows_per_batch:,} rows per batch, {batches} "
        f"measured batches per run, runs alternating percolake / baseline ({pairs} pairs):\n",
        bl.table(["pair", "percolake median ms/batch", "baseline median ms/batch", "ratio"],
                 rows),
        f"\nCoordinator RPC time per batch (heartbeats excluded): p50 "
        f"{result['coordinator_ms_p50']:.1f} ms, p99 {result['coordinator_ms_p99']:.1f} ms; "
        f"median share of batch time {result['coordinator_share_p50'] * 100:.1f} %. "
        f"**Ratio {result['ratio']:.3f}** (goal ≤ 1.03; pooled medians of all batches); "
        f"median of the per-pair ratios {result['paired_ratio']:.3f}; 95 % bootstrap "
        f"interval of the ratio [{low:.3f}, {high:.3f}].\n",
        "Where a batch's time goes (mean ms per batch, driver side):\n",
        bl.table(["phase", "percolake", "baseline"], _phase_rows([result])),
    ])


def _side_by_side_body(summaries: dict[str, dict], rows_per_batch: int, batches: int,
                       pairs: int, elapsed: float) -> str:
    local, s3 = summaries["local"], summaries["s3"]
    pair_rows = []
    for lr, sr in zip(local["runs"], s3["runs"], strict=True):
        pair_rows.append([lr["pair"], *(v for r in (lr, sr) for v in (
            r["percolake_median_s"] * 1e3, r["baseline_median_s"] * 1e3,
            r["percolake_median_s"] / r["baseline_median_s"]))])
    pair_rows.append(["all", *(v for r in (local, s3) for v in (
        r["percolake_median_s"] * 1e3, r["baseline_median_s"] * 1e3, r["ratio"]))])
    figures = [
        ["**ratio** (pooled medians) [95 % CI]",
         *(bl.interval_text(r["ratio"], *r["ratio_ci95"]) for r in (local, s3))],
        ["median of the per-pair ratios", local["paired_ratio"], s3["paired_ratio"]],
        ["coordinator RPCs ms/batch p50", local["coordinator_ms_p50"], s3["coordinator_ms_p50"]],
        ["coordinator RPCs ms/batch p99", local["coordinator_ms_p99"], s3["coordinator_ms_p99"]],
        ["coordinator share of batch time (p50)",
         *(f"{r['coordinator_share_p50'] * 100:.1f} %" for r in (local, s3))],
    ]
    requests = s3["requests_per_batch"]
    kinds = sorted({k for counted in requests.values() for k in counted} - {"total"})
    request_rows = [[path, *(f"{requests[path].get(k, 0):.1f}" for k in (*kinds, "total"))]
                    for path in ("percolake", "baseline") if path in requests]
    return "\n".join([
        f"Spark streaming job, 3 Delta tables, {rows_per_batch:,} rows per batch, {batches} "
        f"measured batches per run, runs alternating percolake / baseline ({pairs} pairs), "
        "each pair on local tables and then on S3 tables (moto's S3 server on 127.0.0.1, "
        "executors writing through Arrow, delta-rs commits; checkpoints local). Median ms per "
        "batch:\n",
        bl.table(["pair", "local percolake", "local baseline", "local ratio", "S3 percolake",
                  "S3 baseline", "S3 ratio"], pair_rows),
        "\n",
        bl.table(["figure", "local", "S3"], figures),
        "\nS3 requests per batch (3 tables; median over runs; moto's access log, the "
        "coordinator's requests included; multipart = create + part + complete):\n",
        bl.table(["path", *kinds, "total"], request_rows),
        "\nWhere a batch's time goes (mean ms per batch, driver side):\n",
        bl.table(["phase", "local percolake", "local baseline", "S3 percolake", "S3 baseline"],
                 _phase_rows([local, s3])),
        f"\nWhole run: {elapsed:.0f} s.",
    ])


if __name__ == "__main__":
    sys.exit(main())
