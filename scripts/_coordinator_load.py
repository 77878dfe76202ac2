"""The load generator of ``bench_coordinator.py``: processes of pipelines, each running whole
transactions against the daemon, every one as real for the daemon as a participant's stream
and as cheap as it can be for the process that drives it, which shares the machine's cores
with the daemon it measures (its own CPU in the window is ``load_cpu_ms_per_txn``).

What the daemon sees, per transaction: an Open (``2rpc``: carrying the previous transaction's
applied report) and a Commit carrying the 3 tables' write intents (``files`` adds each, with
per-batch stats); every added file exists at ``<table>/_percolake/<txn_id>/`` with its stated
size when the Commit stats it (the daemon refuses paths outside the attempt folder Open named);
every table's Delta log entry is the one the participant's delta-rs commit writes (commitInfo
naming the transaction, the app transaction, the adds; protocol and metadata at version 0)
before the call whose applied report the daemon checks against it.

What is not the daemon's work is done before the measured window where it can be: each
transaction's data files are hard links (to a sparse file, as before) made ahead in a folder
per table outside the tables, and moved into the attempt folder with one rename once Open has
named the transaction; the requests are built once per pipeline and only their changing fields
set per call; log entries are rendered from their parts without a JSON encoder.
"""

from __future__ import annotations

import errno
import itertools
import json
import math
import multiprocessing as mp
import os
import shutil
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable

from percolake.lake.warehouse import ATTEMPT_DIR
from percolake.records import delta_app_id

SCHEMA_JSON = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "amount", "type": "double", "nullable": True, "metadata": {}},
    {"name": "day", "type": "string", "nullable": True, "metadata": {}},
]})
# "path": the calls a batch waits for before it can go on (Open, Prewrite, Commit), per txn
RPCS = ("open", "prewrite", "commit", "report", "path")
DATA_FILE_SIZE = 123_456
# the window's transactions whose files are made ahead, across all threads of a closed-loop
# level: ~3x the best 2rpc rate measured on this machine (380 txn/s); past it a transaction's
# files are made when it needs them (the same files, in the window's CPU)
PREPARED_TXN_PER_S = 1200.0
PREPARED_LEAD_S = 0.25  # transactions opened this long before the window use prepared files too


def own_cpu_in_window(t_begin: float, t_end: float) -> Callable[[], float]:
    """Samples this process's CPU seconds (user + system, every thread) at the monotonic times
    ``t_begin`` and ``t_end`` on a thread of its own; the returned call waits for both and
    gives the difference: what a load generator spent in the measured window."""
    marks: list[float] = []

    def sample() -> None:
        for when in (t_begin, t_end):
            time.sleep(max(0.0, when - time.monotonic()))
            times = os.times()
            marks.append(times.user + times.system)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def spent() -> float:
        sampler.join()
        return marks[1] - marks[0]

    return spent


def prepared_per_thread(rate: float, concurrency: int, duration_s: float) -> int:
    """How many transactions' files each thread makes ahead: the window (and the lead before
    it) at ``rate`` txn/s, or at PREPARED_TXN_PER_S in a closed loop, shared by the threads."""
    per_s = rate * 1.1 if rate else PREPARED_TXN_PER_S
    return math.ceil(per_s * (duration_s + PREPARED_LEAD_S) / max(1, concurrency)) + 1


