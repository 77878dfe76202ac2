"""Failover with real processes (issue 16): coordinators on one PostgreSQL database, the leader hit.

C9 with two ``serve --store <dsn> --advertise 127.0.0.1:<port> --lease-s S`` daemons (each its
own data dir, log and fixed port) instead of one: light pipelines (``light.py``), a snapshot
reader and a timestamp probe are all given both addresses and follow the leader. At random
moments the leader (the process whose health is SERVING) is hit by one fault:

- ``sigkill``: killed, then restarted once another process serves (it comes back a standby);
- ``sigstop``: frozen for longer than its lease, resumed once another process serves: it must
  answer NOT_SERVING at once and never write again (the checker finds every batch once);
- ``sigterm``: a graceful stop (the lease is released), then restarted;
- ``pg-restart``: PostgreSQL stopped for longer than the lease, then started: once the leader's
  validity ran out nobody may answer SERVING until it is back;
- ``pg-cut``: every session of the database terminated (a connection cut mid-write).

Each takeover is timed from the fault to a process answering SERVING (health polled every
20 ms; for ``pg-restart`` from PostgreSQL's return), with the longest gap any pipeline saw
between acknowledged commits around it. Then the checker runs as in C9: every batch exactly
once (I2), every snapshot read consistent (I1), acknowledged commits durable with their
commit_ts (I4), and the oracle (I6): the first snapshot_ts after each takeover is above every
timestamp seen before the fault, and the probe's sequential GetSnapshot timestamps rise strictly
across every takeover.
"""

from __future__ import annotations

import bisect
import json
import logging
import random
import socket
import threading
import time
import traceback
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from coordinator.launcher import DaemonProcess
from percolake.v1 import coordinator_pb2 as pb
from tests.crash import light
from tests.crash.checker import Checker, Report, TableSpec, load_observations
from tests.crash.reader import FileCache, observe
from tests.crash.rpc import COMMITTED_STATES, Client, state_name
from tests.crash.scenarios import Outcome

POLL_S = 0.02
HEALTH_TIMEOUT_S = 0.25
VALID_FRACTION = 0.8          # the leader answers only this share of its lease after a renewal
C9_ARGS = ("--roll-forward-after", "2", "--txn-timeout", "60", "--conflict-wait", "20",
           "--log-format", "text", "--shared-table-writers")  # light pipelines share a ledger
OPEN_ENDED = 10**6            # pipelines commit until told to stop
FAULTS = ("sigkill", "sigstop", "sigterm", "pg-restart", "pg-cut")
PROCESS_FAULTS = ("sigkill", "sigstop")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class NoLeader(AssertionError):
    """No process answered SERVING in time: a failed takeover, not a harness problem."""


class Node(DaemonProcess):
    """One coordinator of the group; its port is chosen up front: it is its --advertise."""

    def __init__(self, name: str, root: Path, lake: Path, dsn: str, lease_s: float,
                 extra_args: tuple[str, ...]) -> None:
        port = free_port()
        super().__init__(root / f"coordinator-{name}-data", [str(lake)],
                         log_path=root / f"coordinator-{name}.log", extra_args=[
                             "--store", dsn, "--advertise", f"127.0.0.1:{port}",
                             "--lease-s", str(lease_s), "--shutdown-grace", "5", *extra_args])
        self.name = name
        self.port = port
        self.paused = False

    def status(self) -> str:
        """SERVING, NOT_SERVING, or DOWN (no answer: dead, frozen, not listening yet)."""
        return self.health(HEALTH_TIMEOUT_S) or "DOWN"

    def pause(self) -> None:
        super().pause()
        self.paused = True

    def resume(self) -> None:
        super().resume()
        self.paused = False

    def close(self) -> None:
        if self.paused:
            self.resume()
        self.kill()


