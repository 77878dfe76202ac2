"""The topology check (TOPOLOGY.md, "The check it must pass") with real streaming queries.

The root pipeline ``bank`` and the downstream pipeline ``ledger`` (percolake streaming source
over debits and credits) run in their own driver processes (``tests/topology_driver.py``)
against a coordinator with 1 s global barriers, while this process reads {debits, credits,
ledger} read_committed, snapshot and topology (``tests/topology_support.py``). Every topology
read must have count(ledger) = count(debits) + count(credits) and sum(|ledger.amount|) =
sum(debits.amount) + sum(credits.amount), across SIGKILLs of each driver and of the coordinator;
how often the other two break it is printed, not asserted (it depends on timing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from percolake.v1 import coordinator_pb2 as pb
from tests.crash import workload
from tests.crash.harness import child_env, read_events
from tests.daemon_support import wait_for
from tests.topology_support import LedgerReaders, TopologyLake, ledger_read

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
INTERVAL_S = 1.0
K = 3  # transfers per input file
# The feeder adds an input file every FEED_EVERY_S: slower than a ledger batch takes on a
# busy machine (each non-empty barrier interval is its own ledger batch: a root committing
# every second would leave the ledger ever further behind), and a root batch may take up to
# FEED_BATCH files (a restarted root catches up in one batch).
FEED_EVERY_S = 4.0
FEED_BATCH = 20


class Driver:
    """One driver process of a role; killed with SIGKILL (its JVM too) or stopped gently."""

    def __init__(self, run: TopologyRun, role: str, failpoints: str = "",
                 files_per_batch: int = 1) -> None:
        self.role = role
        self.stop_file = run.root / f"stop.{role}"
        self.stop_file.unlink(missing_ok=True)
        n = len([d for d in run.drivers if d.role == role])
        self.log_path = run.root / f"{role}-{n}.log"
        command = [sys.executable, "-m", "tests.topology_driver", "--role", role,
                   "--target", run.lake.target, "--lake", str(run.lake.lake),
                   "--checkpoint", str(run.root / "checkpoints" / role),
                   "--events", str(run.events[role]), "--stop-file", str(self.stop_file)]
        if role == "root":
            command += ["--input", str(run.input),
                        "--max-files-per-trigger", str(files_per_batch)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log, cwd=ROOT,
                                            env=child_env(failpoints), start_new_session=True)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout_s: float = 120) -> int:
        """Asks the driver to stop its query (``request_stop``), waits for its exit code."""
        self.request_stop()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def request_stop(self) -> None:
        self.stop_file.touch()

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class TopologyRun:
    """A coordinator, the bank's input (a file per batch, added by a thread), both drivers and
    the three-way readers."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.lake = TopologyLake(self.root, interval_s=INTERVAL_S)
        self.input = self.root / "input"
        self.input.mkdir(parents=True, exist_ok=True)
        self.events = {"root": self.root / "root-events.jsonl",
                       "ledger": self.root / "ledger-events.jsonl"}
        self.inputs = 0
        self.drivers: list[Driver] = []
        self.current: dict[str, Driver] = {}
        self.readers: LedgerReaders | None = None
        self._feeding = threading.Event()
        self._feeder: threading.Thread | None = None

    @property
    def tables(self) -> tuple[str, str, str]:
        return (self.lake.table(workload.DEBITS), self.lake.table(workload.CREDITS),
                self.lake.table("ledger"))

    def start(self) -> TopologyRun:
        self.lake.start()
        return self

    def driver(self, role: str, failpoints: str = "", files_per_batch: int = 1) -> Driver:
        """A new driver of ``role``; a root one takes up to ``files_per_batch`` input files per
        batch (more than one: a slow root never falls behind the feeder)."""
        driver = Driver(self, role, failpoints, files_per_batch)
        self.drivers.append(driver)
        self.current[role] = driver
        return driver

    def add_input(self, n: int = 1) -> None:
        for _ in range(n):
            b = self.inputs
            tmp = self.input / f".b{b:06d}.tmp"
            tmp.write_text("\n".join(json.dumps(r) for r in workload.input_rows(b, K)))
            stamp = 1_700_000_000 + b
            os.utime(tmp, (stamp, stamp))
            tmp.rename(self.input / f"b{b:06d}.json")
            self.inputs += 1

    def feed(self, every_s: float) -> None:
        """Adds an input file every ``every_s`` until ``stop_feeding``."""
        def loop() -> None:
            while self._feeding.is_set():
                self.add_input()
                time.sleep(every_s)

        self._feeding.set()
        self._feeder = threading.Thread(target=loop, name="feeder", daemon=True)
        self._feeder.start()

    def stop_feeding(self) -> None:
        self._feeding.clear()
        if self._feeder is not None:
            self._feeder.join()

    def start_readers(self) -> LedgerReaders:
        self.readers = LedgerReaders(self.lake.target, self.tables).start()
        return self.readers

    def ledger_batches(self) -> list[dict[str, Any]]:
        return [e for e in read_events(self.events["ledger"]) if e["event"] == "batch"]

    def topology(self) -> pb.GetTopologyResponse:
        with self.lake.client() as client:
            return client.call("GetTopology", pb.GetTopologyRequest())

    def wait_ledger_batches(self, n: int, timeout_s: float = 400) -> None:
        """Waits for ``n`` more ledger batches with rows than there are now."""
        start = sum(1 for e in self.ledger_batches() if e["rows"])
        wait_for(lambda: sum(1 for e in self.ledger_batches() if e["rows"]) >= start + n
                 or self._failed(), timeout_s, f"{n} more ledger batches", interval_s=0.5)
        assert not self._failed(), self._failed()

    def _failed(self) -> str:
        for role, driver in self.current.items():
            rc = driver.process.poll()
            if rc not in (None, 0):
                return f"{role} driver exited {rc}:\n{driver.log_tail()}"
        return ""

    def wait_root_rows(self, rows: int, timeout_s: float = 240) -> None:
        """Waits until debits holds ``rows`` rows (read_committed): the bank's tables exist,
        so the ledger's percolake sources know their columns."""
        with self.lake.client() as client:
            wait_for(lambda: (read := ledger_read(client, self.tables, "read_committed"))
                     and read.debits.rows >= rows and read.credits.rows >= rows
                     or self._failed(), timeout_s, f"{rows} rows in debits and credits",
                     interval_s=0.5)
        assert not self._failed(), self._failed()

    def wait_caught_up(self, timeout_s: float = 300) -> Any:
        """Waits for a topology read that shows every input row in debits and holds."""
        expected = self.inputs * K

        def caught_up() -> Any:
            with self.lake.client() as client:
                read = ledger_read(client, self.tables, "topology")
            return read if read and read.debits.rows == expected and read.holds else None

        return wait_for(caught_up, timeout_s, f"the ledger to catch up with {expected} rows",
                        interval_s=1.0)

    def close(self) -> None:
        self.stop_feeding()
        if self.readers is not None:
            self.readers.stop()
        for driver in self.drivers:
            driver.kill()
        self.lake.close()


