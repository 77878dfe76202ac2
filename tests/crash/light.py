"""Light participants without Spark, for C9 (coordinator SIGKILLed under load) and the soak.

Each pipeline is a thread that runs the protocol as a driver would: RegisterPipeline, Open (tables
declared up front), Parquet files written with pyarrow under the returned write locations, one
CommitTransaction carrying the prewrites, then each table's Delta commit with
``percolake.lake.delta_commit.apply_table_write`` and ReportApplied. Transient errors (the daemon
restarting) are retried; a commit whose reply was lost is retried on the same txn (idempotent),
never guessed. Every acknowledged commit is recorded, for I4.

Tables of pipeline ``p``: ``p_debits``, ``p_credits`` (append), ``p_balances`` (overwrite) and the
shared append table ``ledger`` that every pipeline writes (write-write holds, I7).
"""

from __future__ import annotations

import os
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.parquet as pq

from percolake import codec
from percolake.records import delta_app_id
from percolake.v1 import coordinator_pb2 as pb
from tests.crash import workload
from tests.crash.checker import TableSpec, bank_tables, local_path
from tests.crash.rpc import Client

LEDGER = "ledger"


def light_tables(lake: str | Path, pipeline: str, k: int) -> list[TableSpec]:
    return bank_tables(lake, k, prefix=f"{pipeline}_")


def ledger_table(lake: str | Path, k: int) -> TableSpec:
    return TableSpec(
        LEDGER, f"{lake}/{LEDGER}", False, ("pipeline", "batch", "i", "amount"),
        lambda t: [(t.pipeline_id, t.batch_id, i, workload.amount(t.batch_id, i))
                   for i in range(k)])


def _arrow(spec: TableSpec, pipeline: str, batch: int, k: int) -> pa.Table:
    if spec.name == LEDGER:
        return pa.table({"pipeline": pa.array([pipeline] * k, pa.string()),
                         "batch": pa.array([batch] * k, pa.int64()),
                         "i": pa.array(range(k), pa.int64()),
                         "amount": pa.array([workload.amount(batch, i) for i in range(k)],
                                            pa.int64())})
    if spec.overwrite:
        rows = workload.balance_rows(batch, k)
    elif spec.name.endswith(workload.DEBITS):
        rows = workload.debit_rows(batch, k)
    else:
        rows = workload.credit_rows(batch, k)
    columns = list(zip(*rows, strict=True))
    return pa.table({c: pa.array(v, pa.int64()) for c, v in zip(spec.columns, columns,
                                                                  strict=True)})


def _stats(table: pa.Table) -> str:
    import json

    mins, maxs, nulls = {}, {}, {}
    for name in table.column_names:
        column = table.column(name)
        nulls[name] = column.null_count
        if len(column) - column.null_count:
            mins[name] = pa.compute.min(column).as_py()
            maxs[name] = pa.compute.max(column).as_py()
    return json.dumps({"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs,
                       "nullCount": nulls})


def _schema_json(schema: pa.Schema) -> str:
    from deltalake import Schema

    return Schema.from_arrow(schema).to_json()


def write_files(tables: list[TableSpec], opened: Any, pipeline: str, batch: int,
                k: int) -> list[pb.TableWrite]:
    """Writes one Parquet file per table under the attempt's write locations (what executors
    do) and returns the write intents with full add actions."""
    txn_id = opened.transaction.txn_id
    locations = {loc.table: loc.write_location for loc in opened.locations}
    writes = []
    for spec in tables:
        data = _arrow(spec, pipeline, batch, k)
        folder = local_path(locations[spec.uri])
        os.makedirs(folder, exist_ok=True)
        name = "part-00000.parquet"
        pq.write_table(data, os.path.join(folder, name))
        size = os.path.getsize(os.path.join(folder, name))
        write = pb.TableWrite(table=spec.path, mode=pb.OVERWRITE if spec.overwrite
                              else pb.APPEND, schema_json=_schema_json(data.schema))
        write.add_files.add(path=f"_percolake/{txn_id}/{name}", size=size,
                            modification_time=int(time.time() * 1000), stats=_stats(data))
        writes.append(write)
    return writes


