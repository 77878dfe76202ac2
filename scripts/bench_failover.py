"""Failover figures: restart-to-SERVING and takeover time, empty store against 10^6 stored
transactions.

History is bulk-loaded (not sent as RPCs): N transactions (``--transactions``, default 10^6)
of 3 tables x 4 files each over ``--pipelines`` pipelines, mostly APPLIED, 1 % ABORTED, and the
newest batch of three pipelines in four still unfinished (OPEN, PREWRITTEN or COMMITTED, in
turn), as a busy deployment has at any moment; with their snapshot-index rows. Into PostgreSQL
with COPY, into the tables the store created (its schema, then ANALYZE); into SQLite with
executemany (``--no-sqlite`` skips it). Then, for an empty store and for the loaded one, in the
same run:

- **restart to SERVING**: ``DaemonProcess.start()`` of one daemon (a new process: interpreter,
  imports, store, lease, state) until its health is SERVING, the previous daemon having stopped
  with SIGTERM (which releases the lease); and the state load the daemon logs;
- **takeover** (PostgreSQL): two daemons on the store; the leader is SIGKILLed and the time until
  the standby's health turns SERVING is taken from a grpc.health.v1 Watch opened before the kill;
  from the standby's log, when it acquired the lease and how long it loaded. Each kill comes at a
  random moment of the leader's renewal cycle (after a pause drawn from 0 to lease/2), as a real
  failure does. The killed daemon is restarted as the next standby before the next try. No load
  runs meanwhile.

    python scripts/bench_failover.py --transactions 100000 --tries 3 --takeovers 5
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _benchlib as bl  # noqa: E402

from coordinator.launcher import DaemonProcess  # noqa: E402
from coordinator.oracle import LOGICAL_BITS  # noqa: E402
from coordinator.store import SqliteStore  # noqa: E402

DAEMON_ARGS = ["--roll-forward-after", "1000000", "--txn-timeout", "600",
               "--retention-hours", "0"]
TXN_COLUMNS = ("txn_id", "pipeline_id", "generation", "batch_id", "attempt", "epoch", "query_id",
               "state", "start_ts", "commit_ts", "tables", "abort_reason", "created_ms",
               "updated_ms", "row_version")
PIPELINE_COLUMNS = ("pipeline_id", "generation", "epoch", "query_id", "created_ms",
                    "last_commit_ms", "resets", "row_version")
COMMIT_COLUMNS = ("table_uri", "commit_ts", "txn_id", "delta_version")
UNFINISHED = ("OPEN", "PREWRITTEN", "COMMITTED")
CHUNK = 20_000


# ---------------------------------------------------------------------------- history


class History:
    """The rows of ``count`` transactions over ``pipelines`` pipelines, spread over the week
    that ended a day and a half ago (older than the 24 h sweep of aborted attempts)."""

    def __init__(self, count: int, pipelines: int, warehouse: Path) -> None:
        self.count = count
        self.pipelines = min(pipelines, count)
        self.warehouse = warehouse
        self.end_ms = int(time.time() * 1000) - 36 * 3600 * 1000
        self.start_ms = self.end_ms - 7 * 86400 * 1000
        self.max_ts = 0
        self.states: dict[str, int] = {}

    def pipeline_rows(self) -> list[tuple]:
        return [(f"hist-{p}", 0, 1, str(uuid.uuid4()), self.start_ms, self.end_ms, "[]", 0)
                for p in range(self.pipelines)]

    def state_of(self, index: int, pipeline: int) -> str:
        newest = index >= self.count - self.pipelines
        if newest and pipeline % 4 != 0:
            return UNFINISHED[pipeline % 3]
        return "ABORTED" if index % 100 == 99 else "APPLIED"

    def chunks(self) -> Iterator[tuple[list[tuple], list[tuple]]]:
        """(transaction rows, snapshot-index rows), CHUNK transactions at a time."""
        step = (self.end_ms - self.start_ms) / self.count
        self.states = {}
        txns: list[tuple] = []
        commits: list[tuple] = []
        for i in range(self.count):
            pipeline, batch = i % self.pipelines, i // self.pipelines
            created = int(self.start_ms + i * step)
            start_ts = (created << LOGICAL_BITS) + (i & 0xFFF)
            state = self.state_of(i, pipeline)
            self.states[state] = self.states.get(state, 0) + 1
            committed = state in ("COMMITTED", "APPLIED")
            commit_ts = start_ts + 7 if committed else 0
            version = batch if state == "APPLIED" else None
            txn_id = uuid.uuid4().hex
            entries = []
            for k in range(3):
                table = f"file://{self.warehouse}/hist-{pipeline}/t{k}"
                entries.append(bl.history_table_entry(table, txn_id, created, state != "OPEN",
                                                      version))
                if committed:
                    commits.append((table, commit_ts, txn_id, version))
            txns.append((txn_id, f"hist-{pipeline}", 0, batch, 2 if state == "ABORTED" else 1,
                         1, "", state, start_ts, commit_ts, "[" + ",".join(entries) + "]",
                         "aborted" if state == "ABORTED" else "", created, created + 50, 3))
            self.max_ts = max(self.max_ts, commit_ts, start_ts)
            if len(txns) >= CHUNK:
                yield txns, commits
                txns, commits = [], []
        if txns:
            yield txns, commits


def load_sqlite(data_dir: Path, history: History) -> float:
    """Writes the history into a SQLite store in ``data_dir``; returns the seconds taken."""
    started = time.monotonic()
    SqliteStore(data_dir).close()  # creates the schema
    conn = sqlite3.connect(data_dir / "coordinator.db", isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    conn.executemany(f"INSERT INTO pipelines ({', '.join(PIPELINE_COLUMNS)}) VALUES "
                     f"({', '.join('?' * len(PIPELINE_COLUMNS))})", history.pipeline_rows())
    for txns, commits in history.chunks():
        conn.executemany(f"INSERT INTO transactions ({', '.join(TXN_COLUMNS)}) VALUES "
                         f"({', '.join('?' * len(TXN_COLUMNS))})", txns)
        conn.executemany(f"INSERT INTO table_commits ({', '.join(COMMIT_COLUMNS)}) VALUES "
                         "(?, ?, ?, ?)", commits)
    conn.execute("INSERT INTO meta VALUES ('ts_high_water', ?) ON CONFLICT(key) DO UPDATE "
                 "SET value = max(value, excluded.value)", (history.max_ts + 1,))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.monotonic() - started


def _copy_text(rows: list[tuple]) -> bytes:
    """Rows in COPY's text format (tab-separated, \\N for NULL, backslashes doubled)."""
    out = io.StringIO()
    for row in rows:
        out.write("\t".join(
            "\\N" if value is None else str(value).replace("\\", "\\\\")
            .replace("\t", "\\t").replace("\n", "\\n") for value in row))
        out.write("\n")
    return out.getvalue().encode()


