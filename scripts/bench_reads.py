"""Consistent reads at a new version: tables percolake writes against delta-spark-written copies.

1. Side by side, in one run: 3 tables written by percolake (real protocol batches without
   Spark, ``scripts/_lakebatch.py``, checkpoints every 10 versions by the participant's
   ``Checkpointer``) and 3 copies written by delta-spark (the same rows, one append each batch:
   its own checkpoints and ``.crc`` files), both at ``--versions`` versions. Then each round
   gives all 6 tables one more version and reads, in alternating order, a ``ConsistentReader``
   snapshot of the 3 percolake tables (GetSnapshot, then each table at its version with
   ``versionAsOf``: a count and a sum over the rows) against the same reads of the 3 copies
   at their new version (``versionAsOf``).
   Goal: percolake's read within 1.2x of the copies' (issue 33, point 5).
2. A reader following a live stream: a writer commits a 3-table batch every ``--every`` s
   while the reader takes snapshots of the 3 tables and reads them; prints the interval between
   consecutive fresh snapshots (every table at a newer version than the last one read).

    python scripts/bench_reads.py --rounds 8 --live-s 60
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
import _lakebatch as lb  # noqa: E402

from coordinator.launcher import DaemonProcess  # noqa: E402

DAEMON_ARGS = ["--roll-forward-after", "1000000", "--txn-timeout", "600", "--log-level",
               "warning"]


def spark_append(spark, path: str, batch: int) -> None:  # noqa: ANN001
    """One delta-spark append of the rows percolake's batch ``batch`` writes."""
    import io

    import pyarrow.parquet as pq

    rows = pq.read_table(io.BytesIO(lb.parquet_bytes(batch))).to_pandas()
    spark.createDataFrame(rows, "id long, amount long").coalesce(1) \
        .write.format("delta").mode("append").save(path)


def read_all(frames) -> float:  # noqa: ANN001
    """Reads each DataFrame (a count and a sum: a scan); the seconds it took."""
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    for frame in frames:
        frame.agg(F.count("*"), F.sum("amount")).collect()
    return time.perf_counter() - t0


