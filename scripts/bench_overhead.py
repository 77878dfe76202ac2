"""What atomic exactly-once costs a Spark streaming job: percolake vs two non-atomic baselines.

The same streaming job (``rate-micro-batch`` source, fixed rows per batch, 3 Delta tables
written per batch, N batches) runs in three variants:

- **percolake**: ``Participant.wrap`` with three ``txn.write`` calls, measured as the
  participant does it (Open, the writes, Commit, the tables' Delta commits, the report);
- **serial baseline**, the way people work today: the same executors' file-writing path
  (``sparkside.writer.write_files``), then each table committed on its own with a Delta app
  transaction (``apply_table_write``), one table after the other; no coordinator, no
  atomicity across tables;
- **concurrent baseline**: the same three writes + commits run from three PySpark
  ``InheritableThread`` s (Spark's local properties carry over), each table committed on its
  own: fast, but not atomic.

Each size (small: 1,000 rows per batch, large: 100,000) runs as triples of the three
variants, the order of each triple rotating through every permutation (so drift and run
order cancel), after an unmeasured warm-up of each variant. Per-batch time is measured
inside ``foreachBatch`` (batch 0, which creates the tables, is left out). The script prints,
per size, the medians, the ratios percolake / serial and percolake / concurrent with 95 %
bootstrap intervals, and the goals met or not.

The coordinator's share of a batch is the time the batch's critical path spends in
coordinator RPCs: every call made on the batch's own thread, plus calls other threads make
during the batch that the batch waits for (e.g. a DeclareTables from a write thread), the
overlapping ones counted once (union of their intervals). Heartbeats, and a ReportApplied sent
from another thread (after the batch returned), are off the path: they are shown apart.
Where a batch's time goes is timed on the driver; phases that run in several threads at once
add up thread time, so they may exceed the batch's wall time.

``--store s3`` measures percolake and the serial baseline (not the concurrent one) on S3 tables
as well, at one size (``--rows``, 10,000 by default): the script starts moto's S3 server on
127.0.0.1 (and stops it), makes a bucket, runs the coordinator with ``--warehouse
s3://<bucket>/wh`` and the server's AWS variables, and each pair runs both paths on local
tables and then on S3 tables (the executors write through Arrow, delta-rs commits with
conditional puts; the streaming checkpoints stay local in both paths). It prints the local and
the S3 figures side by side, and the S3 requests per batch of each path (moto's access log).

    python scripts/bench_overhead.py --quick --json /tmp/overhead.json
    python scripts/bench_overhead.py --sizes small --pairs 2 --batches 2 --no-append
    python scripts/bench_overhead.py --quick --store s3 --json /tmp/overhead-s3.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _benchlib as bl  # noqa: E402

from coordinator.launcher import DaemonProcess  # noqa: E402
from percolake.lake.warehouse import canonical_table_uri, write_location  # noqa: E402
from percolake.records import TableWriteRecord, WriteMode, delta_app_id  # noqa: E402

TABLES = ("debits", "credits", "balances")
SIZES = {"small": 1_000, "large": 100_000}
VARIANTS = ("percolake", "baseline", "concurrent")  # "baseline": the serial one
LABELS = {"percolake": "percolake", "baseline": "serial baseline",
          "concurrent": "concurrent baseline"}
SHORT = {"percolake": "P", "baseline": "S", "concurrent": "C"}
GOAL_SERIAL = 1.00  # percolake / serial baseline, at both sizes
GOAL_CONCURRENT = 1.03  # percolake / concurrent baseline
GOAL_COORDINATOR_MS = 5.0  # coordinator's share of a batch, p99
SMALL_KEYS = {  # the small size's figures at the top level of the JSON: key -> name
    "ratio": "ratio_small", "ratio_ci_low": "ratio_small_ci_low",
    "ratio_ci_high": "ratio_small_ci_high", "ratio_concurrent": "ratio_concurrent_small",
    "ratio_concurrent_ci_low": "ratio_concurrent_small_ci_low",
    "ratio_concurrent_ci_high": "ratio_concurrent_small_ci_high",
    "coordinator_ms_p99": "coordinator_ms_p99_small"}
OFF_PATH_METHODS = ("Heartbeat", "ReportApplied")  # when sent from another thread

PHASES: dict[str, float] = {}  # seconds spent per phase in the current run (all threads)
_PHASES_LOCK = threading.Lock()


def _timed(name: str, fn):  # noqa: ANN001, ANN202
    """Wraps ``fn`` to add its wall time to PHASES[name] (where a batch's time goes)."""

    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            with _PHASES_LOCK:
                PHASES[name] = PHASES.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


def _replace_everywhere(original: Callable, replacement: Callable) -> None:
    """Points every loaded percolake/sparkside module's name for ``original`` at
    ``replacement``, so the timing holds wherever the participant calls it from."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("sparkside", "percolake")):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)


class RpcRecorder:
    """Every coordinator call of this process: (thread, method, start, end), for the
    coordinator's share of a batch's critical path (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[tuple[int, str, float, float]] = []
        # each take's critical-path spans (perf_counter, i.e. CLOCK_MONOTONIC), batch by batch
        self.batch_spans: list[list[tuple[float, float]]] = []

    def install(self) -> None:
        from sparkside.client import CoordinatorClient

        original = CoordinatorClient.call
        recorder = self

        def timed_call(client, method, request, *args, **kwargs):  # noqa: ANN001, ANN202
            t0 = time.perf_counter()
            try:
                return original(client, method, request, *args, **kwargs)
            finally:
                with recorder._lock:
                    recorder._calls.append(
                        (threading.get_ident(), method, t0, time.perf_counter()))

        CoordinatorClient.call = timed_call  # type: ignore[method-assign]

    def reset(self) -> None:
        with self._lock:
            self._calls = []
            self.batch_spans = []

    def take(self, thread: int, start: float, end: float) -> tuple[float, float]:
        """(critical-path seconds, off-path seconds) of the calls recorded since the last
        take, for a batch run on ``thread`` from ``start`` to ``end``; forgets them."""
        with self._lock:
            calls, self._calls = self._calls, []
        spans: list[tuple[float, float]] = []
        off_path = 0.0
        for ident, method, t0, t1 in calls:
            if ident == thread and start <= t0 and t1 <= end:
                spans.append((t0, t1))
            elif ident != thread and method not in OFF_PATH_METHODS and t1 > start \
                    and t0 < end:
                spans.append((max(t0, start), min(t1, end)))  # a thread the batch waits for
            elif method != "Heartbeat":
                off_path += t1 - t0
        self.batch_spans.append(sorted(spans))
        return _union_length(spans), off_path


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for t0, t1 in sorted(spans):
        if t1 <= reach:
            continue
        total += t1 - max(t0, reach)
        reach = t1
    return total


RPCS = RpcRecorder()


def _instrument() -> None:
    """Times the phases of every path: file writing, Delta commits, the participant's schema
    check, and records every coordinator call (``RPCS``)."""
    import sparkside  # noqa: F401  (loads the participant and whatever it imports)
    from percolake.lake import delta_commit
    from sparkside import schema_check, writer

    _replace_everywhere(writer.write_files,
                        _timed("write files (executors)", writer.write_files))
    _replace_everywhere(delta_commit.apply_table_write,
                        _timed("Delta commits (delta-rs)", delta_commit.apply_table_write))
    # the schema check on the write's path: waiting for the batch's layout (read at Open,
    # in the background), then checking the batch against it
    if hasattr(schema_check, "BatchLayouts"):
        schema_check.BatchLayouts.get = _timed("schema check (participant)",
                                               schema_check.BatchLayouts.get)
        _replace_everywhere(schema_check.check_layout,
                            _timed("schema check (participant)", schema_check.check_layout))
    else:  # a checkout from before BatchLayouts (issue 33), measured for comparison
        schema_check.SchemaChecker.check = _timed("schema check (participant)",
                                                  schema_check.SchemaChecker.check)
    RPCS.install()


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
    times: list[float] = []
    coordinator: list[float] = []
    off_path: list[float] = []
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
        thread = threading.get_ident()
        t0 = time.perf_counter()
        wrapped(batch_df, batch_id)
        t1 = time.perf_counter()
        on_path, off = RPCS.take(thread, t0, t1)
        if batch_id > 0:
            times.append(t1 - t0)
            coordinator.append(on_path)
            off_path.append(off)
        else:
            with _PHASES_LOCK:
                PHASES.clear()
        if batch_id >= batches:
            done.set()

    RPCS.reset()
    try:
        _run_query(spark, batch_fn, _checkpoint(root, run, checkpoints), rows, batches, done)
    finally:
        participant.close()
    phases = _phases_per_batch(len(times))
    # "coordinator RPCs": the batch's critical path only (the name of earlier runs' JSON)
    phases["coordinator RPCs"] = statistics.fmean(coordinator)
    if any(off_path):
        phases["coordinator RPCs off the batch's path"] = statistics.fmean(off_path)
    return {"times": times, "coordinator": coordinator, "phases": phases, "run": run,
            "mark": marked[0] if marked else None}


def _phases_per_batch(batches: int) -> dict[str, float]:
    with _PHASES_LOCK:
        return {k: v / max(batches, 1) for k, v in PHASES.items()}


def run_baseline(spark, root: Path | str, rows: int, batches: int,  # noqa: ANN001
                 checkpoints: Path | None = None, mark=None,  # noqa: ANN001
                 concurrent: bool = False) -> dict:
    """The non-atomic baseline: each table written and committed on its own, one after the
    other, or (``concurrent``) the three at once from three inheritable threads."""
    from pyspark import InheritableThread

    from percolake.lake import delta_commit
    from sparkside import writer

    run = f"{'concurrent' if concurrent else 'baseline'}-{uuid.uuid4().hex[:8]}"
    tables = [canonical_table_uri(t) for t in _tables(root, run)]
    app_id = delta_app_id(run, 0)
    times: list[float] = []
    done = threading.Event()
    marked: list[object] = []

    def write_and_commit(frame, table: str, batch_id: int) -> None:  # noqa: ANN001
        attempt = uuid.uuid4().hex
        adds = writer.write_files(frame, table, write_location(table, attempt), [])
        write = TableWriteRecord(table, WriteMode.APPEND, tuple(adds),
                                 writer.delta_schema_json(frame))
        delta_commit.apply_table_write(write, app_id=app_id, app_version=batch_id,
                                       txn_id=attempt, commit_ts=0)

    def write_concurrently(batch_df, batch_id: int) -> None:  # noqa: ANN001
        failures: list[BaseException] = []

        def one(frame, table: str) -> None:  # noqa: ANN001
            try:
                write_and_commit(frame, table, batch_id)
            except BaseException as exc:  # re-raised on the batch's thread
                failures.append(exc)

        threads = [InheritableThread(target=one, args=(frame, table))
                   for frame, table in zip(_frames(batch_df), tables, strict=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]

    def batch_fn(batch_df, batch_id):  # noqa: ANN001, ANN202
        if done.is_set():
            return
        if batch_id == 1 and mark is not None:
            marked.append(mark())
        t0 = time.perf_counter()
        if concurrent:
            write_concurrently(batch_df, batch_id)
        else:
            for frame, table in zip(_frames(batch_df), tables, strict=True):
                write_and_commit(frame, table, batch_id)
        elapsed = time.perf_counter() - t0
        if batch_id > 0:
            times.append(elapsed)
        else:
            with _PHASES_LOCK:
                PHASES.clear()
        if batch_id >= batches:
            done.set()

    _run_query(spark, batch_fn, _checkpoint(root, run, checkpoints), rows, batches, done)
    return {"times": times, "phases": _phases_per_batch(len(times)), "run": run,
            "mark": marked[0] if marked else None}


def orders(variants: Sequence[str]) -> list[tuple[str, ...]]:
    """Run orders of a pair (a triple for three variants): every rotation, then every
    rotation of the reverse, so each variant runs in each position and after each other
    equally often over a cycle."""
    forward = [tuple(variants[i:]) + tuple(variants[:i]) for i in range(len(variants))]
    backward = [tuple(reversed(o)) for o in forward]
    return list(dict.fromkeys(itertools.chain(forward, backward)))


class _Figures:
    """What the runs of one store and size collected: batch times per variant, per-run
    medians, RPC time, phases."""

    def __init__(self, variants: Sequence[str], rows: int) -> None:
        self.variants = tuple(variants)
        self.rows = rows
        self.times: dict[str, list[float]] = {v: [] for v in variants}
        self.runs: dict[str, list[list[float]]] = {v: [] for v in variants}
        self.coord: list[float] = []
        self.coord_percolake: list[float] = []  # the batch times the RPC times belong to
        self.per_run: list[dict] = []
        self.phases: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
        self.s3_runs: list[tuple[str, dict]] = []  # (path, run) of S3 runs: requests

    def add(self, pair: int, order: Sequence[str], results: dict[str, dict]) -> dict:
        for variant, run in results.items():
            self.times[variant] += run["times"]
            self.runs[variant].append(run["times"])
            for name, value in run["phases"].items():
                self.phases[variant].setdefault(name, []).append(value)
        self.coord += results["percolake"]["coordinator"]
        self.coord_percolake += results["percolake"]["times"]
        row = {"pair": pair, "order": list(order)}
        row.update({f"{v}_median_s": statistics.median(results[v]["times"])
                    for v in self.variants})
        self.per_run.append(row)
        return row

    def summary(self) -> dict:
        """The figures of this store and size (the JSON names of the local run)."""
        result: dict = {
            "rows_per_batch": self.rows,
            "runs": self.per_run,
            **{f"{v}_median_s": statistics.median(self.times[v]) for v in self.variants},
            "coordinator_ms_p50": bl.pct(self.coord, 50) * 1e3,
            "coordinator_ms_p99": bl.pct(self.coord, 99) * 1e3,
            "coordinator_share_p50": bl.pct(
                [c / t for c, t in zip(self.coord, self.coord_percolake, strict=True)], 50),
        }
        # ratio: pooled medians of all batches, with a 95 % bootstrap interval (pairs
        # resampled, then batches within a pair); paired_ratio: the median of the per-pair
        # ratios, each pair run back to back, so free of the drift between pairs.
        for variant, suffix in (("baseline", ""), ("concurrent", "_concurrent")):
            if variant not in self.variants:
                continue
            ratio, low, high = bl.ratio_interval(self.runs["percolake"], self.runs[variant])
            result[f"ratio{suffix}"] = ratio
            result[f"ratio{suffix}_ci_low"] = low
            result[f"ratio{suffix}_ci_high"] = high
            result[f"paired_ratio{suffix}"] = statistics.median(
                r["percolake_median_s"] / r[f"{variant}_median_s"] for r in self.per_run)
        result["ratio_ci95"] = [result["ratio_ci_low"], result["ratio_ci_high"]]
        result["phases_ms"] = {v: {k: statistics.fmean(x) * 1e3 for k, x in named.items()}
                               for v, named in self.phases.items()}
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


def _goal(value: float, low: float, high: float, goal: float) -> dict:
    """A ratio against its goal: met by the estimate, and clearly (whole interval) or not."""
    return {"goal": goal, "value": value, "ci": [low, high], "met": value <= goal,
            "clear": high <= goal}


def _goals(sizes: dict[str, dict]) -> dict[str, dict]:
    goals: dict[str, dict] = {}
    for size, s in sizes.items():
        goals[f"percolake/serial {size}"] = _goal(s["ratio"], s["ratio_ci_low"],
                                                  s["ratio_ci_high"], GOAL_SERIAL)
        if "ratio_concurrent" in s:
            goals[f"percolake/concurrent {size}"] = _goal(
                s["ratio_concurrent"], s["ratio_concurrent_ci_low"],
                s["ratio_concurrent_ci_high"], GOAL_CONCURRENT)
        p99 = s["coordinator_ms_p99"]
        goals[f"coordinator ms p99 {size}"] = {"goal": GOAL_COORDINATOR_MS, "value": p99,
                                               "met": p99 <= GOAL_COORDINATOR_MS}
    return goals


def _headline(sizes: dict[str, dict], goals: dict[str, dict]) -> dict:
    """The top-level JSON figures: the large size's (the only size's if one ran), with the
    small size's ratios beside them (None when the small size did not run)."""
    head = sizes.get("large") or next(iter(sizes.values()))
    small = sizes.get("small") or {}
    out = {k: v for k, v in head.items()}
    for key, name in SMALL_KEYS.items():
        out[name] = small.get(key)
    out["coordinator_ms_p99_max"] = max(s["coordinator_ms_p99"] for s in sizes.values())
    out["goals_met"] = all(g["met"] for g in goals.values())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="--store s3 runs percolake and the serial baseline only (no concurrent "
               "baseline), at one size (--rows), on local and S3 tables side by side.")
    parser.add_argument("--quick", action="store_true",
                        help="large batches only, 3 triples of 5 batches per run")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--pairs", type=int,
                        help="pairs (triples of the three variants) per size; default 16, "
                             "--quick 3 (--store s3: pairs of two, 5, --quick 2)")
    parser.add_argument("--batches", type=int,
                        help="measured batches per run; default 10, --quick 5 (--store s3: "
                             "20, --quick 5)")
    parser.add_argument("--sizes", nargs="+", choices=tuple(SIZES),
                        help="batch sizes to measure (local store): small = --small-rows, "
                             "large = --large-rows rows per batch; default both, --quick "
                             "large")
    parser.add_argument("--small-rows", type=int, default=SIZES["small"])
    parser.add_argument("--large-rows", type=int, default=SIZES["large"])
    parser.add_argument("--rows", type=int, default=10_000,
                        help="rows per batch of --store s3 (its one size)")
    parser.add_argument("--no-append", action="store_true",
                        help="do not append the results to docs/benchmarks.md")
    parser.add_argument("--workdir")
    parser.add_argument(
        "--store", choices=("local", "s3"), default="local",
        help="local: local Delta tables, three variants at the sizes of --sizes (the "
             "default). s3: percolake and the serial baseline only (the concurrent baseline "
             "is not run), at --rows rows per batch, on local tables and, in the same run, "
             "the same pairs on S3 tables of a moto S3 server started on 127.0.0.1 "
             "(coordinator with --warehouse s3://<bucket>/wh); prints local and S3 side by "
             "side, with the S3 requests per batch of each path")
    args = parser.parse_args()
    s3_mode = args.store == "s3"
    rows_of = {"small": args.small_rows, "large": args.large_rows}
    if s3_mode:  # two variants at one size, with the defaults of the earlier S3 runs
        pairs = args.pairs or (2 if args.quick else 5)
        batches = args.batches or (5 if args.quick else 20)
        sizes = {"s3": args.rows}
        variants: tuple[str, ...] = ("percolake", "baseline")
    else:
        pairs = args.pairs or (3 if args.quick else 16)
        batches = args.batches or (5 if args.quick else 10)
        chosen = args.sizes or (["large"] if args.quick else ["small", "large"])
        sizes = {name: rows_of[name] for name in SIZES if name in chosen}
        variants = VARIANTS
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
    if s3_mode:
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
    figures = {(store, size): _Figures(variants, rows)
               for store in roots for size, rows in sizes.items()}
    mark = (lambda: log_path.stat().st_size) if moto else None  # noqa: E731

    def run(variant: str, store: str, rows: int, count: int, measured: bool = True) -> dict:
        extra = {"checkpoints": checkpoints[store],
                 "mark": mark if store == "s3" and measured else None}
        if variant == "percolake":
            return run_percolake(spark, daemon.target, roots[store], rows, count, **extra)
        return run_baseline(spark, roots[store], rows, count,
                            concurrent=variant == "concurrent", **extra)

    cycle = orders(variants)
    try:
        daemon.start()
        # Warm the JVM and every code path first (not measured): the first streaming query
        # of a session is much slower than the next ones.
        for store in roots:
            for rows in sizes.values():
                for variant in variants:
                    run(variant, store, rows, 2, measured=False)
        for pair in range(pairs):
            order = cycle[pair % len(cycle)]
            for size, rows in sizes.items():
                for store in roots:
                    results = {v: run(v, store, rows, batches) for v in order}
                    if store == "s3":
                        figures[store, size].s3_runs += [(v, results[v]) for v in order]
                    got = figures[store, size].add(pair, order, results)
                    where = f" {store}" if s3_mode else f" {size}"
                    print(f"pair {pair}{where}: " + ", ".join(
                        f"{LABELS[v]} {got[f'{v}_median_s'] * 1e3:.0f} ms" for v in order)
                        + " per batch", flush=True)
    finally:
        daemon.stop()
        spark.stop()
        if moto is not None:
            moto.stop()
    elapsed = time.monotonic() - started
    if s3_mode:
        summaries = {store: figures[store, "s3"].summary() for store in roots}
        summaries["s3"]["requests_per_batch"] = _requests_per_batch(
            log_path, figures["s3", "s3"].s3_runs, batches)
        result = {"machine": info, "batches_per_run": batches, "pairs": pairs,
                  **summaries["local"], "store": args.store, "s3": summaries["s3"],
                  "seconds_total": elapsed}
        body = _side_by_side_body(summaries, args.rows, batches, pairs, elapsed)
    else:
        by_size = {size: figures["local", size].summary() for size in sizes}
        goals = _goals(by_size)
        result = {"machine": info, "batches_per_run": batches, "pairs": pairs,
                  **_headline(by_size, goals), "store": args.store, "sizes": by_size,
                  "goals": goals, "seconds_total": elapsed}
        body = _local_body(by_size, goals, batches, pairs, elapsed)
    if not args.workdir:  # after the S3 requests are read from moto's log in it
        shutil.rmtree(work, ignore_errors=True)
    bl.publish("bench_overhead", info, body, result, args.json, not args.no_append)
    return 0


def _phase_rows(summaries: list[dict], variants: Sequence[str]) -> list[list[object]]:
    """Rows of phase -> mean ms per batch, each variant of each summary in turn."""
    names = sorted({n for s in summaries for v in variants for n in s["phases_ms"][v]})
    rows: list[list[object]] = [
        [name, *(s["phases_ms"][v].get(name, float("nan")) for s in summaries
                 for v in variants)] for name in names]
    rows.append(["whole batch (median)",
                 *(s[f"{v}_median_s"] * 1e3 for s in summaries for v in variants)])
    return rows


def _met(goal: dict) -> str:
    if not goal["met"]:
        return "not met"
    if "clear" in goal and not goal["clear"]:
        return "met (median; the interval reaches past the goal)"
    return "met"


def _local_body(sizes: dict[str, dict], goals: dict[str, dict], batches: int, pairs: int,
                elapsed: float) -> str:
    names = list(sizes)
    pair_rows = []
    for size, s in sizes.items():
        for r in s["runs"]:
            pair_rows.append([size, r["pair"], " ".join(SHORT[o] for o in r["order"]),
                              *(r[f"{v}_median_s"] * 1e3 for v in VARIANTS),
                              r["percolake_median_s"] / r["baseline_median_s"],
                              r["percolake_median_s"] / r["concurrent_median_s"]])
    figures = [
        ["rows per batch", *(f"{s['rows_per_batch']:,}" for s in sizes.values()), ""],
        *([f"{LABELS[v]} median ms/batch", *(s[f"{v}_median_s"] * 1e3
                                               for s in sizes.values()), ""]
          for v in VARIANTS),
        ["**percolake / serial** (pooled medians) [95 % CI]",
         *(bl.interval_text(s["ratio"], s["ratio_ci_low"], s["ratio_ci_high"])
           for s in sizes.values()), f"≤ {GOAL_SERIAL:.2f} at both sizes"],
        ["**percolake / concurrent** [95 % CI]",
         *(bl.interval_text(s["ratio_concurrent"], s["ratio_concurrent_ci_low"],
                            s["ratio_concurrent_ci_high"]) for s in sizes.values()),
         f"≤ {GOAL_CONCURRENT:.2f}"],
        ["median of the per-pair ratios (serial, concurrent)",
         *(f"{s['paired_ratio']:.3f}, {s['paired_ratio_concurrent']:.3f}"
           for s in sizes.values()), ""],
        ["coordinator RPCs on the critical path ms/batch p50",
         *(s["coordinator_ms_p50"] for s in sizes.values()), ""],
        ["coordinator RPCs on the critical path ms/batch p99",
         *(s["coordinator_ms_p99"] for s in sizes.values()), f"≤ {GOAL_COORDINATOR_MS:.0f}"],
        ["coordinator share of batch time (p50)",
         *(f"{s['coordinator_share_p50'] * 100:.1f} %" for s in sizes.values()), ""],
    ]
    goal_rows = [[name, bl.interval_text(g["value"], *g["ci"]) if "ci" in g
                  else f"{g['value']:.1f}", f"≤ {g['goal']:g}", _met(g)]
                 for name, g in goals.items()]
    return "\n".join([
        f"Spark streaming job, 3 Delta tables, {batches} measured batches per run; per size "
        f"{pairs} triples of percolake (P), the serial non-atomic baseline (S) and the "
        "concurrent non-atomic baseline (C: three threads, each table committed on its own), "
        "the order rotating through every permutation. Median ms per batch:\n",
        bl.table(["size", "pair", "order", "percolake", "serial", "concurrent",
                  "P / S", "P / C"], pair_rows),
        "\n",
        bl.table(["figure", *names, "goal"], figures),
        "\nCoordinator RPCs on the critical path: calls on the batch's thread, and calls of "
        "threads the batch waits for (overlaps counted once); heartbeats and a ReportApplied "
        "sent from another thread are off the path.\n",
        bl.table(["goal", "measured [95 % CI]", "goal", "status"], goal_rows),
        "\nWhere a batch's time goes (mean ms per batch, driver side; phases running in "
        "several threads at once add up their threads' time; \"coordinator RPCs\" is the "
        "critical path's):\n",
        bl.table(["phase", *(f"{size} {LABELS[v]}" for size in names for v in VARIANTS)],
                 _phase_rows(list(sizes.values()), VARIANTS)),
        f"\nWhole run: {elapsed:.0f} s.",
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
        f"measured batches per run, runs alternating percolake / serial baseline ({pairs} "
        "pairs; the concurrent baseline is not run with --store s3), each pair on local "
        "tables and then on S3 tables (moto's S3 server on 127.0.0.1, executors writing "
        "through Arrow, delta-rs commits; checkpoints local). Median ms per batch:\n",
        bl.table(["pair", "local percolake", "local baseline", "local ratio", "S3 percolake",
                  "S3 baseline", "S3 ratio"], pair_rows),
        "\n",
        bl.table(["figure", "local", "S3"], figures),
        "\nS3 requests per batch (3 tables; median over runs; moto's access log, the "
        "coordinator's requests included; multipart = create + part + complete):\n",
        bl.table(["path", *kinds, "total"], request_rows),
        "\nWhere a batch's time goes (mean ms per batch, driver side):\n",
        bl.table(["phase", "local percolake", "local baseline", "S3 percolake", "S3 baseline"],
                 _phase_rows([local, s3], ("percolake", "baseline"))),
        f"\nWhole run: {elapsed:.0f} s.",
    ])


if __name__ == "__main__":
    sys.exit(main())
