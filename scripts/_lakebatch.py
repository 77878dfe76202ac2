"""Percolake batches without Spark, for the benchmarks of table growth and reads.

One batch is what the participant does for a 3-table micro-batch once its executors have
written the data files (here pyarrow writes one small Parquet file per table): the schema
check of each table (``SchemaChecker``, its layout cache kept across batches as the
participant keeps it), Open, Commit with the write intents (the daemon's write check reads
each table's log), the three Delta commits side by side (``apply_table_write``) with their
versions handed to a ``Checkpointer``, then ReportApplied (the participant sends it in the
background: timed apart). Tables of many versions are built fast by writing log entries
directly (``grow_log``), as percolake's applies would have left them.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import pyarrow as pa
import pyarrow.parquet as pq

from percolake import codec
from percolake.lake import storage
from percolake.lake.checkpoints import Checkpointer
from percolake.lake.delta_commit import apply_table_write
from percolake.lake.table_cache import TableCache
from percolake.lake.warehouse import is_object_store, local_path
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode, delta_app_id
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from sparkside.schema_check import SchemaChecker

SCHEMA_JSON = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "amount", "type": "long", "nullable": True, "metadata": {}}]})
ROWS = 100


def put_file(uri: str, data: bytes) -> None:
    if is_object_store(uri):
        with storage.s3_filesystem().open_output_stream(storage.arrow_path(uri)) as out:
            out.write(data)
    else:
        from pathlib import Path

        path = Path(local_path(uri))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def parquet_bytes(batch: int, rows: int = ROWS) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(range(batch * rows, (batch + 1) * rows), pa.int64()),
                             "amount": pa.array([batch] * rows, pa.int64())}), sink)
    return sink.getvalue()


@dataclass
class BatchTimes:
    schema_check: float = 0.0
    open: float = 0.0
    commit: float = 0.0
    apply: float = 0.0
    report: float = 0.0
    versions: dict[str, int] = field(default_factory=dict)
    marks: list[int] = field(default_factory=list)  # mark() before each phase and at the end

    @property
    def batch(self) -> float:
        """The batch's own time (ReportApplied goes in the background)."""
        return self.schema_check + self.open + self.commit + self.apply


class ProtocolBatches:
    """Batches of one pipeline writing ``tables`` through the coordinator at ``target``."""

    def __init__(self, target: str, pipeline: str, tables: list[str],
                 checkpointer: Checkpointer | None = None) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.pipeline = pipeline
        self.tables = tables
        self.checkpointer = checkpointer
        self.schemas = SchemaChecker()
        self.pool = ThreadPoolExecutor(max_workers=len(tables))
        self.kept = TableCache().tables  # as the participant keeps them

    def run(self, batch: int, mark: Callable[[], int] | None = None) -> BatchTimes:
        """One batch; ``mark`` (e.g. the S3 server log's size) is taken at each phase's
        start and at the end, after the executors' part: ``BatchTimes.marks``."""
        times = BatchTimes()
        mark = mark or (lambda: 0)
        times.marks.append(mark())
        t0 = time.perf_counter()
        list(self.pool.map(self.schemas.check_features, self.tables))
        times.marks.append(mark())
        t1 = time.perf_counter()
        txn = self.stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=self.pipeline, batch_id=batch, tables=self.tables),
            timeout=120).transaction
        times.marks.append(mark())
        t2 = time.perf_counter()
        data = parquet_bytes(batch)
        writes = {}
        for table in self.tables:  # the executors' part: not timed
            relative = f"_percolake/{txn.txn_id}/part-00000.parquet"
            put_file(f"{table}/{relative}", data)
            writes[table] = TableWriteRecord(table, WriteMode.APPEND, (AddFileRecord(
                relative, len(data), {}, int(time.time() * 1000),
                json.dumps({"numRecords": ROWS})),), SCHEMA_JSON)
        times.marks.append(mark())
        t3 = time.perf_counter()
        committed = self.stub.CommitTransaction(pb.CommitTransactionRequest(
            txn_id=txn.txn_id, tables=self.tables,
            writes=[codec.table_write_to_pb(w) for w in writes.values()]),
            timeout=120).transaction
        t4 = time.perf_counter()
        times.marks.append(mark())
        app_id = delta_app_id(committed.pipeline_id, committed.generation)

        def apply(write: TableWriteRecord) -> int:
            version = apply_table_write(write, app_id=app_id, app_version=batch,
                                        txn_id=txn.txn_id, commit_ts=committed.commit_ts,
                                        tables=self.kept)
            if self.checkpointer is not None:
                self.checkpointer.applied(write.table, version)
            return version

        versions = dict(zip(self.tables, self.pool.map(apply, writes.values()), strict=True))
        t5 = time.perf_counter()
        times.marks.append(mark())
        self.stub.ReportApplied(pb.ReportAppliedRequest(txn_id=txn.txn_id, tables=[
            pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()]),
            timeout=120)
        t6 = time.perf_counter()
        times.marks.append(mark())
        times.schema_check, times.open = t1 - t0, t2 - t1
        times.commit, times.apply, times.report = t4 - t3, t5 - t4, t6 - t5
        times.versions = versions
        return times

    def close(self) -> None:
        self.pool.shutdown()
        self.channel.close()


def grow_log(table: str, pipeline: str, upto: int, checkpoint_every: int) -> None:
    """Makes ``table`` (created by one real batch, version 0) reach version ``upto`` with one
    append per version, each a log entry as percolake's apply writes it (commitInfo, the app
    transaction, one add of a small file) and its version checksum; then the checkpoint of the
    newest multiple of ``checkpoint_every`` (what a schedule of that interval leaves), if
    any."""
    from percolake.lake.delta_commit import open_table
    from percolake.lake.version_checksum import (
        background_written,
        checksum_uri,
        next_checksum,
        read_checksum,
    )

    app_id = delta_app_id(pipeline, 0)
    start = open_table(table).version() + 1
    now = int(time.time() * 1000)

    def entry(version: int) -> bytes:
        lines = [
            {"commitInfo": {"timestamp": now, "operation": "WRITE",
                            "operationParameters": {"mode": "Append"},
                            "percolake.txn_id": f"grown-{version}",
                            "percolake.commit_ts": str(version), "clientVersion": "grown"}},
            {"txn": {"appId": app_id, "version": version, "lastUpdated": now}},
            {"add": {"path": f"_percolake/grown/part-{version:06d}.parquet", "size": 900,
                     "partitionValues": {}, "modificationTime": now, "dataChange": True,
                     "stats": json.dumps({"numRecords": ROWS})}}]
        return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"

    def put(version: int) -> None:
        put_file(f"{table}/_delta_log/{version:020d}.json", entry(version))

    # each version's checksum, derived from the one before as percolake's applies write them
    # (without the chain, no later commit could write its own: its previous one missing)
    checksums: list[tuple[int, bytes]] = []
    background_written(60)  # the checksum of the version before (an object store's: later)
    previous = read_checksum(table, start - 1)
    for version in range(start, upto + 1):
        actions = [json.loads(line) for line in entry(version).decode().splitlines()]
        previous = next_checksum(previous, actions, f"grown-{version}") if previous else None
        if previous is not None:
            checksums.append((version, (json.dumps(previous, separators=(",", ":"))
                                        + "\n").encode()))

    def put_checksum(item: tuple[int, bytes]) -> None:
        put_file(checksum_uri(table, item[0]), item[1])

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(put, range(start, upto + 1)))
        list(pool.map(put_checksum, checksums))
    due = upto - upto % checkpoint_every
    if due > 0:
        open_table(table, due).create_checkpoint()
