"""One function per crash point C1-C11, shared by the fast tests and ``scripts/crash_soak.py``.

Each builds a fresh :class:`Scenario` under ``root``, makes the named process die at its point,
restarts it, lets the work finish, and returns an :class:`Outcome`: the checker's report (every
invariant over every Delta version and every reader observation) plus the crash-point-specific
findings, also as violations. A scenario raises only when the crash could not be staged (the
failpoint was never reached, a process hung): that is a harness failure, not a verdict.

``clean_run``, ``driver_crash``, ``driver_crash_chain`` and ``coordinator_crash`` take the
keyword arguments of :class:`Scenario` as well (``warehouse``, ``master``, ``spark_conf``,
``env``, ``spark_check``, ``spark_reader``): the same crash on object-store tables, with drivers
on a Spark standalone cluster, checked through delta-spark too.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.crash import light, row_level_job
from tests.crash.checker import Checker, Report, list_below, local_path, read_versions
from tests.crash.harness import (
    FAILPOINT_EXIT,
    FAILPOINT_KILLED,
    QUERY_FAILED,
    Scenario,
    wait_for,
)
from tests.crash.rpc import COMMITTED_STATES, state_name


@dataclass
class Outcome:
    crash_point: str
    report: Report
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def violations(self) -> list[str]:
        return self.report.violations

    def summary(self) -> str:
        return f"{self.crash_point}: {self.report.summary()}\nnotes: {self.notes}"


def _expect_crash(sc: Scenario, failpoints: str, name: str, **driver: Any) -> Any:
    run = sc.run_driver(failpoints, expect=None, **driver)
    rc = run.returncode
    if rc not in (FAILPOINT_EXIT, FAILPOINT_KILLED) or f"failpoint {name}" not in run.log():
        raise AssertionError(f"driver with {failpoints!r} exited {rc} without reaching failpoint "
                             f"{name}:\n{run.log_tail()}\ncoordinator:\n{sc.daemon.log_tail()}")
    return run


def _txns(sc: Scenario, **filters: Any) -> list[Any]:
    with sc.client() as client:
        return client.list_transactions(sc.pipeline, **filters)


def _batch_state(sc: Scenario, batch: int) -> list[str]:
    return [state_name(t.state) for t in _txns(sc, batch_id=batch)]


def clean_run(root: Path, batches: int = 10, k: int = 3, **scenario: Any) -> Outcome:
    """No crash: one driver runs ``batches`` batches while a snapshot reader reads; every
    batch must land exactly once in every table and every snapshot read be consistent."""
    sc = Scenario(root, k=k, **scenario)
    try:
        sc.start_coordinator()
        sc.add_input(batches)
        sc.start_reader()
        started = time.monotonic()
        run = sc.run_driver()
        driven = time.monotonic()
        sc.wait_reader_observations(3)
        sc.stop_reader()
        seen = {tuple(t["version"] for t in o["tables"].values())
                for o in sc.observations() if "snapshot_ts" in o}
        report = sc.check()
        notes: dict[str, Any] = {"user_fn": run.user_fn_batches(),
                                 "distinct_snapshots_read": len(seen),
                                 "driver_s": round(driven - started, 1),
                                 "check_s": round(time.monotonic() - driven, 1)}
        return Outcome("none", report, notes)
    finally:
        sc.close()


def driver_crash(root: Path, point: str, failpoints: str, crash_batch: int = 1,
                 batches: int = 3, k: int = 3, **scenario: Any) -> Outcome:
    """C1-C3, C6-C8: the driver dies at ``failpoints`` in batch ``crash_batch``; a new driver
    on the same checkpoint finishes every batch."""
    sc = Scenario(root, k=k, **scenario)
    try:
        sc.start_coordinator()
        sc.add_input(batches)
        sc.start_reader()
        crashed = _expect_crash(sc, failpoints, failpoints.split("=")[0])
        notes: dict[str, Any] = {"states_after_crash": _batch_state(sc, crash_batch)}
        in_tables = {t.name: _batch_in_table(t.path, crash_batch, sc) for t in sc.tables()}
        notes["tables_with_crashed_batch"] = sorted(n for n, hit in in_tables.items() if hit)
        sc.add_input(1)
        recovery = sc.run_driver()
        notes["states_after_recovery"] = _batch_state(sc, crash_batch)
        notes["user_fn_crashed_run"] = crashed.user_fn_batches()
        notes["user_fn_recovery_run"] = recovery.user_fn_batches()
        sc.wait_reader_observations(3)
        sc.stop_reader()
        report = sc.check()
        committed_before = any(s in ("COMMITTED", "APPLIED") for s in notes["states_after_crash"])
        if committed_before and crash_batch in recovery.user_fn_batches():
            report.add("I2", f"{point}: batch {crash_batch} was committed before the crash but "
                       "the user's function ran again on replay")
        return Outcome(point, report, notes)
    finally:
        sc.close()


def _uncommitted_files(sc: Scenario, batch: int) -> int:
    """How many data files the not-committed attempts of ``batch`` have in their folders."""
    with sc.client() as client:
        txns = [t for t in client.list_transactions(sc.pipeline, batch_id=batch)
                if t.state not in COMMITTED_STATES]
    return sum(len(list_below(local_path(p.write_location)))
               for t in txns for p in t.participants if p.write_location)


def _batch_in_table(path: str, batch: int, sc: Scenario) -> bool:
    with sc.client() as client:
        ids = {t.txn_id for t in client.list_transactions(sc.pipeline, batch_id=batch)}
    versions = read_versions(path)
    return bool(versions) and any(p.split("/")[1] in ids for p in versions[-1].files
                                  if p.startswith("_percolake/"))


def coordinator_crash(root: Path, point: str, failpoint: str, batches: int = 3,
                      k: int = 3, sigkills: int = 0, rng: random.Random | None = None,
                      then: str = "", **scenario: Any) -> Outcome:
    """C4/C5: the coordinator dies at ``failpoint`` during the commit of batch 1; it is
    restarted (same data dir and port) while the driver keeps running on its retries.

    With ``then`` (another commit failpoint) the restarted coordinator dies at it on its first
    commit (the retried one, or the next batch's) and is restarted again, failpoints off. With
    ``sigkills`` it is then also SIGKILLed that many times more at random moments while the
    driver runs (C9's kills, under a real driver), each time restarted at once."""
    rng = rng or random.Random(0)
    sc = Scenario(root, k=k, **scenario)
    try:
        sc.start_coordinator(failpoints=f"{failpoint}=2*exit")
        sc.add_input(batches)
        sc.start_reader()
        first_pid = sc.daemon.process.pid
        sc.watch_coordinator([f"{then}=1*exit"] if then else [])
        driver = sc.start_driver()
        kills = 0
        if sigkills:
            deaths = 2 if then else 1
            wait_for(lambda: sc.coordinator_restarts >= deaths or driver.returncode is not None,
                     240, f"the coordinator's deaths at {failpoint} {then}")
            while kills < sigkills and driver.returncode is None:
                time.sleep(rng.uniform(0.5, 3.0))
                if driver.returncode is None and sc.sigkill_coordinator():
                    kills += 1
        driver.wait()
        run = driver
        sc.stop_watch()
        notes: dict[str, Any] = {"coordinator_restarts": sc.coordinator_restarts,
                                 "driver_rc": run.returncode, "sigkills": kills}
        log = (sc.root / "coordinator.log").read_text(errors="replace")
        report = Report()
        for name in filter(None, (failpoint, then)):
            if f"failpoint {name}" not in log:
                raise AssertionError(f"coordinator never died at {name} (first pid "
                                     f"{first_pid}):\n{sc.daemon.log_tail()}")
        if sc.coordinator_restarts < (2 if then else 1):
            raise AssertionError(f"coordinator restarted {sc.coordinator_restarts} times:\n"
                                 f"{sc.daemon.log_tail()}")
        if run.returncode != 0:
            report.add("I4", f"{point}: the driver did not survive the coordinator restart "
                       f"(exit {run.returncode}):\n{run.log_tail(15)}")
        sc.wait_reader_observations(3)
        sc.stop_reader()
        report.merge(sc.check())
        return Outcome(point, report, notes)
    finally:
        sc.close()


def zombie_driver(root: Path, batches: int = 3, k: int = 3) -> Outcome:
    """C10: driver A stalls (SIGSTOP, like a long GC pause) between prewriting batch 1 and
    committing it; driver B starts on the same checkpoint, registers (new epoch) and finishes
    every batch; then A resumes (SIGCONT) and tries to commit: it must change nothing."""
    sc = Scenario(root, k=k)
    try:
        sc.start_coordinator()
        sc.add_input(batches)
        sc.start_reader()
        # The failpoint only widens the window between prewrite and commit so the harness can
        # freeze A inside it; the freeze, not the sleep, keeps A away until B is done.
        zombie = sc.start_driver("after-prewrite=2*sleep(10)")
        wait_for(lambda: "failpoint after-prewrite" in zombie.log(), 120,
                 "the zombie's files of batch 1 (every table)", interval_s=0.05)
        zombie.pause()
        written = [t for t in _txns(sc, batch_id=1) if state_name(t.state) == "OPEN"
                   and len(t.participants) == len(sc.tables())]
        if len(written) != 1:
            raise AssertionError(f"batch 1 of the zombie is not one open attempt: {written}")
        zombie_txn = written[0].txn_id
        with sc.client() as client:
            epoch_a = client.pipeline(sc.pipeline).epoch
        successor = sc.start_driver()
        rc_b = successor.wait()
        with sc.client() as client:
            epoch_b = client.pipeline(sc.pipeline).epoch
        zombie.resume()
        rc_a = zombie.wait()
        notes = {"zombie_rc": rc_a, "successor_rc": rc_b, "epochs": (epoch_a, epoch_b),
                 "zombie_user_fn": zombie.user_fn_batches(),
                 "successor_user_fn": successor.user_fn_batches()}
        report = Report()
        if rc_b != 0:
            report.add("I5", f"C10: the new driver failed (exit {rc_b}):\n"
                       f"{successor.log_tail(15)}")
        if rc_a == 0:
            report.add("I5", "C10: the zombie driver finished its batch without being fenced")
        if "fenced" not in zombie.log().lower():
            report.add("I5", "C10: the zombie's failure does not say it was fenced:\n"
                       f"{zombie.log_tail(15)}")
        with sc.client() as client:
            txn = client.transaction(zombie_txn)
        if state_name(txn.state) != "ABORTED":
            report.add("I5", f"C10: the zombie's attempt {zombie_txn} is "
                       f"{state_name(txn.state)}, not ABORTED")
        notes["zombie_abort_reason"] = txn.abort_reason
        sc.wait_reader_observations(3)
        sc.stop_reader()
        report.merge(sc.check())
        return Outcome("C10", report, notes)
    finally:
        sc.close()


def zombie_light(root: Path, rng: random.Random | None = None, batches: int = 3,
                 k: int = 3) -> Outcome:
    """C10 without Spark: a driver prewrites batch 0, a new driver registers the same pipeline
    and query id, and the old one then sends every kind of request with its old epoch. Each must
    be refused and change nothing (I5); the new driver's batches land exactly once."""
    import grpc

    from percolake.v1 import coordinator_pb2 as pb

    sc = Scenario(root, k=k)
    report = Report()
    try:
        sc.start_coordinator()
        query_id = str(uuid.uuid4())
        new = light.LightPipeline(sc.target, "z", str(sc.lake), k, batches)
        new.query_id = query_id
        tables = new.tables
        paths = [t.path for t in tables]
        with sc.client() as client:
            old_epoch = client.call("RegisterPipeline", pb.RegisterPipelineRequest(
                pipeline_id="z", query_id=query_id)).epoch
            opened = client.call("OpenTransaction", pb.OpenTransactionRequest(
                pipeline_id="z", batch_id=0, epoch=old_epoch, query_id=query_id, tables=paths))
            zombie_txn = opened.transaction.txn_id
            writes = light.write_files(tables, opened, "z", 0, k)
            client.call("Prewrite", pb.PrewriteRequest(txn_id=zombie_txn, epoch=old_epoch,
                                                       writes=writes))
            new.start()
            new.join(120)
            for error in new.errors:
                report.add("C10", f"new driver: {error.strip()[-1500:]}")
            live = client.call("OpenTransaction", pb.OpenTransactionRequest(
                pipeline_id="z", batch_id=batches, epoch=new.epoch, query_id=query_id))
            before = {t.txn_id: (t.state, t.commit_ts) for t in client.list_transactions("z")}
            last_applied = next(t for t in client.list_transactions("z")
                                if t.batch_id == batches - 1 and t.state in COMMITTED_STATES)
            attempts = {
                "Commit": ("CommitTransaction", pb.CommitTransactionRequest(
                    txn_id=zombie_txn, epoch=old_epoch, tables=paths)),
                "Open": ("OpenTransaction", pb.OpenTransactionRequest(
                    pipeline_id="z", batch_id=batches + 1, epoch=old_epoch,
                    query_id=query_id, tables=paths)),
                "Declare": ("DeclareTables", pb.DeclareTablesRequest(
                    txn_id=live.transaction.txn_id, epoch=old_epoch, tables=paths)),
                "Heartbeat": ("Heartbeat", pb.HeartbeatRequest(
                    txn_id=live.transaction.txn_id, epoch=old_epoch)),
                "Abort": ("AbortTransaction", pb.AbortTransactionRequest(
                    txn_id=live.transaction.txn_id, epoch=old_epoch, reason="zombie")),
                "ReportApplied": ("ReportApplied", pb.ReportAppliedRequest(
                    txn_id=last_applied.txn_id, epoch=old_epoch, tables=[pb.AppliedTable(
                        table=paths[0], delta_version=999)])),
            }
            # An executor of the zombie finishes writing after its attempt was aborted and
            # cleaned up; then the zombie tries to record that write.
            late = light.write_files(tables, opened, "z", 0, k)
            attempts["Prewrite"] = ("Prewrite", pb.PrewriteRequest(
                txn_id=zombie_txn, epoch=old_epoch, writes=late))
            refusals = {}
            for label, (method, request) in attempts.items():
                try:
                    client.call(method, request)
                    report.add("I5", f"C10: the zombie's {label} with epoch {old_epoch} was "
                               "accepted")
                except grpc.RpcError as exc:
                    refusals[label] = f"{exc.code().name}: {exc.details()}"
            after = {t.txn_id: (t.state, t.commit_ts) for t in client.list_transactions("z")}
            changed = {t: (before.get(t), after.get(t)) for t in set(before) | set(after)
                       if before.get(t) != after.get(t)}
            if changed:
                report.add("I5", f"C10: zombie requests changed transactions {changed}")
            zombie = client.transaction(zombie_txn)
            if state_name(zombie.state) != "ABORTED":
                report.add("I5", f"C10: the zombie's attempt is {state_name(zombie.state)}")
            client.call("AbortTransaction", pb.AbortTransactionRequest(
                txn_id=live.transaction.txn_id, epoch=new.epoch, reason="end of scenario"))
            report.merge(Checker(client, tables).check({("z", 0): range(batches)}))
        return Outcome("C10", report, {"refusals": refusals, "epochs": (old_epoch, new.epoch)})
    finally:
        sc.close()


def checkpoint_reset(root: Path, batches: int = 2, k: int = 3) -> Outcome:
    """C11: the checkpoint is deleted and the query started again: refused with
    FAILED_PRECONDITION and nothing written, until reset-pipeline; then every batch of the new
    generation lands although its batch ids were used by generation 0."""
    sc = Scenario(root, k=k)
    try:
        sc.start_coordinator()
        sc.add_input(batches)
        sc.start_reader()
        sc.run_driver()
        before = {t.name: len(read_versions(t.path)) for t in sc.tables()}
        sc.delete_checkpoint()
        refused = sc.run_driver(expect=None)
        after = {t.name: len(read_versions(t.path)) for t in sc.tables()}
        report = Report()
        log = refused.log()
        if refused.returncode != QUERY_FAILED or "FAILED_PRECONDITION" not in log.upper() \
                and "query id" not in log:
            report.add("I9", f"C11: the query on a fresh checkpoint was not refused (exit "
                       f"{refused.returncode}):\n{refused.log_tail(15)}")
        if "reset-pipeline" not in log:
            report.add("I9", "C11: the refusal does not name the reset-pipeline command")
        if before != after:
            report.add("I9", f"C11: the refused query changed the tables: {before} -> {after}")
        with sc.client() as client:
            uncommitted = [t for t in client.list_transactions(sc.pipeline)
                           if t.state not in COMMITTED_STATES]
        if any(state_name(t.state) != "ABORTED" for t in uncommitted):
            report.add("I9", "C11: the refused query left live transactions")
        reset = sc.reset_pipeline(0)
        again = sc.reset_pipeline(0)
        if reset["generation"] != 1 or again["generation"] != 1 or again["changed"]:
            report.add("I9", f"C11: reset answered {reset}, repeated {again}")
        sc.run_driver()
        with sc.client() as client:
            gens = sorted({t.generation for t in client.list_transactions(sc.pipeline)})
        sc.wait_reader_observations(3)
        sc.stop_reader()
        report.merge(sc.check({(sc.pipeline, 0): range(batches),
                               (sc.pipeline, 1): range(batches)}))
        return Outcome("C11", report, {"generations": gens, "reset": reset,
                                       "refused_rc": refused.returncode})
    finally:
        sc.close()


COMMIT_FAILPOINTS = ("", "before-commit-durable", "after-commit-durable-before-reply")


def coordinator_sigkill_under_load(root: Path, rng: random.Random | None = None,
                                   pipelines: int = 3, batches: int = 6, kills: int = 4,
                                   k: int = 3) -> Outcome:
    """C9: light participants (no Spark) commit concurrently while the coordinator is SIGKILLed
    at random moments and restarted on the same data dir and port."""
    rng = rng or random.Random()
    # every light pipeline also appends to one shared ledger table: --shared-table-writers
    sc = Scenario(root, k=k, coordinator_args=[
        "--roll-forward-after", "2", "--txn-timeout", "60", "--conflict-wait", "20",
        "--log-format", "text", "--shared-table-writers"])
    runs: list[light.LightPipeline] = []
    try:
        sc.start_coordinator()
        runs = light.run_light(sc.target, str(sc.lake), pipelines, batches, k)
        tables = light.all_tables(runs)
        sc.start_reader(tables, prefixes=[f"{r.pipeline_id}_" for r in runs])
        report = Report()
        kinds: Counter[str] = Counter()
        armed = ""
        for n in range(kills):
            # Die at a random moment, or at the failpoint armed for this round (C4/C5 moments
            # under concurrency), whichever comes first.
            until = time.monotonic() + rng.uniform(0.3, 2.0)
            while time.monotonic() < until and sc.daemon.is_running():
                time.sleep(0.02)
            seen = [a.commit_ts for r in runs for a in r.acks]
            seen += [o["snapshot_ts"] for o in sc.observations() if "snapshot_ts" in o]
            died_alone = not sc.daemon.is_running()
            sc.daemon.kill()
            high = max(seen, default=0)
            kinds["failpoint " + armed if died_alone and armed else "sigkill"] += 1
            sc.daemon.start(env={"PERCOLAKE_FAILPOINTS": ""})
            sc.coordinator_restarts += 1
            with sc.client() as client:
                fresh = client.snapshot([t.path for t in tables]).snapshot_ts
            if fresh <= high:
                report.add("I6", f"C9: after a restart snapshot_ts {fresh} is not above "
                           f"{high}, handed out before the kill")
            armed = rng.choice(COMMIT_FAILPOINTS) if n < kills - 1 else ""
            if armed:  # one more restart, armed to die at the N-th commit from now
                sc.daemon.kill()
                sc.daemon.start(env={"PERCOLAKE_FAILPOINTS": f"{armed}={rng.randint(1, 3)}*exit"})
        for r in runs:
            r.join(300)
            if r.thread.is_alive():
                report.add("I4", f"C9: pipeline {r.pipeline_id} still running after 300 s")
            for error in r.errors:
                report.add("C9", f"pipeline {r.pipeline_id}: {error.strip()[-1500:]}")
        sc.wait_reader_observations(3)
        sc.stop_reader()
        with sc.client() as client:
            checker = Checker(client, tables)
            report.merge(checker.check({(r.pipeline_id, 0): range(batches) for r in runs},
                                       sc.observations()))
            for r in runs:
                for ack in r.acks:
                    txn = checker.txns.get(ack.txn_id)
                    if txn is None or txn.state not in COMMITTED_STATES \
                            or txn.commit_ts != ack.commit_ts:
                        report.add("I4", f"C9: acknowledged commit {ack} is "
                                   f"{state_name(txn.state) if txn else 'missing'}")
        return Outcome("C9", report, {"restarts": sc.coordinator_restarts, "kills": dict(kinds),
                                      "acks": sum(len(r.acks) for r in runs),
                                      "pipelines": light.summary(runs)})
    finally:
        for r in runs:
            r.stop.set()
        sc.close()


# Driver crash points: (failpoint, hits per batch, which of the first hits of a batch may die).
DRIVER_POINTS: dict[str, tuple[str, int, int]] = {
    "C1": ("after-open", 1, 1),
    "C2": ("mid-prewrite", 3, 3),
    "C3": ("after-prewrite", 1, 1),
    "C6": ("after-commit-reply", 1, 1),
    "C7": ("after-secondary", 3, 2),
    "C8": ("after-all-secondaries", 1, 1),
    # C8r: after all secondaries, before their ReportApplied is handed to the background sender
    # (the deferred report's window): the tables stay held until a roll-forward or the replay.
    "C8r": ("before-deferred-report", 1, 1),
}


def _driver_failpoint(point: str, batch: int, rng: random.Random | None) -> str:
    """The failpoint spec that kills the driver at ``point`` in ``batch``."""
    failpoint, per_batch, choices = DRIVER_POINTS[point]
    nth = batch * per_batch + (rng.randrange(choices) if rng else 0) + 1
    return f"{failpoint}={nth}*exit"


def _driver_point(point: str) -> Callable[..., Outcome]:
    """A driver crash in batch 1, or with an rng in a random batch at a random hit."""

    def run(root: Path, rng: random.Random | None = None) -> Outcome:
        batch = rng.randrange(3) if rng else 1
        return driver_crash(root, point, _driver_failpoint(point, batch, rng),
                            crash_batch=batch, batches=max(3, batch + 2))

    return run


# The driver points before the commit point: a driver dying there has committed nothing.
BEFORE_THE_COMMIT_POINT = ("C1", "C2-first", "C2", "C3")

# Chain points beside DRIVER_POINTS's (which die at their second hit of a batch, if it has two):
# "C2-first" dies as the first of a batch's concurrent table writes has its files, the other
# two write jobs submitted beside it.
CHAIN_HITS: dict[str, tuple[str, int]] = {"C2-first": ("mid-prewrite", 1)}


def _chain_failpoint(point: str, batch: int, action: str = "exit") -> tuple[str, str]:
    """The failpoint name and spec that kill a chain's driver at ``point`` in ``batch``
    (``action`` ``exit``: os._exit; ``kill``: a SIGKILL)."""
    if point in CHAIN_HITS:
        failpoint, nth = CHAIN_HITS[point]
    else:
        failpoint, per_batch, _ = DRIVER_POINTS[point]
        nth = min(2, per_batch)
    return failpoint, f"{failpoint}={nth}*{action}@{batch}"


def driver_crash_chain(root: Path, points: list[str], k: int = 3, more_batches: int = 0,
                       row_level: bool = False, first_batch_points: Sequence[str] = (),
                       **scenario: Any) -> Outcome:
    """Driver crash points one after another on one pipeline (the fast mode's C1-C3 then
    C6-C8r): the driver started after the crash in batch ``n - 1`` replays that batch and dies
    at ``points[n]`` in batch ``n``; a last driver finishes every batch, ``more_batches`` more
    than the crashes' while the snapshot reader reads. Per point the notes hold the crashed
    batch's states right after the crash and after the last driver, the tables holding it right
    after the crash, and whether the next driver ran the user's function for it again, which it
    must not do for a committed batch (I2).

    ``first_batch_points``: points before the commit point (``BEFORE_THE_COMMIT_POINT``) at
    which drivers die one after another in batch 0 first, each replaying the batch its
    predecessor died in; ``points`` then start at batch 1. Those drivers commit nothing, so
    they run the plain bank job (the light session, no ``row_level`` tables) and die by the
    ``exit`` action.

    ``row_level``: issue 32's acceptance run. Every batch also MERGEs a balances table and
    inserts then deletes on a fourth (``row_level_job.py``, tables made by delta-spark before
    the stream), each crash of ``points`` is a SIGKILL (the ``kill`` action), every snapshot
    read must show balances equal to credits minus debits, and delta-spark's latest reads every
    batch exactly once (the notes' ``row_level``)."""
    committing = [p for p in first_batch_points if p not in BEFORE_THE_COMMIT_POINT]
    if committing:
        raise ValueError(f"first_batch_points {committing} are past the commit point: a driver "
                         f"dying there commits batch 0 (use {BEFORE_THE_COMMIT_POINT})")
    final_read = Path(root) / "final-read.json"
    if row_level:
        scenario["driver_args"] = ["--row-level", "--final-read", str(final_read)]
    sc = Scenario(root, k=k, **scenario)
    first = 1 if first_batch_points else 0
    # (batch, point, action, the driver's arguments: None for the scenario's)
    chain = [(0, point, "exit", []) for point in first_batch_points] + [
        (first + n, point, "kill" if row_level else "exit", None)
        for n, point in enumerate(points)]
    try:
        sc.start_coordinator()
        batches = first + len(points) + 1 + more_batches
        sc.add_input(batches)
        extra_tables = row_level_job.reader_tables(str(sc.lake)) if row_level else []
        sc.start_reader(sc.tables() + extra_tables)
        report = Report()
        crashes: list[dict[str, Any]] = []
        for batch, point, action, driver_args in chain:
            failpoint, spec = _chain_failpoint(point, batch, action)
            run = _expect_crash(sc, spec, failpoint, driver_args=driver_args)
            if crashes:
                crashes[-1]["next_run_user_fn"] = run.user_fn_batches()
            crashes.append({"point": point, "batch": batch, "failpoints": spec,
                            "states_after_crash": _batch_state(sc, batch),
                            "tables_with_crashed_batch": sorted(
                                t.name for t in sc.tables() if _batch_in_table(t.path, batch, sc)),
                            "uncommitted_files_after_crash": _uncommitted_files(sc, batch)})
        started = time.monotonic()
        recovery = sc.run_driver()
        driven = time.monotonic()
        crashes[-1]["next_run_user_fn"] = recovery.user_fn_batches()
        for crash in crashes:
            crash["states_after_recovery"] = _batch_state(sc, crash["batch"])
            committed = any(s in ("COMMITTED", "APPLIED") for s in crash["states_after_crash"])
            crash["committed_before_replay"] = committed
            if committed == (crash["batch"] in crash["next_run_user_fn"]):
                report.add("I2", f"{crash['point']}: batch {crash['batch']} "
                           f"{'committed' if committed else 'not committed'} before the crash, "
                           f"but the next driver ran the user's function for "
                           f"{crash['next_run_user_fn']}")
        sc.wait_reader_observations(3)
        sc.stop_reader()
        seen = {tuple(t["version"] for t in o["tables"].values())
                for o in sc.observations() if "snapshot_ts" in o}
        report.merge(sc.check())
        notes: dict[str, Any] = {}
        if row_level:
            checked, violations = row_level_job.snapshot_violations(sc.observations())
            violations += row_level_job.final_violations(final_read, batches, k)
            report.violations += violations
            notes["row_level"] = {"snapshot_reads_checked": checked,
                                  "final_read": final_read.exists()}
        return Outcome("+".join([*first_batch_points, *points]), report, {
            "crashes": crashes, "distinct_snapshots_read": len(seen),
            "recovery_s": round(driven - started, 1),
            "check_s": round(time.monotonic() - driven, 1), **notes})
    finally:
        sc.close()


def checkpoint_reset_among_kills(root: Path, rng: random.Random, k: int = 3) -> Outcome:
    """C11 in the soak: kills of the driver (at random crash points) and of the coordinator
    (SIGKILL), with the checkpoint deleted and the pipeline reset at a random moment among
    them. Every batch generation 0 committed, and every batch of generation 1, must be in every
    table exactly once; generation 0's committed batches must have no gap."""
    sc = Scenario(root, k=k)
    events: list[str] = []
    try:
        sc.start_coordinator()
        sc.add_input(rng.randint(3, 5))
        sc.start_reader()

        def kills(count: int) -> None:
            for n in range(count):
                if n and rng.random() < 0.3:
                    sc.restart_coordinator()
                    events.append("coordinator SIGKILL")
                    continue
                point = rng.choice(sorted(DRIVER_POINTS))
                spec = _driver_failpoint(point, rng.randrange(sc.inputs), rng)
                run = sc.run_driver(spec, expect=None)
                events.append(f"driver {point} {spec} -> exit {run.returncode}")
                if run.returncode not in (0, FAILPOINT_EXIT):
                    raise AssertionError(f"driver with {spec} exited {run.returncode}:\n"
                                         f"{run.log_tail()}")

        kills(rng.randint(1, 3))  # the first is a driver: the checkpoint and binding exist
        sc.delete_checkpoint()
        refused = sc.run_driver(expect=None)
        events.append(f"checkpoint deleted; driver exit {refused.returncode}")
        report = Report()
        if refused.returncode != QUERY_FAILED or "reset-pipeline" not in refused.log():
            report.add("I9", f"C11: a query on a fresh checkpoint was not refused naming the "
                       f"reset (exit {refused.returncode}):\n{refused.log_tail(15)}")
        reset = sc.reset_pipeline(0)
        events.append(f"reset -> generation {reset['generation']}")
        kills(rng.randint(0, 2))
        sc.run_driver()
        with sc.client() as client:
            gen0 = sorted(t.batch_id for t in client.list_transactions(sc.pipeline)
                          if t.generation == 0 and t.state in COMMITTED_STATES)
        if gen0 != list(range(len(gen0))):
            report.add("I2", f"C11: generation 0 committed batches {gen0}: a gap")
        sc.wait_reader_observations(3)
        sc.stop_reader()
        report.merge(sc.check({(sc.pipeline, 0): gen0, (sc.pipeline, 1): range(sc.inputs)}))
        return Outcome("C11", report, {"events": events, "generation_0_batches": gen0})
    finally:
        sc.close()


CRASH_POINTS: dict[str, Callable[..., Outcome]] = {
    **{point: _driver_point(point) for point in ("C1", "C2", "C3")},
    "C4": lambda root, rng=None: coordinator_crash(root, "C4", "before-commit-durable"),
    "C5": lambda root, rng=None: coordinator_crash(root, "C5",
                                                   "after-commit-durable-before-reply"),
    **{point: _driver_point(point) for point in ("C6", "C7", "C8", "C8r")},
    "C9": lambda root, rng=None: coordinator_sigkill_under_load(
        root, rng, **({"pipelines": rng.randint(2, 4), "batches": rng.randint(5, 10),
                       "kills": rng.randint(3, 8)} if rng else {})),
    "C10": lambda root, rng=None: zombie_driver(root),
    "C11": lambda root, rng=None: (checkpoint_reset_among_kills(root, rng) if rng
                                   else checkpoint_reset(root)),
    "C10-light": zombie_light,
}
SPARK_FREE = ("C9", "C10-light")


def set_writer_features(path: str, features: list[str]) -> None:
    """A new log entry whose protocol requires ``features`` of writers (none: back to writer
    version 2), as delta-spark enabling or dropping a table feature writes it."""
    import json

    log = Path(local_path(path)) / "_delta_log"
    version = max(int(p.stem) for p in log.glob("*.json")) + 1
    protocol = {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": features} \
        if features else {"minReaderVersion": 1, "minWriterVersion": 2}
    entry = [{"commitInfo": {"operation": "SET TBLPROPERTIES"}}, {"protocol": protocol}]
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in entry))


def refused_table_feature(root: Path, k: int = 3) -> Outcome:
    """I10 with a table feature percolake cannot write: one table of the batch gains the
    ``identityColumns`` feature (as delta-spark's ``ALTER TABLE`` would) before batch 1 commits.
    The coordinator must refuse the commit naming the feature; the coordinator is then
    SIGKILLed and restarted: no table of the batch shows it, its files go, snapshots answer
    (no wedge). With the feature dropped again, batch 1 lands in every table exactly once."""
    import grpc

    from percolake.v1 import coordinator_pb2 as pb

    sc = Scenario(root, k=k)
    report = Report()
    notes: dict[str, Any] = {}
    try:
        sc.start_coordinator()
        first = light.LightPipeline(sc.target, "f", str(sc.lake), k, 1)
        first.start().join(120)
        for error in first.errors:
            report.add("I10", f"batch 0: {error.strip()[-1500:]}")
        tables = first.tables
        paths = [t.path for t in tables]
        refused_table = next(t for t in tables if t.name == "f_credits")
        set_writer_features(refused_table.path, ["identityColumns"])
        with sc.client() as client:
            opened = client.call("OpenTransaction", pb.OpenTransactionRequest(
                pipeline_id="f", batch_id=1, epoch=first.epoch, query_id=first.query_id,
                tables=paths))
            txn_id = opened.transaction.txn_id
            writes = light.write_files(tables, opened, "f", 1, k)
            try:
                client.call("CommitTransaction", pb.CommitTransactionRequest(
                    txn_id=txn_id, epoch=first.epoch, tables=paths, writes=writes))
                report.add("I10", "the commit of a batch writing a table with identityColumns "
                           "was accepted")
            except grpc.RpcError as exc:
                notes["refusal"] = f"{exc.code().name}: {exc.details()}"
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION \
                        or "'identityColumns'" not in (exc.details() or ""):
                    report.add("I10", f"the refusal does not name the feature: {notes['refusal']}")
        sc.restart_coordinator()  # a crash right after the refusal changes nothing
        with sc.client() as client:
            client.call("AbortTransaction", pb.AbortTransactionRequest(
                txn_id=txn_id, epoch=first.epoch, reason="refused: table feature"))
            started = time.monotonic()
            client.snapshot(paths, wait_ms=5000)
            notes["snapshot_s"] = round(time.monotonic() - started, 2)
        shown = sorted(t.name for t in tables if any(
            p.startswith(f"_percolake/{txn_id}/") for v in read_versions(t.path) for p in v.files))
        if shown:
            report.add("I10", f"tables showing the refused batch: {shown}")
        report.merge(sc.check({("f", 0): [0]}, tables=tables))
        set_writer_features(refused_table.path, [])
        again = light.LightPipeline(sc.target, "f", str(sc.lake), k, 2)
        again.query_id = first.query_id
        again.start().join(120)
        for error in again.errors:
            report.add("I10", f"batch 1 after the feature was dropped: {error.strip()[-1500:]}")
        report.merge(sc.check({("f", 0): range(2)}, tables=tables))
        return Outcome("I10-table-feature", report, notes)
    finally:
        sc.close()


def merge_schema_entry_crash(root: Path, failpoint: str, k: int = 3) -> Outcome:
    """A ``merge_schema`` write (a new column in one table of the batch) is COMMITTED, then
    the coordinator's roll-forward dies at ``failpoint`` around the first log entry it writes
    (``before-log-entry``: nothing written; ``after-log-entry``: one table's entry is there,
    the apply not recorded). Restarted, it rolls the batch forward: every table shows it exactly
    once, the new column in one Delta version together with its data (I4, I10)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from percolake.v1 import coordinator_pb2 as pb

    sc = Scenario(root, k=k)
    report = Report()
    notes: dict[str, Any] = {}
    try:
        sc.start_coordinator(failpoints=f"{failpoint}=exit")
        first = light.LightPipeline(sc.target, "f", str(sc.lake), k, 1)
        first.start().join(120)
        for error in first.errors:
            report.add("I4", f"batch 0: {error.strip()[-1500:]}")
        tables = first.tables
        paths = [t.path for t in tables]
        evolved = next(t for t in tables if t.name == "f_credits")
        with sc.client() as client:
            opened = client.call("OpenTransaction", pb.OpenTransactionRequest(
                pipeline_id="f", batch_id=1, epoch=first.epoch, query_id=first.query_id,
                tables=paths))
            txn_id = opened.transaction.txn_id
            writes = light.write_files(tables, opened, "f", 1, k)
            write = writes[paths.index(evolved.path)]
            file = Path(local_path(evolved.path)) / write.add_files[0].path
            data = pq.read_table(file)
            data = data.append_column("note", pa.array(["new"] * data.num_rows))
            pq.write_table(data, file)
            write.add_files[0].size = file.stat().st_size
            write.schema_json = light._schema_json(data.schema)
            write.merge_schema = True
            client.call("CommitTransaction", pb.CommitTransactionRequest(
                txn_id=txn_id, epoch=first.epoch, tables=paths, writes=writes))
        # nobody applies it but the coordinator's roll-forward, which dies at the failpoint
        wait_for(lambda: not sc.daemon.is_running(), 60, f"the coordinator's death at {failpoint}")
        log = (sc.root / "coordinator.log").read_text(errors="replace")
        if f"failpoint {failpoint}" not in log:
            raise AssertionError(f"coordinator never reached {failpoint}:\n{sc.daemon.log_tail()}")
        # every table's apply is a log entry of ours (an append): the first one reached dies
        at_crash = [len(_entries_of(t.path, txn_id)) for t in tables]
        notes["entries_at_crash"] = sum(at_crash)
        # the tables are applied side by side: the one whose failpoint fired has none at
        # before-log-entry, while another may already hold its own
        notes["tables_without_entry_at_crash"] = at_crash.count(0)
        sc.restart_coordinator()
        with sc.client() as client:
            wait_for(lambda: state_name(client.transaction(txn_id).state) == "APPLIED", 60,
                     "the roll-forward after the restart")
        entries = _entries_of(evolved.path, txn_id)
        notes["entries"] = len(entries)
        if len(entries) != 1:
            report.add("I4", f"{evolved.name}: {len(entries)} Delta versions hold {txn_id}")
        elif not any("metaData" in a and '"note"' in a["metaData"]["schemaString"]
                     for a in entries[0]):
            report.add("I10", f"{evolved.name}: the version holding {txn_id} does not add the "
                       "column 'note'")
        for table in tables:
            held = [v.version for v in read_versions(table.path)
                    if v.tag("percolake.txn_id") == txn_id]
            if len(held) != 1:
                report.add("I4", f"{table.name}: versions {held} hold {txn_id}")
        report.merge(sc.check({("f", 0): range(2)}, tables=tables))
        return Outcome(f"merge-schema-{failpoint}", report, notes)
    finally:
        sc.close()


def _entries_of(path: str, txn_id: str) -> list[list[dict[str, Any]]]:
    """The actions of each Delta log entry of a local table that holds ``txn_id``."""
    import json

    found = []
    for entry in sorted((Path(local_path(path)) / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
        if any(a.get("commitInfo", {}).get("percolake.txn_id") == txn_id for a in actions):
            found.append(actions)
    return found
