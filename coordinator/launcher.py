"""Starting the daemon as a child process: for the demo, the tests and the crash suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from percolake.credentials import ClientSecurity, open_channel


class DaemonProcess:
    """``python -m coordinator serve`` in a child process on a free (then fixed) port."""

    def __init__(self, data_dir: str | Path, warehouse_roots: list[str],
                 env: dict[str, str] | None = None, extra_args: list[str] | None = None,
                 log_path: str | Path | None = None,
                 security: ClientSecurity | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.security = security  # how this process's own calls connect (health); None: plain
        self.warehouse_roots = list(warehouse_roots)
        self.env = dict(env or {})
        self.extra_args = list(extra_args or [])
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / (
            self.data_dir.name + ".log")
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0, env: dict[str, str] | None = None,
              serving: bool = True) -> DaemonProcess:
        """Starts the daemon (on the same port after a restart) and waits until it listens
        and, with ``serving``, until its health is SERVING (a standby never is: pass False)."""
        port_file = self.data_dir.parent / f".{self.data_dir.name}.port"
        port_file.unlink(missing_ok=True)
        command = [
            sys.executable, "-m", "coordinator", "serve", "--host", "127.0.0.1",
            "--port", str(self.port), "--data-dir", str(self.data_dir),
            "--port-file", str(port_file), *sum((["--warehouse", r] for r in
                                                 self.warehouse_roots), []),
            *self.extra_args,
        ]
        child_env = {**os.environ, **self.env, **(env or {})}
        root = str(Path(__file__).resolve().parent.parent)
        child_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [root, child_env.get("PYTHONPATH", "")]))
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(command, stdout=log, stderr=log, env=child_env)
        log.close()
        deadline = time.monotonic() + timeout_s
        while not port_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"coordinator exited with {self.process.returncode}; "
                                   f"see {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"coordinator did not start; see {self.log_path}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        if serving:
            self.wait_serving(max(1.0, deadline - time.monotonic()))
        return self

    def wait_serving(self, timeout_s: float) -> None:
        """Waits until the daemon's health is SERVING (a standby becomes leader)."""
        deadline = time.monotonic() + timeout_s
        status = None
        while (status := self.health(max(0.1, min(2.0, deadline - time.monotonic())))) \
                != "SERVING":
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"coordinator exited with {self.process.returncode}; "
                                   f"see {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"coordinator at {self.target} is not serving after "
                                   f"{timeout_s:g} s (health {status}); see {self.log_path}")
            time.sleep(0.05)

    def health(self, timeout_s: float = 2.0) -> str | None:
        """The daemon's health status name (SERVING, NOT_SERVING), None if it does not
        answer within ``timeout_s`` (not listening, stopped, or shutting down)."""
        with self.channel() as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=timeout_s, wait_for_ready=True)
            except grpc.RpcError:
                return None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def channel(self) -> grpc.Channel:
        """A new channel to the daemon with :attr:`security` (the environment is not read)."""
        if self.security is None:
            return grpc.insecure_channel(self.target)
        return open_channel(self.target, self.security)

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL: no shutdown path runs."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def pause(self) -> None:
        """SIGSTOP: the process freezes where it is (as a long GC pause or a VM stall)."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait for the graceful shutdown; returns the exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.send_signal(signal.SIGCONT)  # a paused process handles it now
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def restart(self, env: dict[str, str] | None = None) -> DaemonProcess:
        self.kill()
        return self.start(env=env)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> DaemonProcess:
        return self.start() if not self.is_running() else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