def spark_jobs(spark, group: str, read) -> tuple[float, int]:  # noqa: ANN001
    """``read()``'s seconds and the Spark jobs it ran (the profile: delta-spark runs a job for
    each table version's state, one for its protocol and metadata unless a ``.crc`` file of
    that version holds them, and one per scan)."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        seconds = read()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return seconds, len(context.statusTracker().getJobIdsForGroup(group))


def side_by_side(spark, reader, writer: lb.ProtocolBatches, copies: list[str],  # noqa: ANN001
                 first_batch: int, rounds: int) -> dict:
    ours: list[float] = []
    theirs: list[float] = []
    jobs: dict[str, list[int]] = {"percolake": [], "delta-spark": []}
    batch = first_batch
    for k in range(rounds):
        writer.run(batch)
        writer.checkpointer.flush(120)
        for path in copies:
            spark_append(spark, path, batch)
        batch += 1

        def percolake_read() -> float:
            t0 = time.perf_counter()
            snapshot = reader.snapshot(writer.tables)
            frames = [snapshot.table(t) for t in writer.tables]
            read_all(frames)
            return time.perf_counter() - t0

        def delta_spark_read(version: int = batch - 1) -> float:
            """The same read: each copy at its new version."""
            t0 = time.perf_counter()
            frames = [spark.read.format("delta").option("versionAsOf", version).load(p)
                      for p in copies]
            read_all(frames)
            return time.perf_counter() - t0

        def measure(side: str, read, into: list[float], k: int = k) -> None:  # noqa: ANN001
            seconds, count = spark_jobs(spark, f"{side}-{k}", read)
            into.append(seconds)
            jobs[side].append(count)

        for side in (("percolake", "delta-spark") if k % 2 == 0
                     else ("delta-spark", "percolake")):
            if side == "percolake":
                measure(side, percolake_read, ours)
            else:
                measure(side, delta_spark_read, theirs)
        print(f"round {k}: percolake {ours[-1] * 1e3:.0f} ms ({jobs['percolake'][-1]} Spark "
              f"jobs), delta-spark copies {theirs[-1] * 1e3:.0f} ms "
              f"({jobs['delta-spark'][-1]} jobs)", flush=True)
    _, low, high = bl.ratio_interval([[o] for o in ours], [[t] for t in theirs])
    return {"percolake_ms": bl.summary_ms(ours), "delta_spark_ms": bl.summary_ms(theirs),
            "ratio": statistics.median(ours) / statistics.median(theirs),
            "ratio_low": low, "ratio_high": high, "next_batch": batch,
            "spark_jobs": {side: statistics.median(n) for side, n in jobs.items()}}


def live(reader, writer: lb.ProtocolBatches, first_batch: int, every_s: float,  # noqa: ANN001
         seconds: float) -> dict:
    stop = threading.Event()
    written = [0]

    def write() -> None:
        batch = first_batch
        while not stop.is_set():
            t0 = time.monotonic()
            writer.run(batch)
            batch += 1
            written[0] += 1
            stop.wait(max(0.0, every_s - (time.monotonic() - t0)))

    thread = threading.Thread(target=write, name="live-writer", daemon=True)
    thread.start()
    fresh: list[float] = []
    reads: list[float] = []
    last: dict[str, int | None] = {}
    start = time.monotonic()
    previous = start
    while time.monotonic() - start < seconds:
        t0 = time.perf_counter()
        snapshot = reader.snapshot(writer.tables)
        read_all([snapshot.table(t) for t in writer.tables])
        reads.append(time.perf_counter() - t0)
        if all((v or -1) > (last.get(t) or -1) for t, v in snapshot.versions.items()):
            now = time.monotonic()
            fresh.append(now - previous)
            previous = now
            last = dict(snapshot.versions)
            print(f"fresh snapshot at versions {sorted(set(last.values()))}: "
                  f"{fresh[-1]:.2f} s after the previous one (read {reads[-1] * 1e3:.0f} ms)",
                  flush=True)
    stop.set()
    thread.join()
    intervals = fresh[1:]  # the first one counts from the start
    return {"fresh_snapshots": len(fresh), "batches_written": written[0],
            "interval_s": {"p50": statistics.median(intervals) if intervals else float("nan"),
                           "max": max(intervals, default=float("nan"))},
            "read_ms": bl.summary_ms(reads), "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=41, help="versions before the rounds")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--live-s", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=1.0, help="live writer's batch period")
    parser.add_argument("--snapshot-partitions", help="delta-spark's snapshotPartitions "
                        "(default: what configure_spark sets)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--workdir")
    args = parser.parse_args()
    info = bl.machine_info()
    print(f"bench_reads: {bl.machine_line(info)}", flush=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="percolake-reads-"))
    lake = work / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    from percolake.lake.checkpoints import Checkpointer
    from sparkside import ConsistentReader, local_spark

    conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    if args.snapshot_partitions:
        conf["spark.databricks.delta.snapshotPartitions"] = args.snapshot_partitions
    spark = local_spark("percolake-bench-reads", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    partitions = spark.conf.get("spark.databricks.delta.snapshotPartitions")
    daemon = DaemonProcess(work / "data", [str(lake)], extra_args=DAEMON_ARGS)
    daemon.start()
    result: dict = {"machine": info, "versions": args.versions,
                    "snapshot_partitions": partitions, "every_s": args.every}
    try:
        run = uuid.uuid4().hex[:6]
        tables = [f"file://{lake}/ours-{run}/t{k}" for k in range(3)]
        copies = [str(lake / f"copies-{run}" / f"t{k}") for k in range(3)]
        checkpointer = Checkpointer()
        writer = lb.ProtocolBatches(daemon.target, f"reads-{run}", tables, checkpointer)
        t0 = time.monotonic()
        for batch in range(args.versions):
            writer.run(batch)
            for path in copies:
                spark_append(spark, path, batch)
        checkpointer.flush(120)
        print(f"built {args.versions} versions of 3 tables each way in "
              f"{time.monotonic() - t0:.0f} s", flush=True)
        reader = ConsistentReader(spark, daemon.target)
        result["side_by_side"] = side_by_side(spark, reader, writer, copies, args.versions,
                                              args.rounds)
        if args.live_s > 0:
            result["live"] = live(reader, writer, result["side_by_side"]["next_batch"],
                                  args.every, args.live_s)
        reader.close()
        writer.close()
        checkpointer.close()
    finally:
        daemon.stop()
        spark.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    bl.publish("bench_reads", info, render(result), result, args.json, not args.no_append)
    return 0


def render(result: dict) -> str:
    side = result["side_by_side"]
    rows = [["percolake (ConsistentReader snapshot, 3 tables)", side["percolake_ms"]["p50"],
             side["percolake_ms"]["max"], side["spark_jobs"]["percolake"],
             side["percolake_ms"]["n"]],
            ["delta-spark-written copies, same reads", side["delta_spark_ms"]["p50"],
             side["delta_spark_ms"]["max"], side["spark_jobs"]["delta-spark"],
             side["delta_spark_ms"]["n"]]]
    parts = [f"Snapshot read of 3 tables at a new version ({result['versions']} versions "
             f"and more; delta-spark snapshotPartitions {result['snapshot_partitions']}; "
             "local tables; ms):\n",
             bl.table(["read", "p50", "max", "Spark jobs per read (median)", "rounds"], rows),
             f"\nRatio (medians) "
             f"{bl.interval_text(side['ratio'], side['ratio_low'], side['ratio_high'])} "
             "(goal ≤ 1.2).\n"]
    if "live" in result:
        lv = result["live"]
        parts.append(
            f"\nLive stream ({lv['seconds']:.0f} s, a 3-table batch every "
            f"~{result['every_s']:g} s, {lv['batches_written']} written): "
            f"{lv['fresh_snapshots']} fresh snapshots of the 3 tables, interval p50 "
            f"{lv['interval_s']['p50']:.2f} s, max "
            f"{lv['interval_s']['max']:.2f} s; each snapshot and read p50 "
            f"{lv['read_ms']['p50']:.0f} ms.\n")
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