@pytest.fixture
def run(tmp_path):
    running = TopologyRun(tmp_path).start()
    yield running
    running.close()


def report(run: TopologyRun, header: str) -> str:
    assert run.readers is not None
    lines = [header, f"  {run.readers.summary()}"]
    for name, stats in run.readers.stats.items():
        lines += [f"  {name} unanswered {stats.unanswered}, errors {len(stats.errors)}"]
        lines += [f"    first refusal: {stats.refusals[0][:300]}"] if stats.refusals else []
        lines += [f"    last refusal: {stats.refusals[-1][:300]}"] if stats.refusals else []
    text = "\n".join(lines)
    print(text)
    return text


def assert_topology_clean(run: TopologyRun, min_reads: int = 5) -> None:
    assert run.readers is not None
    stats = run.readers.stats["topology"]
    assert stats.broken == 0, "\n".join(stats.failures[:10])
    assert not run.readers.backwards, run.readers.backwards[:10]
    assert stats.reads >= min_reads, run.readers.summary()


def _delays(run: TopologyRun) -> dict[str, int | None]:
    topology = run.topology()
    out: dict[str, int | None] = {}
    for table in topology.tables:
        out[f"table {Path(table.table).name}"] = table.delay_ms \
            if table.HasField("delay_ms") else None
    for pipeline in topology.pipelines:
        out[f"pipeline {pipeline.pipeline_id}"] = pipeline.own_delay_ms \
            if pipeline.HasField("own_delay_ms") else None
    return out