class DataFiles:
    """The batches' data files of one load process: hard links to a sparse file of
    DATA_FILE_SIZE bytes in the warehouse. The executors' writing of the files is not the
    coordinator's work and runs on other machines in a real job; a link costs a tenth of
    creating a sized file, and a folder of them made ahead costs one rename in the window."""

    def __init__(self, warehouse: str, files: int) -> None:
        self._prefix = f"{warehouse}/.data-file-{os.getpid()}"
        self.prepared_root = f"{warehouse}/.prepared-{os.getpid()}"
        os.makedirs(self.prepared_root, exist_ok=True)
        self.files = files
        self._folders = itertools.count()
        self._lock = threading.Lock()
        self._count = 0
        self._template = self._new_template()

    def _new_template(self) -> str:
        path = f"{self._prefix}-{self._count}"
        with open(path, "wb") as data:
            data.truncate(DATA_FILE_SIZE)
        return path

    def create(self, path: str) -> None:
        template = self._template
        try:
            os.link(template, path)
        except OSError as exc:
            if exc.errno != errno.EMLINK:
                raise
            with self._lock:  # the file system's limit of links to one file: a new template
                if self._template == template:
                    self._count += 1
                    self._template = self._new_template()
            os.link(self._template, path)

    def folder(self) -> tuple[str, list[str]]:
        """A new folder outside the tables holding one table's files of one transaction, and
        their names (as the executors name them: part number and a random id)."""
        folder = f"{self.prepared_root}/{next(self._folders)}"
        os.mkdir(folder)
        names = [f"part-{i:05d}-{uuid.uuid4().hex}.parquet" for i in range(self.files)]
        for name in names:
            self.create(f"{folder}/{name}")
        return folder, names

    def remove_prepared(self) -> None:
        """The folders no transaction took (after the window)."""
        shutil.rmtree(self.prepared_root, ignore_errors=True)


def file_stats(batch_id: int) -> str:
    """A data file's Delta stats (JSON text, the same every file of a batch)."""
    low = batch_id * 1000
    return (f'{{"numRecords": 1000, "minValues": {{"id": {low}}}, "maxValues": {{"id": '
            f'{low + 999}}}, "nullCount": {{"id": 0}}}}')


def delta_log_entry(txn_id: str, app_id_json: str, batch_id: int, now_ms: int,
                    add_paths: list[str], mtime_ms: int, stats_json: str,
                    first: bool = False) -> bytes:
    """A table's Delta log entry as the participant's delta-rs commit writes it: commitInfo
    naming the transaction, the app transaction (``app_id_json``: the app id as JSON), the
    adds (each of DATA_FILE_SIZE bytes, ``stats_json``: the stats text as a JSON string);
    protocol and metadata when ``first`` (version 0). The same text ``json.dumps`` gives each
    action (``tests/test_bench_load.py``), without encoding the parts that never change."""
    lines = [f'{{"commitInfo": {{"timestamp": {now_ms}, "operation": "WRITE", '
             f'"percolake.txn_id": "{txn_id}"}}}}',
             f'{{"txn": {{"appId": {app_id_json}, "version": {batch_id}, '
             f'"lastUpdated": {now_ms}}}}}']
    if first:
        lines += [json.dumps({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}),
                  json.dumps({"metaData": {"id": str(uuid.uuid4()),
                                           "format": {"provider": "parquet", "options": {}},
                                           "schemaString": SCHEMA_JSON, "partitionColumns": [],
                                           "configuration": {}, "createdTime": now_ms}})]
    lines += [f'{{"add": {{"path": "{path}", "size": {DATA_FILE_SIZE}, "partitionValues": {{}}, '
              f'"modificationTime": {mtime_ms}, "dataChange": true, "stats": {stats_json}}}}}'
              for path in add_paths]
    lines.append("")
    return "\n".join(lines).encode()