class Group:
    """The coordinators on one database; the first to start becomes the leader."""

    def __init__(self, root: Path, dsn: str, lease_s: float, size: int = 2,
                 extra_args: tuple[str, ...] = C9_ARGS) -> None:
        self.root = root
        self.lake = root / "lake"
        self.lake.mkdir(parents=True, exist_ok=True)
        self.lease_s = lease_s
        self.nodes = [Node("abcdefgh"[n], root, self.lake, dsn, lease_s, extra_args)
                      for n in range(size)]

    @property
    def targets(self) -> str:
        return ",".join(n.target for n in self.nodes)

    def start(self) -> None:
        first, *rest = self.nodes
        first.start(serving=False)
        self.wait_leader(60)
        for node in rest:
            node.start(serving=False)

    def live(self, exclude: Node | None = None) -> list[Node]:
        return [n for n in self.nodes if n is not exclude and n.is_running() and not n.paused]

    def wait_leader(self, timeout_s: float, exclude: Node | None = None) -> tuple[Node, float]:
        """The first live process (not ``exclude``) answering SERVING, and when it did."""
        deadline = time.monotonic() + timeout_s
        while True:
            for node in self.live(exclude):
                if node.status() == "SERVING":
                    return node, time.monotonic()
            if time.monotonic() > deadline:
                raise NoLeader(f"no coordinator answered SERVING within {timeout_s:.0f} s: "
                               + "; ".join(f"{n.name} {n.status()}" for n in self.live()))
            time.sleep(POLL_S)

    def client(self, retry_s: float = 60.0) -> Client:
        return Client(self.targets, retry_s=retry_s)

    def close(self) -> None:
        for node in self.nodes:
            node.close()


class _FollowingStub:
    """What ``reader.observe`` calls, through the leader-following client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def GetSnapshot(self, request: pb.GetSnapshotRequest, timeout: float) -> Any:  # noqa: N802
        return self.client.call("GetSnapshot", request, retry_s=timeout)


class Reader:
    """``tests/crash/reader.py``'s loop in a thread, on every address (it follows the leader);
    observations go to ``out`` in the reader's format."""

    def __init__(self, targets: str, tables: list[TableSpec], prefixes: list[str],
                 out: Path, name: str = "reader") -> None:
        self.client = Client(targets, retry_s=10.0, call_timeout_s=5.0)
        self.tables = {t.name: t.path for t in tables}
        self.prefixes = prefixes
        self.out = out
        self.name = name
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Reader:
        self.thread.start()
        return self

    def _run(self) -> None:
        stub, cache = _FollowingStub(self.client), FileCache()
        with open(self.out, "a", buffering=1) as out:
            while not self.stop.is_set():
                try:
                    obs = observe(stub, self.tables, cache, self.name)
                    obs["prefixes"] = self.prefixes
                except grpc.RpcError as exc:
                    obs = {"reader": self.name, "error": exc.details(), "code": exc.code().name}
                    time.sleep(0.2)
                except Exception as exc:  # a version the snapshot named could not be read
                    obs = {"reader": self.name, "error": repr(exc), "code": "READ_ERROR"}
                out.write(json.dumps(obs) + "\n")
                self.stop.wait(0.2)

    def observations(self) -> list[dict[str, Any]]:
        return load_observations([self.out])

    def wait_observations(self, n: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        start = sum("snapshot_ts" in o for o in self.observations())
        while sum("snapshot_ts" in o for o in self.observations()) < start + n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the reader made no {n} more observations in "
                                   f"{timeout_s:.0f} s")
            time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.client.close()


class Probe:
    """Sequential GetSnapshot calls at whichever process leads: every timestamp it is handed
    must be above the one before, across every takeover (I6)."""

    def __init__(self, targets: str, table: str) -> None:
        self.client = Client(targets, retry_s=30.0, call_timeout_s=2.0)
        self.table = table
        self.seen: list[tuple[float, int, str]] = []  # (monotonic at the reply, ts, address)
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ts-probe", daemon=True)

    def start(self) -> Probe:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                ts = self.client.snapshot([self.table]).snapshot_ts
            except grpc.RpcError as exc:
                self.errors.append(f"{exc.code().name}: {exc.details()}")
                continue
            self.seen.append((time.monotonic(), ts, self.client.follower.current))

    def high_before(self, moment: float) -> int:
        return max((ts for at, ts, _ in list(self.seen) if at <= moment), default=0)

    def switches(self) -> int:
        """How often the answering address changed (a new leader seen)."""
        return sum(a[2] != b[2] for a, b in zip(self.seen, self.seen[1:], strict=False))

    def violations(self) -> list[str]:
        out = []
        for (_, a, where_a), (_, b, where_b) in zip(self.seen, self.seen[1:], strict=False):
            if b <= a:
                out.append(f"the probe's GetSnapshot got {b} from {where_b} after {a} from "
                           f"{where_a}: the oracle went back")
        return out

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        self.client.close()