def test_topology_reads_hold_across_sigkills_of_each_driver_and_the_coordinator(run):
    """One run of both pipelines (Spark drivers are slow to start: one run proves it all):

    - T1: the ledger driver is SIGKILLed after batch 2's files are written, before its commit
      (failpoint after-prewrite=kill); the restarted driver replays batch 2 from the
      checkpoint's offsets reading exactly the same rows (same digest, same input barrier);
      input barriers strictly rise.
    - Delays: while the ledger is down the bank goes on; the ledger table's delay and the
      ledger's own delay grow, the bank's stay low, and the ledger is named the bottleneck.
    - The root driver and then the coordinator are SIGKILLed and restarted.
    - Throughout, every topology read shows the ledger exactly as the debits and credits it
      shows and the topology barrier never goes backwards (T2); at the end the ledger holds
      every row once.
    """
    run.add_input(6)
    run.driver("root")  # a file per batch: the ledger's first batches each have rows
    run.wait_root_rows(6 * K)
    run.feed(FEED_EVERY_S)
    run.start_readers()
    crashing = run.driver("ledger", failpoints="after-prewrite=kill@2")
    rc = crashing.process.wait(400)
    assert rc == -9 and "failpoint after-prewrite" in crashing.log_path.read_text(), \
        (rc, crashing.log_tail())
    first = _delays(run)
    assert first["table ledger"] is not None, first
    run.driver("ledger")  # its start takes many seconds: the ledger stays behind meanwhile
    wait_for(lambda: _delays(run)["table ledger"] >= first["table ledger"] + 5_000, 120,
             "the ledger's delay to grow by 5 s while its driver is down", interval_s=0.5)
    second = _delays(run)
    print(f"delays while the ledger is down: {first} -> {second}")
    assert second["pipeline ledger"] is not None \
        and second["pipeline ledger"] > (first["pipeline ledger"] or 0), (first, second)
    for name in ("table debits", "table credits", "pipeline bank"):
        assert second[name] is not None and second[name] < second["table ledger"] - 3_000, \
            (name, second)
    bottleneck = next(t for t in run.topology().tables if Path(t.table).name == "ledger")
    assert bottleneck.bottleneck_pipeline == "ledger", bottleneck
    run.wait_ledger_batches(2)
    batches = run.ledger_batches()
    crashed = [e for e in batches if e["pid"] == crashing.process.pid and e["batch"] == 2]
    replayed = [e for e in batches if e["pid"] != crashing.process.pid and e["batch"] == 2]
    assert len(crashed) == 1 and replayed, batches
    assert crashed[0]["rows"] > 0, crashed
    assert {(e["digest"], e["rows"], e["input_barrier"]) for e in replayed} \
        == {(crashed[0]["digest"], crashed[0]["rows"], crashed[0]["input_barrier"])}, batches

    run.current["root"].kill()
    run.driver("root", files_per_batch=FEED_BATCH)
    run.wait_ledger_batches(1)
    run.lake.restart()
    run.wait_ledger_batches(1)
    run.stop_feeding()
    final = run.wait_caught_up()
    run.readers.stop()
    report(run, f"topology check over {run.inputs} input files, final {final.describe()}")
    assert_topology_clean(run)
    committed: dict[int, int] = {}
    for event in run.ledger_batches():  # the last call of a batch is the one committed
        committed[event["batch"]] = event["input_barrier"]
    barriers = [committed[b] for b in sorted(committed)]
    assert barriers == sorted(set(barriers)) and all(barriers), barriers
    assert final.ledger.rows == 2 * run.inputs * K, final.describe()
    for role in ("root", "ledger"):  # both stop at once
        run.current[role].request_stop()
    for role in ("root", "ledger"):
        assert run.current[role].stop() == 0, run.current[role].log_tail()