def load_postgres(dsn: str, history: History) -> float:
    """Writes the history into the PostgreSQL store at ``dsn`` with COPY, after the store
    created its schema; then ANALYZE, as autovacuum would. Returns the seconds taken."""
    import psycopg

    from coordinator.store.postgres import PostgresStore

    started = time.monotonic()
    store = PostgresStore(dsn)  # creates (or migrates) the schema
    epoch = store.try_acquire_lease("bench-failover-load", "", 30.0)
    if epoch is None:
        raise RuntimeError("the store's lease is held: load the history before any daemon runs")
    store.write_timestamp_high_water(history.max_ts + 1)
    store.release_lease(epoch)
    store.close()
    with psycopg.connect(dsn) as conn:
        with conn.cursor() as cur:
            with cur.copy(f"COPY pipelines ({', '.join(PIPELINE_COLUMNS)}) FROM STDIN") as copy:
                copy.write(_copy_text(history.pipeline_rows()))
            for txns, commits in history.chunks():
                with cur.copy(f"COPY transactions ({', '.join(TXN_COLUMNS)}) FROM STDIN") as copy:
                    copy.write(_copy_text(txns))
                with cur.copy(f"COPY table_commits ({', '.join(COMMIT_COLUMNS)}) FROM STDIN") \
                        as copy:
                    copy.write(_copy_text(commits))
        conn.commit()
        conn.autocommit = True
        conn.execute("ANALYZE")
    return time.monotonic() - started


def postgres_bytes(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])


def sqlite_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in data_dir.glob("coordinator.db*"))


# ---------------------------------------------------------------------------- measuring


def log_events(daemon: DaemonProcess, offset: int) -> list[dict]:
    """The daemon's JSON log entries written after byte ``offset``."""
    if not daemon.log_path.exists():
        return []
    with daemon.log_path.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def _log_size(daemon: DaemonProcess) -> int:
    return daemon.log_path.stat().st_size if daemon.log_path.exists() else 0


def _wall(entry: dict) -> float:
    return datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=timezone.utc).timestamp()


def load_seconds(events: list[dict]) -> float:
    """The state load the daemon logged when it began to serve (NaN if it did not say)."""
    for entry in events:
        if entry.get("msg") == "leader: serving" and "load_s" in entry:
            return float(entry["load_s"])
    return float("nan")


