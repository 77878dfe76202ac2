"""A Spark standalone cluster on 127.0.0.1, started from the PySpark installation: one master and
two workers (one core each), each a JVM of its own (``bin/spark-class``), so executors are
separate JVMs, as on a real cluster.

    cluster = SparkCluster(tmp / "cluster").start()
    spark = local_spark("app", master=cluster.master_url, conf=cluster.app_conf())
    ...
    cluster.stop()

``start`` waits until both workers are registered with the master (its web UI's JSON,
``aliveworkers``). ``stop`` kills every process group it started (the master, the workers, and
with each worker its executors and their Python workers). Nothing outlives the test session:
every JVM gets SIGKILL when the process that started it dies (``PR_SET_PDEATHSIG``), and a small
watchdog child (``python -m tests.cluster_support``, the stdin trick of ``tests/s3_support.py``)
kills every process group of the cluster once its standard input closes, which happens when the
parent exits, whatever the way. Logs (the daemons' and each executor's, in the workers' work
dirs) stay under the cluster's folder; ``logs()`` gathers their tails for a failure message.

Only 127.0.0.1 is ever bound or contacted.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyspark

from tests.spark_settings import JVM_OPTIONS

ROOT = Path(__file__).resolve().parent.parent
SPARK_HOME = Path(pyspark.__file__).resolve().parent
HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent process dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class SparkCluster:
    """A standalone master and ``workers`` workers on 127.0.0.1; ``start``, use, ``stop``."""

    def __init__(self, root: str | Path, workers: int = 2, cores_per_worker: int = 1,
                 worker_memory: str = "1g", env: Mapping[str, str] | None = None) -> None:
        self.root = Path(root)
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.worker_memory = worker_memory
        self.extra_env = dict(env or {})
        self.port = 0
        self.webui_port = 0
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._watchdog: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ addresses

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{HOST}:{self.webui_port}"

    @property
    def cores(self) -> int:
        return self.workers * self.cores_per_worker

    def app_conf(self, executor_memory: str = "512m") -> dict[str, str]:
        """Settings an application on this cluster should have: small executors on every
        core, the driver on 127.0.0.1, executors starting fast."""
        return {
            "spark.cores.max": str(self.cores),
            "spark.executor.cores": str(self.cores_per_worker),
            "spark.executor.memory": executor_memory,
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.executor.extraJavaOptions": JVM_OPTIONS,
            "spark.executorEnv.PYTHONPATH": str(ROOT),
        }

    # ------------------------------------------------------------------ life cycle

    def env(self) -> dict[str, str]:
        """The environment of the cluster's JVMs."""
        env = {**os.environ, **self.extra_env}
        env.update({
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_LOCAL_HOSTNAME": HOST,
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_LOCAL_DIRS": str(self.root / "local"),  # executors' scratch space
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": JVM_OPTIONS,
            "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        })
        for name in ("SPARK_CONF_DIR", "SPARK_MASTER_HOST", "SPARK_MASTER_PORT",
                     "SPARK_WORKER_DIR", "PYSPARK_DRIVER_PYTHON"):
            env.pop(name, None)
        return env

    def start(self, timeout_s: float = 120.0) -> SparkCluster:
        """Starts the watchdog, the master and the workers; returns once every worker is
        registered. Raises (after stopping what it started) with the logs when it cannot."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        (self.root / "local").mkdir(exist_ok=True)
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster_support"], cwd=ROOT, stdin=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
        try:
            self.port, self.webui_port = free_port(), free_port()
            self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", HOST,
                        "--port", str(self.port), "--webui-port", str(self.webui_port))
            self._wait(lambda: self.state() is not None, timeout_s, "the master's web UI")
            for n in range(self.workers):
                work = self.root / f"worker-{n}"
                work.mkdir(exist_ok=True)
                self._spawn(f"worker-{n}", "org.apache.spark.deploy.worker.Worker",
                            self.master_url, "--host", HOST,
                            "--cores", str(self.cores_per_worker),
                            "--memory", self.worker_memory,
                            "--webui-port", str(free_port()), "--work-dir", str(work))
            self._wait(lambda: self.alive_workers() >= self.workers, timeout_s,
                       f"{self.workers} workers registered")
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        log = open(self.root / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - the child's
        try:
            process = subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), main_class, *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.root, env=self.env(),
                start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509
        finally:
            log.close()
        self.processes.append((name, process))
        assert self._watchdog is not None and self._watchdog.stdin is not None
        self._watchdog.stdin.write(f"{process.pid}\n".encode())
        self._watchdog.stdin.flush()

    def _wait(self, ready: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [(n, p.returncode) for n, p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"Spark cluster: {dead} exited while waiting for {what}:\n"
                                   f"{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Spark cluster: no {what} after {timeout_s:.0f} s:\n"
                                   f"{self.logs()}")
            time.sleep(0.25)

    def state(self) -> dict[str, Any] | None:
        """The master's status (its web UI's ``/json/``), None while it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as reply:  # noqa: S310
                return json.loads(reply.read())
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        state = self.state() or {}
        return int(state.get("aliveworkers", 0))

    def is_running(self) -> bool:
        return bool(self.processes) and all(p.poll() is None for _, p in self.processes)

    def stop(self, timeout_s: float = 15.0) -> None:
        """Kills the workers' process groups (with their executors), then the master's; the
        watchdog then exits. Safe to call twice."""
        for _, process in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for _, process in reversed(self.processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            # executors and Python workers are in the worker's group: none may stay behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        self._drop_copied_jars()
        if self._watchdog is not None:
            if self._watchdog.stdin is not None and not self._watchdog.stdin.closed:
                with contextlib.suppress(OSError):  # "done": nothing left to kill (ids reused)
                    self._watchdog.stdin.write(b"done\n")
                    self._watchdog.stdin.flush()
                with contextlib.suppress(OSError):
                    self._watchdog.stdin.close()
            try:
                self._watchdog.wait(10)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
            self._watchdog = None

    def _drop_copied_jars(self) -> None:
        """Deletes the jars each application's executors got a copy of (tens of MB per
        application and worker); their logs stay."""
        for n in range(self.workers):
            for jar in (self.root / f"worker-{n}").glob("app-*/*/*.jar"):
                with contextlib.suppress(OSError):
                    jar.unlink()

    # ------------------------------------------------------------------ logs

    def log_files(self) -> list[Path]:
        """The daemons' logs, then every executor's stdout and stderr."""
        files = sorted((self.root / "logs").glob("*.log"))
        for n in range(self.workers):
            files += sorted((self.root / f"worker-{n}").glob("app-*/*/std*"))
        return files

    def logs(self, lines: int = 25) -> str:
        out = []
        for path in self.log_files():
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.relative_to(self.root)}\n" + "\n".join(text))
        return "\n".join(out)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _watchdog() -> None:
    """Reads process-group ids from stdin; once stdin closes without a ``done`` line first (the
    parent died), SIGKILLs every one of them. After ``done`` (a normal stop, which killed them
    itself) it kills nothing: the ids may belong to new processes by then."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the test run is the parent's
    groups: list[int] = []
    for line in sys.stdin:
        if line.strip() == "done":
            return
        with contextlib.suppress(ValueError):
            groups.append(int(line))
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


if __name__ == "__main__":
    _watchdog()
