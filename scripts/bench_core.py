"""The daemon's servicer and core alone: CPU per transaction without the transport.

Runs ``bench_coordinator.py``'s 2rpc transaction (Open carrying the 3 tables and the previous
report, Commit carrying the 3 writes of 4 files each), built by its load generator
(``_coordinator_load.LoadPipeline``: the same requests, files and Delta log entries), against
the real servicer and core on SQLite with group commit, as the daemon runs them, but called in
this process: no gRPC. ``time.process_time`` around the two calls gives the CPU per
transaction, a figure a loaded machine moves far less than a wall-clock rate; the load
generator's own work (data files, log entries) is outside the timed calls. ``--profile PATH``
writes a cProfile of the timed calls.

``--threads N`` runs N pipelines on N threads at once (no profile): the process's CPU per
committed transaction over the run, with the load generator's own work subtracted (timed per
thread), and the process's context switches per transaction: what the coordinator's lock and
the GIL cost when requests overlap, without gRPC's own threads.

    python scripts/bench_core.py --txns 300 --repeat 3
    python scripts/bench_core.py --txns 300 --threads 8
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH's

from _coordinator_load import DataFiles, LoadPipeline  # noqa: E402

from coordinator.core.state import CoordinatorConfig  # noqa: E402
from coordinator.leadership import FixedCore  # noqa: E402
from coordinator.server import _core_builder  # noqa: E402
from coordinator.servicer import CoordinatorServicer  # noqa: E402
from coordinator.store import SqliteStore, sqlite  # noqa: E402
from percolake.v1 import coordinator_pb2 as pb  # noqa: E402
from tests.servicer_context import InProcessContext  # noqa: E402


class InProcessStub:
    """A stub whose calls run the servicer's methods in this thread, each timed (thread CPU
    and wall time; ``clock``: process CPU when one thread drives) and, with a profile,
    profiled."""

    def __init__(self, servicer: CoordinatorServicer, profile: cProfile.Profile | None = None,
                 clock=time.thread_time) -> None:  # noqa: ANN001
        self._servicer = servicer
        self._profile = profile
        self._clock = clock
        self._context = InProcessContext()
        self.cpu_s = 0.0  # of the calls, on this stub's thread
        self.wall_s = 0.0

    def __getattr__(self, name: str):  # noqa: ANN204
        method = getattr(self._servicer, name)

        def call(request, timeout: float | None = None):  # noqa: ANN001, ANN202
            t0, c0 = time.perf_counter(), self._clock()
            if self._profile:
                self._profile.enable()
            try:
                return method(request, self._context)
            finally:
                if self._profile:
                    self._profile.disable()
                self.cpu_s += self._clock() - c0
                self.wall_s += time.perf_counter() - t0

        return call


def _pipeline(servicer: CoordinatorServicer, warehouse: str, data_files: DataFiles,
              clock=time.thread_time) -> tuple[LoadPipeline, InProcessStub]:  # noqa: ANN001
    stub = InProcessStub(servicer, clock=clock)
    name = f"core-{uuid.uuid4().hex[:8]}"
    query_id = str(uuid.uuid4())
    epoch = stub.RegisterPipeline(pb.RegisterPipelineRequest(
        pipeline_id=name, query_id=query_id)).epoch
    return LoadPipeline(stub, pb, "2rpc", name, epoch, query_id, warehouse, data_files), stub


class _CountedSyncs:
    """The store's WAL syncs, counted (``sqlite._sync_data`` wrapped)."""

    def __init__(self) -> None:
        self.count = 0
        self._sync = sqlite._sync_data
        sqlite._sync_data = self._counted

    def _counted(self, fd: int) -> None:
        self.count += 1
        self._sync(fd)


SYNCS = _CountedSyncs()


def _serving(work: Path) -> tuple[CoordinatorServicer, object, SqliteStore, str]:
    warehouse = work / "warehouse"
    warehouse.mkdir(parents=True)
    config = CoordinatorConfig(warehouse_roots=[str(warehouse)], roll_forward_after_s=1e9)
    store = SqliteStore(work / "data", group_commit=True)
    core = _core_builder(config)(store)
    return CoordinatorServicer(FixedCore(core)), core, store, str(warehouse)


