"""The daemon's servicer and core alone: CPU per transaction without the transport.

Runs ``bench_coordinator.py``'s 2rpc transaction (Open carrying the 3 tables and the previous
report, Commit carrying the 3 writes of 4 files each) against the real servicer and core on
SQLite with group commit, as the daemon runs them, but called in this process on one thread:
no gRPC, no scheduling of other threads. ``time.process_time`` around the two calls gives the
CPU per transaction, a figure a loaded machine moves far less than a wall-clock rate; the load
generator's own work (data files, log entries) is outside the timed calls. ``--profile PATH``
writes a cProfile of the timed calls.

    python scripts/bench_core.py --txns 300 --repeat 3
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_coordinator as bc  # noqa: E402

from coordinator.core.state import CoordinatorConfig  # noqa: E402
from coordinator.leadership import FixedCore  # noqa: E402
from coordinator.server import _core_builder  # noqa: E402
from coordinator.servicer import CoordinatorServicer  # noqa: E402
from coordinator.store import SqliteStore  # noqa: E402
from percolake.records import delta_app_id  # noqa: E402
from percolake.v1 import coordinator_pb2 as pb  # noqa: E402


class _Context:
    """The part of grpc.ServicerContext the servicer touches on a successful call."""

    def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")

    def set_trailing_metadata(self, metadata: object) -> None:
        return

    def invocation_metadata(self) -> tuple:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def _timed(profile: cProfile.Profile | None, call, request, context) -> tuple:  # noqa: ANN001
    """``call(request, context)``, profiled if asked: its reply, wall and CPU seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    if profile:
        profile.enable()
    reply = call(request, context)
    if profile:
        profile.disable()
    return reply, time.perf_counter() - t0, time.process_time() - c0


def run(work: Path, txns: int, files: int, profile: cProfile.Profile | None) -> dict:
    """``txns`` transactions of one pipeline; CPU and wall ms of the two calls each."""
    warehouse = work / "warehouse"
    warehouse.mkdir(parents=True)
    config = CoordinatorConfig(warehouse_roots=[str(warehouse)], roll_forward_after_s=1e9)
    store = SqliteStore(work / "data", group_commit=True)
    core = _core_builder(config)(store)
    servicer = CoordinatorServicer(FixedCore(core))
    context = _Context()
    data_files = bc.DataFiles(str(warehouse))
    pipeline = f"core-{uuid.uuid4().hex[:8]}"
    query_id = str(uuid.uuid4())
    epoch = servicer.RegisterPipeline(pb.RegisterPipelineRequest(
        pipeline_id=pipeline, query_id=query_id), context).epoch
    tables = [f"{warehouse}/{pipeline}/table_{k}" for k in range(3)]
    app_id = delta_app_id(pipeline, 0)
    pending = None
    cpu: list[float] = []
    wall: list[float] = []
    for batch_id in range(txns):
        open_req = pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=batch_id,
                                             epoch=epoch, query_id=query_id, tables=tables)
        if pending is not None:
            open_req.applied_reports.append(pending)
        opened, open_wall, open_cpu = _timed(profile, servicer.OpenTransaction, open_req, context)
        txn_id = opened.transaction.txn_id
        writes = bc._writes(pb, tables, txn_id, files, batch_id, data_files)
        commit_req = pb.CommitTransactionRequest(txn_id=txn_id, epoch=epoch, tables=tables,
                                                 writes=writes)
        committed, commit_wall, commit_cpu = _timed(profile, servicer.CommitTransaction,
                                                    commit_req, context)
        state = committed.transaction.state
        assert state == pb.COMMITTED, state
        bc._delta_commit(writes, txn_id, app_id, batch_id, batch_id)
        pending = pb.AppliedReport(txn_id=txn_id, tables=[
            pb.AppliedTable(table=t, delta_version=batch_id) for t in tables])
        if batch_id >= txns // 10:  # the first tenth warms up (first layout loads)
            cpu.append(open_cpu + commit_cpu)
            wall.append(open_wall + commit_wall)
    core.close()
    store.close()
    return {"cpu_ms": 1000 * statistics.median(cpu), "cpu_mean_ms": 1000 * statistics.mean(cpu),
            "wall_ms": 1000 * statistics.median(wall),
            "wall_p99_ms": 1000 * sorted(wall)[int(0.99 * (len(wall) - 1))],
            "group_commits": store.group_commits}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txns", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--files", type=int, default=4, help="data files per table")
    parser.add_argument("--profile", metavar="PATH", help="write a cProfile of the calls here")
    args = parser.parse_args()
    # CPU time, not wall time: waits (fsync, a loaded machine) are left out of the profile
    profile = cProfile.Profile(time.process_time) if args.profile else None
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-core-") as tmp:
            result = run(Path(tmp), args.txns, args.files, profile)
        print(f"run {i + 1}: CPU per txn median {result['cpu_ms']:.3f} ms "
              f"(mean {result['cpu_mean_ms']:.3f}), wall median {result['wall_ms']:.3f} ms, "
              f"p99 {result['wall_p99_ms']:.3f} ms")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if profile:
        profile.dump_stats(args.profile)
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
