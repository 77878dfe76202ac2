"""What a MERGE costs inside a percolake transaction, against delta-spark alone (issue 32).

Two comparisons in one run, on one SparkSession and one coordinator, each on two copies of the
same tables fed the same data in the same order (so both copies hold the same rows):

- **MERGE**: a batch whose only write is a MERGE of each account's net change into an
  ``accounts`` table (``txn.delta_table(...).merge(...)``, through ``Participant.run_batch``:
  Open, the MERGE, Commit, the table's Delta commit) against delta-spark's own
  ``DeltaTable.forPath(...).merge(...).execute()`` of the same source. Goal: ratio ≤ 1.10.
- **whole batch**: the bank batch (append debits, append credits, MERGE accounts) through
  percolake against the non-atomic way: the same three writes with delta-spark, one after the
  other, each table committed on its own.

Each pair runs both variants back to back, the order alternating between pairs, after an
unmeasured warm-up. The script prints the pairs, the medians, the ratios with 95 % bootstrap
intervals, and where the time goes: the Spark jobs each variant ran (count and their summed
wall time), the MERGE's own computation inside the batch function, and the rest of the batch
(the coordinator's calls, the commit, the Delta commit).

    python scripts/bench_merge.py --quick --json /tmp/merge.json      # ~3 min
    python scripts/bench_merge.py                                      # ~10 min
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _benchlib as bl  # noqa: E402

from coordinator.launcher import DaemonProcess  # noqa: E402

GOAL_MERGE = 1.10  # percolake MERGE / delta-spark MERGE
LABELS = {"merge": "MERGE alone", "batch": "whole batch"}
SEED_ROWS = 2  # files the accounts table starts with (delta-spark's initial write)


class JobClock:
    """The Spark jobs a piece of work ran: count and summed wall time (the status tracker,
    by job group)."""

    def __init__(self, spark) -> None:  # noqa: ANN001
        self.context = spark.sparkContext
        self.runs = 0
        self.last_jobs: list[tuple[str, float]] = []  # (Spark's name of the job, seconds)

    def measure(self, work: Callable[[], object]) -> tuple[float, int, float]:
        """(wall seconds, Spark jobs, their summed seconds) of ``work``."""
        self.runs += 1
        group = f"bench-merge-{self.runs}"
        self.context.setJobGroup(group, group)
        started = time.perf_counter()
        try:
            work()
        finally:
            wall = time.perf_counter() - started
            self.context.setLocalProperty("spark.jobGroup.id", None)
        tracker = self.context.statusTracker()
        jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
        seconds = 0.0
        self.last_jobs = []
        try:  # job durations: Spark's status store (PySpark's tracker has no times)
            store = self.context._jsc.sc().statusStore()  # noqa: SLF001
            for job in sorted((j for j in jobs if j is not None), key=lambda j: j.jobId):
                data = store.job(job.jobId)
                start, end = data.submissionTime(), data.completionTime()
                if start.isDefined() and end.isDefined():
                    took = (end.get().getTime() - start.get().getTime()) / 1000
                    seconds += took
                    self.last_jobs.append((str(data.name()), took))
        except Exception:  # noqa: BLE001 - a figure of the profile, not of the comparison
            seconds = float("nan")
        return wall, len(jobs), seconds


class Workload:
    """The bank's batches: ``rows`` transfers over ``accounts`` accounts, batch ``b`` the same
    for every variant."""

    def __init__(self, spark, accounts: int, rows: int) -> None:  # noqa: ANN001
        self.spark, self.accounts, self.rows = spark, accounts, rows

    def transfers(self, batch: int):  # noqa: ANN201
        from pyspark.sql import functions as F

        ids = self.spark.range(batch * self.rows, (batch + 1) * self.rows, numPartitions=2)
        return ids.select(
            F.lit(batch).cast("long").alias("batch"), F.col("id").alias("transfer"),
            (F.hash("id", F.lit(1)) % self.accounts).cast("long").alias("from_account"),
            (F.hash("id", F.lit(2)) % self.accounts).cast("long").alias("to_account"),
            (F.col("id") % 50 + 1).alias("amount"))

    def parts(self, batch: int):  # noqa: ANN201
        """(debits, credits, net change per account) of a batch."""
        from pyspark.sql import functions as F

        transfers = self.transfers(batch)
        debits = transfers.select("batch", "transfer",
                                  F.abs(F.col("from_account")).alias("account"), "amount")
        credits = transfers.select("batch", "transfer",
                                   F.abs(F.col("to_account")).alias("account"), "amount")
        net = (credits.select("account", F.col("amount").alias("net"))
               .unionByName(debits.select("account", (-F.col("amount")).alias("net")))
               .groupBy("account").agg(F.sum("net").alias("net")))
        return debits, credits, net

    def create(self, folder: Path) -> None:
        """The tables of one copy: accounts with every account at 0 (delta-spark's write)."""
        from pyspark.sql import functions as F

        folder.mkdir(parents=True)
        (self.spark.range(self.accounts, numPartitions=SEED_ROWS)
         .select(F.col("id").alias("account"), F.lit(0).cast("long").alias("balance"))
         .write.format("delta").save(str(folder / "accounts")))


def merge(table, net) -> None:  # noqa: ANN001 - delta-spark's DeltaTable or percolake's
    (table.alias("t").merge(net.alias("s"), "t.account = s.account")
        .whenMatchedUpdate(set={"balance": "t.balance + s.net"})
        .whenNotMatchedInsert(values={"account": "s.account", "balance": "s.net"})
        .execute())


class Variants:
    """The four ways to run a batch; each returns (wall s, jobs, job s, MERGE's own s)."""

    def __init__(self, spark, target: str, work: Workload, lake: Path) -> None:  # noqa: ANN001
        from sparkside import Participant

        self.spark, self.work, self.lake = spark, work, lake
        self.clock = JobClock(spark)
        self.participants = {name: Participant(target, pipeline_id=f"bench-{name}")
                             for name in ("merge", "batch")}
        self.next_batch = {"merge": 0, "batch": 0}

    def folder(self, variant: str) -> Path:
        return self.lake / variant

    def percolake(self, kind: str, batch: int) -> tuple[float, int, float, float]:
        folder = self.folder(f"percolake-{kind}")
        debits, credits, net = self.work.parts(batch)
        merged: list[float] = []

        def write(df, batch_id, txn) -> None:  # noqa: ANN001
            if kind == "batch":
                txn.write(debits, str(folder / "debits"))
                txn.write(credits, str(folder / "credits"))
            started = time.perf_counter()
            merge(txn.delta_table(str(folder / "accounts")), net)
            merged.append(time.perf_counter() - started)

        participant = self.participants[kind]
        batch_id = self.next_batch[kind]
        self.next_batch[kind] += 1
        wall, jobs, job_s = self.clock.measure(
            lambda: participant.run_batch(self.spark.range(1), batch_id, write))
        return wall, jobs, job_s, merged[0]

    def delta_spark(self, kind: str, batch: int) -> tuple[float, int, float, float]:
        from delta.tables import DeltaTable

        folder = self.folder(f"delta-spark-{kind}")
        debits, credits, net = self.work.parts(batch)
        merged: list[float] = []

        def write() -> None:
            if kind == "batch":
                debits.write.format("delta").mode("append").save(str(folder / "debits"))
                credits.write.format("delta").mode("append").save(str(folder / "credits"))
            started = time.perf_counter()
            merge(DeltaTable.forPath(self.spark, str(folder / "accounts")), net)
            merged.append(time.perf_counter() - started)

        wall, jobs, job_s = self.clock.measure(write)
        return wall, jobs, job_s, merged[0]


def _files(path: Path) -> int:
    from deltalake import DeltaTable

    return len(DeltaTable(str(path)).file_uris())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 pairs, smaller tables")
    parser.add_argument("--pairs", type=int, help="measured pairs per comparison (8; quick 3)")
    parser.add_argument("--accounts", type=int,
                        help="rows of the accounts table (100,000; quick 20,000)")
    parser.add_argument("--rows", type=int,
                        help="transfers per batch (10,000; quick 2,000)")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--no-append", action="store_true",
                        help="do not append the results to docs/benchmarks.md")
    args = parser.parse_args()
    pairs = args.pairs or (3 if args.quick else 8)
    accounts = args.accounts or (20_000 if args.quick else 100_000)
    rows = args.rows or (2_000 if args.quick else 10_000)
    info = bl.machine_info()
    print(f"bench_merge: {bl.machine_line(info)}", flush=True)
    started = time.monotonic()
    work_dir = Path(tempfile.mkdtemp(prefix="percolake-bench-merge-"))
    lake = work_dir / "lake"
    lake.mkdir()
    from sparkside import local_spark

    spark = local_spark("percolake-bench-merge")
    spark.sparkContext.setLogLevel("ERROR")
    daemon = DaemonProcess(work_dir / "data", [str(lake)], extra_args=["--log-level", "warning"])
    work = Workload(spark, accounts, rows)
    samples: dict[tuple[str, str], list[tuple[float, int, float, float]]] = {
        (kind, way): [] for kind in ("merge", "batch") for way in ("percolake", "delta-spark")}
    order_log: list[list[object]] = []
    job_lists: dict[str, list[tuple[str, float]]] = {}  # the last pair's Spark jobs
    try:
        daemon.start()
        variants = Variants(spark, daemon.target, work, lake)
        for kind in ("merge", "batch"):
            for way in ("percolake", "delta-spark"):
                work.create(variants.folder(f"{way}-{kind}"))
        for batch, pair in enumerate(range(-1, pairs)):  # pair -1: the warm-up, not measured
            for kind in ("merge", "batch"):
                ways = ("percolake", "delta-spark") if pair % 2 == 0 else \
                    ("delta-spark", "percolake")
                got = {}
                for way in ways:
                    run = variants.percolake if way == "percolake" else variants.delta_spark
                    got[way] = run(kind, batch)
                    if pair >= 0:
                        samples[kind, way].append(got[way])
                        job_lists[f"{LABELS[kind]}, {way}"] = variants.clock.last_jobs
                if pair >= 0:
                    order_log.append([kind, pair, " then ".join(ways),
                                      got["percolake"][0] * 1e3, got["delta-spark"][0] * 1e3,
                                      got["percolake"][0] / got["delta-spark"][0]])
                    print(f"pair {pair} {kind}: percolake {got['percolake'][0] * 1e3:.0f} ms, "
                          f"delta-spark {got['delta-spark'][0] * 1e3:.0f} ms", flush=True)
        files = {f"{way}-{kind}": _files(variants.folder(f"{way}-{kind}") / "accounts")
                 for kind in ("merge", "batch") for way in ("percolake", "delta-spark")}
        same = all(
            sorted(spark.read.format("delta").load(str(variants.folder(f"percolake-{kind}")
                                                       / "accounts")).collect())
            == sorted(spark.read.format("delta").load(str(
                variants.folder(f"delta-spark-{kind}") / "accounts")).collect())
            for kind in ("merge", "batch"))
        for participant in variants.participants.values():
            participant.close()
    finally:
        daemon.stop()
        spark.stop()
    elapsed = time.monotonic() - started
    shutil.rmtree(work_dir, ignore_errors=True)
    result, body = report(samples, order_log, files, same, accounts, rows, pairs, elapsed,
                          job_lists)
    result["machine"] = info
    bl.publish("bench_merge", info, body, result, args.json, not args.no_append)
    return 0 if same else 1