class AckClock:
    """When each pipeline's acknowledged commits arrived (sampled every 10 ms)."""

    def __init__(self, runs: list[light.LightPipeline]) -> None:
        self.runs = runs
        self.times: dict[str, list[float]] = {r.pipeline_id: [] for r in runs}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ack-clock", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.01):
            now = time.monotonic()
            for run in self.runs:
                times = self.times[run.pipeline_id]
                times.extend([now] * (len(run.acks) - len(times)))

    def gap_around(self, moment: float) -> float | None:
        """The longest wait of a pipeline from its last ack before ``moment`` to its next."""
        gaps = []
        for times in self.times.values():
            i = bisect.bisect_right(times, moment)
            if 0 < i < len(times):
                gaps.append(times[i] - times[i - 1])
        return round(max(gaps), 3) if gaps else None

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


@dataclass
class PacedPipeline(light.LightPipeline):
    """A light pipeline that rests ``pace_s`` after each batch: a long run under faults then
    leaves a number of Delta versions the checker reads in reasonable time."""

    pace_s: float = 0.0

    def _batch(self, client: Client, batch: int) -> None:
        super()._batch(client, batch)
        self.stop.wait(self.pace_s)


@dataclass
class Takeover:
    kind: str
    seconds: float            # fault (or PostgreSQL's return) -> a process answering SERVING
    old: str                  # the leader hit
    new: str                  # the process serving after
    ack_gap_s: float | None = None  # a pipeline's longest wait for a commit across it
    details: dict[str, Any] = field(default_factory=dict)


def mixed_faults(n: int, rng: random.Random, kinds: tuple[str, ...] = PROCESS_FAULTS) -> list[str]:
    """``n`` faults in random order, the kinds as evenly as ``n`` allows."""
    faults = [kinds[i % len(kinds)] for i in range(n - n % len(kinds))]
    faults += rng.sample(kinds, n % len(kinds))
    rng.shuffle(faults)
    return faults


