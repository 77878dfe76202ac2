"""Secondaries: applied reports and roll-forward (Percolator lock resolution, I4)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor

from coordinator import metrics, validation
from coordinator.core.state import CoreState, wall_ms
from percolake.errors import (
    CannotApplyAsRead,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
)
from percolake.lake.warehouse import is_object_store
from percolake.parallel import in_parallel
from percolake.records import TxnRecord, delta_app_id
from percolake.states import COMMITTED_STATES, TxnState, check_transition

log = logging.getLogger("percolake.coordinator")
ROLL_FORWARD_THREADS = 4  # tables of one transaction rolled forward at once
_FREE = threading.Lock()  # never taken: stands for a table nobody has rolled forward yet


class Applying(CoreState):
    """ReportApplied and the coordinator's own roll-forward of commits."""

    def report_applied(self, txn_id: str, epoch: int | None, versions: dict[str, int],
                       verified: Collection[str] = ()) -> TxnRecord:
        """Records finished secondaries; the transaction is APPLIED once every table is.

        ``verified``: tables whose reported version the caller has just verified
        (``_verify_applied``) with the same versions: not read again."""
        validation.check_id("txn_id", txn_id)
        validation.check_epoch(epoch)
        if not versions:
            raise InvalidArgument("report at least one table and its Delta version")
        canonical: dict[str, int] = {}
        for table, version in versions.items():
            validation.check_non_negative("delta_version", version)
            canonical[self._canonical(table)] = version
        verified = {self._canonical(t) for t in verified}
        while True:  # the log is read outside the lock; record only what was verified
            with self._lock:
                txn = self._get(txn_id)
                self._check_txn_caller(txn, epoch)
                unverified = {t: v for t, v in canonical.items()
                              if t not in verified and txn.state == TxnState.COMMITTED
                              and t in txn.tables and not txn.tables[t].applied}
                if not unverified:
                    return self._fresh(self._record_applied(txn, canonical))
            self._verify_applied(txn, unverified)
            verified.update(unverified)

    def report_carried(self, pipeline_id: str, epoch: int | None, query_id: str | None,
                       reports: Sequence[tuple[str, Sequence[tuple[str, int]]]]) -> None:
        """The applied reports an Open carries: each recorded exactly as ReportApplied records
        it (same verification, same fencing by the Open's epoch), before the Open itself.

        Every report must be of a transaction of the Open's own pipeline (whose WRITE the Open
        needs); the Open's caller checks (fencing, query id) come first and a malformed or
        foreign report refuses the Open before anything is recorded. The log entries of every
        report are read at once (one round trip on an object store, however many reports);
        reports that pass are then recorded one by one, before the Open's own checks: a true
        report recorded by an Open refused later (say, for a table owned elsewhere) is
        harmless and idempotent.
        """
        if not reports:
            return
        validation.check_count("applied_reports", len(reports), validation.MAX_APPLIED_REPORTS)
        carried: dict[str, dict[str, int]] = {}
        for txn_id, tables in reports:
            validation.check_id("txn_id", txn_id)
            if txn_id in carried:
                raise InvalidArgument(f"transaction {txn_id} is reported twice in one Open")
            self.check_txn_tables(len(tables))
            versions: dict[str, int] = {}
            for table, version in tables:
                if table in versions:
                    raise InvalidArgument(f"table {table} reported twice for transaction "
                                          f"{txn_id}")
                validation.check_non_negative("delta_version", version)
                versions[table] = version
            carried[txn_id] = versions
        records: dict[str, TxnRecord] = {}
        with self._lock:
            pipeline = self._pipelines.get(pipeline_id)
            if pipeline is not None:  # fencing and query id first: a zombie learns nothing
                self._check_caller(pipeline, epoch, query_id)
            for txn_id in carried:
                txn = records[txn_id] = self._get(txn_id)
                if txn.pipeline_id != pipeline_id:
                    raise InvalidArgument(
                        f"an Open of pipeline {pipeline_id!r} carries the applied report of "
                        f"transaction {txn_id}, which belongs to pipeline {txn.pipeline_id!r}; "
                        "an Open carries only its own pipeline's reports (send ReportApplied)")
        canonical = {txn_id: {self._canonical(t): v for t, v in versions.items()}
                     for txn_id, versions in carried.items()}
        # What to verify, from the records read above (a record is replaced, never changed in
        # place, when its state changes): a report recorded meanwhile by another call is
        # verified once more at worst; report_applied decides under the lock what to record.
        unverified: list[tuple[TxnRecord, str, int]] = []
        for txn_id, txn in records.items():
            if txn.state == TxnState.COMMITTED:
                unverified.extend((txn, table, version)
                                  for table, version in canonical[txn_id].items()
                                  if table in txn.tables and not txn.tables[table].applied)
        # Every report's log entries at once (one round trip on an object store, however many
        # reports and tables), then each report recorded in order as ReportApplied records it;
        # a report that failed its check refuses the Open there, as it did when each report
        # was verified on its own (the ones before it stay recorded: true and idempotent).
        outcomes = self._applied_outcomes(unverified)
        for txn_id, versions in carried.items():
            own = [(table, version, outcome) for (txn, table, version), outcome
                   in zip(unverified, outcomes, strict=True) if txn.txn_id == txn_id]
            for table, version, outcome in own:
                if outcome is not True:
                    self._refuse_applied(txn_id, table, version, outcome)
            self.report_applied(txn_id, epoch, versions, verified=[table for table, _, _ in own])

    def _verify_applied(self, txn: TxnRecord, versions: dict[str, int]) -> None:
        """Refuses a reported version whose Delta commit is not this transaction's own."""
        items = [(txn, table, version) for table, version in versions.items()]
        for (_, table, version), outcome in zip(items, self._applied_outcomes(items),
                                                strict=True):
            if outcome is not True:
                self._refuse_applied(txn.txn_id, table, version, outcome)

    def _applied_outcomes(self, items: Sequence[tuple[TxnRecord, str, int]]
                          ) -> list[bool | Exception]:
        """For each (transaction, table, reported version): whether that version's Delta
        commit is the transaction's own (one log entry read each; on an object store all of
        them side by side), or the error that kept it from being read."""
        check = self._applied_check
        if check is None:
            return [True] * len(items)

        def is_own(item: tuple[TxnRecord, str, int]) -> bool:
            txn, table, version = item
            return check(table, version, txn.txn_id,
                         delta_app_id(txn.pipeline_id, txn.generation), txn.batch_id)

        remote = sum(is_object_store(table) for _, table, _ in items)
        return in_parallel(is_own, items, len(items) if remote > 1 else 1, "percolake-verify")

    def _refuse_applied(self, txn_id: str, table: str, version: int,
                        outcome: bool | Exception) -> None:
        if isinstance(outcome, Exception):
            raise outcome
        with self._lock:
            txn = self._get(txn_id)
        raise FailedPrecondition(
            f"Delta version {version} of {table} is not transaction {txn_id}'s commit (its "
            f"log entry must name the transaction and carry app transaction "
            f"{delta_app_id(txn.pipeline_id, txn.generation)} version {txn.batch_id}); "
            "nothing was recorded")

    @metrics.counted_roll_forward
    def _roll_forward(self, txn_id: str, table: str, deadline: float,
                      take_slot: bool = False) -> None:
        """Applies a committed transaction's write to one table (Percolator lock resolution).

        With ``take_slot`` (a request's thread) waiting for another roll-forward of the table
        takes one of the --max-table-waiters slots.
        """
        lock = self._table_apply_locks.setdefault(table, threading.Lock())
        if not lock.acquire(blocking=False) and not self._wait_for(lock, table, deadline,
                                                                   take_slot):
            raise DeadlineExceeded(
                f"timed out waiting to roll forward transaction {txn_id} on {table}")
        try:
            with self._lock:
                txn = self._get(txn_id)
                entry = txn.tables.get(table)
                assert txn.state in COMMITTED_STATES and entry is not None and entry.write, (
                    f"roll-forward of {txn_id} on {table} in state {txn.state}")
                if entry.applied:
                    return
                write = entry.write
            self.store.flush()  # never apply a commit that is not yet durable
            self._before_roll_forward(txn)
            if self._applier is None:
                raise DeadlineExceeded(f"this coordinator cannot apply Delta commits ({table})")
            write = self._write_to_apply(txn_id, table, write)  # refused while quarantined
            try:
                version = self._applier(
                    write, app_id=delta_app_id(txn.pipeline_id, txn.generation),
                    app_version=txn.batch_id, txn_id=txn_id, commit_ts=txn.commit_ts,
                )
            except CannotApplyAsRead as exc:  # I12: never applied against other data
                raise self._quarantine(txn_id, table, exc.problem) from exc
            with self._lock:
                self._record_applied(self._get(txn_id), {table: version})
                self._released_by_apply(txn_id, table, version)
            log.info("rolled forward", extra={"txn_id": txn_id, "table": table,
                                              "delta_version": version})
        finally:
            lock.release()

    def _roll_forward_tables(self, txn_id: str, tables: Sequence[str],
                             deadline: float) -> dict[str, BaseException]:
        """Rolls a committed transaction forward on several tables at once (a small thread pool);
        each table still under its own apply lock, so per table the order stays commit_ts (I7).

        Returns:
            The failure of each table that could not be rolled forward (the others are done).
        """
        failures: dict[str, BaseException] = {}
        if len(tables) <= 1:
            for table in tables:
                try:
                    self._roll_forward(txn_id, table, deadline)
                except Exception as exc:
                    failures[table] = exc
            return failures
        with ThreadPoolExecutor(max_workers=min(len(tables), ROLL_FORWARD_THREADS),
                                thread_name_prefix="roll-forward") as pool:
            futures = {table: pool.submit(self._roll_forward, txn_id, table, deadline)
                       for table in tables}
        for table, future in futures.items():
            if (exc := future.exception()) is not None:
                failures[table] = exc
        return failures

    def _roll_forward_committed_holders(self, tables: Sequence[str]) -> None:
        """Before held tables are taken one by one: rolls forward, side by side, the tables
        that a COMMITTED holder still holds (its driver died before reporting) and that nobody
        is rolling forward right now. Whatever is busy or fails is left to the per-table path,
        which waits, retries and answers for it."""
        with self._lock:
            by_holder: dict[str, list[str]] = {}
            for table in tables:
                holder = self._unfinished.get(self._holders.get(table, ""))
                if holder is not None and holder.state == TxnState.COMMITTED:
                    by_holder.setdefault(holder.txn_id, []).append(table)
        for txn_id, held in by_holder.items():
            idle = [t for t in held if not self._table_apply_locks.get(t, _FREE).locked()]
            if len(idle) > 1:  # a busy table is left to the per-table path (no wait slot)
                failures = self._roll_forward_tables(txn_id, idle, deadline=time.monotonic())
                for table, exc in failures.items():
                    log.debug("parallel roll-forward of %s on %s left to the per-table path: "
                              "%s", txn_id, table, exc)

    def _wait_for(self, lock: threading.Lock, table: str, deadline: float,
                  take_slot: bool) -> bool:
        if not take_slot:
            return lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._table_waits.take(table)
        try:
            return lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            with self._lock:
                self._table_waits.give_back()

    def _record_applied(self, txn: TxnRecord, versions: dict[str, int],
                        abandoned: Collection[str] = ()) -> TxnRecord:
        """Records the Delta versions of applied tables (``abandoned``: tables whose
        quarantined write an operator abandoned, at the version that holds none of it)."""
        if txn.state not in COMMITTED_STATES:
            raise FailedPrecondition(
                f"transaction {txn.txn_id} is {txn.state.value}; only a committed transaction "
                "has secondaries to report")
        updated = txn.copy()
        changed: list[str] = []
        for table, version in versions.items():
            entry = updated.tables.get(table)
            if entry is None:
                raise InvalidArgument(f"transaction {txn.txn_id} did not write {table}")
            if entry.applied:
                if entry.delta_version != version:
                    raise FailedPrecondition(
                        f"{table} was reported applied at Delta version {entry.delta_version}, "
                        f"not {version}")
                continue
            entry.delta_version = version
            entry.abandoned = table in abandoned
            changed.append(table)
        if not changed:
            return txn
        if all(e.applied for e in updated.tables.values()):
            check_transition(updated.state, TxnState.APPLIED)
            updated.state = TxnState.APPLIED
        updated.updated_ms = wall_ms()
        with self.store.batch():
            self.store.update_txn(updated)
            self.store.set_table_commit_versions([(table, updated.commit_ts, versions[table])
                                                  for table in changed])
        self._track(updated)
        self._changed.notify_all()
        return updated
