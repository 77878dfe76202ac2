"""Shared pieces of the topology check (TOPOLOGY.md, "The check it must pass"): a coordinator
on a lake with a short barrier interval, light protocol-level pipelines (root and downstream,
no Spark), and the ledger check read three ways.

The ledger check: the root pipeline ``bank`` appends ``debits`` and ``credits``; the downstream
pipeline ``ledger`` appends one row per input row with the signed amount (debits negative). In
every consistent state count(ledger) = count(debits) + count(credits) and sum(|ledger.amount|)
= sum(debits.amount) + sum(credits.amount). Topology-consistent reads must always pass it;
naive (read_committed) and plain snapshot reads break it while the ledger lags.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coordinator.launcher import DaemonProcess
from percolake import codec
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import apply_table_write
from percolake.lake.warehouse import canonical_table_uri, local_path
from percolake.records import delta_app_id
from percolake.v1 import coordinator_pb2 as pb
from tests.crash.rpc import Client
from tests.daemon_support import wait_for

FAILPOINT_EXIT = 137
CONSISTENCIES = {"read_committed": pb.CONSISTENCY_READ_COMMITTED,
                 "snapshot": pb.CONSISTENCY_SNAPSHOT,
                 "topology": pb.CONSISTENCY_TOPOLOGY}
LEDGER_SCHEMA = pa.schema([("account", pa.int64()), ("amount", pa.int64()),
                           ("input_barrier", pa.int64())])
TRANSFER_SCHEMA = pa.schema([("batch", pa.int64()), ("i", pa.int64()),
                             ("account", pa.int64()), ("amount", pa.int64())])


# ---------------------------------------------------------------- a coordinator on a lake


class TopologyLake:
    """A coordinator daemon (SQLite, own data dir) serving ``<root>/lake`` with global
    barriers every ``interval_s``; restarted on the same data dir and port after a crash."""

    def __init__(self, root: Path, interval_s: float = 0.2,
                 extra_args: list[str] | None = None) -> None:
        self.root = Path(root)
        self.lake = self.root / "lake"
        self.lake.mkdir(parents=True, exist_ok=True)
        self.interval_s = interval_s
        self.data_dir = self.root / "coordinator-data"
        self.daemon = DaemonProcess(
            self.data_dir, [str(self.lake)], log_path=self.root / "coordinator.log",
            extra_args=["--barrier-interval", f"{interval_s:g}", "--log-format", "text",
                        *(extra_args or [])])

    @property
    def target(self) -> str:
        return self.daemon.target

    def table(self, name: str) -> str:
        return canonical_table_uri(str(self.lake / name))

    def start(self, failpoints: str = "") -> TopologyLake:
        self.daemon.start(env={"PERCOLAKE_FAILPOINTS": failpoints})
        return self

    def restart(self, failpoints: str = "") -> None:
        self.daemon.kill()
        self.start(failpoints)

    def client(self, retry_s: float = 30.0) -> Client:
        return Client(self.target, retry_s=retry_s)

    def wait_crashed_at(self, failpoint: str, timeout_s: float = 30.0) -> None:
        """Waits for the daemon to die at ``failpoint`` (its exit code and log line)."""
        process = self.daemon.process
        assert process is not None
        try:
            rc = process.wait(timeout_s)
        except Exception as exc:
            raise AssertionError(f"the coordinator did not die at {failpoint}:\n"
                                 f"{self.daemon.log_tail()}") from exc
        log = (self.root / "coordinator.log").read_text(errors="replace")
        assert rc == FAILPOINT_EXIT and f"failpoint {failpoint}" in log, \
            f"exit {rc}, expected the failpoint {failpoint}:\n{self.daemon.log_tail()}"

    @contextlib.contextmanager
    def store(self) -> Iterator[Any]:
        """The coordinator's SQLite store, opened while the daemon is down (what survived)."""
        from coordinator.store import SqliteStore

        assert not self.daemon.is_running(), "read the store only while the daemon is down"
        store = SqliteStore(self.data_dir)
        try:
            yield store
        finally:
            store.close()

    def close(self) -> None:
        self.daemon.kill()