class FailoverRun:
    """One run: the group, the load, the faults, the checks."""

    def __init__(self, root: Path, dsn: str, rng: random.Random, lease_s: float,
                 coordinators: int, pipelines: int, k: int, pace_s: float, postgres: Any,
                 say: Callable[[str], None]) -> None:
        self.root = Path(root)
        self.dsn = dsn
        self.rng = rng
        self.lease_s = lease_s
        self.postgres = postgres
        self.say = say
        self.report = Report()
        self.takeovers: list[Takeover] = []
        self.moments: list[float] = []  # monotonic time of each takeover's fault
        self.group = Group(self.root, dsn, lease_s, coordinators)
        self.runs = [PacedPipeline(self.group.targets, f"p{n}", str(self.group.lake), k,
                                   OPEN_ENDED, pace_s=pace_s) for n in range(pipelines)]
        self.tables = light.all_tables(self.runs)
        self.reader: Reader | None = None
        self.probe: Probe | None = None
        self.clock: AckClock | None = None

    # ------------------------------------------------------------------ set-up and the end

    def start(self) -> None:
        self.group.start()
        for run in self.runs:
            run.start()
        self.clock = AckClock(self.runs)
        self.reader = Reader(self.group.targets, self.tables,
                             [f"{r.pipeline_id}_" for r in self.runs],
                             self.root / "observations.jsonl").start()
        ledger = next(t for t in self.tables if t.name == light.LEDGER)
        self.probe = Probe(self.group.targets, ledger.path).start()
        deadline = time.monotonic() + 120
        while not any(r.acks for r in self.runs):  # every fault under load
            if time.monotonic() > deadline or all(r.errors for r in self.runs):
                raise AssertionError(f"no commit in 120 s: {light.summary(self.runs)}\n"
                                     f"{self.group.nodes[0].log_tail()}")
            time.sleep(0.05)

    def finish(self, batches: int, timeout_s: float = 300.0) -> None:
        """Lets every pipeline reach ``batches``, then stops them at a batch boundary."""
        deadline = time.monotonic() + timeout_s
        while any(r.done_batches < batches and r.thread.is_alive() for r in self.runs):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for run in self.runs:
            run.stop.set()
        for run in self.runs:
            run.join(120)
            if run.thread.is_alive():
                self.report.add("I4", f"failover: pipeline {run.pipeline_id} still running "
                                f"{timeout_s:.0f} s after the last fault")
            for error in run.errors:
                self.report.add("failover", f"pipeline {run.pipeline_id}: "
                                f"{error.strip()[-1500:]}")
        assert self.clock is not None
        for takeover, moment in zip(self.takeovers, self.moments, strict=True):
            takeover.ack_gap_s = self.clock.gap_around(moment)

    def check(self) -> None:
        assert self.reader is not None and self.probe is not None
        self.reader.wait_observations(3)
        self.reader.close()
        self.probe.close()
        for message in self.probe.violations():
            self.report.add("I6", f"failover: {message}")
        with self.group.client() as client:
            checker = Checker(client, self.tables)
            self.report.merge(checker.check(
                {(r.pipeline_id, 0): range(r.done_batches) for r in self.runs},
                self.reader.observations()))
            for run in self.runs:
                for ack in run.acks:
                    txn = checker.txns.get(ack.txn_id)
                    if txn is None or txn.state not in COMMITTED_STATES \
                            or txn.commit_ts != ack.commit_ts:
                        self.report.add("I4", f"failover: acknowledged commit {ack} is "
                                        f"{state_name(txn.state) if txn else 'missing'}"
                                        + (f" with commit_ts {txn.commit_ts}" if txn else ""))

    def close(self) -> None:
        for run in self.runs:
            run.stop.set()
        for part in (self.reader, self.probe, self.clock):
            if part is not None:
                part.close()
        self.group.close()

    # ------------------------------------------------------------------ faults

    def fault(self, kind: str) -> Takeover:
        """Hits the leader (or the store) with ``kind``; returns the measured takeover."""
        leader, _ = self.group.wait_leader(60)
        high = self._seen_high()
        acks = sum(len(r.acks) for r in self.runs)
        moment = time.monotonic()
        takeover = getattr(self, "_" + kind.replace("-", "_"))(leader, moment)
        takeover.details["acks_before"] = acks
        self._check_oracle(takeover, high)
        self.takeovers.append(takeover)
        self.moments.append(moment)
        self.say(f"{kind}: {takeover.old} -> {takeover.new} in {takeover.seconds:.2f} s")
        return takeover

    def _sigkill(self, leader: Node, moment: float) -> Takeover:
        leader.kill()
        new, served = self.group.wait_leader(60, exclude=leader)
        leader.start(serving=False)
        self._expect_standby(leader, "after its restart")
        return Takeover("sigkill", round(served - moment, 3), leader.name, new.name)

    def _sigterm(self, leader: Node, moment: float) -> Takeover:
        exits: list[int] = []
        stopping = threading.Thread(target=lambda: exits.append(leader.stop()),
                                    name="sigterm", daemon=True)
        stopping.start()
        new, served = self.group.wait_leader(60, exclude=leader)
        stopping.join(60)
        leader.start(serving=False)
        self._expect_standby(leader, "after its restart")
        return Takeover("sigterm", round(served - moment, 3), leader.name, new.name,
                        details={"exit": exits[0] if exits else None})

    def _sigstop(self, leader: Node, moment: float) -> Takeover:
        frozen_s = self.lease_s * 1.5 + self.rng.uniform(0, self.lease_s)
        leader.pause()
        try:
            new, served = self.group.wait_leader(60, exclude=leader)
            time.sleep(max(0.0, moment + frozen_s - time.monotonic()))
        finally:
            leader.resume()
        resumed = time.monotonic()
        statuses = self._expect_standby(leader, "after SIGCONT", within_s=1.0)
        return Takeover("sigstop", round(served - moment, 3), leader.name, new.name, details={
            "frozen_s": round(resumed - moment, 2), "health_after_resume": statuses})

    def _pg_restart(self, leader: Node, moment: float) -> Takeover:
        down_s = self.lease_s * 1.5 + self.rng.uniform(0.5, self.lease_s)
        self.postgres.stop()
        # Counted from when it is down for sure: a renewal may have passed while it stopped.
        must_stop_serving = time.monotonic() + VALID_FRACTION * self.lease_s + 0.5
        served_while_down: list[str] = []
        stopped_serving: float | None = None
        while time.monotonic() < moment + down_s:
            for node in self.group.live():
                status, now = node.status(), time.monotonic()
                if status == "SERVING" and now > must_stop_serving:
                    served_while_down.append(f"{node.name} at +{now - moment:.2f} s")
                if status != "SERVING" and node is leader and stopped_serving is None:
                    stopped_serving = now
            time.sleep(POLL_S)
        self.postgres.start()
        back = time.monotonic()
        if served_while_down:
            self.report.add("HA", f"pg-restart: health SERVING while PostgreSQL was down "
                            f"(lease {self.lease_s} s): {served_while_down[:5]}")
        if stopped_serving is None:
            self.report.add("HA", f"pg-restart: the leader {leader.name} never answered "
                            f"anything but SERVING during {down_s:.1f} s without PostgreSQL")
        new, served = self.group.wait_leader(60)
        return Takeover("pg-restart", round(served - back, 3), leader.name, new.name, details={
            "down_s": round(back - moment, 2),
            "not_serving_after_s": round(stopped_serving - moment, 3) if stopped_serving
            else None})

    def _pg_cut(self, leader: Node, moment: float) -> Takeover:
        self.postgres.kill_connections(urllib.parse.urlsplit(self.dsn).path.lstrip("/"))
        stepped_down: float | None = None
        while time.monotonic() < moment + self.lease_s * 1.5:
            if leader.status() != "SERVING":
                stepped_down = time.monotonic()
                break
            time.sleep(POLL_S)
        if stepped_down is None:  # its calls and renewals got fresh connections: no step-down
            return Takeover("pg-cut", 0.0, leader.name, leader.name,
                            details={"stepped_down": False})
        new, served = self.group.wait_leader(60)
        return Takeover("pg-cut", round(served - moment, 3), leader.name, new.name,
                        details={"stepped_down": True,
                                 "not_serving_after_s": round(stepped_down - moment, 3)})

    def _expect_standby(self, node: Node, when: str, within_s: float = 5.0) -> list[str]:
        """``node`` must answer NOT_SERVING (another leads) within ``within_s``; returns the
        distinct statuses it answered until then, in order."""
        seen: list[str] = []
        deadline = time.monotonic() + within_s
        while True:
            status = node.status()
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == "NOT_SERVING":
                return seen
            if time.monotonic() > deadline:
                self.report.add("HA", f"failover: coordinator {node.name} answered {seen} "
                                f"for {within_s:.1f} s {when}, never NOT_SERVING")
                return seen
            time.sleep(POLL_S)

    # ------------------------------------------------------------------ the oracle (I6)

    def _seen_high(self) -> int:
        """The highest timestamp anyone was handed so far."""
        assert self.reader is not None and self.probe is not None
        now_wall, now = time.time(), time.monotonic()
        seen = [a.commit_ts for r in self.runs for a in list(r.acks)]
        seen += [o["snapshot_ts"] for o in self.reader.observations()
                 if "snapshot_ts" in o and o["wall"] <= now_wall]
        seen.append(self.probe.high_before(now))
        return max(seen, default=0)

    def _check_oracle(self, takeover: Takeover, high: int) -> None:
        new = next(n for n in self.group.nodes if n.name == takeover.new)
        try:
            with Client(new.target, retry_s=20) as client:
                fresh = client.snapshot([t.path for t in self.tables]).snapshot_ts
        except grpc.RpcError as exc:  # leadership moved on already: the probe still checks
            takeover.details["fresh_snapshot"] = f"{exc.code().name}: {exc.details()}"
            return
        takeover.details["snapshot_ts_above_before"] = fresh - high
        if fresh <= high:
            self.report.add("I6", f"failover: after the {takeover.kind} takeover snapshot_ts "
                            f"{fresh} from {new.name} is not above {high}, handed out before")