def report(samples: dict[tuple[str, str], list[tuple[float, int, float, float]]],
           order_log: list[list[object]], files: dict[str, int], same: bool, accounts: int,
           rows: int, pairs: int, elapsed: float,
           job_lists: dict[str, list[tuple[str, float]]]) -> tuple[dict[str, object], str]:
    result: dict[str, object] = {"accounts": accounts, "rows_per_batch": rows, "pairs": pairs,
                                 "tables_equal": same, "accounts_files": files,
                                 "seconds_total": elapsed}
    figures, profile = [], []
    for kind, label in LABELS.items():
        ours, theirs = samples[kind, "percolake"], samples[kind, "delta-spark"]
        ratio, low, high = bl.ratio_interval([[s[0]] for s in ours], [[s[0]] for s in theirs])
        median = {way: statistics.median(s[0] for s in samples[kind, way])
                  for way in ("percolake", "delta-spark")}
        goal = f"≤ {GOAL_MERGE:.2f}" if kind == "merge" else ""
        status = ("met" if high <= GOAL_MERGE else "met (median; the interval reaches past "
                  "the goal)" if ratio <= GOAL_MERGE else "not met") if kind == "merge" else ""
        figures.append([label, median["percolake"] * 1e3, median["delta-spark"] * 1e3,
                        bl.interval_text(ratio, low, high), goal, status])
        result[kind] = {"percolake_median_ms": median["percolake"] * 1e3,
                        "delta_spark_median_ms": median["delta-spark"] * 1e3,
                        "ratio": ratio, "ratio_ci95": [low, high]}
        for way in ("percolake", "delta-spark"):
            got = samples[kind, way]
            wall = statistics.fmean(s[0] for s in got)
            merge_s = statistics.fmean(s[3] for s in got)
            profile.append([f"{label}, {way}", wall * 1e3, statistics.fmean(s[1] for s in got),
                            statistics.fmean(s[2] for s in got) * 1e3, merge_s * 1e3,
                            (wall - merge_s) * 1e3])
            result[kind][f"{way.replace('-', '_')}_profile"] = dict(zip(
                ("wall_ms", "spark_jobs", "spark_job_ms", "merge_ms", "rest_ms"),
                profile[-1][1:], strict=True))
    result["last_pair_jobs"] = job_lists
    result["merge_goal_met"] = result["merge"]["ratio"] <= GOAL_MERGE  # type: ignore[index]
    body = "\n".join([
        f"An accounts table of {accounts:,} rows (two copies per comparison, fed the same "
        f"batches); each batch {rows:,} transfers, its net change per account MERGEd into "
        "accounts (`whenMatchedUpdate` + `whenNotMatchedInsert`). MERGE alone: a percolake "
        "batch whose only write is the MERGE (`txn.delta_table`, the whole transaction "
        "timed) against delta-spark's `DeltaTable.merge` of the same source. Whole batch: "
        "append debits, append credits, MERGE accounts, through percolake against the "
        "non-atomic way (the same three with delta-spark, one after the other). "
        f"{pairs} pairs each, order alternating, after a warm-up. Milliseconds:\n",
        bl.table(["comparison", "pair", "order", "percolake", "delta-spark", "ratio"],
                 order_log),
        "\n",
        bl.table(["comparison", "percolake median ms", "delta-spark median ms",
                  "ratio [95 % CI]", "goal", "status"], figures),
        "\nWhere the time goes (means per batch): the Spark jobs each ran (their wall time "
        "summed; jobs of concurrent writes overlap), the MERGE call itself, and the rest of "
        "the batch (percolake: Open, Commit, the Delta commits; delta-spark: the appends):\n",
        bl.table(["variant", "wall ms", "Spark jobs", "Spark job ms", "MERGE call ms",
                  "rest ms"], profile),
        "\nThe last pair's Spark jobs, in order (Spark's name of each job: its call site; "
        "seconds):\n",
        bl.table(["variant", "jobs"], [[name, "; ".join(f"{job} {took:.2f}"
                                                        for job, took in jobs)]
                                       for name, jobs in job_lists.items()]),
        f"\nData files of accounts at the end: {files}; percolake's and delta-spark's "
        f"accounts hold the same rows: {same}. Whole run: {elapsed:.0f} s.",
    ])
    return result, body


if __name__ == "__main__":
    sys.exit(main())