def run(work: Path, txns: int, files: int, profile: cProfile.Profile | None) -> dict:
    """``txns`` transactions of one pipeline; CPU and wall ms of the two calls each."""
    servicer, core, store, warehouse = _serving(work)
    # process CPU, as before: the background threads' work (WAL checkpoints) is counted too
    pipeline, stub = _pipeline(servicer, warehouse, DataFiles(warehouse, files),
                               clock=time.process_time)
    warm = txns // 10  # the first tenth warms up (first layout loads), profiled too
    pipeline.prepare(txns, until=time.monotonic() + 600, prepared_from=0.0)
    cpu: list[float] = []
    wall: list[float] = []
    for batch_id in range(txns):
        stub._profile = profile if batch_id >= warm else None
        cpu0, wall0 = stub.cpu_s, stub.wall_s
        pipeline.one_txn(batch_id)
        if batch_id >= warm:
            cpu.append(stub.cpu_s - cpu0)
            wall.append(stub.wall_s - wall0)
    pipeline.finish()
    core.close()
    store.close()
    return {"cpu_ms": 1000 * statistics.median(cpu), "cpu_mean_ms": 1000 * statistics.mean(cpu),
            "wall_ms": 1000 * statistics.median(wall),
            "wall_p99_ms": 1000 * sorted(wall)[int(0.99 * (len(wall) - 1))],
            "group_commits": store.group_commits}


def _context_switches() -> int:
    """Voluntary and involuntary context switches of this process so far (every thread,
    those that ended too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def run_threads(work: Path, txns: int, files: int, threads: int) -> dict:
    """``threads`` pipelines at once, ``txns`` transactions each after a warm-up tenth: the
    process's CPU per transaction in the calls (the load's own work left out) and its context
    switches per transaction."""
    servicer, core, store, warehouse = _serving(work)
    syncs0 = SYNCS.count
    data_files = DataFiles(warehouse, files)
    warm = max(1, txns // 10)
    pipelines = [_pipeline(servicer, warehouse, data_files) for _ in range(threads)]
    for pipeline, _ in pipelines:
        pipeline.prepare(txns + warm, until=time.monotonic() + 600, prepared_from=0.0)
    start = threading.Barrier(threads + 1)
    measured = threading.Barrier(threads + 1)
    load_cpu = [0.0] * threads

    def drive(index: int) -> None:
        pipeline, stub = pipelines[index]
        for batch_id in range(warm):
            pipeline.one_txn(batch_id)
        start.wait()
        c0, calls0 = time.thread_time(), stub.cpu_s
        for batch_id in range(warm, warm + txns):
            pipeline.one_txn(batch_id)
        load_cpu[index] = (time.thread_time() - c0) - (stub.cpu_s - calls0)
        measured.wait()

    workers = [threading.Thread(target=drive, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    t0, c0, s0 = time.perf_counter(), time.process_time(), _context_switches()
    measured.wait()
    t1, c1, s1 = time.perf_counter(), time.process_time(), _context_switches()
    for w in workers:
        w.join()
    for pipeline, _ in pipelines:
        pipeline.finish()
    core.close()
    store.close()
    count = threads * txns
    return {"cpu_ms": 1000 * (c1 - c0 - sum(load_cpu)) / count,
            "txn_per_s": count / (t1 - t0), "switches_per_txn": (s1 - s0) / count,
            "group_commits": store.group_commits,
            "syncs_per_txn": (SYNCS.count - syncs0) / (threads * (txns + warm))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txns", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--files", type=int, default=4, help="data files per table")
    parser.add_argument("--threads", type=int, default=0,
                        help="pipelines on as many threads at once (0: one, on this thread)")
    parser.add_argument("--profile", metavar="PATH", help="write a cProfile of the calls here")
    args = parser.parse_args()
    # CPU time, not wall time: waits (fsync, a loaded machine) are left out of the profile
    profile = cProfile.Profile(time.process_time) if args.profile and not args.threads else None
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-core-") as tmp:
            if args.threads:
                result = run_threads(Path(tmp), args.txns, args.files, args.threads)
                print(f"run {i + 1}: {args.threads} threads: CPU per txn {result['cpu_ms']:.3f} "
                      f"ms, {result['txn_per_s']:.0f} txn/s, "
                      f"{result['switches_per_txn']:.1f} context switches per txn, "
                      f"{result['group_commits']} group commits, "
                      f"{result['syncs_per_txn']:.2f} WAL syncs per txn", flush=True)
                continue
            result = run(Path(tmp), args.txns, args.files, profile)
        print(f"run {i + 1}: CPU per txn median {result['cpu_ms']:.3f} ms "
              f"(mean {result['cpu_mean_ms']:.3f}), wall median {result['wall_ms']:.3f} ms, "
              f"p99 {result['wall_p99_ms']:.3f} ms", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if profile:
        profile.dump_stats(args.profile)
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