def failover_under_load(root: Path, dsn: str, faults: int | list[str] = 2,
                        rng: random.Random | None = None, *, pipelines: int = 3,
                        batches: int = 4, k: int = 3, lease_s: float = 2.0,
                        coordinators: int = 2, pace_s: float = 0.0, postgres: Any = None,
                        gap_s: tuple[float, float] = (0.5, 2.0),
                        say: Callable[[str], None] = lambda line: None) -> Outcome:
    """The scenario: ``coordinators`` daemons on ``dsn``, ``pipelines`` light pipelines and a
    reader on all their addresses, then ``faults`` (kinds of :data:`FAULTS`, or a count of
    SIGKILLs and SIGSTOPs mixed) at random moments ``gap_s`` apart; every pipeline commits at
    least ``batches`` batches, resting ``pace_s`` after each. ``postgres`` (a
    ``tests.pg_support.PostgresServer``) is needed for the ``pg-*`` faults. The Outcome's
    notes hold ``takeovers`` (each as a dict) and ``takeover_s`` ((kind, seconds) pairs)."""
    rng = rng or random.Random()
    kinds = mixed_faults(faults, rng) if isinstance(faults, int) else list(faults)
    unknown = [f for f in kinds if f not in FAULTS]
    if unknown or (postgres is None and any(f.startswith("pg-") for f in kinds)):
        raise ValueError(f"faults {kinds}: known are {FAULTS}; pg-* need postgres=")
    run = FailoverRun(Path(root), dsn, rng, lease_s, coordinators, pipelines, k, pace_s,
                      postgres, say)
    # Which coordinator each client call went to and why it moved on: clients.log.
    client_log = logging.FileHandler(Path(root) / "clients.log")
    client_log.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    follower_log = logging.getLogger("percolake.leader")
    follower_log.addHandler(client_log)
    level, _ = follower_log.level, follower_log.setLevel(logging.DEBUG)
    try:
        say(f"starting {coordinators} coordinators (lease {lease_s} s) and {pipelines} "
            f"pipelines; faults: {', '.join(kinds)}")
        run.start()
        for n, kind in enumerate(kinds):
            time.sleep(rng.uniform(*gap_s))
            say(f"fault {n + 1}/{len(kinds)}: {kind} at "
                f"{sum(len(r.acks) for r in run.runs)} acknowledged commits")
            try:
                run.fault(kind)
            except NoLeader as exc:
                run.report.add("HA", f"failover: {kind}: {exc}")
                for node in run.group.nodes:  # the next fault needs a group again
                    if node.paused:
                        node.resume()
                    if not node.is_running():
                        node.start(serving=False)
        say(f"faults done; letting every pipeline reach batch {batches}")
        run.finish(batches)
        say("checking every batch, Delta version and snapshot read")
        run.check()
        takeovers = [asdict(t) for t in run.takeovers]
        return Outcome("failover", run.report, {
            "takeovers": takeovers,
            "takeover_s": [(t.kind, t.seconds) for t in run.takeovers],
            "lease_s": lease_s,
            "acks": sum(len(r.acks) for r in run.runs),
            "batches": {r.pipeline_id: r.done_batches for r in run.runs},
            "probe": {"answers": len(run.probe.seen), "switches": run.probe.switches(),
                      "errors": len(run.probe.errors),
                      "by_address": dict(Counter(a for _, _, a in run.probe.seen))}
            if run.probe else {},
        })
    except Exception:
        (Path(root) / "error.txt").write_text(traceback.format_exc())
        raise
    finally:
        run.close()
        follower_log.removeHandler(client_log)
        follower_log.setLevel(level)
        client_log.close()