class LoadPipeline:
    """One load thread's pipeline (registered with an epoch and a query id, as a Spark driver
    is) writing its own 3 tables, one transaction at a time. Its requests are built once and
    only what changes per transaction is set on them before each call."""

    def __init__(self, stub, pb, mode: str, pipeline: str, epoch: int, query_id: str,  # noqa: ANN001
                 warehouse: str, data_files: DataFiles) -> None:
        self.stub, self.pb, self.mode, self.epoch = stub, pb, mode, epoch
        self.tables = [f"{warehouse}/{pipeline}/table_{k}" for k in range(3)]
        for table in self.tables:  # where the executors write a batch's files
            os.makedirs(f"{table}/{ATTEMPT_DIR}", exist_ok=True)
        self.app_id_json = json.dumps(delta_app_id(pipeline, 0))
        self.version = 0  # each table's next Delta version
        self.pending: tuple[str, int] | None = None  # 2rpc: the report the next Open carries
        self.data_files = data_files
        self.prepared: deque[list[tuple[str, list[str]]]] = deque()
        self.prepared_from = 0.0  # transactions opened from then on take prepared files
        self.unprepared = False  # whether the last transaction found no prepared files left
        self._open = pb.OpenTransactionRequest(pipeline_id=pipeline, epoch=epoch,
                                               query_id=query_id)
        if mode != "4rpc":
            self._open.tables.extend(self.tables)
        self._report = pb.AppliedReport(tables=[pb.AppliedTable(table=t) for t in self.tables])
        writes = [pb.TableWrite(table=table, mode=pb.APPEND, schema_json=SCHEMA_JSON,
                                add_files=[pb.AddFile(size=DATA_FILE_SIZE)
                                           for _ in range(data_files.files)])
                  for table in self.tables]
        if mode == "4rpc":
            self._prewrite = pb.PrewriteRequest(epoch=epoch, writes=writes)
            self._commit = pb.CommitTransactionRequest(epoch=epoch, tables=self.tables)
            self._writes = self._prewrite.writes
        else:
            self._commit = pb.CommitTransactionRequest(epoch=epoch, tables=self.tables,
                                                       writes=writes)
            self._writes = self._commit.writes

    def prepare(self, count: int, until: float, prepared_from: float) -> None:
        """Makes the files of up to ``count`` transactions ahead, stopping at ``until``."""
        self.prepared_from = prepared_from
        for _ in range(count):
            if time.monotonic() >= until:
                return
            self.prepared.append([self.data_files.folder() for _ in self.tables])

    def _place_files(self, txn_id: str) -> list[list[str]]:
        """Each table's files in the transaction's attempt folder; their paths in the table."""
        early = time.monotonic() < self.prepared_from
        self.unprepared = not early and not self.prepared
        if early or self.unprepared:
            folders = [self.data_files.folder() for _ in self.tables]
        else:
            folders = self.prepared.popleft()
        attempt = f"{ATTEMPT_DIR}/{txn_id}"
        paths = []
        for table, (folder, names) in zip(self.tables, folders, strict=True):
            os.rename(folder, f"{table}/{attempt}")
            paths.append([f"{attempt}/{name}" for name in names])
        return paths

    def _write_log_entries(self, txn_id: str, batch_id: int, paths: list[list[str]],
                           mtime_ms: int, stats: str) -> int:
        """Each table's Delta log entry of this transaction; returns its version."""
        version = self.version
        self.version += 1
        now_ms = int(time.time() * 1000)
        stats_json = json.dumps(stats)
        for table, table_paths in zip(self.tables, paths, strict=True):
            log = f"{table}/_delta_log"
            if version == 0:
                os.makedirs(log, exist_ok=True)
            entry = delta_log_entry(txn_id, self.app_id_json, batch_id, now_ms, table_paths,
                                    mtime_ms, stats_json, first=version == 0)
            fd = os.open(f"{log}/{version:020d}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         0o644)
            try:
                os.write(fd, entry)
            finally:
                os.close(fd)
        return version

    def one_txn(self, batch_id: int) -> tuple[float, float | None, float, float | None]:
        """One transaction; returns the latencies of Open, Prewrite, Commit and ReportApplied
        (None for a call the path does not make), without the load generator's own file and
        log writes."""
        pb, stub, mode = self.pb, self.stub, self.mode
        pc = time.perf_counter
        t0 = pc()
        request = self._open
        request.batch_id = batch_id
        if self.pending is None:
            del request.applied_reports[:]
        else:
            if not request.applied_reports:
                request.applied_reports.append(self._report)
            report = request.applied_reports[0]
            report.txn_id, version = self.pending
            for applied in report.tables:
                applied.delta_version = version
        reply = stub.OpenTransaction(request, timeout=60)
        t1 = pc()
        self.pending = None  # reported with this Open
        txn_id = reply.transaction.txn_id
        paths = self._place_files(txn_id)
        mtime_ms = int(time.time() * 1000)
        stats = file_stats(batch_id)
        for write, table_paths in zip(self._writes, paths, strict=True):
            for add, path in zip(write.add_files, table_paths, strict=True):
                add.path = path
                add.modification_time = mtime_ms
                add.stats = stats
        commit_request = self._commit
        commit_request.txn_id = txn_id
        prewrite = None
        if mode == "4rpc":
            self._prewrite.txn_id = txn_id
            t1w = pc()
            stub.Prewrite(self._prewrite, timeout=60)
            t2 = pc()
            prewrite = t2 - t1w
        else:
            t1w = t2 = pc()
        commit = stub.CommitTransaction(commit_request, timeout=60)
        t3 = pc()
        assert commit.transaction.state == pb.COMMITTED, commit.transaction
        version = self._write_log_entries(txn_id, batch_id, paths, mtime_ms, stats)
        report_s = None
        if mode == "2rpc":  # the next Open carries it
            self.pending = (txn_id, version)
        else:
            t3w = pc()
            self._report_applied(txn_id, version)
            report_s = pc() - t3w
        return t1 - t0, prewrite, t3 - t2, report_s

    def _report_applied(self, txn_id: str, version: int) -> None:
        pb = self.pb
        self.stub.ReportApplied(pb.ReportAppliedRequest(
            txn_id=txn_id, epoch=self.epoch,
            tables=[pb.AppliedTable(table=t, delta_version=version) for t in self.tables]),
            timeout=60)

    def finish(self) -> None:
        """2rpc: the last transaction's report, after the window."""
        if self.pending is not None:
            self._report_applied(*self.pending)
            self.pending = None


def worker(target: str, mode: str, proc: int, threads: int, warehouse: str, files: int,
           t_measure: float, t_end: float, rate_per_thread: float, prepared: int,
           out: mp.Queue) -> None:
    """One load-generator process: ``threads`` pipelines, each one transaction at a time,
    each with ``prepared`` transactions' files made before the window."""
    import grpc

    from percolake.v1 import coordinator_pb2 as pb
    from percolake.v1 import coordinator_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(target)
    stub = pb_grpc.CoordinatorStub(channel)
    results: list[dict] = []
    data_files = DataFiles(warehouse, files)
    own_cpu = own_cpu_in_window(t_measure, t_end)

    def run(thread: int) -> None:
        name = f"bench-{uuid.uuid4().hex[:8]}-{proc}-{thread}"
        query_id = str(uuid.uuid4())
        epoch = stub.RegisterPipeline(pb.RegisterPipelineRequest(
            pipeline_id=name, query_id=query_id), timeout=60).epoch
        pipeline = LoadPipeline(stub, pb, mode, name, epoch, query_id, warehouse, data_files)
        pipeline.prepare(prepared, until=t_measure - PREPARED_LEAD_S,
                         prepared_from=t_measure - PREPARED_LEAD_S)
        lat: dict[str, list[float]] = {name: [] for name in (*RPCS, "txn")}
        committed = errors = unprepared = 0
        batch_id = 0
        interval = 1.0 / rate_per_thread if rate_per_thread else 0.0
        scheduled = time.monotonic() + (interval * thread / max(1, threads) if interval else 0)
        while True:
            if interval:
                now = time.monotonic()
                if scheduled > now:
                    time.sleep(scheduled - now)
                start = scheduled
                scheduled += interval
            else:
                start = time.monotonic()
            if start >= t_end:
                break
            try:
                open_s, prewrite_s, commit_s, report_s = pipeline.one_txn(batch_id)
            except grpc.RpcError as exc:
                errors += 1
                if errors <= 3:
                    print(f"worker {proc}/{thread}: {exc.code().name}: {exc.details()}",
                          file=sys.stderr)
                batch_id += 1
                continue
            end = time.monotonic()
            batch_id += 1
            if t_measure <= end <= t_end:  # completed in the window (open loop: may start late)
                committed += 1
                unprepared += pipeline.unprepared
                lat["open"].append(open_s)
                lat["commit"].append(commit_s)
                if prewrite_s is not None:
                    lat["prewrite"].append(prewrite_s)
                if report_s is not None:
                    lat["report"].append(report_s)
                lat["path"].append(open_s + (prewrite_s or 0.0) + commit_s)
                lat["txn"].append(end - start)
        pipeline.finish()
        results.append({"lat": lat, "committed": committed, "errors": errors,
                        "unprepared": unprepared})

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    channel.close()
    merged: dict = {"lat": {name: [] for name in (*RPCS, "txn")}, "committed": 0, "errors": 0,
                    "unprepared": 0, "cpu_s": own_cpu()}
    data_files.remove_prepared()
    for r in results:
        for name, values in r["lat"].items():
            merged["lat"][name].extend(values)
        merged["committed"] += r["committed"]
        merged["errors"] += r["errors"]
        merged["unprepared"] += r["unprepared"]
    out.put(merged)