def restart_to_serving(data_dir: Path, warehouse: Path, store_args: list[str],
                       tries: int) -> dict:
    """``tries`` fresh daemons one after another, each until SERVING, then SIGTERM."""
    serving: list[float] = []
    loads: list[float] = []
    daemon = DaemonProcess(data_dir, [str(warehouse)], extra_args=[*DAEMON_ARGS, *store_args])
    for _ in range(tries):
        offset = _log_size(daemon)
        started = time.monotonic()
        daemon.start(timeout_s=120)
        serving.append(time.monotonic() - started)
        loads.append(load_seconds(log_events(daemon, offset)))
        daemon.stop()
    return {"to_serving_s": serving, "load_s": loads}


class ServingWatch:
    """A grpc.health.v1 Watch of one daemon, from before a kill: when it turned SERVING."""

    def __init__(self, target: str, timeout_s: float) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self._channel = grpc.insecure_channel(target)
        self._stream = health_pb2_grpc.HealthStub(self._channel).Watch(
            health_pb2.HealthCheckRequest(), timeout=timeout_s)
        self._serving = health_pb2.HealthCheckResponse.SERVING
        self.opened = threading.Event()
        self.serving_at: float | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for reply in self._stream:
                self.opened.set()
                if reply.status == self._serving:
                    self.serving_at = time.monotonic()
                    break
        except Exception as exc:  # reported by wait()
            self.error = exc
        finally:
            self.opened.set()

    def wait(self, timeout_s: float) -> float:
        self._thread.join(timeout_s)
        self._stream.cancel()
        self._channel.close()
        if self.serving_at is None:
            raise RuntimeError(f"the standby did not turn SERVING: {self.error!r}")
        return self.serving_at


def takeover(work: Path, warehouse: Path, store_args: list[str], tries: int,
             lease_s: float) -> dict:
    """Two daemons on one PostgreSQL store; ``tries`` SIGKILLs of whichever leads."""
    args = [*DAEMON_ARGS, *store_args, "--lease-s", f"{lease_s:g}"]
    daemons = [DaemonProcess(work / f"ha-{name}", [str(warehouse)], extra_args=args)
               for name in ("a", "b")]
    total: list[float] = []
    lease_wait: list[float] = []
    loads: list[float] = []
    try:
        daemons[0].start(timeout_s=120)
        daemons[1].start(serving=False)
        for _ in range(tries):
            leader, standby = daemons if daemons[0].health() == "SERVING" else daemons[::-1]
            if standby.health() != "NOT_SERVING":
                raise RuntimeError(f"expected a standby at {standby.target}")
            watch = ServingWatch(standby.target, timeout_s=120)
            watch.opened.wait(10)
            offset = _log_size(standby)
            time.sleep(random.uniform(0, lease_s / 2))
            killed_wall, killed_at = time.time(), time.monotonic()
            leader.kill()
            serving_at = watch.wait(120)
            total.append(serving_at - killed_at)
            events = log_events(standby, offset)
            acquired = [e for e in events if e.get("msg", "").startswith("acquired the lease")]
            lease_wait.append(_wall(acquired[0]) - killed_wall if acquired else float("nan"))
            loads.append(load_seconds(events))
            leader.start(serving=False)  # the next standby
    finally:
        for daemon in daemons:
            daemon.stop()
    return {"takeover_s": total, "lease_wait_s": lease_wait, "load_s": loads}


# ---------------------------------------------------------------------------- report


def _stats(values: list[float]) -> dict[str, float]:
    clean = [v for v in values if v == v]
    if not clean:
        nan = float("nan")
        return {"median": nan, "max": nan, "min": nan}
    return {"median": statistics.median(clean), "max": max(clean), "min": min(clean)}


def _cell(values: list[float]) -> str:
    """``median (min–max)``, or – when nothing was measured."""
    stats = _stats(values)
    if stats["median"] != stats["median"]:
        return "–"
    return f"{stats['median']:.3f} ({stats['min']:.3f}–{stats['max']:.3f})"


