"""A 3-table streaming batch on an object store with a real store's latency: percolake against
the serial non-atomic baseline, and the coordinator's share of the batch in round trips.

moto's S3 server on 127.0.0.1 behind two latency relays (``tests/latency_relay.py``: each
request held back ``--latency-ms``, 20 by default, plus an exponential tail of mean
``--jitter-ms``): one for the Spark side (driver and executors: the participant, the file
writing, delta-rs's commits), one for the coordinator daemon, so the relays count each side's
requests apart. The job is ``bench_overhead.py``'s (``rate-micro-batch``, ``--rows`` rows per
batch, 3 tables; percolake with ``Participant`` + ``txn.write``, the serial baseline writing
each table with the same executors' path and committing it alone with delta-rs), in
alternating pairs after an unmeasured warm-up; batch 0 (table creation) is not measured.

Printed side by side, one run:

- the coordinator's share of a percolake batch: its calls on the batch's critical path, ms p50
  and p99 (``bench_overhead``'s measure), and the store round trips the daemon made during
  them (``round_trips`` of the daemon relay's requests that started inside those calls), p50
  and max, against the goals (≤ 3 round trips, ≤ 60 ms p50 at 20 ms per request);
- the whole batch, percolake / serial baseline (pooled medians, 95 % bootstrap interval)
  against ≤ 1.00;
- S3 requests per batch of each path by kind, the Spark side's and the daemon's;
- where a batch's time goes on the driver (the profile of any goal not met).

    python scripts/bench_s3_latency.py --quick --json /tmp/s3-latency.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH's

import _benchlib as bl  # noqa: E402
import bench_overhead as bo  # noqa: E402

from coordinator.launcher import DaemonProcess  # noqa: E402
from tests.latency_relay import LatencyRelay, Request, round_trips  # noqa: E402
from tests.s3_support import MotoServer  # noqa: E402

GOAL_ROUND_TRIPS = 3
GOAL_COORDINATOR_MS_P50 = 60.0  # at 20 ms per request
GOAL_RATIO = 1.00
PATHS = ("percolake", "baseline")


def kinds_of(requests: list[Request]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for request in requests:
        kind = "multipart" if "uploadId=" in request.target or "?uploads" in request.target \
            else request.kind
        counted[kind] = counted.get(kind, 0) + 1
    return counted


def within(requests: list[Request], start: float, end: float) -> list[Request]:
    return [r for r in requests if start <= r.started < end]


def coordinator_round_trips(daemon_requests: list[Request],
                            spans: list[list[tuple[float, float]]]) -> list[int]:
    """Per batch: the daemon's store round trips during the batch's critical-path calls."""
    return [round_trips([r for r in daemon_requests
                         if any(t0 <= r.started < t1 for t0, t1 in batch)])
            for batch in spans]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 pairs of 5 batches (~3 min)")
    parser.add_argument("--pairs", type=int, help="percolake/baseline pairs (default 4)")
    parser.add_argument("--batches", type=int, help="measured batches per run (default 10)")
    parser.add_argument("--rows", type=int, default=10_000, help="rows per batch")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0,
                        help="mean of an exponential wait added to each request")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--no-append", action="store_true",
                        help="do not append the results to docs/benchmarks.md")
    parser.add_argument("--workdir")
    args = parser.parse_args()
    pairs = args.pairs or (2 if args.quick else 4)
    batches = args.batches or (5 if args.quick else 10)
    info = bl.machine_info()
    print(f"bench_s3_latency: {bl.machine_line(info)}", flush=True)
    started = time.monotonic()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="percolake-s3-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    from sparkside import local_spark

    bo._instrument()
    delay, jitter = args.latency_ms / 1e3, args.jitter_ms / 1e3
    moto = MotoServer().start()
    spark_relay = LatencyRelay(moto.port, delay, jitter, seed=1).start()
    daemon_relay = LatencyRelay(moto.port, delay, jitter, seed=2).start()
    spark = daemon = None
    runs: dict[str, list[dict]] = {p: [] for p in PATHS}
    try:
        os.environ.update(moto.env(AWS_ENDPOINT_URL=spark_relay.endpoint))
        root = f"s3://{moto.create_bucket('latency')}/wh"
        spark = local_spark("percolake-bench-s3-latency",
                            conf={"spark.driver.host": "127.0.0.1",
                                  "spark.driver.bindAddress": "127.0.0.1"}, warehouse=root)
        spark.sparkContext.setLogLevel("ERROR")
        daemon = DaemonProcess(work / "data", [root],
                               env=moto.env(AWS_ENDPOINT_URL=daemon_relay.endpoint),
                               extra_args=["--log-level", "warning"])
        daemon.start()
        checkpoints = work / "checkpoints"

        def run(path: str, count: int) -> dict:
            marks: list[float] = []
            mark = lambda: marks.append(time.monotonic()) or marks[-1]  # noqa: E731
            if path == "percolake":
                result = bo.run_percolake(spark, daemon.target, root, args.rows, count,
                                          checkpoints, mark=mark)
                result["spans"] = bo.RPCS.batch_spans[1:]
            else:
                result = bo.run_baseline(spark, root, args.rows, count, checkpoints, mark=mark)
            result["window"] = (marks[0] if marks else time.monotonic(), time.monotonic())
            return result

        for path in PATHS:  # warm-up: JVM, Python workers, S3 clients; not measured
            run(path, 2)
        for pair in range(pairs):
            order = PATHS if pair % 2 == 0 else PATHS[::-1]
            for path in order:
                runs[path].append(run(path, batches))
            print(f"pair {pair}: " + ", ".join(
                f"{p} {statistics.median(runs[p][-1]['times']) * 1e3:.0f} ms" for p in order)
                + " per batch", flush=True)
    finally:
        if daemon is not None:
            daemon.stop()
        if spark is not None:
            spark.stop()
        spark_relay.stop()
        daemon_relay.stop()
        moto.stop()
    elapsed = time.monotonic() - started
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)

    spark_requests, daemon_requests = spark_relay.requests(), daemon_relay.requests()
    percolake, baseline = runs["percolake"], runs["baseline"]
    coordinator_ms = [c * 1e3 for r in percolake for c in r["coordinator"]]
    trips = [t for r in percolake for t in coordinator_round_trips(daemon_requests, r["spans"])]
    ratio, low, high = bl.ratio_interval([r["times"] for r in percolake],
                                         [r["times"] for r in baseline])
    per_batch: dict[str, dict[str, dict[str, float]]] = {}
    for path in PATHS:
        for side, requests in (("Spark side", spark_requests), ("coordinator", daemon_requests)):
            counted: dict[str, float] = {}
            for r in runs[path]:
                for kind, n in kinds_of(within(requests, *r["window"])).items():
                    counted[kind] = counted.get(kind, 0) + n / len(r["times"]) / len(runs[path])
            counted["total"] = sum(counted.values())
            per_batch.setdefault(path, {})[side] = counted
    p50_ms = bl.pct(coordinator_ms, 50)
    goals = {
        "coordinator store round trips per batch (p50)": {
            "value": statistics.median(trips), "max": max(trips), "goal": GOAL_ROUND_TRIPS,
            "met": statistics.median(trips) <= GOAL_ROUND_TRIPS},
        "coordinator ms per batch (p50)": {
            "value": p50_ms, "p99": bl.pct(coordinator_ms, 99), "goal": GOAL_COORDINATOR_MS_P50,
            "met": p50_ms <= GOAL_COORDINATOR_MS_P50},
        "percolake / serial baseline": {"value": ratio, "ci": [low, high], "goal": GOAL_RATIO,
                                        "met": ratio <= GOAL_RATIO},
    }
    medians = {p: statistics.median(t for r in runs[p] for t in r["times"]) for p in PATHS}
    phases = {p: {k: statistics.fmean(r["phases"].get(k, 0.0) for r in runs[p]) * 1e3
                  for k in sorted({k for r in runs[p] for k in r["phases"]})} for p in PATHS}
    result = {"machine": info, "latency_ms": args.latency_ms, "jitter_ms": args.jitter_ms,
              "rows_per_batch": args.rows, "pairs": pairs, "batches_per_run": batches,
              "percolake_median_s": medians["percolake"],
              "baseline_median_s": medians["baseline"], "ratio": ratio, "ratio_ci95": [low, high],
              "coordinator_ms_p50": p50_ms, "coordinator_ms_p99": bl.pct(coordinator_ms, 99),
              "coordinator_round_trips": trips, "requests_per_batch": per_batch,
              "phases_ms": phases, "goals": goals, "seconds_total": elapsed}
    figures = [
        ["coordinator's share: store round trips during its calls, per batch p50 (max)",
         f"{goals['coordinator store round trips per batch (p50)']['value']:g} ({max(trips)})",
         f"≤ {GOAL_ROUND_TRIPS}", _status(goals["coordinator store round trips per batch (p50)"])],
        ["coordinator's share: its calls on the batch's path, ms p50 / p99",
         f"{p50_ms:.1f} / {bl.pct(coordinator_ms, 99):.1f}",
         f"≤ {GOAL_COORDINATOR_MS_P50:.0f} p50", _status(goals["coordinator ms per batch (p50)"])],
        ["whole batch: percolake / serial baseline [95 % CI]",
         bl.interval_text(ratio, low, high), f"≤ {GOAL_RATIO:.2f}",
         _status(goals["percolake / serial baseline"])],
        ["percolake ms per batch (median)", f"{medians['percolake'] * 1e3:.0f}", "", ""],
        ["serial baseline ms per batch (median)", f"{medians['baseline'] * 1e3:.0f}", "", ""],
    ]
    kinds = sorted({k for sides in per_batch.values() for c in sides.values() for k in c}
                   - {"total"})
    request_rows = [[path, side, *(f"{c.get(k, 0):.1f}" for k in (*kinds, "total"))]
                    for path, sides in per_batch.items() for side, c in sides.items()]
    phase_rows = [[name, *(f"{phases[p].get(name, float('nan')):.1f}" for p in PATHS)]
                  for name in sorted({n for p in PATHS for n in phases[p]})]
    phase_rows.append(["whole batch (median)", *(f"{medians[p] * 1e3:.1f}" for p in PATHS)])
    body = "\n".join([
        f"Spark streaming job, 3 Delta tables on S3 (moto on 127.0.0.1 behind latency relays: "
        f"{args.latency_ms:g} ms per request, jitter mean {args.jitter_ms:g} ms), "
        f"{args.rows:,} rows per batch, {batches} measured batches per run, {pairs} "
        "alternating pairs of percolake and the serial non-atomic baseline:\n",
        bl.table(["figure", "measured", "goal", "status"], figures),
        "\nS3 requests per batch (mean; counted on the relays; the coordinator's include its "
        "applied reports and any roll-forward):\n",
        bl.table(["path", "requests of", *kinds, "total"], request_rows),
        "\nWhere a batch's time goes (mean ms per batch, driver side; phases in several "
        "threads add up):\n",
        bl.table(["phase", "percolake", "serial baseline"], phase_rows),
        f"\nWhole run: {elapsed:.0f} s.",
    ])
    bl.publish("bench_s3_latency", info, body, result, args.json, not args.no_append)
    return 0


def _status(goal: dict) -> str:
    if not goal["met"]:
        return "not met"
    if "ci" in goal and goal["ci"][1] > goal["goal"]:
        return "met (median; the interval reaches past the goal)"
    return "met"


if __name__ == "__main__":
    sys.exit(main())
