"""Every percolake entry point that reads Delta tables exits with its real status (issue 13.15).

A process whose pyarrow scan left Python-owned buffers to Arrow's threads can abort at
interpreter exit (``terminate called without an active exception``, status 134 instead of its
own; apache/arrow#34314). Each case below runs ``RUNS`` fresh processes, two at a time, and
checks every exit status; driver runs numbered ``i % 5 == 4`` end with a failure of their own
(status 3) after their reads, which must come out as 3, not 134.

- ``demo``: imports ``scripts/demo.py`` and runs its table-reading functions (``table_sum`` of
  the latest and of an older version, ``per_account``) on prepared Delta tables: the part of the
  demo that scans tables with pyarrow, without its ~90 s Spark job.
- ``participant``: a user's driver doing the participant's table reads outside the JVM:
  ``describe_files`` (Parquet footers of the attempt's files), ``SchemaChecker`` (table layout)
  and ``apply_table_write`` of an append and an overwrite (which lists the add actions).
- ``daemon``: ``python -m coordinator serve`` and the ``percolake-coordinator serve`` console
  script, alternately: a committed write, a GetSnapshot that makes the daemon apply it to its
  Delta table (roll-forward), then SIGTERM, which must end it with status 0. ``serve`` is the
  only CLI subcommand that reads tables (``reset-pipeline`` only calls the daemon).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RUNS = 10
FAILED = 3
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
    str(ROOT), str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")]))}

DEMO_DRIVER = """
import sys
from pathlib import Path
import demo
lake, status, i = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
batches, rows = int(sys.argv[4]), int(sys.argv[5])
total = lambda n: sum(t % 50 + 1 for t in range(n * rows))
balances = lambda v: {a: 1000 + a // rows for a in range((v + 1) * rows)}
assert demo.table_sum(lake / "missing") is None
assert demo.per_account(lake / "missing", None, "balance") == {}
assert demo.table_sum(lake / "credits", 4) == total(5)
assert demo.per_account(lake / "accounts", 4, "balance") == balances(4)
# the last scan, right before exit, reads every file: when an abort at exit would strike
if i % 2:
    assert demo.table_sum(lake / "debits") == total(batches)
else:
    assert demo.per_account(lake / "accounts", batches - 1, "balance") == balances(batches - 1)
sys.exit(status)
"""

PARTICIPANT_DRIVER = """
import os, sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
from deltalake import Schema
from percolake.lake.delta_commit import apply_table_write
from percolake.records import TableWriteRecord, WriteMode
from sparkside.schema_check import SchemaChecker
from sparkside.writer import describe_files
table = Path(sys.argv[1]) / f"run-{sys.argv[3]}" / "t"
status = int(sys.argv[2])
uri = "file://" + os.path.realpath(table)
schema = Schema.from_arrow(pa.schema([("id", pa.int64()), ("day", pa.string())])).to_json()
checker = SchemaChecker()

def batch(txn, mode, version):
    location = table / "_percolake" / txn
    for day in ("d1", "d2"):
        (location / f"day={day}").mkdir(parents=True)
        pq.write_table(pa.table({"id": [version, 10 + version]}),
                       location / f"day={day}" / "part-00000.parquet")
    assert checker.check(uri, schema, ["day"], mode.value, version) == ["day"]
    adds = describe_files(uri, str(location), ["day"])
    write = TableWriteRecord(uri, mode, tuple(adds), schema, ("day",))
    assert apply_table_write(write, app_id="percolake:p:g0", app_version=version, txn_id=txn,
                             commit_ts=version + 1) == version

batch("a", WriteMode.APPEND, 0)
batch("b", WriteMode.OVERWRITE, 1)
assert checker.layout(uri).version == 1
sys.exit(status)
"""


def _in_pairs(run: Callable[[int], None]) -> None:
    """``run(0..RUNS-1)``, two at a time (the test machines have two cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(run, range(RUNS)))


def _expected(i: int) -> int:
    return FAILED if i % 5 == 4 else 0


def _run_driver(source: str, *arguments: str) -> None:
    """``source`` in ``RUNS`` fresh interpreters: ``argv`` is ``arguments``, the status the
    run must exit with, and the run's number."""
    def run(i: int) -> None:
        expected = _expected(i)
        done = subprocess.run([sys.executable, "-c", source, *arguments[:1], str(expected),
                               str(i), *arguments[1:]],
                              capture_output=True, text=True, env=ENV, timeout=120)
        assert done.returncode == expected, (
            f"run {i}: exit status {done.returncode}, expected {expected}\n{done.stderr[-2000:]}")
    _in_pairs(run)


def test_demo_table_reads_exit_with_their_status(tmp_path):
    """Tables shaped like the demo's (4 columns, one file per batch) but of 10 batches of 200
    rows: with the demo's old ``to_pyarrow_table()`` reads, 12 of 20 runs of this driver
    aborted (SIGABRT instead of 0 or 3): all of ``RUNS`` = 10 passing by chance has odds of
    about 1 in 10,000."""
    batches, rows = 10, 200
    for batch in range(batches):
        transfers = list(range(batch * rows, (batch + 1) * rows))
        moves = pa.table({name: pa.array(values, pa.int64()) for name, values in [
            ("batch", [batch] * rows), ("transfer", transfers),
            ("account", [t % 8 for t in transfers]), ("amount", [t % 50 + 1 for t in transfers])]})
        write_deltalake(tmp_path / "debits", moves, mode="append")
        write_deltalake(tmp_path / "credits", moves, mode="append")
        write_deltalake(tmp_path / "accounts", pa.table({
            "account": pa.array(transfers, pa.int64()),
            "balance": pa.array([1000 + batch] * rows, pa.int64())}), mode="append")
    _run_driver(DEMO_DRIVER, str(tmp_path), str(batches), str(rows))


def test_participant_table_reads_exit_with_their_status(tmp_path):
    _run_driver(PARTICIPANT_DRIVER, str(tmp_path))


def _commit_one_write(stub: pb_grpc.CoordinatorStub, table: Path) -> None:
    """Commits one real Parquet file to ``table`` and leaves its Delta commit undone."""
    txn = stub.OpenTransaction(pb.OpenTransactionRequest(pipeline_id="exit"),
                               timeout=30).transaction
    path = table / "_percolake" / txn.txn_id / "part-00000.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), path)
    schema = {"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
    write = pb.TableWrite(table=str(table), mode=pb.APPEND, schema_json=json.dumps(schema),
                          add_files=[pb.AddFile(
                              path=path.relative_to(table).as_posix(), size=path.stat().st_size,
                              modification_time=1_700_000_000_000,
                              stats=json.dumps({"numRecords": 2}))])
    committed = stub.CommitTransaction(pb.CommitTransactionRequest(
        txn_id=txn.txn_id, tables=[str(table)], writes=[write]), timeout=30).transaction
    assert committed.state == pb.COMMITTED


def test_daemon_exits_0_on_sigterm_after_a_roll_forward(tmp_path):
    console_script = Path(sys.executable).parent / "percolake-coordinator"
    commands = [[sys.executable, "-m", "coordinator"], [str(console_script)]]
    assert console_script.exists(), "the console script is not installed (pip install -e .)"

    def run(i: int) -> None:
        base = tmp_path / f"run-{i}"
        warehouse, port_file = base / "warehouse", base / "port"
        warehouse.mkdir(parents=True)
        log = base / "daemon.log"
        with open(log, "wb") as out:
            daemon = subprocess.Popen([
                *commands[i % 2], "serve", "--port", "0", "--port-file", str(port_file),
                "--data-dir", str(base / "data"), "--warehouse", str(warehouse),
                "--roll-forward-after", "3600", "--shutdown-grace", "5"],
                stdout=out, stderr=out, env=ENV)
        try:
            deadline = time.monotonic() + 60
            while not port_file.exists():
                assert daemon.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            table = warehouse / "t"
            with grpc.insecure_channel(f"127.0.0.1:{port_file.read_text()}") as channel:
                stub = pb_grpc.CoordinatorStub(channel)
                _commit_one_write(stub, table)
                snapshot = stub.GetSnapshot(pb.GetSnapshotRequest(tables=[str(table)]),
                                            timeout=60)
            assert [(t.exists, t.delta_version) for t in snapshot.tables] == [(True, 0)]
            assert DeltaTable(str(table)).version() == 0  # the daemon applied it
            daemon.send_signal(signal.SIGTERM)
            status = daemon.wait(timeout=60)
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
        assert status == 0, f"run {i}: exit status {status}\n{log.read_text()[-2000:]}"
    _in_pairs(run)