def crashed_call(client: Client, method: str, request: Any) -> None:
    """Calls ``method`` on a daemon that is to die in it: the call must fail."""
    try:
        reply = client.call(method, request, retry_s=1.0)
    except grpc.RpcError:
        return
    raise AssertionError(f"{method} answered although the coordinator should have died: {reply}")


# ---------------------------------------------------------------- light pipelines (no Spark)


def _schema_json(schema: pa.Schema) -> str:
    from deltalake import Schema

    return Schema.from_arrow(schema).to_json()


def write_intent(opened: pb.OpenTransactionResponse, table: str, rows: pa.Table,
                 mode: int = pb.APPEND) -> pb.TableWrite:
    """Writes ``rows`` as one Parquet file in the attempt's folder of ``table`` (what Spark's
    executors do) and returns the write intent."""
    txn_id = opened.transaction.txn_id
    locations = {loc.table: loc.write_location for loc in opened.locations}
    folder = local_path(locations[table])
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "part-00000.parquet")
    pq.write_table(rows, path)
    write = pb.TableWrite(table=table, mode=mode, schema_json=_schema_json(rows.schema))
    write.add_files.add(path=f"_percolake/{txn_id}/part-00000.parquet",
                        size=os.path.getsize(path), modification_time=int(time.time() * 1000),
                        stats=json.dumps({"numRecords": rows.num_rows}))
    return write


def finish(client: Client, txn_id: str, epoch: int) -> pb.Transaction:
    """The secondaries of a committed transaction: each unapplied table's Delta commit, then
    ReportApplied (as the participant does); the transaction afterwards."""
    txn = client.transaction(txn_id, include_writes=True)
    applied = [pb.AppliedTable(table=p.table, delta_version=apply_table_write(
        codec.table_write_from_pb(p.write), app_id=delta_app_id(txn.pipeline_id, txn.generation),
        app_version=txn.batch_id, txn_id=txn.txn_id, commit_ts=txn.commit_ts))
        for p in txn.participants if not p.applied]
    if applied:
        client.call("ReportApplied", pb.ReportAppliedRequest(txn_id=txn_id, epoch=epoch,
                                                             tables=applied))
    return client.transaction(txn_id)


@dataclass
class LightPipeline:
    """One pipeline driven over gRPC as a participant would: Register, Open, files, Commit,
    apply, ReportApplied."""

    client: Client
    pipeline_id: str
    epoch: int = 0
    generation: int = 0
    last_opened: pb.OpenTransactionResponse | None = None

    def register(self) -> LightPipeline:
        reply = self.client.call("RegisterPipeline", pb.RegisterPipelineRequest(
            pipeline_id=self.pipeline_id))
        self.epoch, self.generation = reply.epoch, reply.generation
        return self

    def register_reads(self, tables: list[str]) -> pb.RegisterReadsResponse:
        return self.client.call("RegisterReads", pb.RegisterReadsRequest(
            pipeline_id=self.pipeline_id, tables=tables, epoch=self.epoch))

    def open(self, batch_id: int, tables: list[str]) -> pb.OpenTransactionResponse:
        self.last_opened = self.client.call("OpenTransaction", pb.OpenTransactionRequest(
            pipeline_id=self.pipeline_id, batch_id=batch_id, epoch=self.epoch, tables=tables))
        return self.last_opened

    def commit(self, opened: pb.OpenTransactionResponse, writes: dict[str, pa.Table],
               source_offsets: str = "") -> pb.Transaction:
        request = pb.CommitTransactionRequest(
            txn_id=opened.transaction.txn_id, epoch=self.epoch, tables=list(writes),
            writes=[write_intent(opened, t, rows) for t, rows in writes.items()],
            source_offsets=source_offsets)
        return self.client.call("CommitTransaction", request).transaction

    def batch(self, batch_id: int, writes: dict[str, pa.Table],
              source_offsets: str = "") -> pb.Transaction:
        """One whole batch, applied; a batch committed before is only finished."""
        opened = self.open(batch_id, list(writes))
        if not opened.already_committed:
            self.commit(opened, writes, source_offsets)
        return finish(self.client, opened.transaction.txn_id, self.epoch)