@dataclass
class Ack:
    pipeline: str
    generation: int
    batch: int
    txn_id: str
    commit_ts: int


@dataclass
class LightPipeline:
    """One pipeline's driver loop in a thread: batches 0..batches-1, sequentially."""

    target: str
    pipeline_id: str
    lake: str
    k: int
    batches: int
    acks: list[Ack] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done_batches: int = 0
    retry_s: float = 90.0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.query_id = str(uuid.uuid4())
        self.tables = [*light_tables(self.lake, self.pipeline_id, self.k),
                       ledger_table(self.lake, self.k)]
        self.thread = threading.Thread(target=self._run, name=self.pipeline_id, daemon=True)

    def start(self) -> LightPipeline:
        self.thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def _run(self) -> None:
        try:
            with Client(self.target, retry_s=self.retry_s) as client:
                reply = client.call("RegisterPipeline", pb.RegisterPipelineRequest(
                    pipeline_id=self.pipeline_id, query_id=self.query_id))
                self.epoch = reply.epoch
                self.generation = reply.generation
                for batch in range(self.batches):
                    if self.stop.is_set():
                        return
                    self._batch(client, batch)
                    self.done_batches = batch + 1
        except Exception:
            self.errors.append(traceback.format_exc())

    def _batch(self, client: Client, batch: int) -> None:
        paths = [t.path for t in self.tables]
        for _attempt in range(50):
            opened = client.call("OpenTransaction", pb.OpenTransactionRequest(
                pipeline_id=self.pipeline_id, batch_id=batch, epoch=self.epoch,
                query_id=self.query_id, tables=paths))
            txn = opened.transaction
            if opened.already_committed:
                self._finish(client, txn.txn_id)
                return
            writes = write_files(self.tables, opened, self.pipeline_id, batch, self.k)
            try:
                committed = client.call("CommitTransaction", pb.CommitTransactionRequest(
                    txn_id=txn.txn_id, epoch=self.epoch, tables=paths, writes=writes)).transaction
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.ABORTED:
                    continue  # aborted meanwhile (conflict, superseded): a new attempt
                raise
            self.acks.append(Ack(self.pipeline_id, committed.generation, batch,
                                 committed.txn_id, committed.commit_ts))
            self._finish(client, committed.txn_id)
            return
        raise RuntimeError(f"{self.pipeline_id} batch {batch}: gave up after 50 attempts")

    def _finish(self, client: Client, txn_id: str) -> None:
        """The secondaries: each unapplied table's Delta commit, then ReportApplied."""
        from percolake.lake.delta_commit import apply_table_write

        txn = client.transaction(txn_id, include_writes=True)
        applied = []
        for part in txn.participants:
            if part.applied:
                continue
            version = apply_table_write(
                codec.table_write_from_pb(part.write),
                app_id=delta_app_id(txn.pipeline_id, txn.generation), app_version=txn.batch_id,
                txn_id=txn.txn_id, commit_ts=txn.commit_ts)
            applied.append(pb.AppliedTable(table=part.table, delta_version=version))
        if applied:
            try:
                client.call("ReportApplied", pb.ReportAppliedRequest(
                    txn_id=txn_id, epoch=self.epoch, tables=applied))
            except grpc.RpcError as exc:
                # Rolled forward meanwhile by the coordinator at the same version is fine; a
                # different version is a bug the checker reports from the Delta log.
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                self.errors.append(f"ReportApplied {txn_id}: {exc.details()}")


def run_light(target: str, lake: str, pipelines: int, batches: int, k: int,
              prefix: str = "p") -> list[LightPipeline]:
    return [LightPipeline(target, f"{prefix}{n}", lake, k, batches).start()
            for n in range(pipelines)]


def all_tables(runs: list[LightPipeline]) -> list[TableSpec]:
    seen: dict[str, TableSpec] = {}
    for run in runs:
        for spec in run.tables:
            seen.setdefault(spec.name, spec)
    return list(seen.values())


def summary(runs: list[LightPipeline]) -> dict[str, Any]:
    return {r.pipeline_id: {"done": r.done_batches, "acks": len(r.acks), "errors": r.errors}
            for r in runs}
