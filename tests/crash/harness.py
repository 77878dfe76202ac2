"""Processes of one crash scenario: the coordinator daemon, Spark drivers, a snapshot reader.

Everything runs as real child processes; a failpoint (env PERCOLAKE_FAILPOINTS) or SIGKILL ends
them hard, and they are restarted on the same data dir, port and checkpoint.

By default the tables are local (``<root>/lake``) and each driver is a local Spark. A scenario
can instead put its tables below an object-store prefix (``warehouse="s3://bucket/prefix"``, the
coordinator's warehouse root; ``env`` then carries the AWS variables every child gets) and run
its drivers on a standalone cluster (``master="spark://127.0.0.1:PORT"``, ``spark_conf`` the
application's settings); ``spark_check=True`` makes ``check`` also read every Delta version
with delta-spark (a child Spark application, ``tests/crash/spark_reads.py``) and compare it
with what deltalake reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.launcher import DaemonProcess
from tests.crash import workload
from tests.crash.checker import Checker, Report, TableSpec, bank_tables, load_observations
from tests.crash.rpc import Client
from tests.daemon_support import wait_for

ROOT = Path(__file__).resolve().parents[2]
FAILPOINT_EXIT = 137
FAILPOINT_KILLED = -9  # a failpoint's ``kill``: the driver SIGKILLed itself
QUERY_FAILED = 3


def child_env(failpoints: str = "", extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {}), "PERCOLAKE_FAILPOINTS": failpoints}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


@dataclass
class DriverRun:
    """One driver process and what it left behind."""

    process: subprocess.Popen[bytes]
    log_path: Path
    events_path: Path
    failpoints: str
    started_pid_events: int = 0

    def wait(self, timeout_s: float = 240.0) -> int:
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise TimeoutError(
                f"driver did not finish in {timeout_s:.0f} s:\n{self.log_tail()}") from None

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        mine = [e for e in read_events(self.events_path) if e.get("pid") == self.process.pid]
        return mine

    def user_fn_batches(self) -> list[int]:
        return [e["batch"] for e in self.events() if e["event"] == "user_fn"]

    def kill(self) -> None:
        """SIGKILL to the driver and its JVM (its own process group)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def pause(self) -> None:
        """SIGSTOP to the driver and its JVM: a stalled driver (a long GC, a network partition)."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


@dataclass
class Scenario:
    """A lake, a coordinator, the bank pipeline's input and checkpoint, drivers and a reader."""

    root: Path
    pipeline: str = "bank"
    k: int = 3
    coordinator_args: list[str] = field(default_factory=lambda: [
        "--roll-forward-after", "3", "--txn-timeout", "60", "--log-format", "text"])
    participant_options: dict[str, Any] = field(default_factory=dict)
    warehouse: str | None = None       # an object-store prefix for the tables (default: local)
    master: str | None = None          # the drivers' Spark master (default: local)
    spark_conf: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # for every child (the AWS variables)
    spark_check: bool = False          # check() also reads every version with delta-spark
    spark_reader: Any = None           # a running spark_reads.SparkReadService to use for it
    driver_args: list[str] = field(default_factory=list)  # more arguments of every driver

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.input = self.root / "input"
        self.events_path = self.root / "events.jsonl"
        self.lake: Path | str
        if self.warehouse:
            self.lake = self.warehouse.rstrip("/")
            self.checkpoint = self.root / "checkpoints" / self.pipeline
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            self.lake = self.root / "lake"
            self.checkpoint = self.lake / "_checkpoints" / self.pipeline
            self.lake.mkdir(parents=True, exist_ok=True)
        self.input.mkdir(parents=True, exist_ok=True)
        self.daemon = DaemonProcess(self.root / "coordinator-data", [str(self.lake)],
                                    env=self.env, extra_args=self.coordinator_args,
                                    log_path=self.root / "coordinator.log")
        self.inputs = 0
        self.drivers: list[DriverRun] = []
        self.reader: subprocess.Popen[bytes] | None = None
        self.reader_out = self.root / "observations.jsonl"
        self.reader_stop = self.root / "reader.stop"
        self.coordinator_restarts = 0
        self._watch: threading.Thread | None = None
        self._watch_stop = threading.Event()
        self._restart_lock = threading.RLock()
        self.max_ts_before_restart: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ processes

    @property
    def target(self) -> str:
        return self.daemon.target

    def child_env(self, failpoints: str = "") -> dict[str, str]:
        return child_env(failpoints, self.env)

    def client(self, retry_s: float = 60.0) -> Client:
        return Client(self.target, retry_s=retry_s)

    def start_coordinator(self, failpoints: str = "") -> None:
        self.daemon.start(env={"PERCOLAKE_FAILPOINTS": failpoints})

    def restart_coordinator(self, failpoints: str = "") -> None:
        """SIGKILL (if still alive) and start again on the same data dir and port."""
        with self._restart_lock:
            self.daemon.kill()
            self.daemon.start(env={"PERCOLAKE_FAILPOINTS": failpoints})
            self.coordinator_restarts += 1

    def sigkill_coordinator(self) -> bool:
        """SIGKILL the coordinator if it is up (never in the middle of a restart); with
        ``watch_coordinator`` on, it is started again at once. Returns whether it was up."""
        with self._restart_lock:
            if not self.daemon.is_running():
                return False
            self.daemon.kill()
            return True

    def watch_coordinator(self, armed: list[str] | None = None) -> None:
        """Restarts the coordinator whenever it dies, until ``stop_watch``: the n-th restart
        with failpoints ``armed[n]``, those past the list with failpoints off."""
        pending = list(armed or [])

        def loop() -> None:
            while not self._watch_stop.wait(0.05):
                if not self.daemon.is_running():
                    try:
                        self.restart_coordinator(pending.pop(0) if pending else "")
                    except RuntimeError:  # it died before it was seen serving (its armed
                        self.coordinator_restarts += 1  # failpoint): the next turn restarts it

        self._watch_stop.clear()
        self._watch = threading.Thread(target=loop, name="coordinator-watch", daemon=True)
        self._watch.start()

    def stop_watch(self) -> None:
        self._watch_stop.set()
        if self._watch is not None:
            self._watch.join()

    def add_input(self, n: int) -> None:
        """Adds the input files of the next n batches (one file per batch, mtime ordered)."""
        for _ in range(n):
            b = self.inputs
            tmp = self.input / f".b{b:06d}.tmp"
            tmp.write_text("\n".join(json.dumps(r) for r in workload.input_rows(b, self.k)))
            stamp = 1_700_000_000 + b
            os.utime(tmp, (stamp, stamp))
            tmp.rename(self.input / f"b{b:06d}.json")
            self.inputs += 1

    def start_driver(self, failpoints: str = "", checkpoint: Path | None = None,
                     options: dict[str, Any] | None = None,
                     driver_args: list[str] | None = None) -> DriverRun:
        """A driver on the scenario's pipeline; ``driver_args`` instead of the scenario's."""
        n = len(self.drivers)
        log_path = self.root / f"driver-{n}.log"
        command = [
            sys.executable, "-m", "tests.crash.driver", "--target", self.target,
            "--pipeline", self.pipeline, "--lake", str(self.lake), "--input", str(self.input),
            "--checkpoint", str(checkpoint or self.checkpoint), "--k", str(self.k),
            "--events", str(self.events_path),
            "--participant-options", json.dumps({**self.participant_options, **(options or {})}),
        ]
        if self.master:
            command += ["--master", self.master]
        if self.spark_conf:
            command += ["--spark-conf", json.dumps(self.spark_conf)]
        command += self.driver_args if driver_args is None else driver_args
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=log, cwd=ROOT,
                                       env=self.child_env(failpoints), start_new_session=True)
        run = DriverRun(process, log_path, self.events_path, failpoints)
        self.drivers.append(run)
        return run

    def run_driver(self, failpoints: str = "", expect: int | None = 0,
                   timeout_s: float = 240.0, **kwargs: Any) -> DriverRun:
        run = self.start_driver(failpoints, **kwargs)
        rc = run.wait(timeout_s)
        if expect is not None and rc != expect:
            raise AssertionError(f"driver (failpoints {failpoints!r}) exited {rc}, expected "
                                 f"{expect}:\n{run.log_tail()}\ncoordinator:\n"
                                 f"{self.daemon.log_tail()}")
        return run

    def start_reader(self, tables: list[TableSpec] | None = None,
                     prefixes: list[str] | None = None) -> None:
        tables = tables or self.tables()
        self.reader_stop.unlink(missing_ok=True)
        command = [sys.executable, "-m", "tests.crash.reader", "--target", self.target,
                   "--out", str(self.reader_out), "--stop-file", str(self.reader_stop),
                   *sum((["--table", f"{t.name}={t.path}"] for t in tables), [])]
        for prefix in prefixes or [""]:
            command += ["--prefix", prefix]
        log = open(self.root / "reader.log", "ab")  # noqa: SIM115 - handed to the child
        self.reader = subprocess.Popen(command, stdout=log, stderr=log, cwd=ROOT,
                                       env=self.child_env())
        log.close()

    def stop_reader(self) -> None:
        if self.reader is None:
            return
        self.reader_stop.touch()
        try:
            self.reader.wait(30)
        except subprocess.TimeoutExpired:
            self.reader.kill()
            self.reader.wait()
        self.reader = None

    def wait_reader_observations(self, n: int = 1, timeout_s: float = 30.0) -> None:
        wait_for(lambda: sum("snapshot_ts" in o for o in self.observations()) >= n,
                 timeout_s, f"{n} reader observations")

    def observations(self) -> list[dict[str, Any]]:
        return load_observations([self.reader_out])

    def close(self) -> None:
        self.stop_watch()
        self.stop_reader()
        for run in self.drivers:
            run.kill()
        self.daemon.kill()

    # ------------------------------------------------------------------ checking

    def tables(self) -> list[TableSpec]:
        return bank_tables(self.lake, self.k)

    def check(self, expected: dict[tuple[str, int], range | list[int]] | None = None,
              tables: list[TableSpec] | None = None, spark_check: bool | None = None) -> Report:
        """Every invariant over everything so far; ``expected`` defaults to generation 0
        holding one batch per input file. With ``spark_check`` (default: the scenario's) every
        version is also read with delta-spark and compared with deltalake's rows."""
        if expected is None:
            expected = {(self.pipeline, 0): range(self.inputs)}
        spark_check = self.spark_check if spark_check is None else spark_check
        with self.client() as client:
            checker = Checker(client, tables or self.tables(),
                              spark_reads=self.spark_reads if spark_check else None)
            return checker.check(expected, self.observations())

    def spark_reads(self, versions: list[tuple[TableSpec, list[int]]]) -> dict[str, Any]:
        """Reads the given versions of each table with delta-spark in a child Spark application
        (``spark_reader``'s, or a new one on the scenario's master), through ``s3a://`` for
        object-store tables: for each table name and version the rows, each as
        ``[txn_id, *columns]`` (``spark_reads.py``)."""
        if self.spark_reader is not None:
            return self.spark_reader.read(versions)
        n = len(list(self.root.glob("spark-reads-*.json")))
        out = self.root / f"spark-reads-{n}.json"
        log_path = self.root / f"spark-reads-{n}.log"
        command = [sys.executable, "-m", "tests.crash.spark_reads", "--out", str(out),
                   "--warehouse", str(self.lake)]
        for table, numbers in versions:
            command += ["--table", json.dumps({"name": table.name, "path": str(table.path),
                                               "columns": list(table.columns),
                                               "versions": numbers})]
        if self.master:
            command += ["--master", self.master]
        if self.spark_conf:
            command += ["--spark-conf", json.dumps(self.spark_conf)]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=log, cwd=ROOT,
                                       env=self.child_env(), start_new_session=True)
        try:
            rc = process.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            rc = None
        if rc != 0 or not out.exists():
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
            raise AssertionError(f"delta-spark reads exited {rc}:\n{tail}")
        return json.loads(out.read_text())

    def delete_checkpoint(self) -> None:
        shutil.rmtree(self.checkpoint)

    def reset_pipeline(self, generation: int, reason: str = "crash suite C11") -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "coordinator", "reset-pipeline", "--target", self.target,
             "--pipeline", self.pipeline, "--generation", str(generation), "--reason", reason],
            capture_output=True, text=True, cwd=ROOT, env=self.child_env(), timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"reset-pipeline failed: {out.stderr}")
        return json.loads(out.stdout)


def failpoint_hit(run: DriverRun, name: str) -> bool:
    return run.returncode == FAILPOINT_EXIT and f"failpoint {name}" in run.log()