def render(result: dict) -> str:
    n = result["transactions"]
    states = ", ".join(f"{count:,} {state}" for state, count in
                       sorted(result["states"].items(), key=lambda kv: -kv[1]))
    parts = [f"History: {n:,} transactions bulk-loaded ({states}) over "
             f"{result['pipelines']:,} pipelines, 3 tables x 4 files each. Lease "
             f"{result['lease_s']:g} s. Seconds; median (min–max) of {result['tries']} restarts "
             f"and {result['takeovers']} takeovers per case.\n"]
    rows = []
    for label, key in (("restart to SERVING (new process)", "to_serving_s"),
                       ("  of which the state load (daemon's log)", "load_s")):
        for store, measured in result["restart"].items():
            if key == "load_s" and store == "sqlite":
                continue  # only the leadership logs its load time
            rows.append([label, store, _cell(measured["empty"][key]),
                         _cell(measured["loaded"][key])])
    for label, key in (("takeover: SIGKILL to standby SERVING", "takeover_s"),
                       ("  of which waiting for the lease", "lease_wait_s"),
                       ("  of which the state load (daemon's log)", "load_s")):
        rows.append([label, "postgresql", _cell(result["takeover"]["empty"][key]),
                     _cell(result["takeover"]["loaded"][key])])
    parts.append(bl.table(["figure", "store", "empty store", f"{n:,} transactions"], rows))
    load = result["bulk_load"]
    sqlite = (f", SQLite {load['sqlite_s']:.0f} s ({load['sqlite_bytes'] / 2**30:.2f} GiB)"
              if "sqlite_s" in load else "")
    tries = ", ".join(f"{t:.2f}" for t in result["takeover"]["loaded"]["takeover_s"])
    parts.append(f"\nBulk load: PostgreSQL {load['postgresql_s']:.0f} s "
                 f"({load['postgresql_bytes'] / 2**30:.2f} GiB database){sqlite}. Each "
                 f"takeover with the loaded store: {tries} s. Whole run: "
                 f"{result['run_s']:.0f} s.\n")
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=1_000_000,
                        help="stored transactions to bulk-load")
    parser.add_argument("--pipelines", type=int, default=1000)
    parser.add_argument("--tries", type=int, default=5, help="restarts per case")
    parser.add_argument("--takeovers", type=int, default=20, help="takeovers per case")
    parser.add_argument("--lease-s", type=float, default=2.0, help="the daemons' --lease-s")
    parser.add_argument("--no-sqlite", action="store_true",
                        help="skip SQLite (its restart-to-SERVING comparison)")
    parser.add_argument("--json", metavar="PATH", help="write machine-readable results here")
    parser.add_argument("--no-append", action="store_true", help="do not touch benchmarks.md")
    parser.add_argument("--workdir", help="where stores and logs go (default: a temp dir)")
    args = parser.parse_args()
    from tests.pg_support import PostgresServer

    info = bl.machine_info()
    print(f"bench_failover: {bl.machine_line(info)}", flush=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="percolake-failover-"))
    warehouse = work / "warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    run_started = time.monotonic()
    result: dict = {"machine": info, "transactions": args.transactions, "tries": args.tries,
                    "takeovers": args.takeovers,
                    "lease_s": args.lease_s, "restart": {}, "takeover": {}, "bulk_load": {}}
    postgres = PostgresServer(work / "postgres").start()
    try:
        history = History(args.transactions, args.pipelines, warehouse)
        result["pipelines"] = history.pipelines
        cases = {}
        for case in ("empty", "loaded"):
            dsn = postgres.create_database(f"failover_{case}")
            if case == "loaded":
                print(f"bulk-loading {args.transactions:,} transactions into PostgreSQL ...",
                      flush=True)
                result["bulk_load"]["postgresql_s"] = load_postgres(dsn, history)
                result["bulk_load"]["postgresql_bytes"] = postgres_bytes(dsn)
                result["states"] = dict(history.states)
                print(f"  {result['bulk_load']['postgresql_s']:.0f} s", flush=True)
            cases[case] = ["--store", dsn]
        if not args.no_sqlite:
            result["restart"]["sqlite"] = {}
            for case in ("empty", "loaded"):
                data_dir = work / f"sqlite-{case}"
                data_dir.mkdir()
                if case == "loaded":
                    print(f"bulk-loading {args.transactions:,} transactions into SQLite ...",
                          flush=True)
                    result["bulk_load"]["sqlite_s"] = load_sqlite(data_dir, history)
                    result["bulk_load"]["sqlite_bytes"] = sqlite_bytes(data_dir)
                print(f"SQLite {case}: restart to SERVING x {args.tries}", flush=True)
                result["restart"]["sqlite"][case] = restart_to_serving(
                    data_dir, warehouse, [], args.tries)
        result["restart"]["postgresql"] = {}
        for case, store_args in cases.items():
            print(f"PostgreSQL {case}: restart to SERVING x {args.tries}", flush=True)
            result["restart"]["postgresql"][case] = restart_to_serving(
                work / f"pg-{case}", warehouse, store_args, args.tries)
            print(f"PostgreSQL {case}: takeover x {args.takeovers}", flush=True)
            result["takeover"][case] = takeover(work / f"pg-{case}-ha", warehouse, store_args,
                                                args.takeovers, args.lease_s)
            print(f"  takeovers: {[round(t, 3) for t in result['takeover'][case]['takeover_s']]}"
                  " s", flush=True)
    finally:
        postgres.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    result["run_s"] = time.monotonic() - run_started
    bl.publish("bench_failover", info, render(result), result, args.json, not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