def transfers(batch: int, k: int = 3) -> pa.Table:
    """Batch ``batch`` of the bank's rows: (batch, i, account, amount), amounts > 0."""
    return pa.table([pa.array([batch] * k, pa.int64()), pa.array(range(k), pa.int64()),
                     pa.array([(batch + i) % 5 for i in range(k)], pa.int64()),
                     pa.array([(batch * 7919 + i * 104729) % 1000 + 1 for i in range(k)],
                              pa.int64())], schema=TRANSFER_SCHEMA)


def ledger_rows(debits: pa.Table, credits: pa.Table, input_barrier: int) -> pa.Table:
    """One ledger row per input row: debits negative, credits positive."""
    accounts = pa.concat_arrays([debits.column("account").combine_chunks(),
                                 credits.column("account").combine_chunks()])
    amounts = pa.concat_arrays([pc.negate(debits.column("amount")).combine_chunks(),
                                credits.column("amount").combine_chunks()])
    barrier = pa.array([input_barrier] * len(accounts), pa.int64())
    return pa.table([accounts, amounts, barrier], schema=LEDGER_SCHEMA)


def version_rows(table: str, version: int) -> pa.Table:
    """The rows one Delta version added (its add actions' files), as a downstream source reads
    a change."""
    root = local_path(table)
    log = Path(root) / "_delta_log" / f"{version:020d}.json"
    parts = []
    for line in log.read_text().splitlines():
        action = json.loads(line)
        if "add" in action and action["add"].get("dataChange", True):
            parts.append(pq.read_table(os.path.join(root, action["add"]["path"])))
    return pa.concat_tables(parts) if parts else TRANSFER_SCHEMA.empty_table()


def changed_rows(client: Client, table: str, after: int, upto: int) -> pa.Table:
    """The rows the table's committed changes in barrier range (after, upto] added."""
    reply = client.call("GetTableChanges", pb.GetTableChangesRequest(
        table=table, after_barrier=after, upto_barrier=upto))
    parts = [version_rows(table, c.delta_version) for c in reply.changes]
    return pa.concat_tables(parts) if parts else TRANSFER_SCHEMA.empty_table()


def completed_barrier(client: Client, table: str) -> int | None:
    """The table's last completed global barrier per GetTopology (None: not known)."""
    reply = client.call("GetTopology", pb.GetTopologyRequest(tables=[table]))
    for node in reply.tables:
        if node.HasField("completed_barrier_ts"):
            return node.completed_barrier_ts
    return None


def wait_completed(client: Client, table: str, at_least: int, timeout_s: float = 30.0) -> int:
    """Waits until ``table`` completed a barrier >= ``at_least``; returns that barrier."""
    return wait_for(lambda: (b := completed_barrier(client, table)) is not None
                    and b >= at_least and b, timeout_s,
                    f"{table} to complete a barrier >= {at_least}")


# ---------------------------------------------------------------- the ledger check


@dataclass(frozen=True)
class Totals:
    rows: int
    amount: int  # sum(amount), for the ledger sum(|amount|)


def table_totals(table: str, version: int | None, absolute: bool = False) -> Totals:
    if version is None:
        return Totals(0, 0)
    amounts = read_delta_table(table, version, columns=["amount"]).column("amount")
    if absolute:
        amounts = pc.abs(amounts)
    return Totals(len(amounts), int(pc.sum(amounts).as_py() or 0))


@dataclass(frozen=True)
class LedgerRead:
    consistency: str
    point: int  # the answer's barrier_ts (topology) or snapshot_ts
    debits: Totals
    credits: Totals
    ledger: Totals

    @property
    def holds(self) -> bool:
        return (self.ledger.rows == self.debits.rows + self.credits.rows
                and self.ledger.amount == self.debits.amount + self.credits.amount)

    def describe(self) -> str:
        return (f"{self.consistency} read at {self.point}: debits {self.debits}, credits "
                f"{self.credits}, ledger {self.ledger}")


def versions_of(reply: pb.GetSnapshotResponse) -> dict[str, int | None]:
    return {t.table: (t.delta_version if t.exists else None) for t in reply.tables}


def ledger_read(client: Client, tables: tuple[str, str, str], consistency: str,
                retry_s: float | None = None, refusals: list[str] | None = None,
                totals: Callable[..., Totals] = table_totals) -> LedgerRead | None:
    """One read of (debits, credits, ledger) with ``consistency``; None if the coordinator
    had no answer yet (a topology barrier not completed by every table), its refusal then
    appended to ``refusals``. ``totals`` reads a table's version (``table_totals``)."""
    try:
        reply = client.call("GetSnapshot", pb.GetSnapshotRequest(
            tables=list(tables), consistency=CONSISTENCIES[consistency]), retry_s=retry_s)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
            if refusals is not None:
                refusals.append(exc.details() or "")
            return None
        raise
    versions = versions_of(reply)
    debits, credits, ledger = tables
    point = reply.barrier_ts if consistency == "topology" else reply.snapshot_ts
    return LedgerRead(consistency, point, totals(debits, versions[debits]),
                      totals(credits, versions[credits]),
                      totals(ledger, versions[ledger], absolute=True))


@dataclass
class ReadStats:
    reads: int = 0
    broken: int = 0
    unanswered: int = 0
    refusals: list[str] = field(default_factory=list)  # why reads were not answered
    failures: list[str] = field(default_factory=list)  # the broken reads, described
    errors: list[str] = field(default_factory=list)


class LedgerReaders:
    """A thread reading (debits, credits, ledger) in turn read_committed, snapshot and
    topology until stopped; counts the reads that break the ledger check and checks that the
    topology barrier never goes backwards (T2)."""

    def __init__(self, target: str, tables: tuple[str, str, str], pause_s: float = 0.1) -> None:
        self.target = target
        self.tables = tables
        self.pause_s = pause_s
        self.stats = {name: ReadStats() for name in CONSISTENCIES}
        self.barriers: list[int] = []  # topology answers, in order
        self.backwards: list[str] = []
        self.rounds = 0
        self.last_round_at = time.monotonic()
        # a table's version never changes: each is read once, not at every round that names it
        # (the tables move every second or so; the readers go round ten times a second)
        self._version_totals = functools.cache(table_totals)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ledger-readers", daemon=True)

    def start(self) -> LedgerReaders:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _loop(self) -> None:
        with Client(self.target, retry_s=60) as client:
            while not self._stop.is_set():
                for name in CONSISTENCIES:
                    self.read_once(client, name)
                self.rounds += 1
                self.last_round_at = time.monotonic()
                self._stop.wait(self.pause_s)

    def read_once(self, client: Client, name: str) -> LedgerRead | None:
        stats = self.stats[name]
        try:
            read = ledger_read(client, self.tables, name, refusals=stats.refusals,
                               totals=self._version_totals)
        except Exception as exc:  # the coordinator restarting beyond the retries: noted
            stats.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return None
        if read is None:
            stats.unanswered += 1
            return None
        stats.reads += 1
        if not read.holds:
            stats.broken += 1
            stats.failures.append(read.describe())
        if name == "topology":
            if self.barriers and read.point < self.barriers[-1]:
                self.backwards.append(f"topology barrier {read.point} after {self.barriers[-1]}")
            self.barriers.append(read.point)
        return read

    def summary(self) -> str:
        return " | ".join(f"{name}: {s.reads} reads, {s.broken} broken"
                          for name, s in self.stats.items()) + \
            f" ({self.rounds} rounds, the last {time.monotonic() - self.last_round_at:.1f} s ago)"
